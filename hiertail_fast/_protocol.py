"""The official evaluation protocol's constants, one definition for the trainer, the baselines
and the experiments (which wrote them twice). Torch-free: the experiments' runner imports it
without torch."""
from __future__ import annotations

# the official harness's seeds 123..132, one run each, and its training budget
OFFICIAL_SEEDS = tuple(range(123, 133))
EPOCHS, PATIENCE = 10_000, 1_000
# the metrics of a run record, in the paper's column order (Tables 2-5)
METRICS = ("bacc", "macro_f1", "g_means", "acc")
METRIC_NAMES = {"bacc": "bAcc", "macro_f1": "Macro-F1", "g_means": "G-Means", "acc": "Acc"}
# the paper appendix's hidden size: 64 on BlogCatalog, Email and Wiki; 128 on the other three
PAPER_HIDDEN = {"email": 64, "wiki": 64, "blogcatalog": 64}
