"""The official row max's gradient entry, taken out of the torch engines' GEMMs.

The official loss subtracts each row's max M_l,i = s_{i,a} (a = a_l,i: the arg-max the dense
reference takes, ``_tied_keys``), so three gradient terms meet on the one logit s_ia:

    g (p_ia - 1)      the LSE part g p_ia and the max's -g (g = g_b r: the LSE coefficient)
    c q_ia            the positive pair (i, a) where a is one of i's positives (c = -g_b / n_i)
    g_b Q_i / n_i     the positives' share of the max (Q_i = sum of q over i's positives)

and they cancel: at large logits p_ia ~ 1 (one key dominates the row); at moderate ones
Q_i / n_i ~ r_i ~ 1 (every positive's q ~ 1) while p_ia is small. The dense reference adds them
into one gradient entry before its GEMM. Summed apart over every row sharing the key a (the
LSE part inside an engine's GEMMs, the rest after them), their difference keeps ~N ulp of the
terms: low-dimensional embeddings, where most rows share one or two arg-max keys, met the
tests' rule 23x over (``bench/official_fuzz.py``).

So the engines take the entry (i, a) of each folded level and row out of their GEMMs (its LSE
part, and the positive's term where their own blocks add it) and hand back, per level and row,

    u     = g (p_ia - 1) = -g o / (t + o) = -g sigmoid(log o - log t)     (float64)
    q_out = q_ia of the positive term they took out (0 if none)

with t = w_a e_ia the arg-max term of the row's sum and o the sum of its other terms (the block
step's float64 sums minus t, the same fp32 product; the level-specific keys' part a log-sum-exp
without a): o = 0 (every other term below e^-C) gives exactly 0, as the reference's 1 - 1. The
caller adds the entry's total v = u + g_b (Q_i - q_out) / n_i (float64; both sides, one row
each) after the pass, when Q is known: what cancels, cancels per row. The row-block engine
reads each block's entries (``MaxFold.entries``) and keeps the few per-row numbers u needs
(``record``); ``hand_back`` forms u and q_out once per call, so a block pays ~10 small torch
calls for the fold (each a kernel launch on CUDA), not ~50.
"""
from __future__ import annotations

import torch

from hiertail_fast.ops._host_reads import device_values, host_reads_cheap
from hiertail_fast.ops._tied_keys import first_tied_key


class ArgmaxShare:
    """The engine's hand-back (original row ids, [L, N] float64): ``u`` and ``q_out`` (see the
    module docstring), and ``amax``, the arg-max keys it used (``_tied_keys``' rule)."""

    def __init__(self, n_levels: int, n: int, device):
        self.u = torch.zeros(n_levels, n, dtype=torch.float64, device=device)
        self.q_out = torch.zeros_like(self.u)
        self.amax = None        # [L, N] the reference's arg-max keys (the engine's, tied)


def column_of(ids: torch.Tensor, n: int) -> torch.Tensor:
    """[n]: each key id's column in a block whose columns are the keys ``ids``, -1 for a key
    not among them."""
    out = torch.full((n,), -1, dtype=torch.long, device=ids.device)
    out[ids] = torch.arange(ids.numel(), device=ids.device)
    return out


def positive_q(x: torch.Tensor) -> torch.Tensor:
    """q = x / (x + eps) in x's dtype, as the positives' kernels form it."""
    from hiertail_fast.ops._contrastive_pairs import OFFICIAL_EPS  # (it imports _lse_torch)

    return x / (x + OFFICIAL_EPS)


class MaxFold:
    """The row-block engine's (``_lse_torch._engine``) per-call plan: each key's reference
    arg-max among equal rows, its block column, and the official positives' labels (``gid``
    [L, N], ``handled`` [L] bool: levels whose positives the engine's blocks add; None: none
    do)."""

    def __init__(self, z: torch.Tensor, visible: torch.Tensor, cidx: torch.Tensor | None,
                 ridx: torch.Tensor, positives=None):
        n, n_levels = z.shape[0], visible.shape[0]
        ids = torch.arange(n, device=z.device)
        # each key id moved to the first equal visible key (duplicate rows: the reference's
        # arg-max), per level
        self.tied = first_tied_key(z, ids.expand(n_levels, n), visible)
        common = ids if cidx is None else cidx
        self.col_of = column_of(common, n)
        self.rcol_of = column_of(ridx, n)
        # duplicate common keys: (their columns, their first twin's), so a block can give them
        # their twin's dot products (a GEMM may round equal columns apart: BLAS edge kernels)
        twin = self.col_of[self.tied[0, common]]
        cols = torch.arange(common.numel(), device=z.device)
        dup = (twin >= 0) & (twin != cols)
        self.duplicates = None
        if not host_reads_cheap(z.device) or bool(dup.any()):
            self.duplicates = (cols[dup], twin[dup])
        self._kept = None               # ``record``'s per-row buffers, visiting order
        self.gid = self.handled = None
        if positives is not None:
            self.gid, self.include_self = positives.gid, positives.include_self
            self.handled = device_values(positives.handled, torch.bool, z.device)

    def entries(self, arg_b, e, v_r, lse_r):
        """One block's arg-max entries, read before the positives write into e. arg_b [L, b]:
        the engine's arg-max key ids; e [b, N_c] = exp(s - shift) on the common keys (None if
        none); v_r [L, b, N_r] = s + log w - shift on the level-specific keys (-inf hidden;
        None if none), lse_r [L, b] their log-sum-exp.
        -> (tgt [L, b] key ids; col [L, b] the entry's common column, -1 where it is not one;
            rcol likewise among the rest keys (None without them); x [L, b]: e at col, 0 where
            col < 0 (None without common keys); rest, v_t [L, b]: the rest keys' log-sum-exp
            without the entry's key and its v (None without rest keys))."""
        tgt = self.tied.gather(1, arg_b)
        col = self.col_of[tgt]
        x = rcol = rest = v_t = None
        if e is not None:
            x = torch.where(col >= 0, e.gather(1, col.clamp(min=0).t()).t(), 0.0)
        if v_r is not None:
            # the level-specific terms other than the arg-max's: all of them (lse_r), or where
            # a rest key holds it, a log-sum-exp without it (not log(e^lse_r - e^v_t): the
            # fp32 lse_r does not resolve o << t, measured 5.6x the tests' rule on a fuzz case)
            rcol = self.rcol_of[tgt]
            rest, v_t = rest_without_target(v_r, rcol, lse_r, host_reads_cheap(v_r.device))
        return tgt, col, rcol, x, rest, v_t

    def record(self, blk: slice, g, entries, sums):
        """Keep a block's (rows ``blk`` of the visiting order) coefficients and entries for
        ``hand_back``: the shares are formed once per call, not per block (each torch call
        is a kernel launch on CUDA)."""
        _, _, _, x, rest, v_t = entries
        if self._kept is None:
            shape, dev = (self.tied.shape[0], self.tied.shape[1]), g.device
            self._kept = {"g": torch.zeros(shape, dtype=g.dtype, device=dev)}
            if x is not None:
                self._kept["x"] = torch.zeros(shape, dtype=x.dtype, device=dev)
                self._kept["sums"] = torch.zeros(shape, dtype=sums.dtype, device=dev)
            if rest is not None:
                self._kept["rest"] = torch.zeros(shape, dtype=rest.dtype, device=dev)
                self._kept["v_t"] = torch.zeros(shape, dtype=v_t.dtype, device=dev)
        for name, val in (("g", g), ("x", x), ("sums", sums), ("rest", rest), ("v_t", v_t)):
            if name in self._kept:
                self._kept[name][:, blk] = val

    def hand_back(self, share: ArgmaxShare, wc, argmax, order) -> torch.Tensor:
        """u and q_out of every recorded row into ``share`` (by row id; argmax [L, N]: the
        engine's arg-max keys by row id; ``order``: the visiting order, None for the
        identity). q_out: the positive term of the entries the blocks added it at
        (``common_positive``), which the engine took out with the entry.
        -> the reference's arg-max keys [L, N] by row id (``targets``)."""
        targets = self.targets(argmax)
        if self._kept is None:
            return targets
        k = self._kept
        tgt = targets if order is None else targets[:, order]             # visiting order
        col = self.col_of[tgt]
        rcol = self.rcol_of[tgt] if "rest" in k else None
        x = k.get("x")
        u = argmax_share(k["g"], col, x, k.get("sums"), wc, rcol, k.get("rest"), k.get("v_t"))
        rows = slice(0, tgt.shape[1]) if order is None else order
        q = torch.zeros_like(k["g"]) if x is None else torch.where(
            self.common_positive(rows, tgt, col), positive_q(x), 0.0)
        share.u[:, rows] = u
        share.q_out[:, rows] = q.double()
        self._kept = None
        return targets

    def common_positive(self, rows, tgt, col) -> torch.Tensor:
        """[L, b] bool: the entry (i, a) is a common key among i's positives at a level whose
        positives the engine's blocks add (their term is in the block, at that entry)."""
        if self.gid is None:
            return torch.zeros(tgt.shape, dtype=torch.bool, device=tgt.device)
        g_row = self.gid[:, rows]
        pos = (self.gid.gather(1, tgt) == g_row) & (g_row >= 0) & (col >= 0)
        if not self.include_self:
            pos &= tgt != (rows if torch.is_tensor(rows) else
                           torch.arange(rows.start, rows.stop, device=tgt.device))[None, :]
        return pos & self.handled[:, None]

    def targets(self, argmax: torch.Tensor) -> torch.Tensor:
        """[L, N] the reference's arg-max of every row from the engine's."""
        return self.tied.gather(1, argmax)


def argmax_share(g, col, x, sums, wc, rcol=None, rest=None, v_t=None) -> torch.Tensor:
    """u = g (p - 1) = -g sigmoid(log o - log t) [L, b] float64 (module docstring) of entries
    at common column col (x: e there, 0 where col < 0; sums: the rows' weighted common sums;
    x, sums None without common keys) or rest column rcol (rest: the rest keys' log-sum-exp
    without the entry's key, v_t its v; None without rest keys)."""
    dt = torch.float64
    log_t = torch.zeros(g.shape, dtype=dt, device=g.device)
    log_o = torch.full(g.shape, float("-inf"), dtype=dt, device=g.device)
    if x is not None:
        at_c = col >= 0
        t_c = (wc.gather(1, col.clamp(min=0)) * x).to(dt)                # the same fp32 product
        log_t = torch.where(at_c, torch.log(t_c), log_t)
        log_o = torch.log((sums.to(dt) - torch.where(at_c, t_c, 0.0)).clamp_(min=0.0))
    if rest is not None:
        log_t = torch.where(rcol >= 0, v_t.to(dt), log_t)
        log_o = torch.logaddexp(log_o, rest.to(dt))
    return -g.to(dt) * torch.sigmoid(log_o - log_t)


def rest_without_target(v_r, rcol, lse_r, subset: bool):
    """(log-sum-exp over the level-specific keys of each row without its arg-max rest key
    rcol (where rcol >= 0; else lse_r, all of them), [L, b]; v_r at rcol, 0 where none).
    ``subset``: only the rows with a rest arg-max (a host sync: ``host_reads_cheap``); else
    every row."""
    at_r = rcol >= 0
    if subset:
        rest, v_t = lse_r.clone(), torch.zeros_like(lse_r)
        lev, row = at_r.nonzero(as_tuple=True)
        v = v_r[lev, row]                                                 # [K, N_r]
        j = rcol[lev, row][:, None]
        v_t[lev, row] = v.gather(1, j).squeeze(1)
        rest[lev, row] = torch.logsumexp(v.scatter(1, j, float("-inf")), 1)
        return rest, v_t
    rc = rcol.clamp(min=0)[:, :, None]
    own = torch.zeros(v_r.shape, dtype=torch.bool, device=v_r.device)
    own.scatter_(2, rc, at_r[:, :, None])
    rest = torch.where(at_r, torch.logsumexp(v_r.masked_fill(own, float("-inf")), 2), lse_r)
    return rest, torch.where(at_r, v_r.gather(2, rc).squeeze(2), 0.0)


def set_at(block: torch.Tensor, col: torch.Tensor, take: torch.Tensor | None, val):
    """block[i, col[i]] = val[i] (a tensor or a number) where take[i] (None: every row) and
    col[i] >= 0 (block [b, n]), no host sync: rows not taken write their own entry back."""
    cc = col.clamp(min=0)[:, None]
    keep = block.gather(1, cc).squeeze(1)
    put = col >= 0 if take is None else take & (col >= 0)
    block.scatter_(1, cc, torch.where(put, val, keep)[:, None])


def fold_levels(t, col, pos, q, coef, a, wc, x, a_max: float | torch.Tensor):
    """The entries (i, col_l,i) of a gradient block of several levels, t_ik = sum_l a_l,i w_lk
    e_ik (units of a_max), rewritten BEFORE the positives add theirs: the levels whose arg-max
    is that key (col_l' = col_l) leave out their LSE part, and pre-subtract the positive term
    c_l' q_l' the positives will add where ``pos`` (so it cancels there); the other levels keep
    a_l' w_l',col e. coef [L, b]: the positives' coefficients c (None: no positives). All
    levels at once: [L (entry), L' (term), b]; levels sharing an entry write the same value.
    a_max: the block's normaliser, a float or (CUDA) a device scalar (`_lse_torch.block_norm`)."""
    n_levels, b = col.shape
    cc = col.clamp(min=0)
    same = col[:, None, :] == col[None, :, :]                             # [L, L', b]
    w_at = wc[:, cc.reshape(-1)].view(n_levels, n_levels, b).transpose(0, 1)   # w_l',col_l
    terms = torch.where(same, 0.0, a[None, :, :] * w_at * x[:, None, :])
    if coef is not None:
        terms = terms - torch.where(same & pos[None, :, :], (coef * q * (1.0 / a_max))[None],
                                    0.0)
    val = terms.sum(1)                                                    # [L, b]
    # one index_put for all levels; a level without a common arg-max writes its row's first
    # level that has one (same place, same value), or that row's entry back to itself
    take = col >= 0
    first = take.to(torch.uint8).argmax(dim=0)                            # [b]
    ar = torch.arange(b, device=t.device)
    flat = ar[None, :] * t.shape[1] + cc
    view = t.view(-1)
    f_first = flat[first, ar]
    v_first = torch.where(take.any(dim=0), val[first, ar], view[f_first])
    flat = torch.where(take, flat, f_first[None, :])
    view.index_put_((flat.reshape(-1),), torch.where(take, val, v_first[None, :]).reshape(-1))


class TileFold:
    """The same in the symmetric engine (``_lse_symmetric``), whose tiles hold each unordered
    pair once: W_ij = A_ij + A_ji (+ the positives' c q of both directions) off the diagonal
    block, A_ij (+ c_i q_ij) on it, A_ij = g_i w_j exp(s_ij - lse_i). The entry of a row i and
    its arg-max a is rewritten in float64 from its logit and the rows' pass-1 statistics: the
    direction i -> a left out (its u and q_out recorded), the other direction as it was (A_ai
    + its positive term, or left out in turn where a's arg-max is i).

    The logit of an entry whose key is its row's own arg-max in pass 1 is that row's max m_i
    (the same product, bit for bit), so those entries are computed at once, before the
    gradient pass, and a tile only writes them; an entry moved to an earlier duplicate key
    (``_tied_keys``) reads its logit from the tile before the gradient pass overwrites it.

    Rows are in the engine's sorted order; ``tiles``: the engine's (r0, r1, c0, c1) list
    (each row block's diagonal tile, then its pieces left to right, of any widths), ``block``
    its row block; target [N]: each row's arg-max (first of duplicate keys) and own [N]: its
    pass-1 arg-max, sorted positions; take [N]: rows with a nonzero coefficient."""

    def __init__(self, tiles, block: int, target: torch.Tensor,
                 own: torch.Tensor, take: torch.Tensor):
        n = target.numel()
        i = take.nonzero().squeeze(1)
        k = target[i]
        diag = (i // block) == (k // block)
        lo = torch.where(diag, i, torch.minimum(i, k))
        hi = torch.where(diag, k, torch.maximum(i, k))
        fwd = diag | (i == lo)                      # the fold's query is the entry's row
        # off the diagonal block, (i, a) and (a, i) are one entry: merge mutual arg-maxes
        key = lo * n + hi + torch.where(diag, 0, n * n)
        key, inv = torch.unique(key, return_inverse=True)
        first = torch.full((key.numel(),), i.numel(), dtype=torch.long)
        first.scatter_reduce_(0, inv, torch.arange(i.numel()), "amin")
        q, k, diag = lo[first], hi[first], diag[first]
        flag = torch.zeros(key.numel(), dtype=torch.uint8)
        f1 = flag.scatter_reduce(0, inv, fwd.to(torch.uint8), "amax").bool()
        f2 = flag.scatter_reduce(0, inv, (~fwd).to(torch.uint8), "amax").bool()
        # the logit is a row max where a folding direction's key is its own pass-1 arg-max
        from_q = f1 & (own[q] == k)
        known = from_q | (f2 & (own[k] == q))
        # the entries' tiles (a block's diagonal tile, then its pieces, in ``tiles``' order)
        # and their offsets in a tile's [r1 - r0, c1 - c0] buffer. Every tile is keyed by
        # block * (n + 1) + its first column: the list is sorted by that key, and an entry's
        # tile is the last one whose key is <= block * (n + 1) + its column
        spec = torch.tensor(tiles, dtype=torch.long).reshape(-1, 4)
        t_key = (spec[:, 0] // block) * (n + 1) + spec[:, 2]
        blk = q // block
        r0 = blk * block
        col = torch.where(diag, r0, k)
        tile = torch.searchsorted(t_key, blk * (n + 1) + col, right=True) - 1
        c0 = spec[tile, 2]
        ld = spec[tile, 3] - c0
        order = torch.argsort(tile, stable=True)
        self.q, self.k, self.diag = q[order], k[order], diag[order]
        self.f1, self.f2, self.known = f1[order], f2[order], known[order]
        self.from_q = from_q[order]                 # the known logit is m_q (else m_k)
        self.flat = ((q - r0) * ld + (k - c0))[order]
        ends = torch.cumsum(torch.bincount(tile, minlength=len(tiles)), 0).tolist()
        self.spans = [slice(a, b) if b > a else None
                      for a, b in zip([0, *ends[:-1]], ends, strict=True)]
        # tiles with entries whose logit must be read (their positions in the tile's span)
        unknown = (~self.known).nonzero().squeeze(1)
        tile_of = tile[order][unknown].tolist()
        self.unknown = {}
        for t, e in zip(tile_of, unknown.tolist(), strict=True):
            self.unknown.setdefault(t, []).append(e)
        self.unknown = {t: torch.tensor(e) for t, e in self.unknown.items()}
        self.u = torch.zeros(n, dtype=torch.float64)        # sorted order, units of g
        self.q_out = torch.zeros(n, dtype=torch.float64)

    def rows(self, stats):
        """Bind the rows' statistics (a dict: m, rel, g, lw, row_s, cutoff; for the positives
        c, gid, include_self; c None: none) and compute every entry whose logit is known."""
        self.st = stats
        m = stats["m"]
        logits = torch.where(self.from_q, m[self.q], m[self.k])
        self.val = self._values(logits, self.q, self.k, self.f1, self.f2, self.diag,
                                self.known).to(m.dtype)

    def read(self, t: int, s: torch.Tensor, scale: float):
        """Tile t's logits at its entries that need them (before the gradient pass: its dot
        products, scaled as the kernels scale them), or None."""
        idx = self.unknown.get(t)
        return None if idx is None else s.reshape(-1)[self.flat[idx]] * scale

    def write(self, t: int, s: torch.Tensor, logits: torch.Tensor | None):
        """Tile t's entries rewritten (after the gradient pass wrote W into s); logits: what
        ``read`` returned."""
        sp = self.spans[t]
        if sp is None:
            return
        if logits is not None:
            idx = self.unknown[t]
            self.val[idx] = self._values(logits, self.q[idx], self.k[idx], self.f1[idx],
                                         self.f2[idx], self.diag[idx], None).to(s.dtype)
        s.view(-1)[self.flat[sp]] = self.val[sp]

    def _values(self, logits, q, k, f1, f2, diag, record):
        """The entries (float64) of logits s_qk; ``record``: entries whose u / q_out to keep
        (None: all)."""
        off = ~diag
        val = self._direction(logits, q, k, f1, record)
        return val + torch.where(off, self._direction(logits, k, q, f2 & off, record), 0.0)

    def _direction(self, s, q, k, fold, record):
        """Query q, key k of the logits s (fp32): A_qk plus the positives' c_q q_qk, or 0
        where ``fold`` (u and q_out of row q recorded)."""
        st = self.st
        cut = st["cutoff"]
        arg = s - st["m"][q]                                              # fp32, as the kernel
        x = torch.where(arg < -cut, 0.0, torch.exp(arg))                  # fp32
        g = st["g"][q].double()
        a_arg = arg.double() + (st["lw"][k].double() - st["rel"][q].double())
        val = g * torch.where(a_arg < -cut, 0.0, torch.exp(a_arg))
        pos = torch.zeros_like(fold)
        if st["c"] is not None:
            pos = st["gid"][q] == st["gid"][k]
            if not st["include_self"]:
                pos &= q != k
            qv = positive_q(x).double()
            val = val + torch.where(pos, st["c"][q].double() * qv, 0.0)
        keep = fold if record is None else fold & record
        if bool(keep.any()):
            t = (st["lw"][k].exp() * x).double()                          # the pass-1 product
            o = (st["row_s"][q] - t).clamp_(min=0.0)
            u = -g * torch.sigmoid(torch.log(o) - torch.log(t))
            self.u[q[keep]] = u[keep]
            if st["c"] is not None:
                self.q_out[q[keep]] = torch.where(pos, qv, 0.0)[keep]
        return torch.where(fold, 0.0, val)
