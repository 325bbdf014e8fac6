"""The official positives whose key is level-specific (a level's own prototypes: the "rest"
keys of ``_positive_blocks``), from the small dense [b, N_r] products the engine makes for them.
In the usual case, one rest key per label group, each row's one positive is collected per block
and the work runs once after the pass (``_collect_rest``, ``_finish_rest``); otherwise per
block with masks (``rest_block``). ``RestKeys`` is a mixin of ``BlockPositives``.
"""
from __future__ import annotations

import torch

from hiertail_fast.ops._contrastive_pairs import OFFICIAL_EPS, _consistent_with_max
from hiertail_fast.ops._host_reads import device_values, slot_counts
from hiertail_fast.ops._lse_torch import exp_shifted_


class RestKeys:
    """``BlockPositives``' level-specific keys (see the module docstring)."""

    def _rest_columns(self, ridx):
        """[L', G] column (in ridx) of each handled level's group's one rest key, -1 if none,
        and the handled levels L'; None when a group has several rest keys (then the general
        mask path). The usual case: level-specific keys are that level's prototypes, one per
        label."""
        if self._rest_map is None:
            levels = [lev for lev, ok in enumerate(self.handled) if ok]
            width = max([self.count[lev].numel() for lev in levels] + [1])
            dev = ridx.device
            # keys outside a level go to a spare column (width), sliced off; whether every
            # group has at most one rest key: all levels in one host read (CUDA: one sync)
            cols = torch.full((len(levels), width + 1), -1, dtype=torch.long, device=dev)
            pos = torch.arange(ridx.numel(), device=dev)
            several = []
            for k, lev in enumerate(levels):
                g = self.gid[lev, ridx]
                slot = torch.where(g >= 0, g, width)
                several.append((slot_counts(slot, width + 1)[:width] > 1).any())
                cols[k].scatter_(0, slot, pos)
            one_each = not several or not any(torch.stack(several).tolist())
            self._rest_map = (cols[:, :width],
                              device_values(levels, torch.long, dev)
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

    def _finish_rest(self, rowmax, argmax, want_grad, drop=None):
        """The rest positives collected by ``_collect_rest``, all rows at once: x = s - M_i
        made consistent with the max (ties), T and Q; with ``want_grad``, the pairs' gradient
        coefficients c_i q_ij as (rows, keys, coefficients), original ids. ``drop`` [L, N]
        (a key id per level and row, or None): pairs (i, drop[l, i]) are left out of the
        gradient terms and kept in ``self.dropped`` as (levels, rows, q) (``_max_fold``)."""
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
                                              self._tie(rows, lev_max), self._first_equal()))
        q = x / (x + OFFICIAL_EPS)
        at = lev * self.T_s.shape[1] + pos                        # into T_s, Q_s [L, N]
        self.T_s.view(-1).index_add_(0, at, torch.log(x + OFFICIAL_EPS))
        self.Q_s.view(-1).index_add_(0, at, q)
        if not want_grad:
            return None
        coef = q * self.coef_s.view(-1)[at]
        if drop is not None:
            out = j == drop[lev, rows]
            self.dropped = (lev[out], rows[out], q[out])
            keep = ~out
            rows, j, coef = rows[keep], j[keep], coef[keep]
        return rows, j, coef
