"""The official positives without the C kernel or the band (``_positive_blocks``): the torch
slice / segment / pair-list plan, kept for CPUs without a C compiler (``HIERTAIL_NATIVE=0``
forces it) and as ``HIERTAIL_POSITIVES=slices`` on CUDA.

A big group's rows (at least ``SLICE_GROUP`` common keys) read its keys as a 2-D slice of the
block (``_slice``); small groups and rows whose max is a level-specific key go through explicit
pair lists with the tie rule (``_pairs``, also used by the range paths for near-tie rows).

Nested levels (every group of a level inside one group of the most significant level of the key
order, as y, y // 2, y // 4) share that level's slices (``_run``): a row's positives at each of
them are a column range inside its top group's range, with the same x wherever f_i = 1. So
log(x + eps) and q are computed ONCE per element for all those levels; each level's sums are
sums over "segments" (runs of keys equal at every such level) and the block's gradient gets
sum_l c_li q_ij with one coefficient per (row, segment). Three levels y, y // 2, y // 4 (Zipf
labels): the element-wise work over positives drops from sum_l sum_c n_c^2 to the top level's.

``SlicePlan`` is a mixin of ``BlockPositives``: its methods use the block state set up there.
"""
from __future__ import annotations

from bisect import bisect_right

import torch

from hiertail_fast.ops import _positive_keys
from hiertail_fast.ops._contrastive_pairs import (
    OFFICIAL_EPS,
    _consistent_with_max,
    scaled_coefficients,
)
from hiertail_fast.ops._lse_torch import exp_shifted_

SLICE_GROUP = 64        # groups with at least this many common keys are read as 2-D slices


class SlicePlan:
    """``BlockPositives``' torch plan for the common keys (see the module docstring)."""

    def _slices_block(self, p, rows, e, f, f_one, max_b, arg_b, target, norm):
        """``common_block`` without the C kernel or the band: the chain levels' shared slices
        (``_runs``), then per level each big group's rows as a 2-D slice (``_slice``) and the
        rest as pair lists (``_pairs``). f, f_one [L, b]: the rows' factors exp(m_c - M) and
        where they are 1."""
        cnt = self.cnt_s[:, p]
        if self.chain:
            done = self._runs(p, e, f_one, target, norm)                  # [C, b]
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
            coef = (None if target is None
                    else scaled_coefficients(self.coef_s[lev, p], norm, target.dtype))
            for grp in torch.unique(g[big]).tolist():
                loc = ((g == grp) & big).nonzero().squeeze(1)
                self._slice(lev, grp, loc, rows, e, t_row, q_row, coef, target)
            small = ((c > 0) & ~big).nonzero().squeeze(1)
            if small.numel():
                self._pairs(lev, small, c, g, rows, e, f[lev], max_b[lev], arg_b[lev],
                            t_row, q_row, coef, target)
            self.T_s[lev, p] += t_row
            self.Q_s[lev, p] += q_row

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
                         and _positive_keys._constant_per_group(keys[top], keys[lev])]
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

    def _runs(self, p, e, f_one, target, norm):
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
                    coef = scaled_coefficients(self.coef_cs[:, p], norm, target.dtype)
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
