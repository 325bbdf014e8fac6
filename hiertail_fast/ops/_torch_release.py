"""torch's release as (major, minor), for the adapters' version checks (``_attention_lse``,
``_onednn_gemm``): "2.13.0+cpu" -> (2, 13)."""
from __future__ import annotations

import torch


def torch_release() -> tuple[int, int]:
    parts = torch.__version__.split("+")[0].split(".")
    return int(parts[0]), int(parts[1])
