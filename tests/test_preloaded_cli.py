"""tests/_preloaded_cli.run_script runs a script as ``python SCRIPT ARGS`` does: the same exit
status, stdout and stderr as a real subprocess for each way a script can end, and nothing a run
changes reaches the next one."""
from __future__ import annotations

import os
import subprocess
import sys
import textwrap

import pytest

from tests._preloaded_cli import run_script

SCRIPTS = {
    "exit 0, argv, cwd, sys.path[0]": """
        import os, sys
        print("argv", sys.argv[1:], os.path.basename(sys.argv[0]))
        print("cwd", os.getcwd())
        print("path0", sys.path[0])
        print("to stderr", file=sys.stderr)
        """,
    "argparse error": """
        import argparse
        p = argparse.ArgumentParser()
        p.add_argument("--n", type=int, required=True)
        p.parse_args()
        """,
    "sys.exit(3)": "import sys; print('before'); sys.exit(3)",
    "sys.exit(message)": "import sys; sys.exit('a message to stderr')",
    "uncaught exception": "print('partial'); raise ValueError('bad value')",
    "atexit handler": """
        import atexit, sys
        atexit.register(lambda: print("at exit", file=sys.stderr))
        print("body")
        """,
    "imports a module beside it": "import helper_beside; print(helper_beside.VALUE)",
    "unflushed output before os-level exit": "import sys; sys.stdout.write('no newline')",
    "the __main__ module": """
        import os, pickle, sys
        class Defined:
            pass
        print(__name__, __spec__, __file__, sys.modules["__main__"].__file__,
              type(__loader__).__name__, pickle.loads(pickle.dumps(Defined())).__class__)
        """,
}


def _real(path, args, cwd):
    return subprocess.run([sys.executable, str(path), *args], capture_output=True, text=True,
                          timeout=120, cwd=cwd)


@pytest.mark.parametrize("name", sorted(SCRIPTS))
def test_same_status_and_output_as_a_real_python(name, tmp_path):
    (tmp_path / "helper_beside.py").write_text("VALUE = 'found beside the script'\n")
    script = tmp_path / "script.py"
    script.write_text(textwrap.dedent(SCRIPTS[name]))
    work = tmp_path / "work"
    work.mkdir()
    args = ["--flag", "value with spaces"]
    real, ours = _real(script, args, work), run_script(script, args, cwd=work)
    assert ours.returncode == real.returncode, (name, ours.stderr)
    assert ours.stdout == real.stdout
    assert ours.stderr == real.stderr


def test_a_run_changes_nothing_the_next_run_sees(tmp_path):
    first = tmp_path / "first.py"
    first.write_text(textwrap.dedent("""
        import os, sys, torch
        os.environ["PRELOADED_CLI_PROBE"] = "set"
        torch.PRELOADED_CLI_PROBE = "set"
        sys.modules["preloaded_cli_probe"] = object()
        os.chdir("/")
        """))
    second = tmp_path / "second.py"
    second.write_text(textwrap.dedent("""
        import os, sys, torch
        print(os.environ.get("PRELOADED_CLI_PROBE"), hasattr(torch, "PRELOADED_CLI_PROBE"),
              "preloaded_cli_probe" in sys.modules, os.getcwd())
        """))
    assert run_script(first, cwd=tmp_path).returncode == 0
    assert run_script(second, cwd=tmp_path).stdout == f"None False False {tmp_path}\n"


def test_a_run_past_its_timeout_is_killed(tmp_path):
    script = tmp_path / "sleeps.py"
    script.write_text("import time; print('started', flush=True); time.sleep(60)\n")
    res = run_script(script, timeout=1)
    assert res.returncode == -9 and res.stdout == "started\n"
    assert run_script(tmp_path / "sleeps.py", timeout=1).returncode == -9  # the server goes on


def test_each_run_gets_the_callers_environment_of_that_moment(tmp_path, monkeypatch):
    """A variable set (monkeypatched) at the call reaches that run only: the server, started
    whenever the first run came, does not keep the environment of that moment."""
    script = tmp_path / "env.py"
    script.write_text("import os; print(os.environ.get('PRELOADED_CLI_VAR'))\n")
    run_script(script)                                   # the server is running before this
    with monkeypatch.context() as m:
        m.setenv("PRELOADED_CLI_VAR", "at this call")
        assert run_script(script).stdout == "at this call\n"
    assert run_script(script).stdout == "None\n"


@pytest.mark.skipif((os.cpu_count() or 1) < 2 or os.environ.get("OMP_NUM_THREADS") == "1",
                    reason="needs a server whose torch runs more than one thread")
def test_a_variable_read_while_torch_loads_takes_a_real_python(tmp_path, monkeypatch):
    """OMP_NUM_THREADS is read when torch's OpenMP runtime loads, which in the server happened
    at its start (with more than one thread here): a run that sets it to 1 gets a fresh python,
    which honours it (a child forked from the server printed the server's count)."""
    script = tmp_path / "threads.py"
    script.write_text("import torch; print(torch.get_num_threads())\n")
    assert run_script(script).stdout != "1\n"         # the server is running before this
    monkeypatch.setenv("OMP_NUM_THREADS", "1")
    assert run_script(script).stdout == "1\n"


def test_the_server_itself_writes_nothing_to_stderr(tmp_path):
    """The server forks from a multi-threaded process (numpy's OpenBLAS pool): Python 3.12+
    warns of that on every fork (the GPU image runs 3.12), which would print one
    DeprecationWarning per run into the test log. Its forks are quiet; a script's output still
    comes back whole."""
    import json

    import tests._preloaded_cli as cli

    script = tmp_path / "s.py"
    script.write_text("import sys; print('out'); print('err', file=sys.stderr)\n")
    request = json.dumps({"script": str(script), "argv0": str(script), "args": [],
                          "cwd": str(tmp_path),
                          "timeout": 60, "env": dict(os.environ)})
    server = subprocess.run([sys.executable, cli.__file__], input=f"{request}\n{request}\n",
                            capture_output=True, text=True, timeout=120)
    replies = [json.loads(line) for line in server.stdout.splitlines()]
    assert [r["stdout"] for r in replies] == ["out\n"] * 2
    assert [r["stderr"] for r in replies] == ["err\n"] * 2
    assert server.returncode == 0 and server.stderr == ""


def test_a_relative_or_linked_script_is_found_and_named_as_python_does(tmp_path):
    """SCRIPT relative to cwd, and reached through a symlinked folder: the same __file__,
    argv[0] and sys.path[0] as a real python (no link resolved)."""
    real_dir = tmp_path / "real"
    real_dir.mkdir()
    (real_dir / "where.py").write_text(
        "import sys; print(__file__, sys.argv[0], sys.path[0])\n")
    (tmp_path / "linked").symlink_to(real_dir, target_is_directory=True)
    for script in ("linked/where.py", "real/where.py", tmp_path / "linked" / "where.py"):
        real = _real(script, [], tmp_path)
        ours = run_script(script, cwd=tmp_path)
        assert (ours.returncode, ours.stdout, ours.stderr) == (real.returncode, real.stdout,
                                                                real.stderr), script
