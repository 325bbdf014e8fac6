"""Behaviour of the data layer (hiertail_fast.data) that a mutation audit (s43) found no test
pinned down: each test here failed on one of its mutants and passes on the package."""
from __future__ import annotations

import os

import numpy as np
import pytest
import torch

from hiertail_fast.data.conversion import convert
from hiertail_fast.data.datasets import (
    canonical_name,
    load_dataset,
    official_preprocess,
    resolve_root,
)
from hiertail_fast.data.io import DENSE_LABEL_MAP_MIN, load_npz, relabel_by_size, save_npz
from hiertail_fast.data.splits import class_counts, natural_split, split_counts


def _write(path, **arrays):
    with open(path, "wb") as fh:
        np.savez(fh, **arrays)
    return path


def _tiny():
    ei = np.array([[0, 1, 1, 2, 3, 4], [1, 0, 2, 1, 4, 3]], dtype=np.int64)
    x = np.arange(15, dtype=np.float32).reshape(5, 3)
    y = np.array([2, 0, 2, 1, 2], dtype=np.int64)
    return ei, x, y


def test_more_feature_rows_than_labels_is_refused(tmp_path):
    """(M03) An 'x' with MORE rows than 'y' has labels must be refused like one with fewer: else
    a user whose features and labels come from different node sets (an extra node, an off-by-one
    export) trains on features silently misaligned with the labels."""
    ei, x, y = _tiny()
    x6 = np.vstack([x, np.ones((1, 3), np.float32)])
    path = _write(tmp_path / "extra_row.npz", edge_index=ei, x=x6, y=y)
    with pytest.raises(ValueError, match="6 rows but 'y' has 5 labels") as err:
        load_npz(path)
    assert "extra_row.npz" in str(err.value)
    with pytest.raises(ValueError, match="rows"):
        save_npz(tmp_path / "out.npz", ei, x6, y)
    assert not (tmp_path / "out.npz").exists()


def test_label_map_is_dense_up_to_the_documented_threshold_inclusive(tmp_path):
    """(M10) ``load_npz(relabel_by_size=True)`` keeps the dense old -> new ``label_map`` for
    labels up to max(DENSE_LABEL_MAP_MIN, 4 n) values, the bound included: a user whose largest
    label sits exactly there would otherwise get ``label_map=None`` and code indexing it fails."""
    ei, x, _ = _tiny()
    top = DENSE_LABEL_MAP_MIN                           # > 4 n = 20: this bound applies
    y = np.array([top - 1, 0, top - 1, 3, top - 1], dtype=np.int64)
    save_npz(tmp_path / "edge.npz", ei, x, y)
    g = load_npz(tmp_path / "edge.npz", relabel_by_size=True)
    assert g.label_map is not None and g.label_map.shape == (top,)
    np.testing.assert_array_equal(g.label_map[y], g.y.numpy())
    assert g.original_labels.tolist() == [top - 1, 0, 3]
    # one more label value: no dense table (original_labels still has the map)
    y2 = y.copy()
    y2[0] = y2[2] = y2[4] = top
    save_npz(tmp_path / "over.npz", ei, x, y2)
    g2 = load_npz(tmp_path / "over.npz", relabel_by_size=True)
    assert g2.label_map is None
    np.testing.assert_array_equal(g2.original_labels[g2.y.numpy()], y2)


def test_relabel_by_size_table_covers_num_classes():
    """(M11) ``relabel_by_size(y, num_classes)``: the table covers every label below num_classes,
    absent ones after the present ones in ascending order. Ignoring num_classes left a caller
    mapping another split's or file's labels (here class 3, absent from this y) with an
    IndexError or, worse, a table of the wrong length."""
    y = np.array([1, 1, 0, 1, 0, 2])
    new, label_map = relabel_by_size(y, num_classes=5)
    np.testing.assert_array_equal(label_map, [1, 0, 2, 3, 4])
    np.testing.assert_array_equal(new, label_map[y])
    # a count below the labels is refused, as the splits and the trainer refuse it (it was
    # ignored; and 2.5, -1, True, "5" were taken or failed inside numpy: an API audit, s68)
    with pytest.raises(ValueError, match=r"the labels go up to 2 but num_classes is 2"):
        relabel_by_size(y, num_classes=2)
    for bad in (2.5, True, "5", np.float64(5)):
        with pytest.raises(TypeError, match="num_classes must be an int"):
            relabel_by_size(y, num_classes=bad)
    np.testing.assert_array_equal(relabel_by_size(y, num_classes=np.int64(3))[1], [1, 0, 2])
    # a 0-d integer tensor (y.max() + 1) is a count too, as before (a review, session 68); a
    # negative one is named as not positive, not as "labels must lie in [0, -1)"
    import torch

    np.testing.assert_array_equal(relabel_by_size(y, torch.tensor(y).max() + 1)[1], [1, 0, 2])
    with pytest.raises(ValueError, match="num_classes must be a positive int, got -1"):
        relabel_by_size(y, num_classes=-1)


def test_a_label_equal_to_num_classes_is_refused():
    """(S11) Labels must be < num_classes, the boundary included: a label == C (a 1-based label
    file, C counted without the extra class) went through, and ``class_counts`` then returned
    C + 1 counts, so per-class tables silently misaligned with the model's C outputs."""
    y = np.array([0, 1, 2, 3, 3])
    for call in (lambda: natural_split(y, num_classes=3),
                 lambda: class_counts(y, num_classes=3),
                 lambda: split_counts(y, [0], [1], [2], num_classes=3)):
        with pytest.raises(ValueError, match="labels go up to 3 but num_classes is 3"):
            call()
    assert class_counts(y, num_classes=4).tolist() == [1, 1, 1, 2]


@pytest.mark.parametrize("raw", [" cora ", "Cora-Full\n", "\tAMZ_CLOTH", "blog "])
def test_dataset_names_ignore_surrounding_whitespace(raw):
    """(D01) A dataset name read from a config file or a shell variable often carries a space
    or a newline; without the strip the user got "unknown dataset name 'cora '" for a dataset
    the registry has."""
    want = {"cora": "cora_full", "cora-full": "cora_full", "amz_cloth": "amazon_clothing",
            "blog": "blogcatalog"}[raw.strip().lower()]
    assert canonical_name(raw) == want


def _cora_like(tmp_path):
    ei = np.array([[0, 1, 2, 2], [1, 0, 3, 2]], dtype=np.int64)     # one-way edge, a self-loop
    x = np.array([[2.0, 0.0], [0.0, 3.0], [1.0, 1.0], [0.0, 0.5]], dtype=np.float32)
    y = np.array([0, 1, 1, 2], dtype=np.int64)                       # class 1 largest
    save_npz(tmp_path / "cora_full.npz", ei, x, y)
    return ei, x, y


def test_preprocess_false_returns_the_graph_as_stored(tmp_path):
    """(D06) ``load_dataset(..., preprocess=False)`` must skip the official preprocessing: a
    user comparing raw and preprocessed features, or using their own label order, otherwise
    silently got binarised features, relabelled classes and rewritten edges."""
    ei, x, y = _cora_like(tmp_path)
    g = load_dataset("cora_full", tmp_path, preprocess=False)
    np.testing.assert_array_equal(g.x.numpy(), x)
    np.testing.assert_array_equal(g.y.numpy(), y)
    np.testing.assert_array_equal(g.edge_index.numpy(), ei)
    assert g.label_map is None and g.original_labels is None
    p = load_dataset("cora_full", tmp_path)                          # the default: preprocessed
    np.testing.assert_array_equal(p.x.numpy(), (x > 0).astype(np.float32))
    assert p.y.tolist() == [1, 0, 0, 2] and p.num_edges == 4         # symmetrised, no self-loop


@pytest.mark.parametrize("name", ["cora_full", "blogcatalog", "email"])
def test_official_preprocess_leaves_the_input_graph_unchanged(tmp_path, name):
    """(D08) ``official_preprocess`` returns a new GraphData and must not touch the one it is
    given (its docstring): an in-place binarisation/normalisation corrupted a graph the user
    still held (e.g. loaded once, preprocessed per experiment: the second run saw 0/1 features
    and its own preprocessing applied twice)."""
    _cora_like(tmp_path)
    g = load_npz(tmp_path / "cora_full.npz")
    before = {k: getattr(g, k).clone() for k in ("x", "y", "edge_index")}
    official_preprocess(g, name)
    for k, t in before.items():
        assert torch.equal(getattr(g, k), t), k


def test_blogcatalog_row_normalisation_divides_by_the_signed_sum(tmp_path):
    """(D09) BlogCatalog's DeepWalk rows are signed; the official loader divides by the signed
    row sum and leaves a zero-sum row at zero. Dividing by |sum| flips the sign of every node
    whose embedding sums negative, and a zero-sum row such as [1, -1] must not blow up."""
    ei = np.zeros((2, 0), dtype=np.int64)
    x = np.array([[-1.0, -3.0], [1.0, -1.0], [2.0, 2.0]], dtype=np.float32)
    save_npz(tmp_path / "blogcatalog.npz", ei, x, np.array([0, 1, 1]))
    g = load_dataset("blogcatalog", tmp_path)
    np.testing.assert_allclose(g.x.numpy(), [[0.25, 0.75], [0.0, 0.0], [0.5, 0.5]])
    assert g.y.tolist() == [1, 0, 0]


class _Payload:
    """An object whose unpickling creates a directory: proof that code from the file ran."""

    def __init__(self, marker: str):
        self.marker = marker

    def __reduce__(self):
        return os.mkdir, (self.marker,)


@pytest.mark.parametrize("member", ["y", "x", "edge_index"])
def test_a_pickled_member_is_never_unpickled(tmp_path, member):
    """(M22) A downloaded .npz whose member is an object array runs arbitrary code when numpy
    unpickles it. ``load_npz`` must refuse it WITHOUT unpickling: an error after the fact (the
    object array failing the dtype check) would be too late, the payload has run."""
    ei, x, y = _tiny()
    marker = tmp_path / "payload_ran"
    arrays = dict(edge_index=ei, x=x, y=y)
    arrays[member] = np.array([_Payload(str(marker))], dtype=object)
    path = _write(tmp_path / "evil.npz", **arrays)
    with pytest.raises(ValueError, match="evil.npz"):
        load_npz(path)
    assert not marker.exists()


@pytest.mark.parametrize("sparse_x", [False, True])
def test_saved_files_have_the_documented_dtypes(tmp_path, sparse_x):
    """(M24) shared/data/README.md fixes the array dtypes of the uniform format (edge_index and
    y int64, x float32; CSR parts float32 / int32 / int64 / int64). Our own loader accepts any
    integer type, so a writer drifting to int32 would go unnoticed here while the files break
    readers that follow the format (the official harness, other tools), whatever dtypes the
    caller's arrays had."""
    ei, x, y = _tiny()
    path = save_npz(tmp_path / "g.npz", ei.astype(np.int32), x.astype(np.float64),
                    y.astype(np.uint8), sparse_x=sparse_x)
    with np.load(path) as z:
        got = {k: z[k].dtype for k in z.files}
    want = {"edge_index": np.int64, "y": np.int64}
    want.update({"x_data": np.float32, "x_indices": np.int32, "x_indptr": np.int64,
                 "x_shape": np.int64} if sparse_x else {"x": np.float32})
    assert got == {k: np.dtype(v) for k, v in want.items()}


def test_a_data_root_that_is_a_file_is_refused(tmp_path):
    """(D14) ``root`` must be a directory: a file passed as root (``--root graph.npz`` instead of
    its folder) was accepted and the user then read "<root>/email.npz not found" under a path
    that cannot exist, instead of being told the root is wrong."""
    f = tmp_path / "email.npz"
    f.write_bytes(b"not a directory")
    with pytest.raises(FileNotFoundError, match="is not a directory"):
        resolve_root(f)
    with pytest.raises(FileNotFoundError, match="is not a directory"):
        load_dataset("email", f)


def test_an_existing_file_without_suffix_is_a_file_not_a_dataset_name(tmp_path, monkeypatch):
    """(C05) ``convert`` takes a source that exists on disk as a file even without a .npz / .pt
    suffix. Otherwise a local file named like a dataset ("email") silently converted the
    registry's dataset from the data root instead of the user's file."""
    root = tmp_path / "root"
    root.mkdir()
    ei, x, y = _tiny()
    save_npz(root / "email.npz", ei, x, y)
    work = tmp_path / "work"
    work.mkdir()
    (work / "email").write_bytes(b"the user's own file")
    monkeypatch.chdir(work)
    with pytest.raises(ValueError, match=r"source email: expected a \.npz or \.pt file"):
        convert("email", work / "out.npz", root=root)
    assert not (work / "out.npz").exists()
