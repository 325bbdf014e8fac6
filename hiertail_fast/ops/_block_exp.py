"""The CPU engine's per-block softmax step in one C kernel (``_block_exp.c``).

For a float32 block of dot products e [b, N] (rows of ``_lse_torch._engine``'s common columns),
the logits' scale and key weights w [L, N]::

    s_ik = scale * e_ik  (the dot product first, then the scale: the dense reference's
                          rounding of (z_i . z_k) / tau)
    m_i = max_k s_ik  (+ its first arg-max; with ``ids``, the smallest ids[k] among the maxima),
    e_ik <- exp(s_ik - m_i) (0 below e^-C),
    sums[l, i] = sum_k w_lk e_ik  (float64)

which the torch path does in six passes over the block (``reference_step``, kept as the
fallback where no C compiler is found and as the oracle of the tests). The kernel's row loop
runs on torch's OpenMP threads (``_native.load(..., openmp=True)``).
"""
from __future__ import annotations

import math

import torch

from hiertail_fast.ops import _lse_torch, _native  # (_lse_torch imports this module too)


def kernel():
    """The C kernel (ctypes function), or None (native kernels off or not buildable here)."""
    i64, ptr, f32 = _native.I64, _native.PTR, _native.F32
    return _native.threaded_function("_block_exp", "hiertail_block_exp_f32",
                                     [i64, i64, i64, ptr, i64, f32, f32, f32, i64, ptr, i64,
                                      ptr, ptr, ptr, ptr, i64])


def reference_step(e: torch.Tensor, w: torch.Tensor, need_arg: bool,
                   ids: torch.Tensor | None = None, scale: float = 1.0):
    """The torch path: (m [b], first arg-max [b] or None, sums [L, b] in e's dtype); e in place.
    ``ids`` [N] (the columns' key ids when they are not in key order): the arg-max is the
    smallest id among a row's maxima (the reference's first index in key order) instead."""
    if scale != 1.0:
        e.mul_(scale)
    if need_arg and ids is not None:
        m = e.amax(dim=1)
        # int32 ids (they are < the number of keys, far below 2^31 for an all-pairs loss): the
        # [b, N] temporary the size of the block, not twice it (and no host sync to check)
        idt = ids.to(torch.int32) if e.shape[1] < torch.iinfo(torch.int32).max // 2 else ids
        big = torch.iinfo(idt.dtype).max
        arg = torch.where(e == m[:, None], idt[None, :], big).amin(dim=1)
        arg = torch.where(arg == big, idt[0], arg).long()    # (no hit: only for a NaN max)
    elif need_arg:
        m, arg = _lse_torch.row_max_first_argmax(e)
    else:
        m, arg = e.amax(dim=1), None
    _lse_torch.exp_shifted_(e.sub_(m[:, None]))
    return m, arg, torch.mm(e, w.t()).t()


def native_step(fn, e: torch.Tensor, w: torch.Tensor, need_arg: bool,
                ids: torch.Tensor | None = None, scale: float = 1.0):
    """The same through the C kernel ``fn`` (from ``kernel()``); sums are float64.

    e: float32 [b, N] with unit column stride (rows may be strided), w: float32 [L, N]."""
    if e.dtype != torch.float32 or w.dtype != torch.float32:
        raise TypeError(f"the block kernel takes float32 (got {e.dtype}, {w.dtype})")
    b, n = e.shape
    if w.dim() != 2 or w.shape[1] != n:
        raise ValueError(f"weights of shape {tuple(w.shape)} do not match a block of {n} columns")
    if n == 0:
        raise ValueError("the block kernel needs at least one column")
    if e.stride(1) != 1:
        raise ValueError("the block kernel needs unit column stride")
    w = w.contiguous()
    if ids is not None:
        if ids.dtype != torch.long or ids.shape != (n,):
            raise ValueError(f"ids must be int64 [{n}], got {ids.dtype} {tuple(ids.shape)}")
        ids = ids.contiguous()
    m = torch.empty(b, dtype=torch.float32)
    arg = torch.empty(b, dtype=torch.long) if need_arg else None
    sums = torch.empty(w.shape[0], b, dtype=torch.float64)
    c = _lse_torch.exp_cutoff(torch.float32)
    fn(torch.get_num_threads(), b, n, e.data_ptr(), e.stride(0), float(scale), c,
       math.exp(-c) * 1.0001,
       w.shape[0], w.data_ptr(), w.stride(0), m.data_ptr(),
       None if arg is None else arg.data_ptr(),
       None if ids is None or arg is None else ids.data_ptr(), sums.data_ptr(), b)
    return m, arg, sums
