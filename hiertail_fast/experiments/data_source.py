"""The graphs of an experiments command: the paper's datasets, a user's, or one small synthetic
long-tail graph, loaded once and shared by every run, with the fingerprint of the data each run
sees (`DataSource.run_fingerprint`)."""
from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

from hiertail_fast.experiments.run_cache import data_fingerprint

if TYPE_CHECKING:
    from hiertail_fast.experiments.runner import RunSpec


SYNTHETIC_DEGREE = 6.0      # the --synthetic graph's average degree (DataSource.load)


class DataSource:
    """The graphs of a command: paper datasets from ``data_dir`` (``load_dataset``, official
    preprocessing) or one small synthetic long-tail graph named ``synthetic`` (CI), their
    features normalised by ``feature_norm`` (``"none"``, the official default, or ``"row"``;
    ``load_dataset``). A non-default ``feature_norm`` is part of every run's data key, so its
    runs are cached apart; ``"none"`` leaves the key (and the runs cached before) as it was."""

    def __init__(self, data_dir: Path | None, synthetic: dict | None = None,
                 feature_norm: str = "none") -> None:
        from hiertail_fast._validation import check_feature_norm

        self.data_dir, self.synthetic = data_dir, synthetic
        self.feature_norm = check_feature_norm(feature_norm)
        self._data: dict[str, Any] = {}
        self._graphs: dict[tuple, Any] = {}
        self._fingerprints: dict[Any, str] = {}

    def available(self) -> list[str]:
        if self.synthetic is not None:
            return ["synthetic"]
        from hiertail_fast.data.datasets import DATASETS
        return [n for n in DATASETS if (Path(self.data_dir) / f"{n}.npz").is_file()]

    def load(self, name: str):
        if name not in self._data:
            if name == "synthetic" and self.synthetic is not None:
                from hiertail_fast.data.synthetic import make_synthetic_graph
                s = self.synthetic
                g = make_synthetic_graph(s["nodes"], num_classes=s["classes"],
                                         avg_degree=SYNTHETIC_DEGREE,
                                         num_features=s["features"], seed=s.get("seed", 0))
                g.name = "synthetic"
                from hiertail_fast.data.datasets import normalize_features
                self._data[name] = normalize_features(g, self.feature_norm)
            else:
                from hiertail_fast.data.datasets import load_dataset
                self._data[name] = load_dataset(name, self.data_dir,
                                                feature_norm=self.feature_norm)
        return self._data[name]

    def data_key(self, name: str) -> dict:
        d = self.load(name)
        key = {"nodes": int(d.y.shape[0]), "edges": int(d.edge_index.shape[1]),
               "features": int(d.x.shape[1]), "classes": int(d.num_classes)}
        if self.feature_norm != "none":
            key["feature_norm"] = self.feature_norm
        return key

    def fingerprint(self, name: str) -> str:
        """`data_fingerprint` of the graph ``load(name)`` gives (after feature normalisation)."""
        if name not in self._fingerprints:
            self._fingerprints[name] = data_fingerprint(self.load(name))
        return self._fingerprints[name]

    def run_fingerprint(self, spec: RunSpec) -> str:
        """`data_fingerprint` of the graph a run of ``spec`` trains on: the loaded one, or the
        semi-synthetic graph made from it (its nodes, edges and order are the code's, not only
        the identity's arguments: when that code came to follow the official arithmetic, the
        runs of the old graphs were served for the new ones). Its split is drawn by the seed,
        as the natural split is."""
        if spec.split[0] != "semi_lt":
            return self.fingerprint(spec.dataset)
        key = (spec.dataset, spec.split)
        if key not in self._fingerprints:
            self._fingerprints[key] = data_fingerprint(self._semi(spec, 0).data)
        return self._fingerprints[key]

    def run_classes(self, spec: RunSpec) -> int:
        """The number of classes of the graph a run of ``spec`` trains on (a semi-synthetic
        graph keeps only the classes large enough for its split)."""
        if spec.split[0] != "semi_lt":
            return int(self.load(spec.dataset).num_classes)
        return int(self._semi(spec, 0).data.num_classes)

    def _semi(self, spec: RunSpec, split_seed: int):
        """The semi-synthetic graph of a ``("semi_lt", alpha, val, test, bug)`` split (its
        graph does not depend on ``split_seed``, only its train / val / test nodes)."""
        from hiertail_fast.data.semi_synthetic import semi_synthetic_long_tail
        _, alpha, val, test, bug = spec.split
        return semi_synthetic_long_tail(self.load(spec.dataset), alpha=alpha,
                                        val_per_class=val, test_per_class=test,
                                        split_seed=split_seed, alignment_bug=bug)

    def run_inputs(self, spec: RunSpec, seed: int):
        """(graph data, split, prepared graph) of one run."""
        from hiertail_fast.data.splits import natural_split
        from hiertail_fast.nn.hiertail import prepare_graph
        data = self.load(spec.dataset)
        if spec.split[0] == "natural":
            split = natural_split(data.y, seed)
        elif spec.split[0] == "semi_lt":
            semi = self._semi(spec, seed)
            data, split = semi.data, semi.split
        else:
            raise ValueError(f"unknown split {spec.split!r}")
        key = (spec.dataset, spec.split)
        if key not in self._graphs:
            self._graphs[key] = prepare_graph(data.edge_index, int(data.y.shape[0]))
        return data, split, self._graphs[key]
