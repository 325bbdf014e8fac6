"""The row-block engine's GEMMs on torch.mm or in oneDNN pieces (``ops/_block_gemms.py``): the
pieces' widths and rows (a bounded set of shapes), each product against float64 within
float32's bound on both providers, which calls reach oneDNN, and the engine's multi-level and
hidden-key losses on each provider against the float64 reference."""
from __future__ import annotations

import pytest
import torch

import hiertail_fast.ops._lse_torch as lt
from hiertail_fast import balanced_contrastive_loss, hierarchical_contrastive_loss
from hiertail_fast.ops import _block_gemms as bg
from hiertail_fast.ops import _onednn_gemm as og
from hiertail_fast.ops import _roomy_heap as heap
from hiertail_fast.reference import balanced_contrastive_loss_ref as ref

ONEDNN_HERE = og._unavailable() is None
needs_onednn = pytest.mark.skipif(not ONEDNN_HERE, reason=str(og._unavailable()))
USES = ["blas", pytest.param("onednn", marks=needs_onednn)]


def _counting_op(monkeypatch) -> list:
    """The shapes (X, W) of the adapter's calls of the real oneDNN op."""
    calls = []
    real = og._op()
    og._probe()                         # cached before counting: the probe's calls not counted

    def op(*args):
        calls.append((tuple(args[0].shape), tuple(args[1].shape)))
        return real(*args)

    monkeypatch.setattr(og, "_op", lambda: op)
    return calls


@pytest.mark.parametrize("b", [16, 48, 112, 256])
def test_onednn_pieces_cover_the_keys_in_few_widths(b):
    unit, widest = bg.PIECE_UNIT, None
    widths = set()
    for n in [0, 1, 255, 256, 257, 511, 4095, 4096, 4097, 30_000, 49_999, 100_000, 123_457]:
        got = bg.pieces(n, b, "onednn")
        ends = [0] + [c1 for _, c1, _ in got]
        assert [c0 for c0, _, _ in got] == ends[:-1] and ends[-1] == n
        for i, (c0, c1, on) in enumerate(got):
            w = c1 - c0
            if on:              # 256 x 2^k keys, at most PIECE_BYTES of float32 logits
                assert w % unit == 0 and (w // unit).bit_count() == 1
                assert 4 * b * w <= bg.PIECE_BYTES
                widths.add(w)
            else:               # only the last < 256 keys go to torch.mm
                assert i == len(got) - 1 and 0 < w < unit
        widest = max(widths, default=None)
    # the widths any N can give: PIECE_UNIT * 2^k up to the widest
    assert widest is not None and len(widths) <= widest.bit_length()
    assert bg.pieces(123_457, b, "blas") == [(0, 123_457, False)]


def test_onednn_blocks_have_a_multiple_of_16_rows():
    assert [bg.rows(b, "onednn", 100_000) for b in (8, 15, 16, 17, 120, 125, 256)] == [
        8, 15, 16, 16, 112, 112, 256]
    # no oneDNN piece (fewer keys than a piece), or torch.mm: the block as it was
    assert [bg.rows(b, "onednn", 255) for b in (17, 125)] == [17, 125]
    assert [bg.rows(b, "blas", 100_000) for b in (8, 17, 125)] == [8, 17, 125]


def _bound(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """float32's error bound of a @ b for any summation order (margin 2)."""
    return 2 * a.shape[1] * 2.0 ** -24 * (a.double().abs() @ b.double().abs()) + 1e-30


@pytest.mark.parametrize("use", USES)
@pytest.mark.parametrize("rows", [16, 9])
def test_block_products_within_float32s_bound(monkeypatch, use, rows):
    """Small pieces (8 x 2^k keys, at most 32 wide for 16 rows) over 77 keys: 32 + 32 + 8
    on oneDNN, a ragged 5 on torch.mm; a short block (9 rows) all on torch.mm."""
    monkeypatch.setattr(bg, "PIECE_UNIT", 8)
    monkeypatch.setattr(bg, "PIECE_BYTES", 4 * 16 * 32)
    calls = _counting_op(monkeypatch) if ONEDNN_HERE else []
    gen = torch.Generator().manual_seed(3)
    zc, right = torch.randn(77, 5, generator=gen), torch.randn(77, 5, generator=gen)
    zb, left = torch.randn(rows, 5, generator=gen), torch.randn(rows, 5, generator=gen)
    t = torch.rand(rows, 77, generator=gen)
    key_c0 = torch.randn(77, 5, generator=gen)
    gemms = bg.BlockGemms(zc, 16, use, grad=True)
    assert gemms.pieces == ([(0, 32, True), (32, 64, True), (64, 72, True), (72, 77, False)]
                            if use == "onednn" else [(0, 77, False)])
    e = torch.full((rows, 77), float("nan"))
    gemms.logits(e, zb, zc)
    key_c = key_c0.clone()
    out = gemms.products(t, right, key_c, left, 0.37)
    gemms.finish_keys(key_c)
    assert gemms.key_t is None
    want_e = zb.double() @ zc.double().t()
    assert ((e.double() - want_e).abs() <= _bound(zb, zc.t())).all()
    assert ((out.double() - t.double() @ right.double()).abs() <= _bound(t, right)).all()
    want_k = key_c0.double() + 0.37 * (t.double().t() @ left.double())
    assert ((key_c.double() - want_k).abs() <= 0.37 * _bound(t.t(), left) + 1e-6).all()
    full = use == "onednn" and rows == 16
    # oneDNN: one call per piece for the logits, two (rows, keys) for the products
    assert calls == ([((16, 5), (32, 5)), ((16, 5), (32, 5)), ((16, 5), (8, 5)),
                      ((16, 32), (5, 32)), ((5, 16), (32, 16)),
                      ((16, 32), (5, 32)), ((5, 16), (32, 16)),
                      ((16, 8), (5, 8)), ((5, 16), (8, 16))] if full else [])


def test_forward_only_calls_make_no_key_accumulator():
    gemms = bg.BlockGemms(torch.randn(600, 4), 16, "onednn", grad=False)
    assert gemms.key_t is None and gemms.scratch is None
    assert bg.BlockGemms(torch.randn(600, 4).double(), 16, "onednn", grad=True).use == "blas"


def _levels(n=300, d=12, seed=7):
    gen = torch.Generator().manual_seed(seed)
    z = torch.nn.functional.normalize(torch.randn(n, d, generator=gen), dim=1)
    ys = [torch.randint(0, 6, (n,), generator=gen), torch.randint(0, 3, (n,), generator=gen)]
    ps = [torch.randn(6, d, generator=gen), torch.randn(3, d, generator=gen)]
    return z, ys, ps


@pytest.mark.parametrize("variant", ["exact", "official"])
@pytest.mark.parametrize("use", USES)
def test_two_levels_on_each_provider_match_the_reference(monkeypatch, variant, use):
    """Blocks of 48 rows (7 blocks, the last 12), pieces of 16 x 2^k keys over 300 node keys:
    the provider asked for serves the full blocks' products, and the loss and gradients match
    the float64 reference's sum of the single levels."""
    monkeypatch.setenv(og.ENV_VAR, use)
    monkeypatch.setenv("HIERTAIL_CPU_BLOCK_BYTES", str(4 * 48 * 300))
    monkeypatch.setattr(bg, "PIECE_UNIT", 16)
    monkeypatch.setattr(bg, "PIECE_BYTES", 4 * 48 * 64)
    calls = _counting_op(monkeypatch) if ONEDNN_HERE else []
    z, ys, ps = _levels()
    tau = 0.5 if variant == "official" else 0.1
    got = [t.clone().requires_grad_() for t in (z, *ps)]
    loss = hierarchical_contrastive_loss(got[0], ys, got[1:], temperature=tau,
                                         variant=variant, backend="torch")
    loss.sum().backward()
    want = [t.double().requires_grad_() for t in (z, *ps)]
    total = sum(ref(want[0], y, prototypes=p, temperature=tau, variant=variant)
                for y, p in zip(ys, want[1:], strict=True))
    total.backward()
    assert abs(loss.sum().item() - total.item()) <= 1e-5 * abs(total.item())
    for g, w in zip(got, want, strict=True):
        assert (g.grad.double() - w.grad).abs().max() <= 1e-5 * w.grad.abs().max()
    if use == "blas":
        assert calls == []
    else:
        # 6 full blocks x (pieces 64, 64, 64, 64, 32, 8-key rest on torch.mm): the logits'
        # pieces and two products per piece
        assert bg.pieces(300, 48, "onednn")[-1] == (288, 300, False)
        assert len(calls) == 6 * 3 * 5
        assert {x for x, _ in calls} <= {(48, 12), (48, 64), (48, 32), (48, 16), (12, 48)}


@pytest.mark.parametrize("variant", ["exact", "official"])
@pytest.mark.parametrize("use", USES)
def test_one_level_and_a_level_without_prototypes_match_the_reference(monkeypatch, use,
                                                                       variant):
    """The row-block engine's other calls on both providers: one level below the symmetric
    engine's rows (MIN_ROWS; the weights folded into the operands, and for the official
    variant the positives written into the block before its products), and two levels of
    which the second has no prototypes (the first's are hidden keys there)."""
    monkeypatch.setenv(og.ENV_VAR, use)
    monkeypatch.setenv("HIERTAIL_CPU_BLOCK_BYTES", str(4 * 32 * 300))
    monkeypatch.setattr(bg, "PIECE_UNIT", 16)
    ran = []
    real = lt._blocks
    monkeypatch.setattr(lt, "_blocks", lambda *a, **k: (ran.append(k["use"]), real(*a, **k))[1])
    z, ys, ps = _levels(n=290)
    for labels, protos in (([ys[0]], [ps[0]]), (ys, [ps[0], None])):
        got_z = z.clone().requires_grad_()
        if len(labels) == 1:
            loss = balanced_contrastive_loss(got_z, labels[0], prototypes=protos[0],
                                             temperature=0.2, variant=variant,
                                             backend="torch")
        else:
            loss = hierarchical_contrastive_loss(got_z, labels, protos, temperature=0.2,
                                                 variant=variant, backend="torch").sum()
        loss.backward()
        want_z = z.double().requires_grad_()
        want = sum(ref(want_z, y, prototypes=None if p is None else p.double(),
                       temperature=0.2, variant=variant)
                   for y, p in zip(labels, protos, strict=True))
        want.backward()
        assert abs(loss.item() - want.item()) <= 1e-5 * abs(want.item())
        assert ((got_z.grad.double() - want_z.grad).abs().max()
                <= 1e-5 * want_z.grad.abs().max())
    assert ran == [use, use]


def test_the_row_block_engine_pads_the_heap_only_around_onednn(monkeypatch):
    """Padded around oneDNN's pieces only: not for torch.mm, nor for a problem with fewer
    rows than a piece has keys (no piece: 109 rows against pieces of 256, then of 16)."""
    entered = []
    real = heap.roomy_heap
    monkeypatch.setattr(heap, "roomy_heap", lambda: (entered.append(1), real())[1])
    z, ys, ps = _levels(n=100)
    for unit in (256, 16):
        monkeypatch.setattr(bg, "PIECE_UNIT", unit)
        for use in ("blas", "onednn") if ONEDNN_HERE else ("blas",):
            entered.clear()
            monkeypatch.setenv(og.ENV_VAR, use)
            hierarchical_contrastive_loss(z.clone().requires_grad_(), ys, ps).sum().backward()
            assert len(entered) == (use == "onednn" and unit == 16)
    monkeypatch.setenv(heap.ENV_VAR, "yes")
    for use in ("blas", "onednn") if ONEDNN_HERE else ("blas",):
        monkeypatch.setenv(og.ENV_VAR, use)
        with pytest.raises(ValueError, match="HIERTAIL_CPU_HEAP='yes' is not one of"):
            hierarchical_contrastive_loss(z, ys, ps)


def test_float64_calls_never_ask_for_onednn(monkeypatch):
    """The provider is read for CPU float32 only: a forced but impossible oneDNN is no error
    for a float64 call, which torch.mm computes."""
    monkeypatch.setenv(og.ENV_VAR, "onednn")
    monkeypatch.setattr(og, "_unavailable", lambda: "not here (a test)")
    z, ys, ps = _levels(n=60)
    loss = hierarchical_contrastive_loss(z.double(), ys, [p.double() for p in ps])
    assert torch.isfinite(loss).all()
    with pytest.raises(ValueError, match="HIERTAIL_CPU_GEMM=onednn, but not here"):
        hierarchical_contrastive_loss(z, ys, ps)
    assert lt.MAX_BLOCK_ROWS == 256
