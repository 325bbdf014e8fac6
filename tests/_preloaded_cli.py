"""Run a command-line script as ``python SCRIPT ARGS`` would, without paying torch's import
each time: for tests that run many short command lines (a bad option refused with exit 2).

A fresh ``python`` spends ~2.5 s of this suite's 2-core CI machine importing torch before a
script can even parse its arguments; 69 such runs cost test_bench_arguments.py ~165 s. Here one
server process (this file run as a script) imports torch once, and forks a child per run: the
child takes the run's working directory, argv and sys.path[0] (the script's folder, as
``python SCRIPT`` sets it), runs the script as ``__main__`` with stdin from /dev/null
and stdout / stderr into files, and exits with the script's exit status (SystemExit's code, 1
and a traceback on an uncaught exception), running its atexit handlers first. Nothing a run
does outlives its child, so runs cannot leak into each other or into pytest.

The environment: each run gets the caller's ``os.environ`` as it is at the call (a
monkeypatched variable included), set in the child before the script starts. Variables that
torch or its libraries read while torch loads (OpenMP / MKL / CUDA / torch's own, the dynamic
loader's, Python's) were fixed when the server started, so where one of those differs from the
server's, the run falls back to a real ``subprocess.run``. Triton and this package are NOT
preloaded: a script that sets TRITON_INTERPRET before importing triton still does so in time.
"""
from __future__ import annotations

import atexit
import json
import os
import shutil
import subprocess
import sys
import tempfile
import threading
import time
import warnings

_server = None
_server_env: dict = {}
_lock = threading.Lock()
# read while torch and its libraries load (a run whose value differs takes a real subprocess)
LOAD_TIME_PREFIXES = ("OMP_", "GOMP_", "KMP_", "MKL_", "OPENBLAS_", "CUDA_", "NVIDIA_",
                      "TORCH", "PYTORCH_", "LD_", "PYTHON", "MALLOC_", "NCCL_")


def _load_time_env(env) -> dict:
    return {k: v for k, v in env.items() if k.startswith(LOAD_TIME_PREFIXES)}


def _start_server() -> subprocess.Popen:
    global _server_env
    _server_env = _load_time_env(os.environ)
    return subprocess.Popen([sys.executable, __file__], stdin=subprocess.PIPE,
                            stdout=subprocess.PIPE, text=True, bufsize=1)


@atexit.register
def _stop_server() -> None:
    if _server is not None and _server.poll() is None:
        _server.stdin.close()
        try:
            _server.wait(timeout=10)
        except subprocess.TimeoutExpired:
            _server.kill()


def run_script(script, args=(), cwd=None, timeout: float = 120) -> subprocess.CompletedProcess:
    """``subprocess.run([sys.executable, script, *args], cwd=cwd, capture_output=True,
    text=True)``, run by the preloaded server. ``returncode`` is -9 if the run took longer than
    `timeout` seconds (its child is killed)."""
    global _server
    cwd = os.path.abspath(cwd if cwd is not None else os.getcwd())
    # as python: a relative SCRIPT is found from cwd, argv[0] is SCRIPT as given, __file__ its
    # absolute path (no link resolved), sys.path[0] its folder with links resolved
    request = {"script": os.path.join(cwd, script), "argv0": str(script),
               "args": [str(a) for a in args], "cwd": cwd, "timeout": timeout,
               "env": dict(os.environ)}
    with _lock:
        if _server is None or _server.poll() is not None:
            _server = _start_server()
        if _load_time_env(os.environ) != _server_env:
            return _real_python(request)
        _server.stdin.write(json.dumps(request) + "\n")
        line = _server.stdout.readline()
    if not line:
        raise RuntimeError(f"the preloaded CLI server exited (status {_server.poll()})")
    reply = json.loads(line)
    return subprocess.CompletedProcess([sys.executable, request["argv0"], *request["args"]],
                                       reply["returncode"], reply["stdout"], reply["stderr"])


def _real_python(request: dict) -> subprocess.CompletedProcess:
    cmd = [sys.executable, request["argv0"], *request["args"]]
    try:
        return subprocess.run(cmd, cwd=request["cwd"], capture_output=True, text=True,
                              timeout=request["timeout"], stdin=subprocess.DEVNULL)
    except subprocess.TimeoutExpired as exc:
        out, err = (b.decode(errors="replace") if isinstance(b, bytes) else (b or "")
                    for b in (exc.stdout, exc.stderr))
        return subprocess.CompletedProcess(cmd, -9, out, err)


# ---- the server (this file run as a script) ----

def _child(request: dict, out_path: str, err_path: str) -> None:
    """In the forked child: become ``python SCRIPT ARGS`` and never return."""
    code = 1
    try:
        null = os.open(os.devnull, os.O_RDONLY)
        os.dup2(null, 0)
        for fd, path in ((1, out_path), (2, err_path)):
            f = os.open(path, os.O_WRONLY | os.O_TRUNC)
            os.dup2(f, fd)
            os.close(f)
        sys.stdin = open(0, closefd=False)
        sys.stdout = open(1, "w", closefd=False)
        sys.stderr = open(2, "w", closefd=False)
        os.environ.clear()
        os.environ.update(request["env"])
        os.chdir(request["cwd"])
        script = request["script"]
        sys.argv = [request["argv0"], *request["args"]]
        sys.path[0] = os.path.dirname(os.path.realpath(script))
        import traceback
        import types
        from importlib.machinery import SourceFileLoader

        # the script as python's own __main__ (runpy.run_path would set argv[0] to the path)
        main = types.ModuleType("__main__")
        main.__file__, main.__builtins__ = script, __builtins__
        main.__loader__, main.__spec__ = SourceFileLoader("__main__", script), None
        sys.modules["__main__"] = main
        try:
            with open(script, "rb") as f:
                source = f.read()
            exec(compile(source, script, "exec"), main.__dict__)
            code = 0
        except SystemExit as exc:      # as the interpreter maps it
            if exc.code is None:
                code = 0
            elif isinstance(exc.code, int):
                code = exc.code
            else:
                print(exc.code, file=sys.stderr)
                code = 1
        except BaseException as exc:   # noqa: BLE001  (uncaught: the traceback, status 1)
            # from the script's frames on, as python prints it (this function's frame left out)
            traceback.print_exception(type(exc), exc, exc.__traceback__.tb_next)
            code = 1
        atexit._run_exitfuncs()
    finally:
        try:
            sys.stdout.flush()
            sys.stderr.flush()
        finally:
            os._exit(code & 0xFF)


def _fork_quietly() -> int:
    """os.fork() without Python 3.12+'s DeprecationWarning that the process is multi-threaded
    (the server is: numpy's OpenBLAS starts a thread when torch imports it; OpenBLAS re-forms
    its pool in a forked child). Parent and child both leave with the warning filters as they
    were, so a script's own fork still warns as under a fresh python."""
    with warnings.catch_warnings():    # (the child, too, leaves this block as it returns)
        warnings.filterwarnings("ignore", message=r"This process \(pid=\d+\) is multi-threaded",
                                category=DeprecationWarning)
        return os.fork()


def _serve() -> None:
    import torch  # noqa: F401  (the point of this server: imported once, shared by every fork)

    # (mkdtemp, not TemporaryDirectory: a child runs the atexit handlers it inherits, as a
    # fresh python that imported torch would, and a TemporaryDirectory's finalizer is one)
    tmp = tempfile.mkdtemp(prefix="preloaded-cli-")
    out_path, err_path = os.path.join(tmp, "out"), os.path.join(tmp, "err")
    try:
        for line in sys.stdin:
            request = json.loads(line)
            for path in (out_path, err_path):
                open(path, "w").close()
            sys.stdout.flush()
            pid = _fork_quietly()
            if pid == 0:
                _child(request, out_path, err_path)
            deadline = time.monotonic() + request["timeout"]
            while True:
                done, status = os.waitpid(pid, os.WNOHANG)
                if done:
                    returncode = os.waitstatus_to_exitcode(status)
                    break
                if time.monotonic() > deadline:
                    os.kill(pid, 9)
                    os.waitpid(pid, 0)
                    returncode = -9
                    break
                time.sleep(0.005)
            with open(out_path, errors="replace") as f_out, \
                    open(err_path, errors="replace") as f_err:
                reply = {"returncode": returncode, "stdout": f_out.read(), "stderr": f_err.read()}
            sys.stdout.write(json.dumps(reply) + "\n")
            sys.stdout.flush()
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    _serve()
