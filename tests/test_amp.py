"""The ops under torch.autocast (hiertail_fast/ops/_amp.py): one defined precision.

Graph ops: the same result as outside autocast (their input dtype). Losses: the same value and
gradient as on inputs cast to autocast's dtype outside autocast (the library's 16-bit path),
on every fast backend; the reference backend stays plain PyTorch under autocast. Runs on CPU
(CPU autocast) and, on a CUDA machine, the Triton rows on CUDA (CUDA autocast)."""
from __future__ import annotations

import pytest
import torch

from hiertail_fast import (
    balanced_contrastive_loss,
    gcn_propagate,
    hierarchical_contrastive_loss,
    nearest_prototype,
    topk_pool,
)
from hiertail_fast.reference import balanced_contrastive_loss_ref
from tests.conftest import DEVICES, backend_device, requires_triton, tol

# (backend, device): the torch-side backends on every device here, Triton where it runs
_TRITON = pytest.param("triton", backend_device("triton"), marks=requires_triton, id="triton")
GRAPH_BACKENDS = [(b, d) for b in ("reference", "torch") for d in DEVICES] + [_TRITON]
LOSS_BACKENDS = [(b, d) for b in ("torch", "attention") for d in DEVICES] + [_TRITON]


def _autocast(dev: str, dtype=torch.bfloat16):
    return torch.autocast(torch.device(dev).type, dtype=dtype)


def _same(a: torch.Tensor, b: torch.Tensor, dev: str, dtype: torch.dtype | None = None) -> None:
    """Bit for bit on CPU (deterministic); on CUDA within the dtype's tolerance, since the
    class sums and degrees there use atomics (docs/GUARANTEES.md: determinism) and two runs of
    the same path may round differently."""
    if torch.device(dev).type == "cpu" or not a.is_floating_point():
        assert torch.equal(a, b)
    else:
        torch.testing.assert_close(a, b, **tol(dtype or b.dtype))


@pytest.mark.parametrize("backend, dev", GRAPH_BACKENDS)
def test_nearest_prototype_under_autocast_is_the_nearest(backend, dev):
    dev = backend_device(backend) if backend == "triton" else dev  # the launch guard
    # before: autocast ran the distance GEMM in bf16 and ~0.5 % of the rows got a prototype
    # that is not the nearest (the near-tie re-check assumes the input dtype's distances)
    gen = torch.Generator().manual_seed(0)
    z = torch.randn(3000, 16, generator=gen).to(dev)
    p = torch.randn(64, 16, generator=gen).to(dev)
    want = nearest_prototype(z, p, backend=backend)
    with _autocast(dev):
        got = nearest_prototype(z, p, backend=backend)
    assert torch.equal(got, want)


@pytest.mark.parametrize("backend, dev", GRAPH_BACKENDS)
def test_graph_ops_under_autocast_keep_their_dtype(backend, dev):
    dev = backend_device(backend) if backend == "triton" else dev  # the launch guard
    gen = torch.Generator().manual_seed(1)
    x = torch.randn(200, 12, generator=gen).to(dev)
    ei = torch.randint(0, 200, (2, 900), generator=gen).to(dev)
    w = torch.rand(900, generator=gen).to(dev)
    p = torch.randn(12, generator=gen).to(dev)

    def run():
        xx = x.clone().requires_grad_()
        h = gcn_propagate(xx, ei, w, backend=backend)
        pooled = topk_pool(h, ei, p, 0.5, backend=backend)
        (pooled.x.pow(2).sum() + h.sum()).backward()
        return h.detach(), pooled.x.detach(), pooled.perm, xx.grad

    want = run()
    with _autocast(dev):
        got = run()
    for a, b in zip(got, want, strict=True):
        assert a.dtype == b.dtype
        _same(a, b, dev)


@pytest.mark.parametrize("backend, dev", LOSS_BACKENDS)
@pytest.mark.parametrize("variant", ["exact", "official"])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.usefixtures("exact_rows_rule_off")
def test_losses_under_autocast_run_on_its_dtype(backend, dev, variant, dtype):
    dev = backend_device(backend) if backend == "triton" else dev  # the launch guard
    # under autocast: the loss on autocast's dtype (as scaled_dot_product_attention), value in
    # float32, gradient back in float32 -- bit for bit what the 16-bit inputs give outside it
    gen = torch.Generator().manual_seed(2)
    z0 = torch.randn(60, 8, generator=gen).to(dev)
    y = torch.randint(0, 4, (60,), generator=gen).to(dev)
    protos = torch.randn(4, 8, generator=gen).to(dev)

    def run(z_in, p_in):
        z = z_in.detach().clone().requires_grad_()
        p = p_in.detach().clone().requires_grad_()
        one = balanced_contrastive_loss(z, y, prototypes=p, variant=variant, backend=backend)
        two = hierarchical_contrastive_loss(z, [y, y // 2], [p, None], variant=variant,
                                            backend=backend)
        # each loss's gradient on its own (a sum would round in the leaf's dtype)
        return (one.detach(), two.detach(), *torch.autograd.grad(one, (z, p)),
                *torch.autograd.grad(two, (z, p)))

    want = run(z0.to(dtype), protos.to(dtype))
    with _autocast(dev, dtype):
        got = run(z0, protos)
    for a, b in zip(got[:2], want[:2], strict=True):
        assert a.dtype == b.dtype == torch.float32
        _same(a, b, dev)
    for a, b in zip(got[2:], want[2:], strict=True):
        assert a.dtype == torch.float32 and b.dtype == dtype
        _same(a, b.float(), dev, dtype)


def test_reference_backend_is_plain_pytorch_under_autocast():
    gen = torch.Generator().manual_seed(3)
    z, y = torch.randn(30, 5, generator=gen), torch.randint(0, 3, (30,), generator=gen)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        got = balanced_contrastive_loss(z, y, backend="reference")
        want = balanced_contrastive_loss_ref(z, y)
    assert torch.equal(got, want)


def test_float64_loss_is_untouched_by_autocast():
    """float64 inputs are left alone, as autocast leaves them (ops/_amp.py): only float32 is
    cast to autocast's 16-bit dtype. No test fed float64 under autocast, so casting it too
    passed the suite (a mutation audit)."""
    gen = torch.Generator().manual_seed(0)
    z = torch.randn(24, 6, generator=gen, dtype=torch.float64)
    y = torch.randint(0, 3, (24,), generator=gen)
    plain = balanced_contrastive_loss(z, y, temperature=0.5)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        auto = balanced_contrastive_loss(z, y, temperature=0.5)
    assert auto.dtype == torch.float64
    torch.testing.assert_close(auto, plain, rtol=1e-12, atol=1e-12)


def test_the_official_range_check_reads_the_rows_autocast_runs_on():
    """Under CPU bf16 autocast the official loss runs on bf16 copies of z: its 2^37 range
    check reads the copies' norms, not the fp32 rows' (the s72 mutation audit: reading the
    fp32 norms refused a call whose copies are within the bound, and would let through one
    whose copies are past it). τ is put between the two bounds, each way round."""
    def case(up: bool):
        for seed in range(200):
            gen = torch.Generator().manual_seed(seed)
            z = torch.randn(16, 8, generator=gen) * 1000
            n32 = z.double().norm(dim=1).max().item() ** 2
            n16 = z.bfloat16().double().norm(dim=1).max().item() ** 2
            if (n16 > n32) == up and abs(n16 - n32) > 1e-4 * n32:
                return z, (n32 + n16) / 2 / 2.0 ** 37
        raise AssertionError("no seed rounds that way")

    y = torch.arange(16) % 3
    for up in (False, True):
        z, tau = case(up)
        with torch.autocast("cpu", dtype=torch.bfloat16):
            if up:           # the copies past 2^37: refused
                with pytest.raises(ValueError, match="2\\^37"):
                    balanced_contrastive_loss(z, y, temperature=tau, variant="official",
                                              backend="torch")
            else:            # the copies within it: runs
                loss = balanced_contrastive_loss(z, y, temperature=tau, variant="official",
                                                 backend="torch")
                assert torch.isfinite(loss)


def test_float16_overflow_under_autocast_stays_float32():
    # rows beyond float16's 65,504 (in z or in the prototypes) keep the call in float32: the
    # float32 result, never one computed on infinities
    gen = torch.Generator().manual_seed(4)
    z, y = torch.randn(10, 4, generator=gen), torch.randint(0, 2, (10,), generator=gen)
    z[3, 1] = 1e5
    small = z.clamp(-9, 9)
    for zz, protos in ((z * 1e-4, None), (small, z[2:4] * 1e-4), (z, None), (small, z[2:4])):
        want = balanced_contrastive_loss(zz, y, prototypes=protos, temperature=1e4,
                                         backend="torch")
        with torch.autocast("cpu", dtype=torch.float16):
            got = balanced_contrastive_loss(zz, y, prototypes=protos, temperature=1e4,
                                            backend="torch")
        big = float(torch.cat([zz] + ([protos] if protos is not None else [])).abs().max())
        if big <= 65504:                            # fits: the float16 path, bit for bit
            want = balanced_contrastive_loss(zz.half(), y, temperature=1e4, backend="torch",
                                             prototypes=None if protos is None else
                                             protos.half())
        assert torch.isfinite(got) and torch.equal(got, want)


@pytest.mark.parametrize("config", ["paper", "official"])
def test_the_model_trains_under_autocast(config):
    # end to end under CPU autocast (bf16): HierTail's forward (GCN layers, pooling, the
    # official configuration's A^2 augmentation -- whose sparse product autocast sent to bf16,
    # which MKL does not implement --) and the losses' backward
    from hiertail_fast import HierTail
    from hiertail_fast.nn.hiertail import HierTailConfig, prepare_graph

    gen = torch.Generator().manual_seed(6)
    n = 300
    x, y = torch.randn(n, 12, generator=gen), torch.randint(0, 5, (n,), generator=gen)
    graph = prepare_graph(torch.randint(0, n, (2, 1500), generator=gen), n)
    torch.manual_seed(0)
    model = HierTail(12, 5, HierTailConfig.named(config, hidden=16))
    with torch.autocast("cpu", dtype=torch.bfloat16):
        loss = model.loss(model(x, graph), y, torch.arange(200)).total
    loss.backward()
    assert torch.isfinite(loss)
    grads = [p.grad for p in model.parameters() if p.grad is not None]
    assert grads and all(torch.isfinite(g).all() for g in grads)
    a2 = graph.augment_a2()
    with torch.autocast("cpu", dtype=torch.bfloat16):
        fresh = prepare_graph(torch.randint(0, n, (2, 1500), generator=gen), n)
        b2 = fresh.augment_a2()
    assert b2.weight.dtype == a2.weight.dtype == torch.float32
