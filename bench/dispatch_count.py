"""Count the torch operator calls (aten dispatches) of one loss forward + backward, and where
in the library they come from: the per-call overhead of the CPU engine is paid per dispatch,
so this is the count behind docs/LOSS.md's "small torch calls per loss". A count, not a timing.

    python bench/dispatch_count.py --levels 3 --variant official --top 15
    python bench/dispatch_count.py --n 20000 --levels 1 --as-cuda      # CUDA's engine paths
    python bench/dispatch_count.py --n 20000 --levels 1 --as-cuda --syncs --variant official
    python bench/dispatch_count.py --epoch 10000 --as-cuda --syncs --top 20   # a HierTail epoch
    python bench/dispatch_count.py --n 600 --variant exact --backend attention --as-cuda \
        --emulate-attention --dtype bfloat16      # the bf16 flash branch, kernels not counted

Each total also says how many of its calls launch a kernel on CUDA: not views
(``OpOverload.is_view``: a view makes a tensor header, host work only) and not allocations
(``ALLOCATIONS``: ``torch.empty`` takes memory from the caching allocator, no kernel; counted as
launches until 2026-12-05, session 58: eight of the exact single level's 129).
``--as-cuda`` counts, on this CPU, the calls the torch engine makes for CUDA tensors, where
every call that is neither a view nor an allocation is a kernel launch: no C kernels, no
symmetric engine, CUDA's block budget with no row cap, the sync-free forms of the engines'
data-dependent shortcuts (``_host_reads``), the whole-band positives (``HIERTAIL_POSITIVES``;
``--positives slices`` for the per-group plan CUDA ran before). ``--syncs`` counts only the
calls that make a CUDA host wait for the device (``SYNC_OPS``: a scalar read, nonzero,
unique, ...; indexing with a boolean mask; ``tolist()`` of a library tensor, which runs no
operator on CPU; a Python value made into a tensor, ``lift_fresh[H2D]``: on CUDA
``torch.tensor(data, device=cuda)`` is a blocking host-to-device copy): each one drains the
GPU's queue of launched kernels.
"""
from __future__ import annotations

import argparse
import collections
import contextlib
import sys
import traceback
from pathlib import Path

import torch
from torch.utils._python_dispatch import TorchDispatchMode

sys.path.insert(0, str(Path(__file__).parent))
import loss_grid  # noqa: E402
from loss_grid import REGIMES, loss_step, make_case  # noqa: E402

from hiertail_fast._argparse import positive, temperature_arg
from hiertail_fast.ops import _host_reads as host_reads

# operators that make a CUDA host wait for the device (their result's size or value is read)
SYNC_OPS = frozenset({"_local_scalar_dense", "nonzero", "_unique2", "unique_dim",
                      "unique_consecutive", "masked_select", "repeat_interleave",
                      "bincount"})  # (one call, two syncs on CUDA: its input's min and max)
_INDEXING = frozenset({"index", "index_put", "index_put_", "_index_put_impl_"})
# a Python value made into a tensor (torch.tensor / as_tensor of numbers or lists; the value
# of an item assignment x[i] = v): torch.tensor(data, device=cuda) is copied with
# cudaMemcpyAsync + cudaStreamSynchronize (PyTorch's blocking host-to-device copy), a wait for
# every kernel queued before it like a scalar read, and an item assignment's 0-d CPU value
# may be copied the same way (not measured). Counted in the CUDA code paths only (--as-cuda:
# the CPU paths make CPU tensors from host data on purpose, ``_host_reads.device_values``).
_FROM_HOST_DATA = frozenset({"lift_fresh", "lift_fresh_copy"})


def _syncs(name: str, args) -> str | None:
    """The name to count a host-syncing call under, or None if the call does not sync."""
    if name in SYNC_OPS:
        return name
    if name in _FROM_HOST_DATA and host_reads.FORCE_SYNC_FREE:
        return name + "[H2D]"      # torch.tensor(data, device=cuda): a blocking copy
    if name in _INDEXING and any(isinstance(t, torch.Tensor) and t.dtype == torch.bool
                                 for t in args[1] if t is not None):
        return name + "[bool]"                 # a boolean mask: nonzero inside
    return None


def _site(frame: traceback.FrameSummary) -> str:
    """``file.py:line`` of a library frame, the file named with its folder inside a private
    package (``_validation/losses.py``: the public ``losses.py`` is another file)."""
    path = Path(frame.filename)
    name = f"{path.parent.name}/{path.name}" if path.parent.name.startswith("_") else path.name
    return f"{name}:{frame.lineno}"


class _Counter(TorchDispatchMode):
    """Counts every dispatched operator (only the host-syncing ones with `syncs`) by (name, the
    innermost library source line)."""

    def __init__(self, syncs: bool = False):
        super().__init__()
        self.calls: collections.Counter = collections.Counter()
        self.views: set[str] = set()     # the names of view operators (no kernel, no launch)
        self.syncs = syncs

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        name = func.overloadpacket.__name__
        if self.syncs:
            name = _syncs(name, args)
        elif func.is_view:
            self.views.add(name)
        if name is not None:
            frames = [f for f in traceback.extract_stack() if "hiertail_fast" in f.filename]
            where = _site(frames[-1]) if frames else "-"
            self.calls[(name, where)] += 1
        return func(*args, **(kwargs or {}))


def count(n: int, d: int, levels: int, variant: str, regime: str, tau: float, backend: str,
          syncs: bool = False, dtype: torch.dtype = torch.float32):
    z, ys, ps = make_case(regime, n, d, levels)
    z, ps = z.to(dtype), [p.to(dtype) for p in ps]
    return count_step(loss_step(backend, z, ys, ps, tau, variant), syncs)


def _emulated_attention():
    """The attention engine's CUDA branches on CPU tensors (``loss_golden.emulated_attention``),
    its stand-in kernels run with the counter paused: the calls counted are the engine's own,
    around kernels that count as none."""
    import loss_golden

    def quiet(fake):
        def kernel(*args, **kwargs):
            with torch.utils._python_dispatch._disable_current_modes():
                return fake(*args, **kwargs)
        return kernel

    return loss_golden.emulated_attention(quiet)

EPOCH_MIN_NODES = 70        # the epoch's graph has 70 classes (bench/scale.py's), a node each


def epoch_step(nodes: int):
    """One HierTail training epoch of ``bench/scale.py``'s defaults (paper config, 70 classes,
    degree 10, 128 features, hidden 128; ``epoch_ab.epoch_step``): zero_grad, forward, loss,
    backward, Adam step, the loss read once."""
    import types

    from epoch_ab import epoch_step as ab_epoch_step

    import hiertail_fast

    args = types.SimpleNamespace(classes=EPOCH_MIN_NODES, avg_degree=10.0, features=128,
                                 hidden=128, seed=0, config="paper")
    return ab_epoch_step(hiertail_fast, nodes, args)


def count_step(step, syncs: bool = False):
    """The calls of one ``step()`` after a warm-up call (caches, lazy imports), by (name, the
    innermost library source line); with ``syncs`` only the host-syncing ones, and the
    library's ``tolist()`` reads."""
    step()                                            # warm-up: caches, lazy imports
    counter = _Counter(syncs)
    real_tolist = torch.Tensor.tolist

    def tolist(self):
        # a CPU tensor's tolist() runs no operator (on CUDA: a device-to-host copy, a sync)
        with torch.utils._python_dispatch._disable_current_modes():
            frames = [f for f in traceback.extract_stack() if "hiertail_fast" in f.filename]
        if frames:
            where = _site(frames[-1])
            counter.calls[("tolist", where)] += 1
        return real_tolist(self)

    if syncs:
        torch.Tensor.tolist = tolist
    try:
        with counter:
            step()
    finally:
        torch.Tensor.tolist = real_tolist
    calls = counter.calls
    calls.views = counter.views
    return calls


# operators that only allocate (no kernel on CUDA: the caching allocator's host work)
ALLOCATIONS = frozenset({"empty", "empty_strided", "empty_like", "new_empty",
                         "new_empty_strided"})


def launches_of(calls: collections.Counter) -> int:
    """How many of ``count``'s calls launch a kernel on CUDA (or sync): neither views nor
    allocations."""
    allocs = sum(k for (name, _), k in calls.items() if name in ALLOCATIONS)
    return sum(calls.values()) - views_of(calls) - allocs


def views_of(calls: collections.Counter) -> int:
    """How many of ``count``'s calls are views (a new tensor header over the same memory: host
    work, no kernel on CUDA; ``launches_of`` also leaves out the allocations)."""
    names = getattr(calls, "views", set())
    return sum(k for (name, _), k in calls.items() if name in names)


@contextlib.contextmanager
def _as_cuda(positives: str = "band", block_bytes: int | None = None):
    """While inside: the engine configured as for CUDA tensors (``_host_reads.cuda_code_paths``
    with the positives' plan `positives`, CUDA's block budget, or `block_bytes`, with no row
    cap)."""
    import hiertail_fast.ops._lse_torch as lse_torch
    from hiertail_fast.ops._host_reads import cuda_code_paths

    rows = lse_torch.MAX_BLOCK_ROWS
    budget = lse_torch.CUDA_BLOCK_BYTES if block_bytes is None else block_bytes
    with cuda_code_paths({"HIERTAIL_POSITIVES": positives,
                          "HIERTAIL_CPU_BLOCK_BYTES": str(budget)}):
        lse_torch.MAX_BLOCK_ROWS = 1 << 62           # CUDA: the byte budget alone bounds a block
        try:
            yield
        finally:
            lse_torch.MAX_BLOCK_ROWS = rows


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=" ".join(__doc__.split("\n\n")[0].split()))
    parser.add_argument("--n", type=positive(int), default=6000)
    parser.add_argument("--d", type=positive(int), default=64)
    parser.add_argument("--levels", type=int, choices=[1, 3], default=3)
    parser.add_argument("--variant", choices=["exact", "official", "both"], default="both")
    parser.add_argument("--regime", choices=REGIMES, default="relu")
    parser.add_argument("--tau", type=temperature_arg, default=0.1)
    parser.add_argument("--backend", choices=(*loss_grid.BACKENDS, "triton", "reference"),
                        default="torch")
    parser.add_argument("--top", type=int, default=0, help="also list the N busiest call sites")
    parser.add_argument("--as-cuda", action="store_true",
                        help="the torch engine's CUDA configuration, counted on the CPU")
    parser.add_argument("--positives", choices=["band", "slices"],
                        help="--as-cuda: the official positives' path (default band)")
    parser.add_argument("--syncs", action="store_true",
                        help="count only the calls that make a CUDA host wait (SYNC_OPS)")
    parser.add_argument("--dtype", choices=["float32", "bfloat16"], default="float32",
                        help="the rows' dtype (bfloat16 with --emulate-attention: the flash "
                        "branch)")
    parser.add_argument("--emulate-attention", action="store_true",
                        help="--as-cuda: the attention engine's CUDA branches too, its kernels "
                        "emulated and not counted")
    parser.add_argument("--epoch", type=positive(int), metavar="NODES",
                        help="count one HierTail training epoch on a synthetic graph of NODES "
                        "nodes (bench/scale.py's model) instead of one loss; the loss options "
                        "do not apply")
    args = parser.parse_args(argv)
    torch.set_num_threads(1)
    variants = ["exact", "official"] if args.variant == "both" else [args.variant]
    if args.emulate_attention and not args.as_cuda:
        parser.error("--emulate-attention needs --as-cuda")
    if args.positives is not None and not args.as_cuda:   # (it was ignored, unsaid)
        parser.error("--positives needs --as-cuda")
    if args.epoch is not None and args.epoch < EPOCH_MIN_NODES:
        parser.error(f"--epoch needs at least {EPOCH_MIN_NODES} nodes (bench/scale.py's "
                     f"graph has {EPOCH_MIN_NODES} classes), got {args.epoch}")
    args.positives = args.positives or "band"
    with contextlib.ExitStack() as stack:
        if args.as_cuda:
            stack.enter_context(_as_cuda(args.positives))
        if args.emulate_attention:
            stack.enter_context(_emulated_attention())
        report = _report_epoch if args.epoch else lambda a: _report(a, variants)
        if args.as_cuda:     # CPU tensors through CUDA's code paths, on a GPU machine too
            report = loss_grid.on_device("cpu")(report)
        report(args)
    return 0


def _what(args, calls, unit: str) -> str:
    if args.syncs:
        return f"host-syncing calls per {unit}"
    return (f"operator calls per {unit} ({sum(calls.values()) - views_of(calls)} not views, "
            f"{launches_of(calls)} launch a kernel on CUDA)")


def _print_top(calls, top: int) -> None:
    for (name, where), k in calls.most_common(top):
        print(f"  {k:6d}  {name:24s} {where}")


def _report_epoch(args) -> None:
    calls = count_step(epoch_step(args.epoch), args.syncs)
    print(f"HierTail epoch, {args.epoch:,d} nodes{' (CUDA forms)' if args.as_cuda else ''}: "
          f"{sum(calls.values())} {_what(args, calls, 'epoch')}")
    _print_top(calls, args.top)


def _report(args, variants) -> None:
    for v in variants:
        calls = count(args.n, args.d, args.levels, v, args.regime, args.tau, args.backend,
                      args.syncs, getattr(torch, args.dtype))
        kernels = " (attention kernels emulated, not counted)" if args.emulate_attention else ""
        print(f"N={args.n} d={args.d} levels={args.levels} {v} {args.regime} tau={args.tau:g} "
              f"{args.dtype} backend={args.backend}{kernels}: {sum(calls.values())} "
              f"{_what(args, calls, 'loss')}")
        _print_top(calls, args.top)


if __name__ == "__main__":
    raise SystemExit(main())
