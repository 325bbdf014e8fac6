"""``load_dataset`` (the .npz path and PyG's CitationFull over a fake raw-file tree, with the same
official preprocessing on both), its error messages, the atomic ``convert`` (API and
``python -m hiertail_fast.data``) and ``python -m hiertail_fast.train --dataset``. No network."""
from __future__ import annotations

import json
import os
import subprocess
import sys

import numpy as np
import pytest
import torch

pytest.importorskip("torch_geometric")
import scipy.sparse as sp  # noqa: E402
from torch_geometric.data import Data  # noqa: E402

from hiertail_fast._train_cli import main as train_main  # noqa: E402
from hiertail_fast.data import load_dataset  # noqa: E402
from hiertail_fast.data.conversion import convert, main, save_graph, write_atomic  # noqa: E402
from hiertail_fast.data.datasets import official_preprocess, resolve_root  # noqa: E402
from hiertail_fast.data.io import GraphData, load_npz, save_npz  # noqa: E402
from hiertail_fast.train import load_split  # noqa: E402

pytestmark = pytest.mark.usefixtures("one_thread")

SIZES = (3, 12, 6, 14, 5)  # distinct class sizes: relabelled order 3, 1, 2, 4, 0


def _raw_cora(seed: int = 0):
    """graph2gauss-style arrays: directed edges with a duplicate and a self-loop, count
    attributes (values up to 3), labels in random order."""
    rng = np.random.default_rng(seed)
    n = sum(SIZES)
    y = rng.permutation(np.repeat(np.arange(len(SIZES)), SIZES))
    src, dst = rng.integers(0, n, 120), rng.integers(0, n, 120)
    src, dst = np.append(src, [4, 7, 7]), np.append(dst, [4, 9, 9])  # self-loop, duplicate
    attr = rng.integers(0, 4, (n, 10)) * (rng.random((n, 10)) < 0.4)
    return src, dst, attr.astype(np.float32), y


def _write_citationfull_raw(root, seed: int = 0):
    """The file CitationFull(root, "cora") reads: root/cora/raw/cora.npz (read_npz's keys)."""
    src, dst, attr, y = _raw_cora(seed)
    n = y.shape[0]
    adj = sp.csr_matrix((np.ones(src.shape[0], np.float32), (src, dst)), shape=(n, n))
    adj.sum_duplicates()
    att = sp.csr_matrix(attr)
    raw = root / "cora" / "raw"
    raw.mkdir(parents=True)
    np.savez(raw / "cora.npz", adj_data=adj.data, adj_indices=adj.indices,
             adj_indptr=adj.indptr, adj_shape=np.array(adj.shape), attr_data=att.data,
             attr_indices=att.indices, attr_indptr=att.indptr, attr_shape=np.array(att.shape),
             labels=y)


def _expected_cora(seed: int = 0):
    """The official preprocessing computed independently with numpy."""
    src, dst, attr, y = _raw_cora(seed)
    n = y.shape[0]
    pairs = {(a, b) for a, b in zip(src, dst, strict=True) if a != b}
    pairs |= {(b, a) for a, b in pairs}
    ei = np.array(sorted(pairs), dtype=np.int64).T
    order = np.argsort(-np.bincount(y), kind="stable")
    new = np.empty_like(order)
    new[order] = np.arange(order.shape[0])
    assert n == attr.shape[0]
    return ei, (attr > 0).astype(np.float32), new[y]


def _assert_same(a: GraphData, b: GraphData):
    for key in ("edge_index", "x", "y"):
        assert torch.equal(getattr(a, key), getattr(b, key)), key
    assert a.num_classes == b.num_classes and a.name == b.name


@pytest.fixture
def cora_root(tmp_path):
    root = tmp_path / "pyg"
    _write_citationfull_raw(root)
    return root


def test_citationfull_raw_tree_gives_the_official_preprocessing(cora_root):
    g = load_dataset("cora_full", root=cora_root)
    ei, x, y = _expected_cora()
    assert g.name == "cora_full" and g.num_classes == len(SIZES)
    np.testing.assert_array_equal(g.edge_index.numpy(), ei)
    np.testing.assert_array_equal(g.x.numpy(), x)
    np.testing.assert_array_equal(g.y.numpy(), y)
    assert np.bincount(g.y.numpy()).tolist() == sorted(SIZES, reverse=True)
    assert (cora_root / "cora" / "processed").is_dir()  # PyG's own cache, next to raw/


def test_npz_and_pyg_paths_agree(cora_root, tmp_path):
    """The raw graph as a uniform .npz (directed, duplicates, self-loop, count attributes) and
    PyG's raw file give the same graph; so does the converted .npz."""
    via_pyg = load_dataset("cora_full", root=cora_root, source="pyg")
    src, dst, attr, y = _raw_cora()
    npz_root = tmp_path / "npz"
    npz_root.mkdir()
    save_npz(npz_root / "cora_full.npz", np.stack([src, dst]), attr, y)
    _assert_same(load_dataset("cora-full", root=npz_root), via_pyg)
    conv_root = tmp_path / "conv"
    conv_root.mkdir()
    convert("cora_full", conv_root / "cora_full.npz", root=cora_root)
    _assert_same(load_dataset("cora_full", root=conv_root, source="npz"), via_pyg)
    # the .npz wins over the raw files when both are there
    save_npz(cora_root / "cora_full.npz", np.stack([src, dst]), attr * 0 + 1, y)
    assert float(load_dataset("cora_full", root=cora_root).x.min()) == 1.0


def test_missing_files_name_what_to_place_where(tmp_path):
    with pytest.raises(FileNotFoundError) as exc:
        load_dataset("cora_full", root=tmp_path)
    msg = str(exc.value)
    assert str(tmp_path / "cora" / "raw" / "cora.npz") in msg
    assert str(tmp_path / "cora_full.npz") in msg and "graph2gauss" in msg
    with pytest.raises(FileNotFoundError) as exc:
        load_dataset("wiki", root=tmp_path)
    for f in ("attrs.npz", "edgelist.txt", "labels.txt"):
        assert str(tmp_path / "wiki" / "raw" / f) in str(exc.value)
    for name in ("email", "blogcatalog", "amazon_clothing", "amz_eletronics"):
        with pytest.raises(FileNotFoundError, match="no PyTorch Geometric dataset class") as exc:
            load_dataset(name, root=tmp_path)
        assert str(tmp_path) in str(exc.value) and ".npz" in str(exc.value)
    with pytest.raises(FileNotFoundError, match="source='npz'"):
        load_dataset("wiki", root=tmp_path, source="npz")


def test_failed_download_names_the_files(tmp_path, monkeypatch):
    from torch_geometric.datasets import CitationFull

    def offline(self):
        raise OSError("network is unreachable")

    monkeypatch.setattr(CitationFull, "download", offline)
    with pytest.raises(FileNotFoundError, match="network is unreachable") as exc:
        load_dataset("cora_full", root=tmp_path, download=True)
    assert str(tmp_path / "cora" / "raw" / "cora.npz") in str(exc.value)


def test_wiki_raw_files_without_pandas_name_it(tmp_path):
    try:
        import pandas  # noqa: F401
    except ImportError:
        pass
    else:
        pytest.skip("pandas is installed: AttributedGraphDataset can read the files")
    raw = tmp_path / "wiki" / "raw"
    raw.mkdir(parents=True)
    sp.save_npz(raw / "attrs.npz", sp.csr_matrix(np.eye(3, dtype=np.float32)))
    (raw / "edgelist.txt").write_text("0 1\n1 2\n")
    (raw / "labels.txt").write_text("0 1\n1 2\n2 1\n")
    with pytest.raises(ImportError, match="pip install pandas"):
        load_dataset("wiki", root=tmp_path)


def test_missing_torch_geometric(cora_root, monkeypatch):
    for name in [m for m in sys.modules if m.startswith("torch_geometric")]:
        monkeypatch.setitem(sys.modules, name, None)
    with pytest.raises(ImportError, match="pip install torch_geometric") as exc:
        load_dataset("cora_full", root=cora_root)
    assert "cora_full.npz" in str(exc.value)


def test_root_and_name_checks(tmp_path, monkeypatch):
    monkeypatch.delenv("HIERTAIL_DATA", raising=False)
    with pytest.raises(ValueError, match="HIERTAIL_DATA"):
        load_dataset("email")
    save_npz(tmp_path / "email.npz", np.array([[0, 1], [1, 0]]), np.ones((3, 2)), [0, 1, 1])
    monkeypatch.setenv("HIERTAIL_DATA", str(tmp_path))
    assert resolve_root() == tmp_path
    g = load_dataset("Email")
    assert g.y.tolist() == [1, 0, 0] and g.label_map.tolist() == [1, 0]
    with pytest.raises(FileNotFoundError, match="not a directory"):
        load_dataset("email", root=tmp_path / "nope")
    with pytest.raises(ValueError, match="unknown dataset name 'cora_ml'.*cora_full"):
        load_dataset("cora_ml", root=tmp_path)
    with pytest.raises(TypeError, match="name must be a str"):
        load_dataset(3, root=tmp_path)
    with pytest.raises(TypeError, match="root must be a path"):
        load_dataset("email", root=3)
    with pytest.raises(ValueError, match="source="):
        load_dataset("email", root=tmp_path, source="web")
    # (a mutation pass, session 73) "~" is the user's home, for root= and $HIERTAIL_DATA (the
    # README's own root="~/data"); an empty $HIERTAIL_DATA counts as unset, said as such
    monkeypatch.setenv("HOME", str(tmp_path))
    assert resolve_root("~") == tmp_path and load_dataset("email", root="~").num_nodes == 3
    monkeypatch.setenv("HIERTAIL_DATA", "~")
    assert resolve_root() == tmp_path
    monkeypatch.setenv("HIERTAIL_DATA", "")
    with pytest.raises(ValueError, match="root is not given and HIERTAIL_DATA is not set"):
        resolve_root()


def test_blogcatalog_rows_are_normalised_as_the_official_loader():
    x = torch.tensor([[1.0, 3.0], [0.0, 0.0], [-1.0, 3.0]])
    g = GraphData(edge_index=torch.tensor([[0], [1]]), x=x, y=torch.tensor([0, 1, 1]),
                  num_classes=2)
    out = official_preprocess(g, "blog")
    torch.testing.assert_close(out.x, torch.tensor([[0.25, 0.75], [0.0, 0.0], [-0.5, 1.5]]))
    # named after the dataset (its canonical name), not the graph it was given
    assert out.name == "blogcatalog" and official_preprocess(g, "Cora-Full").name == "cora_full"
    assert out.edge_index.tolist() == [[0, 1], [1, 0]] and out.y.tolist() == [1, 0, 0]
    assert torch.equal(g.x, x)  # input untouched


def test_shared_email_matches_the_cli_npz_path(data_dir):
    g = load_dataset("email", root=data_dir)
    ref = load_npz(data_dir / "email.npz", relabel_by_size=True)
    for key in ("edge_index", "x", "y"):
        assert torch.equal(getattr(g, key), getattr(ref, key)), key


def test_convert_is_atomic_and_refuses_to_overwrite(cora_root, tmp_path):
    out = tmp_path / "out.npz"
    out.write_bytes(b"old")
    with pytest.raises(FileExistsError, match="force"):
        convert("cora_full", out, root=cora_root)
    assert out.read_bytes() == b"old"
    g = convert("cora_full", out, root=cora_root, force=True)
    assert torch.equal(load_npz(out).edge_index, g.edge_index)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out.npz", "pyg"]  # no temp files

    def boom(tmp):
        tmp.write_bytes(b"partial")
        raise RuntimeError("disk full")

    with pytest.raises(RuntimeError, match="disk full"):
        write_atomic(tmp_path / "new.npz", boom)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out.npz", "pyg"]
    with pytest.raises(FileNotFoundError, match="output directory"):
        write_atomic(tmp_path / "no" / "x.npz", boom)


def test_convert_pt_and_npz_both_ways_with_masks(tmp_path):
    n = 6
    d = Data(x=torch.arange(12.0).view(n, 2), edge_index=torch.tensor([[0, 1, 2], [1, 2, 3]]),
             y=torch.tensor([0, 1, 1, 2, 0, 1]))
    d.train_mask = torch.tensor([1, 1, 0, 0, 0, 0], dtype=torch.bool)
    d.val_mask = torch.tensor([0, 0, 1, 0, 0, 0], dtype=torch.bool)
    d.test_mask = torch.tensor([0, 0, 0, 1, 1, 1], dtype=torch.bool)
    torch.save(d, tmp_path / "g.pt")
    convert(tmp_path / "g.pt", tmp_path / "g.npz", split_out=tmp_path / "split.npz")
    split = load_split(tmp_path / "split.npz")
    assert [split[k].tolist() for k in ("train", "val", "test")] == [[0, 1], [2], [3, 4, 5]]
    convert(tmp_path / "g.npz", tmp_path / "back.pt")
    back = torch.load(tmp_path / "back.pt", weights_only=False)
    assert torch.equal(back.x, d.x) and torch.equal(back.y, d.y)
    assert torch.equal(back.edge_index, d.edge_index)
    convert(tmp_path / "g.pt", tmp_path / "copy.pt")  # .pt -> .pt keeps the masks
    copy = torch.load(tmp_path / "copy.pt", weights_only=False)
    assert torch.equal(copy.test_mask, d.test_mask)
    with pytest.raises(ValueError, match="no train/val/test masks"):
        convert(tmp_path / "g.npz", tmp_path / "x.npz", split_out=tmp_path / "s2.npz")
    with pytest.raises(ValueError, match="suffix"):
        convert(tmp_path / "g.npz", tmp_path / "g.csv")
    with pytest.raises(ValueError, match="neither a file nor a dataset name"):
        convert("no_such_graph", tmp_path / "y.npz")
    weighted = GraphData(edge_index=d.edge_index, x=d.x, y=d.y, num_classes=3,
                         edge_weight=torch.tensor([1.0, 2.0, 1.0]))
    with pytest.raises(ValueError, match="edge weights"):
        save_graph(weighted, tmp_path / "w.npz")


def test_convert_cli(cora_root, tmp_path, capsys):
    out = tmp_path / "c.npz"
    assert main(["convert", "cora_full", str(out), "--root", str(cora_root)]) == 0
    assert load_npz(out).num_nodes == sum(SIZES)
    with pytest.raises(SystemExit) as exc:
        main(["convert", "cora_full", str(out), "--root", str(cora_root)])
    assert exc.value.code == 2 and "--force" in capsys.readouterr().err
    with pytest.raises(SystemExit) as exc:       # Path("") would be the working directory
        main(["convert", "cora_full", str(out), "--root", ""])
    assert exc.value.code == 2 and "argument --root: an empty path" in capsys.readouterr().err
    proc = subprocess.run([sys.executable, "-m", "hiertail_fast.data", "convert", "email",
                           str(tmp_path / "e.npz"), "--root", str(tmp_path)],
                          capture_output=True, text=True,
                          env=dict(os.environ, PYTHONPATH=os.pathsep.join(sys.path)))
    assert proc.returncode == 2 and "email.npz not found" in proc.stderr


def test_train_cli_dataset(cora_root, tmp_path):
    out = tmp_path / "r.json"
    train_main(["--dataset", "cora_full", "--root", str(cora_root), "--epochs", "2",
                "--seeds", "1", "--hidden", "8", "--no-progress", "--json", str(out)])
    res = json.loads(out.read_text())
    assert res["data"]["dataset"] == "cora_full" and res["data"]["root"] == str(cora_root)
    assert res["data"]["num_nodes"] == sum(SIZES) and res["data"]["num_classes"] == len(SIZES)


@pytest.mark.parametrize("argv, message", [
    (["--dataset", "email", "--synthetic"], "exactly one of"),
    (["--dataset", "email", "--data", "x.npz"], "exactly one of"),
    (["--synthetic", "--root", "."], "--root only applies"),
    (["--dataset", "cora_ml", "--root", "."], "unknown dataset name"),
    (["--dataset", "email", "--root", "/nonexistent/dir"], "not a directory"),
])
def test_train_cli_dataset_bad_args(argv, message, capsys):
    with pytest.raises(SystemExit) as exc:
        train_main(argv)
    assert exc.value.code == 2 and message in capsys.readouterr().err


# ----------------------------------------------------------------- fuzz finds (s21 cli_fuzz)
def _masked_pt(path, x=None):
    n = 6
    d = Data(x=torch.arange(12.0).view(n, 2) if x is None else x,
             edge_index=torch.tensor([[0, 1, 2], [1, 2, 3]]), y=torch.tensor([0, 1, 1, 2, 0, 1]))
    d.train_mask = torch.tensor([1, 1, 0, 0, 0, 0], dtype=torch.bool)
    d.val_mask = torch.tensor([0, 0, 1, 0, 0, 0], dtype=torch.bool)
    d.test_mask = torch.tensor([0, 0, 0, 1, 1, 1], dtype=torch.bool)
    torch.save(d, path)
    return path


def _convert_exit_2(argv, capsys) -> str:
    with pytest.raises(SystemExit) as exc:
        main(argv)
    err = capsys.readouterr().err
    last = err.strip().splitlines()[-1]
    assert exc.value.code == 2 and "Traceback" not in err
    assert last.startswith("python -m hiertail_fast.data: error: "), err
    return last


def test_convert_bad_sources_and_outputs_are_clear_errors(tmp_path, capsys):
    """A garbage .pt gave an UnpicklingError traceback; an output that is a directory an
    IsADirectoryError traceback; a NaN in a .pt was reported against a temporary file; with
    --split-out equal to the output only the split arrays were left in it, 'success' printed."""
    garbage = tmp_path / "garbage.pt"
    garbage.write_bytes(b"\x80\x04 truncated pickle")
    err = _convert_exit_2(["convert", str(garbage), str(tmp_path / "g.npz")], capsys)
    assert f"source {garbage}: cannot be read as a torch.save file" in err
    good = _masked_pt(tmp_path / "good.pt")
    (tmp_path / "dir.npz").mkdir()
    err = _convert_exit_2(["convert", str(good), str(tmp_path / "dir.npz"), "--force"], capsys)
    assert f"output {tmp_path / 'dir.npz'} is a directory" in err
    x = torch.arange(12.0).view(6, 2)
    x[3, 1] = float("nan")
    nan = _masked_pt(tmp_path / "nan.pt", x=x)
    err = _convert_exit_2(["convert", str(nan), str(tmp_path / "n.npz")], capsys)
    assert f"source {nan}: 'x' contains NaN or Inf" in err and ".tmp" not in err
    # a .pt output too (it took the NaN features, which our loaders then refuse: a CLI audit)
    err = _convert_exit_2(["convert", str(nan), str(tmp_path / "n.pt")], capsys)
    assert f"source {nan}: 'x' contains NaN or Inf" in err
    # --root / --download belong to a dataset name; with a file they were silently ignored
    for extra in (["--root", str(tmp_path)], ["--download"]):
        err = _convert_exit_2(["convert", str(good), str(tmp_path / "r.npz"), *extra], capsys)
        assert f"--root and --download apply to a dataset name, not to the file {good}" in err
    out = tmp_path / "out.npz"
    convert(good, out)
    before = out.read_bytes()
    err = _convert_exit_2(["convert", str(good), str(out), "--split-out", str(out), "--force"],
                          capsys)
    assert "is the output file itself" in err
    assert out.read_bytes() == before and load_npz(out).num_nodes == 6
    assert sorted(p.name for p in tmp_path.iterdir()) == [
        "dir.npz", "garbage.pt", "good.pt", "nan.pt", "out.npz"]   # nothing else written


def test_convert_never_writes_over_its_source(tmp_path, capsys):
    """`convert email ROOT/email.npz --root ROOT --force` rewrote the user's file with the
    relabelled, preprocessed graph (a CLI audit): an output that is an input is refused,
    for a path source, a dataset name's .npz and a PyG dataset's folder."""
    src = tmp_path / "email.npz"
    save_npz(src, np.array([[0, 1], [1, 0]]), np.ones((3, 2), np.float32), np.array([1, 0, 1]))
    before = src.read_bytes()
    for argv in (["convert", "email", str(src), "--root", str(tmp_path), "--force"],
                 ["convert", str(src), str(tmp_path / "." / "email.npz"), "--force"],
                 ["convert", str(src), str(tmp_path / "x.npz"), "--split-out", str(src),
                  "--force"]):
        err = _convert_exit_2(argv, capsys)
        assert "is an input of source" in err and "write to another file" in err
    assert src.read_bytes() == before
    err = _convert_exit_2(["convert", "wiki", str(tmp_path / "wiki" / "raw" / "w.npz"),
                           "--root", str(tmp_path)], capsys)
    assert f"is an input of source wiki ({tmp_path / 'wiki'})" in err
    # the dataset's .npz where it is not there yet: nothing would be overwritten, and the
    # message said so (a data audit, session 67); refused for what it would do instead
    err = _convert_exit_2(["convert", "wiki", str(tmp_path / "wiki.npz"), "--root",
                           str(tmp_path)], capsys)
    assert (f"is where the source wiki is read from first when it exists "
            f"({tmp_path / 'wiki.npz'}): every later load would read the converted graph") in err
    assert sorted(p.name for p in tmp_path.iterdir()) == ["email.npz"]
    # a source file that is not there, named as its own output: not found, not "an input"
    with pytest.raises(FileNotFoundError, match="source file not found"):
        convert(tmp_path / "none.npz", tmp_path / "none.npz")
    # a suffix in capitals is the format it names (load_npz reads G.NPZ; convert refused it)
    assert main(["convert", str(src), str(tmp_path / "UP.NPZ")]) == 0
    assert main(["convert", str(tmp_path / "UP.NPZ"), str(tmp_path / "UP.PT")]) == 0
    assert load_npz(tmp_path / "UP.NPZ").num_nodes == 3
    (tmp_path / "UP.NPZ").unlink(), (tmp_path / "UP.PT").unlink()


def test_source_pyg_for_a_dataset_without_pyg_class(tmp_path):
    save_npz(tmp_path / "email.npz", np.array([[0, 1], [1, 0]]), np.ones((3, 2), np.float32),
             np.array([0, 1, 1]))
    # was "FileNotFoundError: .../email.npz not found" while the file was there
    with pytest.raises(ValueError, match="no PyTorch Geometric dataset class.*email.npz"):
        load_dataset("email", root=tmp_path, source="pyg")
    assert load_dataset("email", root=tmp_path).num_nodes == 3


def test_empty_root_is_refused(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)   # '' was the working directory, silently
    with pytest.raises(ValueError, match="empty path"):
        load_dataset("email", root="")
    with pytest.raises(ValueError, match="empty path"):
        resolve_root("  ")


@pytest.mark.parametrize("content", [b"", b"not a zip", "wrong keys"])
def test_raw_files_of_another_format_are_named(tmp_path, content):
    raw = tmp_path / "cora" / "raw"
    raw.mkdir(parents=True)
    if content == "wrong keys":
        np.savez(raw / "cora.npz", a=np.arange(3))
    else:
        (raw / "cora.npz").write_bytes(content)
    # was an EOFError / KeyError / pickle ValueError from inside PyG, naming no file
    with pytest.raises(ValueError, match=r"could not read the raw files .*cora\.npz"):
        load_dataset("cora_full", root=tmp_path)


def test_a_directory_where_a_file_is_read_is_named_as_such(tmp_path, capsys):
    # reported as "not found" (a CLI audit)
    (tmp_path / "email.npz").mkdir()
    with pytest.raises(IsADirectoryError, match="email.npz is a directory, not the dataset"):
        load_dataset("email", root=tmp_path)
    err = _convert_exit_2(["convert", str(tmp_path / "email.npz"), str(tmp_path / "o.npz")],
                          capsys)
    assert f"source {tmp_path / 'email.npz'} is a directory" in err


def test_convert_checks_every_output_before_writing(tmp_path):
    """An existing --split-out without force: refused before anything is written (the graph
    was written, then the split failed); a --split-out equal to an output that does not
    exist yet: refused, not a split left in the graph's file (a mutation audit)."""
    good = _masked_pt(tmp_path / "good.pt")
    (tmp_path / "split.npz").write_bytes(b"the user's earlier split")
    with pytest.raises(FileExistsError, match="split.npz"):
        convert(good, tmp_path / "out.npz", split_out=tmp_path / "split.npz")
    assert not (tmp_path / "out.npz").exists()
    assert (tmp_path / "split.npz").read_bytes() == b"the user's earlier split"
    with pytest.raises(ValueError, match="is the output file itself"):
        convert(good, tmp_path / "new.npz", split_out=tmp_path / "new.npz", force=True)
    assert not (tmp_path / "new.npz").exists()


def test_write_atomic_never_replaces_a_file_that_appeared_meanwhile(tmp_path):
    """A file created at the target by another writer while ours is written is kept: the
    final step links, it does not replace (conversion.py's promise; a mutation audit found it
    untested)."""
    target = tmp_path / "g.npz"

    def write(tmp):
        tmp.write_bytes(b"ours")
        target.write_bytes(b"the other writer's file")   # after the exists() check

    with pytest.raises(FileExistsError):
        write_atomic(target, write)
    assert target.read_bytes() == b"the other writer's file"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["g.npz"]   # no temp file left


def test_cora_binarisation_is_x_greater_than_zero():
    """cora_full's features become (x > 0): a negative entry (a user's file) is 0, not 1 (the
    suite's features were all >= 0; a mutation audit)."""
    g = GraphData(edge_index=torch.tensor([[0], [1]]), x=torch.tensor([[2.0, -1.0], [0.0, 3.0]]),
                  y=torch.tensor([0, 1]), num_classes=2)
    assert official_preprocess(g, "cora_full").x.tolist() == [[1.0, 0.0], [0.0, 1.0]]
