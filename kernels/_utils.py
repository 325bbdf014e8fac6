"""Block-size choices shared by every launcher."""
from __future__ import annotations

import triton


def feature_block(d: int, max_block: int = 256) -> int:
    """Smallest power of two >= d (>= 16 so tl.dot accepts it), capped at max_block."""
    return min(max(16, triton.next_power_of_2(int(d))), max_block)
