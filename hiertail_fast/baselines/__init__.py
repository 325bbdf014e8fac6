"""The paper's long-tail baselines on HierTail's harness (PROTOCOL_AND_BASELINES.md §2).

``python -m hiertail_fast.train --method NAME ...`` runs one with the same loop, splits, early
stopping, metrics, seeds and ``--json`` as HierTail. Landed: ``origin``, ``reweight``,
``oversampling``, ``smote``, ``embed_smote``, ``graphsmote_t``, ``graphsmote_o``,
``graphmixup`` — all in O(n·F + n·h + |E|) memory (GraphSMOTE's and GraphMixup's reconstruction
loss still take O(n²·h) time, GraphMixup's local-path labels O(n·|5-hop ball|) once).
"""
from hiertail_fast.baselines import graphmixup as _graphmixup  # noqa: F401 (registers it)
from hiertail_fast.baselines import graphsmote as _graphsmote  # noqa: F401 (registers _T, _O)
from hiertail_fast.baselines.config import BaselineConfig
from hiertail_fast.baselines.harness import run_baseline_seeds, train_baseline
from hiertail_fast.baselines.methods import METHODS, BaselineMethod, MethodContext, build_method

__all__ = ["BaselineConfig", "METHODS", "BaselineMethod", "MethodContext", "build_method",
           "train_baseline", "run_baseline_seeds"]
