"""The semi-synthetic long-tail split (Table 3's protocol): class selection, the α head share,
highest-degree node choice, split sizes, the official alignment bug and its fix."""
from __future__ import annotations

import numpy as np
import pytest
import torch

from hiertail_fast.data.io import GraphData
from hiertail_fast.data.semi_synthetic import semi_synthetic_long_tail


def _graph(sizes, seed=0) -> GraphData:
    """Classes of the given sizes; a ring plus random chords; x[i, 0] = original id."""
    rng = np.random.default_rng(seed)
    y = np.repeat(np.arange(len(sizes)), sizes)
    n = y.shape[0]
    src = np.concatenate([np.arange(n), rng.integers(0, n, 3 * n)])
    dst = np.concatenate([(np.arange(n) + 1) % n, rng.integers(0, n, 3 * n)])
    keep = src != dst
    e = np.unique(np.stack([np.r_[src[keep], dst[keep]], np.r_[dst[keep], src[keep]]]), axis=1)
    x = np.stack([np.arange(n), y], axis=1).astype(np.float32)
    return GraphData(torch.from_numpy(e), torch.from_numpy(x), torch.from_numpy(y),
                     len(sizes), name="toy")


SIZES = [60, 50, 40, 30, 25, 20, 16, 14, 12, 10]


def test_head_holds_about_alpha_and_sizes_follow_the_rule():
    g = _graph(SIZES)
    s = semi_synthetic_long_tail(g, val_per_class=2, test_per_class=4)
    info = s.info
    assert info["kept_classes"] == 10 and info["dropped_classes"] == []
    train = np.array(info["train_per_class"])
    assert train[:2].tolist() == [54, 44]                 # head: n_c - 6, kept
    assert abs(train[:2].sum() / train.sum() - 0.8) < 0.05
    assert s.data.num_nodes == train.sum() + 10 * 6
    for part, k in ((s.val, 2), (s.test, 4)):
        assert np.bincount(s.data.y[part].numpy()).tolist() == [k] * 10
    all_idx = torch.cat([s.train, s.val, s.test])
    assert torch.unique(all_idx).numel() == all_idx.numel() == s.data.num_nodes


def test_small_classes_are_dropped_and_too_few_refused():
    g = _graph([60, 50, 40, 30, 25, 5, 3])
    s = semi_synthetic_long_tail(g, val_per_class=2, test_per_class=4)
    assert s.info["dropped_classes"] == [5, 6] and s.info["kept_classes"] == 5
    with pytest.raises(ValueError, match="need at least 2"):
        semi_synthetic_long_tail(g, val_per_class=25, test_per_class=55)
    with pytest.raises(ValueError, match="alpha"):
        semi_synthetic_long_tail(g, alpha=1.0)


def test_fixed_alignment_keeps_features_labels_and_edges_together():
    g = _graph(SIZES)
    s = semi_synthetic_long_tail(g, val_per_class=2, test_per_class=4)
    orig = s.data.x[:, 0].long()            # each new node's original id
    # every new edge joins two nodes that were adjacent in the original graph
    old = set(map(tuple, g.edge_index.T.tolist()))
    new = orig[s.data.edge_index].T.tolist()
    assert all(tuple(e) in old for e in new)
    # labels follow the features (relabelled by size, so compare through the class grouping)
    same = (s.data.y[:, None] == s.data.y[None, :])
    orig_same = (g.y[orig][:, None] == g.y[orig][None, :])
    assert torch.equal(same, orig_same)
    # the split is drawn per seed
    s2 = semi_synthetic_long_tail(g, val_per_class=2, test_per_class=4, split_seed=1)
    assert not torch.equal(s.train, s2.train)


def test_alignment_bug_scrambles_edges_and_fixes_the_split():
    g = _graph(SIZES)
    a = semi_synthetic_long_tail(g, val_per_class=2, test_per_class=4, alignment_bug=True)
    b = semi_synthetic_long_tail(g, val_per_class=2, test_per_class=4, alignment_bug=True,
                                 split_seed=7)
    assert torch.equal(a.train, b.train)       # the same split for every run
    orig = a.data.x[:, 0].long()
    assert torch.equal(orig, orig.sort().values)   # X in ascending original-id order
    old = set(map(tuple, g.edge_index.T.tolist()))
    new = orig[a.data.edge_index].T.tolist()
    assert sum(tuple(e) in old for e in new) < 0.5 * len(new)


def test_highest_degree_nodes_are_kept():
    g = _graph(SIZES)
    s = semi_synthetic_long_tail(g, val_per_class=2, test_per_class=4)
    deg = torch.bincount(g.edge_index[0], minlength=g.num_nodes)
    kept = set(s.data.x[:, 0].long().tolist())
    for c in range(10):
        nodes = torch.nonzero(g.y == c).flatten()
        k = sum(1 for i in nodes.tolist() if i in kept)
        threshold = deg[nodes].sort(descending=True).values[k - 1]
        assert all(deg[i] >= threshold for i in nodes.tolist() if i in kept)


def test_seeds_flags_and_counts_are_checked():
    g = _graph(SIZES)
    kw = dict(val_per_class=2, test_per_class=4)
    ref = semi_synthetic_long_tail(g, **kw, graph_seed=5, split_seed=3)
    # numpy integers are the same as ints (np.int64 graph_seed failed inside random.Random;
    # np.int64 val_per_class was refused as "not an integer >= 1")
    same = semi_synthetic_long_tail(g, val_per_class=np.int64(2), test_per_class=np.int32(4),
                                    graph_seed=np.int64(5), split_seed=np.int64(3))
    assert all(torch.equal(a, b) for a, b in zip(ref.split, same.split, strict=True))
    assert torch.equal(ref.data.x, same.data.x)
    # None drew an unreproducible graph / split
    for name in ("graph_seed", "split_seed"):
        for bad in (None, 1.5, "abc", True):
            with pytest.raises(TypeError, match=name):
                semi_synthetic_long_tail(g, **kw, **{name: bad})
    with pytest.raises(ValueError, match="split_seed must be >= 0"):
        semi_synthetic_long_tail(g, **kw, split_seed=-1)
    # "no" is truthy: it silently selected the buggy alignment
    with pytest.raises(TypeError, match="alignment_bug must be a bool"):
        semi_synthetic_long_tail(g, **kw, alignment_bug="no")
    # float32(0.8) is 0.800000011920929: it was refused as "not in (0, 1)"
    with pytest.raises(TypeError, match="float32"):
        semi_synthetic_long_tail(g, **kw, alpha=np.float32(0.8))
    assert semi_synthetic_long_tail(g, **kw, alpha=np.float64(0.8)).info["train_per_class"] \
        == ref.info["train_per_class"]
