"""The oneDNN GEMM adapter (``ops/_onednn_gemm.py``): its two products against float64 on
ragged shapes and layouts, the choice of provider (environment, machine, fpmath mode), the
version check, the schema probe and the accuracy probe with their fallback to torch.mm, and the
symmetric loss engine on each provider against the reference."""
from __future__ import annotations

import pytest
import torch

import hiertail_fast.ops._lse_symmetric as sym
from hiertail_fast import balanced_contrastive_loss
from hiertail_fast.ops import _onednn_gemm as og
from hiertail_fast.reference import balanced_contrastive_loss_ref as ref

ONEDNN_HERE = og._unavailable() is None
needs_onednn = pytest.mark.skipif(not ONEDNN_HERE, reason=str(og._unavailable()))


@pytest.fixture
def fresh(monkeypatch):
    """Cleared adapter caches before and after (tests replace what they read)."""
    monkeypatch.delenv(og.ENV_VAR, raising=False)
    monkeypatch.delenv(og.FPMATH_ENV, raising=False)
    cached = (og._op, og._probe, og._cpu_vendor)  # a test may replace them: clear the real
                                                  # ones after
    for fn in cached:
        fn.cache_clear()
    yield
    for fn in cached:
        fn.cache_clear()


def _bound(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """float32's error bound of a @ b for any summation order (margin 2)."""
    k = a.shape[1]
    return 2 * k * 2.0 ** -24 * (a.double().abs() @ b.double().abs()) + 1e-30


def _counting_op(monkeypatch) -> list:
    """Counts the adapter's calls of the real oneDNN op."""
    calls = []
    real = og._op()
    og._probe()                         # cached before counting: the probe's calls not counted

    def op(*args):
        calls.append(args[0].shape)
        return real(*args)

    monkeypatch.setattr(og, "_op", lambda: op)
    return calls


@pytest.mark.parametrize("use", ["blas", pytest.param("onednn", marks=needs_onednn)])
@pytest.mark.parametrize("m,k,n", [(1, 1, 1), (7, 13, 5), (37, 160, 300), (256, 3, 1)])
def test_products_within_float32s_bound(use, m, k, n):
    gen = torch.Generator().manual_seed(m * 1000 + k * 10 + n)
    a = torch.randn(m, k, generator=gen)
    b = torch.randn(n, k, generator=gen)
    got = og.mm_nt(a, b, use=use)
    want = a.double() @ b.double().t()
    assert got.dtype == torch.float32 and got.shape == (m, n)
    assert ((got.double() - want).abs() <= _bound(a, b.t())).all()
    # acc += a @ b, a row-major and a transposed view (the engine's S^T z_B), into a view
    base = torch.randn(m + 3, n, generator=gen)
    keep = base.clone()
    c = torch.randn(k, n, generator=gen)
    for lhs in (a, a.t().contiguous().t()):
        acc = base[2:2 + m]
        before = acc.double().clone()
        og.add_mm_(acc, lhs, c, use=use)
        want = before + lhs.double() @ c.double()
        assert ((acc.double() - want).abs() <= _bound(lhs, c) + 4 * 2.0 ** -24 * want.abs()).all()
        assert torch.equal(base[:2], keep[:2]) and torch.equal(base[2 + m:], keep[2 + m:])


@pytest.mark.parametrize("use", ["blas", pytest.param("onednn", marks=needs_onednn)])
@pytest.mark.parametrize("m,k,n", [(1, 1, 1), (7, 13, 5), (37, 160, 300), (256, 3, 1)])
def test_the_transposed_accumulation_within_float32s_bound(use, m, k, n):
    """acc_t += (a @ b)^T into a column slice of a wider [n, *] buffer (the engine's
    transposed keys accumulator, row stride N), a row-major and as a transposed view; the
    buffer's other columns untouched."""
    gen = torch.Generator().manual_seed(m * 7 + k * 3 + n)
    b = torch.randn(k, n, generator=gen)
    base = torch.randn(n, m + 5, generator=gen)
    keep = base.clone()
    a = torch.randn(m, k, generator=gen)
    for lhs in (a, a.t().contiguous().t()):
        acc_t = base[:, 3:3 + m]
        before = acc_t.double().clone()
        assert og.add_mm_t_(acc_t, lhs, b, use=use) is acc_t
        want = before + (lhs.double() @ b.double()).t()
        bound = _bound(lhs, b).t() + 4 * 2.0 ** -24 * want.abs()
        assert ((acc_t.double() - want).abs() <= bound).all()
        assert torch.equal(base[:, :3], keep[:, :3]) and torch.equal(base[:, 3 + m:],
                                                                       keep[:, 3 + m:])


@needs_onednn
def test_onednn_computes_the_float32_products_and_nothing_else(monkeypatch, fresh):
    calls = _counting_op(monkeypatch)
    a, b, c = torch.randn(4, 6), torch.randn(5, 6), torch.randn(6, 5)
    og.mm_nt(a, b, use="onednn")
    og.add_mm_(torch.zeros(4, 5), a, c, use="onednn")
    og.add_mm_(torch.zeros(5, 4), b.t().contiguous().t(), a.t(), use="onednn")  # a view
    og.add_mm_t_(torch.zeros(5, 4), a, c, use="onednn")
    assert len(calls) == 4
    # float64 and bf16 stay on torch.mm, exact as before
    a64, b64 = a.double(), b.double()
    assert torch.equal(og.mm_nt(a64, b64, use="onednn"), a64 @ b64.t())
    abf = a.bfloat16()
    assert torch.equal(og.mm_nt(abf, abf, use="onednn"), abf @ abf.t())
    acc = torch.zeros(4, 5, dtype=torch.float64)
    og.add_mm_(acc, a64, c.double(), use="onednn")
    assert torch.equal(acc, a64 @ c.double())
    acc_t = torch.zeros(5, 4, dtype=torch.float64)
    og.add_mm_t_(acc_t, a64, c.double(), use="onednn")
    torch.testing.assert_close(acc_t, (a64 @ c.double()).t(), rtol=1e-15, atol=1e-15)
    og.mm_nt(a, b, use="blas")
    og.add_mm_t_(torch.zeros(5, 4), a, c, use="blas")
    assert len(calls) == 4


def test_choice_reads_the_environment(monkeypatch, fresh):
    assert og.choice() == "auto"
    for raw, value in [("", "auto"), (" ONEDNN ", "onednn"), ("Blas", "blas"), ("auto", "auto")]:
        monkeypatch.setenv(og.ENV_VAR, raw)
        assert og.choice() == value
    monkeypatch.setenv(og.ENV_VAR, "mkl")
    with pytest.raises(ValueError,
                       match="HIERTAIL_CPU_GEMM='mkl' is not one of auto, onednn, blas"):
        og.choice()
    with pytest.raises(ValueError, match="HIERTAIL_CPU_GEMM"):
        og.provider()


@pytest.mark.parametrize("vendor,machine,mkl,auto", [
    ("AuthenticAMD", "x86_64", True, "onednn"),
    ("HygonGenuine", "x86_64", True, "onednn"),
    ("GenuineIntel", "x86_64", True, "blas"),
    (None, "x86_64", True, "blas"),
    ("AuthenticAMD", "aarch64", True, "blas"),
    ("AuthenticAMD", "x86_64", False, "blas"),
])
def test_auto_takes_onednn_only_where_mkl_runs_on_another_vendors_cpu(
        monkeypatch, fresh, vendor, machine, mkl, auto):
    monkeypatch.setattr(og, "_cpu_vendor", lambda: vendor)
    monkeypatch.setattr(og.platform, "machine", lambda: machine)
    monkeypatch.setattr(og.torch.backends.mkl, "is_available", lambda: mkl)
    monkeypatch.setattr(og, "_unavailable", lambda: None)
    assert og.provider() == auto
    monkeypatch.setenv(og.ENV_VAR, "onednn")
    assert og.provider() == "onednn"                  # forced: the machine does not matter
    monkeypatch.setenv(og.ENV_VAR, "blas")
    assert og.provider() == "blas"


def test_cpu_vendor_is_read_from_cpuinfo(monkeypatch, tmp_path):
    info = tmp_path / "cpuinfo"
    info.write_text("processor\t: 0\nvendor_id\t: AuthenticAMD\ncpu family\t: 25\n")
    real_open = open
    monkeypatch.setattr("builtins.open", lambda path, *a, **k: real_open(
        info if path == "/proc/cpuinfo" else path, *a, **k))
    read = og._cpu_vendor.__wrapped__         # past the per-process cache
    assert read() == "AuthenticAMD"
    info.write_text("processor\t: 0\n")
    assert read() is None
    info.unlink()
    assert read() is None
    info.write_text("vendor_id\t: AuthenticAMD\n")
    og._cpu_vendor.cache_clear()
    assert og._cpu_vendor() == "AuthenticAMD" and og._cpu_vendor.cache_info().hits == 0
    info.write_text("processor\t: 0\n")
    assert og._cpu_vendor() == "AuthenticAMD"             # read once per process
    og._cpu_vendor.cache_clear()


def test_without_the_op_auto_falls_back_and_a_forced_onednn_says_why(monkeypatch, fresh):
    monkeypatch.setattr(og, "_auto_machine", lambda: True)
    monkeypatch.setattr(og, "supported", lambda version=None: False)      # an older torch
    assert og._op() is None
    assert og.provider() == "blas"
    monkeypatch.setenv(og.ENV_VAR, "onednn")
    with pytest.raises(ValueError, match="_linear_pointwise is not available"):
        og.provider()
    # the loss still runs, on torch.mm
    monkeypatch.setenv(og.ENV_VAR, "auto")
    z = torch.randn(600, 8, requires_grad=True)
    y = torch.randint(0, 3, (600,))
    balanced_contrastive_loss(z, y, backend="torch").backward()
    assert torch.isfinite(z.grad).all()


def test_version_check_and_schema_probe(monkeypatch, fresh):
    assert og.supported((2, 1)) and og.supported((2, 13)) and og.supported((3, 0))
    assert not og.supported((2, 0)) and not og.supported((1, 13))

    class Arg:
        def __init__(self, name):
            self.name = name

    class Overload:
        def __init__(self, names):
            self._schema = type("Schema", (), {"arguments": [Arg(n) for n in names]})()

    class Packet:
        def __init__(self, names):
            self.default = Overload(names)

    fake_mkldnn = type("NS", (), {})()
    monkeypatch.setattr(og.torch.ops, "mkldnn", fake_mkldnn)
    monkeypatch.setattr(og.torch.backends.mkldnn, "is_available", lambda: True)
    fake_mkldnn._linear_pointwise = Packet(og._OP_ARGS)
    assert og._op() is fake_mkldnn._linear_pointwise.default
    og._op.cache_clear()
    fake_mkldnn._linear_pointwise = Packet(("X", "W", "B", "attr", "scalars"))   # changed
    assert og._op() is None
    og._op.cache_clear()
    del fake_mkldnn._linear_pointwise
    assert og._op() is None
    og._op.cache_clear()
    monkeypatch.setattr(og.torch.backends.mkldnn, "is_available", lambda: False)
    fake_mkldnn._linear_pointwise = Packet(og._OP_ARGS)
    assert og._op() is None


@pytest.mark.parametrize("rounding", ["bf16", "tf32", "none"])
def test_the_accuracy_probe_refuses_an_op_that_rounds_its_inputs(monkeypatch, fresh, rounding):
    def rounded(t):
        if rounding == "bf16":
            return t.bfloat16().float()
        if rounding == "tf32":                    # 10-bit mantissa: clear the low 13 bits
            return (t.view(torch.int32) & ~0x1FFF).view(torch.float32)
        return t

    def op(x, w, bias, attr, scalars, algorithm):
        return rounded(x) @ rounded(w).t()

    monkeypatch.setattr(og, "_op", lambda: op)
    why = og._probe()
    if rounding == "none":
        assert why is None and og._unavailable() is None
    else:
        assert "off by more than float32 rounding" in why
        monkeypatch.setattr(og, "_auto_machine", lambda: True)
        assert og.provider() == "blas"
        monkeypatch.setenv(og.ENV_VAR, "onednn")
        with pytest.raises(ValueError, match="off by more than float32 rounding"):
            og.provider()


@pytest.mark.parametrize("mode", ["BF16", "tf32", "any", "F16"])
def test_a_rounding_fpmath_mode_in_the_environment_keeps_torch_mm(monkeypatch, fresh, mode):
    monkeypatch.setattr(og, "_op", lambda: (lambda x, w, *rest: x @ w.t()))
    monkeypatch.setattr(og, "_auto_machine", lambda: True)
    monkeypatch.setenv(og.FPMATH_ENV, mode)
    assert og.provider() == "blas"
    monkeypatch.setenv(og.ENV_VAR, "onednn")
    with pytest.raises(ValueError, match=f"ONEDNN_DEFAULT_FPMATH_MODE='{mode}'"):
        og.provider()
    for strict in ("strict", " STRICT ", ""):
        monkeypatch.setenv(og.FPMATH_ENV, strict)
        assert og.provider() == "onednn"


@needs_onednn
def test_the_probe_holds_under_the_users_reduced_precision(monkeypatch, fresh):
    """torch's bf16 / TF32 matmul settings do not reach the probe (it runs as our ops run,
    at IEEE flags) nor the products inside our loss."""
    before = torch.get_float32_matmul_precision()
    torch.set_float32_matmul_precision("medium")
    try:
        assert og._probe() is None
        assert torch.get_float32_matmul_precision() == "medium"
    finally:
        torch.set_float32_matmul_precision(before)


@pytest.mark.parametrize("variant", ["exact", "official"])
@pytest.mark.parametrize("use", ["blas", pytest.param("onednn", marks=needs_onednn)])
def test_symmetric_engine_on_each_provider_matches_the_reference(monkeypatch, variant, use):
    """Wide ragged tiles (row blocks of 64, 300-key pieces): the provider asked for serves
    every product of the engine, and the loss and gradient match the float64 reference."""
    monkeypatch.setenv(og.ENV_VAR, use)
    monkeypatch.setenv(sym.ENV_VAR, "1")
    monkeypatch.setattr(sym, "MIN_ROWS", 1)
    monkeypatch.setattr(sym, "MAX_BLOCK_ROWS", 64)
    monkeypatch.setenv("HIERTAIL_CPU_BLOCK_BYTES", str(4 * 64 * 300))
    calls = _counting_op(monkeypatch) if ONEDNN_HERE else []
    transposed = []                 # the keys' products into the transposed accumulator
    real_t = og.add_mm_t_
    monkeypatch.setattr(og, "add_mm_t_", lambda acc_t, *a, **k: (
        transposed.append((acc_t.shape, acc_t.stride())), real_t(acc_t, *a, **k))[1])
    gen = torch.Generator().manual_seed(5)
    z = torch.nn.functional.normalize(torch.randn(1001, 24, generator=gen), dim=1)
    y = torch.randint(0, 7, (1001,), generator=gen)
    got_z = z.clone().requires_grad_()
    loss = balanced_contrastive_loss(got_z, y, temperature=0.1, variant=variant, backend="torch")
    loss.backward()
    want_z = z.double().requires_grad_()
    want = ref(want_z, y, temperature=0.1, variant=variant)
    want.backward()
    # 16 row blocks, each a diagonal tile and pieces of 256, 128 or 64 keys (oneDNN: 4
    # products each) or < 64 (torch.mm, as every tile of the BLAS run)
    tiles, _ = sym._tiles(1001, use)
    served = [sym._gemm_use(use, r1 - r0, c1 - c0) for r0, r1, c0, c1 in tiles]
    assert len(calls) == 4 * served.count("onednn")
    # pass 2: each oneDNN tile's keys' product row by row into the [d, N] accumulator
    assert transposed == [((24, c1 - c0), (1001, 1)) for (r0, r1, c0, c1), u in
                          zip(tiles, served, strict=True) if u == "onednn"]
    ragged = [r1 - r0 < 64 or c1 - c0 < 64 for r0, r1, c0, c1 in tiles]
    if use == "onednn":
        assert served == ["blas" if r else "onednn" for r in ragged] and not all(ragged)
    else:
        assert not calls
    assert abs(loss.item() - want.item()) <= 1e-5 * abs(want.item())
    scale = want_z.grad.abs().max()
    assert (got_z.grad.double() - want_z.grad).abs().max() <= 1e-5 * scale


def test_onednn_tiles_stay_under_the_allocators_mmap_ceiling(monkeypatch):
    monkeypatch.delenv("HIERTAIL_CPU_BLOCK_BYTES", raising=False)
    assert sym._piece_width("blas") * 4 * sym.MAX_BLOCK_ROWS == 48 << 20
    width = sym._piece_width("onednn")
    assert width * 4 * sym.MAX_BLOCK_ROWS <= sym.ONEDNN_TILE_BYTES < 32 << 20
    tiles, _ = sym._tiles(100_000, "onednn")
    assert max((r1 - r0) * (c1 - c0) for r0, r1, c0, c1 in tiles) * 4 < 32 << 20
    monkeypatch.setenv("HIERTAIL_CPU_BLOCK_BYTES", str(4 << 20))     # a smaller budget holds
    assert sym._piece_width("onednn") * 4 * sym.MAX_BLOCK_ROWS == 4 << 20


def test_torch_release_reads_major_and_minor(monkeypatch):
    from hiertail_fast.ops import _torch_release

    for text, want in [("2.13.0+cpu", (2, 13)), ("2.11.0", (2, 11)), ("3.0.1+cu130", (3, 0))]:
        monkeypatch.setattr(_torch_release.torch, "__version__", text)
        assert _torch_release.torch_release() == want
    monkeypatch.setattr(_torch_release.torch, "__version__", "2.0.0")
    assert not og.supported()
    monkeypatch.setattr(_torch_release.torch, "__version__", "2.1.0")
    assert og.supported()
