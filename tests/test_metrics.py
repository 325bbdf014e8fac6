"""Metrics against scikit-learn / imbalanced-learn, Ratio_LT by hand and on the paper's Table 1."""
from __future__ import annotations

import math
import warnings

import numpy as np
import pytest
import torch

from hiertail_fast.metrics import (
    accuracy,
    balanced_accuracy,
    class_imbalance_ratio,
    evaluate,
    g_means,
    long_tailedness_ratio,
    loss_range,
    macro_f1,
    per_class_accuracy,
)

skm = pytest.importorskip("sklearn.metrics")
imb = pytest.importorskip("imblearn.metrics")


def _oracle(t, p):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return {
            "acc": skm.accuracy_score(t, p),
            "bacc": skm.balanced_accuracy_score(t, p),
            "macro_f1": skm.f1_score(t, p, average="macro", zero_division=0),
            "g_means": imb.geometric_mean_score(t, p, average="macro"),
        }


def _random_case(rng, i):
    """Random predictions incl. classes only true, only predicted, missing, tiny n."""
    n = int(rng.integers(1, 60)) if i % 3 else int(rng.integers(60, 400))
    k_true = int(rng.integers(1, 12))
    t = rng.integers(0, k_true, n)
    mode = i % 4
    if mode == 0:  # noisy copies of the truth
        p = np.where(rng.random(n) < 0.6, t, rng.integers(0, k_true, n))
    elif mode == 1:  # predictions use classes never true (and skip some true ones)
        p = rng.integers(k_true // 2, k_true + 5, n)
    elif mode == 2:  # long-tailed truth, majority-biased predictions
        t = np.minimum(rng.geometric(0.35, n) - 1, 15)
        p = np.where(rng.random(n) < 0.7, 0, t)
    else:  # sparse label ids with gaps
        t = rng.choice([0, 3, 7, 20], n)
        p = rng.choice([0, 3, 9, 20, 21], n)
    return t.astype(np.int64), p.astype(np.int64)


def test_against_sklearn_and_imblearn_random():
    rng = np.random.default_rng(1234)
    for i in range(400):
        t, p = _random_case(rng, i)
        want = _oracle(t, p)
        got = evaluate(t, p)
        for key, fn in [("acc", accuracy), ("bacc", balanced_accuracy), ("macro_f1", macro_f1),
                        ("g_means", g_means)]:
            assert got[key] == pytest.approx(want[key], abs=1e-12), (key, i, t, p)
            assert fn(t, p) == pytest.approx(want[key], abs=1e-12), (key, i)


@pytest.mark.parametrize(
    "t,p",
    [
        ([0, 0, 0], [0, 0, 0]),  # one class everywhere: specificity 0/0 -> 0, G-Means 0
        ([1, 1], [0, 0]),  # nothing right
        ([0, 1], [0, 1]),  # perfect, binary
        ([2], [5]),  # one sample, class only predicted
        ([0, 1, 2, 3], [3, 2, 1, 0]),
        ([4, 4, 4, 1], [4, 4, 4, 4]),
    ],
)
def test_corner_cases(t, p):
    want = _oracle(np.array(t), np.array(p))
    got = evaluate(t, p)
    for key in want:
        assert got[key] == pytest.approx(want[key], abs=1e-12), key


def test_g_means_is_not_mean_of_per_class_gmeans():
    t = np.array([0, 0, 0, 0, 1, 1, 2])
    p = np.array([0, 0, 1, 2, 1, 0, 2])
    tp = np.array([2, 1, 1.0])
    sens = tp / np.array([4, 2, 1])
    spec = np.array([2 / 3, 4 / 5, 5 / 6])  # TN / (n - T_c)
    assert g_means(t, p) == pytest.approx(math.sqrt(sens.mean() * spec.mean()))
    assert g_means(t, p) != pytest.approx(np.mean(np.sqrt(sens * spec)))


def test_torch_inputs_and_per_class_accuracy():
    t = torch.tensor([0, 0, 1, 1, 1, 3])
    p = torch.tensor([0, 1, 1, 1, 0, 3])
    assert evaluate(t, p) == evaluate(t.numpy(), p.numpy())
    pca = per_class_accuracy(t, p)
    np.testing.assert_allclose(pca, [0.5, 2 / 3, np.nan, 1.0])
    assert per_class_accuracy(t, p, num_classes=6).shape == (6,)
    assert np.nanmean(pca) == pytest.approx(balanced_accuracy(t, p))
    assert accuracy(t, p) == pytest.approx(4 / 6)


@pytest.mark.parametrize(
    "t,p,msg",
    [
        ([0, 1], [0], "entries"),
        ([], [], "empty"),
        ([[0, 1]], [[0, 1]], "1-D"),
        ([0.0, 1.0], [0, 1], "integer"),
        ([True, False], [0, 1], "integer"),
        ([0, -1], [0, 1], "negative"),
    ],
)
def test_bad_inputs(t, p, msg):
    for fn in (accuracy, balanced_accuracy, macro_f1, g_means, evaluate, per_class_accuracy):
        with pytest.raises(ValueError, match=msg):
            fn(np.array(t), np.array(p))


def test_per_class_accuracy_indexed_by_class_id_for_far_apart_labels():
    # labels beyond max(2**16, 4n) were relabelled over the present classes and the result came
    # back indexed by position: [nan, 1, 0] instead of 70,001 entries (a metrics audit)
    pca = per_class_accuracy([5, 70000], [5, 3])
    assert pca.shape == (70001,) and pca[5] == 1.0 and pca[70000] == 0.0
    assert np.isnan(np.delete(pca, [5, 70000])).all()


def test_per_class_accuracy_num_classes_too_small():
    with pytest.raises(ValueError, match="num_classes"):
        per_class_accuracy([0, 5], [0, 1], num_classes=3)


# ----------------------------------------------------------------------------- dataset stats
def test_class_imbalance_ratio():
    assert class_imbalance_ratio(class_sizes=[109, 1, 50]) == pytest.approx(1 / 109)
    assert class_imbalance_ratio(np.array([0, 0, 0, 2, 5, 5])) == pytest.approx(1 / 3)
    with pytest.raises(ValueError):
        class_imbalance_ratio()
    with pytest.raises(ValueError):
        class_imbalance_ratio([0, 1], class_sizes=[1, 1])


@pytest.mark.parametrize(
    "sizes,q_mid,q_plain",
    [
        # n = 100; cumulative 50, 80 -> exactly p at k = 2: both quantiles give Q = 2
        ([50, 30, 10, 10], 2.0, 2.0),
        # n = 100; cumulative 40, 70, 85 -> k = 3, midpoint 2.5
        ([40, 30, 15, 10, 5], 2.5, 3.0),
        # order does not matter; n = 10, cumulative 5, 7, 8 (exactly 0.8 at k = 3)
        ([1, 2, 5, 1, 1], 3.0, 3.0),
        # balanced 10 classes of 7: cumulative share j/10 reaches 0.8 exactly at j = 8
        ([7] * 10, 8.0, 8.0),
        # balanced 3 classes: k = 3 = T -> plain is infinite, midpoint 2.5 / 0.5
        ([4, 4, 4], 2.5, 3.0),
        # one dominant class
        ([97, 1, 1, 1], 0.5, 1.0),
    ],
)
def test_long_tailedness_ratio_by_hand(sizes, q_mid, q_plain):
    t = len(sizes)
    r_mid = long_tailedness_ratio(class_sizes=sizes)
    r_plain = long_tailedness_ratio(class_sizes=sizes, quantile="plain")
    assert r_mid == pytest.approx(q_mid / (t - q_mid))
    assert r_plain == (math.inf if q_plain == t else pytest.approx(q_plain / (t - q_plain)))
    # the same from labels, in shuffled order
    y = np.random.default_rng(0).permutation(np.repeat(np.arange(t), sizes))
    assert long_tailedness_ratio(y) == pytest.approx(r_mid)
    assert long_tailedness_ratio(torch.from_numpy(y), quantile="plain") == r_plain


def test_long_tailedness_ratio_other_p():
    sizes = [40, 30, 15, 10, 5]  # cumulative 40 70 85 95 100
    assert long_tailedness_ratio(class_sizes=sizes, p=0.5) == pytest.approx(1.5 / 3.5)
    assert long_tailedness_ratio(class_sizes=sizes, p=0.4, quantile="plain") == pytest.approx(
        1 / 4
    )


@pytest.mark.parametrize(
    "name,table,q_mid,q_plain,num_classes",
    [("email", 0.79, 18.5, 19, 42), ("wiki", 1.00, 8.5, 9, 17),
     ("blogcatalog", 0.77, 16.5, 17, 38)],
)
def test_long_tailedness_ratio_table1(data_dir, name, table, q_mid, q_plain, num_classes):
    y = np.load(data_dir / f"{name}.npz")["y"]
    r = long_tailedness_ratio(y, 0.8)
    assert round(r, 2) == table  # paper Table 1, two decimals
    assert r == pytest.approx(q_mid / (num_classes - q_mid))
    r_plain = long_tailedness_ratio(y, 0.8, quantile="plain")
    assert r_plain == pytest.approx(q_plain / (num_classes - q_plain))
    assert round(r_plain, 2) != table  # the plain quantile does not reproduce the table


@pytest.mark.parametrize(
    "kwargs",
    [
        dict(class_sizes=[3, 0, 1]),
        dict(class_sizes=[3, -1]),
        dict(class_sizes=[2.5, 1]),
        dict(class_sizes=[]),
        dict(class_sizes=[[1, 2]]),
        dict(class_sizes=[3, 1], p=1.0),
        dict(class_sizes=[3, 1], p=0.0),
        dict(class_sizes=[3, 1], quantile="linear"),
        dict(y=[0.5, 1.0]),
        dict(),
    ],
)
def test_long_tailedness_ratio_bad(kwargs):
    with pytest.raises(ValueError):
        long_tailedness_ratio(**kwargs)


def test_loss_range():
    assert loss_range([0.2, 1.5, np.nan, 0.7]) == pytest.approx(1.3)
    assert loss_range(torch.tensor([0.3])) == 0.0
    # per-node losses with labels: class means 1.0 (class 0), 3.0 (class 2)
    assert loss_range([0.5, 1.5, 3.0, 3.0], y=[0, 0, 2, 2]) == pytest.approx(2.0)
    with pytest.raises(ValueError):
        loss_range([np.nan])
    with pytest.raises(ValueError):
        loss_range([1.0, 2.0], y=[0])
    with pytest.raises(ValueError):
        loss_range([[1.0]])


# ------------------------------------------------------------- fuzz finds (s21 model_fuzz)
def test_sparse_labels_use_memory_of_the_present_classes():
    """A label of 10**10 asked for 74.5 GiB (MemoryError; sklearn answers), 2**62 gave numpy's
    'array is too big': the present labels are relabelled first, with the same results."""
    t = np.array([0, 10**10, 10**10, 7, 2**62])
    p = np.array([0, 10**10, 0, 2**62, 2**62])
    dense_t, dense_p = np.unique(np.concatenate([t, p]), return_inverse=True)[1].reshape(2, -1)
    assert evaluate(t, p) == evaluate(dense_t, dense_p)
    for fn in (accuracy, balanced_accuracy, macro_f1, g_means):
        assert fn(t, p) == fn(dense_t, dense_p)
    assert balanced_accuracy([0, 10**10], [0, 0]) == skm.balanced_accuracy_score(
        [0, 10**10], [0, 0])
    assert class_imbalance_ratio([0, 10**12, 10**12]) == 0.5
    assert loss_range([1.0, 3.0, 5.0], y=[0, 10**12, 10**12]) == pytest.approx(3.0)


@pytest.mark.parametrize("call, exc, msg", [
    (lambda: evaluate(np.array([0, 2**63 + 5], np.uint64), np.array([0, 0], np.uint64)),
     ValueError, "y_true has class id 9223372036854775813 beyond int64's range"),
    (lambda: evaluate(torch.tensor([0, 1]), torch.tensor([0, 1], dtype=torch.bfloat16)),
     ValueError, "y_pred must hold integer class ids, got dtype torch.bfloat16"),
    (lambda: per_class_accuracy([0], [0], num_classes=1.5), TypeError,
     "num_classes must be an int, got float"),
    (lambda: per_class_accuracy([0], [0], num_classes=True), TypeError,
     "num_classes must be an int, got bool"),
    (lambda: per_class_accuracy([0], [0], num_classes="3"), TypeError,
     "num_classes must be an int, got str"),
    (lambda: per_class_accuracy([0], [0], num_classes=0), ValueError, "num_classes must be >= 1"),
])
def test_metrics_name_the_bad_argument(call, exc, msg):
    with pytest.raises(exc) as info:
        call()
    assert type(info.value) is exc and msg in str(info.value), str(info.value)
    assert per_class_accuracy([0, 1], [0, 0], num_classes=np.int64(3)).shape == (3,)
    # a bf16 tensor of losses is a number array (float32 holds it exactly)
    assert loss_range(torch.tensor([0.5, 2.0], dtype=torch.bfloat16)) == 1.5


def test_loss_range_refuses_non_finite_and_complex_losses():
    """[inf, inf] gave NaN, per-node [inf, -inf, 2] silently dropped class 0, a complex array
    lost its imaginary part."""
    inf = float("inf")
    for args in (([inf, inf],), ([1.0, -inf],), ([inf, -inf, 2.0], [0, 0, 1]),
                 ([1.0, inf], [0, 1])):
        with pytest.raises(ValueError, match="losses contain inf"):
            loss_range(*args)
    with pytest.raises(TypeError, match="losses must be real, got dtype complex128"):
        loss_range(np.array([1 + 1j, 2]))
    with pytest.raises(ValueError, match="overflows float64"):
        loss_range([1e308, -1e308])
    assert loss_range([0.2, np.nan, 0.7]) == pytest.approx(0.5)       # NaN: a class without nodes


def test_long_tailedness_ratio_refuses_sizes_that_wrap_int64():
    # [2**62, 2**62] summed to -2**63 and gave 1/3 instead of 3; uint64 2**63 and float 1e20
    # wrapped too; complex sizes lost their imaginary part
    for bad in ([2**62, 2**62], np.array([2**63, 1], dtype=np.uint64), [1e20, 1.0]):
        with pytest.raises(ValueError, match="too large"):
            long_tailedness_ratio(class_sizes=bad)
    with pytest.raises(ValueError, match="numeric"):
        long_tailedness_ratio(class_sizes=np.array([5 + 0j, 3]))
    assert long_tailedness_ratio(class_sizes=[2**40, 2**40]) == 3.0


def test_long_tailedness_ratio_compares_shares_exactly():
    # a 1e-9 relative tolerance: np.float32(0.8) (= 0.800000012) moved k past a class holding
    # exactly 80 %, and a head 999 instances short of 80 % of 1e12 counted as reaching it
    sizes = [8, 1, 1]
    for p in (0.8, np.float32(0.8), np.float64(0.8)):
        assert long_tailedness_ratio(class_sizes=sizes, p=p) == 0.5
        assert long_tailedness_ratio(class_sizes=sizes, p=p, quantile="plain") == 0.5
    n = 10**12
    head = 8 * n // 10 - 999
    assert long_tailedness_ratio(class_sizes=[head, n - head], quantile="plain") == math.inf
    assert long_tailedness_ratio(class_sizes=[head + 999, n - head - 999],
                                 quantile="plain") == 1.0
