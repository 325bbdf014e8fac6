"""The learnable temperature's pass (``ops/_temperature_grad.py``): its C kernel against the torch
path it replaces on CPU (``_torch_row_terms``) on ragged blocks, keys outside the level, rows
that are not their own positive, ties and wide logits, thread splits bit for bit; and dL/dtau
through both paths against the float64 reference."""
from __future__ import annotations

import pytest
import torch

import hiertail_fast.ops._native as native_mod
import hiertail_fast.ops._temperature_grad as tgrad
from hiertail_fast import balanced_contrastive_loss, hierarchical_contrastive_loss
from tests.conftest import built_kernel


def _kernel():
    return built_kernel(tgrad.kernel(), "the temperature kernel")


def _take_path(monkeypatch, native: bool) -> None:
    """The C kernel (skipped where it cannot be built) or, native off, the torch path."""
    if native:
        _kernel()
    else:
        monkeypatch.setattr(native_mod, "enabled", lambda: False)


def _case(kind: str, rows: int, cols: int, seed: int):
    """(dots [rows, cols], scale, gid [cols], w [cols], row indices [rows]) of one level: some
    keys outside it (gid -1, weight 0) unless kind == "full", the rows among the keys."""
    gen = torch.Generator().manual_seed(seed)
    x = torch.randn(rows, cols, generator=gen)
    scale = 10.0
    if kind == "wide":                      # s to ~1e4: most e below e^-87
        scale = 3000.0
    elif kind == "ties":                    # equal logits, the max repeated, whole equal rows
        x = torch.randint(-3, 2, (rows, cols), generator=gen).float()
        x[0] = 1.0
    gid = torch.randint(0, max(1, cols // 4), (cols,), generator=gen)
    if kind != "full":
        gid[torch.rand(cols, generator=gen) < 0.3] = -1
        gid[0] = 0                          # at least one key in the level
    sizes = torch.bincount(gid.clamp(min=0), minlength=cols).float()
    w = torch.where(gid >= 0, 1.0 / sizes[gid.clamp(min=0)].clamp(min=1), 0.0)
    rows_idx = torch.randperm(cols, generator=gen)[:rows]
    rows_idx = rows_idx[gid[rows_idx] >= 0] if (gid[rows_idx] >= 0).any() else rows_idx[:0]
    return x[:rows_idx.numel()], scale, gid, w, rows_idx


@pytest.mark.parametrize("kind", ["plain", "full", "wide", "ties"])
@pytest.mark.parametrize("shape", [(1, 1), (3, 7), (17, 33), (64, 1000)])
@pytest.mark.parametrize("official", [False, True])
@pytest.mark.parametrize("include_self", [False, True])
def test_kernel_matches_the_torch_path(kind, shape, official, include_self):
    """(a, den, pos) of every row: the kernel (float sums over chunks, theirs in float64) to a
    few float32 ulp of the torch path on the same float32 logits, the arg-max key's own term
    exactly e^0 = 1 in both (a kernel built with s = x * scale and s - M contracted into one
    fma was 7e-5 relative off in den at |s| ~ 10^3); both against the terms in float64."""
    fn = _kernel()
    rows, cols = shape
    rows = min(rows, cols)
    x, scale, gid, w, idx = _case(kind, rows, cols, seed=rows * 1000 + cols)
    assert idx.numel() > 0                  # (the draws put rows in the level: no empty case)
    x0 = x.clone()
    got = tgrad.native_row_terms(fn, x, scale, gid, w, idx, include_self, official)
    assert torch.equal(x, x0)               # the block is not written (the levels share it)
    torch_path = tgrad._torch_row_terms(x, scale, gid, w, idx, include_self, official,
                                        bool((gid >= 0).all()))
    assert torch.equal(x, x0)               # nor by the torch path
    want = tgrad._torch_row_terms(x.double(), scale, gid, w.double(), idx, include_self,
                                  official, bool((gid >= 0).all()))
    # the float64 oracle takes s in float64 from the float32 dots: the kernel rounds s to
    # float32 (as the reference does), so allow that rounding of each term: |s| ulp
    s_ulp = torch.finfo(torch.float32).eps * (x.abs().max().item() * scale + 1)
    eps = torch.finfo(torch.float32).eps
    for j, name in enumerate(("a", "den", "pos")):
        close = 16 * eps * torch_path[:, j].abs().max().item() + 1e-30
        assert (got[:, j] - torch_path[:, j]).abs().max().item() <= close, (name, kind)
        bound = 4 * s_ulp * (w.sum().item() + cols) + 1e-6 * want[:, j].abs().max().item()
        assert (got[:, j] - want[:, j]).abs().max().item() <= bound, (name, kind)
        assert (torch_path[:, j] - want[:, j]).abs().max().item() <= bound, (name, kind)


def test_kernel_rows_split_over_threads_bit_for_bit(monkeypatch):
    """Rows are independent: one thread or two, the same bits."""
    fn = _kernel()
    x, scale, gid, w, idx = _case("plain", 200, 400, seed=5)
    monkeypatch.setattr(torch, "get_num_threads", lambda: 1)
    one = tgrad.native_row_terms(fn, x, scale, gid, w, idx, False, True)
    monkeypatch.setattr(torch, "get_num_threads", lambda: 2)
    two = tgrad.native_row_terms(fn, x, scale, gid, w, idx, False, True)
    assert torch.equal(one, two)


def test_kernel_refuses_what_it_does_not_take():
    fn = _kernel()
    x, scale, gid, w, idx = _case("plain", 4, 9, seed=1)
    with pytest.raises(TypeError, match="float32"):
        tgrad.native_row_terms(fn, x.double(), scale, gid, w, idx, True, False)
    with pytest.raises(TypeError, match="unit column stride"):
        tgrad.native_row_terms(fn, torch.randn(9, 4).t(), scale, gid, w, idx, True, False)
    with pytest.raises(TypeError, match="float32"):         # (the kernel reads w as float)
        tgrad.native_row_terms(fn, x, scale, gid, w.double(), idx, True, False)


@pytest.mark.parametrize("ramp", [False, True])
def test_kernel_sums_a_wide_row_in_float64(ramp):
    """(a, den, pos) are float64 sums of float chunks of 128 entries (the kernel's header): a
    row of 2^20 keys to 1e-6 of the float64 terms. One float sum, or float chunks as long as
    the row, was 2e-5 to 2e-4 off there; the other tests' rows are at most 1,000 keys wide."""
    fn = _kernel()
    n = 1 << 20
    gid = torch.zeros(n, dtype=torch.long)
    gid[n // 2:] = 1
    w = torch.full((n,), 1.0 / 3.0)
    x = -torch.linspace(0, 1, n)[None] if ramp else torch.zeros(1, n)
    rows = torch.tensor([3])
    got = tgrad.native_row_terms(fn, x, 10.0, gid, w, rows, False, False)[0]
    want = tgrad._torch_row_terms(x.double(), 10.0, gid, w.double(), rows, False, False, True)[0]
    for j, name in enumerate(("a", "den", "pos")):
        if want[j] != 0:
            assert abs(got[j] - want[j]) <= 1e-6 * abs(want[j]), (name, got[j], want[j])
    assert want[1] > 0 and (not ramp or (want[0] != 0 and want[2] != 0))


@pytest.mark.parametrize("variant", ["exact", "official"])
@pytest.mark.parametrize("native", [True, False])
def test_dtau_through_either_path_against_float64(monkeypatch, variant, native):
    """dL/dtau of the balanced loss ("none" with signed weights, prototypes) and of the
    hierarchical one (a level with prototypes of its own, so keys outside the other level):
    the suite's rule against the float64 reference, with the C kernel and without."""
    _take_path(monkeypatch, native)
    gen = torch.Generator().manual_seed(3)
    z0 = torch.randn(300, 8, generator=gen)
    p0 = torch.randn(5, 8, generator=gen)
    y = torch.randint(0, 5, (300,), generator=gen)
    w = torch.linspace(-1.0, 2.0, 305, dtype=torch.float64)

    def dtau(dtype, backend, hierarchical):
        z = z0.to(dtype).requires_grad_()
        tau = torch.tensor(0.1, dtype=dtype, requires_grad=True)
        if hierarchical:
            out = hierarchical_contrastive_loss(z, [y, y // 2], [p0.to(dtype), None],
                                                temperature=tau, variant=variant,
                                                backend=backend)
        else:
            out = (balanced_contrastive_loss(z, y, prototypes=p0.to(dtype), temperature=tau,
                                             variant=variant, reduction="none",
                                             backend=backend) * w.to(dtype)).sum()
        out.backward()
        return tau.grad.item()

    calls = []
    real = tgrad.native_row_terms
    monkeypatch.setattr(tgrad, "native_row_terms", lambda *a: calls.append(1) or real(*a))
    for hierarchical in (False, True):
        want = dtau(torch.float64, "reference", hierarchical)
        low = dtau(torch.float32, "reference", hierarchical)
        got = dtau(torch.float32, "torch", hierarchical)
        bound = 2 * abs(low - want) + 1e-5 + 1e-4 * abs(want)
        assert abs(got - want) <= bound, (hierarchical, got, want, bound)
    assert bool(calls) == native            # the path asked for was the one taken


def _outside_the_level_case(case: str):
    """(z, labels, level-1 prototypes, include_self) at tau 0.1 where level 2 (the nodes only)
    leaves level 1's prototype rows and keys out (a second mutation audit of the kernel, each
    case NaN there): ``self_above``: a prototype row, not its own positive, whose own dot lies
    ~89 above its level-2 row max (e^d overflows if the row is taken as its own positive at a
    level it is not in); ``far_below``: a prototype row whose logits on every level-2 key are
    -120, past float32's smallest exp (a row max clamped at 0 leaves den = 0);
    ``key_above``: prototype keys ~89 above every
    node's level-2 row max (e^(s - M) of a key outside the level overflows, 0 * inf)."""
    gen = torch.Generator().manual_seed(0)
    n, d = 40, 4
    y1, y2 = torch.arange(n) % 2, torch.arange(n) % 4
    p1 = torch.zeros(2, d)
    if case == "self_above":
        z = torch.randn(n, d, generator=gen)
        z[:, 0] = 0.0                                   # nodes orthogonal to the prototypes
        p1[:, 0] = 8.9 ** 0.5
        return z, [y1, y2], p1, False
    z = torch.randn(n, d, generator=gen) * (0.3 if case == "far_below" else 0.05)
    z[:, 0] = 1.0
    p1[:, 0] = -12.0 if case == "far_below" else 9.92
    return z, [y1, y2], p1, case == "key_above"


@pytest.mark.parametrize("case", ["self_above", "far_below", "key_above"])
@pytest.mark.parametrize("variant", ["exact", "official"])
@pytest.mark.parametrize("native", [True, False])
def test_dtau_with_rows_and_keys_outside_a_level(monkeypatch, case, variant, native):
    """Rows outside a level take 0 of that level's dL/dtau, and a finite 0: their terms are
    computed in the same block as the level's rows (g = 0 times a NaN is NaN)."""
    _take_path(monkeypatch, native)
    z0, labels, p0, include_self = _outside_the_level_case(case)

    def dtau(dtype, backend):
        tau = torch.tensor(0.1, dtype=dtype, requires_grad=True)
        hierarchical_contrastive_loss(z0.to(dtype), labels, [p0.to(dtype), None],
                                      temperature=tau, include_self=include_self,
                                      variant=variant, backend=backend).backward()
        return tau.grad.item()

    want, low = dtau(torch.float64, "reference"), dtau(torch.float32, "reference")
    got = dtau(torch.float32, "torch")
    bound = 2 * abs(low - want) + 1e-5 + 1e-4 * abs(want)
    assert abs(got - want) <= bound, (got, want, bound)


@pytest.mark.parametrize("reduction", ["mean", "sum"])
@pytest.mark.parametrize("native", [True, False])
def test_dtau_scales_with_the_incoming_gradient(monkeypatch, reduction, native):
    """d(c L)/dtau = c dL/dtau for a reduced (0-dim) loss, as for "none" with weights: a loss
    weighted in a sum of losses (HierTail's lambda) passes its weight on to tau."""
    _take_path(monkeypatch, native)
    gen = torch.Generator().manual_seed(0)
    z = torch.randn(50, 6, generator=gen)
    y = torch.arange(50) % 3

    def dtau(c):
        tau = torch.tensor(0.2, requires_grad=True)
        (c * balanced_contrastive_loss(z, y, temperature=tau, reduction=reduction,
                                       backend="torch")).backward()
        return tau.grad.item()

    one = dtau(1.0)
    assert abs(one) > 1e-3                      # (a gradient to scale)
    assert dtau(3.0) == pytest.approx(3.0 * one, rel=1e-6)
    assert dtau(-0.5) == pytest.approx(-0.5 * one, rel=1e-6)
