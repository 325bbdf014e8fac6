"""The official variant's positive pairs, read from the torch engine's own blocks: no extra GEMM.

Every row block of the engine (``_lse_torch._engine``) holds e_ik = exp(s_ik - m_i) for all
common keys k, m_i being the row max over those keys. With the common keys SORTED BY LABEL, the
positives of row i at level l are one column range [start_c, end_c) of its block row, so

    t_ij = log(e_ij f_i + eps),  q_ij = e_ij f_i / (e_ij f_i + eps),  f_i = exp(m_i - M_i)

(M_i: the level's row max, level-specific keys included) are element-wise work on entries the
forward already computed, summed per row into T_i and Q_i. Their gradient coefficient c_i q_ij
(c_i = -g_i / n_i) is added into the block's gradient matrix before its two GEMMs. The official
variant then costs the exact variant's 3 GEMMs plus element-wise work over sum_c n_c^2 entries,
where the separate pass (``_contrastive_pairs.positive_pairs``) paid 3 more GEMMs over them.

Same values as the dense reference: s_ij and m_i come from the same product, so the pair
(i, arg-max) gets e = 1 exactly and no x exceeds 0. Where M_i comes from another product (a
level-specific key holds the max; f_i < 1), a positive can tie it only as a bitwise duplicate of
the arg-max row: those rows go through explicit pair lists with ``_consistent_with_max``, as
the level-specific (rest) keys do.

Overhead: the rows of a block are a slice of the key order, so every per-row quantity (group
ids, group sizes, coefficients, the sums T and Q) is kept in that order and read as a view; a
block costs a few dozen small torch calls, not hundreds (the official variant's extra time at
N = 6,000 was mostly per-call overhead of ~14,000 small ops per loss).

A level whose label groups are not contiguous in the one key order (levels that do not nest;
the order favours the level with the most positive pairs) is left to ``positive_pairs``;
``handled`` says which.

Fused C kernel (``_positive_blocks.c``, built on first use by ``_native``): with it, a block's
positives of every handled level are ONE call — each (level, row) gives its key range
[lo, hi), the kernel reads each entry once for all levels holding it (log, quotient, sums,
gradient coefficient in one loop) — instead of the torch path's six passes and the slice /
segment / pair-list plan above, which stays for machines without a C compiler
(``HIERTAIL_NATIVE=0`` forces it). Rows whose max is a level-specific key go through the kernel
with their factor f_i unless a positive could tie that max (the pair lists, as before).
Without the kernel: on CUDA the same ranges as whole-band torch passes (``_band``), elsewhere
the slice / segment / pair-list plan.

Modules: this one holds ``BlockPositives``' state, the per-block entry points and the range
paths (C kernel, band); ``_positive_keys`` the key order; ``_positive_slices`` the slice plan
(``SlicePlan``, with the nested levels' shared slices); ``_positive_rest`` the level-specific
keys (``RestKeys``). The last two are mixins of ``BlockPositives``.
"""
from __future__ import annotations

import math
import os

import torch

from hiertail_fast.ops import _native, _positive_keys
from hiertail_fast.ops._contrastive_pairs import OFFICIAL_EPS, _tie_bound, scaled_coefficients
from hiertail_fast.ops._finite import finite
from hiertail_fast.ops._host_reads import host_reads_cheap, slot_counts
from hiertail_fast.ops._lse_torch import exp_cutoff
from hiertail_fast.ops._positive_rest import RestKeys
from hiertail_fast.ops._positive_slices import SlicePlan
from hiertail_fast.ops._tied_keys import first_equal_rows

NATIVE_MAX_LEVELS = 16  # MAX_LEVELS of _positive_blocks.c
# entries (sum of the rows' key-range widths) from which a kernel call runs its rows on torch's
# OpenMP threads (``_native.load(..., openmp=True)``; their fork costs a few us while they spin)
PARALLEL_MIN_ENTRIES = 1 << 15


POSITIVES_ENV = "HIERTAIL_POSITIVES"


def positives_plan() -> str:
    """$HIERTAIL_POSITIVES: "" (default), "band", "slices" (the plans below) or "triton" (every
    engine's official positives on the Triton kernel, ``_triton_loss.positive_pairs``, opt-in
    until timed on a GPU; the Triton engine always uses it)."""
    value = os.environ.get(POSITIVES_ENV, "").strip().lower()
    if value not in ("", "band", "slices", "triton"):
        raise ValueError(f"{POSITIVES_ENV}={value!r} is not one of 'band', 'slices', 'triton'")
    return value


def band_path(device: torch.device) -> bool:
    """Whether blocks without the C kernel take the whole-band path (``_band``) rather than the
    slice / segment / pair-list plan: $HIERTAIL_POSITIVES = "band" or "slices"; by default the
    band on CUDA, where every small torch call is a kernel launch (on an H200 the slice plan's
    ~3,400 calls per official loss at N = 20k made it 3.6x the exact loss's time), and the
    slices elsewhere (a CPU without a C compiler, where that plan was tuned; it touches only
    the positive entries, the band a whole band per level: the two are not compared there)."""
    value = positives_plan()
    return value == "band" or (value in ("", "triton") and device.type == "cuda")


def _factor_cut(fac, dtype: torch.dtype) -> float:
    """The value at or below which a factored entry x = e * f counts as exactly 0 (the engine's
    exp cut-off, no denormal enters the sums); 0 without factors (e is cut already). One rule
    for the C kernel's argument and its torch twin."""
    return 0.0 if fac is None else math.exp(-exp_cutoff(dtype)) * 1.0001


def native_kernel(dtype: torch.dtype):
    """The fused C kernel of ``_positive_blocks.c`` for float32 / float64 blocks, or None
    (native kernels off or not buildable here: the torch path)."""
    if dtype not in (torch.float32, torch.float64):
        return None
    i64, ptr, f64 = _native.I64, _native.PTR, _native.F64
    symbol = "hiertail_positives_f32" if dtype == torch.float32 else "hiertail_positives_f64"
    return _native.threaded_function("_positive_blocks", symbol,
                                     [i64, i64, i64, i64, ptr, i64, ptr, i64, ptr, ptr, i64,
                                      ptr, ptr, i64, f64, ptr, i64, f64, ptr, ptr, i64])


class BlockPositives(SlicePlan, RestKeys):
    """Positive-pair sums T, Q [L, N] (and gradient terms) of the levels whose groups are
    contiguous among the common keys ``cidx`` (common key order = ``key_order``).

    The engine visits the rows in ``order``; its block p = slice(r0, r1) holds the rows
    order[p]. Per-row state is kept in that visiting order (suffix ``_s``)."""

    def __init__(self, z, gid, n_groups, include_self: bool, pos_coef, scale: float, common,
                 log_w=None):
        n_levels, n = gid.shape
        dev = gid.device
        self.z, self.gid, self.include_self = z, gid, include_self
        self.order = _positive_keys.key_order(gid, n_groups)
        self.cidx = self.order[common[self.order]]
        self.n_c = int(self.cidx.numel())
        self.cpos = torch.full((n,), -1, dtype=torch.long, device=dev)
        self.cpos[self.cidx] = torch.arange(self.n_c, device=dev)
        # the levels' flags are formed as device tensors and read together below (on CUDA
        # each host read is a sync; rows outside a level go to a spare last group, n_g, and
        # are sliced off: no boolean-mask indexing, which reads the mask's count)
        self.start, self.count, flags = [], [], []
        pos = torch.arange(self.n_c, device=dev)
        for lev in range(n_levels):
            n_g = n_groups[lev]
            g = gid[lev, self.cidx]
            inside = g >= 0
            slot = torch.where(inside, g, n_g)
            cnt = slot_counts(slot, n_g + 1)[:n_g]
            first = torch.full((n_g + 1,), self.n_c, dtype=torch.long, device=dev)
            first.scatter_reduce_(0, slot, pos, "amin")
            first = first[:n_g]
            # contiguous <=> every member sits inside [first, first + count)
            gc = g.clamp(min=0)
            flags.append(((pos - first[gc]) < cnt[gc]).logical_or_(~inside).all() if n_g
                         else torch.ones((), dtype=torch.bool, device=dev))
            self.start.append(first)
            self.count.append(cnt)
        # one level whose key weights are constant inside each group (w_k = 1 / class size):
        # the engine may keep w folded into its GEMM operands (``_lse_torch._engine``)
        fold = n_levels == 1 and log_w is not None
        if fold:
            flags.append(_positive_keys.constant_per_group(log_w[0, self.cidx],
                                                           gid[0, self.cidx], n_groups[0]))
        # every level's visible keys are common keys (and there is one): a row's level max is
        # its common max, f = exp(m_c - M) = 1 exactly, so no block needs the check (``_band``)
        flags.append(torch.ones((), dtype=torch.bool, device=dev) if log_w is None else
                     (~finite(log_w) | common[None, :]).all())
        flags = torch.stack(flags).tolist()                               # one host read
        self.handled = flags[:n_levels]
        self.foldable = fold and self.handled[0] and flags[n_levels]
        f_always_one = self.n_c > 0 and log_w is not None and flags[-1]
        # per-row state in visiting order
        self.gid_s = gid[:, self.order]                                   # [L, N]
        self.cnt_s = torch.stack([torch.where(g >= 0, c[g.clamp(min=0)], torch.zeros_like(g))
                                  for g, c in zip(self.gid_s, self.count, strict=True)])
        self.cpos_s = self.cpos[self.order]
        self.coef_s = None if pos_coef is None else pos_coef.to(z.dtype)[:, self.order]
        self.T_s = torch.zeros(n_levels, n, dtype=z.dtype, device=dev)
        self.Q_s = torch.zeros_like(self.T_s)
        self._scale = scale
        self._tie_unit = None
        self._first_equal_rows = None
        self._rest_map = None
        self._rest_pj = None            # the one-each rest positives (``_collect_rest``)
        # the fused C kernel: every handled level's positives of a block in one call, each
        # row's key range per level given as [lo, hi) (visiting order, [L, N])
        self.native = None
        if z.device.type == "cpu" and n_levels <= NATIVE_MAX_LEVELS:
            self.native = native_kernel(z.dtype)
        # without it: the same per-(level, row) key ranges, as whole-band torch ops (``_band``)
        self.band = self.native is None and band_path(z.device)
        if self.native is not None or self.band:
            self.chain = []
            lo = torch.zeros(n_levels, n, dtype=torch.long, device=dev)
            hi = torch.zeros_like(lo)
            for lev in range(n_levels):
                if self.handled[lev] and n_groups[lev]:
                    g = self.gid_s[lev]
                    inside, gc = g >= 0, g.clamp(min=0)
                    lo[lev] = torch.where(inside, self.start[lev][gc], 0)
                    hi[lev] = torch.where(inside, lo[lev] + self.count[lev][gc], 0)
            self.lo_s, self.hi_s = lo, hi
            self._band_blocks = {}     # block size -> [(c0, c1, levels with a range)]: _extent
            self._f_always_one = f_always_one
            return
        self._chain(gid, _positive_keys._significance(gid, n_groups)[-1])

    def _by_row_id(self, sums_s: torch.Tensor) -> torch.Tensor:
        out = torch.empty_like(sums_s)
        out[:, self.order] = sums_s
        return out

    @property
    def T(self) -> torch.Tensor:                     # the DESIGN.md symbol
        """[L, N] sum over row i's positives of log(x_ij + eps), by original row id."""
        return self._by_row_id(self.T_s)

    @property
    def Q(self) -> torch.Tensor:
        """[L, N] sum over row i's positives of x_ij / (x_ij + eps), by original row id."""
        return self._by_row_id(self.Q_s)

    def finish(self, rowmax, argmax, want_grad: bool, drop=None):
        """After the engine's pass: fold the chain levels' sums into T and Q, and the rest
        positives collected per block (``_collect_rest``; rowmax, argmax [L, N]: the pass's
        level maxima by original row id). Returns their gradient terms (rows, keys,
        coefficients), or None; ``drop``: pairs left out of them (``_finish_rest``)."""
        self.dropped = None
        if self.chain:
            self.T_s[self.chain_idx] += self.Tc_s
            self.Q_s[self.chain_idx] += self.Qc_s
            self.Tc_s.zero_()
            self.Qc_s.zero_()
        if self._rest_pj is None:
            return None
        out = self._finish_rest(rowmax, argmax, want_grad, drop)
        self._rest_pj = self._rest_s = None
        return out

    def _first_equal(self):
        """``_tied_keys.first_equal_rows`` of the keys where host reads are not cheap (CUDA: the
        tie rule's fixed-shape form, ``_contrastive_pairs._consistent_with_max``), else None
        (its host-read form). Computed once."""
        if host_reads_cheap(self.z.device):
            return None
        if self._first_equal_rows is None:
            self._first_equal_rows = first_equal_rows(self.z)
        return self._first_equal_rows

    def _tie(self, rows, row_max_b):
        """``_contrastive_pairs._tie_bound`` of the block's rows (their maxima row_max_b)."""
        if self._tie_unit is None:                       # the row-max-free part, once
            zero = torch.zeros(self.z.shape[0], dtype=self.z.dtype, device=self.z.device)
            self._tie_unit = _tie_bound(self.z, zero, self._scale)
        return self._tie_unit[rows] + torch.finfo(self.z.dtype).eps * row_max_b.abs()

    # ---- forward: common keys
    def common_block(self, p, rows, e, m_c, max_b, arg_b, target=None, norm=1.0):
        """Sums of the block's positives with a common key, into T and Q.

        p: the block's slice of the visiting order, rows = order[p] (original ids); e [b, n_c]
        = exp(s - m_c), the forward values; target: the block's gradient matrix (E * weights,
        divided by its normaliser ``norm``: a float, a 0-dim device tensor or a [b] tensor of
        per-row divisors), which gets the positives' coefficients c_i q_ij / norm added in place
        (no copy of q is kept). target may be e itself: every positive entry is read before it is
        written."""
        f = torch.exp(m_c[None] - max_b).clamp_(max=1.0)                  # [L, b]; 1: common max
        f_one = f == 1.0
        if self.native is not None or self.band:
            self._ranges_block(p, rows, e, m_c, f, f_one, max_b, arg_b, target,
                               norm)
        else:
            self._slices_block(p, rows, e, f, f_one, max_b, arg_b, target, norm)

    def _ranges_block(self, p, rows, e, m_c, f, f_one, max_b, arg_b, target, norm):
        """``common_block`` through the fused C kernel (or its torch twin ``_band``), ONE call
        for the block: every level reads x = e f with its own per-row factor f = exp(m_c - M)
        (1 where the level's max M_i is a common key, so x = e exactly; < 1 where it is a
        level-specific key), all levels sharing each entry where their factors agree. Rows
        whose max is a level-specific key within the rounding bound of the common max (a
        positive could tie M_i) are left out of the call for that level and take the pair lists
        with the tie rule (``_pairs``)."""
        b = p.stop - p.start
        lo, hi = self.lo_s[:, p], self.hi_s[:, p]
        coef = None
        if target is not None:
            assert target.stride(1) == 1 and target.dtype == e.dtype
            coef = scaled_coefficients(self.coef_s[:, p], norm, e.dtype).contiguous()
        run = self._band if self.band else self._kernel
        all_one = self._f_always_one
        if not all_one:
            odd = (~f_one) & (hi > lo)      # hi > lo: a handled level, a group with common keys
            near = odd & ((m_c[None] - max_b) > -self._tie(rows, max_b))
            # both flags in one host read (on CUDA a read drains the GPU's queue: one a block)
            all_one, any_near = torch.stack([f_one.all(), near.any()]).tolist()
        if all_one:                         # (then no row is odd, none near)
            run(p, e, target, lo.contiguous(), hi.contiguous(), coef, None)
            return
        run(p, e, target, lo.contiguous(), torch.where(near, lo, hi), coef,
            f.to(e.dtype).contiguous())
        if not any_near:
            return
        cnt = self.cnt_s[:, p]
        for lev in near.any(dim=1).nonzero().squeeze(1).tolist():
            t_row = torch.zeros(b, dtype=e.dtype, device=e.device)
            q_row = torch.zeros_like(t_row)
            self._pairs(lev, near[lev].nonzero().squeeze(1), cnt[lev], self.gid_s[lev, p],
                        rows, e, f[lev], max_b[lev], arg_b[lev], t_row, q_row,
                        None if coef is None else coef[lev], target)
            self.T_s[lev, p] += t_row
            self.Q_s[lev, p] += q_row

    def _band(self, p, e, target, lo, hi, coef, fac):
        """``_kernel``'s work as whole-band torch ops, for devices without the C kernel (CUDA):
        the block's rows are consecutive in key order, so all their key ranges lie in one
        column band [min lo, max hi) of width ~ the block's rows plus its two end groups; per
        level, masked element-wise passes over that band (log(x + eps), q, row sums in
        float64) and the gradient coefficients of every level added into target once, after
        every level has read the band (target may alias e). ~15 launches per level and block
        instead of a few per group. Temporaries: a few band-sized tensors."""
        c0, c1, levels = self._extent(p)
        if not levels:
            return
        band = e[:, c0:c1]
        cols = torch.arange(c0, c1, device=e.device)
        cut = _factor_cut(fac, e.dtype)
        self_col = None if self.include_self else self.cpos_s[p][:, None]
        zero = torch.zeros((), dtype=e.dtype, device=e.device)
        shared = None           # no factors: x = e for every level, log and quotient once
        if fac is None:
            den = band + OFFICIAL_EPS
            shared = (band / den, torch.log_(den))
        grad = None
        for lev in levels:
            inside = (cols >= lo[lev][:, None]) & (cols < hi[lev][:, None])
            if self_col is not None:
                inside &= cols != self_col
            if shared is None:
                x = band * fac[lev][:, None]
                x = torch.where(x > cut, x, zero)
                den = x + OFFICIAL_EPS
                q_all, t_all = x / den, torch.log_(den)
            else:
                q_all, t_all = shared
            q = torch.where(inside, q_all, zero)
            t = torch.where(inside, t_all, zero)
            self.T_s[lev, p] += t.sum(1, dtype=torch.float64).to(self.T_s.dtype)
            self.Q_s[lev, p] += q.sum(1, dtype=torch.float64).to(self.Q_s.dtype)
            if coef is not None:
                term = q.mul_(coef[lev][:, None])
                grad = term if grad is None else grad.add_(term)
        if grad is not None:
            target[:, c0:c1] += grad

    def _extent(self, p) -> tuple[int, int, list[int]]:
        """Block p's key band [c0, c1) (the union of its rows' ranges over every level) and the
        levels with a non-empty range, as host numbers. Blocks are [k b, (k + 1) b) in visiting
        order (``_lse_torch._engine``): the extents of every block of p's size are computed at
        once, one host sync per call instead of several per block (on CUDA each drains the GPU
        queue); the loop's last, shorter block is read from its full-size neighbours' table,
        and a block of no size seen yet that does not start at a multiple of its size gets its
        own. A caller that narrows some ranges (``_ranges_block``'s near-tie rows) still gets a
        band that contains them (``_band`` masks by the ranges it is given)."""
        n = self.lo_s.shape[1]
        for size, extents in self._band_blocks.items():  # (the last block may be shorter)
            if p.start % size == 0 and p.stop == min(n, p.start + size):
                return extents[p.start // size]
        b = p.stop - p.start
        if p.start % b:
            return self._extents(p.start, p.stop, b)[0]
        self._band_blocks[b] = self._extents(0, n, b)
        return self._band_blocks[b][p.start // b]

    def _extents(self, r0: int, r1: int, size: int) -> list[tuple[int, int, list[int]]]:
        """(c0, c1, levels with a range) of rows [r0, r1) cut in blocks of `size` (one sync)."""
        lo, hi = self.lo_s[:, r0:r1], self.hi_s[:, r0:r1]
        n_levels, n = lo.shape
        blk = torch.arange(n, device=lo.device) // size
        n_blk = -(-n // size)
        has = hi > lo
        big = torch.iinfo(torch.long).max
        c0 = torch.full((n_blk,), big, dtype=torch.long, device=lo.device)
        c1 = torch.full((n_blk,), -1, dtype=torch.long, device=lo.device)
        c0.scatter_reduce_(0, blk, torch.where(has, lo, big).amin(0), "amin")
        c1.scatter_reduce_(0, blk, torch.where(has, hi, -1).amax(0), "amax")
        lev_has = torch.zeros(n_levels, n_blk, dtype=torch.long, device=lo.device)
        lev_has.scatter_reduce_(1, blk.expand(n_levels, n), has.long(), "amax")
        rows = torch.cat([c0[None], c1[None], lev_has]).t().tolist()
        return [(r[0], r[1], [lev for lev in range(n_levels) if r[2 + lev]]) for r in rows]

    def _kernel(self, p, e, target, lo, hi, coef, fac):
        """The C kernel on block p: every level, key ranges lo, hi, coefficients coef and
        factors fac [L, b] (contiguous; fac None: 1, no cut-off). A block with at least
        PARALLEL_MIN_ENTRIES entries in its ranges runs its rows on torch's OpenMP threads
        (rows are independent, so the result is the same bit for bit): the kernel must not
        stay one thread where the torch path it replaces would use every core. Returns the
        number of threads that ran."""
        b = p.stop - p.start
        n = self.T_s.shape[1]
        assert e.stride(1) == 1 and self.T_s.is_contiguous() and hi.is_contiguous()
        self_col = None if self.include_self else self.cpos_s[p]
        cut = _factor_cut(fac, e.dtype)
        osz = self.T_s.element_size()
        return self.native(
            torch.get_num_threads(), PARALLEL_MIN_ENTRIES, b, lo.shape[0], e.data_ptr(),
            e.stride(0), None if target is None else target.data_ptr(),
            0 if target is None else target.stride(0), lo.data_ptr(), hi.data_ptr(), b,
            None if self_col is None else self_col.data_ptr(),
            None if coef is None else coef.data_ptr(), b, OFFICIAL_EPS,
            None if fac is None else fac.data_ptr(), b, cut,
            self.T_s.data_ptr() + p.start * osz, self.Q_s.data_ptr() + p.start * osz, n)

    def coef_max(self, p) -> torch.Tensor | None:
        """max |c| of the block's rows (p: its slice of the visiting order), a 0-dim tensor
        (not read on the host here: ``_lse_torch.block_norm``); None where there are none."""
        if self.coef_s is None or p.stop <= p.start:
            return None
        return self.coef_s[:, p].abs().amax()
