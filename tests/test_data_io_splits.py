"""The .npz loader/saver and the natural / user splits."""
from __future__ import annotations

import os

import numpy as np
import pytest
import torch

from hiertail_fast.data.io import GraphData, load_npz, relabel_by_size, save_npz, size_order
from hiertail_fast.data.splits import (
    class_counts,
    natural_split,
    natural_split_sizes,
    split_counts,
    user_split,
)


def _tiny():
    ei = np.array([[0, 1, 1, 2, 3, 4], [1, 0, 2, 1, 4, 3]], dtype=np.int64)
    x = np.arange(15, dtype=np.float32).reshape(5, 3) * np.array([1, 0, 1], dtype=np.float32)
    y = np.array([2, 0, 2, 1, 2], dtype=np.int64)
    return ei, x, y


@pytest.mark.parametrize("sparse_x", [False, True])
def test_round_trip(tmp_path, sparse_x):
    ei, x, y = _tiny()
    path = tmp_path / "g"  # no suffix: written exactly here
    save_npz(path, torch.from_numpy(ei), x, y, sparse_x=sparse_x)
    assert path.is_file()
    g = load_npz(str(path))
    assert isinstance(g, GraphData) and g.name == "g"
    assert g.edge_index.dtype == torch.int64 and g.x.dtype == torch.float32
    assert g.y.dtype == torch.int64
    np.testing.assert_array_equal(g.edge_index.numpy(), ei)
    np.testing.assert_array_equal(g.x.numpy(), x)
    np.testing.assert_array_equal(g.y.numpy(), y)
    assert (g.num_nodes, g.num_edges, g.num_features, g.num_classes) == (5, 6, 3, 3)
    keys = set(np.load(path).files)
    assert ("x_data" in keys) == sparse_x and ("x" in keys) != sparse_x
    g.to_npz(tmp_path / "again.npz")
    g2 = load_npz(tmp_path / "again.npz")
    assert torch.equal(g2.x, g.x) and torch.equal(g2.edge_index, g.edge_index)


def test_save_never_destroys_a_file(tmp_path, monkeypatch):
    # save_npz opened the path in place: a user's other file there was replaced without a
    # word, and a write that failed midway left the old graph unreadable (a mutation audit)
    ei, x, y = _tiny()
    notes = tmp_path / "notes.txt"
    notes.write_text("mine")
    with pytest.raises(FileExistsError, match="notes.txt exists: pass force=True"):
        save_npz(notes, ei, x, y)
    with pytest.raises(FileExistsError, match="exists"):
        GraphData(edge_index=torch.from_numpy(ei), x=torch.from_numpy(x),
                  y=torch.from_numpy(y), num_classes=3).to_npz(notes)
    assert notes.read_text() == "mine"
    graph = tmp_path / "g.npz"
    save_npz(graph, ei, x, y)
    before = graph.read_bytes()

    def fail(fh, **arrays):
        fh.write(b"PK partial")
        raise OSError(27, "File too large")
    monkeypatch.setattr(np, "savez_compressed", fail)
    with pytest.raises(OSError, match="File too large"):
        save_npz(graph, ei, x * 2, y, force=True)
    monkeypatch.undo()
    assert graph.read_bytes() == before and sorted(p.name for p in tmp_path.iterdir()) == [
        "g.npz", "notes.txt"]                                   # no temporary file left
    assert save_npz(graph, ei, x * 2, y, force=True) == graph   # force replaces it
    np.testing.assert_array_equal(load_npz(graph).x.numpy(), x * 2)
    with pytest.raises(FileNotFoundError, match="does not exist"):
        save_npz(tmp_path / "no" / "g.npz", ei, x, y)


def test_relabel_by_size(tmp_path):
    y = np.array([2, 0, 2, 1, 2, 1, 3, 3])  # sizes: 0:1, 1:2, 2:3, 3:2 -> ties 1 and 3
    new, label_map = relabel_by_size(y)
    np.testing.assert_array_equal(label_map, [3, 1, 0, 2])  # stable: class 1 before class 3
    np.testing.assert_array_equal(new, label_map[y])
    sizes = np.bincount(new)
    assert np.all(np.diff(sizes) <= 0)
    ei, x, _ = _tiny()
    save_npz(tmp_path / "a.npz", ei, np.zeros((8, 2)), y)
    g = load_npz(tmp_path / "a.npz", relabel_by_size=True)
    np.testing.assert_array_equal(g.y.numpy(), new)
    np.testing.assert_array_equal(g.label_map, label_map)


def test_relabel_by_size_names_labels_it_cannot_take():
    # public (the baselines' warning names it): float labels were truncated (2 classes from
    # [0.5, 1.5, 1.7, 1.2]), a 2-D y flattened, a -1 or a uint64 label >= 2**63 failed inside
    # numpy (a data audit, session 67)
    for y, exc, message in ((np.array([0.5, 1.5, 1.7, 1.2]), TypeError, "integer array"),
                            (torch.tensor([0.0, 1.0]), TypeError, "integer array"),
                            (np.array([[0, 1], [1, 1]]), ValueError, r"1-D \[n\], got shape"),
                            (np.array([0, -1, 1]), ValueError, r"negative labels \(min -1\)"),
                            (np.array([0, 2**63], dtype=np.uint64), ValueError,
                             "above int64's range")):
        for call in (relabel_by_size, size_order):
            with pytest.raises(exc, match=message):
                call(y)
    with pytest.raises(ValueError, match="y is on the meta device"):   # (NotImplementedError)
        relabel_by_size(torch.tensor([1, 1, 0], device="meta"))
    new, label_map = relabel_by_size(torch.tensor([1, 1, 0]))       # a tensor is fine
    np.testing.assert_array_equal(new, [0, 0, 1])


def _write(path, **arrays):
    with open(path, "wb") as fh:
        np.savez(fh, **arrays)
    return path


@pytest.mark.parametrize(
    "change,msg",
    [
        (dict(y=None), "missing array"),
        (dict(x=None), "missing array"),
        (dict(y=np.array([0, 1, -1, 0, 0])), "negative labels"),
        (dict(y=np.array([0.0, 1, 1, 0, 0])), "integer"),
        (dict(y=np.array([True, False, True, True, False])), "integer array of labels, got bool"),
        (dict(edge_index=np.array([[True, False], [False, True]])),
         r"integer array of shape \[2, E\], got bool"),
        (dict(edge_index=np.array([[0, 5], [1, 0]])), "refers to node 5"),
        (dict(edge_index=np.array([[0, -1], [1, 0]])), "negative node"),
        (dict(edge_index=np.array([0, 1, 1, 0])), r"\[2, E\]"),
        (dict(x=np.zeros((4, 3), np.float32)), "rows"),
        (dict(x=np.full((5, 3), np.nan, np.float32)), "NaN"),
        (dict(x=np.zeros(5, np.float32)), "2-D"),
    ],
)
def test_load_validation(tmp_path, change, msg):
    ei, x, y = _tiny()
    arrays = dict(edge_index=ei, x=x, y=y)
    arrays.update(change)
    path = _write(tmp_path / "bad.npz", **{k: v for k, v in arrays.items() if v is not None})
    with pytest.raises(ValueError, match=msg) as err:
        load_npz(path)
    assert "bad.npz" in str(err.value)  # names the file


def test_load_bad_csr_and_files(tmp_path):
    ei, _, y = _tiny()
    good = dict(x_data=np.ones(2, np.float32), x_indices=np.array([0, 2], np.int32),
                x_indptr=np.array([0, 1, 1, 2, 2, 2]), x_shape=np.array([5, 3]))
    g = load_npz(_write(tmp_path / "csr.npz", edge_index=ei, y=y, **good))
    assert g.x.shape == (5, 3) and float(g.x.sum()) == 2.0 and g.x[2, 2] == 1.0
    for key, val, msg in [("x_indices", np.array([0, 3], np.int32), "out of range"),
                          ("x_indptr", np.array([0, 1, 1, 2, 2]), "x_indptr"),
                          # (a mutation audit: a negative column went to the last one, a
                          # negative start wrote one value into two rows)
                          ("x_indices", np.array([-1, 0], np.int32), "out of range"),
                          ("x_indptr", np.array([-1, 0, 1, 1, 1, 2]), "x_indptr"),
                          ("x_indptr", np.array([0, 2, 1, 2, 2, 2]), "non-decreasing"),
                          ("x_data", np.ones(3, np.float32), "x_data")]:
        with pytest.raises(ValueError, match=msg):
            load_npz(_write(tmp_path / "c2.npz", edge_index=ei, y=y, **{**good, key: val}))
    # x_shape too large to densify: the MemoryError was reported as a corrupt member (a CLI
    # audit; simulated: whether the allocation fails depends on the machine's overcommit)
    import hiertail_fast.data.io as io

    real_zeros = np.zeros

    def zeros(shape, *args, **kwargs):
        if isinstance(shape, tuple) and shape == (5, 10 ** 9):
            raise MemoryError
        return real_zeros(shape, *args, **kwargs)
    huge = _write(tmp_path / "huge.npz", edge_index=ei, y=y,
                  **{**good, "x_shape": np.array([5, 10 ** 9])})
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(io.np, "zeros", zeros)
        with pytest.raises(ValueError, match="'x_shape' 5 x 1000000000 densify to 20 GB"):
            load_npz(huge)
    # x beside CSR parts (all or some): which attributes are meant is unknown (x was read and
    # the CSR parts dropped without a word)
    x = np.zeros((5, 3), np.float32)
    for parts in (good, {"x_data": good["x_data"]}):
        with pytest.raises(ValueError, match="both 'x' and the CSR attribute part.*x_data"):
            load_npz(_write(tmp_path / "both.npz", edge_index=ei, y=y, x=x, **parts))
    (tmp_path / "junk.npz").write_bytes(b"not a zip file")
    with pytest.raises(ValueError, match="junk.npz"):
        load_npz(tmp_path / "junk.npz")
    with pytest.raises(FileNotFoundError):
        load_npz(tmp_path / "nope.npz")
    with pytest.raises(ValueError):
        save_npz(tmp_path / "s.npz", ei, np.zeros((3, 2)), y)


@pytest.mark.parametrize(
    "name,nodes,edges,features,classes,smallest,largest",
    [("email", 1005, 32128, 128, 42, 1, 109), ("wiki", 2405, 23192, 4973, 17, 9, 406),
     ("blogcatalog", 10312, 667966, 64, 38, 3, 1423)],
)
def test_shared_files(data_dir, name, nodes, edges, features, classes, smallest, largest):
    g = load_npz(data_dir / f"{name}.npz", relabel_by_size=True)
    assert (g.num_nodes, g.num_edges, g.num_features, g.num_classes) == (
        nodes, edges, features, classes)
    sizes = g.class_sizes()
    assert int(sizes[0]) == largest and int(sizes[-1]) == smallest
    assert bool((sizes[:-1] >= sizes[1:]).all())


# ------------------------------------------------------------------------------------ splits
SIZES = [1, 2, 3, 5, 9, 10, 11, 19, 25, 104]
# (train, val, test) by the rule of PROTOCOL §1.2, worked out by hand
EXPECTED = [(1, 1, 1), (1, 1, 1), (1, 1, 1), (1, 1, 3), (1, 1, 7), (1, 1, 8), (1, 1, 8),
            (1, 1, 15), (2, 2, 20), (10, 10, 83)]


def _labels():
    y = np.repeat(np.arange(len(SIZES)), SIZES)
    return np.random.default_rng(5).permutation(y)


def test_natural_split_sizes_per_class():
    lay = natural_split_sizes(SIZES)
    np.testing.assert_array_equal(lay[:, [1, 3, 5]], EXPECTED)
    y = _labels()
    tr, va, te = natural_split(y, seed=3)
    counts = split_counts(y, tr, va, te)
    np.testing.assert_array_equal(counts.numpy(), EXPECTED)
    np.testing.assert_array_equal(class_counts(y, tr).numpy(), [e[0] for e in EXPECTED])
    assert class_counts(y).tolist() == SIZES


def test_natural_split_overlaps_and_disjointness():
    y = _labels()
    tr, va, te = natural_split(torch.from_numpy(y), seed=11)
    for t in (tr, va, te):
        assert t.dtype == torch.int64 and len(set(t.tolist())) == t.numel()
    c1 = int(np.flatnonzero(y == 0)[0])  # the class of one node: in all three sets
    assert c1 in tr.tolist() and c1 in va.tolist() and c1 in te.tolist()
    c2 = set(np.flatnonzero(y == 1).tolist())  # class of two: train == val, test the other
    tr2, va2, te2 = (set(t.tolist()) & c2 for t in (tr, va, te))
    assert tr2 == va2 and len(tr2) == 1 and te2 == c2 - tr2
    big = set(np.flatnonzero(y >= 2).tolist())  # n_c >= 3: pairwise disjoint
    s_tr, s_va, s_te = (set(t.tolist()) & big for t in (tr, va, te))
    assert not (s_tr & s_va) and not (s_tr & s_te) and not (s_va & s_te)
    # val/test are grouped by class; each set holds only nodes of the right class counts
    assert np.all(np.diff(y[va.numpy()]) >= 0) and np.all(np.diff(y[te.numpy()]) >= 0)


def test_natural_split_determinism():
    y = _labels()
    a = natural_split(y, seed=7)
    b = natural_split(y.tolist(), seed=7)
    c = natural_split(y, seed=8)
    assert all(torch.equal(u, v) for u, v in zip(a, b, strict=True))
    assert not all(torch.equal(u, v) for u, v in zip(a, c, strict=True))
    # train is shuffled, not grouped by class
    ys = [y[natural_split(y, seed=s)[0].numpy()] for s in range(5)]
    assert any(np.any(np.diff(t) < 0) for t in ys)


def test_natural_split_bad():
    with pytest.raises(ValueError):
        natural_split(np.array([0.5, 1.0]))
    for empty in (np.array([], dtype=np.int64), []):      # ([] is float64 to numpy)
        with pytest.raises(ValueError, match="y is empty"):
            natural_split(empty)
    with pytest.raises(ValueError):
        natural_split(np.array([0, -1]))
    with pytest.raises(ValueError, match="num_classes"):
        natural_split(np.array([0, 4]), num_classes=3)


def test_user_split():
    mask = np.zeros(6, dtype=bool)
    mask[[1, 4]] = True
    idx = np.array([5, 0])
    tr, va, te = user_split(6, mask, torch.tensor([2]), idx)
    assert tr.tolist() == [1, 4] and va.tolist() == [2] and te.tolist() == [5, 0]
    te[0] = 3
    assert idx[0] == 5  # the caller's array is not modified
    tr, va, te = user_split(6, [0, 1])
    assert va.numel() == 0 and te.numel() == 0
    for args, msg in [((6, [6]), "outside"), ((6, [-1]), "outside"), ((6, []), "empty"),
                      ((6, np.zeros(6, bool)), "empty"), ((6, np.ones(5, bool)), "mask"),
                      ((6, [1, 1]), "duplicate"), ((6, [0.5]), "integer"),
                      ((6, [0], [[1]]), "1-D"), ((0, [0]), "positive")]:
        with pytest.raises(ValueError, match=msg):
            user_split(*args)
    with pytest.raises(TypeError):
        user_split(6.0, [0])


def _official_counts(n_c: int) -> tuple[int, int, int]:
    """The per-class rule of HierTail's split_natural, written as plain Python branches."""
    if n_c == 1:
        return 1, 1, 1
    if n_c == 2:
        return 1, 1, 1
    if n_c < 10:
        a = int(np.ceil(n_c * 0.1))
        return a, a, n_c - 2 * a
    return int(n_c * 0.1), int(n_c * 0.1), int(n_c * 0.8)


@pytest.mark.parametrize("name", ["email", "blogcatalog"])
def test_natural_split_on_shared_data(data_dir, name):
    y = load_npz(data_dir / f"{name}.npz", relabel_by_size=True).y
    tr, va, te = natural_split(y, seed=123)
    counts = split_counts(y, tr, va, te).numpy()
    sizes = np.bincount(y.numpy())
    np.testing.assert_array_equal(counts, [_official_counts(int(s)) for s in sizes])
    assert (counts[:, 0] >= 1).all()  # every class has a training node under this rule


# ----------------------------------------------------------------- fuzz finds (s21 cli_fuzz)
def test_relabel_memory_does_not_grow_with_the_largest_label(tmp_path):
    """One label of 2**40 made relabel_by_size bincount 2**40 entries (10**9: 7.45 GiB, an OOM
    kill): the relabelling is O(n) now, same order as before, and the mapping is kept in
    ``original_labels`` (no dense old -> new table for such sparse labels)."""
    huge = 2**40
    y = np.array([5, huge, 0, 5, huge, 5, 0, 7], dtype=np.int64)   # sizes 5:3, huge:2, 0:2, 7:1
    ei, _, _ = _tiny()
    save_npz(tmp_path / "h.npz", ei, np.zeros((8, 2)), y)
    g = load_npz(tmp_path / "h.npz", relabel_by_size=True)
    assert g.original_labels.tolist() == [5, 0, huge, 7]          # ties: smaller label first
    np.testing.assert_array_equal(g.original_labels[g.y.numpy()], y)
    assert g.num_classes == 4 and g.label_map is None
    # labels of an ordinary range: the dense table as before, inverse of original_labels
    y2 = np.array([2, 9, 9, 0, 2, 9], dtype=np.int64)
    save_npz(tmp_path / "s.npz", ei[:, :0], np.zeros((6, 2)), y2)
    g2 = load_npz(tmp_path / "s.npz", relabel_by_size=True)
    new, label_map = relabel_by_size(y2)
    np.testing.assert_array_equal(g2.y.numpy(), new)
    np.testing.assert_array_equal(g2.label_map, label_map)
    assert label_map.tolist() == [2, 3, 1, 4, 5, 6, 7, 8, 9, 0]   # absent labels after, in order
    np.testing.assert_array_equal(label_map[g2.original_labels], np.arange(3))
    # load_dataset's official preprocessing relabels the same way (it built the dense table:
    # a MemoryError at 2^40, 460 MB at 2e7; a data audit), and keeps the dense one for y2
    from hiertail_fast.data.datasets import load_dataset

    save_npz(tmp_path / "email.npz", ei, np.zeros((8, 2)), y)
    d = load_dataset("email", tmp_path)
    assert d.original_labels.tolist() == [5, 0, huge, 7] and d.label_map is None
    np.testing.assert_array_equal(d.original_labels[d.y.numpy()], y)
    assert d.num_classes == 4
    save_npz(tmp_path / "wiki.npz", ei[:, :0], np.zeros((6, 2)), y2)
    d2 = load_dataset("wiki", tmp_path)
    np.testing.assert_array_equal(d2.label_map, label_map)
    assert d2.original_labels.tolist() == [9, 2, 0] and d2.num_classes == 3


@pytest.mark.parametrize("kind, message", [("npy", "single .npy array"),
                                           ("garbage", "not a readable .npz file")])
def test_unreadable_graph_and_split_files_are_named(tmp_path, kind, message):
    """A .npy renamed .npz gave "'numpy.ndarray' object does not support the context manager
    protocol" (no file name); a corrupt split file numpy's allow_pickle hint, unnamed."""
    from hiertail_fast.train import load_split

    path = tmp_path / "bad.npz"
    if kind == "npy":
        with open(path, "wb") as fh:
            np.save(fh, np.zeros((3, 2)))
    else:
        path.write_bytes(b"not a zip file")
    for load in (load_npz, load_split):
        with pytest.raises(ValueError, match=message) as exc:
            load(path)
        assert str(path) in str(exc.value) and "allow_pickle" not in str(exc.value)


def test_features_beyond_float32_and_without_columns_are_refused(tmp_path):
    ei, x, y = _tiny()

    def refused_both_ways(name, bad, message):
        """load_npz of a file holding `bad` as x, and save_npz of it, refuse it (no file)."""
        _write(tmp_path / f"{name}.npz", edge_index=ei, x=bad, y=y)
        with pytest.raises(ValueError, match=rf"{name}\.npz: 'x' {message}"):
            load_npz(tmp_path / f"{name}.npz")
        with pytest.raises(ValueError, match=message):
            save_npz(tmp_path / "out.npz", ei, bad, y)
        assert not (tmp_path / "out.npz").exists()

    big = x.astype(np.float64)
    big[1, 0] = 1e300                        # finite as float64, inf as float32
    refused_both_ways("big", big, "has values beyond float32's range")
    _write(tmp_path / "nofeat.npz", edge_index=ei, x=np.zeros((5, 0), np.float32), y=y)
    with pytest.raises(ValueError, match=r"nofeat\.npz: 'x' has no feature columns"):
        load_npz(tmp_path / "nofeat.npz")
    # stored as CSR parts: the same message (densified first, it read "NaN or Inf"; an
    # extremes audit), and a NaN still gets the NaN message (not "beyond float32's range")
    rows, cols = np.nonzero(big)
    csr = dict(edge_index=ei, y=y, x_data=big[rows, cols], x_indices=cols.astype(np.int32),
               x_indptr=np.concatenate([[0], np.cumsum(np.bincount(rows, minlength=5))]),
               x_shape=np.array(big.shape))
    _write(tmp_path / "big_csr.npz", **csr)
    with pytest.raises(ValueError, match=r"big_csr\.npz: 'x' has values beyond float32's"):
        load_npz(tmp_path / "big_csr.npz")
    nan = big.copy()
    nan[1, 0] = np.nan
    _write(tmp_path / "nan.npz", edge_index=ei, x=nan, y=y)
    with pytest.raises(ValueError, match="NaN or Inf") as exc:
        load_npz(tmp_path / "nan.npz")
    assert "range" not in str(exc.value)
    # an Inf as well, in float32 (a NaN-only check passed; mutation audit, session 69)
    inf = x.astype(np.float32)
    inf[1, 0] = np.inf
    refused_both_ways("inf", inf, "contains NaN or Inf")
    # float64 within range still loads (as float32)
    _write(tmp_path / "ok.npz", edge_index=ei, x=x.astype(np.float64) * 1e30, y=y)
    assert load_npz(tmp_path / "ok.npz").x.dtype == torch.float32


def test_natural_split_seed_must_be_a_non_negative_int():
    y = _labels()
    ref = natural_split(y, seed=3)
    for seed in (np.int64(3), np.uint32(3)):   # numpy integers are the same seed
        assert all(torch.equal(u, v) for u, v in zip(ref, natural_split(y, seed), strict=True))
    big = natural_split(y, seed=2**70)          # any size of non-negative int
    assert all(torch.equal(u, v) for u, v in zip(big, natural_split(y, 2**70), strict=True))
    # None drew an unreproducible split; bool / float / str / sequences were taken or failed
    # inside numpy ("SeedSequence expects int ..."), -1 with "expected non-negative integer"
    for bad in (None, True, 1.5, "3", [1, 2]):
        with pytest.raises(TypeError, match="seed must be an int"):
            natural_split(y, bad)
    with pytest.raises(ValueError, match="seed must be >= 0"):
        natural_split(y, -1)


def test_num_classes_must_be_an_int():
    y = np.array([0, 0, 0, 1, 1])
    assert class_counts(y, num_classes=np.int64(4)).tolist() == [3, 2, 0, 0]
    for bad in (2.7, "3", True):   # 2.7 was truncated to 2, "3" parsed, True taken as 1
        with pytest.raises(TypeError, match="num_classes must be an int"):
            natural_split(y, 0, num_classes=bad)
        with pytest.raises(TypeError, match="num_classes must be an int"):
            class_counts(y, num_classes=bad)


def test_natural_split_sparse_labels_cost_nothing_per_missing_class():
    # a label 10**12 tried to allocate a 7 TiB bincount (MemoryError); empty classes get no nodes
    y = np.array([0, 5, 5, 5, 7] * 3)
    sparse = y.astype(np.int64) * 10**11
    for s in (0, 1):
        for u, v in zip(natural_split(y, s), natural_split(sparse, s), strict=True):
            assert torch.equal(u, v)
    with pytest.raises(ValueError, match="above int64"):      # wrapped to a negative label
        natural_split(np.array([0, 2**63 + 5], dtype=np.uint64))
    with pytest.raises(ValueError, match="meta"):               # NotImplementedError deep down
        natural_split(torch.empty(3, dtype=torch.long, device="meta"))
    with pytest.raises(ValueError, match="meta"):
        user_split(5, torch.empty(2, dtype=torch.long, device="meta"))


def test_natural_split_sizes_rejects_impossible_class_sizes():
    np.testing.assert_array_equal(natural_split_sizes([3.0, 12]), natural_split_sizes([3, 12]))
    assert natural_split_sizes([]).shape == (0, 6)
    # a negative size gave an all-zero row, 2.5 was truncated to 2, 2-D hit an IndexError
    for bad, msg in (([-1, 3], "whole numbers >= 0"), ([2.5, 3], "whole numbers >= 0"),
                     ([np.nan], "whole numbers >= 0"), ([[3]], "1-D"), (3, "1-D"),
                     ([True], "numeric")):
        with pytest.raises(ValueError, match=msg):
            natural_split_sizes(bad)


def test_uint64_labels_beyond_int64_are_refused(tmp_path):
    # the check ran on the uint64 array, the int64 cast then wrapped 2**63 to a negative label:
    # load_npz returned it silently, save_npz wrote a file load_npz refused (a config audit)
    path = tmp_path / "g.npz"
    y = np.array([0, 2**63, 1, 1], dtype=np.uint64)
    np.savez(path, edge_index=np.array([[0, 1], [1, 2]]), x=np.ones((4, 2), np.float32), y=y)
    for relabel in (False, True):
        with pytest.raises(ValueError, match="labels above int64's range"):
            load_npz(path, relabel_by_size=relabel)
    with pytest.raises(ValueError, match="labels above int64's range"):
        save_npz(tmp_path / "out.npz", np.array([[0, 1], [1, 2]]), np.ones((4, 2)), y)
    assert not (tmp_path / "out.npz").exists()


def test_load_npz_names_a_directory(tmp_path):
    (tmp_path / "g.npz").mkdir()
    with pytest.raises(IsADirectoryError, match="is a directory, not an .npz graph file"):
        load_npz(tmp_path / "g.npz")


@pytest.mark.parametrize("bad", [None, 3, b"g.npz", "file object"],
                         ids=["None", "int", "bytes", "file object"])
def test_paths_that_are_not_paths_are_named(tmp_path, bad):
    """load_npz / save_npz / save_graph / convert name their path argument when it is not a
    str or os.PathLike (pathlib said "expected str, bytes or os.PathLike object, not int");
    a str and a Path still work."""
    from hiertail_fast.data.conversion import convert, save_graph

    ei, x, y = np.array([[0, 1], [1, 0]]), np.ones((2, 3), np.float32), np.array([0, 1])
    good = save_npz(tmp_path / "g.npz", ei, x, y)
    assert load_npz(str(good)).num_nodes == load_npz(good).num_nodes == 2
    with open(good, "rb") as fh:
        value = fh if bad == "file object" else bad
        for call, arg in ((lambda: load_npz(value), "path"),
                          (lambda: save_npz(value, ei, x, y), "path"),
                          (lambda: save_graph(load_npz(good), value), "path"),
                          (lambda: convert(good, value), "out"),
                          (lambda: convert(good, tmp_path / "h.npz", split_out=value),
                           "split_out")):
            if value is None and arg == "split_out":
                continue            # (split_out=None: no split file, the default)
            with pytest.raises(TypeError, match=f"^{arg} must be a path"):
                call()
    assert not (tmp_path / "h.npz").exists()


# ------------------------------------------------------ golden checks (a mutation audit)
def _documented_natural_split(y: np.ndarray, seed: int):
    """The module doc's construction, written from scratch: ``default_rng(seed).permutation(n)``
    orders the nodes; each class's nodes in that order (a stable grouping by class); per class
    train / val / test take consecutive positions of that list by the rule of the table
    (``_official_counts``; a class of 1 puts node 0 in all three sets, a class of 2 trains and
    validates on node 0 and tests on node 1). val and test are concatenated class 0 first;
    train is returned as a sorted set (the doc only says it is shuffled at the end)."""
    perm = np.random.default_rng(seed).permutation(len(y)).tolist()
    train, val, test = [], [], []
    for c in sorted(set(y.tolist())):
        mine = [v for v in perm if y[v] == c]         # the permutation's order within c
        if len(mine) == 1:
            tr, va, te = mine, mine, mine
        elif len(mine) == 2:
            tr, va, te = mine[:1], mine[:1], mine[1:]
        else:
            a, _, t = _official_counts(len(mine))
            tr, va, te = mine[:a], mine[a:2 * a], mine[2 * a:2 * a + t]
        train += tr
        val += va
        test += te
    return sorted(train), val, test


def test_natural_split_matches_the_documented_construction_at_1000_nodes():
    """A golden check of natural_split against an independent implementation of its documented
    construction (permutation, then a STABLE grouping by class, so the order inside a class
    is the permutation's). A mutation audit found that an unstable sort (numpy's default
    quicksort, which reorders equal labels for more than 16 nodes) went unnoticed: every split
    size stays right, only WHICH nodes a seed puts in each set changes. 1,000 nodes in 11
    classes of 400 down to 1 (every branch of the rule), three seeds."""
    sizes = [400, 250, 150, 90, 50, 30, 15, 9, 3, 2, 1]
    y = np.random.default_rng(5).permutation(np.repeat(np.arange(len(sizes)), sizes))
    for seed in (0, 3, 123):
        tr, va, te = natural_split(y, seed=seed)
        exp_tr, exp_va, exp_te = _documented_natural_split(y, seed)
        assert te.tolist() == exp_te
        assert va.tolist() == exp_va
        assert sorted(tr.tolist()) == exp_tr


def test_size_order_ties_keep_ascending_original_label_beyond_16_classes():
    """size_order / relabel_by_size: classes by descending size, equal sizes in ascending
    ORIGINAL label (documented stable tie-break). The existing check has 4 classes, where
    numpy's default sort is an insertion sort and stable anyway; a mutation audit found an
    unstable argsort surviving. 40 classes of sizes 1..3 (many ties), labels 3k + 1 (not the
    class indices), against a plain ``sorted`` by (-size, label)."""
    rng = np.random.default_rng(0)
    sizes = rng.integers(1, 4, 40)
    labels = 3 * np.arange(40) + 1
    y = rng.permutation(np.repeat(labels, sizes))
    size_of = {int(lab): int(s) for lab, s in zip(labels, sizes, strict=True)}
    expected = sorted(size_of, key=lambda lab: (-size_of[lab], lab))
    new_y, original = size_order(y)
    assert original.tolist() == expected
    assert new_y.tolist() == [expected.index(int(v)) for v in y]
    _, label_map = relabel_by_size(y)
    assert label_map[expected].tolist() == list(range(40))


# ------------------------------------------------------ file contents (a mutation audit)
def test_csr_features_sum_duplicate_entries(tmp_path):
    """CSR-stored features with a repeated (row, col) entry add up, as scipy's csr_matrix
    (they overwrote each other: no test had a duplicate)."""
    import scipy.sparse as sp

    data = np.array([1.0, 2.0, 5.0], np.float32)
    idx, ptr = np.array([0, 0, 1], np.int32), np.array([0, 2, 3])
    np.savez(tmp_path / "dup.npz", edge_index=np.array([[0, 1], [1, 0]]), y=np.array([0, 1]),
             x_data=data, x_indices=idx, x_indptr=ptr, x_shape=np.array([2, 2]))
    want = sp.csr_matrix((data, idx, ptr), shape=(2, 2)).toarray()
    assert want.tolist() == [[3.0, 0.0], [0.0, 5.0]]
    assert load_npz(tmp_path / "dup.npz").x.numpy().tolist() == want.tolist()


def test_sparse_features_round_trip_with_trailing_empty_rows(tmp_path):
    """save_npz(sparse_x=True) of features whose last rows are all zero: the row pointers
    cover every row, so the file loads back (the round-trip test had no empty last row)."""
    x = np.array([[1.0, 0.0], [0.0, 2.0], [0.0, 0.0], [0.0, 0.0]], np.float32)
    save_npz(tmp_path / "g.npz", np.array([[0, 1], [1, 2]]), x, np.array([0, 1, 1, 0]),
             sparse_x=True)
    assert np.array_equal(load_npz(tmp_path / "g.npz").x.numpy(), x)


def test_a_label_gap_keeps_the_empty_class(tmp_path):
    """Labels {0, 2}: num_classes is max + 1 = 3 (class 1 empty, as GraphData allows), not the
    number of distinct labels (a mutation audit)."""
    save_npz(tmp_path / "g.npz", np.array([[0, 1], [1, 2]]), np.ones((3, 2)), np.array([0, 2, 2]))
    g = load_npz(tmp_path / "g.npz")
    assert g.num_classes == 3 and g.y.tolist() == [0, 2, 2]


def test_written_files_get_the_usual_permissions(tmp_path):
    """Files written atomically (a temp file, then a link) get the mode open() would give
    (0o666 & ~umask) and an overwritten file keeps its own: the temp file's 0o600 leaked
    through unnoticed (a mutation audit)."""
    import stat

    args = (np.array([[0], [1]]), np.ones((2, 2)), np.array([0, 1]))
    old = os.umask(0o022)
    try:
        save_npz(tmp_path / "g.npz", *args)
        assert stat.S_IMODE(os.stat(tmp_path / "g.npz").st_mode) == 0o644
        os.chmod(tmp_path / "g.npz", 0o664)
        save_npz(tmp_path / "g.npz", *args, force=True)
        assert stat.S_IMODE(os.stat(tmp_path / "g.npz").st_mode) == 0o664
    finally:
        os.umask(old)


@pytest.mark.parametrize("name", ["graph.pt", "graph.npz"])
def test_a_torch_save_file_is_named_as_one(tmp_path, name):
    """torch.save's zip opens as an npz of its members: the error listed them ('missing
    array(s) ...; has ['g/.data/serialization_id', ...]'), where the user needs to hear that
    the file is a .pt and how to convert it (a fresh-user audit, session 66)."""
    path = tmp_path / name
    torch.save({"edge_index": torch.zeros(2, 1, dtype=torch.long)}, path)
    # convert picks its reader by the suffix: a .npz-named .pt is told to rename it first (the
    # advice sent it back to this error: a review's find)
    rename = "" if name.endswith(".pt") else "rename it to graph.pt, then "
    with pytest.raises(ValueError) as exc:
        load_npz(path)
    assert (f"is a torch.save file (a .pt), not the uniform .npz format; {rename}convert a "
            f"saved PyG Data with `python -m hiertail_fast.data convert "
            f"{tmp_path / 'graph.pt'} OUT.npz`") in str(exc.value)


def test_save_npz_takes_the_tensors_from_pyg_data_takes(tmp_path):
    # a bfloat16 x gave torch's "Got unsupported ScalarType BFloat16", a sparse x torch's own
    # TypeError, a meta x a NotImplementedError (a data audit, session 67)
    ei, y = torch.tensor([[0, 1], [1, 2]]), torch.tensor([0, 1, 1])
    dense = torch.tensor([[1.0, 0.0], [0.0, 2.0], [0.5, 0.0]])
    for x in (dense.bfloat16(), dense.to_sparse(), dense.to_sparse_csr()):
        path = save_npz(tmp_path / "g.npz", ei, x, y, force=True)
        assert torch.equal(load_npz(path).x, dense)
    with pytest.raises(ValueError, match="'x' is on the meta device"):
        save_npz(tmp_path / "m.npz", ei, torch.empty(3, 2, device="meta"), y)
    assert not (tmp_path / "m.npz").exists()


def test_the_label_checks_say_the_same_thing_wherever_labels_enter(tmp_path):
    # one check (_validation.check_label_array) for the file loaders, relabel_by_size and the
    # splits, which wrote it three times in three wordings; each keeps its exception type for
    # float labels (a file's array and the splits: ValueError; relabel_by_size: TypeError)
    ei, x = np.array([[0, 1], [1, 2]]), np.ones((3, 2), np.float32)
    for y, message in ((np.array([0, -3, 1]), r"has negative labels \(min -3\)"),
                       (np.array([0, 2**63, 1], dtype=np.uint64),
                        r"has labels above int64's range \(max 9223372036854775808\)"),
                       (np.array([[0, 1, 1]]), r"must be 1-D \[n\], got shape \(1, 3\)")):
        for call in (lambda y: save_npz(tmp_path / "g.npz", ei, x, y),
                     relabel_by_size, natural_split):
            with pytest.raises(ValueError, match=message):
                call(y)
    # float labels, and bool ones (a mask passed as labels: counted as an integer array, it
    # was read as two classes without a word; a mutation pass, session 73)
    for labels in (np.array([0.0, 1.0, 1.0]), np.array([True, False, True])):
        for call, exc in ((lambda y: save_npz(tmp_path / "g.npz", ei, x, y), ValueError),
                          (relabel_by_size, TypeError), (natural_split, ValueError),
                          (class_counts, ValueError)):
            with pytest.raises(exc, match="must be an integer array of labels, got "
                               f"{labels.dtype}"):
                call(labels)
    assert not (tmp_path / "g.npz").exists()


# ------------------------------------------------ shapes, counts and tables the loader promises
def test_load_names_malformed_edge_index_and_csr_shapes(tmp_path):
    """An edge_index of three rows, a negative x_shape and an x_indptr longer than
    x_shape[0] + 1 are refused with the message naming that array (not read, nor reported
    as a corrupt member or an allocation failure)."""
    ei, y = np.array([[0, 1], [1, 0]]), np.array([0, 1])
    three_rows = np.array([[0, 1], [1, 0], [0, 0]])
    with pytest.raises(ValueError, match=r"'edge_index' must be an integer array of shape "
                       r"\[2, E\], got int64 \(3, 2\)"):
        load_npz(_write(tmp_path / "e.npz", edge_index=three_rows, y=y,
                        x=np.ones((2, 1), np.float32)))
    for shape, ptr, message in (
            ([2, -1], [0, 0, 0], r"'x_shape' must be two non-negative integers, got \[ 2 -1\]"),
            ([2, 2], [0, 0, 0, 0], "'x_indptr' must be an integer array of length 3"),
            ([2, 2], [0, 1, 1, 1], "'x_indptr' must be an integer array of length 3")):
        nnz = ptr[-1]
        path = _write(tmp_path / "c.npz", edge_index=ei, y=y, x_data=np.ones(nnz, np.float32),
                      x_indices=np.zeros(nnz, np.int32), x_indptr=np.array(ptr),
                      x_shape=np.array(shape))
        with pytest.raises(ValueError, match=message):
            load_npz(path)


def test_class_sizes_has_one_entry_per_class_empty_ones_included():
    """GraphData.class_sizes() is [C] long: classes after the largest label count 0."""
    g = GraphData(torch.tensor([[0], [1]]), torch.ones(3, 1), torch.tensor([1, 0, 1]),
                  num_classes=4)
    assert g.class_sizes().tolist() == [1, 2, 0, 0]


def test_dense_label_map_is_kept_up_to_four_labels_per_node(tmp_path):
    """load_npz(relabel_by_size=True) keeps the dense label_map while max label + 1 is at most
    max(DENSE_LABEL_MAP_MIN, 4 n), and gives None just past it (original_labels either way)."""
    from hiertail_fast.data.io import DENSE_LABEL_MAP_MIN

    n = 20_000
    assert 4 * n > DENSE_LABEL_MAP_MIN
    for top, dense in ((4 * n, True), (4 * n + 1, False)):
        y = np.zeros(n, np.int64)
        y[:2] = top - 1
        save_npz(tmp_path / "g.npz", np.zeros((2, 0), np.int64), np.ones((n, 1), np.float32),
                 y, force=True)
        g = load_npz(tmp_path / "g.npz", relabel_by_size=True)
        assert g.original_labels.tolist() == [0, top - 1]
        if dense:
            assert g.label_map.shape == (top,)
            assert (int(g.label_map[0]), int(g.label_map[top - 1])) == (0, 1)
        else:
            assert g.label_map is None


def test_class_counts_cover_every_label_class_when_idx_misses_the_last():
    """class_counts / split_counts without num_classes have max label + 1 entries, also when
    the selected nodes hold none of the largest class."""
    y = np.array([0, 1, 2, 2])
    assert class_counts(y, [0, 1]).tolist() == [1, 1, 0]
    assert split_counts(y, [0], [1], [2, 3]).tolist() == [[1, 0, 0], [0, 1, 0], [0, 0, 2]]


def test_duplicate_ids_get_the_mask_hint_only_when_they_could_be_a_mask():
    """A 0/1 array of num_nodes entries is hinted to be a mask; a shorter one with a repeated
    id is just a duplicate (no hint about masks)."""
    with pytest.raises(ValueError, match=r"looks like a 0/1 mask"):
        user_split(3, [0, 1, 1])
    with pytest.raises(ValueError, match=r"^train has duplicate node ids$"):
        user_split(5, [0, 1, 1])


def test_a_graph_without_nodes_is_refused_on_save_and_load(tmp_path):
    """An empty 'y' (no nodes) is a ValueError naming the file, on writing and on reading."""
    ei, x, y = np.zeros((2, 0), np.int64), np.zeros((0, 2), np.float32), np.zeros(0, np.int64)
    with pytest.raises(ValueError, match=r"empty\.npz\): the graph has no nodes"):
        save_npz(tmp_path / "empty.npz", ei, x, y)
    assert not (tmp_path / "empty.npz").exists()
    path = _write(tmp_path / "empty.npz", edge_index=ei, x=x, y=y)
    with pytest.raises(ValueError, match=r"empty\.npz: the graph has no nodes"):
        load_npz(path)


def test_class_counts_checks_its_node_ids():
    """class_counts validates ``idx`` as user_split does: a negative or duplicate id is a
    ValueError naming idx, not wrapped around or counted twice."""
    y = np.array([0, 1, 1])
    with pytest.raises(ValueError, match=r"idx has node ids outside \[0, 3\)"):
        class_counts(y, [-1])
    with pytest.raises(ValueError, match="idx has duplicate node ids"):
        class_counts(y, [1, 1])
    assert class_counts(y, np.array([True, False, True])).tolist() == [1, 1]


def test_user_split_num_nodes_is_no_bool():
    """num_nodes=True is a TypeError (a bool is no node count), not one node."""
    with pytest.raises(TypeError, match="num_nodes must be an int, got bool"):
        user_split(True, [0])
