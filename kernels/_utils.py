"""Block-size choices shared by every launcher."""
from __future__ import annotations

import triton


def feature_block(d: int, max_block: int = 256) -> int:
    """Smallest power of two >= d (>= 16 so tl.dot accepts it), capped at max_block."""
    return min(max(16, triton.next_power_of_2(int(d))), max_block)


def pair_blocks(n: int, d_pad: int, on_gpu: bool) -> tuple[int, int, int]:
    """(BLOCK_M, BLOCK_N, num_warps) for kernels that stream tiles of Z·Zᵀ (contrastive LSE).

    GPU: FlashAttention-like tiles, smaller when the [BLOCK_M, d_pad] fp32 accumulator of the
    backward grows (heuristic, not autotuned: autotune configs break under the interpreter).
    Interpreter (CPU tests): one tile as large as the problem allows up to 64, since every
    program costs Python overhead there.
    """
    if not on_gpu:
        block = min(64, max(16, triton.next_power_of_2(int(n))))
        return block, block, 4
    if d_pad <= 64:
        return 128, 64, 4
    if d_pad <= 128:
        return 64, 64, 4
    return 64, 32, 8
