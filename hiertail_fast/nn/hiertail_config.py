"""HierTailConfig: the model's and loss's hyper-parameters, the two named configurations
(``paper``, ``official``; their table is in hiertail_fast/nn/hiertail.py's docstring), validated
at construction, and the per-level pool sizes."""
from __future__ import annotations

import dataclasses
import math
import numbers
from collections.abc import Iterable, KeysView, Mapping
from dataclasses import dataclass

import numpy as np
import torch

from hiertail_fast._validation import (
    _FP32_MAX,
    MAX_NODES,
    MIN_TEMPERATURE,
    check_finite_number,
    check_flag,
    check_num_nodes,
    check_positive_int,
)

__all__ = ["HierTailConfig"]

_POOL_MODES = ("classes", "official")
_VARIANTS = ("exact", "official")
_BACKENDS = (None, "reference", "torch", "triton", "attention")
_LOSS_DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}
ACTIVATIONS = ("relu", "leaky_relu", "elu", "tanh")   # the appendix figure's activation sweep
_TINY_RATIO = 2.0 ** -100   # far below 1 / MAX_NODES: ceil(r·n) = 1 for every graph (n >= 1)
_FLAGS = ("share_convs", "linear_classifier", "augment_a2", "improved", "fix_cluster_labels",
          "include_self", "task_grouping", "contrastive")


def _real(value: object, name: str) -> int | float:
    """A finite real (bool and str a TypeError, NaN / inf a ValueError): a Python int or float
    as given, a numpy or one-element tensor scalar as float."""
    as_float = check_finite_number(value, name)
    return value if type(value) in (int, float) else as_float


@dataclass(frozen=True)
class HierTailConfig:
    """Every hyper-parameter of the model and its loss (``name`` says which preset it came from).

    pool_ratios / pool_mode:
        ``"classes"``: level l keeps ceil(pool_ratios[l]·C) nodes (paper: T⁽ˡ⁺¹⁾ counts).
        ``"official"``: PyG ratios after the official rescale pool_ratios[0] ← pool_ratios[0]·n/C
        applied ``pool_rescale_power`` times (1 = once, the recommended fix; s+1 at seed index s
        reproduces the code's compounding bug); a ratio >= 1 is a count floor(r) (PyG ``topk``),
        a ratio < 1 keeps ceil(r·n_prev).
    pool_counts: explicit number of tasks per level (e.g. (198, 70) for Table 5's over-clustering
        row); overrides pool_ratios / pool_mode and sets the number of levels. None: the ratios.
    task_grouping (M1) / contrastive (M2): the ablation switches of Table 4. ``task_grouping=False``
        drops the pooling levels: embedding GCN -> one GCN -> classifier (paper: GCN h->h, act,
        Linear; official: GCN h->C). ``contrastive=False`` drops SCL and BCL (L = CE). BCL needs
        the task prototypes, so ``contrastive`` requires ``task_grouping``.
    activation: the non-linearity after every hidden GCN (relu in both configurations).
    """

    name: str = "paper"
    hidden: int = 128
    pool_ratios: tuple[float, ...] = (1.0, 0.5)
    pool_mode: str = "classes"
    pool_rescale_power: int = 1
    share_convs: bool = False          # one down conv for all pooled levels, one up conv (h→h)
    linear_classifier: bool = True     # paper: Linear(h→C); official: last up conv h→C
    augment_a2: bool = False           # official augment_adj ((A+I)² without loops) before pools
    improved: bool = True              # GCNConv(improved=True): self-loop fill 2 where missing
    dropout: float = 0.0
    gamma: float = 0.01
    tau: float = 0.1
    scl_on: str = "hidden"             # "hidden" (paper) | "logits" (official)
    bcl_mode: str = "paper"            # "paper" (level l vs level l+1) | "official" (x⁰ vs each)
    fix_cluster_labels: bool = True    # official BCL: label = nearest index instead of perm[...]
    loss_variant: str = "exact"
    include_self: bool = False
    loss_backend: str | None = None    # None: dispatch; "reference": dense reference losses
    loss_dtype: str | None = None      # float32|bfloat16|float16 (or dtype): contrastive inputs
    lr: float = 0.01
    weight_decay: float = 5e-4
    pool_counts: tuple[int, ...] | None = None
    task_grouping: bool = True         # M1
    contrastive: bool = True           # M2
    activation: str = "relu"

    def __post_init__(self) -> None:
        # switches: a bool or numpy bool (stored as bool), never read by truthiness ("no")
        for name in _FLAGS:
            object.__setattr__(self, name, check_flag(getattr(self, name), name))
        # integers: bool, float (1.5, NaN) and str refused here, not deep inside the build
        for name in ("hidden", "pool_rescale_power"):
            value = getattr(self, name)
            if isinstance(value, (bool, np.bool_)) or not isinstance(value, numbers.Integral):
                raise TypeError(f"{name} must be an integer, got {type(value).__name__} "
                                f"{value!r}")
            object.__setattr__(self, name, int(value))   # numpy ints stored as int (JSON-able)
        # real numbers: finite, bool refused (gamma=True is no number); numpy / tensor scalars
        # stored as float, Python ints and floats as given
        for name in ("dropout", "gamma", "tau", "lr", "weight_decay"):
            object.__setattr__(self, name, _real(getattr(self, name), name))
        self._check_loss_dtype()
        if self.hidden < 1:
            raise ValueError(f"hidden must be >= 1, got {self.hidden}")
        self._check_pool_ratios()
        if self.pool_mode not in _POOL_MODES:
            raise ValueError(f"pool_mode={self.pool_mode!r} is not one of {_POOL_MODES}")
        if self.pool_rescale_power < 1:
            raise ValueError(f"pool_rescale_power must be >= 1, got {self.pool_rescale_power}")
        if not 0.0 <= self.dropout < 1.0:
            raise ValueError(f"dropout must lie in [0, 1), got {self.dropout}")
        if not 0 <= self.gamma <= _FP32_MAX:
            raise ValueError(f"gamma must lie in [0, {_FP32_MAX:.4g}] (float32's range: the loss "
                             f"is computed in float32, where a larger gamma is inf), got "
                             f"{self.gamma}")
        if not self.tau >= MIN_TEMPERATURE:
            raise ValueError(f"tau must be finite and >= {MIN_TEMPERATURE:g} (the loss's "
                             f"MIN_TEMPERATURE), got {self.tau}")
        if self.scl_on not in ("hidden", "logits"):
            raise ValueError(f"scl_on={self.scl_on!r} is not 'hidden' or 'logits'")
        if self.scl_on == "hidden" and not self.linear_classifier:
            raise ValueError("scl_on='hidden' needs linear_classifier=True (a hidden embedding)")
        if self.bcl_mode not in ("paper", "official"):
            raise ValueError(f"bcl_mode={self.bcl_mode!r} is not 'paper' or 'official'")
        if self.bcl_mode == "official" and self.pool_counts is None \
                and len(self.pool_ratios) < 2:           # (pool_counts: checked with them)
            raise ValueError("bcl_mode='official' needs at least two pooling levels")
        if self.loss_variant not in _VARIANTS:
            raise ValueError(f"loss_variant={self.loss_variant!r} is not one of {_VARIANTS}")
        if self.loss_backend not in _BACKENDS:
            raise ValueError(f"loss_backend={self.loss_backend!r} is not one of {_BACKENDS}")
        if not self.lr > 0:
            raise ValueError(f"lr must be finite and > 0, got {self.lr}")
        if not self.weight_decay >= 0:
            raise ValueError(f"weight_decay must be finite and >= 0, got {self.weight_decay}")
        self._check_ablation_fields()

    def _check_loss_dtype(self) -> None:
        value = self.loss_dtype
        if isinstance(value, torch.dtype):    # a dtype is stored by name (JSON-able)
            value = {v: k for k, v in _LOSS_DTYPES.items()}.get(value, value)
            object.__setattr__(self, "loss_dtype", value)
        if not (value is None or (isinstance(value, str) and value in _LOSS_DTYPES)):
            raise ValueError(f"loss_dtype={value!r} is not None or one of {list(_LOSS_DTYPES)}")

    def _check_pool_ratios(self) -> None:
        """pool_ratios as a tuple (``to_dict`` gives a list: the round trip is exact) of finite
        reals in (0, MAX_NODES]: a level never keeps more than MAX_NODES nodes (the library's
        largest graph), and a larger ratio overflowed ceil(r·C) to an OverflowError."""
        ratios = self.pool_ratios
        # ordered: a set (or a dict's keys) was taken in its own order, the levels reordered
        # ({1.0, 0.5} became (0.5, 1.0)); any other iterable (a range, a generator) as before
        if isinstance(ratios, (str, bytes, set, frozenset, Mapping, KeysView)) \
                or not isinstance(ratios, Iterable):
            raise TypeError(f"pool_ratios must be a sequence of numbers, got "
                            f"{type(ratios).__name__} {ratios!r}")
        ratios = tuple(ratios)
        if not ratios:
            raise ValueError("pool_ratios must name at least one pooling level")
        for r in ratios:
            if isinstance(r, (bool, np.bool_)) or not isinstance(r, numbers.Real):
                raise TypeError(f"pool_ratios must hold real numbers, got "
                                f"{type(r).__name__} {r!r} in {self.pool_ratios!r}")
        if any(not (0 < r <= MAX_NODES) for r in ratios):   # (NaN fails too)
            raise ValueError(f"pool_ratios must be finite and in (0, {MAX_NODES}] (a level keeps "
                             f"at most MAX_NODES nodes), got {self.pool_ratios}")
        object.__setattr__(self, "pool_ratios", tuple(
            r if type(r) in (int, float) else float(r) for r in ratios))

    def _check_ablation_fields(self) -> None:
        if self.pool_counts is not None:
            # (an int, a str or a set was iterated or failed with "'int' object is not
            # iterable"; an element that is no integer is a TypeError, as hidden's)
            if not isinstance(self.pool_counts, (tuple, list, np.ndarray)):
                raise TypeError(f"pool_counts must be a tuple of integers, got "
                                f"{type(self.pool_counts).__name__} {self.pool_counts!r}")
            counts = tuple(self.pool_counts)
            if any(isinstance(k, (bool, np.bool_)) or not isinstance(k, numbers.Integral)
                   for k in counts):
                raise TypeError(f"pool_counts must hold integers, got {self.pool_counts!r}")
            if not counts or any(k < 1 for k in counts):
                raise ValueError(f"pool_counts must be a non-empty tuple of integers >= 1, got "
                                 f"{self.pool_counts!r}")
            object.__setattr__(self, "pool_counts", tuple(int(k) for k in counts))
            if self.bcl_mode == "official" and len(counts) < 2:
                raise ValueError("bcl_mode='official' needs at least two pooling levels")
        if self.contrastive and not self.task_grouping:
            raise ValueError("contrastive=True (M2) needs task_grouping=True (M1): the balanced "
                             "contrastive loss contrasts nodes with the task prototypes")
        if self.activation not in ACTIVATIONS:
            raise ValueError(f"activation={self.activation!r} is not one of {ACTIVATIONS}")

    @property
    def num_levels(self) -> int:
        """L, the number of task-grouping (pooling) levels (0 without task grouping)."""
        if not self.task_grouping:
            return 0
        return len(self.pool_counts) if self.pool_counts is not None else len(self.pool_ratios)

    @classmethod
    def paper(cls, **overrides) -> HierTailConfig:
        """The paper's model (default): see the table in hiertail_fast/nn/hiertail.py's
        docstring."""
        return cls(**{"name": "paper", **overrides})

    @classmethod
    def official(cls, **overrides) -> HierTailConfig:
        """The official code as it runs (PROTOCOL_AND_BASELINES.md §3), seed-1 pool sizes."""
        base = dict(
            name="official", hidden=128, pool_ratios=(1.0, 0.5, 0.5), pool_mode="official",
            share_convs=True, linear_classifier=False, augment_a2=True, improved=True,
            dropout=0.0, gamma=0.01, tau=1.0, scl_on="logits", bcl_mode="official",
            fix_cluster_labels=False, loss_variant="official", include_self=True, lr=0.001,
        )
        return cls(**{**base, **overrides})

    @classmethod
    def named(cls, name: str, **overrides) -> HierTailConfig:
        """``"paper"`` or ``"official"`` preset by name."""
        if name not in ("paper", "official"):
            raise ValueError(f"unknown HierTail config {name!r}; use 'paper' or 'official'")
        return getattr(cls, name)(**overrides)

    def replace(self, **changes) -> HierTailConfig:
        """A copy with ``changes`` applied (fields by name), checked as a new config is."""
        return dataclasses.replace(self, **changes)

    def to_dict(self) -> dict:
        """Every field as plain Python values (lists for the tuples): JSON-ready."""
        out = dataclasses.asdict(self)
        out["pool_ratios"] = list(self.pool_ratios)
        if self.pool_counts is not None:
            out["pool_counts"] = list(self.pool_counts)
        return out

    def pool_sizes(self, num_nodes: int, num_classes: int) -> list[int | float]:
        """What each level hands to ``topk_pool``: an int count or a float ratio in (0, 1].
        ``num_nodes`` an int >= 0, ``num_classes`` an int >= 1 (TypeError / ValueError: -5
        nodes gave counts of -5, 0 classes a ZeroDivisionError, 100.5 nodes half-node
        counts; an API audit). Not while TorchDynamo traces: the forward passes x.shape[0],
        a symbolic int under dynamic shapes, whose check broke the compiled graph (a review)."""
        if not torch.compiler.is_compiling():
            num_nodes = check_num_nodes(num_nodes)
            num_classes = check_positive_int(num_classes, "num_classes")
        if not self.task_grouping:
            return []
        if self.pool_counts is not None:   # a level keeps at most the previous level's nodes
            sizes, prev = [], num_nodes
            for k in self.pool_counts:
                prev = min(k, prev)
                sizes.append(prev)
            return sizes
        if self.pool_mode == "classes":
            return [max(1, math.ceil(r * num_classes)) for r in self.pool_ratios]
        first = float(self.pool_ratios[0])
        for _ in range(self.pool_rescale_power):
            first = first * num_nodes / num_classes  # embedder.py: ratio * len(labels) / nclass
            if first == 0.0 or math.isinf(first):    # fixed from here on (0: n = 0)
                break
        return [_pyg_ratio(first, num_nodes)] + [_pyg_ratio(r, None) for r in self.pool_ratios[1:]]


def _pyg_ratio(ratio: float, cap: int | None) -> int | float:
    """PyG ``topk`` reading of a ratio: >= 1 is a count floor(r), < 1 a fraction (ceil).

    A ratio below 2**-100 (a rescaled first ratio of an empty graph, n = 0, or one rescaled
    many times on a graph with fewer nodes than classes) is the count 1: r·n < 1 for every
    n <= MAX_NODES, so ceil(r·n) is 1 (0 for n = 0), which ``topk_pool`` keeps as min(1, n),
    as the paper configuration's counts do; as a float, 0 was refused and a product below
    float32's smallest value kept no node."""
    if ratio >= 1.0:
        k = math.floor(ratio) if math.isfinite(ratio) else cap
        return int(k if cap is None else min(k, cap))
    if ratio < _TINY_RATIO:
        return 1
    return float(ratio)
