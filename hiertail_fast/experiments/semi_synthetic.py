"""``semi-synthetic``: Table 3's protocol — the manual long-tail split (α = 0.8: the 20 % head
classes hold about 80 % of the training nodes; 25 validation / 55 test nodes per class;
hiertail_fast/data/semi_synthetic.py) applied to the datasets given, then the same rows as
``main``. The official alignment bug (edges scrambled relative to X and y, lowest-id split) is
reproduced by ``--alignment-bug`` and fixed by default. The paper's numbers (Table 3) are for the
two Amazon graphs; other datasets show ours alone."""
from __future__ import annotations

import argparse

from hiertail_fast.experiments import main_table
from hiertail_fast.experiments.common import Context
from hiertail_fast.experiments.paper_numbers import TABLE3_SEMI_SYNTHETIC
from hiertail_fast.experiments.report import markdown_table
from hiertail_fast.experiments.runner import RunSpec

TITLE = "Table 3: semi-synthetic long-tail setting (manual split, α = 0.8)"
OPTIONS = ("methods", "alpha", "val_per_class", "test_per_class", "alignment_bug")


def _unit_open(text: str) -> float:
    """argparse type: a number strictly between 0 and 1 (nan refused)."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number") from None
    if not 0.0 < value < 1.0:
        raise argparse.ArgumentTypeError(f"must lie in (0, 1), got {text}")
    return value


def add_arguments(parser) -> None:
    from hiertail_fast._argparse import positive

    parser.add_argument("--alpha", type=_unit_open, default=0.8, help="semi-synthetic: share "
                        "of the training nodes in the head classes, in (0, 1)")
    parser.add_argument("--val-per-class", type=positive(int), default=25,
                        help="semi-synthetic: validation nodes per class (>= 1)")
    parser.add_argument("--test-per-class", type=positive(int), default=55,
                        help="semi-synthetic: test nodes per class (>= 1)")
    parser.add_argument("--alignment-bug", action="store_true", help="semi-synthetic: "
                        "reproduce the official feature / adjacency misalignment")


def _split(ctx: Context) -> tuple:
    a = ctx.args
    return ("semi_lt", a.alpha, a.val_per_class, a.test_per_class, bool(a.alignment_bug))


def setting(ctx: Context, dataset: str) -> dict:
    """The down-sampled graph's description, or ValueError when the dataset cannot take it."""
    from hiertail_fast.data.semi_synthetic import semi_synthetic_long_tail

    _, alpha, val, test, bug = _split(ctx)
    return semi_synthetic_long_tail(ctx.source.load(dataset), alpha=alpha, val_per_class=val,
                                    test_per_class=test, alignment_bug=bug).info


def specs(ctx: Context) -> list[RunSpec]:
    usable = []
    for d in ctx.datasets:
        try:
            setting(ctx, d)
            usable.append(d)
        except ValueError as exc:
            # (the head-class count int((1 - alpha) C) also grows with the eligible classes C:
            # smaller per-class counts let more classes in)
            advice = ("try another --alpha, or smaller --val-per-class / --test-per-class (more "
                      "classes large enough to keep)" if str(exc).startswith("alpha=")
                      else "try smaller --val-per-class / --test-per-class")
            ctx.notes.append(f"- {d}: not applicable ({exc}); {advice}")
    if not usable:
        raise ValueError("semi-synthetic: no dataset can take this split: "
                         + "; ".join(n.removeprefix("- ") for n in ctx.notes
                                     if "not applicable" in n))
    sub = Context(ctx.args, ctx.budget, ctx.source, ctx.cache, usable, ctx.device, ctx.notes)
    return main_table.method_specs(sub, _split(ctx))


def report(ctx: Context, records: list[dict]):
    usable = list(dict.fromkeys(r["spec"].dataset for r in records))
    sub = Context(ctx.args, ctx.budget, ctx.source, ctx.cache, usable, ctx.device, ctx.notes)
    rows = main_table.build_rows(sub, records, TABLE3_SEMI_SYNTHETIC)
    info = {d: setting(ctx, d) for d in usable}
    lines = [f"Split: α = {ctx.args.alpha}, {ctx.args.val_per_class} validation / "
             f"{ctx.args.test_per_class} test nodes per class; alignment bug "
             f"{'REPRODUCED (--alignment-bug)' if ctx.args.alignment_bug else 'fixed'}. The "
             "paper's numbers (Table 3) are for Amazon-Clothing / -Electronics only.", "",
             "| dataset | kept classes | dropped (too small) | nodes | edges | train "
             "Ratio_LT(0.8) |", "|---|---|---|---|---|---|"]
    for d, i in info.items():
        lines.append(f"| {d} | {i['kept_classes']} | {len(i['dropped_classes'])} | "
                     f"{i['num_nodes']:,} | {i['num_edges'] // 2:,} | "
                     f"{i['train_ratio_lt_0.8']:.2f} |")
    lines += ["", markdown_table(rows, len(ctx.budget.seeds))]
    return "\n".join(lines), {"rows": rows, "settings": info}, {}
