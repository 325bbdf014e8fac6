"""Evaluation metrics of the HierTail protocol (PROTOCOL_AND_BASELINES.md §1.3, paper Defs. 1-2).

Every metric works on integer class predictions (not scores), takes numpy arrays, torch tensors
or lists, and needs neither scikit-learn nor imbalanced-learn at run time. All return fractions
in [0, 1]; the paper reports them multiplied by 100.

Cost: O(n + K) time and memory, K = largest label + 1. Only three per-class count vectors are
built with ``np.bincount`` (true positives TP_c, true counts T_c = TP_c + FN_c, predicted counts
P_c = TP_c + FP_c); no K x K confusion matrix and no Python loop over samples or classes. Labels
far above n (K > max(2**16, 4n)) are relabelled over the present classes first (O(n log n)):
memory never grows with the largest label, except in ``per_class_accuracy``, whose output has
one entry per label 0..K-1.

Label set: like scikit-learn, the classes taken into account are those that occur in y_true or
in y_pred ("present" labels); a class occurring in neither is ignored.
"""
from __future__ import annotations

import math
import numbers
from fractions import Fraction
from typing import Any

import numpy as np

# Labels up to max(this, 4 n) count in dense per-label vectors (np.bincount, O(n + K)); beyond
# it the present labels are relabelled first (O(n log n)), as data/io.py's DENSE_LABEL_MAP_MIN.
DENSE_LABELS_MIN = 1 << 16
_INT64_MAX = int(np.iinfo(np.int64).max)

__all__ = [
    "accuracy",
    "balanced_accuracy",
    "macro_f1",
    "g_means",
    "per_class_accuracy",
    "class_imbalance_ratio",
    "long_tailedness_ratio",
    "loss_range",
    "evaluate",
]


# --------------------------------------------------------------------------------------------
# input handling
# --------------------------------------------------------------------------------------------
def _to_numpy(a: Any, name: str) -> np.ndarray:
    """numpy view of a numpy array / torch tensor / sequence (torch is never imported here).

    A floating tensor without a numpy dtype (bfloat16, float8) comes as float32, which holds
    its values exactly; another tensor numpy cannot take is a TypeError naming ``name``."""
    if hasattr(a, "detach") and hasattr(a, "cpu"):  # torch.Tensor without importing torch
        if getattr(a, "is_nested", False):
            raise TypeError(f"{name} must be a plain tensor, got a nested tensor: evaluate "
                            "each graph on its own, or torch.cat them")
        if type(a).__name__ == "MaskedTensor":      # (torch.masked's; torch not imported)
            raise TypeError(f"{name} must be a plain tensor, got a MaskedTensor: pass the "
                            "entries that are present as a plain tensor")
        # (a meta tensor failed in .cpu() with NotImplementedError, a sparse one was refused
        # as "a tensor of dtype torch.int64 cannot be converted": an API audit, session 68)
        if str(getattr(a, "device", "")) == "meta":
            raise ValueError(f"{name} is on the meta device: it has no values to read")
        if str(getattr(a, "layout", "torch.strided")) != "torch.strided":
            raise TypeError(f"{name} must be a dense tensor, got layout {a.layout}: pass "
                            f"{name}.to_dense()")
        t = a.detach().cpu()
        try:
            return t.numpy()
        except (TypeError, RuntimeError) as exc:
            if t.is_floating_point():
                return t.float().numpy()
            raise TypeError(f"{name}: a tensor of dtype {t.dtype} cannot be converted to a "
                            f"numpy array ({exc})") from None
    try:
        return np.asarray(a)
    except Exception as exc:  # pragma: no cover - exotic inputs
        raise TypeError(f"{name} cannot be converted to an array: {exc}") from exc


def _labels(a: Any, name: str) -> np.ndarray:
    """Validate a 1-D vector of non-negative integer class ids; return it as int64."""
    arr = _to_numpy(a, name)
    if arr.ndim != 1:
        raise ValueError(f"{name} must be 1-D, got shape {arr.shape}")
    if arr.dtype == bool or not (np.issubdtype(arr.dtype, np.integer) or arr.size == 0):
        raise ValueError(f"{name} must hold integer class ids, got dtype "
                         f"{getattr(a, 'dtype', arr.dtype)}")
    if arr.dtype.kind == "u" and arr.size and int(arr.max()) > _INT64_MAX:
        # (the int64 cast below made 2**63 + 5 a negative id)
        raise ValueError(f"{name} has class id {int(arr.max())} beyond int64's range "
                         f"(max {_INT64_MAX})")
    arr = arr.astype(np.int64, copy=False)
    if arr.size and int(arr.min()) < 0:
        raise ValueError(f"{name} has negative class ids (min {int(arr.min())})")
    return arr


def _num_classes(value: Any) -> int:
    """``num_classes`` as an int >= 1: any integer but bool (numpy's too); floats, str and bool
    are a TypeError. (`hiertail_fast._validation.check_num_nodes` would import torch.)"""
    if isinstance(value, (bool, np.bool_)) or not isinstance(value, numbers.Integral):
        raise TypeError(f"num_classes must be an int, got {type(value).__name__} {value!r}")
    if value < 1:
        raise ValueError(f"num_classes must be >= 1, got {value}")
    return int(value)


def _pair(y_true: Any, y_pred: Any) -> tuple[np.ndarray, np.ndarray]:
    t = _labels(y_true, "y_true")
    p = _labels(y_pred, "y_pred")
    if t.shape[0] != p.shape[0]:
        raise ValueError(f"y_true has {t.shape[0]} entries but y_pred has {p.shape[0]}")
    if t.shape[0] == 0:
        raise ValueError("y_true and y_pred are empty")
    return t, p


def _counts(t: np.ndarray, p: np.ndarray, num_classes: int | None = None):
    """Per-class TP, true counts T, predicted counts P over K = max label + 1 classes.

    Without ``num_classes`` (the metrics over the present classes) labels far above the number
    of samples are first relabelled 0..K'-1 in ascending order over the labels present
    (np.unique, as `hiertail_fast.data.io.size_order`): absent classes count in no metric, so
    the result is the same and memory no longer grows with the largest label (one label of
    10**10 asked for 74.5 GiB)."""
    k = int(max(t.max(), p.max())) + 1
    if num_classes is not None:
        if k > num_classes:     # (_validation.check_labels_below's words; it imports torch)
            raise ValueError(f"the labels go up to {k - 1} but num_classes is {num_classes}: "
                             f"labels must lie in [0, {num_classes})")
        k = num_classes
    elif k > max(DENSE_LABELS_MIN, 4 * t.shape[0]):
        present, inverse = np.unique(np.concatenate([t, p]), return_inverse=True)
        inverse = inverse.reshape(-1)
        t, p, k = inverse[: t.shape[0]], inverse[t.shape[0]:], present.shape[0]
    tp = np.bincount(t[t == p], minlength=k).astype(np.float64)
    true_c = np.bincount(t, minlength=k).astype(np.float64)
    pred_c = np.bincount(p, minlength=k).astype(np.float64)
    return tp, true_c, pred_c


def _div0(num: np.ndarray, den: np.ndarray) -> np.ndarray:
    """num / den with 0 where den == 0 (scikit-learn's zero_division -> 0)."""
    out = np.zeros_like(num, dtype=np.float64)
    np.divide(num, den, out=out, where=den > 0)
    return out


# --------------------------------------------------------------------------------------------
# classification metrics
# --------------------------------------------------------------------------------------------
def accuracy(y_true: Any, y_pred: Any) -> float:
    """Accuracy = mean_i 1[y_pred_i = y_true_i]."""
    t, p = _pair(y_true, y_pred)
    return float(np.count_nonzero(t == p) / t.shape[0])


def _bacc(tp, true_c) -> float:
    has = true_c > 0  # classes present in y_true only (sklearn drops predicted-only classes)
    return float(np.mean(tp[has] / true_c[has]))


def balanced_accuracy(y_true: Any, y_pred: Any) -> float:
    """Balanced accuracy = mean over classes c present in y_true of recall TP_c / T_c.

    Same as ``sklearn.metrics.balanced_accuracy_score`` (adjusted=False): classes that occur
    only in y_pred are dropped (sklearn warns; we stay silent).
    """
    tp, true_c, _ = _counts(*_pair(y_true, y_pred))
    return _bacc(tp, true_c)


def _f1(tp, true_c, pred_c) -> float:
    present = (true_c + pred_c) > 0
    # F1_c = 2 TP / (2 TP + FP + FN) = 2 TP / (T_c + P_c); a present class has T_c + P_c > 0,
    # and a class never predicted or never true (TP = 0) gets F1 = 0.
    f1 = 2.0 * tp[present] / (true_c[present] + pred_c[present])
    return float(np.mean(f1))


def macro_f1(y_true: Any, y_pred: Any) -> float:
    """Macro-F1 = mean over present classes (y_true ∪ y_pred) of F1_c = 2TP_c / (T_c + P_c).

    Same as ``sklearn.metrics.f1_score(average="macro")`` with zero_division -> 0.
    """
    return _f1(*_counts(*_pair(y_true, y_pred)))


def _gmean(tp, true_c, pred_c, n: int) -> float:
    present = (true_c + pred_c) > 0
    tp, true_c, pred_c = tp[present], true_c[present], pred_c[present]
    # sensitivity_c = TP / (TP + FN) = TP / T_c; specificity_c = TN / (TN + FP) with
    # TN = n - (T_c + P_c - TP), so TN + FP = n - T_c. 0/0 -> 0, as imblearn's _prf_divide.
    sens = _div0(tp, true_c)
    tn = n - (true_c + pred_c - tp)
    spec = _div0(tn, n - true_c)
    return float(np.sqrt(sens.mean() * spec.mean()))


def g_means(y_true: Any, y_pred: Any) -> float:
    """G-Means = sqrt(S̄ · P̄) exactly as ``imblearn.metrics.geometric_mean_score(average="macro")``.

    S̄ = mean_c TP_c / (TP_c + FN_c) (macro sensitivity) and P̄ = mean_c TN_c / (TN_c + FP_c)
    (macro specificity), both over the classes present in y_true ∪ y_pred, with 0/0 -> 0 (e.g.
    the specificity of the only class when y_true holds a single class). This is neither the mean
    of per-class sqrt(sens·spec) nor the geometric mean of recalls (average="multiclass").
    """
    t, p = _pair(y_true, y_pred)
    return _gmean(*_counts(t, p), t.shape[0])


def per_class_accuracy(y_true: Any, y_pred: Any, num_classes: int | None = None) -> np.ndarray:
    """Per-class accuracy (= recall) TP_c / T_c, float64 [K], K = num_classes or max label + 1.

    Entries of classes with no sample in y_true are NaN.
    """
    t, p = _pair(y_true, y_pred)
    # K given explicitly even when num_classes is not: _counts relabels far-apart labels over
    # the present classes, which would index the result by position, not by class id
    num_classes = (_num_classes(num_classes) if num_classes is not None
                   else int(max(t.max(), p.max())) + 1)
    tp, true_c, _ = _counts(t, p, num_classes=num_classes)
    out = np.full(tp.shape, np.nan)
    np.divide(tp, true_c, out=out, where=true_c > 0)
    return out


def evaluate(y_true: Any, y_pred: Any) -> dict[str, float]:
    """The four headline metrics in one pass over the data (fractions; the paper shows x100).

    Returns ``{"acc", "bacc", "macro_f1", "g_means"}``, each equal to the single-metric function.
    """
    t, p = _pair(y_true, y_pred)
    tp, true_c, pred_c = _counts(t, p)
    n = t.shape[0]
    return {
        "acc": float(tp.sum() / n),
        "bacc": _bacc(tp, true_c),
        "macro_f1": _f1(tp, true_c, pred_c),
        "g_means": _gmean(tp, true_c, pred_c, n),
    }


# --------------------------------------------------------------------------------------------
# dataset statistics
# --------------------------------------------------------------------------------------------
def _class_sizes(y: Any, class_sizes: Any) -> np.ndarray:
    """Sizes of the non-empty classes, from labels ``y`` or from explicit ``class_sizes``."""
    if (y is None) == (class_sizes is None):
        raise ValueError("give exactly one of y (labels) or class_sizes")
    if y is not None:
        lab = _labels(y, "y")
        if lab.size == 0:
            raise ValueError("y is empty")
        return np.unique(lab, return_counts=True)[1]  # classes are the labels that occur
    sizes = _to_numpy(class_sizes, "class_sizes")
    if sizes.ndim != 1 or sizes.size == 0:
        raise ValueError(f"class_sizes must be a non-empty 1-D array, got shape {sizes.shape}")
    if (sizes.dtype == bool or not np.issubdtype(sizes.dtype, np.number)
            or np.issubdtype(sizes.dtype, np.complexfloating)):  # complex: imag part dropped
        raise ValueError(f"class_sizes must be numeric (real), got dtype {sizes.dtype}")
    if not np.all(np.isfinite(sizes)) or np.any(sizes <= 0):
        raise ValueError("class_sizes must be finite and > 0 (every class non-empty)")
    if np.issubdtype(sizes.dtype, np.floating) and np.any(sizes != np.round(sizes)):
        raise ValueError("class_sizes must be whole numbers")
    # the int64 sizes and their sum must not wrap (2**62 twice, uint64 2**63, float 1e20 gave
    # negative or garbage sizes and a wrong ratio, silently)
    if float(np.sum(sizes, dtype=np.float64)) >= 2.0**62:
        raise ValueError("class_sizes sum to 2**62 or more; too large to count in int64")
    return sizes.astype(np.int64)


def class_imbalance_ratio(y: Any = None, *, class_sizes: Any = None) -> float:
    """Class-imbalance ratio min_t |D_t| / max_t |D_t| over the non-empty classes (paper §2)."""
    s = _class_sizes(y, class_sizes)
    return float(s.min() / s.max())


def long_tailedness_ratio(
    y: Any = None,
    p: float = 0.8,
    *,
    class_sizes: Any = None,
    quantile: str = "midpoint",
) -> float:
    """Long-tailedness ratio Ratio_LT(p) = Q(p) / (T - Q(p)) (paper Definition 1).

    Classes are sorted largest first; T = number of non-empty classes; s_(1) >= ... >= s_(T).
    Let k = min{j : s_(1) + ... + s_(j) >= p · n}, the number of classes reaching a share p of
    the n instances (compared exactly, p taken as the decimal it prints as).

    quantile="plain":    Q(p) = k (the integer quantile of the definition).
    quantile="midpoint": Q(p) = k - 0.5, the midpoint between k - 1 (classes holding just under
                         p) and k (classes reaching p); Q(p) = k when the first k classes hold
                         exactly p. This reproduces every Ratio_LT value of the paper's Table 1
                         (Email 0.79, Wiki 1.00, BlogCatalog 0.77 with Q = 18.5, 8.5, 16.5).

    Args:
        y: labels [n] (classes = the labels that occur), or None when class_sizes is given.
        p: quantile order in (0, 1); 0.8 is the paper's Pareto choice.
        class_sizes: sizes [T] of the classes, all > 0, any order (instead of y).
    Returns:
        the ratio as a float; ``math.inf`` when Q(p) = T (only with quantile="plain").
    """
    if quantile not in ("midpoint", "plain"):
        raise ValueError(f"quantile must be 'midpoint' or 'plain', got {quantile!r}")
    if isinstance(p, bool) or not (isinstance(p, numbers.Real) and 0.0 < float(p) < 1.0):
        raise ValueError(f"p must be a number in (0, 1), got {p!r}")
    s = np.sort(_class_sizes(y, class_sizes))[::-1]
    t = s.shape[0]
    n = int(s.sum())
    cum = np.cumsum(s)
    # exact: p as the decimal it prints as (np.float32(0.8) is 0.8, not 0.800000012, which
    # moved k past a class holding exactly 80 %), shares compared in integers (a float
    # tolerance let a head 999 instances short of 80 % of 1e12 count as reaching it)
    frac = Fraction(str(p)) if isinstance(p, (float, np.floating)) else Fraction(p)
    num, den = frac.numerator, frac.denominator
    lo, hi = 0, t - 1                 # first j with cum[j] / n >= p; cum[-1] = n > p·n
    while lo < hi:
        mid = (lo + hi) // 2
        if int(cum[mid]) * den >= num * n:
            hi = mid
        else:
            lo = mid + 1
    k = lo + 1
    q = float(k)
    if quantile == "midpoint" and int(cum[k - 1]) * den != num * n:
        q = k - 0.5
    return math.inf if q >= t else q / (t - q)


def loss_range(losses: Any, y: Any = None) -> float:
    """Loss range of paper Definition 2: max_t L̄_t - min_t L̄_t.

    L̄_t is the mean loss (cross-entropy in the paper) of the nodes of class t.

    Args:
        losses: either per-class mean losses [T] (``y`` None; NaN entries, e.g. classes without
            nodes, are ignored) or per-node losses [n] together with their labels ``y`` [n],
            in which case L̄_t = bincount(y, losses) / bincount(y) over the classes present.
        y: optional labels [n].
    """
    arr = _to_numpy(losses, "losses")
    if arr.ndim != 1 or arr.size == 0:
        raise ValueError(f"losses must be a non-empty 1-D array, got shape {arr.shape}")
    if np.issubdtype(arr.dtype, np.complexfloating):   # (the cast dropped the imaginary part)
        raise TypeError(f"losses must be real, got dtype {arr.dtype}")
    if not np.issubdtype(arr.dtype, np.number) or arr.dtype == bool:
        raise ValueError(f"losses must be numeric, got dtype {arr.dtype}")
    arr = arr.astype(np.float64)
    if np.isinf(arr).any():      # ([inf, inf] gave NaN; inf and -inf made a class mean NaN)
        raise ValueError("losses contain inf: a loss range needs finite losses (NaN marks a "
                         "class without nodes)")
    if y is not None:
        lab = _labels(y, "y")
        if lab.shape[0] != arr.shape[0]:
            raise ValueError(f"losses has {arr.shape[0]} entries but y has {lab.shape[0]}")
        if np.isnan(arr).any():
            raise ValueError("per-node losses contain NaN")
        _, lab, cnt = np.unique(lab, return_inverse=True, return_counts=True)  # present only
        arr = np.bincount(lab.reshape(-1), weights=arr) / cnt
    arr = arr[~np.isnan(arr)]
    if arr.size == 0:
        raise ValueError("losses hold no finite per-class value")
    out = float(arr.max()) - float(arr.min())   # (Python floats: inf on overflow, no warning)
    if not math.isfinite(out):
        raise ValueError("the loss range overflows float64 (losses of magnitude ~1e308)")
    return out
