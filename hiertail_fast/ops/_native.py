"""Small C kernels of the CPU engine, compiled on first use with the system C compiler.

Why: a few element-wise steps of the CPU loss (the official variant's positive pairs) are six
eager torch passes and dozens of small calls per block where one fused loop does it; PyTorch
has no fused op for them, and ``torch.compile`` costs 7-30 s per process before its first call.
A plain C99 file (no Python or torch headers) compiles in well under a second with ``cc`` — the
compiler Triton and the optional torch-scatter build already need — and is loaded with ctypes.

Where there is no compiler, or the build fails, or ``HIERTAIL_NATIVE=0``, ``load`` returns
None (one warning per process for a failed build) and the callers keep their eager torch path,
which stays tested. Builds are cached per source, compiler, flags and CPU (``-march=native``:
the binary is built on the machine that runs it) under ``HIERTAIL_NATIVE_CACHE`` (default:
``~/.cache/hiertail_fast/native``; the temp directory if that cannot be written), written to a
temporary file and renamed into place, so concurrent processes never load a half-written
library.

Threads: ``load(name, openmp=True)`` builds the kernel with ``-fopenmp`` but does NOT link an
OpenMP runtime of its own: its ``#pragma omp parallel`` regions run on the runtime torch already
loaded (``libgomp`` of the torch wheel; Intel's and LLVM's runtimes export the same GOMP entry
points), made global first. So the kernel's row loop uses torch's own worker threads, which
spin-wait right after every torch op: a second thread pool of ours (or Python threads) would
compete with those spinning workers for the same cores instead of using them. Where no such
runtime is loaded, or the build or load fails (e.g. a compiler with another OpenMP ABI), the
serial build of the same file is used.
"""
from __future__ import annotations

import ctypes
import hashlib
import os
import platform
import shutil
import subprocess
import tempfile
import threading
import warnings
from pathlib import Path

from hiertail_fast._files import atomic_path, unwritable_dir_reason
from hiertail_fast._threads import in_forked_child
from hiertail_fast._validation import env_switch

_HERE = Path(__file__).resolve().parent
FLAGS = ["-O3", "-march=native", "-fopenmp-simd", "-fno-math-errno", "-std=gnu99", "-shared",
         "-fPIC"]
_LOCK = threading.Lock()      # held by load(): for the whole C compile at a kernel's first use
_LOADED: dict[str, ctypes.CDLL | None] = {}
_WARNED: list[str] = []       # the kernel whose failed build was reported (one per process)


@in_forked_child
def _fresh_lock_after_fork() -> None:
    """In a forked child (a DataLoader worker): the lock as new. A parent thread compiling a
    kernel at the fork held it, and the child, where that thread does not exist, hung at its
    first native call (a mutation audit; _graph_cache.py resets its graphs' locks alike)."""
    global _LOCK
    _LOCK = threading.Lock()



def enabled() -> bool:
    """False when the user switched the native kernels off (``HIERTAIL_NATIVE=0``)."""
    return env_switch("HIERTAIL_NATIVE", True)


def compiler() -> str | None:
    """The C compiler to use: ``$CC``, else ``cc``/``gcc``/``clang`` on PATH; None if none."""
    for name in (os.environ.get("CC"), "cc", "gcc", "clang"):
        if name and shutil.which(name.split()[0]):
            return name
    return None


def _cpu_signature() -> str:
    """The CPU's model and feature flags (the key of a ``-march=native`` build)."""
    try:
        with open("/proc/cpuinfo") as f:
            lines = [ln for ln in f if ln.startswith(("model name", "flags"))][:2]
        return "".join(lines)
    except OSError:
        return platform.processor() + platform.machine()


def cache_dir() -> Path:
    env = os.environ.get("HIERTAIL_NATIVE_CACHE")
    if env:
        return Path(env)
    return Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "hiertail_fast" \
        / "native"


def _build(source: Path, cc: str, openmp: bool = False) -> Path:
    """Compile ``source`` into the cache (if not there yet) and return the library's path.
    ``openmp``: compiled with -fopenmp, linked without a runtime (GOMP symbols left undefined,
    resolved at load time from the runtime torch loaded; ``openmp_runtime``)."""
    key = hashlib.sha256()
    headers = [h.read_bytes() for h in sorted(source.parent.glob("*.h"))]   # it may include
    for part in (source.read_bytes(), *headers, cc.encode(), " ".join(FLAGS).encode(),
                 _cpu_signature().encode(), b"openmp" if openmp else b""):
        key.update(part)
    name = f"{source.stem}{'-omp' if openmp else ''}-{key.hexdigest()[:16]}.so"
    user = os.getuid() if hasattr(os, "getuid") else os.environ.get("USERNAME", "user")
    fallback = Path(tempfile.gettempdir()) / f"hiertail_fast-native-{user}"
    reasons = []
    for out_dir in (cache_dir(), fallback):      # an unwritable cache: the temp directory
        lib = out_dir / name
        reason = _foreign_dir_reason(out_dir) if out_dir == fallback else None
        if reason is None and _intact(lib):
            return lib
        reason = reason or unwritable_dir_reason(out_dir)
        if reason is None:
            break
        reasons.append(reason)
    else:
        raise OSError("no writable directory for the build: " + "; ".join(reasons))
    with atomic_path(lib) as tmp:           # a reader sees no file or the whole one
        if openmp:                          # compile with -fopenmp, link without its runtime
            obj = Path(str(tmp) + ".o")
            try:
                _run(cc, [*FLAGS, "-fopenmp", "-c", str(source), "-o", str(obj)], source)
                _run(cc, ["-shared", "-fPIC", str(obj), "-o", str(tmp), "-lm"], source)
            finally:
                obj.unlink(missing_ok=True)
        else:
            _run(cc, [*FLAGS, str(source), "-o", str(tmp), "-lm"], source)
    with atomic_path(_digest_path(lib)) as tmp:   # written after the library: see _intact
        tmp.write_text(_digest(lib))
    return lib


def _digest(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def _digest_path(lib: Path) -> Path:
    return lib.with_name(lib.name + ".sha256")


def _intact(lib: Path) -> bool:
    """Whether ``lib`` is the file its build wrote (its sha256 as recorded beside it). Only
    then is it loaded: a truncated .so (a copied or synced cache, a disk fault) was mapped by
    the loader and killed the process with SIGBUS on every run; another kernel's library
    under the name failed at the first symbol. Otherwise it is built again (atomically)."""
    try:
        return _digest_path(lib).read_text().strip() == _digest(lib)
    except OSError:
        return False


def _foreign_dir_reason(path: Path) -> str | None:
    """Why the temp-directory fallback at ``path`` must not be used: another user owns it or
    others may write to it (its name is predictable, in a world-writable directory: a
    library planted there would be loaded)."""
    try:
        path.mkdir(mode=0o700, exist_ok=True)   # ours alone when we create it
        st = path.stat()
    except OSError:
        return None                              # (unwritable_dir_reason says why)
    if hasattr(os, "getuid") and (st.st_uid != os.getuid() or st.st_mode & 0o022):
        return f"{path} is not a directory only this user may write to"
    return None


def _run(cc: str, args: list[str], source: Path) -> None:
    proc = subprocess.run([*cc.split(), *args], capture_output=True, text=True, timeout=120)
    if proc.returncode != 0:
        raise RuntimeError(f"{cc} failed on {source.name}:\n{proc.stderr.strip()[-2000:]}")


_RUNTIME_NAMES = ("libgomp", "libiomp5", "libomp")


def openmp_runtime() -> str | None:
    """Path of the OpenMP runtime already loaded into this process (torch's), made global so a
    kernel library can bind its GOMP entry points to it; None if there is none (no /proc, a
    torch without OpenMP) or it cannot be promoted."""
    try:
        with open("/proc/self/maps") as f:
            paths = {ln.split()[-1] for ln in f if "/" in ln}
    except OSError:
        return None
    for path in sorted(paths):
        if not Path(path).name.startswith(_RUNTIME_NAMES):
            continue
        try:                               # already loaded: RTLD_NOLOAD only promotes it
            rt = ctypes.CDLL(path, mode=os.RTLD_GLOBAL | getattr(os, "RTLD_NOLOAD", 0))
        except OSError:
            continue
        if hasattr(rt, "GOMP_parallel"):
            return path
    return None


def load(name: str, openmp: bool = False) -> ctypes.CDLL | None:
    """The compiled ``hiertail_fast/ops/<name>.c`` (built once per process and machine), or
    None when native kernels are off or cannot be built here. ``openmp``: the build whose
    parallel regions run on torch's OpenMP threads if that works here, else the serial one;
    the library's ``threaded`` attribute says which."""
    if not enabled():
        return None
    key = f"{name}+omp" if openmp else name
    with _LOCK:
        if key in _LOADED:
            return _LOADED[key]
        lib = None
        cc = compiler()
        if cc is not None and openmp and openmp_runtime() is not None:
            try:                          # a speed-up only: on failure, the serial build
                lib = ctypes.CDLL(str(_build(_HERE / f"{name}.c", cc, openmp=True)))
                lib.threaded = True
            except Exception:
                lib = None
        if cc is not None and lib is None:
            try:
                lib = ctypes.CDLL(str(_build(_HERE / f"{name}.c", cc)))
                lib.threaded = False
            except Exception as err:      # an optional accelerator: any failure -> torch path
                if not _WARNED:           # one warning per process, not one per kernel
                    _WARNED.append(name)
                    warnings.warn(f"hiertail_fast: native CPU kernel {name!r} unavailable, "
                                  f"using the torch path ({err}); other kernels that fail to "
                                  f"build are not reported again", RuntimeWarning,
                                  stacklevel=2)
        _LOADED[key] = lib
        return lib


# ctypes argument types of the kernels' C functions (``threaded_function``)
I64, PTR, F32, F64 = ctypes.c_int64, ctypes.c_void_p, ctypes.c_float, ctypes.c_double


def threaded_function(name: str, symbol: str, argtypes: list):
    """The C function ``symbol`` of ``hiertail_fast/ops/<name>.c`` (the OpenMP build, see
    ``load``) with its argument types set once and an int64 result (the kernels return how
    many threads ran), or None when native kernels are off or cannot be built here."""
    lib = load(name, openmp=True)
    if lib is None:
        return None
    fn = getattr(lib, symbol)
    if fn.argtypes is None:
        fn.argtypes = argtypes
        fn.restype = I64
    return fn
