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

Nested levels (every group of a level inside one group of the most significant level of the key
order, as y, y // 2, y // 4) share that level's slices (``_run``): a row's positives at each of
them are a column range inside its top group's range, with the same x wherever f_i = 1. So
log(x + eps) and q are computed ONCE per element for all those levels; each level's sums are
sums over "segments" (runs of keys equal at every such level) and the block's gradient gets
sum_l c_li q_ij with one coefficient per (row, segment). Three levels y, y // 2, y // 4 (Zipf
labels): the element-wise work over positives drops from sum_l sum_c n_c^2 to the top level's.

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
"""
from __future__ import annotations

import ctypes
import math
import os
from bisect import bisect_right

import torch

from hiertail_fast.ops import _native
from hiertail_fast.ops._contrastive_pairs import OFFICIAL_EPS, _consistent_with_max, _tie_bound
from hiertail_fast.ops._lse_torch import exp_cutoff, exp_shifted_

SLICE_GROUP = 64        # groups with at least this many common keys are read as 2-D slices
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
    lib = _native.load("_positive_blocks", openmp=True)
    if lib is None or dtype not in (torch.float32, torch.float64):
        return None
    fn = lib.hiertail_positives_f32 if dtype == torch.float32 else lib.hiertail_positives_f64
    if fn.argtypes is None:
        i64, ptr = ctypes.c_int64, ctypes.c_void_p
        fn.argtypes = [i64, i64, i64, i64, ptr, i64, ptr, i64, ptr, ptr, i64, ptr, ptr, i64,
                       ctypes.c_double, ptr, i64, ctypes.c_double, ptr, ptr, i64]
        fn.restype = i64                  # the number of threads that ran
    return fn


def _constant_per_group(values: torch.Tensor, g: torch.Tensor) -> bool:
    """Whether every group (g >= 0) has one value (rows outside every group: ignored)."""
    inside = g >= 0
    if not bool(inside.any()):
        return True
    v, gi = values[inside], g[inside]
    first = torch.zeros(int(gi.max()) + 1, dtype=v.dtype, device=v.device)
    first[gi] = v                          # one member's value per group (any member)
    return bool((first[gi] == v).all())


def _significance(gid: torch.Tensor) -> list[int]:
    """Levels from least to most significant sort key: by their positive pairs sum_c n_c^2."""
    cost = [float((torch.bincount(g[g >= 0]).double() ** 2).sum()) if bool((g >= 0).any())
            else 0.0 for g in gid]
    return sorted(range(gid.shape[0]), key=lambda lev: cost[lev])


def key_order(gid: torch.Tensor) -> torch.Tensor:
    """Stable lexicographic order of the rows by their group ids, the level with the most
    positive pairs (sum_c n_c^2) most significant: that level's groups are always contiguous,
    and for nested levels (the costliest is then the coarsest) every level's are."""
    order = torch.arange(gid.shape[1], device=gid.device)
    for lev in _significance(gid):
        order = order[torch.argsort(gid[lev, order], stable=True)]
    return order


class BlockPositives:
    """Positive-pair sums T, Q [L, N] (and gradient terms) of the levels whose groups are
    contiguous among the common keys ``cidx`` (common key order = ``key_order``).

    The engine visits the rows in ``order``; its block p = slice(r0, r1) holds the rows
    order[p]. Per-row state is kept in that visiting order (suffix ``_s``)."""

    def __init__(self, z, gid, n_groups, include_self: bool, pos_coef, scale: float, common,
                 log_w=None):
        n_levels, n = gid.shape
        dev = gid.device
        self.z, self.gid, self.include_self = z, gid, include_self
        self.order = key_order(gid)
        self.cidx = self.order[common[self.order]]
        self.n_c = int(self.cidx.numel())
        self.cpos = torch.full((n,), -1, dtype=torch.long, device=dev)
        self.cpos[self.cidx] = torch.arange(self.n_c, device=dev)
        self.start, self.count, self.handled = [], [], []
        for lev in range(n_levels):
            g = gid[lev, self.cidx]
            inside = g >= 0
            cnt = torch.bincount(g[inside], minlength=n_groups[lev])
            first = torch.full((n_groups[lev],), self.n_c, dtype=torch.long, device=dev)
            pos = torch.arange(self.n_c, device=dev)
            first.scatter_reduce_(0, g[inside], pos[inside], "amin")
            # contiguous <=> every member sits inside [first, first + count)
            ok = bool(((pos[inside] - first[g[inside]]) < cnt[g[inside]]).all())
            self.start.append(first)
            self.count.append(cnt)
            self.handled.append(ok)
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
        self._rest_map = None
        self._rest_pj = None            # the one-each rest positives (``_collect_rest``)
        # one level whose key weights are constant inside each group (w_k = 1 / class size):
        # the engine may keep w folded into its GEMM operands (``_lse_torch._engine``)
        self.foldable = n_levels == 1 and self.handled[0] and log_w is not None and bool(
            _constant_per_group(log_w[0, self.cidx], gid[0, self.cidx]))
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
                if self.handled[lev]:
                    g = self.gid_s[lev]
                    inside = g >= 0
                    lo[lev, inside] = self.start[lev][g[inside]]
                    hi[lev, inside] = lo[lev, inside] + self.count[lev][g[inside]]
            self.lo_s, self.hi_s = lo, hi
            self._band_blocks = {}     # block size -> [(c0, c1, levels with a range)]: _extent
            # every level's visible keys are common keys (and there is one): a row's level max
            # is its common max, f = exp(m_c - M) = 1 exactly, so no block needs the check
            self._f_always_one = self.n_c > 0 and log_w is not None and bool(
                (~torch.isfinite(log_w) | common[None, :]).all())
            return
        self._chain(gid, _significance(gid)[-1])

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

    def _chain(self, gid, top):
        """The shared-slice plan (``_run``). ``chain``: the top level (the most significant
        sort key: its groups are contiguous) and every handled level whose groups each lie
        inside one top group, among the common keys; [] if that is the top level alone.
        Segments: maximal runs of common keys with equal ids at every chain level
        (``seg_sizes[grp]``: the sizes of top group grp's, in key order). Per chain level k
        and row (visiting order): ``ok_s`` (the row's group is inside its own top group: its
        positives are all in that group's slice) and the row's segments [``seg_a_s``,
        ``seg_b_s``), local to the top group. ``run_start``, ``run_grp``: start and top group
        of each run of rows with one top group (visiting order)."""
        dev = gid.device
        levels = [lev for lev, ok in enumerate(self.handled) if ok]
        self.chain = []
        if self.n_c == 0 or top not in levels:
            return
        keys = gid[:, self.cidx]
        chain = [top] + [lev for lev in levels if lev != top
                         and _constant_per_group(keys[top], keys[lev])]
        if len(chain) < 2:      # one level: nothing to share, ``_slice`` is the leaner path
            return
        ci = torch.tensor(chain, dtype=torch.long, device=dev)
        kg = keys[ci]                                                      # [C, n_c]
        change = torch.ones(self.n_c, dtype=torch.bool, device=dev)
        change[1:] = (kg[:, 1:] != kg[:, :-1]).any(dim=0)
        seg_start = change.nonzero().squeeze(1)                           # global segments
        seg_end = torch.cat([seg_start[1:], seg_start.new_tensor([self.n_c])])
        seg_top = kg[0, seg_start]
        n_top = self.count[top].numel()
        first = torch.zeros(n_top, dtype=torch.long, device=dev)           # first segment of
        first.scatter_reduce_(0, seg_top.clamp(min=0), torch.arange(       # each top group
            seg_start.numel(), device=dev), "amin", include_self=False)
        sizes = (seg_end - seg_start).tolist()
        lo_hi = torch.stack([first, first + torch.bincount(seg_top[seg_top >= 0],
                                                           minlength=n_top)]).tolist()
        self.seg_sizes = [sizes[a:b] for a, b in zip(*lo_hi, strict=True)]
        top_s = self.gid_s[top]
        ok, seg_a, seg_b = [], [], []
        for lev in chain:
            # the top group of each of this level's groups (-1: a group without common keys)
            top_of = torch.full((self.count[lev].numel(),), -1, dtype=torch.long, device=dev)
            inside = keys[lev] >= 0
            top_of[keys[lev][inside]] = keys[top][inside]
            g = self.gid_s[lev]
            gc = g.clamp(min=0)
            ok.append((g >= 0) & (top_s >= 0) & (top_of[gc] == top_s))
            # a group's segments, local to its top group
            a = torch.searchsorted(seg_start, self.start[lev].clamp(max=self.n_c - 1))[gc]
            b = torch.searchsorted(seg_start, self.start[lev] + self.count[lev])[gc]
            base = first[top_s.clamp(min=0)]
            seg_a.append(a - base)
            seg_b.append(b - base)
        self.chain = chain
        self.chain_idx = ci
        self.ok_s, self.seg_a_s, self.seg_b_s = torch.stack(ok), torch.stack(seg_a), \
            torch.stack(seg_b)
        self.coef_cs = None if self.coef_s is None else self.coef_s[ci]   # [C, N]
        self.Tc_s = torch.zeros(len(chain), gid.shape[1], dtype=self.T_s.dtype, device=dev)
        self.Qc_s = torch.zeros_like(self.Tc_s)
        rs = torch.ones(gid.shape[1], dtype=torch.bool, device=dev)
        rs[1:] = top_s[1:] != top_s[:-1]
        starts = rs.nonzero().squeeze(1)
        self.run_start = starts.tolist()
        self.run_grp = top_s[starts].tolist()
        # each top group's common-key columns [c0, c1), as host ints (read per run)
        c0 = self.start[top].clamp(max=self.n_c)
        self.top_cols = list(zip(c0.tolist(), (c0 + self.count[top]).tolist(), strict=True))
        self._seg_ar = {}
        self._work = None

    def _scratch(self, x):
        """Two [r, c] work buffers for ``_run``, reused across blocks: a fresh multi-MB tensor
        per block would be new pages (first-touch faults) every time."""
        n = x.numel()
        if self._work is None or self._work.shape[1] < n:
            self._work = torch.empty(2, n, dtype=x.dtype, device=x.device)
        return self._work[0, :n].view(x.shape), self._work[1, :n].view(x.shape)

    def finish(self, rowmax, argmax, want_grad: bool):
        """After the engine's pass: fold the chain levels' sums into T and Q, and the rest
        positives collected per block (``_collect_rest``; rowmax, argmax [L, N]: the pass's
        level maxima by original row id). Returns their gradient terms (rows, keys,
        coefficients), or None."""
        if self.chain:
            self.T_s[self.chain_idx] += self.Tc_s
            self.Q_s[self.chain_idx] += self.Qc_s
            self.Tc_s.zero_()
            self.Qc_s.zero_()
        if self._rest_pj is None:
            return None
        out = self._finish_rest(rowmax, argmax, want_grad)
        self._rest_pj = self._rest_s = None
        return out

    def _tie(self, rows, row_max_b):
        """``_contrastive_pairs._tie_bound`` of the block's rows (their maxima row_max_b)."""
        if self._tie_unit is None:                       # the row-max-free part, once
            zero = torch.zeros(self.z.shape[0], dtype=self.z.dtype, device=self.z.device)
            self._tie_unit = _tie_bound(self.z, zero, self._scale)
        return self._tie_unit[rows] + torch.finfo(self.z.dtype).eps * row_max_b.abs()

    # ---- forward: common keys
    def common_block(self, p, rows, e, m_c, max_b, arg_b, target=None, inv_norm=1.0):
        """Sums of the block's positives with a common key, into T and Q.

        p: the block's slice of the visiting order, rows = order[p] (original ids); e [b, n_c]
        = exp(s - m_c), the forward values; target: the block's gradient matrix (E * weights,
        normalised by 1 / inv_norm; a float or a [b] tensor of per-row factors), which gets
        the positives' coefficients c_i q_ij * inv_norm added in place (no copy of q is
        kept). target may be e itself: every positive entry is read before it is written."""
        f = torch.exp(m_c[None] - max_b).clamp_(max=1.0)                  # [L, b]; 1: common max
        f_one = f == 1.0
        if self.native is not None or self.band:
            self._ranges_block(p, rows, e, m_c, f, f_one, max_b, arg_b, target,
                               inv_norm)
            return
        cnt = self.cnt_s[:, p]
        if self.chain:
            done = self._runs(p, e, f_one, target, inv_norm)              # [C, b]
            if done is not None:
                cnt = cnt.clone()
                cnt[self.chain_idx] *= ~done
        left = (cnt > 0).any(dim=1).tolist()              # levels with rows still to visit
        for lev, todo in enumerate(left):
            if not (todo and self.handled[lev]):
                continue
            g = self.gid_s[lev, p]
            c = cnt[lev]
            big = (c >= SLICE_GROUP) & f_one[lev]
            t_row = torch.zeros(g.numel(), dtype=e.dtype, device=e.device)
            q_row = torch.zeros_like(t_row)
            coef = None if target is None else self.coef_s[lev, p] * inv_norm
            for grp in torch.unique(g[big]).tolist():
                loc = ((g == grp) & big).nonzero().squeeze(1)
                self._slice(lev, grp, loc, rows, e, t_row, q_row, coef, target)
            small = ((c > 0) & ~big).nonzero().squeeze(1)
            if small.numel():
                self._pairs(lev, small, c, g, rows, e, f[lev], max_b[lev], arg_b[lev],
                            t_row, q_row, coef, target)
            self.T_s[lev, p] += t_row
            self.Q_s[lev, p] += q_row

    def _ranges_block(self, p, rows, e, m_c, f, f_one, max_b, arg_b, target, inv_norm):
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
            coef = (self.coef_s[:, p] * inv_norm).to(e.dtype).contiguous()
        run = self._band if self.band else self._kernel
        if self._f_always_one or bool(f_one.all()):
            run(p, e, target, lo.contiguous(), hi.contiguous(), coef, None)
            return
        odd = (~f_one) & (hi > lo)          # hi > lo: a handled level, a group with common keys
        near = odd & ((m_c[None] - max_b) > -self._tie(rows, max_b))
        run(p, e, target, lo.contiguous(), torch.where(near, lo, hi), coef,
            f.to(e.dtype).contiguous())
        if not bool(near.any()):
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
        queue); a last, shorter block that does not start at a multiple of its size gets its
        own. A caller that narrows some ranges (``_ranges_block``'s near-tie rows) still gets a
        band that contains them (``_band`` masks by the ranges it is given)."""
        b = p.stop - p.start
        if p.start % b:
            return self._extents(p.start, p.stop, b)[0]
        if b not in self._band_blocks:
            self._band_blocks[b] = self._extents(0, self.lo_s.shape[1], b)
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

    def _runs(self, p, e, f_one, target, inv_norm):
        """The chain levels' positives of the block's rows in big top groups (``_run`` each).
        Returns done [C, b] ((chain level, row) pairs taken), or None if no such rows."""
        r0, r1 = p.start, p.stop
        i = bisect_right(self.run_start, r0) - 1
        done = None
        coef = None
        while i < len(self.run_start) and self.run_start[i] < r1:
            grp = self.run_grp[i]
            a = max(r0, self.run_start[i])
            b = min(r1, self.run_start[i + 1]) if i + 1 < len(self.run_start) else r1
            i += 1
            if grp < 0 or self.top_cols[grp][1] - self.top_cols[grp][0] < SLICE_GROUP:
                continue
            if done is None:
                done = torch.zeros(len(self.chain), r1 - r0, dtype=torch.bool, device=e.device)
                f_c = f_one[self.chain_idx]
                if target is not None:
                    coef = self.coef_cs[:, p] * inv_norm                   # [C, b]
            self._run(grp, a - r0, b - r0, r0, e, f_c, done, coef, target)
        return done

    def _run(self, grp, a, b, r0, e, f_c, done, coef, target):
        """Block rows [a, b) (one top group, grp) x that group's common keys: log(x + eps)
        and q once per element for every chain level, whose sums are segment sums; one
        gradient coefficient per (row, segment): the sum over the levels holding it."""
        c0, c1 = self.top_cols[grp]
        x = e[a:b, c0:c1]
        den, q = self._scratch(x)
        torch.add(x, OFFICIAL_EPS, out=den)
        torch.div(x, den, out=q)
        lg = torch.log_(den)
        g0, g1 = r0 + a, r0 + b                                            # visiting order
        if not self.include_self:           # the row's own key: inside every level's range
            cp = self.cpos_s[g0:g1] - c0
            mine = ((cp >= 0) & (cp < c1 - c0)).nonzero().squeeze(1)
            if mine.numel():
                lg[mine, cp[mine]] = 0.0
                q[mine, cp[mine]] = 0.0
        sizes = self.seg_sizes[grp]
        lgs, qs = lg.split(sizes, 1), q.split(sizes, 1)
        t_seg = torch.stack([t.sum(1) for t in lgs], 1)                   # [r, S]
        q_seg = torch.stack([t.sum(1) for t in qs], 1)
        sidx = self._seg_ar.get(len(sizes))
        if sidx is None:
            sidx = self._seg_ar[len(sizes)] = torch.arange(len(sizes), device=e.device)
        # x is a level's own where its f = 1; member [C, r, S]: the row's segments per level
        ok = self.ok_s[:, g0:g1] & f_c[:, a:b]
        member = ((sidx >= self.seg_a_s[:, g0:g1, None]) & (sidx < self.seg_b_s[:, g0:g1, None])
                  & ok[:, :, None]).to(lg.dtype)
        self.Tc_s[:, g0:g1] += (member * t_seg).sum(2)
        self.Qc_s[:, g0:g1] += (member * q_seg).sum(2)
        done[:, a:b] = ok
        if target is None:
            return
        c = (member * coef[:, a:b, None]).sum(0)                          # [r, S]
        for tg, qk, ck in zip(target[a:b, c0:c1].split(sizes, 1), qs, c.split(1, 1),
                              strict=True):
            tg.addcmul_(qk, ck)

    def _slice(self, lev, grp, loc, rows, e, t_row, q_row, coef, target):
        """One group's rows x its common keys as a 2-D slice of the block (f = 1, so
        x = exp(s - M) exactly). Passes: x + eps, x / that, log of it in place, two row sums,
        one addcmul into the target."""
        c0 = int(self.start[lev][grp])
        c1 = c0 + int(self.count[lev][grp])
        r0, r1 = int(loc[0]), int(loc[-1]) + 1
        rsel = slice(r0, r1) if r1 - r0 == loc.numel() else loc
        x = e[rsel, c0:c1]
        den = x + OFFICIAL_EPS
        q = torch.div(x, den)
        t_sum = torch.log_(den).sum(1)
        q_sum = q.sum(1)
        if not self.include_self:                   # take the row's own key back out
            cp = self.cpos[rows[loc]] - c0
            mine = ((cp >= 0) & (cp < c1 - c0)).nonzero().squeeze(1)
            if mine.numel():
                x_self = x[mine, cp[mine]]
                t_sum[mine] -= torch.log(x_self + OFFICIAL_EPS)
                q_sum[mine] -= x_self / (x_self + OFFICIAL_EPS)
                q[mine, cp[mine]] = 0.0
        t_row[rsel] += t_sum
        q_row[rsel] += q_sum
        if target is not None:
            c = coef[rsel][:, None]
            if isinstance(rsel, slice):
                target[rsel, c0:c1].addcmul_(q, c)
            else:
                target[rsel, c0:c1] += q * c

    def _pairs(self, lev, small, cnt, g, rows, e, f, row_max, arg_max, t_row, q_row, coef,
               target):
        """Explicit (row, key) lists for small groups and for rows whose max is not common."""
        ne = cnt[small]
        r = torch.repeat_interleave(small, ne)
        offs = torch.arange(r.numel(), device=e.device) - torch.repeat_interleave(
            torch.cumsum(ne, 0) - ne, ne)
        col = self.start[lev][g[r]] + offs
        if not self.include_self:
            keep = col != self.cpos[rows[r]]
            r, col = r[keep], col[keep]
        if not r.numel():
            return
        flat = r * e.shape[1] + col
        x = e.reshape(-1)[flat] * f[r]
        odd = (f[r] < 1.0).nonzero().squeeze(1)
        if odd.numel():                       # max from another product: tie rule by rows
            xo = torch.log(x[odd]).clamp_(min=-1e30)
            xo = _consistent_with_max(xo, r[odd], self.cidx[col[odd]], self.z, row_max,
                                      arg_max, self._tie(rows, row_max))
            x[odd] = exp_shifted_(xo)
        den = x + OFFICIAL_EPS
        q = torch.div(x, den)
        t_row.index_add_(0, r, torch.log_(den))
        q_row.index_add_(0, r, q)
        if target is not None:
            target.view(-1).index_add_(0, flat, q.mul_(coef[r]))

    def coef_max(self, p) -> float:
        """max |c| of the block's rows (p: its slice of the visiting order)."""
        if self.coef_s is None or p.stop <= p.start:
            return 0.0
        return float(self.coef_s[:, p].abs().max())

    # ---- level-specific (rest) keys: small dense [b, N_r]
    def _rest_columns(self, ridx):
        """[L', G] column (in ridx) of each handled level's group's one rest key, -1 if none,
        and the handled levels L'; None when a group has several rest keys (then the general
        mask path). The usual case: level-specific keys are that level's prototypes, one per
        label."""
        if self._rest_map is None:
            levels = [lev for lev, ok in enumerate(self.handled) if ok]
            width = max([self.count[lev].numel() for lev in levels] + [1])
            cols = torch.full((len(levels), width), -1, dtype=torch.long, device=ridx.device)
            pos = torch.arange(ridx.numel(), device=ridx.device)
            one_each = True
            for k, lev in enumerate(levels):
                g = self.gid[lev, ridx]
                inside = g >= 0
                if bool((torch.bincount(g[inside], minlength=width) > 1).any()):
                    one_each = False
                    break
                cols[k, g[inside]] = pos[inside]
            self._rest_map = (cols, torch.tensor(levels, dtype=torch.long, device=ridx.device)
                              ) if one_each else False
        return self._rest_map or None

    def rest_block(self, p, rows, ridx, s_r, max_b, arg_b, want_grad: bool):
        """Positive pairs with a rest key; returns their gradient coefficients [b, N_r], or
        None (none here, or the usual case of one rest key per group: its s are collected and
        the work runs once after the pass, in ``finish``). s_r = scale * z_rows . z_ridx
        (unshifted); p, rows as in ``common_block``."""
        out = None
        if not ridx.numel():
            return out
        rest_map = self._rest_columns(ridx)
        if rest_map is not None:
            self._collect_rest(p, ridx, s_r, *rest_map)
            return out
        for lev, ok in enumerate(self.handled):
            if not ok:
                continue
            g_rows, g_keys = self.gid[lev, rows], self.gid[lev, ridx]
            mask = (g_rows[:, None] == g_keys[None, :]) & (g_rows[:, None] >= 0)
            if not self.include_self:
                mask &= rows[:, None] != ridx[None, :]
            pi, pj = mask.nonzero(as_tuple=True)
            if not pi.numel():
                continue
            i = p.start + pi                                              # visiting order
            x = s_r[pi, pj] - max_b[lev][pi]
            # pi: block-local rows (index the block's arg-max and tie bound); ridx[pj] global
            x = exp_shifted_(_consistent_with_max(x, pi, ridx[pj], self.z, max_b[lev],
                                                  arg_b[lev], self._tie(rows, max_b[lev])))
            q = x / (x + OFFICIAL_EPS)
            self.T_s[lev].index_add_(0, i, torch.log(x + OFFICIAL_EPS))
            self.Q_s[lev].index_add_(0, i, q)
            if want_grad:
                if out is None:
                    out = torch.zeros_like(s_r)
                out.index_put_((pi, pj), q * self.coef_s[lev, i], accumulate=True)
        return out

    def _collect_rest(self, p, ridx, s_r, cols, levels):
        """The one-each case of ``rest_block``: keep only the block's s of each (handled
        level, row) pair with its group's rest key (one gather), for ``_finish_rest``; the
        rest of the work runs once for all rows after the pass, not per block."""
        if self._rest_pj is None:
            g = self.gid_s[levels]                                         # [L', N]
            pj = torch.where(g >= 0, cols.gather(1, g.clamp(min=0)), torch.full_like(g, -1))
            if not self.include_self:                                      # own key: no pair
                pj = torch.where(self.order[None, :] == ridx[pj.clamp(min=0)],
                                 torch.full_like(pj, -1), pj)
            self._rest_pj = pj
            self._rest_s = torch.zeros(pj.shape, dtype=s_r.dtype, device=s_r.device)
            self._rest_ridx, self._rest_levels = ridx, levels
        self._rest_s[:, p] = s_r.gather(1, self._rest_pj[:, p].clamp(min=0).t()).t()

    def _finish_rest(self, rowmax, argmax, want_grad):
        """The rest positives collected by ``_collect_rest``, all rows at once: x = s - M_i
        made consistent with the max (ties), T and Q; with ``want_grad``, the pairs' gradient
        coefficients c_i q_ij as (rows, keys, coefficients), original ids."""
        pj, ridx, levels = self._rest_pj, self._rest_ridx, self._rest_levels
        k, pos = (pj >= 0).nonzero(as_tuple=True)
        if not pos.numel():
            return None
        j = ridx[pj[k, pos]]
        rows = self.order[pos]
        lev = levels[k]
        lev_max, lev_arg = rowmax[lev, rows], argmax[lev, rows]
        x = self._rest_s[k, pos] - lev_max
        x = exp_shifted_(_consistent_with_max(x, torch.arange(x.numel(), device=x.device), j,
                                              self.z, lev_max, lev_arg,
                                              self._tie(rows, lev_max)))
        q = x / (x + OFFICIAL_EPS)
        at = lev * self.T_s.shape[1] + pos                        # into T_s, Q_s [L, N]
        self.T_s.view(-1).index_add_(0, at, torch.log(x + OFFICIAL_EPS))
        self.Q_s.view(-1).index_add_(0, at, q)
        if not want_grad:
            return None
        return rows, j, q * self.coef_s.view(-1)[at]
