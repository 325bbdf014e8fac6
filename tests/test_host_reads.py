"""``ops/_host_reads.py``: the one switch between the torch engines' CPU shortcuts and their
sync-free CUDA forms, and the context that runs the CUDA code paths on CPU tensors."""
from __future__ import annotations

import contextlib
import os

import pytest
import torch

import hiertail_fast.ops._host_reads as host_reads


def test_host_reads_are_cheap_on_cpu_only(monkeypatch):
    assert host_reads.host_reads_cheap("cpu") and host_reads.host_reads_cheap(torch.device("cpu"))
    assert not host_reads.host_reads_cheap("cuda") and not host_reads.host_reads_cheap("meta")
    monkeypatch.setattr(host_reads, "FORCE_SYNC_FREE", True)
    assert not host_reads.host_reads_cheap("cpu")


def test_cuda_code_paths_sets_and_restores_every_switch(monkeypatch):
    monkeypatch.setenv("HIERTAIL_POSITIVES", "slices")          # a user's value: kept after
    monkeypatch.delenv("HIERTAIL_NATIVE", raising=False)        # unset: unset after
    monkeypatch.setenv("HIERTAIL_SYMMETRIC", "1")
    with host_reads.cuda_code_paths():
        assert not host_reads.host_reads_cheap("cpu")
        assert {k: os.environ[k] for k in host_reads.CUDA_PATH_ENV} == host_reads.CUDA_PATH_ENV
    assert host_reads.host_reads_cheap("cpu") and not host_reads.FORCE_SYNC_FREE
    assert os.environ["HIERTAIL_POSITIVES"] == "slices" and "HIERTAIL_NATIVE" not in os.environ
    assert os.environ["HIERTAIL_SYMMETRIC"] == "1"
    with host_reads.cuda_code_paths({"HIERTAIL_POSITIVES": "slices", "HIERTAIL_X": "1"}):
        assert os.environ["HIERTAIL_POSITIVES"] == "slices" and os.environ["HIERTAIL_X"] == "1"
        assert os.environ["HIERTAIL_NATIVE"] == "0"             # extra switches on top
    assert "HIERTAIL_X" not in os.environ and os.environ["HIERTAIL_POSITIVES"] == "slices"
    try:                                                        # restored on an error too
        with host_reads.cuda_code_paths():
            raise RuntimeError("inside")
    except RuntimeError:
        pass
    assert not host_reads.FORCE_SYNC_FREE and "HIERTAIL_NATIVE" not in os.environ


def _cuda_forms_calls(monkeypatch, backend, variant, levels, syncs,
                      block_bytes: int = 1 << 30):
    """The calls of one loss (fwd+bwd, 600 rows, d 8; the torch engine in blocks of
    `block_bytes`, one by default, with no row cap, as on CUDA) in the engines' CUDA code
    paths, counted by bench/dispatch_count.py on CPU tensors, on any machine (on a GPU the
    profile table of bench/gpu_report.py counts the real launches and waits)."""
    import sys

    from tests.conftest import load_bench

    dispatch_count = load_bench("bench_dispatch_count_forms", "dispatch_count.py")
    monkeypatch.setattr(sys.modules["loss_grid"], "DEVICE", "cpu")
    with dispatch_count._as_cuda(block_bytes=block_bytes):
        return dispatch_count.count(600, 8, levels, variant, "relu", 0.1, backend, syncs=syncs)


@pytest.mark.parametrize("levels,variant,per_block", [
    (1, "exact", 0), (3, "exact", 0), (1, "official", 0), (3, "official", 1)])
def test_the_cuda_block_loop_makes_no_host_sync(monkeypatch, levels, variant, per_block):
    """In its CUDA code paths the torch engine's row-block loop reads nothing on the host: the
    loss makes as many host syncs in 9 blocks as in one (a read per block drained the GPU's
    queue each time and left the GPU idle while the host launched the next block's ~100 small
    ops: the official loss at 20k rows spent ~17 ms of kernels in a 34 ms step on an H200).
    The official variant at several levels reads one pair of flags per block
    (_positive_blocks._ranges_block: whether any row's level max is a level-specific key
    close enough to tie), so at most one sync per block (it was four)."""
    def syncs(block_bytes):
        return sum(_cuda_forms_calls(monkeypatch, "torch", variant, levels, True,
                                     block_bytes).values())

    one_block = syncs(1 << 30)
    nine_blocks = syncs(4 * 620 * 75)                                  # 75 of ~670 rows
    assert one_block > 0 and 0 <= nine_blocks - one_block <= per_block * 9


@pytest.mark.parametrize("levels", [1, 3])
def test_the_official_positives_setup_reads_the_device_three_times(levels, monkeypatch):
    """``BlockPositives`` (the official positives of the torch engine) on its CUDA path: the
    key order's level costs, the common keys' count and every level's flags (contiguous groups,
    foldable weights, level maxima always common) are three host reads whatever the number of
    levels (it made ~6 per level: boolean-mask indexing reads the mask's count), and give the
    flags and key ranges of the CPU path."""
    from hiertail_fast.ops._positive_blocks import BlockPositives
    from tests.conftest import load_bench

    dispatch_count = load_bench("bench_dispatch_count_setup", "dispatch_count.py")
    g = torch.Generator().manual_seed(levels)
    n = 300
    y = torch.randint(0, 12, (n,), generator=g)
    gid = torch.stack([y // (2 ** k) for k in range(levels)])
    gid[-1, ::17] = -1                                    # rows outside the last level
    common = torch.ones(n, dtype=torch.bool)
    common[-5:] = False                                   # prototype-like keys
    log_w = torch.where(common, -torch.log1p(gid.clamp(min=0).double()), -torch.inf)
    log_w[0, -5:] = 0.0                                   # level 0 sees its prototypes
    z = torch.randn(n, 8, generator=g)
    reads = []
    real_tolist = torch.Tensor.tolist
    monkeypatch.setattr(torch.Tensor, "tolist", lambda t: reads.append(1) or real_tolist(t))
    built = {}
    for cuda in (False, True):
        counter = dispatch_count._Counter(syncs=True)
        reads.clear()
        with host_reads.cuda_code_paths() if cuda else contextlib.nullcontext(), counter:
            built[cuda] = BlockPositives(z, gid, [12 >> k for k in range(levels)], True, None,
                                         1.0, common, log_w)
        if cuda:
            assert sum(counter.calls.values()) + len(reads) == 3
    cpu, gpu = built[False], built[True]
    assert gpu.handled == cpu.handled and gpu.foldable == cpu.foldable
    assert gpu._f_always_one == cpu._f_always_one is False
    for a, b in zip(cpu.start + cpu.count, gpu.start + gpu.count, strict=True):
        assert torch.equal(a, b)
    assert torch.equal(cpu.cnt_s, gpu.cnt_s)
    if gpu.band and hasattr(cpu, "lo_s"):
        assert torch.equal(cpu.lo_s, gpu.lo_s) and torch.equal(cpu.hi_s, gpu.hi_s)
    assert gpu.band


@pytest.mark.parametrize("backend,variant,levels,most", [
    ("torch", "exact", 1, 2), ("torch", "exact", 3, 6), ("torch", "official", 1, 8),
    ("torch", "official", 3, 20), ("attention", "exact", 1, 2), ("attention", "exact", 3, 4),
    ("attention", "official", 1, 10), ("attention", "official", 3, 26)])
def test_host_reads_per_loss_in_the_cuda_forms(monkeypatch, backend, variant, levels, most):
    """The host syncs of one loss (fwd+bwd, 600 rows, one block) in the engines' CUDA code
    paths stay at what 2026-12-04 left (each one drains the GPU's queue; they were 7-19 for the
    torch engine and 8-506 for the attention engine before: one read for the input checks of
    every level, none per class group or block in the attention engine's official positives,
    three for the torch engine's official setup), less 2026-12-05's: no index list per partial
    level in the class sums, no read of the key side's coefficient signs; less 2026-12-06's:
    the attention engine's logit bound from the input checks' read, and the torch engine's
    every-key-visible fact from the levels. A new read makes
    this fail on purpose: count it in bench/dispatch_count.py --as-cuda --syncs and raise the
    number here if it must be."""
    calls = _cuda_forms_calls(monkeypatch, backend, variant, levels, syncs=True)
    assert 0 < sum(calls.values()) <= most, calls.most_common(8)


def _class_sums_over_level_rows(z, lv, scale, include_self, coef):
    """The exact variant's class-sum term computed over each level's own rows (an index list
    of them, as ``class_sum_term`` did before its sync-free form): the numbers to match."""
    pos = torch.zeros(lv.gid.shape, dtype=torch.float64)
    dz = torch.zeros_like(z)
    delta = 0.0 if include_self else 1.0
    sq = (z * z).sum(1)
    scale_z = torch.as_tensor(scale, dtype=z.dtype).to(torch.float64)
    for lev in range(lv.gid.shape[0]):
        rows = (lv.gid[lev] >= 0).nonzero().squeeze(1)
        g, zr = lv.gid[lev, rows], z[rows]
        sums = torch.zeros(lv.n_groups[lev], z.shape[1], dtype=z.dtype).index_add_(0, g, zr)
        size = lv.n_pos[lev, rows].double() + delta
        mean_dot = (zr * (sums[g] / size.to(z.dtype)[:, None])).sum(1, dtype=torch.float64)
        pos[lev, rows] = (mean_dot * size - delta * sq[rows].double()) * scale_z
        c = coef[lev, rows].to(z.dtype)
        acc = torch.zeros_like(sums).index_add_(0, g, zr * c[:, None])
        dz.index_add_(0, rows, c[:, None] * (sums[g] - 2.0 * delta * zr) + acc[g], alpha=scale)
    return pos, dz


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("include_self", [True, False])
def test_class_sums_of_partial_levels_read_nothing_and_match_the_level_rows(dtype,
                                                                            include_self):
    """Levels that leave rows out (the other levels' prototypes, a pooled level) take every
    row into their class sums, the rows outside in a spare group, instead of a ``nonzero``
    index list per level and pass (a host sync on CUDA, in the middle of the loss: six per
    three-level loss). Bit for bit the numbers of the index-list form, including the pos of
    rows outside a level (0) and their dz (0, whatever coefficient they carry)."""
    from hiertail_fast.ops._loss_terms import class_sum_term, make_levels
    from tests.conftest import load_bench

    dispatch_count = load_bench("bench_dispatch_count_class_sums", "dispatch_count.py")
    gen = torch.Generator().manual_seed(3)
    n = 240
    z = (torch.randn(n, 6, generator=gen) * 4).to(dtype)
    level_rows = []
    for share in (1.0, 0.7, 0.3):      # a full level, two partial ones (one with singletons)
        rows = (torch.rand(n, generator=gen) < share).nonzero().squeeze(1)
        labels = torch.randint(0, 3 if share > 0.5 else 60, (rows.numel(),), generator=gen)
        level_rows.append((rows, labels))
    lv = make_levels(n, level_rows, include_self, dtype, "cpu")
    assert lv.full == [True, False, False]
    coef = torch.randn(3, n, generator=gen, dtype=dtype)     # nonzero outside the levels too
    want_pos, want_dz = _class_sums_over_level_rows(z, lv, 0.3, include_self, coef)
    counter = dispatch_count._Counter(syncs=True)
    with counter:
        pos, dz = class_sum_term(z, lv, 0.3, include_self, coef)
        pos_only, none = class_sum_term(z, lv, 0.3, include_self)
        no_pos, dz_only = class_sum_term(z, lv, 0.3, include_self, coef, need_pos=False)
    assert not counter.calls, counter.calls
    assert none is None and no_pos is None and torch.equal(dz_only, want_dz)
    for got in (pos, pos_only):
        assert torch.equal(got.view(torch.int64), want_pos.view(torch.int64))   # bitwise
    assert torch.equal(dz, want_dz)
    outside = lv.gid < 0
    assert outside[1:].any() and (pos[outside] == 0).all()
    # the rows outside spread over the spare groups (CUDA's atomics) or all in one: the same
    import hiertail_fast.ops._loss_terms as loss_terms
    spares = loss_terms.SPARE_GROUPS
    try:
        loss_terms.SPARE_GROUPS = 1
        one_pos, one_dz = class_sum_term(z, lv, 0.3, include_self, coef)
    finally:
        loss_terms.SPARE_GROUPS = spares
    assert torch.equal(one_pos.view(torch.int64), pos.view(torch.int64))
    assert torch.equal(one_dz, dz)


@pytest.mark.parametrize("backend", ["torch", "attention"])
@pytest.mark.parametrize("variant", ["exact", "official"])
@pytest.mark.parametrize("levels", [1, 3])
def test_no_loss_makes_a_tensor_from_host_data_in_the_cuda_forms(monkeypatch, backend, variant,
                                                               levels):
    """torch.tensor(values, device=cuda) (and as_tensor of a number) is a blocking copy:
    cudaMemcpyAsync, then cudaStreamSynchronize, so the host waits for every kernel queued
    before it, as a scalar read does. The exact variant made one after its LSE kernels (the
    class sums' scale as a device tensor), and every loss one per call for the level sizes;
    the torch engine one for a -inf constant, the official positives for flags. None now
    (Python floats, fills: ``_host_reads.device_values``); a new one fails this."""
    calls = _cuda_forms_calls(monkeypatch, backend, variant, levels, syncs=True)
    assert not [k for k in calls if k[0].endswith("[H2D]")], calls.most_common(12)


def test_the_counter_counts_tensors_from_host_data_in_the_cuda_forms(tmp_path):
    """bench/dispatch_count.py counts a Python value made into a tensor (lift_fresh: a
    torch.tensor of host data, or an item assignment's value) as a host sync in the CUDA
    forms (on CUDA torch.tensor(data, device=cuda) is a blocking copy), not in the CPU ones."""
    import importlib.util

    from tests.conftest import load_bench

    dispatch_count = load_bench("bench_dispatch_count_lift", "dispatch_count.py")
    probe = tmp_path / "hiertail_fast_probe.py"
    probe.write_text("import torch\n\n"
                     "def made():\n    return torch.tensor([1.0, 2.0])\n\n"
                     "def assigned():\n    t = torch.zeros(3)\n    t[1] = 5.0\n    return t\n")
    spec = importlib.util.spec_from_file_location("hiertail_fast_probe", probe)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    counted = {}
    for name in ("made", "assigned"):
        for forms in (False, True):
            counter = dispatch_count._Counter(syncs=True)
            with host_reads.cuda_code_paths() if forms else contextlib.nullcontext(), counter:
                getattr(mod, name)()
            counted[name, forms] = sum(k for (n, _), k in counter.calls.items()
                                       if n.endswith("[H2D]"))
    assert counted == {("made", False): 0, ("made", True): 1, ("assigned", False): 0,
                       ("assigned", True): 1}


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.int64, torch.bool])
def test_device_values_equal_torch_tensor_in_both_forms(dtype):
    """``device_values``: torch.tensor's tensor, made with one fill per value and no tensor from
    host data in the CUDA forms (where torch.tensor(..., device=cuda) would block)."""
    from tests.conftest import load_bench

    dispatch_count = load_bench("bench_dispatch_count_values", "dispatch_count.py")
    values = [True, False, True] if dtype == torch.bool else [3, 0, 70]
    want = torch.tensor(values, dtype=dtype)
    for forms in (False, True):
        counter = dispatch_count._Counter()
        with host_reads.cuda_code_paths() if forms else contextlib.nullcontext(), counter:
            got = host_reads.device_values(values, dtype, "cpu")
        assert got.dtype == dtype and torch.equal(got, want)
        lifted = sum(k for (n, _), k in counter.calls.items() if n.startswith("lift_fresh"))
        assert lifted == (0 if forms else 1)
    assert host_reads.device_values([], torch.float32, "cpu").shape == (0,)


@pytest.mark.parametrize("backend,levels,most", [
    ("torch", 1, 119), ("torch", 3, 236), ("attention", 1, 110), ("attention", 3, 198)])
def test_kernel_launches_per_exact_loss_in_the_cuda_forms(monkeypatch, backend, levels, most):
    """Calls that launch a kernel on CUDA (not views, not allocations) per exact loss,
    fwd+bwd, in the engines' CUDA code paths (the attention engine with its CPU kernel here):
    what 2026-12-05 left (session 58: a level of every row writes its tables in place, with
    no fill and no index kernel; the count no longer takes torch.empty for a launch; the
    attention key side no longer retests the LSE's finiteness that its gradient had tested).
    A 20k-row loss on an H200 spent more time launching kernels than running them (a bf16
    profile, 2026-11-27: 1.6 ms of kernels in a 4.3 ms step, 203 launches). Before: 133 / 274
    / 141 / 257 (2f5126b; and two blocking host-to-device copies, each a copy launch on CUDA,
    which the CPU count did not see, replaced by fills): the class sums form their [L, N]
    terms once for all levels, the attention engine tests its keys once and shares them
    between its calls, isfinite (four kernels) became |x| < inf (two) in every engine; on the
    new count 124 / 232 / 118 / 201 before session 58. Three levels 232 -> 236 in session 61:
    the level-specific keys' v in float64 (their fp32 form was an ulp of a prototype's lead
    off; test_a_levels_prototypes_far_above_every_node_row): the log-weights once, the rest
    dots in each pass, p back to fp32 in the gradient's. The attention engine's 106 / 194 ->
    110 / 198 in session 71: its gradient takes g / max|g| (upstream gradients of ~1e-39 were
    up to 28x off). A new launch fails this on purpose: count it with
    bench/dispatch_count.py --as-cuda and raise the number."""
    from tests.conftest import load_bench

    dispatch_count = load_bench("bench_dispatch_count_launches", "dispatch_count.py")
    calls = _cuda_forms_calls(monkeypatch, backend, "exact", levels, syncs=False)
    launches = dispatch_count.launches_of(calls)
    assert 0 < launches <= most, calls.most_common(10)


def test_a_hiertail_epoch_makes_no_tensor_from_host_data_in_the_cuda_forms():
    """The whole training epoch (bench/dispatch_count.py --epoch: model, pooling, graph caches,
    losses, Adam) in the CUDA code paths: no Python value made into a tensor (before: the
    losses' level sizes and scale, and x[idx] = True in the graph's self-loop cache, the
    propagation's stored diagonal, the training labels' duplicate check and the nearest
    prototype's tie rule, now index_fill_)."""
    from tests.conftest import load_bench

    dispatch_count = load_bench("bench_dispatch_count_epoch", "dispatch_count.py")
    with host_reads.cuda_code_paths():
        calls = dispatch_count.count_step(dispatch_count.epoch_step(600), syncs=True)
    assert sum(calls.values()) > 0
    assert not [k for k in calls if k[0].endswith("[H2D]")], calls.most_common(12)


def test_launch_count_leaves_out_views_and_allocations():
    """bench/dispatch_count.launches_of: a view (a tensor header) and an allocation
    (torch.empty: the caching allocator, no kernel) launch nothing on CUDA; a fill, a copy
    and arithmetic each launch one."""
    from tests.conftest import load_bench

    dispatch_count = load_bench("bench_dispatch_count_allocs", "dispatch_count.py")

    def step():
        t = torch.empty(4, 3)               # allocation
        t.fill_(1.0)                        # launch
        u = t[1:].t()                       # two views
        torch.zeros(2)                      # launch (a fill)
        return (u * 2.0).clone()            # two launches

    calls = dispatch_count.count_step(step)
    assert dispatch_count.launches_of(calls) == 4, calls
    assert dispatch_count.views_of(calls) == 2


@pytest.mark.parametrize("include_self", [True, False])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_a_level_of_every_row_in_order_builds_the_tables_of_its_index_list(include_self,
                                                                           dtype):
    """make_levels with rows None (every row, in order: written in place, no fill, no index
    kernel) builds the tables, bit for bit, that the level's index list arange(N) builds;
    beside an index-list level, and alone (no fill at all: every entry written)."""
    from hiertail_fast.ops._loss_terms import make_levels

    gen = torch.Generator().manual_seed(7)
    n = 50
    labels = torch.randint(0, 6, (n,), generator=gen) * 3 - 4          # negative, gaps
    rows2 = torch.randperm(n, generator=gen)[:20]
    labels2 = torch.randint(0, 4, (20,), generator=gen)
    for levels in ([labels], [labels, labels2]):
        extra = [(rows2, labels2)] if len(levels) == 2 else []
        got = make_levels(n, [(None, labels), *extra], include_self, dtype, "cpu", n_common=n)
        want = make_levels(n, [(torch.arange(n), labels), *extra], include_self, dtype,
                           "cpu", n_common=n)
        for field in ("log_w", "gid", "n_pos", "contrib", "n_distinct"):
            assert torch.equal(getattr(got, field), getattr(want, field)), field
        assert (got.n_groups, got.full, got.n_common) == (want.n_groups, want.full, n)
        assert got.full[0] and got.gid[0].min() == 0


@pytest.mark.parametrize("hierarchical", [False, True])
@pytest.mark.parametrize("variant", ["exact", "official"])
def test_a_learnable_temperature_is_read_with_the_input_checks(monkeypatch, hierarchical,
                                                               variant):
    """A tensor temperature's value is read once, in the checks' one ``tolist`` (a read of a
    CUDA tensor is a host sync: the checks and ``_temperature_link`` each read it, two syncs a
    call more than a float temperature). The loss and both gradients are those of the float
    temperature's call with the tensor's value, bit for bit (and its dtau, from its own pass)."""
    from hiertail_fast import balanced_contrastive_loss, hierarchical_contrastive_loss
    from tests.conftest import load_bench

    dispatch_count = load_bench("bench_dispatch_count_tau_read", "dispatch_count.py")
    gen = torch.Generator().manual_seed(5)
    z = torch.randn(300, 8, generator=gen, requires_grad=True)
    y = torch.randint(0, 7, (300,), generator=gen)
    protos = torch.randn(7, 8, generator=gen, requires_grad=True)

    def loss(tau):
        if hierarchical:
            return hierarchical_contrastive_loss(z, [y, y % 3], [protos, None], temperature=tau,
                                                 variant=variant)
        return balanced_contrastive_loss(z, y, prototypes=protos, temperature=tau,
                                         variant=variant)

    tau = torch.tensor(0.3, requires_grad=True)
    reads = []
    real_tolist = torch.Tensor.tolist
    monkeypatch.setattr(torch.Tensor, "tolist", lambda t: reads.append(t.numel())
                        or real_tolist(t))
    counter = dispatch_count._Counter(syncs=True)
    with counter:
        out = loss(tau)
    monkeypatch.undo()
    scalar_reads = [where for (name, where), k in counter.calls.items()
                    if name == "_local_scalar_dense"]
    assert not any(w.startswith(("_validation/", "balanced_contrastive_loss.py"))
                   for w in scalar_reads), scalar_reads
    n_levels = 2 if hierarchical else 1
    assert reads[0] == 1 + 1 + n_levels + 1          # z, the prototypes, the labels, tau
    out.backward()
    grads = z.grad.clone(), protos.grad.clone()
    assert tau.grad is not None and torch.isfinite(tau.grad)
    z.grad = protos.grad = None
    expected = loss(float(tau.detach()))
    expected.backward()
    assert torch.equal(out.detach(), expected.detach())
    assert torch.equal(grads[0], z.grad) and torch.equal(grads[1], protos.grad)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="a CPU temperature beside CUDA rows")
def test_a_cpu_temperature_beside_cuda_rows_is_read_on_its_own():
    """A tensor temperature on another device than z is read by itself (copied to z's
    device, its copy would wait for the device as a read does); the loss is the float's."""
    from hiertail_fast import balanced_contrastive_loss

    gen = torch.Generator().manual_seed(6)
    z = torch.randn(200, 8, generator=gen).cuda()
    y = torch.randint(0, 5, (200,), generator=gen).cuda()
    tau = torch.tensor(0.25, requires_grad=True)
    out = balanced_contrastive_loss(z, y, temperature=tau)
    assert torch.equal(out, balanced_contrastive_loss(z, y, temperature=0.25))


@pytest.mark.parametrize("grad", [False, True])
@pytest.mark.parametrize("variant", ["exact", "official"])
def test_the_torch_engine_takes_every_keys_visibility_from_the_levels(monkeypatch, grad,
                                                                      variant):
    """Whether every key is visible in every level comes to the torch engine from the levels
    (``Levels.full``), not from a read of log_w (a host sync on CUDA, in every call): the
    fact given equals the read, for levels with and without their own rows, forward only and
    with the gradient's pass."""
    from hiertail_fast import balanced_contrastive_loss, hierarchical_contrastive_loss
    from hiertail_fast.ops import _lse_torch
    from hiertail_fast.ops._finite import finite

    given = []
    real = _lse_torch._engine

    def engine(z, log_w, *args, all_visible=None, **kw):
        given.append((all_visible, bool(finite(log_w).all())))
        return real(z, log_w, *args, all_visible=all_visible, **kw)

    monkeypatch.setattr(_lse_torch, "_engine", engine)
    gen = torch.Generator().manual_seed(8)
    z = torch.randn(120, 6, generator=gen, requires_grad=grad)
    y = torch.randint(0, 6, (120,), generator=gen)
    protos = torch.randn(6, 6, generator=gen)
    calls = [
        lambda: balanced_contrastive_loss(z, y, variant=variant, backend="torch"),
        lambda: balanced_contrastive_loss(z, y, prototypes=protos, variant=variant,
                                          backend="torch"),
        lambda: balanced_contrastive_loss(z, y, prototypes=protos, variant=variant,
                                          backend="torch", reduction="none").sum(),
        lambda: hierarchical_contrastive_loss(z, [y, y % 2], [None, None], variant=variant,
                                              backend="torch"),
        lambda: hierarchical_contrastive_loss(z, [y, y % 2], [protos, protos[:2]],
                                              variant=variant, backend="torch"),
    ]
    with torch.set_grad_enabled(grad):
        for call in calls:
            out = call()
            if grad:
                out.backward()
    assert {read for _, read in given} == {True, False}, given      # both kinds were seen
    assert all(fact is read for fact, read in given), given
