"""hiertail_fast.metrics: corners the s43 mutation audit found unpinned (each test failed on
one of its mutants). Expected values are computed by hand, not by the package.
"""
from __future__ import annotations

import warnings

import numpy as np
import pytest

from hiertail_fast.metrics import loss_range, per_class_accuracy


def test_per_class_accuracy_of_absent_classes_is_nan_without_a_warning():
    """Classes with no true sample are NaN by contract, computed without dividing 0 by 0: a
    user evaluating every epoch (or running with warnings as errors) would otherwise get a
    RuntimeWarning, or a crash, for every class missing from a split."""
    t, p = np.array([0, 0, 2, 2, 2]), np.array([0, 1, 2, 0, 2])
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        got = per_class_accuracy(t, p, num_classes=5)
    np.testing.assert_array_equal(np.isnan(got), [False, True, False, True, True])
    np.testing.assert_allclose(got[[0, 2]], [1 / 2, 2 / 3])


def test_per_class_accuracy_refuses_a_label_equal_to_num_classes():
    """num_classes=K means labels 0..K-1: a label K must be refused, not silently give a
    K+1-entry array that no longer lines up with the user's K classes."""
    with pytest.raises(ValueError, match="labels go up to 3 but num_classes is 3"):
        per_class_accuracy([0, 3], [0, 1], num_classes=3)
    with pytest.raises(ValueError, match="num_classes is 3"):
        per_class_accuracy([0, 1], [0, 3], num_classes=3)     # a predicted label counts too
    assert per_class_accuracy([0, 2], [0, 1], num_classes=3).shape == (3,)


def test_loss_range_refuses_nan_per_node_losses():
    """Per-node losses with a NaN (a diverged node) must be refused: the NaN made its class
    mean NaN, which the per-class path then drops as 'a class without nodes', so the range was
    silently computed over the other classes (here 0.0 instead of an error)."""
    with pytest.raises(ValueError, match="per-node losses contain NaN"):
        loss_range([1.0, float("nan"), 3.0, 1.0], y=[0, 1, 1, 2])
    assert loss_range([1.0, 2.0, 4.0, 1.0], y=[0, 1, 1, 2]) == 2.0     # class 1 mean 3.0


def test_meta_and_sparse_tensors_are_named_and_torch_is_not_imported():
    # an API audit (session 68): a meta tensor failed in .cpu() with NotImplementedError, a
    # sparse one was refused for its dtype; and the module keeps its promise not to import
    # torch (the label check it shares with the splits is imported when first used)
    import subprocess
    import sys

    import torch

    from hiertail_fast import metrics

    y = torch.tensor([0, 1, 1, 0])
    for call in (lambda a: metrics.evaluate(a, y), lambda a: metrics.macro_f1(y, a),
                 lambda a: metrics.long_tailedness_ratio(a)):
        with pytest.raises(ValueError, match="is on the meta device: it has no values"):
            call(y.to("meta"))
        with pytest.raises(TypeError, match=r"must be a dense tensor, got layout "
                           r"torch.sparse_coo: pass .*\.to_dense\(\)"):
            call(y.to_sparse())
    # nor any metric on plain lists (per_class_accuracy checked its class count with the
    # torch-importing _validation check: a review, session 68), whose words it keeps
    code = ("import sys, hiertail_fast.metrics as m; m.per_class_accuracy([0, 1, 1], [0, 1, 0]); "
            "m.evaluate([0, 1, 1], [0, 1, 0]); print('torch' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert out.stdout.strip() == "False", out.stderr


def test_the_metrics_class_bound_says_what_the_validators_say():
    # metrics keeps its own copy of the label-bound check (torch-free); the two must not drift
    from hiertail_fast._validation import check_labels_below

    with pytest.raises(ValueError) as ours:
        per_class_accuracy([0, 3], [0, 1], num_classes=3)
    with pytest.raises(ValueError) as theirs:
        check_labels_below(3, 3)
    assert str(ours.value) == str(theirs.value)


def test_the_midpoint_quantile_tests_its_hit_exactly():
    # at 10^10 instances one more than 80 % is not an exact hit: Q = 0.5, Ratio_LT = 1/3; a
    # float tolerance (1e-9 n = 10 instances) called it one (Q = 1, 1.0). 8d06cc7 tested the
    # big counts with quantile="plain" only (a fix-test check, session 68)
    import math

    from hiertail_fast.metrics import long_tailedness_ratio

    n = 10**10
    head = 8 * n // 10 + 1
    assert math.isclose(long_tailedness_ratio(class_sizes=[head, n - head]), 1 / 3)
    assert long_tailedness_ratio(class_sizes=[8 * n // 10, n - 8 * n // 10]) == 1.0


def test_per_class_accuracy_spans_the_predicted_labels_as_float64():
    """Without num_classes K is the largest label of y_true OR y_pred plus one, entries are
    float64 (a class only predicted is a NaN entry, not a refusal or a shorter array)."""
    got = per_class_accuracy([0, 1, 1], [0, 3, 1])
    assert got.dtype == np.float64 and got.shape == (4,)
    np.testing.assert_array_equal(np.isnan(got), [False, False, True, True])
    assert got[0] == 1.0 and got[1] == 0.5
    assert per_class_accuracy([0, 0, 0], [0, 1, 0])[0] == 2 / 3     # exact in float64


def test_uint64_labels_up_to_int64_max_are_accepted():
    """A uint64 class id is refused only beyond int64's range: 2**63 - 1 itself is a valid
    (far-apart) class id, scored as its dense relabelling."""
    from hiertail_fast.metrics import evaluate

    big = 2**63 - 1
    t = np.array([0, big, big, 5], dtype=np.uint64)
    p = np.array([0, big, 5, 5], dtype=np.uint64)
    assert evaluate(t, p) == evaluate([0, 2, 2, 1], [0, 2, 1, 1])


def test_class_sizes_bounds_are_named():
    """class_sizes that are not finite are refused as such (not as 'too large' or 'not
    whole'), and the int64 guard refuses a sum of exactly 2**62, as it says."""
    from hiertail_fast.metrics import class_imbalance_ratio, long_tailedness_ratio

    for bad in ([np.inf, 1.0], [np.nan, 1.0], [1.0, -np.inf]):
        for fn in (long_tailedness_ratio, class_imbalance_ratio):
            with pytest.raises(ValueError, match="class_sizes must be finite and > 0"):
                fn(class_sizes=bad)
    with pytest.raises(ValueError, match="sum to 2\\*\\*62 or more"):
        long_tailedness_ratio(class_sizes=[2**61, 2**61])
    assert long_tailedness_ratio(class_sizes=[2**61, 2**61 - 2**10]) == 3.0


def test_loss_range_names_an_empty_input():
    """An empty loss vector is refused as such, with or without labels."""
    with pytest.raises(ValueError, match="losses must be a non-empty 1-D array"):
        loss_range([])
    with pytest.raises(ValueError, match="losses must be a non-empty 1-D array"):
        loss_range(np.zeros(0), y=np.zeros(0, dtype=np.int64))


def test_dataset_statistics_refuse_empty_labels():
    """No labels, no classes: both ratios refuse an empty y by name (not inf, not numpy's
    zero-size error)."""
    from hiertail_fast.metrics import class_imbalance_ratio, long_tailedness_ratio

    for call in (lambda: class_imbalance_ratio(np.zeros(0, dtype=np.int64)),
                 lambda: long_tailedness_ratio([]),
                 lambda: long_tailedness_ratio(np.zeros(0, dtype=np.int64), quantile="plain")):
        with pytest.raises(ValueError, match="y is empty"):
            call()
