"""--feature-norm: row normalisation of the node features (the official --is_normalize), off by
default; a non-default value changes every run's cache key, the default leaves the keys of the
runs cached before it existed unchanged."""
from __future__ import annotations

import json

import pytest
import torch

from hiertail_fast.data.datasets import load_dataset, normalize_features
from hiertail_fast.data.io import GraphData
from hiertail_fast.experiments import runner
from hiertail_fast.experiments.cli import main

pytestmark = pytest.mark.usefixtures("one_thread")

TINY = ["main", "--synthetic", "--synthetic-nodes", "120", "--seeds", "1", "--epochs", "2",
        "--hidden", "8", "--no-progress", "--device", "cpu", "--methods", "origin"]


def _graph() -> GraphData:
    x = torch.tensor([[1000.0, 3000.0], [0.0, 0.0], [2.0, 6.0]])
    return GraphData(edge_index=torch.tensor([[0, 1], [1, 0]]), x=x,
                     y=torch.tensor([0, 1, 1]), num_classes=2, name="email")


def test_normalize_features_row_none_and_bad_values():
    g = _graph()
    assert normalize_features(g, "none") is g
    out = normalize_features(g, "row")
    torch.testing.assert_close(out.x, torch.tensor([[0.25, 0.75], [0.0, 0.0], [0.25, 0.75]]))
    assert torch.equal(g.x, _graph().x)                          # input untouched
    assert out.edge_index is g.edge_index and out.num_classes == 2
    # the check is the only guard: normalize_features row-normalises whatever is not "none"
    # (an empty or differently cased value let in was taken as "row"; a mutation pass, s73)
    for bad in ("l2", "", "ROW", "None"):
        with pytest.raises(ValueError, match=f"feature_norm={bad!r} is not one of"):
            normalize_features(g, bad)
    with pytest.raises(TypeError, match="feature_norm must be a str"):
        normalize_features(g, None)
    # entries that cancel: x / sum leaves float32; the loader's NaN / Inf check then blamed
    # the file for what the normalisation made (a CLI audit)
    cancels = GraphData(edge_index=g.edge_index, y=g.y, num_classes=2, name="email",
                        x=torch.tensor([[1.0, 1.0, 1.0], [1e30, -1e30, 1e-30], [1.0, 2.0, 3.0]]))
    with pytest.raises(ValueError, match="row normalisation .* of node 1 leaves float32's range"):
        normalize_features(cancels, "row")


def test_load_dataset_feature_norm(tmp_path):
    _graph().to_npz(tmp_path / "email.npz")
    raw = load_dataset("email", tmp_path)
    assert raw.x.sum(1).tolist() == [4000.0, 0.0, 8.0]           # default: raw, as officially
    row = load_dataset("email", tmp_path, feature_norm="row")
    torch.testing.assert_close(row.x.sum(1), torch.tensor([1.0, 0.0, 1.0]))
    assert torch.equal(row.y, raw.y) and torch.equal(row.edge_index, raw.edge_index)
    with pytest.raises(ValueError, match="is not one of"):
        load_dataset("email", tmp_path, feature_norm="max")


def test_feature_norm_runs_are_cached_apart_and_default_keys_unchanged(tmp_path, monkeypatch):
    seen = []
    real = runner._train

    def spy(spec, data, *args, **kwargs):
        seen.append(data.x.sum(1))
        return real(spec, data, *args, **kwargs)
    monkeypatch.setattr(runner, "_train", spy)
    runs = tmp_path / "runs"
    base = [*TINY, "--runs-dir", str(runs)]
    main([*base, "--out", str(tmp_path / "raw")])
    res = main([*base, "--out", str(tmp_path / "row"), "--feature-norm", "row"])
    assert len(seen) == 2                                        # two trainings, not one cached
    assert not torch.allclose(seen[0], torch.ones_like(seen[0]))
    nonzero = seen[1] != 0
    torch.testing.assert_close(seen[1][nonzero], torch.ones_like(seen[1][nonzero]))
    records = [json.loads(p.read_text()) for p in (runs / "synthetic").glob("origin-*.json")]
    keys = sorted((r["identity"]["data"] for r in records), key=len)
    assert len(records) == 2
    assert keys[0] == {"nodes": 120, "edges": keys[0]["edges"], "features": 16, "classes": 6}
    assert keys[1] == {**keys[0], "feature_norm": "row"}
    assert res["args"]["feature_norm"] == "row"
    assert any("--feature-norm row" in n for n in res["notes"])
    assert "--feature-norm row" in (tmp_path / "row" / "main-s1-e2-p1000.md").read_text()
    main([*base, "--out", str(tmp_path / "row"), "--feature-norm", "row"])
    assert len(seen) == 2                                        # cached now


def test_bad_feature_norm_exits_with_a_message(tmp_path, capsys):
    with pytest.raises(SystemExit) as exc:
        main([*TINY, "--out", str(tmp_path), "--feature-norm", "l1"])
    assert exc.value.code == 2 and "--feature-norm" in capsys.readouterr().err
