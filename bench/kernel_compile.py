"""Every Triton kernel of the package compiled for a GPU target, without a GPU: a pre-flight for
the next GPU run.

    python bench/kernel_compile.py                          # sm_80 and sm_90, this triton
    python bench/kernel_compile.py --arch 90 --out DIR      # DIR/kernel_compile.{json,md}

1. Capture: the ops run on small CPU tensors with ``backend="triton"`` under the interpreter
   (``TRITON_INTERPRET=1``, set here before triton is imported) and every kernel launch is
   recorded: the kernel, its arguments' types, its constexpr values, ``num_warps`` /
   ``num_stages``. The workload covers each kernel's switches: the GCN SpMM weighted or not,
   with or without self-loops, fp32 / fp64 accumulation, its edge-dot backward; top-k pooling's
   score, gather, filter, backward and unpool kernels; the nearest prototype; the loss's LSE
   forward / backward (exact, official with its relative mode, one and three levels, shared
   keys, key splits) and its positives kernel, in every input dtype the launchers take.
2. Compile (a subprocess pool with ``TRITON_INTERPRET=0``): each distinct launch goes through
   ``triton.compile`` for ``GPUTarget("cuda", arch, 32)``: Triton's front end, its GPU passes
   and the wheel's ptxas. That is where compiled-only failures surface (a dot shape or type
   the tensor-core lowering refuses, an operation the interpreter runs in numpy but the
   compiler does not take); the interpreter, which runs every other CPU test of the kernels,
   never compiles them.

What this does not show: timings, and the card's own limits at launch (shared memory per block
is printed beside the card's); the tiles are the ones the launchers pick for these small
shapes under the interpreter, while the loss's card-dependent tiles (``pair_blocks``, the
autotuner's) are ``bench/kernel_resources.py``'s. Exit code 1 if any launch failed to compile
or any workload call failed under the interpreter other than by a launcher's refusal.
"""
from __future__ import annotations

import os

if __name__ == "__main__":    # the capture runs the kernels interpreted: set before triton is
    os.environ["TRITON_INTERPRET"] = "1"     # imported (tests: conftest sets it)

import argparse  # noqa: E402
import importlib  # noqa: E402
import inspect  # noqa: E402
import json  # noqa: E402
import multiprocessing  # noqa: E402
import re  # noqa: E402
import sys  # noqa: E402
import time  # noqa: E402
from concurrent.futures import ProcessPoolExecutor  # noqa: E402
from pathlib import Path  # noqa: E402

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

from kernel_resources import _compile_mode, ast_source  # noqa: E402

from hiertail_fast._argparse import positive  # noqa: E402
from hiertail_fast._files import atomic_path, unwritable_dir_reason  # noqa: E402

_POINTER = {"float32": "fp32", "float64": "fp64", "float16": "fp16", "bfloat16": "bf16",
            "int64": "i64", "int32": "i32", "int16": "i16", "int8": "i8", "uint8": "u8",
            "bool": "i1"}
INT32_MAX = 2 ** 31 - 1
# the most shared memory one block may have, by compute capability (bytes; CUDA's opt-in limit)
SMEM_PER_BLOCK = {75: 65536, 80: 166912, 86: 101376, 89: 101376, 90: 232448, 100: 232448,
                  120: 101376}


def _arg_type(value) -> str | None:
    """Triton's signature type of a launch argument, None for one passed as a constexpr."""
    import torch
    if isinstance(value, torch.Tensor):
        return "*" + _POINTER[str(value.dtype).removeprefix("torch.")]
    if isinstance(value, bool):
        return "i1"
    if isinstance(value, int):
        return "i32" if -INT32_MAX - 1 <= value <= INT32_MAX else "i64"
    if isinstance(value, float):
        return "fp32"
    return None


def _is_constexpr(parameter: inspect.Parameter) -> bool:
    note = parameter.annotation     # (a string where the module has postponed annotations)
    return "constexpr" in (note if isinstance(note, str) else getattr(note, "__name__", ""))


def launch_record(fn, args: tuple, kwargs: dict) -> dict:
    """One launch as JSON: kernel (module, name), per-parameter types, constexprs, options."""
    signature = inspect.signature(fn)
    params = signature.parameters
    try:
        bound = signature.bind(*args, **{k: v for k, v in kwargs.items() if k in params})
    except TypeError as exc:
        raise ValueError(f"{fn.__name__}: {exc}") from None
    bound.apply_defaults()       # a default: compiled as the kernel declares it
    bound = bound.arguments
    types, constexprs = {}, {}
    for name, parameter in params.items():
        value = bound[name]
        kind = None if _is_constexpr(parameter) else _arg_type(value)
        if kind is None:
            constexprs[name] = value if isinstance(value, (bool, int, float, str, type(None))) \
                else str(value)
        else:
            types[name] = kind
    options = {k: kwargs[k] for k in ("num_warps", "num_stages", "enable_fp_fusion") if k in kwargs}
    return {"module": fn.__module__, "kernel": fn.__name__, "types": types,
            "constexprs": constexprs, "options": options}


def capture(workload) -> tuple[list[dict], list[str], list[str]]:
    """The distinct launches `workload()` makes (each call a tuple (label, thunk)); the labels
    of the calls a launcher refused by design (ValueError / TypeError / NotImplementedError:
    an input it does not take, listed, not an error here); and of the calls that failed
    otherwise (a kernel that crashed under the interpreter: an error)."""
    from hiertail_fast.kernels._utils import interpreting
    from triton.runtime import interpreter
    if not interpreting():
        raise RuntimeError("the capture runs the kernels under the interpreter: set "
                           "TRITON_INTERPRET=1 before triton is imported")
    seen: dict[str, dict] = {}
    real_run = interpreter.InterpretedFunction.run

    def recording_run(self, *args, **kwargs):
        record = launch_record(self.fn, args, kwargs)
        seen.setdefault(json.dumps(record, sort_keys=True), record)
        return real_run(self, *args, **kwargs)

    refused, failed = [], []
    interpreter.InterpretedFunction.run = recording_run
    try:
        for label, thunk in workload():
            try:
                thunk()
            except Exception as exc:  # noqa: BLE001 - each call's outcome is a row
                line = f"{label}: {type(exc).__name__}: {(str(exc).splitlines() or [''])[0]}"
                (refused if isinstance(exc, (ValueError, TypeError, NotImplementedError))
                 else failed).append(line)
    finally:
        interpreter.InterpretedFunction.run = real_run
    return list(seen.values()), refused, failed


def workload(quick: bool = False):
    """(label, thunk) pairs: every op on small CPU tensors, forward and backward, over the
    switches and dtypes of its Triton kernels (``quick``: fp32 inputs, d 16, one graph: every
    kernel once or twice, for the test suite)."""
    import torch

    import hiertail_fast as hf
    from hiertail_fast import CSRGraph

    gen = torch.Generator().manual_seed(0)
    n, d = 40, 24
    edges = torch.randint(0, n, (2, 160), generator=gen)
    sym = torch.cat([edges, edges.flip(0)], 1)
    dtypes = (torch.float32,) if quick else (torch.float32, torch.float64, torch.bfloat16,
                                             torch.float16)
    for dtype in dtypes:
        name = str(dtype).removeprefix("torch.")
        x = torch.randn(n, d, generator=gen).to(dtype)
        for weighted in (False, True):
            for graph_edges, shape in ((edges, "directed"), (sym, "symmetric"))[quick:]:
                def gcn(dtype=dtype, x=x, weighted=weighted, graph_edges=graph_edges):
                    xx = x.clone().requires_grad_()
                    w = (torch.rand(graph_edges.shape[1], generator=gen).to(dtype)
                         .requires_grad_() if weighted else None)
                    out = hf.gcn_propagate(xx, graph_edges, edge_weight=w, backend="triton")
                    out.float().sum().backward()
                yield f"gcn_propagate {name} weighted={weighted} {shape}", gcn
        graph = CSRGraph.from_edge_index(sym, num_nodes=n)

        def no_loops(x=x, graph=graph):
            hf.gcn_propagate(x, graph, add_self_loops=False, backend="triton")
        yield f"gcn_propagate {name} without self-loops", no_loops

        def pool(dtype=dtype, x=x):
            xx = x.clone().requires_grad_()
            p = torch.randn(d, generator=gen).to(dtype).requires_grad_()
            res = hf.topk_pool(xx, sym, p, ratio=0.5, backend="triton")
            back = hf.topk_unpool(res.x, res.perm, n, backend="triton")
            (res.x.float().sum() + back.float().square().sum()).backward()
        yield f"topk_pool / topk_unpool {name}", pool

        def nearest(dtype=dtype, x=x):
            hf.nearest_prototype(x, torch.randn(5, d, generator=gen).to(dtype),
                                 backend="triton")
        yield f"nearest_prototype {name}", nearest
    yield from _loss_workload(gen, dtypes, (16,) if quick else (16, 64, 128))


def _loss_workload(gen, dtypes, dims):
    import torch
    from _gpu_checks import environment  # (the knobs set for a call, then put back)

    import hiertail_fast as hf

    n = 48
    for dtype in dtypes:
        name = str(dtype).removeprefix("torch.")
        for d in dims:
            z = torch.nn.functional.normalize(torch.randn(n, d, generator=gen), dim=1).to(dtype)
            labels = torch.randint(0, 4, (n,), generator=gen)
            coarse = labels // 2
            protos = torch.randn(4, d, generator=gen).to(dtype)
            for variant in ("exact", "official"):
                def single(z=z, labels=labels, protos=protos, variant=variant):
                    zz = z.clone().requires_grad_()
                    hf.balanced_contrastive_loss(zz, labels, prototypes=protos,
                                                 variant=variant, backend="triton").backward()
                yield f"balanced_contrastive_loss {name} d={d} {variant}", single

                def levels(z=z, labels=labels, coarse=coarse, protos=protos,
                           variant=variant):
                    zz = z.clone().requires_grad_()
                    hf.hierarchical_contrastive_loss(
                        zz, [labels, coarse, coarse // 2], [protos, protos[:2], protos[:1]],
                        variant=variant, backend="triton").backward()
                yield f"hierarchical_contrastive_loss {name} d={d} {variant} 3 levels", levels

                def shared(levels=levels):
                    with environment({"HIERTAIL_TRITON_SHARED_LEVELS": "1"}):
                        levels()
                yield (f"hierarchical_contrastive_loss {name} d={d} {variant} 3 levels, "
                       "shared keys"), shared
        # the LSE kernels' key splits (SPLIT launches: a split axis, partial planes): 130 rows
        # are 3 key tiles of the interpreter's 64, so 2 splits run
        z = torch.nn.functional.normalize(torch.randn(130, 16, generator=gen), dim=1).to(dtype)
        labels = torch.randint(0, 4, (130,), generator=gen)
        protos = torch.randn(4, 16, generator=gen).to(dtype)
        for variant, shared in (("exact", "0"), ("official", "0"), ("exact", "1")):
            def split(z=z, labels=labels, protos=protos, variant=variant, shared=shared):
                with environment({"HIERTAIL_TRITON_KEY_SPLITS": "2",
                                  "HIERTAIL_TRITON_SHARED_LEVELS": shared}):
                    zz = z.clone().requires_grad_()
                    hf.hierarchical_contrastive_loss(
                        zz, [labels, labels // 2, labels // 4], [protos, protos[:2], None],
                        variant=variant, backend="triton").backward()
            yield (f"hierarchical_contrastive_loss {name} d=16 {variant} 3 levels, 2 key "
                   f"splits{', shared keys' if shared == '1' else ''}"), split


def ptx_float_ops(ptx: str) -> dict[str, int]:
    """Counts of the fp32 multiply / add / subtract / FMA instructions in `ptx`. ``mul.f32``,
    ``add.f32``, ``sub.f32`` (no rounding modifier) are the ones ptxas may still contract into an
    FMA; with ``enable_fp_fusion=False`` Triton emits the ``.rn`` forms, which it may not
    (kernels/_utils.fp_fusion says which launches need that)."""
    ops = ("fma.rn.f32", "mul.f32", "mul.rn.f32", "add.f32", "add.rn.f32", "sub.f32",
           "sub.rn.f32")
    return {op: len(re.findall(rf"\b{re.escape(op)}\b", ptx)) for op in ops}


def compile_one(job: dict) -> dict:
    """Compile one captured launch for sm_<arch>: the row, with ``error`` if it failed."""
    import triton
    from triton.backends.compiler import GPUTarget

    fn = getattr(importlib.import_module(job["module"]), job["kernel"])
    row = dict(job)
    started = time.perf_counter()
    try:
        source = ast_source(fn, job["types"], job["constexprs"])
        out = triton.compile(source, target=GPUTarget("cuda", job["arch"], 32),
                             options=dict(job["options"]))
        row.update(ok=True, shared_bytes=int(out.metadata.shared),
                   cubin_bytes=len(out.asm.get("cubin", b"")),
                   ptx_float_ops=ptx_float_ops(out.asm.get("ptx", "")))
    except Exception as exc:   # a launch the compiler refuses is a row, not the end of the run
        lines = str(exc).strip().splitlines() or [""]
        row.update(ok=False, error=f"{type(exc).__name__}: {lines[-1][:300]}")
    row["seconds"] = round(time.perf_counter() - started, 2)
    return row


def _label(row: dict) -> str:
    keys = ", ".join(f"{k}={v}" for k, v in row["constexprs"].items())
    pointers = sorted({t for t in row["types"].values() if t.startswith("*")})
    opts = ", ".join(f"{k}={v}" for k, v in row["options"].items())
    return f"{keys} | {' '.join(pointers)}" + (f" | {opts}" if opts else "")


def markdown(report: dict) -> str:
    rows = report["rows"]
    failed = [r for r in rows if not r["ok"]]
    lines = [f"# Triton kernels compiled for GPU targets (triton {report['triton']}, "
             f"{report['machine']})", "",
             f"{len(rows)} compilations ({report['launches']} distinct launches x arch "
             f"{', '.join(f'sm_{a}' for a in report['arch'])}): **{len(rows) - len(failed)} "
             f"compiled, {len(failed)} failed**, {report['seconds']:.0f} s.", "",
             "| kernel | compiled | failed | shared memory per block (bytes, max) |",
             "|---|--:|--:|--:|"]
    for kernel in sorted({r["kernel"] for r in rows}):
        mine = [r for r in rows if r["kernel"] == kernel]
        ok = [r for r in mine if r["ok"]]
        lines.append(f"| `{kernel}` | {len(ok)} | {len(mine) - len(ok)} | "
                     f"{max((r['shared_bytes'] for r in ok), default=0):,} |")
    if failed:
        lines += ["", "## Failed", ""]
        lines += [f"- sm_{r['arch']} `{r['kernel']}` ({_label(r)}): {r['error']}"
                  for r in failed]
    over = [r for r in rows if r["ok"] and r["shared_bytes"] > SMEM_PER_BLOCK[r["arch"]]]
    if over:
        lines += ["", "## Over the card's shared memory per block", "",
                  "Compiled, but a launch would fail on the card (Triton's OutOfResources). "
                  "The constants are the launchers' choices under the interpreter, which can "
                  "differ from a GPU's (the loss backward's DOT_CR recomputation and its square "
                  "tiles are interpreter-only; on a card the loss launchers fall back to a "
                  "smaller tile):", ""]
        lines += [f"- sm_{r['arch']} `{r['kernel']}` {r['shared_bytes']:,} > "
                  f"{SMEM_PER_BLOCK[r['arch']]:,} bytes ({_label(r)})" for r in over]
    if report["interpreter_failures"]:
        lines += ["", "## Workload calls that failed under the interpreter", ""]
        lines += [f"- {line}" for line in report["interpreter_failures"]]
    if report["refused"]:
        lines += ["", "## Workload calls the launchers refused (not compile failures)", ""]
        lines += [f"- {line}" for line in report["refused"]]
    return "\n".join(lines) + "\n"


def parse_args(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--arch", type=int, nargs="+", default=[80, 90],
                    choices=sorted(SMEM_PER_BLOCK), metavar="CC",
                    help="compute capabilities to compile for (80: A100, 90: H100/H200; one of "
                         f"{', '.join(map(str, sorted(SMEM_PER_BLOCK)))})")
    ap.add_argument("--jobs", type=positive(int), default=os.cpu_count() or 1,
                    help="compiler processes (default: one per core)")
    ap.add_argument("--quick", action="store_true",
                    help="fp32 inputs, d 16, one graph: every kernel, fewer switches (a minute)")
    ap.add_argument("--out", type=Path, default=HERE / "results")
    return ap.parse_args(argv)


def main(argv=None) -> int:
    args = parse_args(argv)
    problem = unwritable_dir_reason(args.out)
    if problem:
        print(f"kernel_compile: --out {problem}", file=sys.stderr)
        return 2
    import platform

    import triton
    started = time.perf_counter()
    launches, refused, failed = capture(lambda: workload(args.quick))
    for line in failed:
        print(f"FAILED under the interpreter: {line}", flush=True)
    print(f"captured {len(launches)} distinct launches of "
          f"{len({r['kernel'] for r in launches})} kernels; compiling for "
          f"{', '.join(f'sm_{a}' for a in args.arch)} on {args.jobs} processes", flush=True)
    jobs = [dict(launch, arch=arch) for arch in args.arch for launch in launches]
    with ProcessPoolExecutor(args.jobs, initializer=_compile_mode,
                             mp_context=multiprocessing.get_context("spawn")) as pool:
        rows = []
        for row in pool.map(compile_one, jobs):
            rows.append(row)
            if not row["ok"]:
                print(f"FAILED sm_{row['arch']} {row['kernel']}: {row['error']}", flush=True)
    report = {"triton": triton.__version__, "machine": platform.node() or "?",
              "arch": args.arch, "launches": len(launches), "refused": refused,
              "interpreter_failures": failed,
              "seconds": time.perf_counter() - started, "rows": rows}
    args.out.mkdir(parents=True, exist_ok=True)
    text = markdown(report)
    for name, content in (("kernel_compile.json", json.dumps(report, indent=1, default=str)),
                          ("kernel_compile.md", text)):
        with atomic_path(args.out / name) as tmp:
            tmp.write_text(content)
    print(text)
    return 1 if failed or any(not r["ok"] for r in rows) else 0


if __name__ == "__main__":
    sys.exit(main())
