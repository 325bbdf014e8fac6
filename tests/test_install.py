"""pyproject.toml packaging: `pip install --no-deps --no-build-isolation [-e] .` works offline
(--no-index) into a fresh venv that sees the machine's torch / triton / setuptools, and the
installed package (kernels included, as hiertail_fast.kernels) imports from outside the repo."""
from __future__ import annotations

import importlib.metadata
import importlib.util
import os
import re
import shutil
import site
import subprocess
import sys
import tarfile
import venv
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
SOURCES = ("pyproject.toml", "setup.py", "README.md", "MANIFEST.in", "hiertail_fast", "kernels")

# printed by the venv's interpreter from a directory outside the source tree
_IMPORT = """
import hiertail_fast, hiertail_fast.kernels, hiertail_fast.kernels.gcn_propagate
from hiertail_fast import gcn_propagate, balanced_contrastive_loss
print(hiertail_fast.__file__)
print(hiertail_fast.kernels.__file__)
"""


def _source_copy(dst: Path) -> Path:
    """The files a build reads, copied so that build/ and *.egg-info never land in the repo
    (hiertail_fast/kernels, the development symlink to ../kernels that GPU notes once used
    where the package was not installed, is left out if one exists)."""
    dev_link = ROOT / "hiertail_fast" / "kernels"
    skip = lambda d, names: [n for n in names if n == "__pycache__" or Path(d) / n == dev_link]
    dst.mkdir()
    for name in SOURCES:
        src = ROOT / name
        if src.is_dir():
            shutil.copytree(src, dst / name, ignore=skip)
        else:
            shutil.copy2(src, dst / name)
    return dst


def _offline_env() -> dict:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PIP_", "PYTHONPATH"))}
    # no network: --no-index plus an unroutable proxy in case anything still tries
    return dict(env, PIP_DISABLE_PIP_VERSION_CHECK="1", PIP_NO_INPUT="1",
                HTTPS_PROXY="http://127.0.0.1:9", HTTP_PROXY="http://127.0.0.1:9")


def _see_this_interpreters_packages(python: Path) -> None:
    """--system-site-packages shows the BASE interpreter's packages. Where the tests run in a
    venv themselves (the GPU image's python is /opt/torch/.venv), torch and setuptools live in
    that venv: a .pth file in the new venv adds this interpreter's site-packages (a no-op
    duplicate where they are the base's)."""
    res = subprocess.run([str(python), "-c", "import sysconfig; print(sysconfig.get_paths()"
                          "['purelib'])"], capture_output=True, text=True, timeout=60)
    assert res.returncode == 0, res.stderr
    paths = [p for p in site.getsitepackages() if Path(p).is_dir()]
    (Path(res.stdout.strip()) / "_outer_site_packages.pth").write_text("\n".join(paths) + "\n")


def _setuptools_floor() -> tuple[int, ...]:
    """The setuptools release pyproject.toml's [build-system] asks for (``setuptools>=X.Y``)."""
    text = (ROOT / "pyproject.toml").read_text()
    found = re.search(r'requires\s*=\s*\[[^]]*"setuptools>=([0-9.]+)"', text)
    assert found, "pyproject.toml's build requirement on setuptools has moved"
    return tuple(int(p) for p in found.group(1).split("."))


def _release(version: str) -> tuple[int, ...]:
    return tuple(int(p) for p in re.findall(r"\d+", version)[:3])


@pytest.mark.parametrize("editable", [True, False], ids=["editable", "regular"])
def test_offline_install_into_fresh_venv(tmp_path, editable):
    for module in ("setuptools", "pip"):
        if importlib.util.find_spec(module) is None:
            pytest.skip(f"{module} is not installed: cannot build the package offline")
    have = importlib.metadata.version("setuptools")
    if _release(have) < _setuptools_floor():
        # --no-build-isolation builds with what is installed; an older setuptools fails
        # ("invalid command 'bdist_wheel'" before 70.1), as it would for a user
        pytest.skip(f"setuptools {have} is older than pyproject.toml's build requirement: "
                    "cannot build the package offline")
    src = _source_copy(tmp_path / "src")
    env_dir = tmp_path / "venv"
    try:
        # the system's pip, setuptools and torch are visible through --system-site-packages
        venv.EnvBuilder(system_site_packages=True, with_pip=False).create(env_dir)
    except Exception as exc:  # noqa: BLE001 - e.g. a Python built without venv support
        pytest.skip(f"cannot create a venv here: {exc}")
    bindir = env_dir / ("Scripts" if os.name == "nt" else "bin")
    python = bindir / ("python.exe" if os.name == "nt" else "python")
    _see_this_interpreters_packages(python)
    target = ["-e", str(src)] if editable else [str(src)]
    env = _offline_env()
    res = subprocess.run([str(python), "-m", "pip", "install", "--no-index", "--no-deps",
                          "--no-build-isolation", "-q", *target], cwd=tmp_path, env=env,
                         capture_output=True, text=True, timeout=600)
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]
    outside = tmp_path / "elsewhere"
    outside.mkdir()
    res = subprocess.run([str(python), "-c", _IMPORT], cwd=outside, env=env,
                         capture_output=True, text=True, timeout=300)
    assert res.returncode == 0, res.stderr[-3000:]
    pkg_file, kernels_file = (Path(p).resolve() for p in res.stdout.split())
    if editable:  # the sources themselves, kernels through the package-dir mapping
        assert pkg_file == (src / "hiertail_fast" / "__init__.py").resolve()
        assert kernels_file == (src / "kernels" / "__init__.py").resolve()
    else:  # a copy inside the venv
        assert env_dir.resolve() in pkg_file.parents and env_dir.resolve() in kernels_file.parents
        assert kernels_file.parent.name == "kernels" and kernels_file.parent.parent.name == \
            "hiertail_fast"
    assert ROOT.resolve() not in pkg_file.parents
    assert (pkg_file.parent / "py.typed").is_file(), "PEP 561 marker missing: no type hints"
    script = bindir / ("hiertail-train.exe" if os.name == "nt" else "hiertail-train")
    assert script.exists(), "the console script was not installed"


def test_sdist_holds_the_build_sources_and_no_uncollectable_tests(tmp_path):
    """The sdist builds the package (pyproject, setup.py, kernels/, the C sources) and leaves
    tests/ out: setuptools added tests/test_*.py by default without tests/conftest.py or
    pytest.ini, so the shipped tests could not be collected (a packaging audit)."""
    if importlib.util.find_spec("setuptools") is None:
        pytest.skip("setuptools is not installed: cannot build an sdist")
    have = importlib.metadata.version("setuptools")
    if _release(have) < _setuptools_floor():
        pytest.skip(f"setuptools {have} is older than pyproject.toml's build requirement")
    src = _source_copy(tmp_path / "src")
    shutil.copytree(ROOT / "tests", src / "tests",
                    ignore=shutil.ignore_patterns("__pycache__"))
    res = subprocess.run([sys.executable, "setup.py", "-q", "sdist", "-d", str(tmp_path / "d")],
                         cwd=src, env=_offline_env(), capture_output=True, text=True,
                         timeout=300)
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]
    (archive,) = (tmp_path / "d").glob("*.tar.gz")
    with tarfile.open(archive) as tar:
        names = {n.split("/", 1)[1] for n in tar.getnames() if "/" in n}
    assert not {n for n in names if n.startswith("tests/")}
    kernels = {p.relative_to(ROOT).as_posix() for p in (ROOT / "kernels").glob("*.py")}
    native = {p.relative_to(ROOT).as_posix() for p in (ROOT / "hiertail_fast").rglob("*.[ch]")}
    assert native and kernels
    assert {"pyproject.toml", "setup.py", "README.md", *kernels, *native} <= names


def test_pyproject_keeps_extras_script_and_kernel_mapping():
    tomllib = pytest.importorskip("tomllib")  # Python >= 3.11
    meta = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))
    project = meta["project"]
    assert {"test", "pyg", "triton"} <= set(project["optional-dependencies"])
    assert project["scripts"]["hiertail-train"] == "hiertail_fast.__main__:main"
    assert meta["tool"]["setuptools"]["package-dir"] == {"hiertail_fast.kernels": "kernels"}
    listed = set(meta["tool"]["setuptools"]["packages"])
    on_disk = {".".join(p.parent.relative_to(ROOT).parts)
               for p in (ROOT / "hiertail_fast").rglob("__init__.py")
               if "kernels" not in p.relative_to(ROOT).parts}
    assert on_disk | {"hiertail_fast.kernels"} == listed  # no subpackage left out
