"""pytest plugin of bench/sanitize_native.sh: builds hiertail_fast's C kernels under
AddressSanitizer + UndefinedBehaviorSanitizer, and fails a test whose kernel did not load (the
eager torch fallback would pass without checking the C code).

Env: SAN_SERIAL=1 forces the serial (non-OpenMP) builds; SAN_EXTRA adds compiler flags."""
import os

import hiertail_fast.ops._native as native

_FLAGS = [f for f in native.FLAGS if f != "-O3"]
native.FLAGS[:] = ["-O1", "-g", "-fno-omit-frame-pointer", "-fsanitize=address,undefined",
                   "-fno-sanitize-recover=undefined", *os.environ.get("SAN_EXTRA", "").split(),
                   *_FLAGS]     # in place: every module holds the same list
if os.environ.get("SAN_SERIAL"):
    native.openmp_runtime = lambda: None

_load = native.load


def _checked_load(name, openmp=False):
    lib = _load(name, openmp)
    # (not where a test sets $CC to a failing compiler on purpose)
    if lib is None and native.enabled() and native.compiler() is not None \
            and not os.environ.get("CC"):
        raise RuntimeError(f"the sanitized build of native kernel {name!r} did not load")
    return lib


native.load = _checked_load
