"""Helpers of tests/test_fuzz.py: the hypothesis settings, backend lists and the comparison rule.

Comparison rule (``assert_close64``): every backend's result, computed from inputs of dtype
``dtype``, is compared with the float64 reference evaluated on the SAME (already rounded)
inputs, elementwise  |got − ref64| <= atol + rtol·|ref64| + extra  with (rtol, atol) from
``tests.conftest.tol(dtype)``, plus
* twice the error of the low-precision reference itself (``2·|ref_lowp − ref64|``, the rule
  of tests/conftest and STYLE.md) where the caller passes one: for float16/bfloat16 inputs,
  and for the official loss variant in float32, whose gradient is discontinuous where two
  logits of a row tie for its max within fp32 rounding (the row max's gradient goes to
  whichever rounds higher: the float32 dense reference and every engine agree, float64 picks
  the other; a long campaign at 40 rows, ``HIERTAIL_FUZZ_ROWS=40``, found one 0.47 off);
* ``extra``: a condition-scaled term for ill-conditioned cases, computed by the caller from a
  first-order error bound (documented next to each use: huge logits of the contrastive loss in
  float32, GCN degrees that nearly cancel with signed weights).
"""
from __future__ import annotations

import os

import torch
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st

from hiertail_fast._validation import env_int
from hiertail_fast.ops.gcn_propagate import torch_sparse_available
from tests.conftest import on_backend_device, tol, triton_importable  # noqa: F401

LOW = (torch.float16, torch.bfloat16)
DTYPES = (torch.float32, torch.float64, torch.float16, torch.bfloat16)
BACKENDS = ["reference", "torch"] + (["triton"] if triton_importable() else [])
GCN_BACKENDS = BACKENDS + (["torch_sparse"] if torch_sparse_available() else [])
LOSS_BACKENDS = BACKENDS + ["attention"]      # the loss's own engine (PyTorch's attention)

# examples per (test, backend): the Triton interpreter costs ~0.1-0.5 s a call on CPU
EXAMPLES = {"reference": 40, "torch": 60, "triton": 15, "torch_sparse": 30, "attention": 40}

# Long random campaigns (not CI's fixed run), e.g.
#   HIERTAIL_FUZZ_EXAMPLES=3000 HIERTAIL_FUZZ_RANDOM=1 python -m pytest tests/test_fuzz.py
# HIERTAIL_FUZZ_EXAMPLES: examples per (test, backend), a tenth of it (at least 5) on the
# Triton interpreter; HIERTAIL_FUZZ_RANDOM=1: new examples every run (a failure prints its
# example and a @reproduce_failure blob); HIERTAIL_FUZZ_ROWS: every op's largest row count
# (node / embedding rows; defaults 7-10 by op; graphs get twice as many edges; with
# HIERTAIL_CPU_BLOCK_BYTES=128 the losses' CPU engines cut 40 rows into 8-row blocks)
EXAMPLES_ENV, RANDOM_ENV, ROWS_ENV = ("HIERTAIL_FUZZ_EXAMPLES", "HIERTAIL_FUZZ_RANDOM",
                                      "HIERTAIL_FUZZ_ROWS")


def fuzz_rows(default: int) -> int:
    """An op's largest row count in its cases: $HIERTAIL_FUZZ_ROWS, else ``default``."""
    return env_int(ROWS_ENV, default, 1)


def fuzz_settings(backend: str) -> settings:
    """Fixed example budget, deterministic (derandomize: the same examples every run, so a
    failure reproduces by rerunning the test), no deadline (the interpreter is slow), no
    example database; a failure prints the falsifying example and a @reproduce_failure blob.
    $HIERTAIL_FUZZ_EXAMPLES / $HIERTAIL_FUZZ_RANDOM turn it into a long random campaign."""
    examples = EXAMPLES[backend]
    wanted = env_int(EXAMPLES_ENV, 0, 1)
    if wanted:
        examples = max(5, wanted // 10) if backend == "triton" else wanted
    randomly = os.environ.get(RANDOM_ENV, "0").strip() == "1"
    return settings(max_examples=examples, deadline=None, derandomize=not randomly,
                    database=None, print_blob=True,
                    suppress_health_check=list(HealthCheck))


seeds = st.integers(0, 2**31 - 1)
dtypes = st.sampled_from(DTYPES)


def unit_roundoff(dtype: torch.dtype) -> float:
    """u of the dtype the fast paths ACCUMULATE in (float32 for 16-bit inputs)."""
    return 2.0**-53 if dtype == torch.float64 else 2.0**-24


def assert_close64(got, ref64, dtype, *, ref_lowp=None, extra=0.0, scale=1.0, what=""):
    """The comparison rule of the module docstring; ``scale`` multiplies atol (for results
    whose natural size is not 1, e.g. the gradient of a tiny-normed projection)."""
    t = tol(dtype)
    got64, ref64 = got.detach().double(), ref64.detach().double()
    assert got64.shape == ref64.shape, (what, got64.shape, ref64.shape)
    bound = t["atol"] * scale + t["rtol"] * ref64.abs() + extra
    if ref_lowp is not None:
        # a low-precision reference that overflowed (NaN/inf) sets no bound for that entry
        lowp_err = (ref_lowp.detach().double() - ref64).abs()
        bound = bound + 2 * torch.nan_to_num(lowp_err, nan=float("inf"))
    err = (got64 - ref64).abs()
    ok = (err <= bound) | (got64 == ref64)  # equal infinities are fine
    if not bool(ok.all()):
        i = int(torch.nonzero(~ok.reshape(-1))[0])
        raise AssertionError(
            f"{what}: max error {float(err.max()):.3g}; first bad entry {i}: got "
            f"{float(got64.reshape(-1)[i])!r}, float64 reference {float(ref64.reshape(-1)[i])!r}"
            f", bound {float(bound.reshape(-1)[i]):.3g}")
