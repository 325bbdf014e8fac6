"""Our ops' float32 GEMMs in IEEE float32, whatever torch's float32 matmul precision is set to:
the one module that touches torch's precision flags.

``torch.set_float32_matmul_precision("medium")`` (or ``torch.backends.mkldnn.matmul.
fp32_precision = "bf16"``) makes every float32 ``torch.mm`` on a CPU with bf16 units (AMX,
AVX512-BF16) round its inputs to bf16 inside oneDNN; ``"high"`` / ``"medium"`` /
``torch.backends.fp32_precision = "tf32"`` make cuBLAS use TF32 (10-bit mantissas). For a
model's layers that is the user's trade of precision for speed. Inside our ops it silently
breaks the error analysis the engines are built on (the logits' exponentials, the official
variant's cancellation, the nearest-prototype near-tie bound): measured on this project's CPU
(Xeon with AMX, torch 2.13, ``fp32_precision = "bf16"``, 3,000 rows, d 64, |s| <= 180) the
exact loss's gradient came back 2.4e-3 off (relative to its largest entry; 1e-7 at IEEE), the
official variant's 0.19 off, the hierarchical loss's 0.05, and ``nearest_prototype`` returned
another prototype for many rows. So every public op runs its forward and its backward inside
``ieee_matmuls()``; the plain-PyTorch reference follows torch's setting, as any PyTorch code
does (as it follows autocast, ``_amp``).

How, and why this way. torch has no per-call precision argument and its thread-local guard
(``at::NoTF32Guard``) is not exposed to Python, so the override is process-wide:

* while one of our calls runs, other threads' float32 matmuls also run at IEEE precision
  (slower, never less precise); calls on several threads share one override: the first to
  enter saves the flags and sets them, the last to leave restores them (a lock and a count).
  A flag another thread changes while our call runs is overwritten when the last call leaves;
* torch >= 2.9 keeps a legacy setting (``set_float32_matmul_precision``) beside per-backend
  flags (``torch.backends.{cuda,mkldnn}.matmul.fp32_precision``, each falling back to its
  backend's flag and then to the generic ``torch.backends.fp32_precision`` while "none"),
  and its cuBLAS check raises ("mix of the legacy and new APIs") inside every float32 CUDA
  GEMM where the legacy value and the cuBLAS flag disagree. The override sets both matmul
  flags to "ieee" (after which torch can always read the legacy value) and, where the legacy
  value is not "highest", sets it so (the two then agree); the restore sets the legacy value
  back, then each matmul flag to the value it was SET to. The getters return resolved values
  (a flag at "none" reads as its fallback's), so that value is found by a probe under the
  lock: the fallback is set to another value for an instant and back; a flag that follows it
  was "none" (an exact restore: an explicit value restored as "none", or the reverse, had
  left later changes of the fallback moving the flag, or legacy value and cuBLAS flag
  disagreeing). Other threads may see a probe's value for that instant;
* a setting another thread makes while calls run inside the override is taken in by the
  next call that enters (IEEE again; the new setting is what is restored). Calls already
  running may compute partly at it until then, and a setting made between the steps of the
  final restore (legacy value, then each flag) can leave torch's flags disagreeing: torch
  has no atomic way to set them all;
* TorchDynamo guards compiled code on global state that includes the cuBLAS TF32 switch: a
  compilation running in ANOTHER thread while one of our calls holds the override can fail
  with "Guard failed on the same frame it was created" (seen once in 30 compilations under
  "high", by an audit); compiling in the calling thread, or with the flags at "highest", is
  unaffected;
* torch < 2.9 has the legacy setting only: "highest" for the call, the old value after.
"""
from __future__ import annotations

import threading

import torch

from hiertail_fast._threads import in_forked_child

# per-backend flags (torch >= 2.9), through the functions torch.backends' properties call
_GET = getattr(torch._C, "_get_fp32_precision_getter", None)
_SET = getattr(torch._C, "_set_fp32_precision_setter", None)
PER_BACKEND_FLAGS = _GET is not None and _SET is not None
_BACKENDS = ("mkldnn", "cuda")          # CPU (oneDNN) and cuBLAS float32 GEMMs
_REDUCED = {"mkldnn": ("bf16", "tf32"), "cuda": ("tf32",)}

_lock = threading.Lock()
_depth = 0                     # calls inside the override now
_saved: dict | None = None     # what the first of them found, to restore


@in_forked_child
def _after_fork_in_child() -> None:
    """In a forked child (a DataLoader worker): a new lock, and no override. The calls of the
    parent's threads inside it at the fork do not run in the child, so none would ever leave:
    the child kept the lock held (its first op hung) or the user's reduced-precision setting
    overridden for good. That setting comes back; a fork during another thread's first
    override or last restore (between its flag writes) may leave a flag at IEEE."""
    global _lock, _depth, _saved
    _lock = threading.Lock()
    saved, _saved = _saved, None
    if _depth and saved is not None:
        _restore(saved)
    _depth = 0


def _flag(backend: str, op: str = "matmul") -> str:
    return _GET(backend, op)


def _legacy() -> str | None:
    """set_float32_matmul_precision's value, or None where torch refuses to read it."""
    try:
        return torch.get_float32_matmul_precision()
    except RuntimeError:                # "mix of the legacy and new APIs"
        return None


def reduced() -> bool:
    """Whether torch's settings make float32 GEMMs round their inputs (CPU or CUDA)."""
    if PER_BACKEND_FLAGS:
        return any(_flag(b) in _REDUCED[b] for b in _BACKENDS)
    return torch.get_float32_matmul_precision() != "highest"


_OTHER = {"ieee": "tf32"}        # a probe's value: anything but the value read ("ieee" else)


def _probe(level: tuple[str, str], level_value: str, read) -> str:
    """"none" when the flag ``read`` returns follows ``level`` (it moves when level is set to
    another value for an instant), else the value it reads; ``level`` is set back to
    ``level_value`` (its own value as set)."""
    before = read()
    other = _OTHER.get(before, "ieee")
    _SET(*level, other)
    follows = read() == other
    _SET(*level, level_value)
    return "none" if follows else before


def _matmul_as_set(backend: str) -> str:
    """The value ``backend``'s matmul flag was set to ("none" where it follows its
    fallbacks), not the resolved value its getter returns."""
    generic = _flag("generic", "all")               # nothing above it: as set
    all_resolved = _flag(backend, "all")
    all_set = all_resolved if all_resolved != generic else _probe(
        ("generic", "all"), generic, lambda: _flag(backend, "all"))
    resolved = _flag(backend)
    if resolved != all_resolved:
        return resolved
    return _probe((backend, "all"), all_set, lambda: _flag(backend))


def _override() -> dict:
    """Set IEEE float32 GEMMs; -> what is needed to restore the flags exactly."""
    if not PER_BACKEND_FLAGS:
        legacy = _legacy()
        torch.set_float32_matmul_precision("highest")
        return {"legacy": legacy}
    flags = {b: _matmul_as_set(b) for b in _BACKENDS}
    for b in _BACKENDS:
        _SET(b, "matmul", "ieee")
    legacy = _legacy()          # readable now: the checks that refuse it need a flag not IEEE
    if legacy is not None and legacy != "highest":
        torch.set_float32_matmul_precision("highest")   # legacy HIGHEST, both flags IEEE
    return {"legacy": legacy, "flags": flags}


def _restore(saved: dict) -> None:
    if saved["legacy"] not in (None, "highest"):
        torch.set_float32_matmul_precision(saved["legacy"])   # (sets both flags: below)
    for b, value in saved.get("flags", {}).items():
        _SET(b, "matmul", value)


def _take_in(saved: dict) -> dict:
    """Flags the user set while calls ran inside the override (another thread): IEEE again
    for the calls that enter now, and the user's setting is what is restored at the end.
    Before, only the first call looked at the flags: a call entering while others ran
    computed at the user's new reduced precision (a gradient 0.13 off)."""
    legacy = _legacy()
    if not PER_BACKEND_FLAGS or (legacy is not None and legacy != "highest"):
        return _override()          # set_float32_matmul_precision again: all of it anew
    for b in _BACKENDS:
        if _flag(b) in _REDUCED[b]:             # a flag (or its fallback) set since
            saved["flags"][b] = _matmul_as_set(b)
            _SET(b, "matmul", "ieee")
    return saved


class _IEEEMatmuls:
    """The override for one call (``ieee_matmuls``). Decided under the lock on entry, every
    time: flags at IEEE and no override running -> nothing to do for this call (a change
    another call makes later is an override of its own, counted and restored by it); flags
    reduced while an override runs -> the user's new setting is taken in (``_take_in``)."""

    active = False

    def __enter__(self):
        global _depth, _saved
        if torch.compiler.is_compiling():
            return self
        with _lock:
            if _depth == 0:
                if not reduced():
                    return self
                _saved = _override()
            elif reduced():
                _saved = _take_in(_saved)
            _depth += 1
            self.active = True
        return self

    def __exit__(self, *exc):
        global _depth, _saved
        if not self.active:
            return
        with _lock:
            _depth -= 1
            if _depth == 0:
                saved, _saved = _saved, None
                _restore(saved)


def ieee_matmuls() -> _IEEEMatmuls:
    """A context in which float32 torch GEMMs run in IEEE float32 (the module docstring);
    nothing is touched when torch's settings are IEEE already, or while torch.compile traces
    (the compiled op's call runs its eager body, which enters it)."""
    return _IEEEMatmuls()
