"""Corners of the official loss's CPU engines that a mutation audit found untested: the
symmetric engine's arg-max on ties across column chunks, the positives' contiguity check, the
tie rule and clamp of recomputed positive logits, and dL/dtau's eps * #labels term and row
blocks. Each case is checked against the float64 reference (tests/test_contrastive_numerics.py's
rule where fp32 rounding is involved) or against a formula written here."""
from __future__ import annotations

import math

import pytest
import torch

import hiertail_fast.ops._contrastive_pairs as pairs_mod
import hiertail_fast.ops._lse_symmetric as sym
import hiertail_fast.ops._temperature_grad as tgrad_mod
from hiertail_fast import balanced_contrastive_loss, hierarchical_contrastive_loss
from hiertail_fast.ops._positive_blocks import BlockPositives
from hiertail_fast.ops._positive_keys import key_order
from hiertail_fast.reference import balanced_contrastive_loss_ref as ref
from tests import test_lse_symmetric
from tests.conftest import tol
from tests.test_contrastive_numerics import assert_within_reference_error

pytestmark = pytest.mark.usefixtures("one_thread")
# the symmetric engine on every fp32 CPU single-level call, in row blocks of 16 (a 600-row
# tile spans three of the C kernel's 256-column chunks); its value counts the engine's calls
forced = test_lse_symmetric.forced

EPS = pairs_mod.OFFICIAL_EPS
def _integer_rows(n: int, seed: int):
    """Integer rows in {-2..2}^3 (exact logits: a row's max is often held by several DIFFERENT
    keys) and unsorted labels (the engine visits keys sorted by label, not by id)."""
    g = torch.Generator().manual_seed(seed)
    return (torch.randint(-2, 3, (n, 3), generator=g).float(),
            torch.randint(0, 5, (n,), generator=g))


@pytest.mark.parametrize("seed", [0, 1])
def test_symmetric_argmax_first_index_across_column_chunks(forced, seed):
    """The symmetric engine's row arg-max is the FIRST id holding the max (torch.max's rule)
    when the max is tied in several 256-column chunks of one tile and a later chunk holds a
    smaller id (keys sorted by label). A mutation audit found that a chunk whose max only
    equals the running max was never scanned for a smaller id (one thread: 163 of 600 rows
    got a later key), and no test noticed. Against a dense float64 computation."""
    n = 600
    z, y = _integer_rows(n, seed)
    log_w = -torch.log(torch.bincount(y)[y].float())[None]
    pos = sym.Positives(y, True, torch.full((n,), -0.01))
    coef = lambda rows, lse, rmax: torch.full_like(lse, 0.01)
    lse, rmax, amax, _ = sym.lse_fused(z, log_w, 0.5, True, coef, positives=pos)
    assert forced["fused"] == 1
    s = (z.double() @ z.double().t()) * 0.5                 # exact: ties stay ties
    is_max = s == s.max(dim=1, keepdim=True).values
    # the case has ties between distinct keys (not only duplicate rows)
    distinct = torch.tensor([len({tuple(r) for r in z[m].tolist()}) for m in is_max])
    assert int((distinct > 1).sum()) > n // 4
    assert torch.equal(rmax[0].double(), s.max(dim=1).values)
    first = is_max.double().argmax(dim=1)                     # first True per row
    assert torch.equal(amax[0], first), f"{int((amax[0] != first).sum())} rows differ"
    torch.testing.assert_close(lse[0], torch.logsumexp(s + log_w[0].double(), dim=1))


@pytest.mark.parametrize("include_self", [True, False])
def test_symmetric_official_gradient_on_tied_distinct_keys(forced, include_self):
    """The official loss through the symmetric engine on integer rows (ties between distinct
    keys in several column chunks): the row max's gradient goes to the first arg-max key, as in
    the dense reference. A mutation audit's tie-rule bug moved it to a later key: the gradient
    11 % of its size off, no test failed. The suite's rule (test_contrastive_numerics)."""
    n, tau = 600, 0.5
    z, y = _integer_rows(n, 3)

    def run(zz, backend):
        zz = zz.clone().requires_grad_()
        loss = balanced_contrastive_loss(zz, y, temperature=tau, variant="official",
                                         include_self=include_self, backend=backend)
        (loss * 2).backward()
        return [loss.detach().double(), zz.grad.double()]

    got = run(z, "torch")
    assert forced["fused"] >= 1
    exp, low = run(z.double(), "reference"), run(z, "reference")
    terms = 2.0 * z.abs().max().item() * z.shape[1] ** 0.5 / tau / n
    assert_within_reference_error(got, exp, low, terms)


# A two-level case whose level B has ONE key between its group 7's members in the key order
# (sorted by A, the level with more pairs, then by B): positions 3 and 5.
_GAP_A = torch.tensor([0, 0, 0, 0, 1, 1, 1, 1])
_GAP_B = torch.tensor([5, 5, 5, 7, 6, 7, 8, 8])


def _contiguous_in_key_order(gid: torch.Tensor, lev: int) -> bool:
    """Whether every group of level ``lev`` occupies consecutive positions of ``key_order``."""
    g = gid[lev, key_order(gid)].tolist()
    for label in set(g) - {-1}:
        at = [i for i, v in enumerate(g) if v == label]
        if at[-1] - at[0] + 1 != len(at):
            return False
    return True


def test_positive_blocks_one_gap_group_is_not_contiguous():
    """BlockPositives takes a level's positives from the engine's blocks only where each of its
    groups is one contiguous key range. A group with a single foreign key inside its range is
    not: a mutation audit's off-by-one (<= count) took it (the hierarchical loss 7.41 instead
    of 7.49), unnoticed. The flags are checked against a contiguity test written here, on the
    hand-made case and on random pairs of small label vectors."""
    z = torch.randn(8, 4, generator=torch.Generator().manual_seed(0), dtype=torch.float64)
    gid = torch.stack([_GAP_A, _GAP_B - 5])
    order = key_order(gid)
    assert gid[1, order].tolist() == [0, 0, 0, 2, 1, 2, 3, 3]      # the gap, as described
    blocks = BlockPositives(z, gid, [2, 4], True, None, 1.0, torch.ones(8, dtype=torch.bool))
    assert blocks.handled == [True, False]
    g = torch.Generator().manual_seed(1)
    gaps = 0
    for _ in range(60):
        n = int(torch.randint(6, 14, (1,), generator=g))
        labels = torch.stack([torch.randint(0, 3, (n,), generator=g),
                              torch.randint(0, 4, (n,), generator=g)])
        gid = torch.stack([torch.unique(lab, return_inverse=True)[1] for lab in labels])
        n_groups = [int(row.max()) + 1 for row in gid]
        zz = torch.randn(n, 4, generator=g, dtype=torch.float64)
        got = BlockPositives(zz, gid, n_groups, True, None, 1.0,
                             torch.ones(n, dtype=torch.bool)).handled
        want = [_contiguous_in_key_order(gid, lev) for lev in range(2)]
        assert got == want, (labels.tolist(), got, want)
        gaps += not all(want)
    assert gaps >= 10                                   # the random cases do have gaps


@pytest.mark.parametrize("include_self", [True, False])
def test_hierarchical_official_with_a_one_gap_group(include_self):
    """The hierarchical official loss on that case (float64, torch backend) equals the sum of
    the reference's levels, values and gradient, to float64 tolerance: the one-gap group must
    go to the pair pass (a mutation audit's off-by-one read it from the blocks: 0.21 off)."""
    z = torch.randn(8, 4, generator=torch.Generator().manual_seed(0), dtype=torch.float64)
    kw = dict(temperature=0.5, variant="official", include_self=include_self)
    a = z.clone().requires_grad_()
    got = hierarchical_contrastive_loss(a, [_GAP_A, _GAP_B], [None, None], backend="torch",
                                        **kw)
    got.backward()
    b = z.clone().requires_grad_()
    want = sum(ref(b, lab, **kw) for lab in (_GAP_A, _GAP_B))
    want.backward()
    torch.testing.assert_close(got.detach(), want.detach(), **tol(torch.float64))
    torch.testing.assert_close(a.grad, b.grad, **tol(torch.float64))


def _hub_copies(seed: int, smax: float, tau: float, d: int = 64):
    """60 rows, each one of 10 exact copies of one of 6 hub rows of |s| = smax (shuffled);
    returns z (fp32), the hub of each row and each row's copy number."""
    g = torch.Generator().manual_seed(seed)
    hubs = torch.randn(6, d, generator=g, dtype=torch.float64)
    hubs = hubs / hubs.norm(dim=1, keepdim=True) * (smax * tau) ** 0.5
    perm = torch.randperm(60, generator=g)
    hub, copy = torch.arange(60)[perm] // 10, torch.arange(60)[perm] % 10
    return hubs[hub].float(), hub, copy


@pytest.mark.parametrize("sync_free", [False, True])
@pytest.mark.parametrize("include_self", [True, False])
@pytest.mark.parametrize("seed", [0, 1, 2, 3])
def test_positive_pairs_copies_of_the_argmax_get_zero(seed, include_self, sync_free,
                                                      monkeypatch):
    """positive_pairs: a positive that is a bitwise copy of the row's arg-max row has s_ij = M_i
    exactly, as in the dense reference (one s for both), so every term is log(1 + eps) and
    q = 1 / (1 + eps), whatever the rounding of the recomputed dot at |s| = 1e4. A mutation
    audit's tie rule that zeroed only j == arg-max left copies a few ulp of |s| below M
    (T off by ~5e-3), no test failed. M_i, a_i from an fp32 GEMM, as the engines make them."""
    import hiertail_fast.ops._host_reads as host_reads

    monkeypatch.setattr(host_reads, "FORCE_SYNC_FREE", sync_free)   # CUDA's form too
    tau = 0.01
    z, hub, copy = _hub_copies(seed, 1e4, tau)
    gid = hub * 2 + (copy < 5).long()                  # classes of 5 copies of one hub
    row_max, arg_max = (z @ z.t() / tau).max(dim=1)
    big_t, big_q, _ = pairs_mod.positive_pairs(z, gid, 12, row_max, arg_max, 1 / tau,
                                               include_self)
    n_pos = 5 if include_self else 4
    t = tol(torch.float32)
    want_t = torch.full((60,), n_pos * math.log(1 + EPS), dtype=torch.float64)
    torch.testing.assert_close(big_t.double(), want_t, **t)
    torch.testing.assert_close(big_q.double(), want_t.new_full((60,), n_pos / (1 + EPS)), **t)


@pytest.mark.parametrize("include_self", [True, False])
@pytest.mark.parametrize("seed", [0, 1])
def test_positive_pairs_sync_free_form_equals_the_cpu_form(seed, include_self, monkeypatch):
    """positive_pairs' CUDA form (the tie rule through ``first_equal_rows``, no host read per
    block) gives the CPU form's numbers bit for bit: small groups (explicit pairs) and big ones
    (GEMM blocks, 3 of them per group here), copies of hub rows at |s| ~ 1e4 (ties with the
    arg-max), near-ties that are not copies, -0.0 against 0.0, with and without coefficients."""
    import hiertail_fast.ops._host_reads as host_reads

    tau = 0.01
    g = torch.Generator().manual_seed(seed)
    z, hub, _ = _hub_copies(seed, 1e4, tau, d=16)
    z = torch.cat([z, z[:40]])                         # 100 rows: hubs of 10 to 17 copies
    z[::7] += torch.randn(z[::7].shape, generator=g) * 1e-4    # near-ties, not copies
    z[3, 0], z[63, 0] = 0.0, -0.0
    z[63] = torch.where(torch.arange(16) == 0, z[63], z[3])     # equal rows up to the sign of 0
    gid = torch.randint(0, 3, (100,), generator=g)     # two big groups (> SMALL_GROUP) and one
    gid[gid == 2] = torch.randint(2, 12, (int((gid == 2).sum()),), generator=g)   # + small ones
    gid[::11] = -1                                     # rows outside the level
    scale = 1 / tau
    s = z @ z.t() * scale
    row_max, arg_max = s.max(dim=1)
    coef = torch.randn(100, generator=g)
    monkeypatch.setattr(pairs_mod, "SMALL_GROUP", 8)              # groups of ~30: big
    monkeypatch.setattr(pairs_mod, "BLOCK_ELEMS", 12 * 30)       # several blocks per group
    out = {}
    for sync_free in (False, True):
        monkeypatch.setattr(host_reads, "FORCE_SYNC_FREE", sync_free)
        out[sync_free] = pairs_mod.positive_pairs(z, gid, 12, row_max, arg_max, scale,
                                                  include_self, coef)
    assert int(torch.bincount(gid[gid >= 0]).max()) > pairs_mod.SMALL_GROUP
    for a, b in zip(out[False], out[True], strict=True):
        assert torch.equal(a, b)


def test_first_equal_rows_and_a_hash_collision(monkeypatch):
    """``_tied_keys.first_equal_rows``: the smallest index of an equal row (-0.0 equal to 0.0),
    across its chunks; a forced hash collision between different rows does not make them equal."""
    import hiertail_fast.ops._tied_keys as tied

    z = torch.tensor([[1.0, 2.0], [3.0, 4.0], [1.0, 2.0], [0.0, 5.0], [-0.0, 5.0], [3.0, 4.0],
                      [1.0, 2.0]])
    monkeypatch.setattr(tied, "_HASH_ROWS", 3)                   # rows compared 3 at a time
    assert tied.first_equal_rows(z).tolist() == [0, 1, 0, 3, 3, 1, 0]
    assert tied.first_equal_rows(z[:1]).tolist() == [0]
    monkeypatch.setattr(tied, "row_ids", lambda t: torch.zeros(t.shape[0], dtype=torch.long))
    # every row in one hash group: the rows that differ from row 0 keep their own index (so 3
    # and 4 now look different: the documented cost of a collision), row 5 is not row 0's
    assert tied.first_equal_rows(z).tolist() == [0, 1, 0, 3, 4, 5, 0]
    # rows that share some entries are not equal (a second mutation audit's .all for .any)
    assert tied.first_equal_rows(torch.tensor([[1.0, 2.0], [1.0, 3.0]])).tolist() == [0, 1]
    monkeypatch.undo()
    assert tied.first_equal_rows(z[:1].repeat(2, 1)).tolist() == [0, 0]      # two rows (n = 2)


def _hierarchical_and_reference(z, labels, tau):
    """[loss, dL/dz] (grad_output 2) of the fused hierarchical official loss (torch backend,
    fp32) and of the reference's sum of levels in float64 and in fp32."""
    def run(zz, backend):
        zz = zz.clone().requires_grad_()
        if backend == "torch":
            loss = hierarchical_contrastive_loss(zz, labels, [None] * len(labels),
                                                 temperature=tau, variant="official",
                                                 backend="torch")
        else:
            loss = sum(ref(zz, lab, temperature=tau, variant="official") for lab in labels)
        (loss * 2).backward()
        return [loss.detach().double(), zz.grad.double()]

    return run(z, "torch"), run(z.double(), "reference"), run(z, "reference")


@pytest.mark.parametrize("seed", [0, 1, 2, 3])
def test_hierarchical_official_duplicate_hubs_two_levels(seed):
    """The user-visible side: hierarchical official loss, two levels that split each hub's 10
    copies into classes of 5 in ways that do not nest (level B's positives: the explicit pair
    pass), |s| = 3e4. Every positive is a copy of the row's arg-max; within the suite's rule
    (the tie-rule mutation of a mutation audit was 2x-24x it on these seeds)."""
    tau = 0.01
    z, hub, copy = _hub_copies(seed, 3e4, tau)
    a = hub * 2 + (copy < 5).long()
    b = hub * 2 + torch.isin(copy, torch.tensor([0, 1, 2, 5, 6])).long()
    got, exp, low = _hierarchical_and_reference(z, [a, b], tau)
    assert_within_reference_error(got, exp, low, 2.0 * 2 / 60 * z.abs().max().item() / tau)


def _near_duplicate_hubs(n: int, seed: int):
    """n rows of randn, 60 of them near-copies (1e-7 relative apart) of 6 hubs of norm ~2400:
    |s| up to ~7e8 at tau 0.01 (accepted: the guard refuses 1/16 of fp32's max)."""
    g = torch.Generator().manual_seed(seed)
    hubs = torch.randn(6, 64, generator=g, dtype=torch.float64) * 300
    z = torch.randn(n, 64, generator=g, dtype=torch.float64)
    idx = torch.randperm(n, generator=g)[:60]
    jitter = 1 + 1e-7 * torch.randn(60, 1, generator=g, dtype=torch.float64)
    z[idx] = hubs[torch.arange(60) % 6] * jitter
    return z.float(), idx, g


@pytest.mark.parametrize("sync_free", [False, True])
@pytest.mark.parametrize("seed", [0, 1, 2, 3])
def test_positive_pairs_clamped_at_the_row_max(seed, sync_free, monkeypatch):
    """positive_pairs recomputes s_ij of near-duplicate rows in another product than M_i; at
    |s| ~ 7e8 one ulp is 64, so s_ij - M_i can come out > 88 and exp overflow. Every x is
    clamped to <= 0 (s_ij <= M_i holds exactly): T_i <= n_i log(1 + eps), Q_i <= n_i / (1 +
    eps), everything finite. A mutation audit removed the clamp (T, Q, dz inf / NaN), no test
    failed; a second one removed it from CUDA's form (no host read), which this ran without."""
    import hiertail_fast.ops._host_reads as host_reads

    monkeypatch.setattr(host_reads, "FORCE_SYNC_FREE", sync_free)   # CUDA's form too
    n, tau = 120, 0.01
    z, idx, g = _near_duplicate_hubs(n, seed)
    gid = torch.randint(0, 4, (n,), generator=g)
    gid[idx] = 4 + torch.arange(60) % 6                # each hub's copies: one class
    row_max, arg_max = (z @ z.t() / tau).max(dim=1)
    big_t, big_q, dz = pairs_mod.positive_pairs(z, gid, 10, row_max, arg_max, 1 / tau, True,
                                                coef=torch.full((n,), 0.01))
    assert torch.isfinite(big_t).all() and torch.isfinite(big_q).all()
    assert torch.isfinite(dz).all()
    n_pos = torch.bincount(gid)[gid].double()
    atol = tol(torch.float32)["atol"]
    assert (big_t.double() <= n_pos * math.log(1 + EPS) + atol).all()
    assert (big_q.double() <= n_pos / (1 + EPS) + atol).all()


@pytest.mark.parametrize("size", [pairs_mod.SMALL_GROUP - 1, pairs_mod.SMALL_GROUP,
                                  pairs_mod.SMALL_GROUP + 1])
def test_positive_pairs_groups_at_the_small_group_size(size):
    """A group of SMALL_GROUP members or one either side: the pair lists take groups up to
    SMALL_GROUP, the GEMM blocks the bigger ones, so each group's positives are summed once.
    The suite had no group of exactly SMALL_GROUP (tests patch it to 8 or use small groups): a
    second mutation audit had such a group summed by neither path (T = 0; the attention
    engine's official loss -1.64 for 6.05) or by both (T doubled)."""
    g = torch.Generator().manual_seed(0)
    n, scale = size + 12, 10.0
    z = torch.nn.functional.normalize(torch.randn(n, 8, generator=g), dim=1)
    gid = (torch.arange(n) >= size).long()          # a group of `size`, and one of 12
    s = z @ z.t() * scale
    row_max, arg_max = s.max(dim=1)
    big_t, big_q, _ = pairs_mod.positive_pairs(z, gid, 2, row_max, arg_max, scale, True)
    same = gid[:, None] == gid[None, :]
    x = torch.exp(s.double() - row_max.double()[:, None])
    want_t = (torch.log(x + EPS) * same).sum(1)
    want_q = (x / (x + EPS) * same).sum(1)
    torch.testing.assert_close(big_t.double(), want_t, **tol(torch.float32))
    torch.testing.assert_close(big_q.double(), want_q, **tol(torch.float32))


@pytest.mark.parametrize("seed", [0, 1])
def test_hierarchical_official_near_duplicate_huge_logits(seed):
    """The user-visible side: the hierarchical official loss (two levels that do not nest) with
    near-duplicate hub rows at |s| ~ 7e8 is finite, with a finite gradient (without the clamp:
    loss -inf, gradient NaN), and as close to the float64 reference as the dense fp32 reference
    is: at this scale fp32 arithmetic's own error dominates both (ours 0.8-1.2x the fp32
    reference's here) and moves with the BLAS, so the bound is 4x its error, not the suite's 2x."""
    n, tau = 300, 0.01
    z, _, g = _near_duplicate_hubs(n, seed)
    labels = [torch.randint(0, 3, (n,), generator=g), torch.randint(0, 10, (n,), generator=g)]
    got, exp, low = _hierarchical_and_reference(z, labels, tau)
    for a, e, lo in zip(got, exp, low, strict=True):
        assert torch.isfinite(a).all()
        ref_err = (lo.double() - e).abs().max().item()
        assert (a.double() - e).abs().max().item() <= 4 * ref_err + 1e-4 * e.abs().max().item()


def _tau_grads(z, call, tau0, dtype, backend):
    """(loss, dL/dtau) of ``call(z, tau, backend)`` with tau a learnable 0-d tensor."""
    tau = torch.tensor(tau0, dtype=dtype, requires_grad=True)
    out = call(z.to(dtype), tau, backend)
    out.backward()
    return out.detach().double(), tau.grad.double()


def _assert_tau_like_reference(call, z, tau0):
    """fp32 loss and dL/dtau (the fast backend) within 2x the dense fp32 reference's error of
    the float64 reference + 1e-5 + 1e-4 |ref| (test_learnable_temperature's rule); float64 to
    the float64 tolerance."""
    exp = _tau_grads(z, call, tau0, torch.float64, "reference")
    low = _tau_grads(z, call, tau0, torch.float32, "reference")
    got = _tau_grads(z, call, tau0, torch.float32, "torch")
    for a, e, lo, what in zip(got, exp, low, ("value", "dtau"), strict=True):
        err = (a - e).abs().item()
        bound = 2 * (lo - e).abs().item() + 1e-5 + 1e-4 * e.abs().item()
        assert err <= bound, (what, err, bound)
    got64 = _tau_grads(z, call, tau0, torch.float64, "torch")
    for a, e in zip(got64, exp, strict=True):
        torch.testing.assert_close(a, e, **tol(torch.float64))


def test_official_learnable_temperature_many_labels():
    """dL/dtau of the official loss carries eps * #distinct labels in each row's denominator,
    as the loss does. With 601 labels (one class of 600 rows holding every row's max, 600
    singletons) that term is comparable to the key weights: a mutation audit's eps * 1 made
    dL/dtau 0.31 % off while the loss was right, and no test noticed. Against the float64
    reference's autograd dL/dtau."""
    g = torch.Generator().manual_seed(0)
    y = torch.cat([torch.zeros(600, dtype=torch.long), torch.arange(1, 601)])
    z = torch.randn(1200, 16, generator=g, dtype=torch.float64)
    z[:600] += 3.0
    call = lambda zz, tau, b: balanced_contrastive_loss(zz, y, temperature=tau,
                                                        variant="official", backend=b)
    _assert_tau_like_reference(call, z, 0.05)


@pytest.mark.parametrize("hierarchical", [False, True])
@pytest.mark.parametrize("variant", ["official", "exact"])
def test_temperature_gradient_over_many_row_blocks(monkeypatch, hierarchical, variant):
    """The dL/dtau pass (_temperature_grad.g_dot_s) runs over the rows in blocks of
    BLOCK_BYTES; here made 7 rows so 150 rows take 22 blocks (at the default, N = 3000 does).
    Every row must be summed once: a mutation audit's block slice one short dropped each
    block's last row (0.2 % at N = 3000), unnoticed. Against the float64 reference."""
    n = 150
    monkeypatch.setattr(tgrad_mod, "BLOCK_BYTES", 4 * n * 4 * 7)
    g = torch.Generator().manual_seed(0)
    y = torch.randint(0, 8, (n,), generator=g)
    z = torch.randn(n, 16, generator=g, dtype=torch.float64) / 4
    if hierarchical:
        call = lambda zz, tau, b: hierarchical_contrastive_loss(
            zz, [y, y // 3], [None, None], temperature=tau, variant=variant, backend=b)
    else:
        call = lambda zz, tau, b: balanced_contrastive_loss(zz, y, temperature=tau,
                                                            variant=variant, backend=b)
    _assert_tau_like_reference(call, z, 0.2)


def test_argmax_grad_in_row_blocks_is_the_whole_matrix_sum(monkeypatch):
    """The official loss's arg-max gradient sums in float64 a block of rows at a time (its
    whole-matrix float64 copies were +50 % on the loss's peak; a memory audit): the same bits
    as one block, every query-side term before the key sides, and the float64 formula."""
    from hiertail_fast.ops import _loss_terms

    gen = torch.Generator().manual_seed(3)
    z = torch.randn(50, 6, generator=gen)
    amax = torch.randint(0, 9, (2, 50), generator=gen)
    gamma = torch.randn(2, 50, generator=gen, dtype=torch.float64)
    whole = _loss_terms.argmax_grad(z, amax, gamma, 2.5, precise=True)
    monkeypatch.setattr(_loss_terms, "ARGMAX_GRAD_ROWS", 7)
    blocks = _loss_terms.argmax_grad(z, amax, gamma, 2.5, precise=True)
    assert torch.equal(blocks, whole)
    want = torch.zeros(50, 6, dtype=torch.float64)
    for lev in range(2):
        gm = (gamma[lev] * 2.5)[:, None]
        want += gm * z.double()[amax[lev]]
        want.index_add_(0, amax[lev], gm * z.double())
    torch.testing.assert_close(blocks, want.float(), rtol=0, atol=0)
    no_keys = _loss_terms.argmax_grad(z, amax, gamma, 2.5, key_side=False, precise=True)
    torch.testing.assert_close(no_keys, sum((gamma[lev] * 2.5)[:, None] * z.double()[amax[lev]]
                                            for lev in range(2)).float(), rtol=0, atol=0)


@pytest.mark.parametrize("backend", ["torch", "attention", "triton"])
def test_the_official_fast_engines_refuse_logits_past_their_range(backend):
    """The official variant's fast engines form its denominator LSE_i - M_i from two numbers
    of the logits' size (an audit: on these 4 rows the loss was 4.3e-6 relative off at max|s|
    1e12, 9.4 % at 1e16 and beyond, silently, where the reference is exact): past
    OFFICIAL_ENGINE_MAX_LOGIT (2^37) they refuse the call; within it their error stays under
    2^-17 absolute (the tests' float32 tolerance is 1e-5). Both losses, and under autocast
    (whose 16-bit rows the bound is computed from); the reference answers at any size."""
    from hiertail_fast._validation import OFFICIAL_ENGINE_MAX_LOGIT
    from tests.conftest import on_backend_device

    dev = on_backend_device(backend)
    unit = torch.tensor([[1., 0.], [0., 1.], [-1., 0.], [0., -1.]], device=dev)
    y = torch.tensor([0, 0, 1, 1], device=dev)
    exact64 = balanced_contrastive_loss(unit.double() * 1e5, y, temperature=1.0,
                                        variant="official", backend="reference")
    inside = balanced_contrastive_loss(unit * OFFICIAL_ENGINE_MAX_LOGIT ** 0.5, y,
                                       temperature=1.0, variant="official", backend=backend)
    assert abs(float(inside) - float(exact64)) <= 2.0 ** -17        # the bound's promise
    past = unit * (1.05 * OFFICIAL_ENGINE_MAX_LOGIT) ** 0.5       # just past the bound
    calls = [lambda: balanced_contrastive_loss(past, y, temperature=1.0, variant="official",
                                               backend=backend),
             lambda: hierarchical_contrastive_loss(past, [y, y * 0], [None, None],
                                                   temperature=1.0, variant="official",
                                                   backend=backend),
             # rows of norm 1, prototypes past the bound: the bound is taken over both (taken
             # over z alone, the call ran on, 5.9e-4 relative off at 4.8e14; a mutation pass,
             # session 73)
             lambda: balanced_contrastive_loss(unit, y, prototypes=past[:2], temperature=1.0,
                                               variant="official", backend=backend)]
    if dev == "cpu":
        def autocast_call():
            with torch.autocast("cpu", dtype=torch.bfloat16):
                return balanced_contrastive_loss(past, y, temperature=1.0, variant="official",
                                                 backend=backend)
        calls.append(autocast_call)
    for call in calls:
        with pytest.raises(ValueError, match="variant='official' on the fast engines") as err:
            call()
        assert err.value.non_finite        # (a training loop reports it as divergence)
    far = balanced_contrastive_loss(unit.double() * 1e9, y, temperature=1.0,
                                    variant="official", backend="reference")
    assert float(far) == pytest.approx(float(exact64), rel=1e-12)
    assert float(balanced_contrastive_loss(past, y, temperature=1.0, variant="exact",
                                           backend=backend)) > 0     # the exact variant: no limit


def test_the_official_range_refusal_names_every_way_to_the_reference():
    # the refusal past 2^37 names the bound and the three ways to the dense reference (8c14d16;
    # its test matched the first words only: a fix-test check, session 68)
    unit = torch.tensor([[1., 0.], [0., 1.], [-1., 0.], [0., -1.]])
    with pytest.raises(ValueError) as exc:
        balanced_contrastive_loss(unit * 1e6, torch.tensor([0, 0, 1, 1]), temperature=1.0,
                                  variant="official", backend="torch")
    for part in ("variant='official' on the fast engines", "2^37", "backend='reference'",
                 "HIERTAIL_BACKEND=reference", "HierTailConfig(loss_backend='reference')"):
        assert part in str(exc.value), part


def test_a_norm_past_float64_is_named_at_its_true_size():
    # a row norm that overflows float64 (1.4e300 squared) is recomputed row-scaled, so the
    # refusal says ~1e600, not ~1einf (0730a62's branch, which no test reached: a fix-test
    # check, session 68)
    z = torch.tensor([[1e300, 1e300], [1.0, 2.0]], dtype=torch.float64)
    with pytest.raises(ValueError, match="max ‖z_i‖² = ~1e600 "):
        balanced_contrastive_loss(z, torch.tensor([0, 1]), temperature=1.0)
