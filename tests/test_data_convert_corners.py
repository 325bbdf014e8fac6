"""``python -m hiertail_fast.data convert`` / :func:`convert` / :func:`save_graph` /
``GraphData.to_npz`` corners that a mutation audit (2026-12-03, session 44) found unchecked:
each test failed on the mutant it names and passes on main. In-process (``main([...])`` with
capsys), no network, no subprocess."""
from __future__ import annotations

import errno
import os
import re
import warnings
import zipfile

import numpy as np
import pytest
import torch

pytest.importorskip("torch_geometric")
from torch_geometric.data import Data  # noqa: E402

from hiertail_fast.data import conversion  # noqa: E402
from hiertail_fast.data.conversion import convert, main, save_graph, write_atomic  # noqa: E402
from hiertail_fast.data.io import GraphData, load_npz, save_npz  # noqa: E402
from hiertail_fast.train import load_split  # noqa: E402
from tests.test_data_datasets import _convert_exit_2  # noqa: E402

pytestmark = pytest.mark.usefixtures("one_thread")

EI = torch.tensor([[0, 1, 2, 3], [1, 0, 3, 2]])
Y = torch.tensor([0, 1, 1, 2, 0, 1])
TRAIN, VAL, TEST = [0, 1], [2], [3, 4, 5]


def _graph(**kw) -> GraphData:
    return GraphData(edge_index=EI, x=torch.arange(12.0).view(6, 2), y=Y, num_classes=3, **kw)


def _masked_data() -> Data:
    d = Data(x=torch.arange(12.0).view(6, 2), edge_index=EI, y=Y)
    for key, ids in (("train_mask", TRAIN), ("val_mask", VAL), ("test_mask", TEST)):
        mask = torch.zeros(6, dtype=torch.bool)
        mask[ids] = True
        d[key] = mask
    return d


def _no_dataset_load(monkeypatch):
    def fail(*args, **kwargs):
        raise AssertionError("the dataset was read although the output is refused")
    monkeypatch.setattr(conversion, "load_dataset", fail)


# ------------------------------------------------------------------------ save_graph
def test_save_graph_refuses_an_unknown_output_suffix(tmp_path):
    """``save_graph`` is public: a ``.csv`` (or any other) path must be refused, not silently
    filled with an .npz archive the user's tools then misread (mutant: the suffix check of
    save_graph dropped; ``convert`` checks the suffix on its own, so only this call shows it)."""
    with pytest.raises(ValueError, match=r"suffix must be one of"):
        save_graph(_graph(), tmp_path / "g.csv")
    assert list(tmp_path.iterdir()) == []


def test_save_graph_accepts_unit_edge_weights_in_npz(tmp_path):
    """Only weights that the .npz format cannot represent are refused: all-ones weights (what
    PyG and many pipelines attach by default) are the unweighted graph and are written
    (mutant: any ``edge_weight`` refused)."""
    path = save_graph(_graph(edge_weight=torch.ones(4)), tmp_path / "g.npz")
    assert torch.equal(load_npz(path).edge_index, EI)


# ------------------------------------------------------------------------ convert: sources
def test_convert_takes_a_data_object_with_its_masks(tmp_path):
    """An in-memory PyG ``Data`` converts like a .pt file: its masks become the split file
    (mutant: a Data object's masks dropped, so ``split_out`` was refused as 'no masks')."""
    convert(_masked_data(), tmp_path / "g.npz", split_out=tmp_path / "split.npz")
    split = load_split(tmp_path / "split.npz")
    assert [split[k].tolist() for k in ("train", "val", "test")] == [TRAIN, VAL, TEST]
    assert torch.equal(load_npz(tmp_path / "g.npz").y, Y)


def test_convert_to_npz_says_when_a_datas_masks_are_not_written(tmp_path, capsys):
    """Without ``split_out`` the masks were dropped without a word (a later ``--data`` run
    took the natural split), and masks that are not one split (only train_mask, several
    columns) refused the whole conversion with advice that did not apply (a data audit,
    session 67): now a warning, the graph written; where the split is written (a .pt output,
    ``split_out``) such masks are still an error."""
    partial = Data(x=torch.arange(12.0).view(6, 2), edge_index=EI, y=Y,
                   train_mask=torch.ones(6, dtype=torch.bool))
    for data, what in ((_masked_data(), "train/val/test masks are not written"),
                       (partial, "masks (data has train_mask but not val_mask, test_mask")):
        out = tmp_path / "g.npz"
        with pytest.warns(UserWarning, match=re.escape(f"the source's {what}")):
            convert(data, out, force=True)
        assert torch.equal(load_npz(out).y, Y)
    with pytest.raises(ValueError, match="train_mask but not val_mask"):
        convert(partial, tmp_path / "g.pt")
    with pytest.raises(ValueError, match="train_mask but not val_mask"):
        convert(partial, tmp_path / "h.npz", split_out=tmp_path / "s.npz")
    # on the command line: one line, not Python's warning with its file and source line
    torch.save(_masked_data(), tmp_path / "m.pt")
    assert main(["convert", str(tmp_path / "m.pt"), str(tmp_path / "m.npz")]) == 0
    err = capsys.readouterr().err
    assert err.startswith("python -m hiertail_fast.data: warning: the source's train/val/test "
                          "masks are not written to") and "UserWarning" not in err
    # a weighted graph: GraphData.to_npz refuses what save_graph refuses (it dropped them)
    with pytest.raises(ValueError, match="the graph has edge weights, which the .npz format"):
        _graph(edge_weight=torch.full((4,), 2.0)).to_npz(tmp_path / "w.npz")
    assert not (tmp_path / "w.npz").exists()


def test_convert_takes_a_graphdata_and_refuses_other_objects(tmp_path):
    """A :class:`GraphData` is written as is; any other object is a TypeError naming its type
    (mutants: GraphData refused; the TypeError turned into a ValueError)."""
    g = _graph()
    assert convert(g, tmp_path / "g.pt") is g
    back = torch.load(tmp_path / "g.pt", weights_only=False)
    assert torch.equal(back.x, g.x) and torch.equal(back.edge_index, EI)
    with pytest.raises(TypeError, match="got dict"):
        convert({"x": g.x}, tmp_path / "h.npz")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["g.pt"]


@pytest.mark.parametrize("suffix", [".npz", ".pt"])
def test_a_missing_source_file_is_reported_as_not_found(tmp_path, capsys, suffix):
    """A mistyped source path says "not found" (FileNotFoundError; exit 2 on the command line),
    not "neither a file nor a dataset name" or "cannot be read as a torch.save file" (mutants:
    the existence check dropped; a missing .npz path taken for a dataset name)."""
    missing = tmp_path / f"grpah{suffix}"
    with pytest.raises(FileNotFoundError, match="source file not found"):
        convert(missing, tmp_path / "out.npz")
    err = _convert_exit_2(["convert", str(missing), str(tmp_path / "out.npz")], capsys)
    assert f"source file not found: {missing}" in err
    assert list(tmp_path.iterdir()) == []


def test_a_pt_file_without_a_data_object_is_named(tmp_path, capsys):
    """A .pt holding something else (a bare tensor, a state dict) is refused naming what it
    holds, not an AttributeError traceback from deep in the conversion (mutant: the Data check
    dropped)."""
    torch.save(torch.ones(3, 2), tmp_path / "t.pt")
    err = _convert_exit_2(["convert", str(tmp_path / "t.pt"), str(tmp_path / "o.npz")], capsys)
    assert f"source {tmp_path / 't.pt'}: holds a Tensor, not a PyG Data" in err


def test_an_unreadable_pt_is_reported_in_one_line(tmp_path, capsys, monkeypatch):
    """torch.load's errors can span lines (C++ context, hints): the command line reports the
    first only, on the error line itself (mutant: the whole message, whose last line then read
    as the error)."""
    src = tmp_path / "g.pt"
    src.write_bytes(b"not a checkpoint")

    def load(*args, **kwargs):
        raise RuntimeError("failed reading zip archive\n  at inline_container.cc:123\nhint")
    monkeypatch.setattr(torch, "load", load)
    err = _convert_exit_2(["convert", str(src), str(tmp_path / "o.npz")], capsys)
    assert "(RuntimeError: failed reading zip archive)" in err


def test_the_graph_of_a_pt_file_is_named_after_it(tmp_path):
    """The returned graph of a .pt source carries the file's stem as its name, as load_npz
    does for .npz files (mutant: the name dropped: every converted graph was 'data')."""
    torch.save(_masked_data(), tmp_path / "citeseer_mine.pt")
    assert convert(tmp_path / "citeseer_mine.pt", tmp_path / "o.npz").name == "citeseer_mine"


def test_download_reaches_load_dataset(tmp_path, monkeypatch, capsys):
    """``--download`` / ``download=True`` is passed on to ``load_dataset``; without it PyG is
    never allowed to fetch (mutants: the flag dropped in ``convert`` or in ``main``)."""
    seen = []

    def load(name, root, *, download):
        seen.append((name, download))
        return _graph()
    monkeypatch.setattr(conversion, "load_dataset", load)
    convert("cora_full", tmp_path / "a.npz", root=tmp_path, download=True)
    assert main(["convert", "cora_full", str(tmp_path / "b.npz"), "--root", str(tmp_path),
                 "--download"]) == 0
    assert main(["convert", "cora_full", str(tmp_path / "c.npz"), "--root", str(tmp_path)]) == 0
    assert seen == [("cora_full", True), ("cora_full", True), ("cora_full", False)]


# ------------------------------------------------------------------------ convert: outputs
def test_outputs_are_checked_before_the_source_is_read(tmp_path, monkeypatch):
    """An existing output without force, or a bad suffix, is refused before the (possibly
    long, possibly downloading) dataset load: the user is not told after minutes of
    preprocessing (mutants: the source read first; the early suffix check dropped)."""
    _no_dataset_load(monkeypatch)
    (tmp_path / "out.npz").write_bytes(b"mine")
    with pytest.raises(FileExistsError, match="out.npz exists"):
        convert("cora_full", tmp_path / "out.npz", root=tmp_path)
    (tmp_path / "out.csv").write_bytes(b"mine too")
    with pytest.raises(ValueError, match="suffix must be one of"):
        convert("cora_full", tmp_path / "out.csv", root=tmp_path)
    assert (tmp_path / "out.npz").read_bytes() == b"mine"


def test_an_output_directory_is_an_isadirectoryerror(tmp_path):
    """The API raises IsADirectoryError (an OSError, as open() would) for an output that is a
    folder, with or without force (mutant: a ValueError)."""
    (tmp_path / "g.npz").mkdir()
    for force in (False, True):
        with pytest.raises(IsADirectoryError, match="is a directory"):
            convert(_masked_data(), tmp_path / "g.npz", force=force)


def test_an_output_spelled_differently_from_its_source_is_still_refused(tmp_path, monkeypatch):
    """The source given relative to the working directory and the output as an absolute path
    (or through a symlinked folder) are the same file: refused, the user's graph kept (mutant:
    the paths compared as spelled, and ``--force`` replaced the source)."""
    data = tmp_path / "data"
    data.mkdir()
    src = save_npz(data / "g.npz", EI, np.ones((6, 2)), Y)
    before = src.read_bytes()
    (tmp_path / "alias").symlink_to(data, target_is_directory=True)
    monkeypatch.chdir(data)
    for out in (src, tmp_path / "alias" / "g.npz"):
        with pytest.raises(ValueError, match="is an input of source g.npz"):
            convert("g.npz", out, force=True)
    assert src.read_bytes() == before


def test_a_split_out_spelled_differently_from_the_output_is_refused(tmp_path, monkeypatch):
    """``split_out`` naming the output file by another spelling (relative vs absolute, or
    through a symlinked folder) is the output file itself: refused before anything is
    written, with or without force, not the graph written and then replaced by the split."""
    (tmp_path / "alias").symlink_to(tmp_path, target_is_directory=True)
    monkeypatch.chdir(tmp_path)
    out = tmp_path / "g.npz"
    for split_out in ("g.npz", tmp_path / "alias" / "g.npz"):
        for force in (False, True):
            with pytest.raises(ValueError, match="is the output file itself"):
                convert(_masked_data(), out, split_out=split_out, force=force)
            assert not out.exists()


def test_an_existing_output_is_refused_before_it_is_written(tmp_path):
    """Without force an existing file is refused before the writer runs: a large graph is not
    serialised and compressed only to be thrown away (mutant: the early check dropped, the
    final link refusing it after the work)."""
    target = tmp_path / "g.npz"
    target.write_bytes(b"mine")
    calls = []
    with pytest.raises(FileExistsError, match="pass force=True"):
        write_atomic(target, calls.append)
    assert calls == [] and target.read_bytes() == b"mine"


def test_force_replaces_both_the_graph_and_the_split(tmp_path):
    """A rerun with force rewrites an existing graph AND split file (mutant: force not passed
    to the split's write, which failed after the graph was already replaced)."""
    out, split = tmp_path / "g.npz", tmp_path / "split.npz"
    out.write_bytes(b"old graph")
    split.write_bytes(b"old split")
    convert(_masked_data(), out, split_out=split, force=True)
    assert load_npz(out).num_nodes == 6
    assert load_split(split)["test"].tolist() == TEST


def test_a_split_file_made_while_the_graph_is_written_is_kept(tmp_path, monkeypatch):
    """Without force the split is linked into place, not replaced: a file another writer made
    between the early check and the write is kept, and the conversion says so (written with
    force=True regardless, it was replaced silently; a mutation pass, session 73)."""
    split = tmp_path / "split.npz"
    real_save = conversion.save_graph

    def save_then_another_writer(*args, **kwargs):
        out = real_save(*args, **kwargs)
        split.write_bytes(b"another writer's file")
        return out

    monkeypatch.setattr(conversion, "save_graph", save_then_another_writer)
    with pytest.raises(FileExistsError):
        convert(_masked_data(), tmp_path / "g.npz", split_out=split)
    assert split.read_bytes() == b"another writer's file"


# ------------------------------------------------------------------------ the command line
def test_cli_force_overwrites_and_reports_the_graph(tmp_path, capsys):
    """``--force`` replaces an existing output, and the success line on stderr gives the
    written graph's sizes (stdout stays clean for pipelines) (mutants: --force not forwarded;
    the summary on stdout; edges reported as the node count)."""
    src = tmp_path / "g.pt"
    torch.save(_masked_data(), src)
    out = tmp_path / "o.npz"
    out.write_bytes(b"old")
    assert main(["convert", str(src), str(out), "--force"]) == 0
    captured = capsys.readouterr()
    assert captured.out == ""
    # (after the line saying the masks are not written: test_convert_to_npz_says_...)
    assert captured.err.strip().splitlines()[-1] == (
        f"wrote {out}: 6 nodes, 4 edges, 2 features, 3 classes")
    assert load_npz(out).num_edges == 4


def test_cli_root_and_download_with_any_source_file_are_a_usage_error(tmp_path, capsys):
    """``--root`` / ``--download`` with a source file are refused naming the file, whatever the
    file's suffix (G.NPZ, which load_npz reads, or a .csv), not silently ignored or reported
    as another error."""
    save_npz(tmp_path / "G.NPZ", EI, np.ones((6, 2)), Y)
    (tmp_path / "graph.csv").write_text("0,1\n")
    for name in ("G.NPZ", "graph.csv"):
        src = tmp_path / name
        for extra in (["--root", str(tmp_path)], ["--download"]):
            err = _convert_exit_2(["convert", str(src), str(tmp_path / "o.npz"), *extra],
                                  capsys)
            assert f"--root and --download apply to a dataset name, not to the file {src}" in err
    assert not (tmp_path / "o.npz").exists()


def test_cli_without_a_command_is_a_usage_error(capsys):
    """``python -m hiertail_fast.data`` alone exits 2 naming the missing command, not with an
    AttributeError traceback (mutant: the subcommand made optional)."""
    err = _convert_exit_2([], capsys)
    assert "required: command" in err


def test_cli_a_missing_optional_dependency_is_one_line(tmp_path, monkeypatch, capsys):
    """An ImportError while loading (torch_geometric or scipy missing for a PyG dataset) is a
    one-line error with exit 2, its install hint kept (mutant: ImportError not caught)."""
    def load(*args, **kwargs):
        raise ImportError("cora_full needs torch_geometric: pip install torch_geometric")
    monkeypatch.setattr(conversion, "load_dataset", load)
    err = _convert_exit_2(["convert", "cora_full", str(tmp_path / "o.npz"),
                           "--root", str(tmp_path)], capsys)
    assert "error: cora_full needs torch_geometric: pip install torch_geometric" in err


# ------------------------------------------------------------------------ GraphData.to_npz
def test_to_npz_forwards_sparse_x_and_force(tmp_path):
    """``to_npz(sparse_x=True)`` writes the CSR parts and ``to_npz(force=True)`` replaces an
    existing file (mutants: either keyword dropped on the way to save_npz)."""
    g = _graph()
    path = tmp_path / "g.npz"
    path.write_bytes(b"old")
    g.to_npz(path, sparse_x=True, force=True)
    with np.load(path) as z:
        assert "x" not in z.files and {"x_data", "x_indices", "x_indptr", "x_shape"} <= set(z.files)
    assert torch.equal(load_npz(path).x, g.x)


def test_save_npz_compresses_and_checks_force(tmp_path):
    """Files are written compressed, as documented (a dense feature matrix of zeros would
    otherwise take n·F·4 bytes), and ``force`` must be a bool: ``force="no"`` is truthy and
    would overwrite (mutants: np.savez; the flag check dropped)."""
    path = save_npz(tmp_path / "g.npz", EI, np.zeros((6, 500), np.float32), Y)
    with zipfile.ZipFile(path) as z:
        assert {i.compress_type for i in z.infolist()} == {zipfile.ZIP_DEFLATED}
    assert path.stat().st_size < 6 * 500 * 4 / 10
    with pytest.raises(TypeError, match="force must be a bool"):
        save_npz(path, EI, np.ones((6, 2)), Y, force="no")
    assert load_npz(path).x.abs().sum() == 0


def test_write_without_hard_links_still_writes(tmp_path, monkeypatch):
    """On a file system without hard links (os.link fails with EPERM, e.g. some network and
    FUSE mounts) a new file is still written, by a plain rename (mutant: the fallback dropped,
    so saving failed there)."""
    def no_link(src, dst):
        raise OSError(errno.EPERM, "Operation not permitted")
    monkeypatch.setattr(os, "link", no_link)
    path = save_npz(tmp_path / "g.npz", EI, np.ones((6, 2)), Y)
    assert load_npz(path).num_nodes == 6
    assert [p.name for p in tmp_path.iterdir()] == ["g.npz"]


# ------------------------------------------------------------------------ live bugs (fixed)
def test_a_split_out_in_a_missing_folder_is_refused_before_the_graph_is_written(tmp_path):
    """Live bug: ``--split-out nodir/split.npz`` wrote the graph, then failed on the split's
    folder, leaving a half-done conversion (and a rerun refused: "out.npz exists"). Every
    output's folder is now checked before anything is read or written."""
    torch.save(_masked_data(), tmp_path / "g.pt")
    with pytest.raises(FileNotFoundError, match="output directory .*nodir does not exist"):
        convert(tmp_path / "g.pt", tmp_path / "out.npz", split_out=tmp_path / "nodir" / "s.npz")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["g.pt"]


@pytest.mark.parametrize("name, folder", [("cora", "cora"), ("wiki", "wiki")])
def test_convert_inside_the_data_root_next_to_pyg_folders(tmp_path, monkeypatch, capsys,
                                                          name, folder):
    """Live bug: run inside the data root, where PyG keeps a dataset in ROOT/cora or
    ROOT/wiki, ``convert cora out.npz --root .`` took the folder for the source file and
    exited with "--root and --download apply to a dataset name, not to the file cora" (and
    without --root: "source cora is a directory"). A folder is never a source file: a
    folder named like a dataset is the dataset name."""
    (tmp_path / folder / "raw").mkdir(parents=True)
    seen = []

    def load(name, root, *, download):
        seen.append((name, root))
        return _graph()
    monkeypatch.setattr(conversion, "load_dataset", load)
    monkeypatch.chdir(tmp_path)
    assert main(["convert", name, "out.npz", "--root", "."]) == 0
    assert convert(name, "out.pt", root=tmp_path).num_nodes == 6
    assert [n for n, _ in seen] == [conversion.canonical_name(name)] * 2
    # the PyG folder is still an input: writing into it is refused
    err = _convert_exit_2(["convert", name, f"{folder}/raw/x.npz", "--root", "."], capsys)
    assert "is an input of source" in err
    # a folder that is no dataset name stays a source error naming it
    (tmp_path / "mydir").mkdir()
    err = _convert_exit_2(["convert", "mydir", "o.npz"], capsys)
    assert "source mydir is a directory" in err


def test_convert_names_the_data_attributes_it_does_not_carry(tmp_path, capsys):
    """edge_attr, pos, node_year, ... of a Data were dropped without a word (edge_attr with a
    warning worded for training: "the graph is used unweighted") (a data audit, session 67)."""
    d = _masked_data()
    d.edge_attr, d.pos = torch.rand(4, 3), torch.randn(6, 2)
    with pytest.warns(UserWarning, match=r"the source Data's edge_attr, pos are not converted") \
            as caught:
        convert(d, tmp_path / "g.pt")
    assert not any("used unweighted" in str(w.message) for w in caught)
    assert [w.filename for w in caught if "not converted" in str(w.message)] == [__file__]
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        convert(_masked_data(), tmp_path / "h.pt")          # nothing dropped: nothing said


def test_an_explicit_num_nodes_is_carried_not_reported_as_dropped(tmp_path):
    """A Data's ``num_nodes`` is part of the converted graph (its node count): a Data that sets
    it explicitly converts without a warning that something was not converted."""
    d = _masked_data()
    d.num_nodes = 6
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert convert(d, tmp_path / "g.pt").num_nodes == 6


def test_an_existing_file_of_another_format_is_named_as_such(tmp_path):
    """An existing file is a file source whatever its suffix: one that is neither .npz nor .pt
    is refused as such, not looked up as a dataset name."""
    src = tmp_path / "graph.csv"
    src.write_text("0,1\n")
    with pytest.raises(ValueError, match=r"expected a \.npz or \.pt file"):
        convert(src, tmp_path / "g.npz")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["graph.csv"]
