"""Conversion between PyG and the uniform ``.npz`` format, written atomically.

``python -m hiertail_fast.data convert SOURCE OUT [--root DIR] [--force] [--download]``

SOURCE is a dataset name (``load_dataset(SOURCE, root)``: the official preprocessing applied),
a uniform ``.npz`` file or a ``.pt`` file holding a PyG ``Data`` (``torch.save(data, path)``;
read with ``torch.load(weights_only=False)``, i.e. unpickled: convert only files you trust).
OUT's suffix picks the format: ``.npz`` (uniform; a ``Data``'s masks go to ``--split-out`` as
``train`` / ``val`` / ``test`` arrays, the file ``--split`` of the trainer reads) or ``.pt``
(a PyG ``Data``, masks included).

Every file is written to a temporary file in OUT's directory and moved into place
(``os.link`` without ``--force``, so an existing file is never replaced even by a concurrent
writer; ``os.replace`` with it): readers never see a half-written file, and an existing file
is kept unless ``force``.
"""
from __future__ import annotations

import argparse
import os
import sys
import warnings
from pathlib import Path
from typing import Any, Sequence

import numpy as np
import torch

from hiertail_fast._argparse import ArgumentParser, dir_arg, path_arg
from hiertail_fast._files import check_new_output, overwritten_input, same_file, write_atomic
from hiertail_fast._validation import check_path
from hiertail_fast.data.datasets import (
    DATASETS,
    canonical_name,
    dataset_input_paths,
    load_dataset,
)
from hiertail_fast.data.io import (
    GraphData,
    check_graph_arrays,
    check_unit_weights,
    load_npz,
    save_npz,
)
from hiertail_fast.data.pyg import from_pyg_data, is_pyg_data, split_from_masks, to_pyg_data

__all__ = ["write_atomic", "save_graph", "convert", "main"]

_FORMATS = (".npz", ".pt")


def _suffix(path: Path) -> str:
    """The suffix that picks a file's format, in any case (load_npz reads G.NPZ; convert
    refused it as "expected a .npz or .pt file"; a data audit)."""
    return path.suffix.lower()


def save_graph(graph: GraphData, path: Any, *, force: bool = False, split: Any = None) -> Path:
    """Write ``graph`` atomically: ``.npz`` uniform format or ``.pt`` PyG ``Data`` (with the
    masks of ``split``). The .npz format has no edge weights: a weighted graph is refused
    unless every weight is 1."""
    path = check_path(path, "path")
    if _suffix(path) not in _FORMATS:
        raise ValueError(f"output {path}: the suffix must be one of {_FORMATS}")
    if _suffix(path) == ".pt":
        data = to_pyg_data(graph, split=split)
        return write_atomic(path, lambda tmp: torch.save(data, tmp), force=force)
    check_unit_weights(graph.edge_weight, path)
    return save_npz(path, graph.edge_index, graph.x, graph.y, force=force)


def _read_source(source: Any, root: Any, download: bool) -> tuple[GraphData, Any]:
    """(graph, split or None) of a dataset name, a .npz path or a .pt file with a Data."""
    if is_pyg_data(source):
        return _from_data(source), _masks(source)
    if isinstance(source, GraphData):
        return source, None
    if not isinstance(source, (str, os.PathLike)):
        raise TypeError(f"source must be a dataset name, a path, a Data or a GraphData, got "
                        f"{type(source).__name__}")
    path = Path(source)
    if _is_file_source(path):
        if path.is_dir():
            raise IsADirectoryError(f"source {path} is a directory, not a .npz or .pt file")
        if not path.is_file():
            raise FileNotFoundError(f"source file not found: {path}")
        if _suffix(path) == ".npz":
            return load_npz(path), None
        if _suffix(path) != ".pt":
            raise ValueError(f"source {path}: expected a .npz or .pt file")
        try:
            obj = torch.load(path, map_location="cpu", weights_only=False)
        except Exception as exc:  # not a torch.save file: truncated, garbage, another format
            reason = (str(exc).strip().splitlines() or [""])[0]
            raise ValueError(f"source {path}: cannot be read as a torch.save file of a PyG "
                             f"Data ({type(exc).__name__}: {reason})") from None
        if not is_pyg_data(obj):
            raise ValueError(f"source {path}: holds a {type(obj).__name__}, not a PyG Data")
        return _from_data(obj, name=path.stem), _masks(obj)
    try:
        name = canonical_name(str(source))
    except ValueError:
        raise ValueError(f"source {str(source)!r} is neither a file nor a dataset name "
                         f"({', '.join(DATASETS)})") from None
    return load_dataset(name, root, download=download), None


# the Data attributes a converted graph carries (x, edge_index, y, edge weights, the split)
_CONVERTED = {"x", "edge_index", "y", "edge_weight", "num_nodes", "train_mask", "val_mask",
              "test_mask"}


def _from_data(data: Any, name: str | None = None) -> GraphData:
    """``from_pyg_data``, with one warning naming the Data's attributes the converted graph
    does not carry (edge_attr, pos, node_year, ... were dropped without a word, edge_attr with
    a warning worded for training; a data audit)."""
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="the Data's edge_attr is not read")
        graph = from_pyg_data(data, name=name)
    keys = data.keys() if callable(data.keys) else data.keys     # (a property before PyG 2.4)
    extras = sorted(k for k in keys if k not in _CONVERTED)
    if extras:
        warnings.warn(f"the source Data's {', '.join(extras)} are not converted (a converted "
                      f"graph holds x, edge_index, y, edge_weight and the train/val/test masks)",
                      UserWarning, stacklevel=4)      # (convert's caller)
    return graph


def _masks(data: Any) -> Any:
    """A Data's split (its train / val / test masks; None without), or the ValueError that
    says why its masks are not one split (some of the three, several columns): `convert`
    raises it only where the split is written."""
    try:
        return split_from_masks(data)
    except ValueError as exc:
        return exc


def _is_file_source(source: Any) -> bool:
    """Whether ``source`` names a file (a .npz / .pt path, or any existing path), not a
    dataset name. An existing folder named like a dataset is the dataset name: a folder is
    never a source file, and PyG's own folders (``ROOT/cora``, ``ROOT/wiki``) made every
    ``convert cora ...`` run inside the data root fail ("--root ... not to the file cora")."""
    path = Path(source)
    if _suffix(path) in _FORMATS:
        return True
    if path.is_dir():
        try:
            canonical_name(str(source))
        except ValueError:
            return True             # (reading it says it is a directory)
        return False
    return path.exists()


def _source_paths(source: Any, root: Any) -> list[Path]:
    """The files (and PyG dataset folders) ``source`` is read from: its path, or for a dataset
    name those of :func:`dataset_input_paths` (none when the name or root is bad: reading the
    source says so)."""
    if not isinstance(source, (str, os.PathLike)):
        return []
    if _is_file_source(source):
        return [Path(source)]
    try:
        return dataset_input_paths(str(source), root)
    except (ValueError, TypeError):
        return []


def convert(source: Any, out: Any, *, root: Any = None, force: bool = False,
            download: bool = False, split_out: Any = None) -> GraphData:
    """Convert ``source`` (module docstring) to ``out``; returns the graph written.

    A split read from a ``Data``'s masks goes into a ``.pt`` output, and into ``split_out``
    (``.npz`` with ``train`` / ``val`` / ``test`` node ids) when given.
    """
    out = check_path(out, "out")
    split_out = None if split_out is None else check_path(split_out, "split_out")
    if _suffix(out) not in _FORMATS:
        raise ValueError(f"output {out}: the suffix must be one of {_FORMATS}")
    if split_out is not None and same_file(out, split_out):
        raise ValueError(f"split_out={split_out} is the output file itself: the split would "
                         "replace the graph; write it to another file")
    for p in (out, split_out):
        if p is None:
            continue
        if p.is_dir():
            raise IsADirectoryError(f"output {p} is a directory, not a file")
        src = overwritten_input(p, _source_paths(source, root))
        if src is not None and not src.exists() and _is_file_source(source):
            src = None          # a source file that is not there: reading it says so (a review)
        if src is not None and not src.exists() and same_file(p, src):
            # (the dataset's .npz, not there yet: nothing to overwrite; a data audit)
            raise ValueError(f"output {p} is where the source {_describe(source)} is read from "
                             f"first when it exists ({src}): every later load would read the "
                             "converted graph there in place of the raw files; write to "
                             "another file")
        if src is not None:
            raise ValueError(f"output {p} is an input of source {_describe(source)} ({src}): "
                             "it would be overwritten (with --force) by the converted graph; "
                             "write to another file")
        # write_atomic's own refusals, for both files before any is written (a --split-out
        # in a missing folder failed after the graph was written: a half-done conversion)
        check_new_output(p, force=force)
    graph, split = _read_source(source, root, download)
    # save_npz's checks, here naming the source, not a temp file; a .pt output too (NaN
    # features went into it, which every loader of ours then refuses)
    check_graph_arrays(graph.edge_index, graph.x, graph.y, f"source {_describe(source)}")
    if split_out is not None and split is None:
        raise ValueError(f"split_out={split_out}: the source has no train/val/test masks")
    wanted = split_out is not None or _suffix(out) == ".pt"
    if isinstance(split, ValueError) and wanted:
        raise split
    if split is not None and not wanted:
        # (they were dropped without a word, and a later --data run took the natural split;
        # masks that are not one split refused the whole conversion; a data audit)
        what = ("train/val/test masks" if not isinstance(split, ValueError)
                else f"masks ({split})")
        warnings.warn(f"the source's {what} are not written to {out} (the .npz format has "
                      f"none): pass split_out= (--split-out FILE.npz) to keep a split, or "
                      f"write a .pt file", UserWarning, stacklevel=2)
        split = None
    save_graph(graph, out, force=force, split=split if _suffix(out) == ".pt" else None)
    if split_out is not None:
        arrays = {k: t.numpy() for k, t in zip(("train", "val", "test"), split, strict=True)}
        write_atomic(split_out, lambda tmp: _savez(tmp, arrays), force=force)
    return graph


def _describe(source: Any) -> str:
    if isinstance(source, (str, os.PathLike)):
        return str(source)
    return f"({type(source).__name__})"


def _savez(path: Path, arrays: dict) -> None:
    with open(path, "wb") as fh:  # a handle: numpy would append ".npz" to a bare path
        np.savez(fh, **arrays)


def build_parser() -> argparse.ArgumentParser:
    p = ArgumentParser(prog="python -m hiertail_fast.data",
                       description="Dataset tools of hiertail_fast.")
    sub = p.add_subparsers(dest="command", required=True)
    c = sub.add_parser("convert", help="dataset name | .npz | .pt (PyG Data) -> .npz | .pt")
    c.add_argument("source", help=f"a dataset name ({', '.join(DATASETS)}), a uniform .npz "
                   "or a .pt file with a PyG Data (unpickled by torch.load: only a file "
                   "you trust)")
    c.add_argument("out", type=path_arg,
                   help="output file: .npz (uniform format) or .pt (PyG Data)")
    c.add_argument("--root", type=dir_arg, help="data directory of a dataset name (default: "
                   "$HIERTAIL_DATA)")
    c.add_argument("--force", action="store_true", help="overwrite an existing output")
    c.add_argument("--download", action="store_true", help="let PyG download raw files")
    c.add_argument("--split-out", type=path_arg, help="write a Data's masks here (.npz)")
    return p


def main(argv: Sequence[str] | None = None) -> int:
    """``python -m hiertail_fast.data convert SOURCE OUT``: convert a dataset (a name or a
    file) to the uniform .npz (or .pt); usage errors exit with code 2 and one line on stderr."""
    parser = build_parser()
    args = parser.parse_args(argv)
    if _is_file_source(args.source) and (args.root is not None or args.download):
        parser.error(f"--root and --download apply to a dataset name, not to the file "
                     f"{args.source} (they were ignored)")
    try:
        with warnings.catch_warnings(record=True) as caught:    # (the filters as they are)
            g = convert(args.source, args.out, root=args.root, force=args.force,
                        download=args.download, split_out=args.split_out)
    except (ValueError, TypeError, OSError, ImportError) as exc:
        parser.error(str(exc))      # OSError: FileNotFound/FileExists/IsADirectory/Permission
    for w in caught:                # one line each, not Python's file:line and source line
        print(f"{parser.prog}: warning: {w.message}", file=sys.stderr)
    print(f"wrote {args.out}: {g.num_nodes} nodes, {g.num_edges} edges, {g.num_features} "
          f"features, {g.num_classes} classes", file=sys.stderr)
    return 0
