"""The CPU loss engine's float32 GEMMs on oneDNN where torch's BLAS runs slow code: one adapter.

torch's x86 wheels do ``torch.mm`` in MKL. MKL picks its kernels by CPU vendor, and on AMD
CPUs it runs code paths that leave much of the chip unused. oneDNN, the other CPU library
inside torch, picks its kernels by instruction set. On this project's 2-core AMD EPYC VM
(AVX-512, torch 2.13.0+cpu; ``bench/cpu_gemm.py``, idle, round-robin) a symmetric-engine tile
of 256 x 16,384 keys, d 128, took 23.6 ms in torch.mm and 14.9 ms in oneDNN (1.59x; the
logits 1.90x, the rows' product 1.83x, the keys' 1.08x), and a whole HierTail epoch at 100k
nodes 41.1 s -> 24.0 s (``bench/epoch_ab.py``, the engine's 4 MiB tiles; loss equal).

torch reaches oneDNN's plain float32 matmul only through a private op,
``torch.ops.mkldnn._linear_pointwise(X, W, bias, "none", [], "")`` = X @ W^T, which takes
dense tensors (what torch's own compiler emits for frozen linear layers). This module is the
ONE place that calls it:

* ``supported`` / ``_op``: a torch release the adapter knows, the op present with the
  argument names used below (a schema probe), oneDNN built in; anything else: torch.mm;
* ``_probe``: one small GEMM of each form used (X W^T with W contiguous and with W a
  transposed view) checked against float64 within float32's error bound. oneDNN may round
  float32 inputs to bf16 or TF32 (its "fpmath mode": ``ONEDNN_DEFAULT_FPMATH_MODE``, or torch's
  mkldnn precision flag, which our ops hold at IEEE during a call, ``_matmul_precision``, and
  the probe too): that makes the logits' exponentials wrong by percents, and the probe sends
  every GEMM back to torch.mm (a non-STRICT ``ONEDNN_DEFAULT_FPMATH_MODE`` does so without
  probing);
* ``provider()``: ``HIERTAIL_CPU_GEMM`` = ``auto`` (default) | ``onednn`` | ``blas``. ``auto``
  takes oneDNN on x86-64 Linux machines whose CPU vendor is not Intel and whose torch BLAS is
  MKL (the case measured); on Intel CPUs MKL is at home and stays. ``onednn`` where the
  adapter says no is a ValueError naming why.

Only float32 CPU tensors go to oneDNN; anything else takes torch.mm / addmm as before.
"""
from __future__ import annotations

import functools
import os
import platform

import torch

from hiertail_fast._validation import env_choice
from hiertail_fast.ops._matmul_precision import ieee_matmuls
from hiertail_fast.ops._torch_release import torch_release

ENV_VAR = "HIERTAIL_CPU_GEMM"
CHOICES = ("auto", "onednn", "blas")
FPMATH_ENV = "ONEDNN_DEFAULT_FPMATH_MODE"
# the private op and the argument names used below, checked on torch 2.13 (the CPU machines)
# and present since 2.1; other releases go through the schema probe in `_op()`
MIN_TORCH = (2, 1)
_OP_ARGS = ("X", "W", "B", "attr", "scalars", "algorithm")
_NO_OP = "torch.ops.mkldnn._linear_pointwise is not available in this torch build"


def supported(version: tuple[int, int] | None = None) -> bool:
    """Whether this torch release is one the adapter knows (>= MIN_TORCH)."""
    return (version or torch_release()) >= MIN_TORCH


@functools.lru_cache(maxsize=None)
def _op():
    """``torch.ops.mkldnn._linear_pointwise.default`` if usable here, else None."""
    if not supported() or not torch.backends.mkldnn.is_available():
        return None
    packet = getattr(getattr(torch.ops, "mkldnn", None), "_linear_pointwise", None)
    try:
        op = packet.default
        have = tuple(a.name for a in op._schema.arguments)
    except (AttributeError, RuntimeError):
        return None
    return op if have == _OP_ARGS else None


@functools.lru_cache(maxsize=None)
def _cpu_vendor() -> str | None:
    """/proc/cpuinfo's vendor_id (Linux), else None. Read once per process (30 us a read:
    ``provider()`` runs on every CPU loss call, tiny ones too)."""
    try:
        with open("/proc/cpuinfo", encoding="ascii", errors="replace") as f:
            for line in f:
                if line.startswith("vendor_id"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        return None
    return None


def _fpmath_strict() -> bool:
    """False when ONEDNN_DEFAULT_FPMATH_MODE lets oneDNN round float32 inputs."""
    return os.environ.get(FPMATH_ENV, "").strip().upper() in ("", "STRICT")


@functools.lru_cache(maxsize=None)
def _probe() -> str | None:
    """None when oneDNN's float32 GEMM meets float32's error bound in both forms used, else
    why not. Cached: run once per process (inside our ops, at IEEE precision flags)."""
    op = _op()
    if op is None:
        return _NO_OP
    g = torch.Generator().manual_seed(0)
    x = torch.randn(67, 160, generator=g)
    w = torch.randn(45, 160, generator=g)
    for weight in (w, w.t().contiguous().t()):     # contiguous, and a transposed view
        with ieee_matmuls():                       # as in our ops' calls
            got = op(x, weight, None, "none", [], "").double()
        want = x.double() @ weight.double().t()
        # |error| <= K * 2^-24 * |x| |w|^T for any summation order (plus a margin of 2)
        bound = 2 * 160 * 2.0 ** -24 * (x.double().abs() @ weight.double().abs().t())
        if got.shape != want.shape or not bool(((got - want).abs() <= bound).all()):
            return ("oneDNN's float32 GEMM is off by more than float32 rounding here (an "
                    f"fpmath mode that rounds to bf16 or TF32? {FPMATH_ENV}="
                    f"{os.environ.get(FPMATH_ENV, '')!r})")
    return None


def _unavailable() -> str | None:
    """Why oneDNN cannot serve the GEMMs here, or None."""
    if _op() is None:
        return _NO_OP
    if not _fpmath_strict():
        return f"{FPMATH_ENV}={os.environ[FPMATH_ENV]!r} lets oneDNN round float32 inputs"
    return _probe()


def _auto_machine() -> bool:
    """The machines ``auto`` sends to oneDNN: x86-64 Linux, CPU vendor not Intel, MKL BLAS."""
    return (platform.machine().lower() in ("x86_64", "amd64")
            and _cpu_vendor() not in (None, "GenuineIntel")
            and torch.backends.mkl.is_available())


def choice() -> str:
    """HIERTAIL_CPU_GEMM's value (unset or empty: auto); anything else a ValueError."""
    return env_choice(ENV_VAR, CHOICES)


def provider() -> str:
    """"onednn" or "blas": who computes the CPU engine's float32 GEMMs now."""
    want = choice()
    if want == "blas":
        return "blas"
    if want == "auto" and not _auto_machine():
        return "blas"
    why = _unavailable()
    if why is None:
        return "onednn"
    if want == "onednn":
        raise ValueError(f"{ENV_VAR}=onednn, but {why}")
    return "blas"


def _takes(*tensors: torch.Tensor) -> bool:
    return all(t.dtype == torch.float32 and t.device.type == "cpu" for t in tensors)


def mm_nt(a: torch.Tensor, b: torch.Tensor, out: torch.Tensor | None = None,
          use: str | None = None) -> torch.Tensor:
    """a @ b.T (a [M, K], b [N, K]). oneDNN returns a fresh tensor; torch.mm writes into
    ``out`` when given. ``use``: a ``provider()`` value read once by the caller."""
    if (use or provider()) == "onednn" and _takes(a, b):
        return _op()(a, b, None, "none", [], "")
    return torch.mm(a, b.t(), out=out)


def add_mm_(acc: torch.Tensor, a: torch.Tensor, b: torch.Tensor,
            use: str | None = None) -> torch.Tensor:
    """acc += a @ b (a [M, K], b [K, N]) in place; returns acc.

    oneDNN: a row-major ``a`` (the tile S [B, C] times keys [C, d]) as X @ W^T with W = b^T;
    a transposed view (S^T [C, B] times rows [B, d]: the long side first) as (b^T a^T)^T, X =
    b^T made contiguous (small), W = a itself, which reads S row-major (the first form on it
    ran 1.5x slower than torch.mm, this one as fast or faster: bench/cpu_gemm.py)."""
    if (use or provider()) == "onednn" and _takes(acc, a, b):
        if a.is_contiguous():
            return acc.add_(_op()(a, b.t(), None, "none", [], ""))
        add_mm_t_(acc.t(), a, b, use="onednn")
        return acc
    return acc.addmm_(a, b)


def add_mm_t_(acc_t: torch.Tensor, a: torch.Tensor, b: torch.Tensor,
              use: str | None = None) -> torch.Tensor:
    """acc_t += (a @ b)^T in place (a [M, K], b [K, N], acc_t [N, M]); returns acc_t.

    oneDNN: (a b)^T = b^T a^T as X @ W^T with X = b^T made contiguous (small) and W = a, as in
    ``add_mm_``'s transposed form, and its fresh [N, M] result adds into acc_t row by row. The
    symmetric engine keeps its keys' products in such a transposed accumulator: added into the
    [M, N] rows of dz through a transposed view, that result was a strided add of 0.46 ms per
    256 x 4,096-key tile (d 128) against 0.03 ms row by row, next to 0.75 ms for the product."""
    if (use or provider()) == "onednn" and _takes(acc_t, a, b):
        return acc_t.add_(_op()(b.t().contiguous(), a, None, "none", [], ""))
    acc_t.t().addmm_(a, b)
    return acc_t
