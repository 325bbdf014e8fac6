"""The contrastive loss under torch.compile: first-call time, graphs, steady per-call time.

    python bench/compile_time.py [--n 2000] [--d 64] [--variant official] [--repeats 3]
                                 [--json docs/results/compile_time.json]

Modes, each in a fresh Python process (every mode pays the same imports and compiler
warm-up), run round-robin ``--repeats`` times (medians reported):

* ``eager``: no compiler.
* ``custom-op``: ``torch.compile`` as shipped, the loss one opaque custom op
  (``hiertail_fast/ops/_custom_ops.py``), with ``fullgraph=True``.
* ``traced``: ``torch.compile`` tracing into the loss's Python dispatch, as before the custom
  op (``_custom_ops.READY`` set False; ``fullgraph=True`` fails there, so without it).

for the ``aot_eager`` and ``inductor`` compiler backends. The function compiled is one training
step's loss: ``normalize(x @ W)`` then the balanced contrastive loss, forward + backward.
First call = tracing + compiling + one step; steady = median of ``--steps`` further steps.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

from hiertail_fast._argparse import positive

sys.path.insert(0, str(Path(__file__).parent))
from _results import check_targets, write_result  # noqa: E402

MODES = [("eager", None), ("custom-op", "aot_eager"), ("traced", "aot_eager"),
         ("custom-op", "inductor"), ("traced", "inductor")]


def worker(mode: str, compiler: str | None, n: int, d: int, variant: str, steps: int) -> dict:
    import torch

    from hiertail_fast import balanced_contrastive_loss
    from hiertail_fast.ops import _custom_ops

    gen = torch.Generator().manual_seed(0)
    x = torch.randn(n, d, generator=gen)
    y = torch.randint(0, 10, (n,), generator=gen)
    w = (torch.randn(d, d, generator=gen) / d ** 0.5).requires_grad_()

    def step(x, y):
        z = torch.nn.functional.normalize(x @ w, dim=1)
        return balanced_contrastive_loss(z, y, variant=variant)

    graphs = []
    fn = step
    if mode != "eager":
        _custom_ops.READY = mode == "custom-op"
        inner = torch._dynamo.lookup_backend(compiler)

        def backend(gm, example_inputs):
            graphs.append(gm)
            return inner(gm, example_inputs)
        fn = torch.compile(step, backend=backend, fullgraph=mode == "custom-op")

    def once():
        w.grad = None
        fn(x, y).backward()

    t0 = time.perf_counter()
    once()
    first = time.perf_counter() - t0
    times = []
    for _ in range(steps):
        t0 = time.perf_counter()
        once()
        times.append(time.perf_counter() - t0)
    return {"mode": mode, "compiler": compiler, "first_call_s": first,
            "steady_s": statistics.median(times), "graphs": len(graphs)}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=" ".join(__doc__.split("\n\n")[0].split()))
    ap.add_argument("--n", type=positive(int), default=2000)
    ap.add_argument("--d", type=positive(int), default=64)
    ap.add_argument("--variant", default="official", choices=["exact", "official"])
    ap.add_argument("--steps", type=positive(int), default=5)
    ap.add_argument("--repeats", type=positive(int), default=3)
    ap.add_argument("--modes", default=None,
                    help="comma-separated mode:compiler pairs (default: all five)")
    ap.add_argument("--json", default=None, help="write the results here (atomically)")
    ap.add_argument("--worker", nargs=2, metavar=("MODE", "COMPILER"), help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.worker:
        mode, compiler = args.worker
        print(json.dumps(worker(mode, None if compiler == "-" else compiler, args.n, args.d,
                                args.variant, args.steps)))
        return 0
    pairs = [] if args.modes is None else [p.split(":") for p in args.modes.split(",")]
    known = {f"{m}:{c or '-'}" for m, c in MODES}
    bad = [":".join(p) for p in pairs if len(p) != 2 or f"{p[0]}:{p[1] or '-'}" not in known]
    if bad:         # (an unknown mode ran the traced path under its name; no colon: traceback)
        ap.error(f"--modes: {', '.join(bad)} not among {', '.join(sorted(known))}")
    if args.json:   # before the fresh processes' minutes, not after them
        check_targets(ap, "--json", Path(args.json))
    modes = [(m, None if c in ("", "-") else c) for m, c in pairs] or MODES
    runs: dict[tuple, list[dict]] = {m: [] for m in modes}
    for r in range(args.repeats):
        for mode, compiler in modes:              # round-robin: a slow spell hits every mode
            cmd = [sys.executable, __file__, "--worker", mode, compiler or "-", "--n",
                   str(args.n), "--d", str(args.d), "--variant", args.variant, "--steps",
                   str(args.steps)]
            out = subprocess.run(cmd, capture_output=True, text=True, check=True)
            runs[(mode, compiler)].append(json.loads(out.stdout.strip().splitlines()[-1]))
            print(f"repeat {r + 1}/{args.repeats} {mode} {compiler or ''} done", file=sys.stderr)
    eager_steady = statistics.median(x["steady_s"] for x in runs[("eager", None)]) \
        if ("eager", None) in runs else None
    rows = []
    print(f"\nN = {args.n}, d = {args.d}, {args.variant}, fwd+bwd; medians of {args.repeats} "
          f"fresh processes; load {os.getloadavg()[0]:.2f}")
    print("| mode | compiler | first call (s) | graphs | steady step (ms) | vs eager |")
    print("|---|---|---|---|---|---|")
    for (mode, compiler), xs in runs.items():
        row = {"mode": mode, "compiler": compiler,
               "first_call_s": statistics.median(x["first_call_s"] for x in xs),
               "steady_s": statistics.median(x["steady_s"] for x in xs),
               "graphs": xs[0]["graphs"], "runs": xs}
        rows.append(row)
        ratio = f"{row['steady_s'] / eager_steady:.2f}x" if eager_steady else "-"
        print(f"| {mode} | {compiler or '-'} | {row['first_call_s']:.2f} | {row['graphs']} | "
              f"{1e3 * row['steady_s']:.1f} | {ratio} |")
    if args.json:
        import torch

        write_result(Path(args.json), json.dumps({
            "n": args.n, "d": args.d, "variant": args.variant, "steps": args.steps,
            "repeats": args.repeats, "torch": torch.__version__, "rows": rows}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
