"""Bit-for-bit guard for refactors of the loss: record the value and gradient of a grid of loss
calls, then compare two records exactly. A check, not a timing.

    python bench/loss_golden.py record before.pt          # on the code before the change
    python bench/loss_golden.py record after.pt           # after it
    python bench/loss_golden.py compare before.pt after.pt    # exit 1 if any call differs

The grid: three problems (1 level with a class of three and singletons, 3 and 2 levels), each
through every engine (``torch``, ``attention``, ``attention[kernels]`` (its guard's rows rules off),
``triton`` under the Triton interpreter, ``reference``), both variants, fp32 / bf16 / fp64 rows, the
three reductions, include_self both ways, with and without prototypes, in the CPU code paths and in
the CUDA code paths run on CPU tensors (``_host_reads.cuda_code_paths``, with PyTorch's CUDA
attention kernels emulated by a dense softmax: the memory-efficient kernel's contract, padded LSE
included, and flash attention on the folded bf16 operands). A call that raises is recorded by its
error, which must match too. The hierarchical loss takes the mean reduction only. Values and
gradients compare exactly (NaN where NaN, signs of zero aside, as ``torch.equal``); dtypes and
shapes too.
"""
from __future__ import annotations

import argparse
import contextlib
import itertools
import math
import os
import sys
from pathlib import Path

if __name__ == "__main__":    # the Triton engine on CPU tensors: before anything imports triton
    os.environ.setdefault("TRITON_INTERPRET", "1")    # (not on import: dispatch_count's fakes)

import torch  # noqa: E402

from hiertail_fast._files import atomic_path, unwritable_file_reason  # noqa: E402

SHAPES = ((40, 8, 1), (61, 12, 3), (33, 5, 2))       # (rows, width, levels)
# "attention[kernels]": the attention engine with its guard's rows rules off (MAX_LOGIT stays),
# so the grid's small problems keep reaching its fp32 kernels (since 2026-12-05 the exact
# variant's rule sends them, as the official one's, to the torch engine under "attention")
BACKENDS = ("torch", "attention", "attention[kernels]", "triton", "reference")
DTYPES = (torch.float32, torch.bfloat16, torch.float64)


def _fake_flash(q, k, v, dropout_p, is_causal, return_debug_mask, *, scale):
    s = scale * q.float() @ k.float().transpose(-1, -2)
    return torch.softmax(s, -1).to(q.dtype) @ v, torch.logsumexp(s, -1)


def _fake_efficient(q, k, v, bias, compute_lse, dropout_p, is_causal, *, scale):
    s = scale * q @ k.transpose(-1, -2) + bias
    lse = torch.logsumexp(s, dim=-1)
    n = q.shape[2]
    padded = torch.full((*lse.shape[:2], -(-n // 32) * 32), float("nan"),   # padded to 32
                        device=lse.device)
    padded[..., :n] = lse
    return torch.softmax(s, dim=-1) @ v, padded, None, None


@contextlib.contextmanager
def emulated_attention(wrap=lambda kernel: kernel):
    """While inside: the attention engine takes its CUDA branches on CPU tensors (fp32: the
    memory-efficient kernel's contract; bf16: flash attention on the folded operands), each
    kernel a dense softmax (`wrap` applied to the stand-ins)."""
    import hiertail_fast.ops._attention_lse as attn

    kind, op = attn._kernel_kind, attn._op
    fakes = {attn._FLASH_OP: wrap(_fake_flash), attn._CUDA_OP: wrap(_fake_efficient)}
    attn._kernel_kind = lambda device: "cuda"
    attn._op = lambda name, args: fakes.get(name) or op(name, args)
    try:
        yield
    finally:
        attn._kernel_kind, attn._op = kind, op


@contextlib.contextmanager
def rows_rules_off():
    """While inside: the attention guard's rows rules off (both variants; MAX_LOGIT stays)."""
    import hiertail_fast.ops._attention_lse as attn

    real = attn.OFFICIAL_LOGIT_PER_ROW, attn.EXACT_LOGIT_PER_ROW
    attn.OFFICIAL_LOGIT_PER_ROW = attn.EXACT_LOGIT_PER_ROW = float("inf")
    try:
        yield
    finally:
        attn.OFFICIAL_LOGIT_PER_ROW, attn.EXACT_LOGIT_PER_ROW = real


@contextlib.contextmanager
def cuda_forms():
    """CPU tensors through the CUDA code paths, the CUDA attention kernels emulated."""
    from hiertail_fast.ops._host_reads import cuda_code_paths

    with emulated_attention(), cuda_code_paths():
        yield


def _problems():
    gen = torch.Generator().manual_seed(0)
    for n, d, levels in SHAPES:
        z = torch.randn(n, d, generator=gen) * 1.5
        y = torch.randint(0, 6, (n,), generator=gen)
        y[:3] = 7                                  # a class of three
        y[5] = 11                                  # and a singleton
        ys = [y] + [y // (2 ** k) for k in range(1, levels)]
        ps = [torch.randn(int(t.max()) + 1, d, generator=gen) for t in ys]
        yield (n, d, levels), z, ys, ps


def _one_call(z0, ys, ps, backend, variant, dtype, reduction, include_self, protos):
    from hiertail_fast import balanced_contrastive_loss, hierarchical_contrastive_loss

    z = z0.to(dtype).detach().clone().requires_grad_()
    p = [q.to(dtype) for q in ps] if protos else [None] * len(ys)
    try:
        if len(ys) == 1:
            loss = balanced_contrastive_loss(z, ys[0], prototypes=p[0], temperature=0.3,
                                             variant=variant, backend=backend,
                                             reduction=reduction, include_self=include_self)
        else:
            loss = hierarchical_contrastive_loss(z, ys, p, temperature=0.3, variant=variant,
                                                 backend=backend, include_self=include_self)
        weights = torch.linspace(0.5, 1.5, loss.numel()).view(loss.shape).to(loss.dtype)
        (loss * weights).sum().backward()
        return loss.detach(), z.grad
    except Exception as err:  # noqa: BLE001  (recorded: the same calls must fail alike)
        return (f"{type(err).__name__}: {str(err)[:200]}",)


def record(shapes=SHAPES) -> dict:
    """{call key: (value, gradient) or (error text,)} over the grid."""
    out = {}
    torch.set_num_threads(1)
    for (n, d, levels), z0, ys, ps in _problems():
        if (n, d, levels) not in shapes:
            continue
        for form, backend, variant, dtype, reduction, include_self, protos in itertools.product(
                ("cpu", "cuda"), BACKENDS, ("exact", "official"), DTYPES,
                ("mean", "sum", "none"), (False, True), (False, True)):
            if (backend == "triton" and dtype == torch.float64) or (
                    backend == "reference" and form == "cuda") or (
                    levels > 1 and reduction != "mean"):
                continue
            key = (n, d, levels, form, backend, variant, str(dtype), reduction, include_self,
                   protos)
            kernels = backend == "attention[kernels]"
            with (cuda_forms() if form == "cuda" else contextlib.nullcontext(),
                  rows_rules_off() if kernels else contextlib.nullcontext()):
                out[key] = _one_call(z0, ys, ps, "attention" if kernels else backend, variant,
                                     dtype, reduction, include_self, protos)
    return out


def differences(a: dict, b: dict) -> list[str]:
    """The calls whose records differ (or that only one record has)."""
    diff = [f"only in one record: {k}" for k in set(a) ^ set(b)]
    for k in sorted(set(a) & set(b), key=str):
        x, y = a[k], b[k]
        if len(x) != len(y):
            said = [t[0] if len(t) == 1 else "ran" for t in (x, y)]
            diff.append(f"{k}: {said[0]} vs {said[1]}")
            continue
        for u, v in zip(x, y, strict=True):
            if isinstance(u, str):
                same = u == v
            else:
                same = (u.dtype == v.dtype and u.shape == v.shape
                        and torch.equal(u.isnan(), v.isnan())
                        # (NaN set to 0 after its own check; inf kept: nan_to_num's default
                        # would make it the dtype's largest finite value, equal to that)
                        and torch.equal(u.nan_to_num(0.0, math.inf, -math.inf),
                                        v.nan_to_num(0.0, math.inf, -math.inf)))
            if not same:
                diff.append(f"{k}")
                break
    return diff


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=" ".join(__doc__.split("\n\n")[0].split()))
    sub = parser.add_subparsers(dest="what", required=True)
    rec = sub.add_parser("record", help="run the grid and save its record")
    rec.add_argument("out")
    cmp_ = sub.add_parser("compare", help="compare two records exactly")
    cmp_.add_argument("a")
    cmp_.add_argument("b")
    args = parser.parse_args(argv)
    if args.what == "record":
        problem = unwritable_file_reason(Path(args.out))    # (before the minutes of the grid)
        if problem:
            parser.error(f"record {args.out} cannot be written: {problem}")
        out = record()
        with atomic_path(Path(args.out)) as tmp:    # (its folder made; torch.save makes none)
            torch.save(out, tmp)
        raised = sum(len(v) == 1 for v in out.values())
        print(f"{len(out)} calls recorded ({raised} raised) -> {args.out}")
        return 0
    try:
        a, b = torch.load(args.a), torch.load(args.b)
        if not (isinstance(a, dict) and isinstance(b, dict)):
            raise TypeError("not a dict of calls")
    except Exception as exc:  # noqa: BLE001 - whatever unpickling another file raises
        parser.error(f"compare: {args.a} and {args.b} must be records of this script "
                     f"({type(exc).__name__}: {exc})")
    diff = differences(a, b)
    for line in diff[:50]:
        print("DIFFERS", line)
    print(f"{len(set(a) | set(b))} calls, {len(diff)} differ")
    return 1 if diff else 0


if __name__ == "__main__":
    sys.exit(main())
