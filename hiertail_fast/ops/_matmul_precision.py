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
  flags (``torch.backends.{cuda,mkldnn}.matmul.fp32_precision``, falling back to their
  backend's and then the generic ``torch.backends.fp32_precision``), and its TF32 check for
  cuBLAS raises ("mix of the legacy and new APIs") when legacy and cuBLAS flag disagree. The
  override sets what ``set_float32_matmul_precision("highest")`` sets (the two agree) and
  restores the legacy value first, then each per-backend flag. The getters return resolved
  values, so a per-backend flag that equals its fallback is restored as "none" (following the
  fallback again): the same precision, told apart only by a later change of the fallback;
* where torch itself refuses to read the legacy value (the user's flags already disagree),
  the legacy value is left as it is and only the per-backend flags are overridden;
* a setting another thread makes while calls run inside the override is taken in by the
  next call that enters (IEEE again; the new setting is what is restored). Calls already
  running may compute partly at it until then, and a setting made between the steps of the
  final restore (legacy value, then each flag) can leave torch's flags disagreeing: torch
  has no atomic way to set them all;
* torch < 2.9 has the legacy setting only: "highest" for the call, the old value after.
"""
from __future__ import annotations

import threading

import torch

# per-backend flags (torch >= 2.9), through the functions torch.backends' properties call
_GET = getattr(torch._C, "_get_fp32_precision_getter", None)
_SET = getattr(torch._C, "_set_fp32_precision_setter", None)
PER_BACKEND_FLAGS = _GET is not None and _SET is not None
_BACKENDS = ("mkldnn", "cuda")          # CPU (oneDNN) and cuBLAS float32 GEMMs
_REDUCED = {"mkldnn": ("bf16", "tf32"), "cuda": ("tf32",)}

_lock = threading.Lock()
_depth = 0                     # calls inside the override now
_saved: dict | None = None     # what the first of them found, to restore


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


def _cublas_tf32() -> bool | None:
    """torch's cuBLAS TF32 switch as its own check reads it (legacy value against the cuBLAS
    flag), or None where that check raises (the two disagree: every float32 CUDA GEMM calls
    that check and raises too)."""
    try:
        return bool(torch._C._get_cublas_allow_tf32())
    except (RuntimeError, AttributeError):
        return None


def _override() -> dict:
    """Set IEEE float32 GEMMs; -> what is needed to restore the flags. The legacy value and
    the cuBLAS flag must agree (torch's cuBLAS check raises otherwise, inside every float32
    CUDA GEMM): where the legacy value is readable, "highest" sets both; where it is not but
    the cuBLAS pair agrees (set_float32_matmul_precision("medium") then allow_tf32 = True:
    torch's own legacy getter refuses that state), the cuBLAS switch sets both halves of the
    pair; where even that pair disagrees (legacy "highest" with a cuBLAS flag at TF32: every
    float32 CUDA GEMM raises for the user), the cuBLAS flag set to IEEE makes it agree for
    the call, and any other disagreement it leaves as it was."""
    legacy = _legacy()
    if not PER_BACKEND_FLAGS:
        torch.set_float32_matmul_precision("highest")
        return {"legacy": legacy}
    flags = {b: _flag(b) for b in _BACKENDS}
    saved: dict = {"legacy": None, "cublas": None, "flags": flags}
    if legacy is not None and legacy != "highest":
        torch.set_float32_matmul_precision("highest")   # legacy HIGHEST, both flags IEEE
        saved["legacy"] = legacy
    elif legacy is None and _cublas_tf32():
        torch._C._set_cublas_allow_tf32(False)            # legacy HIGHEST + cuBLAS IEEE
        saved["cublas"] = True
    for b in flags:
        _SET(b, "matmul", "ieee")
    return saved


def _restore(saved: dict) -> None:
    """The flags as ``_override`` found them. After the legacy setter (which sets both
    per-backend flags explicitly) a flag is set again only where it differs from what was
    found; otherwise a flag equal to its fallback is restored as "none" (the getters return
    resolved values: an explicit value equal to its fallback cannot be told from "none")."""
    legacy_set = saved["legacy"] is not None or saved.get("cublas")
    if saved["legacy"] is not None:
        torch.set_float32_matmul_precision(saved["legacy"])
    elif saved.get("cublas"):
        torch._C._set_cublas_allow_tf32(True)             # legacy HIGH + cuBLAS TF32
    for b, value in saved.get("flags", {}).items():
        if legacy_set and _flag(b) == value:
            continue                        # as the legacy setter left it: explicit, as found
        fallback = _flag(b, "all")      # what "none" resolves to: the backend's, else generic
        _SET(b, "matmul", "none" if value == fallback else value)


def _take_in(saved: dict) -> dict:
    """Flags the user set while calls ran inside the override (another thread): IEEE again
    for the calls that enter now, and the user's setting is what is restored at the end.
    Before, only the first call looked at the flags: a call entering while others ran
    computed at the user's new reduced precision (a gradient 0.13 off)."""
    legacy = _legacy()
    if not PER_BACKEND_FLAGS or (legacy is not None and legacy != "highest"):
        return _override()          # set_float32_matmul_precision again: all of it anew
    for b in saved["flags"]:
        value = _flag(b)
        if value != "ieee":         # a per-backend flag set since
            saved["flags"][b] = value
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
