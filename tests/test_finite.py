"""``ops/_finite.finite``: torch.isfinite in two kernels (|x| < inf) instead of four."""
from __future__ import annotations

import pytest
import torch

from hiertail_fast.ops._finite import finite


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16, torch.float32, torch.float64])
def test_finite_equals_isfinite_on_every_special_value(dtype):
    info = torch.finfo(dtype)
    x = torch.tensor([0.0, -0.0, 1.0, -2.5, info.max, -info.max, info.tiny, info.tiny / 4,
                      float("inf"), float("-inf"), float("nan"), -float("nan")], dtype=dtype)
    x = torch.cat([x, torch.randn(64, dtype=torch.float64).mul(1e3).to(dtype)])
    got = finite(x.view(4, -1))
    assert got.dtype == torch.bool and torch.equal(got, torch.isfinite(x.view(4, -1)))
    assert got.view(-1)[:8].all() and not got.view(-1)[8:12].any()


def test_finite_launches_two_kernels_where_isfinite_launches_four():
    from torch.utils._python_dispatch import TorchDispatchMode

    class Count(TorchDispatchMode):
        def __init__(self):
            super().__init__()
            self.names = []

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            self.names.append(func.overloadpacket.__name__)
            return func(*args, **(kwargs or {}))

    x = torch.randn(10)
    for fn, want in ((finite, 2), (torch.isfinite, 4)):
        with Count() as c:
            fn(x)
        assert len(c.names) == want, c.names
