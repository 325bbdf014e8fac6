"""Packaging contract: lazy public API, no triton at import, every exported name resolves."""
from __future__ import annotations

import os
import subprocess
import sys

import pytest

import hiertail_fast


def test_import_does_not_import_triton_or_kernels():
    # a fresh interpreter: this test process may already have imported triton elsewhere
    code = (
        "import sys, hiertail_fast, hiertail_fast.losses, hiertail_fast.nn.hiertail\n"
        "bad = [m for m in sys.modules if m == 'triton' or m.startswith('triton.')\n"
        "       or m.startswith('hiertail_fast.kernels')]\n"
        "print(','.join(bad))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         check=True, env=dict(os.environ, TRITON_INTERPRET="0"))
    assert out.stdout.strip() == "", f"imported at package import time: {out.stdout}"


@pytest.mark.parametrize("name", hiertail_fast.__all__)
def test_every_public_name_resolves(name):
    assert getattr(hiertail_fast, name) is not None


@pytest.mark.parametrize("package", ["hiertail_fast", "hiertail_fast.nn", "hiertail_fast.data",
                                     "hiertail_fast.reference"])
def test_type_checkers_see_every_lazy_export(package):
    """The public names resolve through a lazy ``__getattr__``, so mypy / pyright typed every
    one of them ``Any`` despite py.typed (a typing audit). Each package's ``if
    TYPE_CHECKING:`` block imports exactly its exports, from the module ``__getattr__`` uses,
    as explicit re-exports (``X as X``)."""
    import ast
    import importlib
    from pathlib import Path

    module = importlib.import_module(package)
    tree = ast.parse(Path(module.__file__).read_text())
    blocks = [node for node in tree.body if isinstance(node, ast.If)
              and isinstance(node.test, ast.Name) and node.test.id == "TYPE_CHECKING"]
    assert len(blocks) == 1
    seen = {}
    for node in blocks[0].body:
        assert isinstance(node, ast.ImportFrom)
        for alias in node.names:
            assert alias.asname == alias.name, alias.name
            seen[alias.name] = node.module
    assert seen == module._EXPORTS


def test_unknown_attribute_is_an_attribute_error():
    with pytest.raises(AttributeError, match="no_such_thing"):
        hiertail_fast.no_such_thing  # noqa: B018


def test_kernels_are_installed_under_the_package_name():
    pytest.importorskip("triton")
    import hiertail_fast.kernels.balanced_contrastive_loss as k

    assert hasattr(k, "lse_forward") and hasattr(k, "lse_backward")


def test_readme_public_api_example_runs():
    """The README's Public API block, as printed there (its compiled step called once there,
    and its value the eager loss's)."""
    from pathlib import Path

    import torch

    text = (Path(__file__).resolve().parents[1] / "README.md").read_text()
    block = text[text.index("## Public API"):].split("```python")[1].split("```")[0]
    ns: dict = {}
    exec(compile(block, "README.md (Public API)", "exec"), ns)
    value = ns["loss_compiled"]
    assert torch.isfinite(value) and ns["h"].shape == ns["g"].x.shape
    torch.testing.assert_close(value, ns["balanced_contrastive_loss"](ns["z"].detach(), ns["y"]))
    assert ns["out"].logits.shape == (ns["g"].num_nodes, ns["g"].num_classes)
    assert torch.equal(ns["dz"], ns["z"].grad)        # torch.func.grad: the backward's numbers


def test_every_subpackage_is_listed_for_the_wheel():
    # pyproject lists the packages by name (the kernels/ mapping rules out find:); an editable
    # install finds an unlisted one anyway, a wheel (pip install .) leaves it out and the
    # package fails at import. hiertail_fast._validation became a package in session 68
    from pathlib import Path

    tomllib = pytest.importorskip("tomllib")            # (Python 3.11+; 3.10 is supported)
    root = Path(hiertail_fast.__file__).resolve().parent
    config = tomllib.loads((root.parent / "pyproject.toml").read_text())
    listed = set(config["tool"]["setuptools"]["packages"])
    on_disk = {".".join(("hiertail_fast",) + p.parent.relative_to(root).parts)
               for p in root.rglob("__init__.py")}
    assert on_disk <= listed, f"not in pyproject's packages: {sorted(on_disk - listed)}"
    assert "hiertail_fast.kernels" in listed
