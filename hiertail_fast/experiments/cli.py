"""The command line of the experiments (``python -m hiertail_fast.experiments NAME --help``)."""
from __future__ import annotations

import argparse
import importlib
import os
import sys
import time
from pathlib import Path
from typing import Sequence

from hiertail_fast._argparse import ArgumentParser, dir_arg, exact_int
from hiertail_fast._files import DeferredInterrupt
from hiertail_fast._validation import FEATURE_NORMS, SEED_MAX, check_classes
from hiertail_fast.experiments import EXPERIMENTS
from hiertail_fast.experiments.common import Context, check_distinct
from hiertail_fast.experiments.runner import (
    FULL_EPOCHS,
    FULL_PATIENCE,
    FULL_SEEDS,
    QUICK,
    SYNTHETIC_DEGREE,
    Budget,
    DataSource,
    RunCache,
    run_specs,
)

# options that change where / how fast results are written, not what they are. A summary with
# the same other arguments replaces the one in place, kept as .prev, but never one that holds
# more runs (--report-only over an empty --runs-dir, ...): report.write_outputs.
_NOT_RESULT_ARGS = ("out", "runs_dir", "no_progress", "threads", "data_dir", "report_only",
                    "replace_summary")


def _module(name: str):
    return importlib.import_module(EXPERIMENTS[name])


def _seed_base(text: str) -> int:
    """--seed-base: an integer however written ("1e3"), exactly; its range is checked with the
    seeds it starts (``parse_seeds``: [0, 2**64 - 1])."""
    return exact_int(text, SEED_MAX)


def build_parser() -> argparse.ArgumentParser:
    from hiertail_fast._argparse import non_negative, positive, threads_arg

    p = ArgumentParser(prog="python -m hiertail_fast.experiments",
                       description="Reproduce one table or figure of the HierTail "
                       "paper (see hiertail_fast/experiments/__init__.py).")
    p.add_argument("name", choices=list(EXPERIMENTS))
    p.add_argument("--out", type=dir_arg, help="results folder (default results/NAME). A summary "
                   "from other arguments is never replaced (this one goes to NAME-<hash>.*); "
                   "one from the same arguments is replaced, kept as NAME.prev.* (one "
                   "generation), but not by a summary holding fewer finished runs (e.g. "
                   "--report-only over an empty or other --runs-dir): that is refused (exit 2) "
                   "unless --replace-summary")
    p.add_argument("--runs-dir", type=dir_arg, help="per-run cache (default OUT/runs); share it "
                   "between experiments to reuse their runs (a cached run made from other "
                   "data of the same shape, or an unreadable one, is retrained)")
    p.add_argument("--replace-summary", action="store_true", help="replace the summary in "
                   "--out even when it holds more runs than this one (it is kept as .prev.*)")
    d = p.add_argument_group("data")
    d.add_argument("--data-dir", type=dir_arg, help="folder of the uniform .npz files (default "
                   "$HIERTAIL_DATA, else ../shared/data)")
    d.add_argument("--datasets", help="comma-separated names (default: every paper dataset "
                   "present in the data folder)")
    d.add_argument("--synthetic", action="store_true", help="one small synthetic long-tail "
                   "graph instead of the paper's datasets (tests, smoke runs)")
    d.add_argument("--feature-norm", choices=FEATURE_NORMS, default="none",
                   help="node features: none (raw, the official harness's default) or row = "
                   "x_i / sum_j x_ij (the official --is_normalize; Wiki's raw TF-IDF rows sum "
                   "to thousands); a non-default value is part of every run's cache key")
    d.add_argument("--synthetic-nodes", type=positive(int),
                   help=f"--synthetic: nodes (default {_GIVEN_DEFAULTS['synthetic_nodes']})")
    d.add_argument("--synthetic-classes", type=positive(int),
                   help=f"--synthetic: classes (default {_GIVEN_DEFAULTS['synthetic_classes']})")
    b = p.add_argument_group("budget (default: the full protocol)")
    b.add_argument("--quick", action="store_true", help=f"{QUICK['seeds']} seeds, ≤ "
                   f"{QUICK['epochs']} epochs, patience {QUICK['patience']} (labelled REDUCED)")
    b.add_argument("--seeds", nargs="+", help="a count from --seed-base or a list: 3 | 1,2,5 | 7, "
                   "(the seed 7 alone)")
    b.add_argument("--seed-base", type=_seed_base,
                   help="first seed of a --seeds count and of the default seeds (default "
                   f"{FULL_SEEDS[0]})")
    b.add_argument("--epochs", type=positive(int), help="most epochs per run (default: the "
                   "budget's)")
    b.add_argument("--patience", type=non_negative(int), help="early-stopping patience "
                   "(default: the budget's)")
    t = p.add_argument_group("training")
    t.add_argument("--device", help="cpu or cuda[:N] (default: cuda when present)")
    t.add_argument("--threads", type=threads_arg, help="torch CPU threads (default, per "
                   "dataset: 1 on a graph below 5,000 nodes, else torch's default)")
    t.add_argument("--hidden", type=positive(int), help="override every method's hidden size")
    t.add_argument("--lr", type=positive(float), help="override every method's learning rate "
                   "(e.g. 0.001, the official code's default, PROTOCOL §5.1 item 1)")
    t.add_argument("--adj-norm", choices=("none", "row"), help="baselines' adjacency: none "
                   "(official HierTail copy, default; lte4g: row, its official code) or row = "
                   "D^-1(A+I) (LTE4G / HeroLT; PROTOCOL §5.2 item 9)")
    t.add_argument("--no-progress", action="store_true", help="no progress bar")
    t.add_argument("--report-only", action="store_true", help="train nothing: write the tables "
                   "from the runs already cached (rows say how many seeds they hold); it does "
                   "not replace a summary holding more runs (see --out)")
    seen = set()
    for name in EXPERIMENTS:
        add = getattr(_module(name), "add_arguments", None)
        if add is not None and add not in seen:
            seen.add(add)
            add(p.add_argument_group(f"{name}"))
    return p


# What a table that trains nothing (datasets) ignores
_TRAINING_OPTIONS = ("quick", "seeds", "seed_base", "epochs", "patience", "hidden", "lr",
                     "adj_norm", "report_only", "replace_summary", "runs_dir", "device",
                     "threads", "feature_norm")   # (the last three: the datasets table checked
# --device cuda on a CPU machine, and --feature-norm, which changes no statistic of it, named
# a second summary; an experiments audit)


def inapplicable_option(args, parser: argparse.ArgumentParser) -> str | None:
    """Why an option given (a value other than its default) does not apply to ``args.name``:
    another experiment's option (each module's ``OPTIONS``), or a training option for a table
    that trains nothing. Ignoring it silently would report a variant that did not run."""
    owners: dict[str, list[str]] = {}
    for name in EXPERIMENTS:
        for dest in _module(name).OPTIONS:
            owners.setdefault(dest, []).append(name)
    module = _module(args.name)
    for dest, names in owners.items():
        if dest not in module.OPTIONS and getattr(args, dest) != parser.get_default(dest):
            return (f"--{dest.replace('_', '-')} does not apply to {args.name} (it applies to "
                    f"{', '.join(names)})")
    if (getattr(module, "TRAINS", True) and not getattr(module, "RUNS_BASELINES", True)
            and args.adj_norm is not None):     # (it went into the summary as a variant)
        return f"--adj-norm does not apply to {args.name}: it runs no baseline"
    for dest in ("synthetic_nodes", "synthetic_classes"):   # (they were silently ignored)
        if getattr(args, dest) is not None and not args.synthetic:
            return f"--{dest.replace('_', '-')} only applies to --synthetic"
    if not getattr(module, "TRAINS", True):
        for dest in _TRAINING_OPTIONS:
            if getattr(args, dest) != parser.get_default(dest):
                return (f"--{dest.replace('_', '-')} does not apply to {args.name}: it trains "
                        "nothing")
    return None


# Options whose parser default is None ("not given") and their values once given_defaults
# ran: an explicit default value (`main --config paper`, `datasets --seed-base 123`) is then
# refused where the option does not apply, as any other value (it was silently ignored)
_GIVEN_DEFAULTS = {"config": "paper", "seed_base": FULL_SEEDS[0], "synthetic_nodes": 240,
                   "synthetic_classes": 6}


def given_defaults(args) -> None:
    """Fill the options of _GIVEN_DEFAULTS that were not given (after `inapplicable_option`)."""
    for dest, value in _GIVEN_DEFAULTS.items():
        if getattr(args, dest, value) is None:
            setattr(args, dest, value)


def budget_from_args(args) -> Budget:
    from hiertail_fast._argparse import parse_seeds, seed_count_notice

    # (args as parsed, before `given_defaults`, too: an unset --seed-base is the default's)
    base = _GIVEN_DEFAULTS["seed_base"] if args.seed_base is None else args.seed_base
    seeds = list(FULL_SEEDS)
    epochs, patience = FULL_EPOCHS, FULL_PATIENCE
    # (the default counts go through parse_seeds too: it checks --seed-base and the last
    # seed's range before anything trains; an unchecked base failed on its first bad seed)
    # (--seeds replaces the default count before it is derived: `--seed-base 2**64-6 --seeds
    # 1` was refused for the default ten seeds' last one; an experiments audit)
    if args.quick:
        epochs, patience = QUICK["epochs"], QUICK["patience"]
    if args.seeds:
        seeds = parse_seeds(args.seeds, base)
        notice = seed_count_notice(args.seeds, seeds)
        if notice:
            print(notice, file=sys.stderr)
    elif args.quick:
        seeds = parse_seeds([str(QUICK["seeds"])], base)
    elif base != FULL_SEEDS[0]:
        seeds = parse_seeds([str(len(FULL_SEEDS))], base)
    epochs = args.epochs if args.epochs is not None else epochs
    patience = args.patience if args.patience is not None else patience
    return Budget(tuple(seeds), epochs, patience)


def _device(args) -> str:
    import torch

    from hiertail_fast._argparse import device_error

    if args.device is None:
        return "cuda" if torch.cuda.is_available() else "cpu"
    problem = device_error(args.device)
    if problem:
        raise ValueError(problem)
    return args.device


def _select_datasets(args, source: DataSource, data_dir: Path) -> list[str]:
    """--datasets (each loadable: a user's .npz or, for cora_full / wiki, PyG's raw files), else
    every paper dataset with an .npz in the data folder (or the synthetic graph)."""
    present = source.available()
    if args.datasets is None:       # not given ("" is given: refused below, not "every one")
        if not present:
            raise ValueError(f"no dataset found in {data_dir}")
        return present
    datasets = [x.strip() for x in args.datasets.split(",") if x.strip()]
    if not datasets:
        raise ValueError(f"--datasets {args.datasets!r} names no dataset")
    if source.synthetic is not None:
        if datasets != ["synthetic"]:
            raise ValueError("--synthetic runs the one graph named 'synthetic'")
        return datasets
    from hiertail_fast.data.datasets import canonical_name

    datasets = [canonical_name(x) for x in datasets]
    check_distinct("--datasets", datasets)
    for x in datasets:
        try:
            source.load(x)
        except FileNotFoundError as exc:
            raise ValueError(f"--datasets {x}: not in {data_dir} (present: "
                             f"{', '.join(present) or 'none'}); {exc}") from None
    return datasets


_SYNTHETIC_MIN_NODES = int(SYNTHETIC_DEGREE) + 2    # make_synthetic_graph: avg_degree < n - 1


def _check_datasets(source: DataSource, datasets: list[str], trains: bool) -> None:
    """Every dataset of the command loaded before any run (a bad .npz found in the data folder,
    or a synthetic graph's bad size, raised from inside the runs, a traceback after other
    datasets had trained), and, when it trains, with at least two classes."""
    for name in datasets:
        try:
            data = source.load(name)
            if trains:
                check_classes(data.y)
        except (ValueError, TypeError) as exc:
            raise type(exc)(f"dataset {name}: {exc}") from None


def _check_tail_classes(specs, source: DataSource) -> None:
    """The tail baselines' last ``im_class_num`` labels (3, the official default: no option
    here) exist in every dataset they run on: on two classes each raised from inside its runs,
    a traceback after HierTail and Origin had trained (an experiments audit)."""
    from hiertail_fast.baselines import METHODS

    classes: dict[tuple, int] = {}      # (dataset, split) -> classes: one graph per pair
    short: dict[tuple[str, int, int], list[str]] = {}
    for spec in specs:
        if not getattr(METHODS.get(spec.method), "uses_tail", False):
            continue
        # (the graph the run trains on: semi-synthetic keeps the classes large enough for its
        # split, 2 of Email's 42 at alpha 0.5; a review)
        key = (spec.dataset, spec.split)
        if key not in classes:
            classes[key] = source.run_classes(spec)
        if spec.config.im_class_num > classes[key]:
            graph = (f"dataset {spec.dataset}" if spec.split[0] == "natural"
                     else f"the semi-synthetic graph of {spec.dataset}")
            short.setdefault((graph, classes[key], spec.config.im_class_num),
                             []).append(spec.method)
    if short:       # (the first graph that falls short)
        (graph, count, tail), methods = next(iter(short.items()))
        raise ValueError(f"{graph} has {count} classes, and {', '.join(methods)} "
                         f"take{'s' if len(methods) == 1 else ''} its last {tail} labels as "
                         f"the tail classes (im_class_num="
                         f"{tail}, the official default): leave them out with --methods, or "
                         f"run them with `python -m hiertail_fast.train --method NAME "
                         f"--im-class-num N`")


def _check_adj_norm_applies(args, specs) -> None:
    """--adj-norm on rows none of which has the option (HierTail's, graphens's and imgagn's
    aggregation is their own): the same cached runs as without it, and a summary whose args
    said adj_norm: row (an experiments audit; `inapplicable_option` refuses it where the
    table runs no baseline at all)."""
    from hiertail_fast.baselines.config import METHOD_FIELDS

    if getattr(args, "adj_norm", None) is None:
        return
    if not any("adj_norm" in METHOD_FIELDS.get(spec.method, ()) for spec in specs):
        rows = sorted({spec.method for spec in specs})
        raise ValueError(f"--adj-norm does not apply to the rows selected ({', '.join(rows)}): "
                         f"none of them has the option")


def _check_targets(args, out: Path, stem: str, trains: bool) -> None:
    """Before any run (training can take hours): --out and its summary files must be writable,
    and the runs folder too when runs are trained (--report-only only reads it)."""
    from hiertail_fast._files import unwritable_dir_reason, unwritable_file_reason

    problem = unwritable_dir_reason(out) or next(
        (r for r in (unwritable_file_reason(out / f"{stem}{s}", keeps_prev=True)
                     for s in (".md", ".json"))
         if r), None)
    if problem:
        raise ValueError(f"--out {out} cannot be written: {problem}")
    runs = args.runs_dir or out / "runs"
    if trains and not args.report_only:
        problem = unwritable_dir_reason(runs)
    else:
        problem = f"{runs} is not a directory" if runs.exists() and not runs.is_dir() else None
    if problem:
        raise ValueError(f"--runs-dir {runs} cannot be used: {problem}")


def _result_args(args) -> dict:
    return {k: (str(v) if isinstance(v, Path) else v) for k, v in sorted(vars(args).items())
            if k not in _NOT_RESULT_ARGS}


def _close(figures: dict | None) -> None:
    if figures:
        import matplotlib.pyplot as plt

        for fig in figures.values():
            plt.close(fig)


def _result_defaults(parser: argparse.ArgumentParser, args) -> dict:
    """Each recorded argument's value when not given (the parser's, or `given_defaults`'): a
    summary recorded before an option existed holds no entry for it, and matches a command
    that leaves the option at this value (`write_outputs`)."""
    return {k: _GIVEN_DEFAULTS.get(k, parser.get_default(k)) for k in _result_args(args)}


def run_threads(requested: int | None, source):
    """dataset -> the torch thread count its runs train with: ``--threads``, else 1 on a graph
    below ``_threads.SMALL_GRAPH_NODES`` nodes (as ``train``'s default) and torch's count as
    the command started on larger ones. Per dataset: the default was once set for the whole
    command (1 only when every dataset named was small), so Email's runs came out at 1 or 2
    threads, with other numbers, depending on the datasets named with it."""
    import torch

    from hiertail_fast._threads import default_threads

    start = torch.get_num_threads()

    def threads(dataset: str) -> int:
        if requested is not None:       # (no need to read the dataset's size)
            return requested
        return default_threads(source.data_key(dataset)["nodes"], None, start)
    return threads


def main(argv: Sequence[str] | None = None) -> dict:
    """Run (or report) one experiment; torch's thread count is restored after it."""
    from hiertail_fast._threads import keeps_thread_count

    return keeps_thread_count(_main)(argv)


def _main(argv: Sequence[str] | None) -> dict:
    from hiertail_fast.experiments.report import (
        SummaryKept,
        provenance,
        provenance_markdown,
        write_outputs,
    )

    started = time.time()
    parser = build_parser()
    argv = list(sys.argv[1:] if argv is None else argv)
    args = parser.parse_args(argv)
    module = _module(args.name)
    trains = getattr(module, "TRAINS", True)   # the datasets table trains nothing
    problem = inapplicable_option(args, parser)
    if problem is not None:
        parser.error(problem)
    given_defaults(args)
    try:
        budget = budget_from_args(args)
        out = args.out or Path("results") / args.name
        stem = args.name + (budget.tag() if trains else "")
        _check_targets(args, out, stem, trains)
        device = _device(args) if trains else "cpu"
        data_dir = args.data_dir or Path(os.environ.get("HIERTAIL_DATA") or "../shared/data")
        synthetic = ({"nodes": args.synthetic_nodes, "classes": args.synthetic_classes,
                      "features": 16} if args.synthetic else None)
        if synthetic is not None and (synthetic["nodes"] < _SYNTHETIC_MIN_NODES
                                      or synthetic["classes"] < 2):
            raise ValueError(f"--synthetic needs --synthetic-nodes >= {_SYNTHETIC_MIN_NODES} "
                             f"(its average degree is {SYNTHETIC_DEGREE:g}) and "
                             f"--synthetic-classes >= 2, got {synthetic['nodes']} and "
                             f"{synthetic['classes']}")
        if synthetic is None and not data_dir.is_dir():
            raise ValueError(f"data folder {data_dir} " + ("is a file, not a folder" if
                             data_dir.exists() else "not found") + " (--data-dir or "
                             "$HIERTAIL_DATA)")
        source = DataSource(data_dir, synthetic, args.feature_norm)
        datasets = _select_datasets(args, source, data_dir)
        _check_datasets(source, datasets, trains)
        ctx = Context(args, budget, source, RunCache(args.runs_dir or out / "runs"), datasets,
                      device)
        if args.feature_norm != "none":
            ctx.notes.append(f"- node features: --feature-norm {args.feature_norm} (x_i / "
                             "Σ_j x_ij, the official --is_normalize; the official harness "
                             "uses raw features except on BlogCatalog)")
        threads = run_threads(args.threads, source)
        specs = module.specs(ctx)
        check_distinct("table rows", [f"{s.dataset} / {s.row}" for s in specs])
        _check_tail_classes(specs, source)
        _check_adj_norm_applies(args, specs)
    except (ValueError, TypeError, OSError) as exc:
        parser.error(str(exc))
    except KeyboardInterrupt:   # Ctrl-C while the datasets load: nothing is written yet
        print(f"{parser.prog}: interrupted before any run; nothing was written",
              file=sys.stderr)
        raise SystemExit(130) from None
    try:
        records = run_specs(specs, budget, source, ctx.cache, device=device, notes=ctx.notes,
                            progress=not args.no_progress and not args.report_only,
                            train=not args.report_only, threads=threads)
    except (MemoryError, RuntimeError) as exc:
        from hiertail_fast.train import is_out_of_memory

        if not is_out_of_memory(exc):
            raise
        # (--hiddens 30000000 passes the option checks: the model wanted 3.6 PB)
        # (Python's own MemoryError has no message: named by its type, as the trainer does)
        what = " ".join(str(exc).split()) or type(exc).__name__
        print(f"{parser.prog}: error: out of memory in a run ({what}); "
              f"the runs finished before are kept in {args.runs_dir or out / 'runs'} and the "
              f"same command resumes from them; the summary ({out / stem}.md / .json) was not "
              "written", file=sys.stderr)
        raise SystemExit(1) from None
    except KeyboardInterrupt:   # Ctrl-C: a line, not a traceback from inside torch
        print(f"{parser.prog}: interrupted; the runs finished before are kept in "
              f"{args.runs_dir or out / 'runs'} and the same command resumes from them; "
              f"the summary ({out / stem}.md / .json) was not written", file=sys.stderr)
        raise SystemExit(130) from None
    try:                        # the summary of finished runs, written as one set
        if args.report_only:
            done = {(r["spec"].dataset, r["spec"].row) for r in records}
            absent = [f"{s.dataset} / {s.row}" for s in specs if (s.dataset, s.row) not in done]
            ctx.notes += [f"- {a}: no finished run yet (--report-only)" for a in absent]
        body, payload, figures = module.report(ctx, records)
        prov = provenance(argv, budget, started, device, records)
        notes = ("\n\nNotes:\n" + "\n".join(ctx.notes)) if ctx.notes else ""
        header = f"{budget.header()}\n\n" if trains else ""
        markdown = (f"# {module.TITLE}\n\n{header}{provenance_markdown(prov, trains)}\n\n"
                    f"{body}{notes}\n")
        # the datasets the table covers (the datasets table trains nothing: no specs)
        fingerprints = {d: source.fingerprint(d)
                        for d in sorted({s.dataset for s in specs} | set(ctx.datasets))}
        full = {"experiment": args.name, "title": module.TITLE, "args": _result_args(args),
                "data_fingerprints": fingerprints,
                "budget_header": budget.header() if trains else None, "provenance": prov,
                "notes": ctx.notes, "runs": len(records), **payload}
        log = lambda line: print(line, file=sys.stderr)  # noqa: E731
        try:
            paths = write_outputs(out, stem, markdown, full, figures, log=log,
                                  replace_fewer=args.replace_summary,
                                  arg_defaults=_result_defaults(parser, args))
        except SummaryKept as exc:
            print(markdown)
            parser.error(f"{exc}; the table above was not saved")
        finally:    # (pyplot keeps every figure open until closed: one set per call of main)
            _close(figures)
        print(markdown)
        if paths:
            log("wrote " + ", ".join(str(p) for p in paths))
        return full
    except DeferredInterrupt:   # a Ctrl-C the summary's renames held: it is in place
        print(f"{parser.prog}: interrupted after the summary ({out / stem}.md / .json) was "
              "written", file=sys.stderr)
        raise SystemExit(130) from None
    except KeyboardInterrupt:   # Ctrl-C while the summary is made: every run is kept
        print(f"{parser.prog}: interrupted while the summary was made; every run is kept in "
              f"{args.runs_dir or out / 'runs'} and the same command makes the summary "
              f"({out / stem}.md / .json) from them without training", file=sys.stderr)
        raise SystemExit(130) from None
