"""The row-block engine's three GEMMs per block, on torch.mm or in oneDNN pieces.

``_lse_torch._engine`` visits row blocks of b rows against all N_c common keys and runs, per
block, the logits e = Z_b Z_c^T [b, N_c], the rows' product t Z_c [b, d] and the keys'
product t^T Z_b [N_c, d] (t: the block's gradient entries). Those are the CPU engine's
multi-level calls (``hierarchical_contrastive_loss``), keys hidden from a level, and small
problems; one level with every key visible runs the symmetric engine (``_lse_symmetric``),
whose GEMMs moved to oneDNN first.

Where ``_onednn_gemm.provider()`` says oneDNN (x86-64 CPUs not made by Intel, whose MKL runs
slow code), a full block's GEMMs run there, cut into column pieces as the symmetric engine
cuts its tiles:

* oneDNN keeps a compiled kernel for every GEMM shape it sees (~0.5 MB each, not given back),
  so a shape must not follow N: pieces are 256 x 2^k keys wide (``_lse_symmetric``'s binary
  cut), the last < 256 keys and the last, shorter row block go to torch.mm, and oneDNN's
  blocks have a multiple of 16 rows (``rows``). The shapes seen are then bounded whatever
  the calls' sizes;
* oneDNN writes no ``out=``: each piece of logits comes back fresh (<= 4 MiB, inside
  ``_roomy_heap``'s padded heap) and is copied into the block's buffer, which the C step
  needs whole (the row max over all keys);
* oneDNN reads only dense operands fast (a strided column slice as W ran over 1,000x slower
  in a one-off check), so each piece of t is copied once into a contiguous scratch that serves both
  products: rows as X W^T with W = Z_c[piece]^T (a transposed view), keys transposed,
  Z_b^T t_piece, added into a [d, N_c] accumulator row by row (``_onednn_gemm.add_mm_t_``'s
  form) and into the keys' [N_c, d] once at the end.

On the project's 2-core AMD EPYC (AVX-512, torch 2.13.0+cpu) a 30k-row three-level loss,
d 128, took 0.70x (official) and 0.64x (exact) the time of torch.mm's GEMMs, unchanged at
1,000-2,400 rows (``bench/version_ab.py --levels 3``, ``bench/engine_ab.py --switch gemm
--levels 3``; docs/LOSS.md).
"""
from __future__ import annotations

import torch

from hiertail_fast.ops import _onednn_gemm

# a oneDNN piece is at most this many bytes of float32 logits, as the symmetric engine's tile
# (``_lse_symmetric.ONEDNN_TILE_BYTES``, which is this value; why 4 MiB: there)
PIECE_BYTES = 4 << 20
PIECE_UNIT = 256        # piece widths are PIECE_UNIT * 2^k keys
ROW_UNIT = 16           # oneDNN's blocks have a multiple of ROW_UNIT rows


def rows(b: int, use: str, n_cols: int) -> int:
    """The row-block engine's rows per block `b` over `n_cols` common keys for the provider
    `use`: rounded down to a multiple of ROW_UNIT (a bounded set of shapes) where oneDNN gets
    pieces (at least PIECE_UNIT keys), unless below it. (b is MAX_BLOCK_ROWS, a multiple,
    unless the problem is one short block, which has no piece, or the block buffer's budget
    holds fewer rows: past ~49k keys.)"""
    if use != "onednn" or n_cols < PIECE_UNIT or b < ROW_UNIT:
        return b
    return b - b % ROW_UNIT


def widest(budget: int, b: int, unit: int) -> int:
    """The widest oneDNN piece for blocks of `b` rows: unit * 2^k keys, at most `budget` bytes
    of float32 (one unit if none fits). Shared with the symmetric engine's tiles."""
    units = max(1, budget // (4 * b * unit))
    return unit << (units.bit_length() - 1)


def cut(rest: int, width: int, unit: int) -> int:
    """The next piece's width when rest >= unit keys are left: `width`, or the largest
    unit * 2^k that fits (a binary cut of the rest: a few shapes at any N). Shared with the
    symmetric engine's tiles."""
    return width if rest >= width else unit << ((rest // unit).bit_length() - 1)


def pieces(n_cols: int, b: int, use: str) -> list[tuple[int, int, bool]]:
    """(c0, c1, on oneDNN) covering [0, n_cols) for a full block of `b` rows: one piece on
    torch.mm for torch's BLAS; for oneDNN a binary cut into widths PIECE_UNIT * 2^k of at most
    PIECE_BYTES, and the last < PIECE_UNIT keys on torch.mm."""
    if use != "onednn":
        return [(0, n_cols, False)]
    width = widest(PIECE_BYTES, b, PIECE_UNIT)
    out, c0 = [], 0
    while n_cols - c0 >= PIECE_UNIT:
        w = cut(n_cols - c0, width, PIECE_UNIT)
        out.append((c0, c0 + w, True))
        c0 += w
    if c0 < n_cols:
        out.append((c0, n_cols, False))
    return out


def addmm_scaled_(acc: torch.Tensor, m1: torch.Tensor, m2: torch.Tensor, alpha) -> None:
    """acc += alpha * m1 @ m2, alpha a float (addmm's own alpha) or ``block_norm``'s device
    scalar, which addmm cannot take: it scales m2 (the block's [b, d] operand, the small one)
    instead. Where that applies (CUDA), a denormal operand costs no time (a CPU matter)."""
    if isinstance(alpha, torch.Tensor):
        acc.addmm_(m1, m2 * alpha)
    else:
        acc.addmm_(m1, m2, alpha=alpha)


class BlockGemms:
    """The GEMMs of one ``_engine`` call against the common keys ``zc`` [N_c, d], blocks of
    ``b`` rows, provider ``use`` (``_onednn_gemm.provider()``, read once per call).
    ``grad``: the call has a gradient (the keys' accumulator is made)."""

    def __init__(self, zc: torch.Tensor, b: int, use: str, grad: bool):
        n_c, d = zc.shape
        self.b = b
        self.use = use if zc.device.type == "cpu" and zc.dtype == torch.float32 else "blas"
        self.pieces = pieces(n_c, b, self.use)
        # whether full blocks run in pieces on oneDNN (not where every piece is torch.mm's)
        self.dnn = any(on for _, _, on in self.pieces)
        width = max((c1 - c0 for c0, c1, on in self.pieces if on), default=0)
        self.scratch = torch.empty(b * width, dtype=zc.dtype) if self.dnn and grad else None
        # the keys' products of oneDNN's pieces, transposed [d, N_c] (added row by row)
        self.key_t = torch.zeros(d, n_c, dtype=zc.dtype) if self.dnn and grad else None

    def logits(self, e: torch.Tensor, zb: torch.Tensor, zc: torch.Tensor) -> None:
        """e [rows, N_c] <- zb @ zc^T (the dot products; the C step scales them)."""
        if not self.dnn or zb.shape[0] != self.b:
            torch.mm(zb, zc.t(), out=e)
            return
        for c0, c1, on in self.pieces:
            if on:
                e[:, c0:c1].copy_(_onednn_gemm.mm_nt(zb, zc[c0:c1], use="onednn"))
            else:
                e[:, c0:c1].copy_(torch.mm(zb, zc[c0:c1].t()))

    def products(self, t: torch.Tensor, right: torch.Tensor, key_c: torch.Tensor,
                 left: torch.Tensor, alpha) -> torch.Tensor:
        """t [rows, N_c] -> t @ right [rows, d], and key_c [N_c, d] += alpha * t^T @ left
        (alpha: ``addmm_scaled_``'s; a float wherever oneDNN serves, which is CPU only)."""
        if self.key_t is None or t.shape[0] != self.b:
            out = torch.mm(t, right)
            addmm_scaled_(key_c, t.t(), left, alpha)
            return out
        left_t = left.t().contiguous()          # [d, b], small
        acc = None
        for c0, c1, on in self.pieces:
            if on:
                p = self.scratch[: t.shape[0] * (c1 - c0)].view(t.shape[0], c1 - c0)
                p.copy_(t[:, c0:c1])
                part = _onednn_gemm.mm_nt(p, right[c0:c1].t(), use="onednn")
                self.key_t[:, c0:c1].add_(_onednn_gemm.mm_nt(left_t, p.t(), use="onednn"),
                                          alpha=alpha)
            else:
                part = torch.mm(t[:, c0:c1], right[c0:c1])
                key_c[c0:c1].addmm_(t[:, c0:c1].t(), left, alpha=alpha)
            acc = part if acc is None else acc.add_(part)
        return acc

    def finish_keys(self, key_c: torch.Tensor) -> None:
        """key_c += the oneDNN pieces' transposed accumulator (once, after the blocks)."""
        if self.key_t is not None:
            key_c.add_(self.key_t.t())
            self.key_t = None
