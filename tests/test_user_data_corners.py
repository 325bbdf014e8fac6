"""Corners of how a user's own data gets in (the .npz loader/saver, load_dataset's names and
preprocessing, PyG Data in, the CSRGraph constructors, user splits) that no test reached (a
mutation audit, session 33): each test here failed on one plausible bug that every other test
passed. Expected values come from the documented rule or an independent computation (a float64
oracle, a hand-written list)."""
from __future__ import annotations

import numpy as np
import pytest
import torch

from hiertail_fast import CSRGraph
from hiertail_fast.data.datasets import (
    canonical_name,
    load_dataset,
    normalize_features,
    official_preprocess,
)
from hiertail_fast.data.io import GraphData, load_npz, save_npz
from hiertail_fast.data.splits import user_split

EI2 = np.array([[0, 1], [1, 0]])


def _graph(x: torch.Tensor, y: torch.Tensor) -> GraphData:
    return GraphData(edge_index=torch.from_numpy(EI2), x=x, y=y, num_classes=int(y.max()) + 1)


def test_loaded_name_is_the_file_stem(tmp_path):
    """load_npz's default name is the file STEM, documented (a mutation audit: the file name
    with its '.npz' passed every other test, whose files had no suffix)."""
    save_npz(tmp_path / "mygraph.npz", EI2, np.ones((2, 1)), np.array([0, 1]))
    assert load_npz(tmp_path / "mygraph.npz").name == "mygraph"
    assert load_npz(tmp_path / "mygraph.npz", name="other").name == "other"


def test_sparse_features_round_trip_exactly_in_float32(tmp_path):
    """save_npz(sparse_x=True) stores x_data as float32, so non-integer and large features
    come back bit-exact (a mutation audit: x_data stored as float16 passed the small-integer
    round trips)."""
    x = np.array([[0.1, 0.0], [0.0, 1234.567], [7.0e4, 0.0]], dtype=np.float32)
    save_npz(tmp_path / "g.npz", EI2, x, np.array([0, 1, 1]), sparse_x=True)
    assert np.load(tmp_path / "g.npz")["x_data"].dtype == np.float32
    np.testing.assert_array_equal(load_npz(tmp_path / "g.npz").x.numpy(), x)


def test_official_preprocess_original_labels_has_one_entry_per_class():
    """official_preprocess: original_labels is int64 [C] (new -> old label) for the C =
    num_classes present classes, also when labels have gaps (a mutation audit: the table over
    every label value 0..max passed)."""
    y = torch.tensor([5, 5, 5, 2, 2, 0])       # labels 1, 3 and 4 absent
    p = official_preprocess(_graph(torch.ones(6, 1), y), "email")
    assert p.num_classes == 3
    assert p.original_labels.tolist() == [5, 2, 0]     # by size: 5 (3 nodes), 2 (2), 0 (1)
    assert p.y.tolist() == [0, 0, 0, 1, 1, 2]


@pytest.mark.parametrize("alias, name", [
    ("amz_eletronics", "amazon_electronics"), ("amz_electronics", "amazon_electronics"),
    ("amz_cloth", "amazon_clothing"), ("blog", "blogcatalog"), ("cora", "cora_full"),
    ("CoraFull", "cora_full"), ("Amazon-Clothing", "amazon_clothing"),
])
def test_official_aliases_name_the_right_dataset(alias, name):
    """The official harness's dataset names resolve to the paper's dataset (a mutation audit:
    'amz_eletronics' resolving to Amazon-Clothing passed every test)."""
    assert canonical_name(alias) == name


def test_feature_norm_comes_after_the_official_binarisation(tmp_path):
    """load_dataset(feature_norm="row") row-normalises AFTER the official preprocessing
    (documented: 'applied last'): cora_full's binarised rows then sum to 1 (a mutation audit:
    normalising first, then binarising, passed)."""
    x = np.array([[3.0, 1.0, 0.0], [0.0, 2.0, 2.0], [5.0, 0.0, 0.0]], dtype=np.float32)
    save_npz(tmp_path / "cora_full.npz", EI2, x, np.array([0, 1, 1]))
    g = load_dataset("cora_full", tmp_path, feature_norm="row")
    want = (x > 0) / (x > 0).sum(1, keepdims=True)
    np.testing.assert_array_equal(g.x.numpy(), want.astype(np.float32))


def test_row_normalisation_sums_in_float64():
    """Row normalisation (feature_norm="row", blogcatalog's preprocessing) divides by the
    row sum taken in float64, documented: a row whose float32 sum cancels to 0 keeps its
    float64 sum of 1 (a mutation audit: a float32 sum passed, giving a zero row)."""
    x = torch.tensor([[1e8, 1.0, -1e8], [0.25, 0.5, 0.25]], dtype=torch.float32)
    x64 = x.double()
    oracle = (x64 / x64.sum(1, keepdim=True)).float()
    g = _graph(x, torch.tensor([0, 1]))
    assert torch.equal(normalize_features(g, "row").x, oracle)
    assert torch.equal(official_preprocess(g, "blogcatalog").x, oracle)


def test_pyg_float64_edge_weights_are_kept_as_they_are():
    """from_pyg_data keeps a floating edge_weight as the very tensor (documented 'no copies'):
    float64 weights keep their precision (a mutation audit: a cast to float32 passed)."""
    Data = pytest.importorskip("torch_geometric.data").Data
    from hiertail_fast.data.pyg import from_pyg_data
    w = torch.tensor([1.0 + 1e-12, 2.0], dtype=torch.float64)
    d = Data(x=torch.ones(2, 1), y=torch.tensor([0, 1]), edge_index=torch.from_numpy(EI2),
             edge_weight=w)
    assert from_pyg_data(d).edge_weight is w


def test_an_explicit_edge_weight_replaces_the_datas():
    """prepare_graph(data, edge_weight=w): the given w replaces the Data's edge_weight
    (documented in graph_inputs; a mutation audit: the Data's winning passed)."""
    Data = pytest.importorskip("torch_geometric.data").Data
    from hiertail_fast.nn.hiertail import prepare_graph
    d = Data(edge_index=torch.from_numpy(EI2), num_nodes=2, edge_weight=torch.ones(2))
    g = prepare_graph(d, edge_weight=torch.tensor([5.0, 5.0]))
    dense = torch.zeros(2, 2).index_put_((g.row_index(), g.indices), g.weight)
    assert dense.tolist() == [[1.0, 5.0], [5.0, 1.0]]


def test_csr_with_repeated_columns_is_a_valid_graph():
    """CSRGraph takes CSR arrays with a repeated column in a row (non-decreasing, as
    from_edge_index(dedupe=False) builds them; a mutation audit: refusing them passed)."""
    g = CSRGraph.from_edge_index(torch.tensor([[0, 0, 1], [1, 1, 0]]), dedupe=False)
    assert g.indptr.tolist() == [0, 1, 3] and g.indices.tolist() == [1, 0, 0]
    h = CSRGraph(g.indptr.clone(), g.indices.clone(), None, 2)
    assert h.degree().tolist() == [1.0, 2.0]


def test_kept_duplicates_stay_in_input_order():
    """from_edge_index(dedupe=False) keeps duplicate entries in their input order (documented
    stable sort): with weight = input position, the weights of equal (target, source)
    entries increase (a mutation audit: an unstable sort passed)."""
    n, e = 50, 20000
    ei = torch.randint(0, n, (2, e), generator=torch.Generator().manual_seed(0))
    g = CSRGraph.from_edge_index(ei, torch.arange(e, dtype=torch.float64), num_nodes=n,
                                 dedupe=False)
    key = g.row_index() * n + g.indices
    same = key[1:] == key[:-1]
    assert bool(same.any())
    assert bool((g.weight[1:][same] > g.weight[:-1][same]).all())


def test_a_weighted_graph_without_edges_stays_weighted():
    """An edgeless weighted graph keeps an empty weight tensor of its dtype (a mutation
    audit: dropping it to None, an unweighted graph, passed)."""
    g = CSRGraph.from_edge_index(torch.zeros(2, 0, dtype=torch.long),
                                 torch.zeros(0, dtype=torch.float64), num_nodes=3)
    assert g.weight is not None and g.weight.dtype == torch.float64 and g.weight.numel() == 0


@pytest.mark.parametrize("dedupe", [False, True])
def test_removed_self_loops_take_their_weights_with_them(dedupe):
    """from_edge_index(remove_self_loops=True) drops each loop's weight with it; the other
    edges keep theirs (a mutation audit: unfiltered weights passed, shifted onto the wrong
    edges without dedupe)."""
    ei, w = torch.tensor([[0, 0, 1], [0, 1, 0]]), torch.tensor([9.0, 2.0, 3.0])
    g = CSRGraph.from_edge_index(ei, w, remove_self_loops=True, dedupe=dedupe)
    got = {(int(s), int(t)): float(v)
           for (s, t), v in zip(g.edge_index().T, g.weight, strict=True)}
    assert got == {(0, 1): 2.0, (1, 0): 3.0}


def test_self_loop_fill_applies_to_an_unweighted_graph():
    """with_self_loops(fill) gives the loops weight ``fill`` on an unweighted graph too (a
    mutation audit: unit loops passed): in-degree = 1 neighbour + fill."""
    g = CSRGraph.from_edge_index(torch.from_numpy(EI2)).with_self_loops(2.0)
    assert g.degree().tolist() == [3.0, 3.0]


@pytest.mark.parametrize("mask", [[True, False, False, False], [True, False, False, True]])
def test_a_mask_longer_than_the_graph_is_refused(mask):
    """user_split refuses a boolean mask of another length than the node count, too long
    included (a mutation audit: a longer mask was accepted, its ids beyond the graph kept)."""
    with pytest.raises(ValueError, match="mask has 4 entries but there are 3 nodes"):
        user_split(3, np.array(mask))


def test_arrays_outside_the_format_are_named_not_dropped_silently(tmp_path):
    """A user's .npz with edge_weight (or masks) beside edge_index / x / y loaded unweighted
    without a word (an interop audit): the ignored arrays are named in a warning; the three
    shipped layouts (x dense or as CSR parts) load without one."""
    import warnings

    ei = np.array([[0, 1, 2], [1, 2, 0]])
    x, y = np.eye(3, dtype=np.float32), np.array([0, 1, 1])
    path = tmp_path / "weighted.npz"
    np.savez(path, edge_index=ei, x=x, y=y, edge_weight=np.array([0.5, 2.0, 1.0]),
             train_mask=np.ones(3, dtype=bool))
    with pytest.warns(UserWarning, match=r"edge_weight, train_mask are not part of the "
                                         r"uniform format .* read unweighted"):
        g = load_npz(path)
    assert g.edge_weight is None
    for sparse in (False, True):
        plain = save_npz(tmp_path / f"plain{sparse}.npz", ei, x, y, sparse_x=sparse)
        with warnings.catch_warnings():
            warnings.simplefilter("error")
            load_npz(plain)
