"""Every bench script loads from its file on its own (as ``conftest.load_bench`` and a user's
``importlib`` load it), whatever else is on ``sys.path``. Test modules that import bench
scripts put bench/ on ``sys.path`` when they are collected, so in a whole-suite run a script
that imports a sibling (``_device``, ``loss_grid``) without putting its own folder on the path
still loads, and fails only when a test file that loads it runs alone (official_fuzz.py, the
64th session: ``ModuleNotFoundError: No module named '_device'``). Checked in a fresh
interpreter, each script with its siblings unloaded and bench/ off the path."""
from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
BENCH = ROOT / "bench"

_PROBE = r"""
import importlib.util, os, sys, traceback
from pathlib import Path
bench = Path(sys.argv[1]).resolve()
failed = []
for path in sorted(bench.glob("*.py")):
    if path.name.startswith("test_") or path.name == "conftest.py":
        continue            # pytest's files: collected by pytest, with bench/ as their rootdir
    sys.path[:] = [p for p in sys.path if Path(p or os.getcwd()).resolve() != bench]
    for name, mod in list(sys.modules.items()):
        if Path(getattr(mod, "__file__", None) or "/").resolve().parent == bench:
            del sys.modules[name]
    spec = importlib.util.spec_from_file_location("probe_" + path.stem, path)
    try:
        spec.loader.exec_module(importlib.util.module_from_spec(spec))
    except Exception:
        failed.append(path.name + ": " + traceback.format_exc().strip().splitlines()[-1])
print("\n".join(failed))
print("loaded", len(list(bench.glob("*.py"))))
"""


def test_every_bench_script_loads_from_its_file_alone():
    proc = subprocess.run([sys.executable, "-c", _PROBE, str(BENCH)], cwd=ROOT,
                          capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    lines = proc.stdout.strip().splitlines()
    assert lines and lines[-1].startswith("loaded ") and int(lines[-1].split()[1]) > 30, lines
    assert lines[:-1] == [], "\n".join(lines[:-1])
