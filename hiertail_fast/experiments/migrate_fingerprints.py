"""Maintenance (one-off): add ``data_fingerprint`` to cached run records made before it existed.

``python -m hiertail_fast.experiments.migrate_fingerprints RUNS_DIR [--data-dir DIR] [--dry-run]``

The runner (hiertail_fast/experiments/runner.py) records in every new run the fingerprint of the
data it trained on and retrains a cached run whose fingerprint differs; records written before
that have none and are reused on their shape alone. This command gives each of them the
fingerprint of the data it was run on, computed exactly as the runner computes it: the graph
``DataSource`` loads for the record's ``identity.dataset`` from ``--data-dir`` (default, as the
experiments: ``$HIERTAIL_DATA``, else ``../shared/data``) with the identity's ``feature_norm``
(absent: ``none``), or for ``synthetic`` the CLI's synthetic graph of the identity's nodes,
classes and features; then ``run_cache.data_fingerprint`` of it. A record is migrated only when that
data's shape key equals the one in its identity (else it was not made from this data folder's
file: it is listed and left alone). Each record is rewritten atomically, its content unchanged
but for ``data_fingerprint`` (after ``identity``) and ``data_fingerprint_added`` (how and when).
Records that have a fingerprint are not touched; unreadable files are listed and left alone, and
so are semi-synthetic records: their graph is made from the data by code (the runner fingerprints
that graph, ``DataSource.run_fingerprint``), which may have changed since they ran — the loaded
graph's fingerprint would not match the runner's, and the derived graph's now could credit them
with a graph they never saw.

Exit 0 when every record of RUNS_DIR ends with a fingerprint, else 1. Run it only while no
experiment writes into RUNS_DIR, and first on a copy (``cp -r RUNS_DIR COPY``) to check.
"""
from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path

from hiertail_fast._argparse import ArgumentParser, dir_arg
from hiertail_fast._files import atomic_write_text
from hiertail_fast.experiments.data_source import DataSource
from hiertail_fast.experiments.run_cache import _json_default


def _source_for(identity: dict, data_dir: Path, sources: dict) -> tuple[DataSource, str]:
    dataset = identity["dataset"]
    key = identity["data"]
    norm = key.get("feature_norm", "none")
    if dataset == "synthetic":
        syn = {"nodes": key["nodes"], "classes": key["classes"], "features": key["features"]}
        cache_key = ("synthetic", norm, tuple(syn.values()))
        if cache_key not in sources:
            sources[cache_key] = DataSource(None, syn, norm)
    else:
        cache_key = (str(data_dir), norm)
        if cache_key not in sources:
            sources[cache_key] = DataSource(data_dir, None, norm)
    return sources[cache_key], dataset


def migrate(runs_dir: Path, data_dir: Path, *, dry_run: bool = False, log=print) -> dict:
    """{"migrated", "had", "mismatched", "unreadable"}: counts, the last two lists of paths."""
    sources: dict = {}
    stats: dict = {"migrated": 0, "had": 0, "mismatched": [], "unreadable": []}
    stamp = time.strftime("%Y-%m-%dT%H:%M:%S%z")
    for path in sorted(Path(runs_dir).glob("*/*.json")):
        try:
            record = json.loads(path.read_text())
            identity = record["identity"]
            key = identity["data"]
            had = bool(record.get("data_fingerprint"))
            # (a malformed identity, e.g. a synthetic key without "nodes", raised KeyError here
            # after earlier records were rewritten: now it is left alone like any unreadable one)
            source, dataset = (None, None) if had else _source_for(identity, data_dir, sources)
        except (OSError, ValueError, KeyError, TypeError, AttributeError) as exc:
            stats["unreadable"].append(str(path))
            log(f"unreadable, left alone: {path} ({exc!r})")
            continue
        if had:
            stats["had"] += 1
            continue
        if isinstance(identity.get("split"), list) and identity["split"][:1] == ["semi_lt"]:
            stats["mismatched"].append(str(path))
            log(f"{path}: a semi-synthetic run (its graph is made by code that may have changed "
                "since it ran: it cannot be attributed); left alone")
            continue
        try:
            found = source.data_key(dataset)
            fingerprint = source.fingerprint(dataset)
        except (OSError, ValueError) as exc:
            stats["mismatched"].append(str(path))
            log(f"no data for {path} ({exc}); left alone")
            continue
        if found != key:
            stats["mismatched"].append(str(path))
            log(f"{path}: its data key {key} is not {dataset}'s here ({found}); left alone")
            continue
        new = {}
        for k, v in record.items():
            if k in ("data_fingerprint", "data_fingerprint_added"):
                continue  # an empty one (null, ""): replaced below, not copied over the new one
            new[k] = v
            if k == "identity":
                new["data_fingerprint"] = fingerprint
                new["data_fingerprint_added"] = (
                    f"by hiertail_fast.experiments.migrate_fingerprints on {stamp}, from "
                    f"{'the synthetic graph' if dataset == 'synthetic' else data_dir.resolve()}")
        if not dry_run:
            atomic_write_text(path, json.dumps(new, indent=1, default=_json_default) + "\n")
        stats["migrated"] += 1
    return stats


def main(argv: list[str] | None = None) -> int:
    p = ArgumentParser(prog="python -m hiertail_fast.experiments.migrate_fingerprints",
                       description=__doc__.split("\n\n")[0])
    p.add_argument("runs_dir", type=dir_arg, help="the runs folder (<dataset>/<run>.json)")
    p.add_argument("--data-dir", type=dir_arg, help="the data folder the runs were made from "
                   "(default $HIERTAIL_DATA, else ../shared/data)")
    p.add_argument("--dry-run", action="store_true", help="count, write nothing")
    args = p.parse_args(argv)
    data_dir = args.data_dir or Path(os.environ.get("HIERTAIL_DATA") or "../shared/data")
    if not args.runs_dir.is_dir():
        p.error(f"{args.runs_dir} is not a directory")
    stats = migrate(args.runs_dir, data_dir, dry_run=args.dry_run)
    left = len(stats["mismatched"]) + len(stats["unreadable"])
    print(f"{'would add' if args.dry_run else 'added'} a fingerprint to {stats['migrated']} "
          f"record(s); {stats['had']} had one; {left} left without one")
    return 0 if left == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
