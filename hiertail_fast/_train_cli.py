"""The command line of the training loop: ``python -m hiertail_fast.train``, ``python -m
hiertail_fast`` or ``hiertail-train`` (all enter through `hiertail_fast.__main__.main`, which sets
the OpenMP wait policy before torch is imported); see ``--help``. Builds the config from the
options, loads the graph (``--data`` .npz, ``--dataset`` NAME [``--root``] or ``--synthetic``) and
an optional user split, runs `run_seeds`, prints the table and writes ``--json``. This module
drives `hiertail_fast.train`; the loop never imports it back.

Exit codes: 0 done; 2 the command line or an input file is refused (one line on stderr,
argparse's ``error``), before training or, for an option a method checks only when its run
starts, then; 1 the run failed: training diverged (a non-finite loss, `TrainingDivergedError`:
one line naming the seed, the epoch and the lr; the seeds finished before it are the ``seed
...`` lines already on stderr, no --json is written), memory ran out (one line), or --json
could not be written (the results go to stdout); 130 interrupted (Ctrl-C; one line)."""
from __future__ import annotations

import argparse
import json
import math
import os
import sys
from typing import Any, Sequence

import numpy as np
import torch

from hiertail_fast._argparse import (
    ArgumentParser,
    device_error,
    dir_arg,
    non_negative,
    parse_seeds,
    path_arg,
    positive,
    seed_arg,
    seed_count_notice,
    temperature_arg,
    threads_arg,
)
from hiertail_fast._files import (
    DeferredInterrupt,
    overwritten_input,
    prev_path,
    replace_keeping_prev,
    same_file,
    unwritable_file_reason,
)
from hiertail_fast._threads import SMALL_GRAPH_NODES, default_threads, keeps_thread_count
from hiertail_fast._validation import MIN_TEMPERATURE, check_classes
from hiertail_fast.baselines.cli import add_method_arguments, method_config_from_args
from hiertail_fast.data.io import load_npz
from hiertail_fast.data.splits import SPLIT_PARTS, user_split
from hiertail_fast.nn.hiertail import HierTailConfig
from hiertail_fast.ops._dispatch import (
    _attention_available,
    triton_available,
    triton_refusal,
)
from hiertail_fast.train import (
    EPOCHS,
    PAPER_HIDDEN,
    PATIENCE,
    TrainingDivergedError,
    format_table,
    is_out_of_memory,
    load_split,
    run_seeds,
)

# the synthetic generator's options and their defaults (``--synthetic`` only)
SYNTHETIC_DEFAULTS = {"nodes": 2000, "classes": 20, "avg_degree": 10.0, "homophily": 0.8,
                      "features": 64, "data_seed": 0}


def build_parser(prog: str = "python -m hiertail_fast.train") -> argparse.ArgumentParser:
    p = ArgumentParser(prog=prog,
                       description="Train HierTail (long-tail node classification).")
    src = p.add_argument_group("input")
    src.add_argument("--data", type=path_arg, help="graph in the uniform .npz format; its classes "
                     "are relabelled by size (0 = largest, as the official harness), so "
                     "per-class results are in that order: --json's data.original_labels "
                     "gives each class's label in the file")
    src.add_argument("--synthetic", action="store_true", help="generate a long-tail graph")
    src.add_argument("--dataset", help="a paper dataset by name (cora_full, wiki, email, "
                     "blogcatalog, amazon_clothing, amazon_electronics): ROOT/NAME.npz or PyG's "
                     "raw files, official preprocessing (hiertail_fast.data.datasets)")
    src.add_argument("--root", type=dir_arg, help="data directory of --dataset (default: "
                     "$HIERTAIL_DATA)")
    src.add_argument("--download", action="store_true", help="--dataset: let PyG download "
                     "missing raw files into --root (needs a network)")
    # default None, SYNTHETIC_DEFAULTS filled in after parsing: given without --synthetic,
    # they are refused (they were silently ignored with --data / --dataset)
    d = SYNTHETIC_DEFAULTS
    src.add_argument("--nodes", type=positive(int),
                     help=f"--synthetic: nodes (default {d['nodes']})")
    src.add_argument("--classes", type=positive(int),
                     help=f"--synthetic: classes, long-tailed sizes (default {d['classes']})")
    src.add_argument("--avg-degree", type=positive(float),
                     help=f"--synthetic: average degree (default {d['avg_degree']})")
    src.add_argument("--homophily", type=float,
                     help="--synthetic: share of same-class edges, in [0, 1] (default "
                     f"{d['homophily']})")
    src.add_argument("--features", type=positive(int),
                     help=f"--synthetic: feature dimension (default {d['features']})")
    src.add_argument("--data-seed", type=seed_arg,
                     help=f"--synthetic: generator seed (default {d['data_seed']})")
    src.add_argument("--feature-norm", choices=("none", "row"), default="none",
                     help="node features: none (as loaded; the official default) or row = "
                     "x_i / sum_j x_ij (the official --is_normalize; Wiki's raw TF-IDF rows "
                     "sum to thousands and collapse training without it)")
    src.add_argument("--split", type=path_arg,
                     help="user split .npz (train/val/test arrays of node ids, or "
                     "train_mask/val_mask/test_mask booleans); "
                     "default: natural per-class split redone per seed")
    m = p.add_argument_group("model and training")
    # default None ("paper" when unset): an explicit `--config paper` with a baseline
    # --method is refused, as any HierTail option (it was silently ignored)
    m.add_argument("--config", choices=("paper", "official"),
                   help="HierTail preset: the paper's hyper-parameters or the official "
                   "code's (default paper; HierTailConfig.paper / .official)")
    m.add_argument("--hidden", type=positive(int), help="default: config (paper: 64 on "
                   "email/wiki/blogcatalog)")
    m.add_argument("--gamma", type=non_negative(float),
                   help="weight of the contrastive losses (default: config)")
    m.add_argument("--tau", type=temperature_arg,
                   help=f"contrastive temperature, >= {MIN_TEMPERATURE:g} (default: config)")
    m.add_argument("--dropout", type=non_negative(float), help="in [0, 1) (default: config)")
    m.add_argument("--lr", type=positive(float), help="learning rate; a run whose loss turns "
                   "NaN/Inf stops with an error naming the epoch (exit code 1)")
    m.add_argument("--weight-decay", type=non_negative(float),
                   help="Adam weight decay (default: config)")
    m.add_argument("--augment-a2", choices=("on", "off"), help="override the config's A²")
    m.add_argument("--fix-cluster-labels", action="store_true",
                   help="official BCL: label nodes by their nearest prototype index")
    m.add_argument("--compound-pool-bug", action="store_true",
                   help="official: rescale the first pool ratio once more every seed")
    m.add_argument("--loss-backend", choices=("reference", "torch", "triton", "attention"),
                   help="the contrastive losses' backend (default: chosen per device; "
                        "attention: PyTorch's fused attention kernels)")
    m.add_argument("--epochs", type=positive(int), default=EPOCHS,
                   help="most epochs per seed (default %(default)s, the paper's protocol)")
    m.add_argument("--patience", type=non_negative(int), default=PATIENCE,
                   help="stop after this many epochs without a better val Macro-F1 (default "
                   "%(default)s)")
    m.add_argument("--seeds", nargs="+", default=["10"],
                   help="a count (from --seed-base) or a list: 3 | 1,2,5 | 1 2 5 | 7, (the seed "
                   "7 alone)")
    m.add_argument("--seed-base", type=seed_arg, default=123,
                   help="first seed of a --seeds count (default %(default)s)")
    m.add_argument("--device", default="cpu", help="cpu (default), cuda or cuda:N")
    m.add_argument("--threads", type=threads_arg,
                   help=f"torch CPU threads (default: 1 below {SMALL_GRAPH_NODES:,} nodes, where "
                   "the work per epoch is too small to share, else torch's default); OpenMP "
                   "threads wait passively unless OMP_WAIT_POLICY is set")
    m.add_argument("--no-progress", action="store_true",
                   help="no progress bars: one line per finished seed instead")
    m.add_argument("--json", type=path_arg, help="write all results to this JSON file (checked "
                   "before training; written atomically; a file it replaces is kept as "
                   "NAME.prev.json)")
    add_method_arguments(p)
    return p


def _registry_name(name: str | None) -> str:
    """`name` as the dataset registry knows it (``canonical_name``), else lower-cased."""
    from hiertail_fast.data.datasets import canonical_name

    try:
        return canonical_name(name or "")
    except ValueError:
        return (name or "").lower()


def _config_from_args(args, dataset_name: str | None) -> HierTailConfig:
    over: dict[str, Any] = {}
    for key in ("hidden", "gamma", "tau", "dropout", "lr", "weight_decay", "loss_backend"):
        if getattr(args, key) is not None:
            over[key] = getattr(args, key)
    preset = args.config or "paper"
    # the name as --dataset reads it: any case, '-' for '_', the official aliases (Email.npz
    # trained at hidden 128 where email.npz and --dataset EMAIL took the paper's 64: a
    # fresh-user audit)
    name = _registry_name(dataset_name)
    if preset == "paper" and args.hidden is None and name in PAPER_HIDDEN:
        over["hidden"] = PAPER_HIDDEN[name]
    if args.augment_a2 is not None:
        over["augment_a2"] = args.augment_a2 == "on"
    if args.fix_cluster_labels:
        over["fix_cluster_labels"] = True
    return HierTailConfig.named(preset, **over)


@keeps_thread_count
def main(argv: Sequence[str] | None = None, prog: str = "python -m hiertail_fast.train") -> dict:
    """Parse `argv`, train, print the table, write ``--json``; returns the results dict.
    User errors exit with code 2 and one line on stderr (argparse's ``parser.error``); ``prog``
    names the command in them (the entry point's own name)."""
    parser = build_parser(prog)
    args = parser.parse_args(argv)
    if (args.data is not None) + args.synthetic + (args.dataset is not None) != 1:
        parser.error("give exactly one of --data PATH.npz, --dataset NAME or --synthetic")
    if args.root is not None and args.dataset is None:
        parser.error("--root only applies to --dataset")
    if args.dropout is not None and args.dropout >= 1:
        parser.error(f"--dropout must lie in [0, 1), got {args.dropout}")
    if args.download and args.dataset is None:
        parser.error("--download only applies to --dataset")
    # (HierTail's options with a baseline --method: the baselines' own check names them)
    hiertail = args.method == "hiertail"
    if hiertail and args.compound_pool_bug and args.config != "official":
        parser.error("--compound-pool-bug only applies to --config official")
    if hiertail and args.fix_cluster_labels and args.config != "official":
        parser.error("--fix-cluster-labels only applies to --config official (the paper "
                     "config labels nodes by their nearest prototype already)")
    given = [f"--{k.replace('_', '-')}" for k in SYNTHETIC_DEFAULTS if getattr(args, k) is not None]
    if given and not args.synthetic:
        parser.error(f"{', '.join(given)} only appl{'ies' if len(given) == 1 else 'y'} to "
                     "--synthetic (the generator's options)")
    for option, path in (("--data", args.data), ("--split", args.split)):
        if path is not None and path.is_dir():
            parser.error(f"{option} {path} is a directory, not an .npz file")
    problem = device_error(args.device)
    if problem is None and args.loss_backend == "triton" and not triton_available(
            torch.device(args.device)):
        problem = (f"--loss-backend triton cannot run on --device {args.device}: "
                   f"{triton_refusal(torch.device(args.device))}; use torch or reference")
    if problem is None and args.loss_backend == "attention" and not _attention_available(
            torch.device(args.device)):
        problem = (f"--loss-backend attention cannot run on --device {args.device} (this "
                   f"torch {torch.__version__} has no fused attention kernels for it); use "
                   "torch or reference")
    if problem is None and args.json is not None:   # (first: _json_clash takes the path's
        # .prev name, which "." or "/" do not have, and reads it, which a name too long fails)
        problem = unwritable_file_reason(args.json, keeps_prev=True)
        problem = problem and f"--json {args.json} cannot be written: {problem}"
    if problem is None and args.json is not None:
        problem = _json_clash(args)
    if problem is not None:
        parser.error(problem)
    try:
        seeds = parse_seeds(args.seeds, args.seed_base)
        notice = seed_count_notice(args.seeds, seeds)
        if notice:
            print(notice, file=sys.stderr)
        data, data_info = _load_data(args)
        check_classes(data.y)
        split = None
        if args.split is not None:
            try:
                split = user_split(int(data.y.shape[0]), **load_split(args.split))
            except (ValueError, TypeError) as exc:
                message = str(exc)
                raise ValueError(message if str(args.split) in message
                                 else f"--split {args.split}: {message}") from None
            for name, part in zip(("val", "test"), split[1:], strict=True):
                if not part.numel():
                    raise ValueError(f"--split {args.split}: the {name!r} set is empty (the "
                                     "model is selected on val and reported on test)")
            _note_split_overlaps(args.split, split)
        cfg = _config_from_args(args, None if args.synthetic else data_info["name"])
        baseline_cfg = method_config_from_args(args)   # None for --method hiertail
        if baseline_cfg is not None:
            _check_method_run(baseline_cfg, int(data.num_classes), args.epochs)
    except (ValueError, TypeError, OSError, ImportError) as exc:
        parser.error(str(exc))
    except (MemoryError, RuntimeError) as exc:
        if not is_out_of_memory(exc):
            raise
        _exit_out_of_memory(parser.prog, "while the data was built or loaded", exc,
                            "nothing was written")
    except KeyboardInterrupt:   # Ctrl-C while the data loads (a large .npz, PyG's download)
        print(f"{parser.prog}: interrupted before training; nothing was written",
              file=sys.stderr)
        raise SystemExit(130) from None
    data_info.update(num_nodes=int(data.y.shape[0]), num_edges=int(data.edge_index.shape[1]),
                     num_features=int(data.x.shape[1]), num_classes=int(data.num_classes))
    torch.set_num_threads(default_threads(data_info["num_nodes"], args.threads,
                                          torch.get_num_threads()))
    runner = run_seeds
    if baseline_cfg is not None:    # the one dispatch point: a baseline on the same loop
        from hiertail_fast.baselines.harness import run_baseline_seeds as runner
        cfg = baseline_cfg
    try:
        result = runner(data, cfg, seeds, split=split,
                        compound_pool_bug=args.compound_pool_bug, epochs=args.epochs,
                        patience=args.patience, device=args.device,
                        progress=not args.no_progress,
                        log=lambda line: print(line, file=sys.stderr, flush=True))
    except TrainingDivergedError as exc:   # a run's outcome, not a refused input: exit 1
        print(f"{parser.prog}: error: {' '.join(str(exc).split())}", file=sys.stderr)
        raise SystemExit(1) from None
    except (ValueError, TypeError) as exc:
        # an option a method checks only when it starts (the synthetic-node counts of
        # --up-scale / --gen-ratio depend on the seed's split): a refused input, exit 2 as
        # those checked up front (it printed a traceback and exit 1, a diverged run's code)
        parser.error(' '.join(str(exc).split()))
    except (MemoryError, RuntimeError) as exc:
        if not is_out_of_memory(exc):
            raise
        _exit_out_of_memory(parser.prog, "while training", exc, "the seeds finished before "
                            "are on the lines above" + _json_not_written(args))
    except KeyboardInterrupt:   # Ctrl-C: a line, not a traceback from inside torch
        print(f"{parser.prog}: interrupted (the seeds finished before are on the lines above)"
              f"{_json_not_written(args)}", file=sys.stderr)
        raise SystemExit(130) from None
    if getattr(data, "original_labels", None) is not None:
        data_info["original_labels"] = [int(v) for v in data.original_labels]
    result["data"] = data_info
    result["method"] = args.method
    result["training"] = {"epochs": args.epochs, "patience": args.patience,
                          "lr": cfg.lr, "weight_decay": cfg.weight_decay,
                          "device": args.device, "threads": torch.get_num_threads(),
                          "omp_wait_policy": os.environ.get("OMP_WAIT_POLICY"),
                          "optimizer": "Adam",
                          "selection": "val macro-F1, last tie; patience from first max"}
    result["argv"] = list(sys.argv[1:] if argv is None else argv)
    print(format_table(result))
    if args.json is not None:
        text, existed = json_text(result), args.json.exists()
        try:
            kept = replace_keeping_prev(args.json, text)
        except OSError as exc:  # e.g. the disk filled up during training: keep the results
            print(f"error: could not write --json {args.json} ({exc.strerror or exc}); "
                  f"{'the existing file is unchanged' if existed else 'nothing was written'}"
                  "; the results follow on stdout", file=sys.stderr)
            print(text)
            raise SystemExit(1) from None
        except KeyboardInterrupt as exc:   # Ctrl-C while writing: a rotation completes first
            print(f"{parser.prog}: interrupted " + (
                f"after --json {args.json} was written" if isinstance(exc, DeferredInterrupt) else
                f"while writing --json {args.json}; " + (
                    "the existing file is unchanged" if existed else "nothing was written")),
                file=sys.stderr)
            raise SystemExit(130) from None
        print(f"wrote {args.json}" + (f"; the file it replaced is kept as {kept}" if kept
                                      else ""), file=sys.stderr)
    return result


def _json_not_written(args) -> str:
    """"; --json PATH not written ..." for a run that stopped, or "" without --json."""
    return "" if args.json is None else f"; --json {args.json} not written" + (
        " (the existing file is unchanged)" if args.json.exists() else "")


def _exit_out_of_memory(prog: str, stage: str, exc: BaseException, outcome: str):
    """One line and exit 1 (a run's outcome, as a diverged run), not a traceback from numpy or
    torch: sizes the options allow (--nodes, --features, --hidden) can still exceed memory."""
    what = " ".join(str(exc).split()) or type(exc).__name__
    print(f"{prog}: error: out of memory {stage} ({what}); {outcome}. Fewer nodes or features, "
          "a smaller --hidden or a device with more memory may fit", file=sys.stderr)
    raise SystemExit(1) from None


def _note_split_overlaps(path, split) -> None:
    """Say on stderr which parts of a user split share nodes: allowed (the protocol's natural
    split does so for classes of one or two nodes), but a validation or test node that is
    also trained on flatters model selection or the reported metrics, so never unsaid."""
    shared = []
    for i in range(3):
        for j in range(i + 1, 3):
            common = np.intersect1d(split[i].numpy(), split[j].numpy()).size
            if common:
                shared.append(f"{SPLIT_PARTS[i]} and {SPLIT_PARTS[j]} share {common} node(s)")
    if shared:
        print(f"note: --split {path}: {'; '.join(shared)} (allowed: the natural split does so "
              "for classes of one or two nodes; a node in val or test that is also trained "
              "on favours that split's numbers)", file=sys.stderr)


def _json_clash(args) -> str | None:
    """Why --json must not be written: it, or where an existing --json is kept
    (``prev_path``: ``g.npz`` -> ``g.prev.npz``), is the same file as --data or --split, or
    one that --dataset NAME --root DIR reads (DIR/NAME.npz, or the PyG dataset's folder)."""
    targets = [(args.json, f"--json {args.json}", "with the results")]
    if args.json.exists():
        targets.append((prev_path(args.json), f"{prev_path(args.json)} (where the existing "
                        f"--json file is kept)", f"with the old {args.json.name}"))
    inputs = None
    if args.dataset is not None:
        from hiertail_fast.data.datasets import dataset_input_paths
        try:
            inputs = dataset_input_paths(args.dataset, args.root)
        except (ValueError, TypeError):
            pass                    # a bad name or root: loading the data says so
    for target, said, by in targets:
        for option, path in (("--data", args.data), ("--split", args.split)):
            if path is not None and same_file(target, path):
                return (f"{said} is the same file as {option} {path}: it would be "
                        f"overwritten {by}; choose another --json path")
        path = None if inputs is None else overwritten_input(target, inputs)
        if path is not None:
            return (f"{said} is an input of --dataset {args.dataset} ({path}): it would be "
                    f"overwritten {by}; choose another --json path")
    return None


def _check_method_run(cfg, num_classes: int, epochs: int) -> None:
    """A baseline's options against the data and --epochs, before training: ValueError naming
    the options (the methods raise the same at their start, after the data is loaded)."""
    from hiertail_fast.baselines.methods import METHODS

    if getattr(METHODS[cfg.method], "uses_tail", False) and not (
            1 <= cfg.im_class_num <= num_classes):
        raise ValueError(f"--im-class-num {cfg.im_class_num}: --method {cfg.method} takes the "
                         f"last N classes as the tail, N in [1, {num_classes}] (the data has "
                         f"{num_classes} classes)")
    if cfg.method == "graphmixup":
        from hiertail_fast.baselines.graphmixup import pretrain_length
        try:
            pretrain_length(cfg, epochs)
        except ValueError:
            raise ValueError(f"--pretrain-epochs {cfg.pretrain_epochs} must be < --epochs "
                             f"{epochs}: graphmixup selects its model over the fine-tuning "
                             "epochs after pre-training") from None


def _load_data(args) -> tuple[Any, dict[str, Any]]:
    data, info = _load_source(args)
    if args.feature_norm != "none":
        from hiertail_fast.data.datasets import normalize_features
        data = normalize_features(data, args.feature_norm)
        info["feature_norm"] = args.feature_norm
    return data, info


def _load_source(args) -> tuple[Any, dict[str, Any]]:
    if args.data is not None:
        data = load_npz(args.data, relabel_by_size=True)
        return data, {"path": str(args.data), "name": data.name}
    if args.dataset is not None:
        from hiertail_fast.data.datasets import load_dataset, resolve_root
        root = resolve_root(args.root)
        data = load_dataset(args.dataset, root, download=args.download)
        return data, {"dataset": data.name, "root": str(root), "name": data.name}
    from hiertail_fast.data.synthetic import make_synthetic_graph
    opt = {key: default if getattr(args, key) is None else getattr(args, key)
           for key, default in SYNTHETIC_DEFAULTS.items()}
    data = make_synthetic_graph(opt["nodes"], num_classes=opt["classes"],
                                avg_degree=opt["avg_degree"], homophily=opt["homophily"],
                                num_features=opt["features"], seed=opt["data_seed"])
    return data, {"synthetic": True, **opt, "name": "synthetic"}


def json_text(result: dict) -> str:
    """``result`` as strict JSON: numpy / torch values converted, NaN and ±Inf as null (a bare
    NaN is not JSON; strict parsers reject it)."""
    return json.dumps(_finite_or_none(result), indent=2, allow_nan=False)


def _finite_or_none(obj: Any):
    if isinstance(obj, dict):
        return {k: _finite_or_none(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [_finite_or_none(v) for v in obj]
    if isinstance(obj, (np.generic, np.ndarray, torch.Tensor)):
        return _finite_or_none(_json_default(obj))     # -> Python scalars / lists
    if isinstance(obj, float) and not math.isfinite(obj):
        return None
    if obj is None or isinstance(obj, (str, int, float, bool)):
        return obj
    raise TypeError(f"not JSON serialisable: {type(obj).__name__}")


def _json_default(obj: Any):
    if isinstance(obj, (np.integer,)):
        return int(obj)
    if isinstance(obj, (np.floating,)):
        return float(obj) if np.isfinite(obj) else None
    if isinstance(obj, np.bool_):
        return bool(obj)
    if isinstance(obj, (torch.Tensor, np.ndarray)):
        return np.asarray(obj).tolist()
    raise TypeError(f"not JSON serialisable: {type(obj).__name__}")
