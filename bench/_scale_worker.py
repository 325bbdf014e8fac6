"""One (method, size) run of bench/scale.py, in the fresh subprocess that ``scale.py --worker``
starts: builds the synthetic graph, the model and its optimiser, times the training epochs and
measures their peak memory (see the scale.py docstring for what peak_memory_bytes means).

A harness baseline (any ``hiertail_fast.baselines.METHODS`` name) trains as
``python -m hiertail_fast.train --method NAME`` does: its epoch is one step on
``train_loss()`` (default `BaselineConfig`, --hidden). A baseline with stages after the loop
(``after_fit``: LTE4G's prototypes, experts and students) runs them once after the timed epochs,
with one epoch per stage loop (`ONCE_SCHEDULE`): their seconds are ``once_seconds`` and their
memory counts in the peak."""
from __future__ import annotations

import math
import re
import statistics
import time

RUN_SECONDS = 120.0  # timed epochs stop once this much is spent (at least one)
OWN_METHODS = ("hiertail", "hiertail-reference", "gcn")
ONCE_SCHEDULE = {"expert_ep": 1, "curriculum_ep": 1}   # the after-loop stages: 1 epoch per loop


def _proc_status_bytes(field: str) -> int:
    with open("/proc/self/status") as fh:
        return int(re.search(rf"{field}:\s+(\d+) kB", fh.read()).group(1)) * 1024


def _reset_peak_rss() -> bool:
    """Reset the kernel's resident high-water mark (VmHWM) to the current RSS (Linux >= 4.0)."""
    try:
        with open("/proc/self/clear_refs", "w") as fh:
            fh.write("5")
        return True
    except OSError:
        return False


def _tracked_peak(step) -> int:
    """Peak live bytes of torch's CPU allocator during `step()` above those live at its start.
    The profiler records no free of a block allocated before it started (torch warns so): such
    a block freed in `step` (the gradients zero_grad(set_to_none=True) drops) stays counted."""
    from torch._C._profiler import _EventType
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
        step()
    sizes: list[tuple[int, int]] = []
    stack = list(prof.profiler.kineto_results.experimental_event_tree())
    while stack:
        node = stack.pop()
        if node.tag == _EventType.Allocation and node.extra_fields.device.type == "cpu":
            sizes.append((node.start_time_ns, node.extra_fields.alloc_size))  # < 0: a free
        stack.extend(node.children)
    live = peak = 0
    for _, nbytes in sorted(sizes):
        live += nbytes
        peak = max(peak, live)
    return peak


def build_model(method: str, in_channels: int, num_classes: int, spec: dict):
    """(model, loss(model output, y, train_idx) -> scalar tensor) for one method."""
    import torch
    import torch.nn.functional as F

    if method == "gcn":
        from hiertail_fast.nn.conv import GCNConv

        class GCN(torch.nn.Module):
            def __init__(self) -> None:
                super().__init__()
                self.conv1 = GCNConv(in_channels, spec["hidden"], improved=True)
                self.conv2 = GCNConv(spec["hidden"], num_classes, improved=True)

            def forward(self, x, graph):
                return self.conv2(torch.relu(self.conv1(x, graph)), graph)

        return GCN(), lambda out, y, idx: F.cross_entropy(out[idx], y[idx])

    from hiertail_fast.nn.hiertail import HierTail, HierTailConfig

    backend = "reference" if method == "hiertail-reference" else None
    config = HierTailConfig.named(spec["config"], hidden=spec["hidden"], loss_backend=backend,
                                  loss_dtype=spec.get("loss_dtype"))
    model = HierTail(in_channels, num_classes, config)
    return model, lambda out, y, idx: model.loss(out, y, idx).total


def _malloc_trim() -> None:
    """Hand freed heap pages back to the OS (glibc), so the baseline RSS holds live data only."""
    try:
        import ctypes
        ctypes.CDLL("libc.so.6").malloc_trim(0)
    except (OSError, AttributeError):
        pass


def _baseline(method: str, x, y, graph, split, num_classes: int, spec: dict):
    """(model, its once-stages or None) of a harness baseline on this graph."""
    import torch

    from hiertail_fast.baselines import BaselineConfig, MethodContext, build_method
    from hiertail_fast.baselines.config import METHOD_FIELDS
    from hiertail_fast.baselines.methods import BaselineMethod

    once = {k: v for k, v in ONCE_SCHEDULE.items() if k in METHOD_FIELDS[method]}
    cfg = BaselineConfig(method=method, hidden=spec["hidden"], **once)
    ctx = MethodContext(x, y, graph, split[0], num_classes,
                        torch.Generator().manual_seed(spec["seed"]))
    model = build_method(ctx, cfg)
    if type(model).after_fit is BaselineMethod.after_fit:
        return model, None
    return model, lambda: model.after_fit(split[1], epochs=1)


def _setup(spec: dict, nodes: int):
    """Graph, model and optimiser of one run; returns (epoch function, edges, losses list,
    once-stages function or None)."""
    import warnings

    import torch

    from hiertail_fast.data.splits import natural_split
    from hiertail_fast.data.synthetic import make_synthetic_graph
    from hiertail_fast.nn.hiertail import prepare_graph

    device = torch.device(spec["device"])
    torch.manual_seed(spec["seed"])
    with warnings.catch_warnings():     # small sizes get fewer edges than asked: the CSV
        warnings.filterwarnings("ignore", message="make_synthetic_graph", category=UserWarning)
        data = make_synthetic_graph(nodes, spec["classes"], avg_degree=spec["avg_degree"],
                                    num_features=spec["features"], seed=spec["seed"])
    split = [t.to(device) for t in natural_split(data.y, spec["seed"])]
    train_idx = split[0]
    # as the official loader leaves it: symmetric, deduplicated, one unit self-loop a node
    graph = prepare_graph(data.edge_index, nodes).to(device)
    x, y = data.x.to(device), data.y.to(device)
    once = None
    if spec["method"] in OWN_METHODS:
        model, loss_fn = build_model(spec["method"], x.shape[1], int(data.num_classes), spec)
        forward = lambda: loss_fn(model(x, graph), y, train_idx)  # noqa: E731
    else:
        model, once = _baseline(spec["method"], x, y, graph, split, int(data.num_classes), spec)
        forward = lambda: model.train_loss()  # noqa: E731
    model = model.to(device=device, dtype=x.dtype).train()   # not the default dtype
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-3)
    losses: list[float] = []

    def epoch() -> None:
        model.train()
        optimizer.zero_grad(set_to_none=True)
        loss = forward()
        loss.backward()
        optimizer.step()
        losses.append(loss.item())  # .item() synchronises: the time includes the kernels

    return epoch, graph.num_edges - nodes, losses, once


def run_worker(spec: dict) -> dict:
    """One (method, size) run in this (fresh) process; returns the CSV row fields."""
    import gc

    import torch

    device = torch.device(spec["device"])
    if spec.get("threads"):
        torch.set_num_threads(spec["threads"])
    if device.type == "cpu" and spec["cpu_memory"] == "rss":
        # Prime: one epoch on a tiny graph faults in code pages, thread pools and lazily loaded
        # libraries (~170 MB of RSS on first use), so that the baseline below holds them.
        # (its degree capped: a dense --avg-degree, valid for the sizes, is not for 200 nodes)
        tiny = max(2 * spec["classes"], 200)
        primer = _setup(dict(spec, avg_degree=min(spec["avg_degree"], tiny / 2)), tiny)
        primer[0]()
        if primer[3] is not None:
            primer[3]()
        del primer
    gc.collect()
    _malloc_trim()
    baseline_rss = _proc_status_bytes("VmRSS")
    epoch, edges, losses, once = _setup(spec, spec["nodes"])
    gc.collect()
    _malloc_trim()  # drop the generator's freed temporaries from the resident set
    # the training device's queue (torch.cuda.synchronize() alone waits on the CURRENT
    # device: with cuda:1 trained and cuda:0 current, steps were timed before they ended)
    sync = (lambda: torch.cuda.synchronize(device)) if device.type == "cuda" else (lambda: None)
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)
    hwm_reset = _reset_peak_rss()
    times: list[float] = []
    warmed = 0
    for _ in range(spec["warmup"]):
        start = time.perf_counter()
        epoch()
        sync()
        if time.perf_counter() - start > spec.get("long_epoch_seconds", math.inf):
            # Longer than the cut-off the sweep predicted it to stay under: one-time costs are
            # noise at this length, so this epoch is the first timed one (no second warm-up).
            times.append(time.perf_counter() - start)
            break
        warmed += 1
    while len(times) < spec["epochs"] and (not times or sum(times) < RUN_SECONDS):
        sync()
        start = time.perf_counter()
        epoch()
        sync()
        times.append(time.perf_counter() - start)
    once_seconds = ""
    if once is not None:
        start = time.perf_counter()
        once()
        sync()
        once_seconds = time.perf_counter() - start
    name = "cpu"
    if device.type == "cuda":
        peak = torch.cuda.max_memory_allocated(device)
        name = f"cuda ({torch.cuda.get_device_name(device)})"
    elif spec["cpu_memory"] == "tracked":
        peak = _tracked_peak(epoch)
        if once is not None:
            peak = max(peak, _tracked_peak(once))
    else:  # without the reset, VmHWM is the whole process's peak: report it as such
        peak = _proc_status_bytes("VmHWM") - (baseline_rss if hwm_reset else 0)
    return {"edges": edges, "epoch_seconds": statistics.median(times),
            "peak_memory_bytes": int(peak), "device": name, "timed_epochs": len(times),
            "warmup_epochs": warmed, "once_seconds": once_seconds,
            "status": "ok" if all(map(math.isfinite, losses)) else "ok (non-finite loss)"}
