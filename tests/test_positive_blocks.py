"""The official variant's positive pairs read from the torch engine's blocks (_positive_blocks):
which levels it takes, and values / gradients against the float64 reference on every path it
has (2-D slices of big groups, pair lists of small ones, rows whose max is a level-specific key,
ties with duplicated rows at huge logits, include_self both ways, fused and recomputed).

Every test runs twice (``engine_path``): through the fused C kernel (``_positive_blocks.c``) and
through the torch path that replaces it where no C compiler is found."""
from __future__ import annotations

import pytest
import torch

import hiertail_fast.ops._contrastive_pairs as pairs_mod
import hiertail_fast.ops._host_reads as host_reads_mod
import hiertail_fast.ops._loss_passes as passes_mod
import hiertail_fast.ops._native as native_mod
import hiertail_fast.ops._positive_blocks as blocks_mod
import hiertail_fast.ops._positive_keys as keys_mod
import hiertail_fast.ops._positive_slices as slices_mod
from hiertail_fast import balanced_contrastive_loss, hierarchical_contrastive_loss
from hiertail_fast.ops._positive_blocks import BlockPositives
from hiertail_fast.ops._positive_keys import key_order
from hiertail_fast.reference import balanced_contrastive_loss_ref as ref
from tests.conftest import built_kernel

pytestmark = pytest.mark.usefixtures("one_thread")


@pytest.fixture(autouse=True, params=["native", "torch", "band"])
def engine_path(request, monkeypatch):
    """"native": the C kernel (must build in CI, which has a compiler); "torch": switched off
    (``HIERTAIL_NATIVE=0``), as on a CPU without one (the slice / segment / pair-list plan);
    "band": the kernel's torch twin over whole key bands, the path CUDA tensors take, with the
    engines' other CUDA forms (``_host_reads.FORCE_SYNC_FREE``: no data-dependent shortcut)."""
    monkeypatch.setattr(native_mod, "_LOADED", {})
    monkeypatch.setattr(host_reads_mod, "FORCE_SYNC_FREE", request.param == "band")
    monkeypatch.setenv(blocks_mod.POSITIVES_ENV, "band" if request.param == "band" else "slices")
    if request.param in ("torch", "band"):
        monkeypatch.setenv("HIERTAIL_NATIVE", "0")
    else:
        monkeypatch.delenv("HIERTAIL_NATIVE", raising=False)
        built_kernel(blocks_mod.native_kernel(torch.float64), "the native positives kernel")
    return request.param


def _spy_kernel(monkeypatch):
    """Records the per-row factor argument (None or a tensor) of every C kernel call (or of
    its torch twin ``_band``, which takes the same arguments)."""
    calls = []
    for name in ("_kernel", "_band"):
        real = getattr(BlockPositives, name)

        def spy(self, p, e, target, lo, hi, coef, fac, real=real):
            calls.append((p, fac))
            return real(self, p, e, target, lo, hi, coef, fac)

        monkeypatch.setattr(BlockPositives, name, spy)
    return calls


def _zipf_labels(n, classes, gen):
    probs = 1.0 / torch.arange(1, classes + 1, dtype=torch.float64)
    return torch.multinomial(probs, n, replacement=True, generator=gen)


def _count_pair_passes(monkeypatch):
    calls = []
    real = pairs_mod.positive_pairs

    def spy(*a, **k):
        calls.append(1)
        return real(*a, **k)

    monkeypatch.setattr(passes_mod, "positive_pairs", spy)
    return calls


def test_key_order_makes_nested_levels_contiguous():
    gen = torch.Generator().manual_seed(0)
    y = torch.randint(0, 12, (200,), generator=gen)
    gid = torch.stack([y // 3, y, y // 6])                  # in any level order
    order = key_order(gid)
    for lev in range(3):
        g = gid[lev, order]
        assert int((g[1:] != g[:-1]).sum()) + 1 == int(torch.unique(g).numel())


def test_handled_levels_nested_and_not():
    gen = torch.Generator().manual_seed(1)
    y = torch.randint(0, 8, (120,), generator=gen)
    z = torch.randn(120, 4, generator=gen)
    common = torch.ones(120, dtype=torch.bool)
    nested = BlockPositives(z, torch.stack([y, y // 2]), [8, 4], True, None, 1.0, common)
    assert nested.handled == [True, True]
    other = torch.randint(0, 3, (120,), generator=gen)      # fewer, bigger groups: costlier
    mixed = BlockPositives(z, torch.stack([y, other]), [8, 3], True, None, 1.0, common)
    assert mixed.handled == [False, True]
    swapped = BlockPositives(z, torch.stack([other, y]), [3, 8], True, None, 1.0, common)
    assert swapped.handled == [True, False]        # the costliest level wins, wherever it is


def _grads(fn, z, protos):
    zz = z.detach().clone().requires_grad_()
    pp = [p.detach().clone().requires_grad_() if p is not None else None for p in protos]
    loss = fn(zz, pp)
    (loss.sum() if loss.dim() else loss).backward()
    return loss.detach(), zz.grad, [p.grad for p in pp if p is not None]


def _assert_close64(got, want):
    for a, b in zip([got[0], got[1], *got[2]], [want[0], want[1], *want[2]], strict=True):
        torch.testing.assert_close(a, b, rtol=1e-9, atol=1e-11)


def _assert_two_levels_match_reference(z, y, second, protos, kw):
    """The torch engine's hierarchical loss over levels y and second: value and gradients (z,
    both prototypes) against the sum of the two levels' float64 references."""
    got = _grads(lambda zz, pp: hierarchical_contrastive_loss(zz, [y, second], pp,
                                                              backend="torch", **kw), z, protos)
    want = _grads(lambda zz, pp: ref(zz, y, prototypes=pp[0], **kw)
                  + ref(zz, second, prototypes=pp[1], **kw), z, protos)
    _assert_close64(got, want)


@pytest.mark.parametrize("include_self", [True, False])
@pytest.mark.parametrize("reduction", ["mean", "none"])
def test_single_level_slices_and_pairs_float64(monkeypatch, include_self, reduction):
    """Zipf labels: big classes (>= SLICE_GROUP keys: 2-D slices) and small ones (pair lists);
    several row blocks. Neither the forward nor, for reduction "none", the backward's fused
    pass calls the separate pair pass: the positives come from the blocks."""
    monkeypatch.setenv("HIERTAIL_CPU_BLOCK_BYTES", str(8 * 700 * 64))
    calls = _count_pair_passes(monkeypatch)
    gen = torch.Generator().manual_seed(2)
    y = _zipf_labels(700, 25, gen)
    z = torch.randn(700, 16, generator=gen, dtype=torch.float64)
    p = torch.randn(25, 16, generator=gen, dtype=torch.float64) * 2
    kw = dict(temperature=0.2, variant="official", include_self=include_self,
              reduction=reduction)
    got = _grads(lambda zz, pp: balanced_contrastive_loss(zz, y, prototypes=pp[0],
                                                          backend="torch", **kw), z, [p])
    want = _grads(lambda zz, pp: ref(zz, y, prototypes=pp[0], **kw), z, [p])
    _assert_close64(got, want)
    assert len(calls) == 0
    assert int(torch.bincount(y).max()) >= slices_mod.SLICE_GROUP


@pytest.mark.parametrize("rest_path", ["one_each", "mask"])
@pytest.mark.parametrize("include_self", [True, False])
@pytest.mark.parametrize("nested", [True, False])
def test_hierarchical_rest_keys_and_prototype_maxima_float64(monkeypatch, include_self, nested,
                                                             rest_path):
    """Level-specific prototypes with large norms hold many rows' maxima (f < 1: the explicit
    pair path), nested levels go through the blocks, non-nested ones through the pair pass.
    Rest keys: the one-prototype-per-label lookup, and the general mask path it replaces."""
    if rest_path == "mask":
        monkeypatch.setattr(BlockPositives, "_rest_columns", lambda self, ridx: None)
    monkeypatch.setenv("HIERTAIL_CPU_BLOCK_BYTES", str(8 * 400 * 32))
    calls = _count_pair_passes(monkeypatch)
    gen = torch.Generator().manual_seed(3)
    y = _zipf_labels(400, 12, gen)
    second = y // 3 if nested else torch.randint(0, 4, (400,), generator=gen)
    z = torch.randn(400, 8, generator=gen, dtype=torch.float64)
    protos = [torch.randn(12, 8, generator=gen, dtype=torch.float64) * 3,
              torch.randn(4, 8, generator=gen, dtype=torch.float64) * 3]
    kw = dict(temperature=0.5, variant="official", include_self=include_self)
    _assert_two_levels_match_reference(z, y, second, protos, kw)
    assert len(calls) == (0 if nested else 1)


def test_a_prototype_whose_row_max_is_a_common_key_of_a_big_group(engine_path, monkeypatch):
    """A level's prototype row is not one of the common keys (its column -1): in a big group
    (>= 64 common keys) whose common key holds the prototype's row max (short prototypes), the
    slice plan must not read that -1 as a column from the end of the slice (without its guard
    the slice's last key left the prototype's sums: the hierarchical loss 1.8e-5 off, its
    gradient 2.6e-5, float64, on the torch plan; a mutation pass, session 73)."""
    monkeypatch.setenv("HIERTAIL_SYMMETRIC", "0")
    gen = torch.Generator().manual_seed(0)
    n, d = 200, 8

    def unit_rows(k):
        return torch.nn.functional.normalize(torch.randn(k, d, generator=gen,
                                                         dtype=torch.float64), dim=1)

    z = unit_rows(n)
    y = torch.zeros(n, dtype=torch.long)
    y[150:] = 1 + torch.arange(50) % 5                                # class 0: 150 rows
    short = 0.5 * unit_rows(6)                                        # short: node keys win
    second = torch.randint(0, 3, (n,), generator=gen)                 # not nested in y
    protos = [short, 0.5 * unit_rows(3)]
    kw = dict(temperature=0.5, variant="official", include_self=False)
    _assert_two_levels_match_reference(z, y, second, protos, kw)


def test_key_order_is_stable_and_ranks_levels_by_exact_cost():
    """key_order: a stable lexicographic order (equal group ids keep index order); the levels
    are ranked by their positive pairs Σ n_c² counted exactly (float32 rounds 25,000,001 to
    25,000,000)."""
    assert key_order(torch.tensor([[1, 0, 1, 0, 0]])).tolist() == [1, 3, 4, 0, 2]
    more = torch.tensor([0] * 5000 + [1])          # 5000² + 1
    less = torch.tensor([0] * 5000 + [-1])         # 5000² (the last row outside the level)
    assert keys_mod._significance(torch.stack([more, less])) == [1, 0]


def test_rest_columns_take_the_one_each_lookup_only_for_at_most_one_key_per_group():
    """The one-each lookup (``_rest_columns``) is a [level, group] -> key column table; a group
    holding two rest keys must send the block to the general mask path (None), where the
    table would keep one of them and lose the other's positive pair. Through the public API
    each level has one prototype per label, so only a direct call reaches the second case."""
    def positives(gid):
        bp = object.__new__(BlockPositives)
        bp._rest_map, bp.handled = None, [True, True]
        bp.count = [torch.ones(3, dtype=torch.long), torch.ones(2, dtype=torch.long)]
        bp.gid = torch.tensor(gid)
        return bp

    # keys 0-3 common; 4-6 rest keys: level 0 groups 0, 1, 2; level 1 groups 1, -, 0
    one_each = positives([[0, 1, 2, 0, 0, 1, 2], [0, 1, 1, 0, 1, -1, 0]])
    cols, levels = one_each._rest_columns(torch.tensor([4, 5, 6]))
    assert cols.tolist() == [[0, 1, 2], [2, 0, -1]] and levels.tolist() == [0, 1]
    # level 1's group 0 holds two rest keys (4 and 6): no lookup table
    two = positives([[0, 1, 2, 0, 0, 1, 2], [0, 1, 1, 0, 0, -1, 0]])
    assert two._rest_columns(torch.tensor([4, 5, 6])) is None


@pytest.mark.parametrize("norm", [3.0, 30.0])
def test_fused_duplicate_rows_at_huge_logits(norm):
    """Duplicated rows (nodes, and prototypes equal to nodes: ties across two products) with
    |s| to ~9,000, fused path (mean reduction): error within 1e-5 relative of the fp32
    reference's. (Known: several levels put the level-specific keys in a second product, so a
    prototype that duplicates a node bitwise does not tie it bitwise; the error grows with
    ulp(|s|): 1.4e-5 relative at |s| ~ 1e5, norm 100.)"""
    gen = torch.Generator().manual_seed(5)
    z = torch.randn(60, 16, generator=gen)
    z = z / z.norm(dim=1, keepdim=True) * norm
    z[30:] = z[:30]
    y = torch.randint(0, 3, (60,), generator=gen)
    protos = [z[[0, 7, 9]].clone(), z[[1, 2]].clone()]
    labels = [y, y // 2]
    kw = dict(temperature=0.1, variant="official")
    zz = z.clone().requires_grad_()
    got = hierarchical_contrastive_loss(zz, labels, protos, backend="torch", **kw)
    got.backward()
    assert torch.isfinite(zz.grad).all()

    def total(t, ps):
        return sum(ref(t, lab, prototypes=q, **kw) for lab, q in zip(labels, ps, strict=True))

    exp = total(z.double(), [q.double() for q in protos])
    low = total(z, protos).double()
    err, ref_err = abs(got.double() - exp).item(), abs(low - exp).item()
    assert err <= 2 * ref_err + 1e-5 * max(1.0, abs(exp.item()))


def test_foldable_only_for_one_level_with_per_group_weights():
    """One level whose key weights are constant per group: the engine keeps w folded into its
    GEMM operands (no [b, N] gradient matrix); two levels, or weights that vary inside a group,
    use the unfolded block."""
    gen = torch.Generator().manual_seed(6)
    y = torch.randint(0, 5, (90,), generator=gen)
    z = torch.randn(90, 4, generator=gen)
    common = torch.ones(90, dtype=torch.bool)
    log_w = -torch.log(torch.bincount(y)[y].double())[None]
    one = BlockPositives(z, y[None], [5], True, None, 1.0, common, log_w)
    assert one.foldable
    varying = log_w.clone()
    varying[0, int((y == y[0]).nonzero()[1])] -= 1.0     # a second member of y[0]'s group
    assert not BlockPositives(z, y[None], [5], True, None, 1.0, common, varying).foldable
    two = BlockPositives(z, torch.stack([y, y // 2]), [5, 3], True, None, 1.0, common,
                         torch.cat([log_w, log_w]))
    assert not two.foldable
    assert not BlockPositives(z, y[None], [5], True, None, 1.0, common).foldable   # no log_w


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
@pytest.mark.parametrize("include_self", [True, False])
def test_single_level_folded_equals_unfolded(monkeypatch, dtype, include_self):
    """The folded official gradient (positives' coefficients divided by a_i w_i, added into
    the exp block in place) against the unfolded block (w in a separate gradient matrix) and
    the float64 reference: wide logits (randn, tau 0.2: most keys exactly 0 after the
    cut-off), Zipf labels (slices and pair lists), prototypes, several row blocks: the
    row-block engine (520 float32 rows would take the symmetric engine, which has no fold)."""
    monkeypatch.setenv("HIERTAIL_CPU_BLOCK_BYTES", str(4 * 96 * 540))
    monkeypatch.setenv("HIERTAIL_SYMMETRIC", "0")
    gen = torch.Generator().manual_seed(7)
    y = _zipf_labels(500, 20, gen)
    z = torch.randn(500, 16, generator=gen, dtype=torch.float64)
    p = torch.randn(20, 16, generator=gen, dtype=torch.float64)
    kw = dict(temperature=0.2, variant="official", include_self=include_self)

    def run():
        return _grads(lambda zz, pp: balanced_contrastive_loss(
            zz, y, prototypes=pp[0], backend="torch", **kw), z.to(dtype), [p.to(dtype)])

    folded = run()
    asked = []

    def never_constant(values, *a):                 # the weights never foldable
        asked.append(1)
        return torch.zeros((), dtype=torch.bool, device=values.device)

    monkeypatch.setattr(keys_mod, "constant_per_group", never_constant)
    unfolded = run()
    assert asked                                    # the switch reached the engine
    want = _grads(lambda zz, pp: ref(zz, y, prototypes=pp[0], **kw), z, [p])
    if dtype == torch.float64:
        _assert_close64(folded, unfolded)
        _assert_close64(folded, want)
    else:
        for a, b, c in zip([folded[0], folded[1], *folded[2]],
                           [unfolded[0], unfolded[1], *unfolded[2]],
                           [want[0], want[1], *want[2]], strict=True):
            scale = float(c.abs().max())
            assert float((a.double() - c).abs().max()) <= 1e-5 * scale
            assert float((a - b).abs().max()) <= 1e-5 * scale


def _spy_runs(monkeypatch):
    calls = []
    real = BlockPositives._run

    def spy(self, *a, **k):
        calls.append(self.chain)
        return real(self, *a, **k)

    monkeypatch.setattr(BlockPositives, "_run", spy)
    return calls


@pytest.mark.parametrize("include_self", [True, False])
@pytest.mark.parametrize("proto_norm", [0.0, 3.0])
def test_three_nested_levels_share_the_top_slices_float64(monkeypatch, engine_path,
                                                          include_self, proto_norm):
    """Levels y, y // 2, y // 4 (given in another order): the top level (y // 4, the most
    positive pairs) is read once per element for all three (``_run``); prototypes of large
    norm hold many rows' maxima (f < 1 at some levels: those (level, row) pairs go to the
    pair lists). Values and gradients (z and prototypes) against the float64 reference
    (fused pass), and the value of the forward-only pass (no_grad: no gradient target)."""
    monkeypatch.setenv("HIERTAIL_CPU_BLOCK_BYTES", str(8 * 700 * 48))
    runs = _spy_runs(monkeypatch)
    kernels = _spy_kernel(monkeypatch)
    gen = torch.Generator().manual_seed(7)
    y = _zipf_labels(700, 24, gen)
    labels = [y // 2, y, y // 4]
    z = torch.randn(700, 12, generator=gen, dtype=torch.float64)
    protos = [None if proto_norm == 0 else
              torch.randn(int(lab.max()) + 1, 12, generator=gen, dtype=torch.float64)
              * proto_norm for lab in labels]
    kw = dict(temperature=0.3, variant="official", include_self=include_self)

    def ours(zz, pp):
        return hierarchical_contrastive_loss(zz, labels, pp, backend="torch", **kw)

    want = _grads(lambda zz, pp: sum(ref(zz, lab, prototypes=q, **kw)
                                     for lab, q in zip(labels, pp, strict=True)), z, protos)
    _assert_close64(_grads(ours, z, protos), want)
    with torch.no_grad():
        torch.testing.assert_close(ours(z, protos), want[0], rtol=1e-9, atol=1e-11)
    if engine_path == "torch":
        assert runs and all(sorted(chain) == [0, 1, 2] and chain[0] == 2 for chain in runs)
    else:       # ONE kernel (band) call per block and pass: the entries of all levels
        assert not runs and kernels
        blocks = [(p.start, p.stop) for p, _ in kernels]
        assert len(set(blocks)) < len(blocks) == 2 * len(set(blocks))   # fused + no_grad
        facs = [fac for _, fac in kernels if fac is not None]
        if proto_norm:          # rows whose max is a prototype: x = e f, f < 1 at that level
            assert facs and all(f.shape[0] == 3 for f in facs)
            # some row has f < 1 at one level and f = 1 at another: two factor groups
            assert any(bool(((f < 1).any(0) & (f == 1).any(0)).any()) for f in facs)
        else:
            assert not facs


def test_chain_takes_only_the_levels_nested_in_the_top_one(engine_path):
    """B's groups are contiguous in A's order (so B is handled) but one of them straddles two
    groups of A: B is not in the chain and its big groups go through ``_slice``. A level
    nested in A is. Values and gradients against the float64 reference."""
    n = 600
    a = (torch.arange(n) >= 300).long()                       # 2 groups of 300: most pairs
    b = torch.arange(n) // 200                                # group 1 = rows 200..399
    c = torch.arange(n) // 150                                # inside A's groups
    gen = torch.Generator().manual_seed(8)
    perm = torch.randperm(n, generator=gen)
    gid = torch.stack([a, b, c])[:, perm]
    z = torch.randn(n, 6, generator=gen, dtype=torch.float64)
    blocks = BlockPositives(z, gid, [2, 3, 4], True, None, 1.0,
                            torch.ones(n, dtype=torch.bool))
    assert blocks.handled == [True, True, True]
    assert blocks.chain == ([0, 2] if engine_path == "torch" else [])    # the kernel: no plan
    labels = list(gid)
    kw = dict(temperature=0.5, variant="official")
    got = _grads(lambda zz, pp: hierarchical_contrastive_loss(zz, labels, [None] * 3,
                                                              backend="torch", **kw), z, [])
    want = _grads(lambda zz, pp: sum(ref(zz, lab, **kw) for lab in labels), z, [])
    _assert_close64(got, want)


def test_positives_path_switch(monkeypatch):
    """$HIERTAIL_POSITIVES: by default the band on CUDA, the slice plan elsewhere; "band" /
    "slices" force one; anything else is a clear error."""
    cuda, cpu = torch.device("cuda"), torch.device("cpu")
    monkeypatch.delenv(blocks_mod.POSITIVES_ENV, raising=False)
    assert blocks_mod.band_path(cuda) and not blocks_mod.band_path(cpu)
    monkeypatch.setenv(blocks_mod.POSITIVES_ENV, "Band")
    assert blocks_mod.band_path(cuda) and blocks_mod.band_path(cpu)
    monkeypatch.setenv(blocks_mod.POSITIVES_ENV, "slices")
    assert not blocks_mod.band_path(cuda) and not blocks_mod.band_path(cpu)
    monkeypatch.setenv(blocks_mod.POSITIVES_ENV, "fast")
    with pytest.raises(ValueError, match="HIERTAIL_POSITIVES='fast'"):
        blocks_mod.band_path(cpu)


@pytest.mark.parametrize("n, b", [(97, 10), (100, 25), (60, 60), (61, 7)])
def test_band_extents_match_each_blocks_own_ranges(monkeypatch, n, b):
    """_extent: the band [c0, c1) and the levels with a range of each block [k b, (k+1) b),
    computed for all blocks in one pass (and the last, shorter block), equal a direct
    computation on the block's own rows; f = 1 is known statically when every visible key is
    a common key, not when a level has its own keys."""
    monkeypatch.setenv("HIERTAIL_POSITIVES", "band")
    monkeypatch.setattr(blocks_mod, "native_kernel", lambda dtype: None)
    gen = torch.Generator().manual_seed(n + b)
    z = torch.randn(n, 4, generator=gen)
    gid = torch.stack([torch.randint(0, 5, (n,), generator=gen),
                       torch.randint(0, 3, (n,), generator=gen)])
    gid[1, torch.rand(n, generator=gen) < 0.3] = -1        # level 1: some rows not in it
    log_w = torch.where(gid >= 0, torch.zeros(()), torch.tensor(float("-inf")))
    common = torch.isfinite(log_w).all(dim=0)
    bp = BlockPositives(z, gid, [5, 3], True, None, 1.0, common, log_w)
    assert bp.band and not bp._f_always_one                  # level 0 sees non-common keys
    for r0 in range(0, n, b):
        p = slice(r0, min(n, r0 + b))
        lo, hi = bp.lo_s[:, p], bp.hi_s[:, p]
        has = hi > lo
        want_levels = [lev for lev in range(2) if bool(has[lev].any())]
        c0, c1, levels = bp._extent(p)
        assert levels == want_levels
        if want_levels:
            assert (c0, c1) == (int(lo[has].min()), int(hi[has].max()))
    one = BlockPositives(z, gid[:1], [5], True, None, 1.0, torch.ones(n, dtype=torch.bool),
                         torch.zeros(1, n))
    assert one._f_always_one


def test_positive_pairs_blocks_follow_the_cpu_block_budget(monkeypatch):
    """The big-group blocks of the official positive pass were a fixed 4M elements on CPU
    (~80 MB of temporaries at a 4 MB $HIERTAIL_CPU_BLOCK_BYTES; a memory audit): they follow the
    budget now (about three [b, n_g] temporaries), with the same sums."""
    gen = torch.Generator().manual_seed(5)
    n, d = 700, 6
    z = torch.randn(n, d, generator=gen, dtype=torch.float64)
    gid = torch.cat([torch.zeros(400, dtype=torch.long), torch.randint(1, 9, (n - 400,),
                                                                        generator=gen)])
    s = z @ z.t() * 2.0
    row_max, arg_max = s.max(dim=1)
    coef = torch.rand(n, generator=gen, dtype=torch.float64)
    args = (z, gid, 9, row_max, arg_max, 2.0, True, coef)
    want = pairs_mod.positive_pairs(*args)
    shapes = []
    real_mm = torch.mm
    monkeypatch.setattr(torch, "mm", lambda a, b: shapes.append(a.shape[0] * b.shape[1])
                        or real_mm(a, b))
    budget = 3 * 8 * 400 * 25                     # 25 rows of the 400-member group a block
    monkeypatch.setenv("HIERTAIL_CPU_BLOCK_BYTES", str(budget))
    got = pairs_mod.positive_pairs(*args)
    assert shapes and max(shapes) * 3 * z.element_size() <= budget and len(shapes) == 16
    for a, b in zip(got, want, strict=True):
        torch.testing.assert_close(a, b, rtol=1e-12, atol=1e-12)


def test_constant_per_group_as_a_device_flag():
    """``_positive_keys.constant_per_group``: the host-read-free twin of ``_constant_per_group``
    (rows outside every group ignored, any number of groups, none)."""
    from hiertail_fast.ops import _positive_keys as keys

    g = torch.tensor([0, 1, 0, -1, 2, 1, -1])
    same = torch.tensor([5.0, 7.0, 5.0, 1.0, 3.0, 7.0, 9.0])
    for values, want in ((same, True), (same.clone().index_fill_(0, torch.tensor([5]), 8.0),
                                        False)):
        assert keys._constant_per_group(values, g) is want
        assert keys.constant_per_group(values, g, 3).item() is want
        assert keys.constant_per_group(values, g, 5).item() is want      # spare groups
    none = torch.full((4,), -1)
    assert keys.constant_per_group(torch.arange(4.0), none, 2).item() is True
    assert keys.constant_per_group(torch.arange(4.0), none, 0).item() is True
    # the level costs in one read: sum_c n_c^2, rows outside a level weighing 0
    gid = torch.stack([g, torch.tensor([0, 0, 0, 0, 0, 0, -1]), none.new_full((7,), -1)])
    assert keys._significance(gid) == [2, 0, 1]                       # costs 9, 36, 0
    assert keys._significance(gid, [3, 1, 0]) == keys._significance(gid, [5, 2, 4]) == [2, 0, 1]
    assert keys.key_order(gid, [3, 1, 0]).tolist() == keys.key_order(gid).tolist()


@pytest.mark.parametrize("size", [1, 3, 50])
def test_slot_counts_are_bincounts_without_reading_the_device(size, monkeypatch):
    """``_host_reads.slot_counts``: torch.bincount's counts in a known size, without the
    bincount (on CUDA it reads its input's min and max on the host, and with weights has no
    deterministic implementation): empty, one slot, every slot, slots never hit."""
    from hiertail_fast.ops._host_reads import slot_counts

    monkeypatch.setattr(torch, "bincount", None)          # the op must not be called
    g = torch.Generator().manual_seed(size)
    for n in (0, 1, 7, 200):
        slot = torch.randint(0, size, (n,), generator=g)
        want = torch.tensor([int((slot == v).sum()) for v in range(size)])
        got = slot_counts(slot, size)
        assert got.dtype == torch.long and torch.equal(got, want)
