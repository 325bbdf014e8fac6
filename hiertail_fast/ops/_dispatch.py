"""Backend selection, decided in exactly one place.

Rules, in order:
1. ``backend=`` on the call, else ``HIERTAIL_BACKEND=reference|torch|triton`` (environment),
   forces a backend.
2. With an op name (every op's call site passes one), the automatic backend is the one that
   MEASURED faster for that op on that device class: `AUTO_BACKEND` below, one row per op and
   device class, with the figures and the card they came from. A "triton" row falls back to
   "torch" when triton cannot run on the tensor's device (not importable); a device class
   without a row (e.g. "mps") uses "torch".
3. Without an op name (the old rule, kept for callers outside the package): CUDA tensors use the
   Triton kernels, everything else the fast torch path.

The contrastive loss has one more backend, ``attention`` (PyTorch's attention kernels), and its
own entry, `choose_loss_backend`: its table row, refined by variant and level count where the
measurement said so, and float64 always on our float64 engine.

`triton` on CPU tensors only works under `TRITON_INTERPRET=1` (that is how the kernels are
tested without a GPU); asking for it otherwise is a clear error, not a crash in a kernel.
"""
from __future__ import annotations

import contextlib
import functools
import os
from typing import NamedTuple

import torch

from hiertail_fast.ops._amp import autocast_off
from hiertail_fast.ops._functorch import check_transforms
from hiertail_fast.ops._matmul_precision import ieee_matmuls

BACKENDS = ("reference", "torch", "triton")
# backends one op has beyond BACKENDS (requested with backend= on that op's calls only)
OP_BACKENDS = {"balanced_contrastive_loss": ("attention",)}
ENV_VAR = "HIERTAIL_BACKEND"
OPS = ("gcn_propagate", "topk_pool", "nearest_prototype", "balanced_contrastive_loss")


class AutoChoice(NamedTuple):
    backend: str
    evidence: str  # the measurement behind the choice: figures, card, source file


_H200 = ("NVIDIA H200, torch 2.11.0+cu130, triton 3.6.0, 2026-11-26 "
         "(shared/gpu-runs/2026-11-26-h200/SUMMARY.md")
_CPU = "Triton runs on CPU only under the interpreter (a testing aid, orders slower)"

# THE table: op -> device class -> automatic backend. Update a row only with a measurement on
# the device class it names, and say where the figures are.
AUTO_BACKEND: dict[str, dict[str, AutoChoice]] = {
    "gcn_propagate": {
        "cpu": AutoChoice("torch", _CPU),
        "cuda": AutoChoice("torch", f"{_H200} §4): 1M nodes / 10M edges, fwd d=64/128 torch "
                           "(cuSPARSE CSR) 1.2/1.8 ms vs triton 2.3/4.0 ms; fwd+bwd 2.5/3.5 vs "
                           "4.6/7.9 ms. Again 2026-11-27 (bench/gpu_report.py, H200): fwd "
                           "1.59/1.86 vs 2.51/4.51 ms, fwd+bwd d=64 2.50 vs 4.88 ms"),
    },
    "topk_pool": {
        "cpu": AutoChoice("torch", _CPU),
        "cuda": AutoChoice("triton", f"{_H200} §4): 1M nodes / 10M edges, fwd+bwd d=64/128 "
                           "triton 2.7/3.2 ms vs torch 4.6/5.6 ms. Again 2026-11-27 "
                           "(bench/gpu_report.py, H200): d=64 triton 3.09 vs torch 10.47 ms"),
    },
    "nearest_prototype": {
        "cpu": AutoChoice("torch", _CPU),
        "cuda": AutoChoice("triton", f"{_H200} §4): 1M rows x 282 prototypes, d=128, triton "
                           "8.0 ms vs torch 19.8 ms"),
    },
    "balanced_contrastive_loss": {
        # CPU: the attention kernels (CPU flash attention) for the exact single-level loss only
        # without our C kernels (no C compiler, or HIERTAIL_SYMMETRIC=0); with them our torch
        # engines at every size and dtype, and for the official variant and several levels
        # (`_automatic_engine`), which measured faster there.
        "cpu": AutoChoice("attention", "2-core AMD EPYC (torch 2.13, 2 threads, idle), "
                          "bench/loss_grid.py --levels 1: the symmetric torch engine vs attention "
                          "on the cells where attention runs its own kernel (normalised, relu), "
                          "medians: 6k 1.29x, 20k 1.23x faster (docs/results/loss_grid_{6000,"
                          "20000}_L1_symmetric.md); official / 3 levels: torch faster (1.75x / "
                          "2.0-2.5x). Before the symmetric engine: exact 1 level N=100k d=128 "
                          "attention 65.1 s vs row-block torch 85.9 s"),
        # "attention" = PyTorch's fused attention kernels through ops/_attention_lse.py (the
        # loss's own backend; float64, logits over its precision guard and shapes the kernels
        # refuse go to our torch engine, `own_engine`).
        "cuda": AutoChoice("attention", "NVIDIA H200, torch 2.11.0+cu130, triton 3.6.0, "
                           "2026-11-27, bench/gpu_report.py: exact loss fwd+bwd fp32, N = 20k, "
                           "d = 64, 1 level: attention 12.2 ms, torch 36.7 ms, triton 256.1 ms "
                           "(SDPA fp32 fwd+bwd 15.4 ms); 3 levels: 28.7 / 113.8 / 340.6 ms"),
    },
}


def requested_backend() -> str | None:
    value = os.environ.get(ENV_VAR, "").strip().lower()
    if not value:
        return None
    if value not in BACKENDS:
        raise ValueError(f"{ENV_VAR}={value!r} is not one of {BACKENDS}")
    return value


# Triton's own reading of TRITON_INTERPRET (its getenv_bool, triton 3.6: case-insensitive)
_TRUE = ("1", "true", "yes", "on", "y")


def triton_interpreting() -> bool:
    """Whether Triton runs its kernels in its CPU interpreter: $TRITON_INTERPRET read as Triton
    reads it ("true", "on", ... too: with only "1" taken, TRITON_INTERPRET=true interpreted in
    Triton while the CPU request was refused as needing CUDA)."""
    return os.environ.get("TRITON_INTERPRET", "").strip().lower() in _TRUE


def triton_unavailable_reason(device: torch.device) -> str | None:
    """Why Triton kernels cannot run on tensors of `device` (None: they can)."""
    if device.type != "cuda" and not triton_interpreting():
        return _needs_cuda(device)
    try:
        import triton  # noqa: F401
    except ImportError:
        return ("the triton backend needs the triton package, which is not installed "
                "(pip install 'hiertail_fast[triton]')")
    if not _kernels_importable():
        return ("the triton backend's kernels (hiertail_fast.kernels) are not importable: this "
                "hiertail_fast is a source checkout imported without being installed; install "
                "it (pip install -e .), whose build maps kernels/ to hiertail_fast.kernels")
    return None


@functools.lru_cache(maxsize=1)
def _kernels_importable() -> bool:
    import importlib.util

    return importlib.util.find_spec("hiertail_fast.kernels") is not None


def _needs_cuda(device: torch.device) -> str:
    return ("the triton backend needs CUDA tensors (or TRITON_INTERPRET=1 set before triton is "
            f"imported, for testing on CPU); got a tensor on {device}")


def triton_available(device: torch.device) -> bool:
    """Whether Triton kernels can run on tensors of `device`."""
    return triton_unavailable_reason(device) is None


def triton_refusal(device: torch.device) -> str:
    """The message of a Triton request `triton_available` refused."""
    return triton_unavailable_reason(device) or _needs_cuda(device)


def auto_backend(op: str, device: torch.device | str) -> str:
    """The measured-faster backend of `op` on `device` (`AUTO_BACKEND`), torch when the row's
    choice cannot run there."""
    if op not in AUTO_BACKEND:
        raise ValueError(f"op={op!r} is not one of {OPS}")
    device = torch.device(device)
    row = AUTO_BACKEND[op].get(device.type)
    if row is None:
        return "torch"
    if row.backend == "attention" and not _attention_available(device):
        return own_engine(device)
    if row.backend == "triton" and not triton_available(device):
        return "torch"
    return row.backend


def own_engine(device: torch.device) -> str:
    """Our own engine for `device` where PyTorch's attention kernels are missing, refuse a loss
    call or would be too imprecise: the torch engine on every device (exact at any logits). On
    CUDA it runs on cuBLAS (NVIDIA H200, bench/gpu_report.py 2026-11-27: 3-7x faster than our
    Triton kernels with exact IEEE dots, which is what they use where the logits are too large
    for their 3xTF32 dots)."""
    return "torch"


def _attention_available(device: torch.device) -> bool:
    """Whether PyTorch's attention kernels can serve the loss on `device` (its adapter decides;
    imported lazily, it imports no triton)."""
    from hiertail_fast.ops import _attention_lse

    return _attention_lse.available(device)


def choose_backend(x: torch.Tensor, backend: str | None = None, *, op: str | None = None) -> str:
    """Backend for an op whose main input is `x`; `backend` (argument) overrides the env, which
    overrides the automatic choice (`auto_backend(op, x.device)`, or the old device rule when
    `op` is None)."""
    if backend is not None and backend not in BACKENDS:
        raise ValueError(f"backend={backend!r} is not one of {BACKENDS}")
    if op is not None and op not in AUTO_BACKEND:
        raise ValueError(f"op={op!r} is not one of {OPS}")
    if not isinstance(x, torch.Tensor):
        raise TypeError(f"choose_backend needs a torch.Tensor, got {type(x).__name__}")
    choice = backend or requested_backend()
    if choice is None:
        if op is not None:
            return auto_backend(op, x.device)
        choice = "triton" if x.is_cuda and triton_available(x.device) else "torch"
    if choice == "triton" and not triton_available(x.device):
        raise ValueError(triton_refusal(x.device))
    return choice


# Loss backends: the generic three plus "attention" (PyTorch's fused attention kernels through
# the adapter in ops/_attention_lse.py; the loss is the only op they serve).
LOSS_BACKENDS = BACKENDS + OP_BACKENDS["balanced_contrastive_loss"]


def _automatic_engine(z: torch.Tensor, variant: str, n_levels: int) -> str:
    """Engine for an automatic choice (no backend= and no HIERTAIL_BACKEND): the loss row of
    ``_dispatch.AUTO_BACKEND`` (by measurement), refined where the measurement said so: the
    attention kernels win only the exact single-level loss (on CPU only where our C kernels
    cannot be built or are switched off); our torch engine wins the official
    variant (its row max and positives ride on its own blocks) and several levels (one exp of
    the shared block for all levels, where attention pays one head per level), on CPU and on
    CUDA (NVIDIA H200, bench/gpu_report.py 2026-11-27, N = 20k, d = 64, fp32 fwd+bwd: official
    1 level torch 48.3 ms vs attention 60.3 ms; exact 3 levels 24.4 vs 29.8 ms)."""
    choice = auto_backend("balanced_contrastive_loss", z.device)
    if choice == "attention" and (variant == "official" or n_levels > 1 or (
            z.device.type == "cpu" and _own_cpu_engine_takes(z, n_levels))):
        return "torch"
    return choice


# Refinements of the automatic CUDA choice, measured on an NVIDIA H200 (torch 2.11.0+cu130,
# triton 3.6.0, 2026-11-27, `python bench/loss_profile.py --sizes 20000:64 50000:64 100000:64`,
# fwd+bwd, logits bound ~20; docs/results/gpu_h200_2026-11-27/loss_profile_*.md), ms at
# N = 20k / 50k / 100k:
#   fp32 exact 1 level   triton (3xTF32) 10.2 / 32.4 / 121, attention 11.2 / 45.8 / 169
#   fp32 exact 3 levels  triton 22.6 / 67.9 / 238, torch 23.6 / 113 / 451
#   fp32 official 1 lvl  torch 34.8 / 182 / 581, attention 62.1 / 112 / 321,
#                        triton 81.8 / 118 / 245
#   fp32 official 3 lvls torch 78.0 / 331 / 1,195, triton 207 / 290 / 879
#   bf16 exact 3 levels  attention 10.5 / 27.5 / 81.6, triton 12.7 / 40.3 / 107,
#                        torch 25.4 / 120 / 462
#   bf16 official 1 lvl  torch 40.4 / 147 / 602, triton 75.6 / 87.6 / -, (attention: imprecise)
#   bf16 official 3 lvls torch 61.4 / 291 / -, triton 132 / 254 / -
TRITON_MIN_ROWS = {"exact": 20_000, "official": 75_000}      # fp32, 3xTF32 dots
TRITON_MIN_ROWS_BF16 = {"official": 50_000}
# The Triton rows were measured at d = 64 only; wider embeddings (HierTail's hidden 128) keep the
# choices measured for them (attention / torch) until a GPU run times the kernels there.
TRITON_MAX_DIM = 64
ATTENTION_OFFICIAL_MIN_ROWS = 50_000                         # fp32, one level


def refine_loss_backend(choice: str, z_all: torch.Tensor, scale: float, variant: str,
                        n_levels: int = 1, bound=None) -> str:
    """An automatic CUDA choice refined by size, dtype and the logits' bound (the table above;
    z_all: the loss's rows with any prototypes). fp32: our Triton kernels from
    TRITON_MIN_ROWS[variant] rows of at most TRITON_MAX_DIM columns (the head dim they were
    timed at) where their 3xTF32 dots are precise enough for the logits
    (``_triton_loss.fp32_dot``), else the attention kernels for the official single level from
    ATTENTION_OFFICIAL_MIN_ROWS where their guard allows. bf16: the attention kernels for the
    exact variant at any number of levels (their guard in the op sends large logits to our
    engine), the Triton kernels for the official variant from TRITON_MIN_ROWS_BF16 (at most
    TRITON_MAX_DIM columns). Anything else keeps `choice`. The logits' bound: `bound`, the
    call's shared ``_attention_lse.LogitBound`` (computed only where a rule needs it)."""
    if not (choice in ("attention", "torch") and z_all.is_cuda):
        return choice
    n, device = z_all.shape[0], z_all.device
    if z_all.dtype == torch.bfloat16:
        if variant == "exact" and _attention_available(device):
            return "attention"
        if (variant == "official" and n >= TRITON_MIN_ROWS_BF16[variant]
                and z_all.shape[1] <= TRITON_MAX_DIM and triton_available(device)):
            from hiertail_fast.ops import _triton_loss

            if _triton_loss.tf32_cores(device):         # (bf16 tensor cores: Ampere on, too)
                return "triton"
        return choice
    if z_all.dtype != torch.float32 or n < min(TRITON_MIN_ROWS[variant],
                                               ATTENTION_OFFICIAL_MIN_ROWS):
        return choice
    from hiertail_fast.ops import _attention_lse, _triton_loss

    bound = bound or _attention_lse.LogitBound(z_all, scale)
    if (n >= TRITON_MIN_ROWS[variant] and z_all.shape[1] <= TRITON_MAX_DIM
            and triton_available(device)
            and _triton_loss.fp32_dot(z_all, scale, variant, bound) == "tf32x3"):
        return "triton"
    if (variant == "official" and n_levels == 1 and n >= ATTENTION_OFFICIAL_MIN_ROWS
            and _attention_available(device)
            and _attention_lse.within_precision(z_all, scale, variant, bound)):
        return "attention"
    return choice


def _own_cpu_engine_takes(z: torch.Tensor, n_levels: int) -> bool:
    """Whether a one-level CPU loss on `z` runs our torch backend with its C kernels: the
    symmetric engine (``_lse_symmetric``: each pair once, 2 N^2 d multiply-adds) from its
    MIN_ROWS rows, the row-block engine below (one or two blocks). Both measured faster than
    the CPU attention kernel (4 N^2 d) for the exact loss: the symmetric engine from 6k to 100k
    rows, the row-block engine 1.02-1.27x at 100-500 rows in 33 of 36 cells, even in the other
    three (docs/LOSS.md: `bench/loss_grid.py`). The engines compute in the op's compute
    dtype: 16-bit inputs run on their float32 copy (as backend="torch" does); the CPU attention
    kernel on their bf16 rows, the choice before, took 1.22x / 1.28x the symmetric engine's
    time at 12k / 50k rows, d 128 (`bench/loss_grid.py --dtype bfloat16`). Switched off
    (HIERTAIL_SYMMETRIC=0) or without the C kernels: the attention kernel, as before."""
    from hiertail_fast.ops import _lse_symmetric, _lse_torch

    return _lse_symmetric.serves_kind(z.device, _lse_torch._compute_dtype(z), n_levels)


def choose_loss_backend(z: torch.Tensor, backend: str | None, variant: str,
                        n_levels: int = 1) -> str:
    """Backend of one loss call. float64 always runs the torch engine (the attention and Triton
    kernels compute in fp32: never a silent downgrade of a float64 request)."""
    if backend is not None and backend not in LOSS_BACKENDS:
        raise ValueError(f"backend={backend!r} is not one of {LOSS_BACKENDS}")
    if backend == "attention":
        if not _attention_available(z.device):
            from hiertail_fast.ops._attention_lse import MIN_TORCH

            raise ValueError(
                f"the attention backend needs torch >= {'.'.join(map(str, MIN_TORCH))} with "
                f"its fused attention kernels for {z.device.type} tensors; use backend='torch'"
            )
        choice = "attention"
    elif backend is None and requested_backend() is None:
        choice = _automatic_engine(z, variant, n_levels)
    else:
        choice = choose_backend(z, backend, op="balanced_contrastive_loss")
    if z.dtype == torch.float64 and choice in ("triton", "attention"):
        return "torch"
    return choice


def on_input_device(t: torch.Tensor | None):
    """A context making ``t``'s CUDA device the current one (nothing for other tensors, or
    None). Triton launches a kernel on the CURRENT device's stream whatever device its
    pointers are on: tensors on cuda:1 with cuda:0 current would reach the wrong GPU. (The
    backward passes need no guard: autograd runs them with their device current.)"""
    if t is not None and t.is_cuda:
        return torch.cuda.device(t.device)
    return contextlib.nullcontext()


def public_op(op):
    """Decorator of a public graph op: its body runs on its first tensor argument's device
    (``on_input_device``) with autocast off there (``_amp``: the op keeps its input dtype) and
    float32 GEMMs in IEEE float32 (``_matmul_precision``);
    under torch.func.vmap it raises, naming the op (``_functorch.check_transforms``)."""
    @functools.wraps(op)
    def wrapper(*args, **kwargs):
        check_transforms(op.__name__, *args, *kwargs.values())      # torch.func.vmap: raises
        first = args[0] if args and isinstance(args[0], torch.Tensor) else next(
            (a for a in (*args, *kwargs.values()) if isinstance(a, torch.Tensor)), None)
        if first is None or (first.is_cpu and not torch.is_autocast_enabled("cpu")):
            with ieee_matmuls():            # the common case, without the other contexts
                return op(*args, **kwargs)  # (tiny graphs' calls are ~40 us on CPU)
        with autocast_off(first), on_input_device(first), ieee_matmuls():
            return op(*args, **kwargs)
    return wrapper
