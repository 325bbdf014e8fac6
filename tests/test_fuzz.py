"""Property-based fuzzing (hypothesis): every public op x every backend against the float64
reference, values and gradients, on small random inputs that include the hard cases —
self-loops, duplicate edges, isolated nodes, negative and zero weights, duplicate rows and
exact ties, singleton classes, |logits| up to 1e4, τ in [0.01, 10], float16/bfloat16/float64.

Each example is drawn as a handful of small parameters (a seed, sizes, flags) from which the
tensors are built, so a failure shrinks to a readable case; the budget is fixed and the run
deterministic (``tests/_fuzz_support.fuzz_settings``). Tolerances: ``assert_close64`` there.
Long random campaigns: the environment variables described in ``tests/_fuzz_support.py``
(such a campaign, 400-3,000 random examples a test, found the holes fixed on 2026-11-28 in the
comparison rule and in 16-bit top-k pooling).
"""
from __future__ import annotations

import contextlib
import math

import pytest
import torch
from hypothesis import assume, given, note
from hypothesis import strategies as st

import hiertail_fast.ops._lse_symmetric as sym
from hiertail_fast import (
    CSRGraph,
    balanced_contrastive_loss,
    gcn_propagate,
    hierarchical_contrastive_loss,
    nearest_prototype,
    topk_pool,
    topk_unpool,
)
from hiertail_fast.reference.topk_pool import pool_size
from tests._fuzz_support import (
    BACKENDS,
    GCN_BACKENDS,
    LOSS_BACKENDS,
    LOW,
    assert_close64,
    dtypes,
    fuzz_rows,
    fuzz_settings,
    on_backend_device,
    seeds,
    unit_roundoff,
)
from tests.conftest import backend_device

pytestmark = pytest.mark.usefixtures("one_thread")


def _gen(seed: int) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


# ------------------------------------------------------------------------- gcn_propagate
def _graph(kind, ei, w, n):
    if kind == "edge_index":
        return ei, w
    sym = kind == "symmetric"
    return CSRGraph.from_edge_index(ei, w, n, dedupe=kind != "csr", symmetrize=sym), None


def _check_gcn(c, backend):
    g = _gen(c["seed"])
    n, dt = c["n"], c["dtype"]
    active = max(1, n - c["isolated"])  # the last nodes get no edges: isolated
    ei = torch.randint(0, active, (2, c["e"]), generator=g)
    if c["loops"]:
        nodes = torch.arange(0, active, 2)
        ei = torch.cat([ei, torch.stack([nodes, nodes])], 1)
    if c["dups"] and ei.shape[1]:
        ei = torch.cat([ei, ei[:, :3]], 1)
    wdt = torch.float64 if dt == torch.float64 else torch.float32
    w = {"none": None, "zero": torch.zeros(ei.shape[1], dtype=wdt),
         "positive": torch.rand(ei.shape[1], generator=g, dtype=wdt) + 0.1,
         "signed": torch.randn(ei.shape[1], generator=g, dtype=wdt)}[c["weights"]]
    if c["weights"] == "zero" and ei.shape[1]:
        w[::2] = 1.5
    x = torch.randn(n, c["d"], generator=g).to(dt).requires_grad_()
    kw = dict(improved=c["improved"], add_self_loops=c["add_self_loops"])
    x64 = x.detach().double().requires_grad_()
    w64 = None if w is None else w.double().requires_grad_()
    if w is not None:
        w.requires_grad_()
    try:
        graph64, ew64 = _graph(c["graph"], ei, w64, n)
        ref = gcn_propagate(x64, graph64, ew64, backend="reference", **kw)
    except ValueError as exc:  # negative degree: every backend must say the same
        assert "has GCN degree" in str(exc)
        with pytest.raises(ValueError, match=r"node \d+ has GCN degree"):
            graph, ew = _graph(c["graph"], ei, w, n)
            gcn_propagate(x, graph, ew, backend=backend, **kw)
        return
    graph, ew = _graph(c["graph"], ei, w, n)
    out = gcn_propagate(x, graph, ew, backend=backend, **kw)
    lowp = xl = wl = None
    if dt in LOW:   # the reference in the low dtype, with its gradients: part of the bound
        xl = x.detach().clone().requires_grad_()
        wl = None if w is None else w.detach().clone().requires_grad_()
        lowp = gcn_propagate(xl, *_graph(c["graph"], ei, wl, n), backend="reference", **kw)
    # signed weights: the degree Σw + loop may nearly cancel; first-order bound on the
    # relative error of dinv^2 ~ u·Σ|w|/|deg| per node, times the output size
    extra = 0.0
    if c["weights"] == "signed" and ei.shape[1]:
        absdeg = torch.zeros(n, dtype=torch.float64).index_add(0, ei[1], w64.detach().abs())
        deg = torch.zeros(n, dtype=torch.float64).index_add(0, ei[1], w64.detach())
        cond = float(((absdeg + 2) / deg.abs().clamp_min(1e-300)).max())
        extra = 8 * cond * unit_roundoff(dt) * float(ref.detach().abs().max())
    assert_close64(out, ref, dt, ref_lowp=lowp, extra=extra, what="gcn value")
    with torch.no_grad():  # the cached-operator path
        out_ng = gcn_propagate(x, graph, ew, backend=backend, **kw)
    assert_close64(out_ng, ref, dt, ref_lowp=lowp, extra=extra, what="gcn no_grad value")
    gout = torch.randn(out.shape, generator=g).to(dt)
    out.backward(gout)
    ref.backward(gout.double())
    if lowp is not None:
        lowp.backward(gout)
    assert_close64(x.grad, x64.grad, dt, extra=extra, what="gcn grad x",
                   ref_lowp=None if xl is None else xl.grad)
    if w is not None:
        gscale = 1 + (float(w64.grad.abs().max()) if w64.grad.numel() else 0.0)
        # float32 weights of 16-bit rows: dL/dw = Σ g_i x_j (dinv terms) is float32 sums of the
        # 16-bit values' exact products, never rounded to 16 bits, so float32's tolerance
        wdt = torch.float32 if dt in LOW else dt
        assert_close64(w.grad, w64.grad, wdt, extra=extra * gscale, scale=gscale,
                       what="gcn grad w")


@st.composite
def gcn_cases(draw):
    rows = fuzz_rows(7)
    return dict(seed=draw(seeds), n=draw(st.integers(1, rows)),
                e=draw(st.integers(0, 2 * rows)),
                d=draw(st.integers(1, 5)), isolated=draw(st.integers(0, 2)),
                loops=draw(st.booleans()), dups=draw(st.booleans()),
                weights=draw(st.sampled_from(["none", "positive", "signed", "zero"])),
                dtype=draw(dtypes), improved=draw(st.booleans()),
                add_self_loops=draw(st.booleans()),
                graph=draw(st.sampled_from(["csr", "dedupe", "symmetric", "edge_index"])))


@pytest.mark.parametrize("backend", GCN_BACKENDS)
def test_fuzz_gcn_propagate(backend):
    on_backend_device(backend)
    @fuzz_settings(backend)
    @given(c=gcn_cases())
    def run(c):
        _check_gcn(c, backend)
    run()


# ------------------------------------------------------------------------- top-k pooling
def _pool_expected(x, p, perm):
    """X[perm]·tanh(X[perm]·p̂)[:, None] and the scores, in x's dtype (autograd)."""
    phat = p / torch.linalg.vector_norm(p)
    s = torch.tanh((x[perm] * phat).sum(1))
    return x[perm] * s[:, None], s


def _check_topk(c, backend):
    g = _gen(c["seed"])
    n, d, dt = c["n"], c["d"], c["dtype"]
    if c["ties"]:  # small integers: exact ties between different rows too
        rows = torch.randint(-2, 3, (c["distinct"], d), generator=g).double()
    else:
        rows = torch.randn(c["distinct"], d, generator=g, dtype=torch.float64) * 2
    x = rows[torch.randint(0, c["distinct"], (n,), generator=g)].to(dt)  # duplicate rows
    if c["colmajor"]:  # a transposed view: the tie rule must not depend on the layout
        x = x.t().contiguous().t()
    scale = 1.0 if dt in LOW else c["p_scale"]
    p = (torch.randn(d, generator=g, dtype=torch.float64) * scale).to(dt)
    assume(bool((p != 0).any()))
    ei = torch.randint(0, n, (2, c["e"]), generator=g)
    ew = torch.rand(c["e"], generator=g).to(dt) if c["weighted"] else None
    ratio = c["ratio"] if c["ratio"] != "count" else max(1, n // 2)
    x, p = x.requires_grad_(), p.requires_grad_()
    r = topk_pool(x, ei, p, ratio, ew, backend=backend)
    k = pool_size(n, ratio, dt)
    perm = r.perm
    assert perm.numel() == k and torch.unique(perm).numel() == k
    x64, p64 = x.detach().double().requires_grad_(), p.detach().double().requires_grad_()
    xe, se = _pool_expected(x64, p64, perm)
    # the same formula in the low dtype (plain autograd): its own error sets part of the bound
    xl, pl = x.detach().clone().requires_grad_(), p.detach().clone().requires_grad_()
    lowp = _pool_expected(xl, pl, perm) if dt in LOW else (None, None)
    assert_close64(r.score, se, dt, ref_lowp=lowp[1], what="topk score")
    assert_close64(r.x, xe, dt, ref_lowp=lowp[0], what="topk x")
    # the kept scores are the largest ones, in descending order ...
    full = topk_pool(x.detach(), ei, p.detach(), 1.0, ew, backend=backend)  # every score
    own = torch.empty(n, dtype=dt)
    own[full.perm] = full.score
    assert torch.equal(own[perm], r.score.detach())
    kept = torch.zeros(n, dtype=torch.bool)
    kept[perm] = True
    assert bool((r.score[1:] <= r.score[:-1]).all())
    if k < n:
        assert float(own[~kept].max()) <= float(own[kept].min())
    # ... and identical rows (bit-identical scores) are kept lowest index first, in order
    _, group = torch.unique(x.detach(), dim=0, return_inverse=True)
    pos = torch.full((n,), -1, dtype=torch.long)
    pos[perm] = torch.arange(k)
    for gid in group.unique():
        members = torch.nonzero(group == gid).view(-1)
        assert torch.unique(own[members]).numel() == 1, "identical rows, different scores"
        sel = pos[members]
        n_sel = int((sel >= 0).sum())
        assert bool((sel[:n_sel] >= 0).all()), "a higher index was kept before a lower one"
        assert bool((sel[:n_sel].diff() > 0).all()), "tied rows out of index order"
    if backend != "reference" and dt not in LOW:  # no near-ties: the reference's perm exactly
        ref = topk_pool(x.detach(), ei, p.detach(), ratio, ew, backend="reference")
        s64 = _pool_expected(x64.detach(), p64.detach(), torch.arange(n))[1]
        gaps = s64.unique().diff()
        if not gaps.numel() or float(gaps.min()) > 1e-4:
            assert perm.tolist() == ref.perm.tolist()
    # pooled graph = induced subgraph on perm (dense comparison, duplicates summed)
    new = torch.full((n,), -1, dtype=torch.long)
    new[perm] = torch.arange(k)
    keep = (new[ei[0]] >= 0) & (new[ei[1]] >= 0)
    dense = torch.zeros(k, k, dtype=torch.float64)
    vals = torch.ones(int(keep.sum()), dtype=torch.float64) if ew is None else ew[keep].double()
    dense.index_put_((new[ei[1]][keep], new[ei[0]][keep]), vals, accumulate=True)
    got = torch.zeros(k, k, dtype=torch.float64)
    gw = r.graph.weight_or_ones(torch.float64).detach()
    got.index_put_((r.graph.row_index(), r.graph.indices), gw, accumulate=True)
    assert torch.equal(got, dense)
    # gradients through the pooled features and the returned scores
    gx = torch.randn(r.x.shape, generator=g).to(dt)
    gs = torch.randn(k, generator=g).to(dt)
    ((r.x * gx).sum() + (r.score * gs).sum()).backward()
    ((xe * gx.double()).sum() + (se * gs.double()).sum()).backward()
    if dt in LOW:
        ((lowp[0] * gx).sum() + (lowp[1] * gs).sum()).backward()
    psc = 1 + float(p64.grad.abs().max())
    # d/dp = (v - p̂(p̂·v)) / ‖p‖ with v = Σ_i a_i (1 - s_i²) x_i, a_i = d/ds_i: where v is
    # (nearly) parallel to p (always at d = 1) the two terms cancel, and both the backend and
    # the float64 reference keep a rounding residue of ~u·T, T = Σ_i |a_i| ‖x_i‖ / ‖p‖ (found
    # by random fuzzing: d = 1, ‖p‖ = 1e-23, reference 8.4e6, exact answer and ours 0)
    kept = x64.detach()[perm]
    a = (gx.double() * kept).sum(1).abs() + gs.double().abs()
    terms = float((a * torch.linalg.vector_norm(kept, dim=1)).sum()
                  / torch.linalg.vector_norm(p64.detach()))
    cancel = 8 * (unit_roundoff(dt) + 2.0**-53) * terms
    assert_close64(x.grad, x64.grad, dt, scale=4 if dt in LOW else 1, what="topk grad x",
                   ref_lowp=xl.grad if dt in LOW else None)
    assert_close64(p.grad, p64.grad, dt, scale=psc * (4 if dt in LOW else 1),
                   extra=float(p64.grad.abs().max()) * (1e-2 if dt in LOW else 0) + cancel,
                   what="topk grad p", ref_lowp=pl.grad if dt in LOW else None)
    # unpool puts the rows back (exactly: a copy)
    up = topk_unpool(r.x.detach(), perm, n, backend=backend)
    expect = torch.zeros(n, d, dtype=dt)
    expect[perm] = r.x.detach()
    assert torch.equal(up, expect)


@st.composite
def topk_cases(draw):
    rows = fuzz_rows(9)
    return dict(seed=draw(seeds), n=draw(st.integers(1, rows)), d=draw(st.integers(1, 5)),
                distinct=draw(st.integers(1, 4)), ties=draw(st.booleans()), dtype=draw(dtypes),
                p_scale=draw(st.sampled_from([1.0, 1e-23, 1e20])),
                e=draw(st.integers(0, 12 * rows // 9)),
                weighted=draw(st.booleans()), colmajor=draw(st.booleans()),
                ratio=draw(st.sampled_from([0.5, 0.3, 1.0, 1, 3, "count"])))


@pytest.mark.parametrize("backend", BACKENDS)
def test_fuzz_topk_pool(backend):
    on_backend_device(backend)
    @fuzz_settings(backend)
    @given(c=topk_cases())
    def run(c):
        _check_topk(c, backend)
    run()


# ------------------------------------------------------------------------- nearest prototype
@pytest.mark.parametrize("backend", BACKENDS)
def test_fuzz_nearest_prototype(backend):
    on_backend_device(backend)
    @fuzz_settings(backend)
    @given(seed=seeds, n=st.integers(1, fuzz_rows(8)), m=st.integers(1, 5), d=st.integers(1, 5),
           dup=st.booleans(), on_proto=st.booleans(), dt=dtypes,
           scale=st.sampled_from([1.0, 1e-23, 1e20]), colmajor=st.booleans())
    def run(seed, n, m, d, dup, on_proto, dt, scale, colmajor):
        g = _gen(seed)
        scale = 1.0 if dt in LOW else scale
        protos = torch.randn(m, d, generator=g, dtype=torch.float64)
        if dup:  # duplicate prototypes: exact ties, lowest index must win
            protos = torch.cat([protos, protos.flip(0)])
        z = torch.randn(n, d, generator=g, dtype=torch.float64)
        if on_proto:
            z[: min(n, protos.shape[0])] = protos[: min(n, protos.shape[0])]
        z, protos = (z * scale).to(dt), (protos * scale).to(dt)
        if colmajor:  # transposed views: the tie rule must not depend on the layout
            z, protos = z.t().contiguous().t(), protos.t().contiguous().t()
        got = nearest_prototype(z, protos, backend=backend)
        dist = torch.cdist(z.double() / scale, protos.double() / scale) ** 2  # exact enough
        best = dist.min(1).values
        # chosen distance within rounding of the minimum (fp32 accumulation of O(d) terms)
        slack = 1e-5 * (z.double().norm(dim=1) / scale + protos.double().norm(dim=1).max()) ** 2
        chosen = dist.gather(1, got[:, None]).squeeze(1)
        assert bool((chosen <= best + slack).all()), (got, dist)
        exact_tie = dist == dist.gather(1, got[:, None])  # bit-equal distances of duplicates
        first = torch.argmax(exact_tie.int(), dim=1)
        assert torch.equal(got, first), "ties must go to the lowest prototype index"
    run()


# ------------------------------------------------------------------------- contrastive losses
@st.composite
def loss_cases(draw):
    rows = fuzz_rows(10)
    return dict(seed=draw(seeds), n=draw(st.integers(1, rows)), d=draw(st.integers(1, 6)),
                classes=draw(st.integers(1, max(4, rows // 5))),
                singleton=draw(st.booleans()),
                m=draw(st.integers(0, 3)), tau=10 ** draw(st.floats(-2, 1)),
                logit=draw(st.sampled_from([1.0, 1e2, 1e4])), dtype=draw(dtypes),
                include_self=draw(st.booleans()),
                reduction=draw(st.sampled_from(["mean", "sum", "none"])),
                variant=draw(st.sampled_from(["exact", "official"])),
                levels=draw(st.integers(1, 2)), dups=draw(st.booleans()),
                symmetric=draw(st.booleans()))


@contextlib.contextmanager
def _symmetric_engine(on: bool):
    """The symmetric CPU engine (``_lse_symmetric``: one level, fp32, every key visible) on
    these tiny problems too (its MIN_ROWS lifted), so the fuzz reaches it as well."""
    old = sym.MIN_ROWS
    sym.MIN_ROWS = 1 if on else old
    try:
        yield
    finally:
        sym.MIN_ROWS = old


def _loss_inputs(c):
    g = _gen(c["seed"])
    n, d = c["n"], c["d"]
    y = torch.randint(0, c["classes"], (n,), generator=g)
    if c["singleton"]:
        y[-1] = c["classes"] + 3  # a class of one member
    z = torch.randn(n, d, generator=g, dtype=torch.float64)
    if c["dups"]:  # equal rows (in any class): exact ties of the official variant's row max
        z = z[torch.randint(0, (n + 1) // 2, (n,), generator=g)]
    protos = torch.randn(c["m"], d, generator=g, dtype=torch.float64)
    # scale so that max |z_i·z_j| / τ = logit (the loss's condition number, below)
    allz = torch.cat([z, protos])
    smax = float((allz @ allz.t()).abs().max()) / c["tau"]
    s = math.sqrt(c["logit"] / max(smax, 1e-12))
    return y, (z * s).to(c["dtype"]), (protos * s).to(c["dtype"])


def _cond_extra(zs, tau, dt, n_rows):
    """First-order bound of float32 rounding in the similarities s_ij = z_i·z_j/τ:
    |δs| <= (d + 2)·u·‖z_i‖‖z_j‖/τ =: δ; the loss moves by at most ~2δ and a gradient row,
    a p-weighted sum over n_rows keys of z/τ, by ~2δ·n_rows·max‖z‖/τ."""
    norms = torch.cat([t.detach().double().norm(dim=1) for t in zs])
    delta = (zs[0].shape[1] + 2) * unit_roundoff(dt) * float(norms.max()) ** 2 / tau
    return 4 * delta, 4 * delta * n_rows * float(norms.max()) / tau


def _check_loss(c, backend, hierarchical):
    dt = c["dtype"]
    y, z, protos = _loss_inputs(c)
    z.requires_grad_()
    pr = protos.requires_grad_() if c["m"] else None
    z64 = z.detach().double().requires_grad_()
    pr64 = protos.detach().double().requires_grad_() if c["m"] else None
    kw = dict(temperature=c["tau"], include_self=c["include_self"], variant=c["variant"])
    if hierarchical:
        labels = [y, y % 2][: c["levels"]]
        out = hierarchical_contrastive_loss(z, labels, [pr, None][: c["levels"]],
                                            backend=backend, **kw)
        ref = hierarchical_contrastive_loss(z64, labels, [pr64, None][: c["levels"]],
                                            backend="reference", **kw)
    else:
        kw["reduction"] = c["reduction"]
        out = balanced_contrastive_loss(z, y, prototypes=pr, backend=backend, **kw)
        ref = balanced_contrastive_loss(z64, y, prototypes=pr64, backend="reference", **kw)
    # the 16-bit reference (float32 arithmetic on the 16-bit values) bounds the fast paths, and
    # the float32 one the official variant's in float32 (its row max's gradient jumps where two
    # logits tie within fp32 rounding: _fuzz_support); the reference backend itself is held to
    # the rule without it (else it bounds itself)
    lowp_needed = dt in LOW or (dt == torch.float32 and c["variant"] == "official")
    if lowp_needed and backend == "reference" and c["variant"] == "official":
        assume(not _row_max_near_tie([z, protos], c["tau"]))     # (it would bound itself)
    lowp = (_loss_lowp(c, y, z, protos, kw, hierarchical)
            if lowp_needed and backend != "reference" else None)
    n_rows = c["n"] + c["m"]
    ex_val, ex_grad = _cond_extra([z, protos], c["tau"], dt, n_rows)
    note(f"condition extra: value {ex_val:.3g}, grad {ex_grad:.3g}")
    lv, lz, lp = lowp if lowp is not None else (None, None, None)
    assert_close64(out, ref, dt, ref_lowp=lv, extra=ex_val, what="loss value")
    gout = _loss_gout(c, out.shape).to(out.dtype)  # the same incoming gradient for both
    out.backward(gout)
    ref.backward(gout.double())
    assert_close64(z.grad, z64.grad, dt, ref_lowp=lz, extra=ex_grad, what="loss grad z")
    if c["m"]:
        assert_close64(pr.grad, pr64.grad, dt, ref_lowp=lp, extra=ex_grad,
                       what="loss grad prototypes")


def _row_max_near_tie(zs, tau) -> bool:
    """Whether some row's two largest logits over all keys (rows and prototypes) are within
    4 fp32 ulp of the larger: where the official variant's row max may pick either key."""
    z_all = torch.cat([t.detach().double() for t in zs])
    if z_all.shape[0] < 2:
        return False
    top = torch.topk(z_all @ z_all.t() / tau, 2, dim=1).values
    return bool((top[:, 0] - top[:, 1] <= 4 * 2.0**-23 * top[:, 0].abs()).any())


def _loss_gout(c, shape):
    return torch.randn(shape, generator=_gen(c["seed"] + 1), dtype=torch.float64)


def _loss_lowp(c, y, z, protos, kw, hierarchical):
    """(value, grad z, grad prototypes) of the dense reference on the 16-bit inputs (computed
    in float32, gradients rounded to 16 bits): the low-precision reference of the rule."""
    zl = z.detach().clone().requires_grad_()
    pl = protos.detach().clone().requires_grad_() if c["m"] else None
    if hierarchical:
        labels = [y, y % 2][: c["levels"]]
        out = hierarchical_contrastive_loss(zl, labels, [pl, None][: c["levels"]],
                                            backend="reference", **kw)
    else:
        out = balanced_contrastive_loss(zl, y, prototypes=pl, backend="reference", **kw)
    out.backward(_loss_gout(c, out.shape).to(out.dtype))
    return out.detach(), zl.grad, None if pl is None else pl.grad


@pytest.mark.parametrize("backend", LOSS_BACKENDS)
def test_fuzz_balanced_contrastive_loss(backend):
    on_backend_device(backend)
    @fuzz_settings(backend)
    @given(c=loss_cases())
    def run(c):
        with _symmetric_engine(c["symmetric"]):
            _check_loss(c, backend, hierarchical=False)
    run()


@pytest.mark.parametrize("backend", LOSS_BACKENDS)
def test_fuzz_hierarchical_contrastive_loss(backend):
    on_backend_device(backend)
    @fuzz_settings(backend)
    @given(c=loss_cases())
    def run(c):
        with _symmetric_engine(c["symmetric"]):
            _check_loss(c, backend, hierarchical=True)
    run()


@pytest.mark.skipif("triton" not in BACKENDS, reason="triton is not installed")
def test_triton_16bit_loss_gradient_cancellation():
    """Regression: the Triton LSE gradient of a 16-bit input was returned in 16 bits and then
    cancelled against the fp32 positive-pair part (-0.0078 instead of 0 here)."""
    dev = backend_device("triton")
    z = torch.tensor([[10.0]], dtype=torch.float16, device=dev, requires_grad=True)
    loss = balanced_contrastive_loss(z, torch.tensor([0], device=dev), temperature=1.0,
                                     backend="triton")
    loss.backward(torch.tensor(-1.1, dtype=torch.float16, device=dev))
    assert z.grad.item() == 0.0  # one row: the loss is log(w) = 0 for every z


# ------------------------------------------------------------------ the campaign knobs
def test_campaign_knobs(monkeypatch):
    """CI's run: the fixed budgets, derandomized, 10 rows; the variables of a long random
    campaign change exactly that; a bad value is an error naming the variable."""
    from tests import _fuzz_support as fs
    for var in (fs.EXAMPLES_ENV, fs.RANDOM_ENV, fs.ROWS_ENV):
        monkeypatch.delenv(var, raising=False)
    base = fs.fuzz_settings("torch")
    assert (base.max_examples, base.derandomize) == (fs.EXAMPLES["torch"], True)
    assert fs.fuzz_rows(10) == 10 and fs.fuzz_rows(7) == 7
    monkeypatch.setenv(fs.EXAMPLES_ENV, "123")
    monkeypatch.setenv(fs.RANDOM_ENV, "1")
    monkeypatch.setenv(fs.ROWS_ENV, "40")
    got = fs.fuzz_settings("torch")
    assert (got.max_examples, got.derandomize) == (123, False)
    assert fs.fuzz_settings("triton").max_examples == 12
    assert fs.fuzz_rows(10) == 40 and fs.fuzz_rows(7) == 40
    for bad in ("0", "-3", "many"):
        monkeypatch.setenv(fs.EXAMPLES_ENV, bad)
        with pytest.raises(ValueError, match=fs.EXAMPLES_ENV):
            fs.fuzz_settings("torch")
