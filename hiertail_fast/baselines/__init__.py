"""The paper's long-tail baselines on HierTail's harness (PROTOCOL_AND_BASELINES.md §2).

``python -m hiertail_fast.train --method NAME ...`` runs one with the same loop, splits, early
stopping, metrics, seeds and ``--json`` as HierTail. Landed: ``origin``, ``reweight``,
``oversampling``, ``smote``, ``embed_smote``, ``graphsmote_t``, ``graphsmote_o``, ``lte4g`` — all
in O(n·F + n·h + |E|) memory (GraphSMOTE's reconstruction loss still takes O(n²·h) time) —
``graphens``, ``imgagn`` (O((n+s)·(F+h) + |E|) plus their sampled neighbours / generator outputs)
and ``graphmixup`` (its reconstruction loss O(n²·h) time, its local-path labels O(n·|5-hop ball|)
time once, both in linear memory).
"""
from hiertail_fast.baselines import graphens as _graphens  # noqa: F401 (registers graphens)
from hiertail_fast.baselines import graphmixup as _graphmixup  # noqa: F401 (registers it)
from hiertail_fast.baselines import graphsmote as _graphsmote  # noqa: F401 (registers _T, _O)
from hiertail_fast.baselines import imgagn as _imgagn  # noqa: F401 (registers imgagn)
from hiertail_fast.baselines import lte4g as _lte4g  # noqa: F401 (registers lte4g)
from hiertail_fast.baselines.config import BaselineConfig
from hiertail_fast.baselines.harness import run_baseline_seeds, train_baseline
from hiertail_fast.baselines.methods import METHODS, BaselineMethod, MethodContext, build_method

__all__ = ["BaselineConfig", "METHODS", "BaselineMethod", "MethodContext", "build_method",
           "train_baseline", "run_baseline_seeds"]
