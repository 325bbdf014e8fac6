"""``_max_fold``: the LSE part g (p - 1) of the official arg-max entry (``argmax_share``),
formed so that it cancels exactly, against p in float64 from the same block; the helpers that
take the entry out of a gradient block."""
from __future__ import annotations

import pytest
import torch

from hiertail_fast import hierarchical_contrastive_loss
from hiertail_fast.ops._max_fold import (
    ArgmaxShare,
    MaxFold,
    TileFold,
    argmax_share,
    fold_levels,
    positive_q,
    rest_without_target,
    set_at,
)
from tests.conftest import DEVICES


def _block(seed: int, n_c: int = 7, n_r: int = 3, b: int = 5, levels: int = 2):
    g = torch.Generator().manual_seed(seed)
    e = torch.rand(b, n_c, generator=g)
    e[torch.arange(b), torch.randint(0, n_c, (b,), generator=g)] = 1.0     # each row's max
    wc = torch.rand(levels, n_c, generator=g) + 0.1
    v_r = torch.randn(levels, b, n_r, generator=g) - 1.0
    v_r[0, :, 1] = float("-inf")                                           # hidden at level 0
    sums = (wc[:, None, :] * e[None]).double().sum(2)                      # as the C step
    coef = torch.randn(levels, b, generator=g)
    return e, wc, v_r, sums, coef


def _shares(mf: MaxFold, arg, coef, e, sums, wc, v_r, lse_r):
    """One block's entries and their shares u, as ``hand_back`` forms them:
    (tgt, col, rcol, u [L, b] float64, x)."""
    tgt, col, rcol, x, rest, v_t = mf.entries(arg, e, v_r, lse_r)
    return tgt, col, rcol, argmax_share(coef, col, x, sums, wc, rcol, rest, v_t), x


def _fold(n_c: int, n_r: int, levels: int):
    """A MaxFold over n_c common keys (ids 0..n_c-1) and n_r rest keys, no duplicate rows."""
    z = torch.randn(n_c + n_r, 4, generator=torch.Generator().manual_seed(9))
    visible = torch.ones(levels, n_c + n_r, dtype=torch.bool)
    return MaxFold(z, visible, None if n_r == 0 else torch.arange(n_c),
                   torch.arange(n_c, n_c + n_r))


def test_shares_match_float64_softmax_on_common_and_rest_keys():
    e, wc, v_r, sums, coef = _block(0)
    n_c, n_r, levels, b = e.shape[1], v_r.shape[2], wc.shape[0], e.shape[0]
    mf = _fold(n_c, n_r, levels)
    arg = torch.tensor([[0, 3, n_c + 0, 6, n_c + 2], [2, n_c + 1, 1, 4, 5]])
    tgt, col, rcol, share, x = _shares(mf, arg, coef, e, sums, wc, v_r, torch.logsumexp(v_r, 2))
    assert torch.equal(tgt, arg) and share.dtype == torch.float64
    terms = torch.cat([(wc[:, None, :] * e[None]).double(), v_r.double().exp()], dim=2)
    tot = terms.sum(2)
    for lev in range(levels):
        for i in range(b):
            k = int(arg[lev, i])
            p = terms[lev, i, k] / tot[lev, i]
            expect = coef[lev, i].double() * (p - 1)
            assert abs(share[lev, i].double() - expect) <= 1e-6 * abs(coef[lev, i]) + 1e-12
            if k < n_c:
                assert col[lev, i] == k and rcol[lev, i] == -1 and x[lev, i] == e[i, k]
            else:
                assert rcol[lev, i] == k - n_c and col[lev, i] == -1 and x[lev, i] == 0


def test_share_is_exactly_zero_when_the_max_holds_the_whole_row():
    """Every other term underflowed (e = 0): p = 1 and the entry must be exactly 0, as the
    reference's p - 1 is; a subtraction of two rounded values would leave ulps."""
    b, n_c = 4, 6
    e = torch.zeros(b, n_c)
    e[torch.arange(b), torch.tensor([0, 2, 5, 1])] = 1.0
    wc = torch.full((1, n_c), 1.0 / 3.0)
    sums = (wc[:, None, :] * e[None]).double().sum(2)
    coef = torch.tensor([[0.7, -1.3, 2.0, 1e-3]])
    mf = _fold(n_c, 0, 1)
    arg = torch.tensor([[0, 2, 5, 1]])
    share = _shares(mf, arg, coef, e, sums, wc, None, None)[3]
    assert (share == 0).all()


def test_shares_go_to_the_first_of_duplicate_keys():
    """Duplicate rows: the reference's arg-max is the first of the equal keys (``_tied_keys``);
    the share's column follows it, its p is that key's own."""
    z = torch.randn(5, 3, generator=torch.Generator().manual_seed(1))
    z[4] = z[1]
    mf = MaxFold(z, torch.ones(1, 5, dtype=torch.bool), None, torch.empty(0, dtype=torch.long))
    e = torch.tensor([[0.2, 0.9, 0.1, 0.3, 1.0]])
    wc = torch.ones(1, 5)
    sums = e.double().sum(1, keepdim=True).t()
    tgt, col, _, share, x = _shares(mf, torch.tensor([[4]]), torch.tensor([[1.0]]), e, sums, wc,
                                      None, None)
    assert tgt.item() == 1 and col.item() == 1 and x.item() == e[0, 1].item()
    p = 0.9 / float(e.double().sum())
    assert abs(share.item() - (p - 1)) < 1e-6


def test_set_at_writes_one_entry_per_row():
    block = torch.arange(12.0).view(3, 4)
    set_at(block, torch.tensor([2, -1, 0]), torch.tensor([True, True, False]),
           torch.tensor([5.0, 6.0, 7.0]))
    expect = torch.arange(12.0).view(3, 4)
    expect[0, 2] = 5.0       # row 1: no column (-1); row 2: not taken
    assert torch.equal(block, expect)
    set_at(block, torch.tensor([-1, 3, 1]), None, 0.0)     # every row with a column
    expect[1, 3] = expect[2, 1] = 0.0
    assert torch.equal(block, expect)


class _Positives:
    """What MaxFold reads of the engine's positives: labels [L, N], the levels they handle."""

    def __init__(self, gid, handled, include_self):
        self.gid, self.handled, self.include_self = gid, handled, include_self


@pytest.mark.parametrize("include_self", [True, False])
def test_recorded_blocks_hand_back_the_per_block_shares(include_self):
    """``record`` per block then ``hand_back`` once (the engine's path: the shares formed once
    per call) equals each block's own shares bit for bit, rows visited in a permuted order
    (u and q_out land by row id), rest keys and positives included."""
    n_c, n_r, levels, b = 7, 3, 2, 5
    n = n_c + n_r
    z = torch.randn(n, 4, generator=torch.Generator().manual_seed(9))
    z[5] = z[2]                                                # a duplicate common key
    gen = torch.Generator().manual_seed(3)
    gid = torch.randint(0, 3, (levels, n), generator=gen)
    pos = _Positives(gid, [True, False], include_self)
    mf = MaxFold(z, torch.ones(levels, n, dtype=torch.bool), torch.arange(n_c),
                 torch.arange(n_c, n), pos)
    order = torch.randperm(n, generator=gen)
    share = ArgmaxShare(levels, n, "cpu")
    argmax = torch.zeros(levels, n, dtype=torch.long)
    expect_u = torch.zeros(levels, n, dtype=torch.float64)
    expect_q = torch.zeros_like(expect_u)
    for blk in (slice(0, b), slice(b, n)):
        e, _, v_r, _, coef = _block(blk.start, n_c, n_r, blk.stop - blk.start, levels)
        wc = _block(0, n_c, n_r, b, levels)[1]                 # one set of key weights
        sums = (wc[:, None, :] * e[None]).double().sum(2)
        rows = order[blk]
        arg = torch.randint(0, n, (levels, rows.numel()), generator=gen)
        argmax[:, rows] = arg
        lse_r = torch.logsumexp(v_r, 2)
        tgt, col, _, u, x = _shares(mf, arg, coef, e, sums, wc, v_r, lse_r)
        expect_u[:, rows] = u
        expect_q[:, rows] = torch.where(mf.common_positive(rows, tgt, col), positive_q(x),
                                        0.0).double()
        mf.record(blk, coef, mf.entries(arg, e, v_r, lse_r), sums)
    targets = mf.hand_back(share, wc, argmax, order)
    assert torch.equal(targets, mf.targets(argmax))
    assert torch.equal(share.u, expect_u) and torch.equal(share.q_out, expect_q)
    assert (share.q_out[0] != 0).any() and (share.q_out[1] == 0).all()   # level 1 unhandled


def test_fold_levels_leaves_out_the_folded_levels_and_pre_subtracts_their_positive():
    """Two levels over 3 common keys, one row: level 0's arg-max is key 2 (a positive of the row),
    level 1's is key 0. Entry (0, 2) keeps only level 1's term minus level 0's positive term;
    entry (0, 0) keeps only level 0's term; the other entry is untouched."""
    a = torch.tensor([[0.5], [0.25]])                        # a_l (units of a_max)
    wc = torch.tensor([[1.0, 2.0, 3.0], [4.0, 5.0, 6.0]])
    e = torch.tensor([[0.75, 0.5, 1.0]])
    t = (a[0][:, None] * wc[0] + a[1][:, None] * wc[1]) * e
    untouched = t[0, 1].clone()
    col = torch.tensor([[2], [0]])
    x = torch.stack([e[:, 2], e[:, 0]])
    pos = torch.tensor([[True], [False]])
    q = torch.where(pos, positive_q(x), 0.0)
    coef = torch.tensor([[-0.125], [-0.5]])
    a_max = 2.0
    fold_levels(t, col, pos, q, coef, a, wc, x, a_max)
    assert torch.allclose(t[0, 2], a[1, 0] * wc[1, 2] * e[0, 2] - coef[0, 0] * q[0, 0] / a_max)
    assert torch.allclose(t[0, 0], a[0, 0] * wc[0, 0] * e[0, 0])
    assert t[0, 1] == untouched


def test_positive_q_matches_the_official_pairs():
    from hiertail_fast.ops._contrastive_pairs import OFFICIAL_EPS

    x = torch.tensor([1.0, 0.5, 1e-7, 0.0])
    assert torch.equal(positive_q(x), x / (x + OFFICIAL_EPS))


def test_fold_levels_with_a_level_whose_arg_max_is_not_common():
    """Row 0: level 0's arg-max is common key 0, level 1's a level-specific key (col -1) - the
    level without a common column must not write over level 0's entry (one index_put for all
    levels: the later write won with a plain write-back). Row 1: neither has one."""
    a = torch.tensor([[0.5, 0.5], [0.25, 0.25]])
    wc = torch.tensor([[1.0, 2.0], [4.0, 5.0]])
    e = torch.tensor([[1.0, 0.5], [0.3, 0.2]])
    t = (a[0][:, None] * wc[0] + a[1][:, None] * wc[1]) * e
    before = t.clone()
    col = torch.tensor([[0, -1], [-1, -1]])
    x = torch.tensor([[1.0, 0.0], [0.0, 0.0]])
    none = torch.zeros(2, 2, dtype=torch.bool)
    fold_levels(t, col, none, torch.zeros(2, 2), None, a, wc, x, 1.0)
    assert torch.allclose(t[0, 0], a[1, 0] * wc[1, 0] * e[0, 0])     # level 0's part out
    assert torch.equal(t[0, 1], before[0, 1]) and torch.equal(t[1], before[1])


def test_rest_without_target_row_subset_equals_every_row():
    """The CPU path (only rows whose arg-max is a rest key) and the no-sync path (every row)."""
    g = torch.Generator().manual_seed(3)
    v_r = torch.randn(2, 6, 5, generator=g)
    v_r[1, :, 2] = float("-inf")
    rcol = torch.tensor([[0, -1, 4, 1, -1, 3], [-1, 0, -1, 4, 3, -1]])
    lse_r = torch.logsumexp(v_r, 2)
    a, ta = rest_without_target(v_r, rcol, lse_r, True)
    b, tb = rest_without_target(v_r, rcol, lse_r, False)
    torch.testing.assert_close(a, b)
    torch.testing.assert_close(ta, tb)
    for lev in range(2):
        for i in range(6):
            j = int(rcol[lev, i])
            keep = [k for k in range(5) if k != j]
            torch.testing.assert_close(a[lev, i], torch.logsumexp(v_r[lev, i, keep], 0))
            assert ta[lev, i] == (v_r[lev, i, j] if j >= 0 else 0.0)


@pytest.mark.parametrize("use", ["blas", "onednn"])
@pytest.mark.parametrize("n,budget", [(600, None), (1030, None), (3000, 4 * 256 * 700),
                                      (5000, 4 * 256 * 1024)])
def test_tile_fold_addresses_every_entry_inside_its_tile(monkeypatch, n, budget, use):
    """The symmetric engine's entries (i, target_i) located in the engine's tile list
    (diagonal tiles, then column pieces: several per block with a small block-byte budget;
    for oneDNN of power-of-two widths, then a ragged one), each at its (row, column) offset
    in the tile's buffer, mutual pairs merged."""
    from hiertail_fast.ops import _lse_symmetric as sym

    if budget is not None:
        monkeypatch.setenv("HIERTAIL_CPU_BLOCK_BYTES", str(budget))
    tiles, _ = sym._tiles(n, use)
    target = torch.randint(0, n, (n,), generator=torch.Generator().manual_seed(n))
    target[:3] = torch.tensor([n - 1, 0, 2])             # 0 -> n - 1, 1 -> 0, 2 -> itself
    target[n - 1] = 0                 # 0 <-> n - 1 (other blocks): one entry, both folded
    tf = TileFold(tiles, sym.MAX_BLOCK_ROWS, target, target.clone(),
                  torch.ones(n, dtype=torch.bool))
    seen = 0
    for t, sp in enumerate(tf.spans):
        if sp is None:
            continue
        r0, r1, c0, c1 = tiles[t]
        q, k = tf.q[sp], tf.k[sp]
        assert ((q >= r0) & (q < r1) & (k >= c0) & (k < c1)).all()
        assert torch.equal(tf.flat[sp], (q - r0) * (c1 - c0) + (k - c0))
        seen += q.numel()
    assert seen == tf.q.numel()
    mutual = (tf.q == 0) & (tf.k == n - 1)
    assert int(mutual.sum()) == 1 and bool(tf.f1[mutual]) and bool(tf.f2[mutual])


# ---- MaxFold.record's per-row buffers (_kept): dtypes (a mutation audit, s43)
def _engine_grads(z, labels, protos, backend, dev):
    zz = z.clone().to(dev).requires_grad_()
    pp = [p.clone().to(dev).requires_grad_() for p in protos]
    loss = hierarchical_contrastive_loss(zz, [y.to(dev) for y in labels], pp, temperature=0.5,
                                         variant="official", backend=backend)
    loss.backward()
    return [t.detach().cpu() for t in (loss, zz.grad, *(p.grad for p in pp))]


@pytest.mark.parametrize("dev", DEVICES)
def test_float64_rest_key_maxima_keep_float64_shares(dev):
    """``MaxFold.record``'s per-row buffers (``_kept``) for the level-specific keys: in
    float64, rows whose official max is a level's own prototype (a rest key) keep that key's
    log-sum-exp terms (``rest``, ``v_t``) in the input's dtype; kept in float32 the arg-max
    entry's share lost ~1e-8 of its size and every float64 test passed (their rest-key maxima
    were rare or float32). The engine against the float64 reference at float64 precision, on
    each device."""
    gen = torch.Generator().manual_seed(5)
    n, d = 48, 6
    z = torch.randn(n, d, generator=gen, dtype=torch.float64) * 0.5
    y0 = torch.randint(0, 5, (n,), generator=gen)
    labels = [y0, y0 // 2]
    protos = [torch.randn(5, d, generator=gen, dtype=torch.float64) * 2.0,
              torch.randn(3, d, generator=gen, dtype=torch.float64) * 2.0]
    # the precondition: most rows' max at some level is a prototype (a level-specific key)
    rest_max = torch.zeros(n, dtype=torch.bool)
    for p in protos:
        s = z @ torch.cat([z, p]).t()
        rest_max |= s.argmax(dim=1) >= n
    assert int(rest_max.sum()) > n // 2
    want = _engine_grads(z, labels, protos, "reference", dev)
    got = _engine_grads(z, labels, protos, "torch", dev)
    for a, w in zip(got, want, strict=True):
        torch.testing.assert_close(a, w, rtol=1e-10, atol=1e-12)
