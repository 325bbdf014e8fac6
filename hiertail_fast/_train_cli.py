"""The command line of `hiertail_fast.train`: ``python -m hiertail_fast.train`` (or
``python -m hiertail_fast``); see ``--help``. Builds the config from the options, loads the graph
(``--data`` .npz, ``--dataset`` NAME [``--root``] or ``--synthetic``) and an optional user split,
runs `run_seeds`, prints the table and writes ``--json``. `main`, `build_parser` and
`parse_seeds` stay importable from `hiertail_fast.train`."""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any, Sequence

import numpy as np
import torch

from hiertail_fast.baselines.cli import add_method_arguments, method_config_from_args
from hiertail_fast.data.io import load_npz
from hiertail_fast.data.splits import user_split
from hiertail_fast.nn.hiertail import HierTailConfig
from hiertail_fast.train import PAPER_HIDDEN, format_table, load_split, run_seeds


def _positive(kind):
    def parse(text: str):
        value = kind(text)
        if value <= 0:
            raise argparse.ArgumentTypeError(f"must be > 0, got {text}")
        return value
    return parse


def _non_negative(kind):
    def parse(text: str):
        value = kind(text)
        if value < 0:
            raise argparse.ArgumentTypeError(f"must be >= 0, got {text}")
        return value
    return parse


def parse_seeds(values: Sequence[str], base: int = 123) -> list[int]:
    """``["3"]`` -> 3 seeds from ``base``; ``["1,2,5"]`` or ``["1", "2", "5"]`` -> that list."""
    items = [v for text in values for v in text.split(",") if v.strip()]
    try:
        nums = [int(v) for v in items]
    except ValueError as exc:
        raise ValueError(f"--seeds takes integers (a count or a list), got {values}") from exc
    if not nums:
        raise ValueError("--seeds is empty")
    if len(values) == 1 and "," not in values[0]:
        if nums[0] < 1:
            raise ValueError(f"--seeds count must be >= 1, got {nums[0]}")
        return list(range(base, base + nums[0]))
    return nums


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m hiertail_fast.train",
                                description="Train HierTail (long-tail node classification).")
    src = p.add_argument_group("input")
    src.add_argument("--data", type=Path, help="graph in the uniform .npz format")
    src.add_argument("--synthetic", action="store_true", help="generate a long-tail graph")
    src.add_argument("--dataset", help="a paper dataset by name (cora_full, wiki, email, "
                     "blogcatalog, amazon_clothing, amazon_electronics): ROOT/NAME.npz or PyG's "
                     "raw files, official preprocessing (hiertail_fast.data.datasets)")
    src.add_argument("--root", type=Path, help="data directory of --dataset (default: "
                     "$HIERTAIL_DATA)")
    src.add_argument("--nodes", type=_positive(int), default=2000)
    src.add_argument("--classes", type=_positive(int), default=20)
    src.add_argument("--avg-degree", type=_positive(float), default=10.0)
    src.add_argument("--homophily", type=float, default=0.8)
    src.add_argument("--features", type=_positive(int), default=64)
    src.add_argument("--data-seed", type=int, default=0, help="synthetic generator seed")
    src.add_argument("--split", type=Path, help="user split .npz (train/val/test arrays); "
                     "default: natural per-class split redone per seed")
    m = p.add_argument_group("model and training")
    m.add_argument("--config", choices=("paper", "official"), default="paper")
    m.add_argument("--hidden", type=_positive(int), help="default: config (paper: 64 on "
                   "email/wiki/blogcatalog)")
    m.add_argument("--gamma", type=_non_negative(float))
    m.add_argument("--tau", type=_positive(float))
    m.add_argument("--dropout", type=_non_negative(float))
    m.add_argument("--lr", type=_positive(float))
    m.add_argument("--weight-decay", type=_non_negative(float))
    m.add_argument("--augment-a2", choices=("on", "off"), help="override the config's A²")
    m.add_argument("--fix-cluster-labels", action="store_true",
                   help="official BCL: label nodes by their nearest prototype index")
    m.add_argument("--compound-pool-bug", action="store_true",
                   help="official: rescale the first pool ratio once more every seed")
    m.add_argument("--loss-backend", choices=("reference", "torch", "triton"))
    m.add_argument("--epochs", type=_positive(int), default=10_000)
    m.add_argument("--patience", type=_non_negative(int), default=1_000)
    m.add_argument("--seeds", nargs="+", default=["10"],
                   help="a count (from --seed-base) or a list: 3 | 1,2,5 | 1 2 5")
    m.add_argument("--seed-base", type=int, default=123)
    m.add_argument("--device", default="cpu")
    m.add_argument("--threads", type=_positive(int),
                   help="torch CPU threads (1 avoids OpenMP oversubscription on busy machines)")
    m.add_argument("--no-progress", action="store_true")
    m.add_argument("--json", type=Path, help="write all results to this JSON file")
    add_method_arguments(p)
    return p


def _config_from_args(args, dataset_name: str | None) -> HierTailConfig:
    over: dict[str, Any] = {}
    for key in ("hidden", "gamma", "tau", "dropout", "lr", "weight_decay", "loss_backend"):
        if getattr(args, key) is not None:
            over[key] = getattr(args, key)
    if args.config == "paper" and args.hidden is None and dataset_name in PAPER_HIDDEN:
        over["hidden"] = PAPER_HIDDEN[dataset_name]
    if args.augment_a2 is not None:
        over["augment_a2"] = args.augment_a2 == "on"
    if args.fix_cluster_labels:
        over["fix_cluster_labels"] = True
    return HierTailConfig.named(args.config, **over)


def main(argv: Sequence[str] | None = None) -> dict:
    parser = build_parser()
    args = parser.parse_args(argv)
    if (args.data is not None) + args.synthetic + (args.dataset is not None) != 1:
        parser.error("give exactly one of --data PATH.npz, --dataset NAME or --synthetic")
    if args.root is not None and args.dataset is None:
        parser.error("--root only applies to --dataset")
    if args.dropout is not None and args.dropout >= 1:
        parser.error(f"--dropout must lie in [0, 1), got {args.dropout}")
    if args.compound_pool_bug and args.config != "official":
        parser.error("--compound-pool-bug only applies to --config official")
    if args.device.startswith("cuda") and not torch.cuda.is_available():
        parser.error(f"--device {args.device}: CUDA is not available")
    if args.threads is not None:
        torch.set_num_threads(args.threads)
    try:
        seeds = parse_seeds(args.seeds, args.seed_base)
        if args.data is not None:
            data = load_npz(args.data, relabel_by_size=True)
            data_info: dict[str, Any] = {"path": str(args.data), "name": data.name}
        elif args.dataset is not None:
            from hiertail_fast.data.datasets import load_dataset, resolve_root
            root = resolve_root(args.root)
            data = load_dataset(args.dataset, root)
            data_info = {"dataset": data.name, "root": str(root), "name": data.name}
        else:
            from hiertail_fast.data.synthetic import make_synthetic_graph
            data = make_synthetic_graph(args.nodes, num_classes=args.classes,
                                        avg_degree=args.avg_degree, homophily=args.homophily,
                                        num_features=args.features, seed=args.data_seed)
            data_info = {"synthetic": True, "nodes": args.nodes, "classes": args.classes,
                         "avg_degree": args.avg_degree, "homophily": args.homophily,
                         "features": args.features, "data_seed": args.data_seed,
                         "name": "synthetic"}
        split = None
        if args.split is not None:
            split = user_split(int(data.y.shape[0]), **load_split(args.split))
        cfg = _config_from_args(args, None if args.synthetic else data_info["name"])
        baseline_cfg = method_config_from_args(args)   # None for --method hiertail
    except (ValueError, TypeError, FileNotFoundError, ImportError) as exc:
        parser.error(str(exc))
    data_info.update(num_nodes=int(data.y.shape[0]), num_edges=int(data.edge_index.shape[1]),
                     num_features=int(data.x.shape[1]), num_classes=int(data.num_classes))
    runner = run_seeds
    if baseline_cfg is not None:    # the one dispatch point: a baseline on the same loop
        from hiertail_fast.baselines.harness import run_baseline_seeds as runner
        cfg = baseline_cfg
    result = runner(data, cfg, seeds, split=split, compound_pool_bug=args.compound_pool_bug,
                       epochs=args.epochs, patience=args.patience, device=args.device,
                       progress=not args.no_progress,
                       log=lambda line: print(line, file=sys.stderr, flush=True))
    result["data"] = data_info
    result["method"] = args.method
    result["training"] = {"epochs": args.epochs, "patience": args.patience,
                          "lr": cfg.lr, "weight_decay": cfg.weight_decay,
                          "device": args.device, "threads": torch.get_num_threads(),
                          "optimizer": "Adam",
                          "selection": "val macro-F1, last tie; patience from first max"}
    result["argv"] = list(sys.argv[1:] if argv is None else argv)
    print(format_table(result))
    if args.json is not None:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(result, indent=2, default=_json_default))
    return result


def _json_default(obj: Any):
    if isinstance(obj, (np.integer,)):
        return int(obj)
    if isinstance(obj, (np.floating,)):
        return float(obj)
    if isinstance(obj, (torch.Tensor, np.ndarray)):
        return np.asarray(obj).tolist()
    raise TypeError(f"not JSON serialisable: {type(obj).__name__}")
