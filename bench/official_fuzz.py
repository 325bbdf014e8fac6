"""Differential fuzz of the official loss variant (``--variant exact``: the exact one) on every
engine against float64: where does each engine meet the tests' rule?

Random problems (rows 2-257, dims from --dims, tau 0.01-1, logit bound B = scale max|z|^2 log-
uniform in [1, 10^--max-log-bound], labels singleton / few / many / one class, optional
prototypes, a duplicated row, include_self, every reduction; "none" with signed weights), each
run on the torch, attention and triton engines (without CUDA the Triton kernels run under the
interpreter) and on the dense reference in float64 and in float32. The rule is the suite's
(tests/test_balanced_contrastive_loss.py ``_check``): error <= 2 x the dense fp32 reference's +
1e-5 + 1e-4 max|ref|, gradients + 32 ulp of the terms that cancel in them (g max|z| sqrt(d) /
tau), and, unlike the suite's, the value + 32 ulp of the terms that cancel in it (the logit
bound, ``_value_terms``). Prints each case over the rule as it happens, then the worst ratio
per engine (``--by-ratio``: also per range of the logit bound B over the rows, and of B).

    python bench/official_fuzz.py --seconds 300                      # dims 1 2 3 8 16 40
    python bench/official_fuzz.py --dims 16 40 64 --seconds 300
    python bench/official_fuzz.py --dims 1 2 3 8 --max-log-bound 3.6
    python bench/official_fuzz.py --cases 1000 --seconds 3600 --engines triton   # fixed cases
    python bench/official_fuzz.py --levels 3 --engines torch      # the hierarchical loss too
    python bench/official_fuzz.py --rows 512 700 1030 --engines torch   # the symmetric engine
    python bench/official_fuzz.py --levels 3 --engines torch --cuda-forms   # CUDA's code paths
    python bench/official_fuzz.py --levels 3 --engines torch --seed 2 --case 4711   # replay one
    python bench/official_fuzz.py --variant exact --levels 3         # the exact variant instead
    python bench/official_fuzz.py --engines attention --max-log-bound 3.01 --by-ratio  # by B/rows
    python bench/official_fuzz.py --dtype bfloat16 --emulate-attention --variant exact  # 16 bits
    python bench/official_fuzz.py --variant exact --levels 3 --learnable-temperature  # dL/dtau
    python bench/official_fuzz.py --levels 3 --level-labels random   # levels that do not nest

A case over the rule is printed with its number (``--case`` replays it with the same options)
and its ratio to the rule with the fp32 reference's error taken as the worst of 23 roundings of
its logits (``_reference_roundings``: the logits scaled, the features reversed): 1 or below,
the excess is the reference's rounding luck on the case (docs/LOSS.md, case (a)), not an
engine's error. Since 2026-12-05 the reference forms its logits as the engines do ((z z^T) *
(1/tau); docs/LOSS.md, "Logits formed as the engines form them"), and the cases kind (a) had
left over the rule are within it.

``--emulate-attention`` runs the attention engine's CUDA branches on CPU tensors, PyTorch's CUDA
kernels replaced by dense fp32 stand-ins (``loss_golden.emulated_attention``): the adapter's padding
and bias plumbing against float64 without a GPU (the stand-ins' rounding is not the kernels').
``--cuda-forms`` runs the engines on CPU tensors through the code paths they take for CUDA tensors
(no C kernels, no symmetric engine, the whole-band positives, the sync-free forms of
``ops/_host_reads.cuda_code_paths``, as the tests' ``cuda_forms`` fixture): a fuzz of those paths
without a GPU. Both run on the CPU on any machine. ``--device`` is where the attention and Triton
engines run otherwise (default: CUDA where there is one; the torch engine and the references
always run on the CPU); ``--device cpu`` replays on a GPU machine what a CPU one found (the
Triton engine then needs ``TRITON_INTERPRET=1`` set before the script starts).

Measured 2026-11-27 (sessions 22-23, Triton interpreter, CPU flash attention; the torch
engines before and after their arg-max entry fold, ``ops/_max_fold.py``): docs/LOSS.md."""
from __future__ import annotations

import argparse
import contextlib
import math
import os
import random
import sys
import time
from pathlib import Path

import torch

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")

sys.path.insert(0, str(Path(__file__).parent))     # (its siblings, when loaded from a file)
from _device import asked_device  # noqa: E402

from hiertail_fast import balanced_contrastive_loss, hierarchical_contrastive_loss  # noqa: E402
from hiertail_fast.ops._dispatch import triton_interpreting  # noqa: E402

ENGINES = ("torch", "attention", "triton")


def _run(z, y, p, kw, backend, weights, device="cpu"):
    """[loss, dz, dprototypes..., (dtau)] in float64 on the CPU. Several levels (y and p
    lists): the hierarchical loss (mean reduction per level). kw["learn_tau"] (``--learnable-
    temperature``): the temperature as a 0-d tensor that requires grad (float64 with float64
    rows, else float32, as a user's learnable one), its gradient last, shaped [1]."""
    z = z.to(device).clone().requires_grad_()
    kw = dict(kw)
    tau = None
    if kw.pop("learn_tau", False):
        tau = torch.tensor(kw["temperature"], device=device, requires_grad=True,
                           dtype=torch.float64 if z.dtype == torch.float64 else torch.float32)
        kw["temperature"] = tau
    if isinstance(y, list):
        ps = [q.to(device).clone().requires_grad_() if q is not None else None for q in p]
        kw.pop("reduction")
        out = hierarchical_contrastive_loss(z, [t.to(device) for t in y], ps, backend=backend,
                                            **kw)
        (out * 2).backward()
        grads = [z.grad] + [q.grad for q in ps if q is not None]
    else:
        pp = p.to(device).clone().requires_grad_() if p is not None else None
        out = balanced_contrastive_loss(z, y.to(device), prototypes=pp, backend=backend, **kw)
        if kw["reduction"] == "none":
            (out * weights.to(out.device, out.dtype)).sum().backward()
        else:
            (out * 2).backward()
        grads = [z.grad] + ([pp.grad] if pp is not None else [])
    if tau is not None:
        grads.append(tau.grad.reshape(1))
    return [t.detach().double().cpu() for t in [out, *grads]]


LEVEL_LABELS = ("halved", "modulo", "random")


def _levels(rng: random.Random, y, p, max_levels: int, seed: int, level_labels: str = "halved",
            norm_cap: float | None = None):
    """With --levels L > 1: 1 to L levels, prototypes (one per label, or none) per level; 1
    level: the problem as it is. Level l's labels (``level_labels``): y // 2^l ("halved": each
    level coarsens the one before, so the levels nest), y % ceil(k / 2^l) ("modulo": classes
    of y merged across its order, not nesting) or ceil(k / 2^l) labels drawn anew per row
    ("random": a grouping with no relation to y); level 0 is y in each. A level's prototypes
    are drawn ones scaled by 1-1.1, each then at most `norm_cap` long (the norm of B =
    10^--max-log-bound: grown past it, B reached 1.43e11 at the largest bound, seed 8 case
    232 with --levels 3, and the loss refused the call, a traceback; the cap scales only such
    prototypes, the other draws are as before)."""
    n_levels = rng.randint(1, max_levels)
    if n_levels == 1:
        return y, p
    g = torch.Generator().manual_seed(seed + 7)
    k0 = int(y.max()) + 1
    ys, ps = [], []
    for lev in range(n_levels):
        n_labels = -(-k0 // 2 ** lev)                    # ceil(k0 / 2^lev)
        if lev == 0 or level_labels == "halved":
            yl = y // (2 ** lev)
        elif level_labels == "modulo":
            yl = y % n_labels
        else:
            yl = torch.randint(0, n_labels, y.shape,
                               generator=torch.Generator().manual_seed(seed + lev))
        ys.append(yl)
        if p is not None and lev % 2 == 0:
            k = int(yl.max()) + 1
            idx = torch.randint(0, p.shape[0], (k,), generator=g)
            q = p[idx] * (1 + 0.1 * torch.rand(k, 1, generator=g))
            if norm_cap is not None:     # (a factor of exactly 1 where the cap is not reached)
                over = (norm_cap / q.double().norm(dim=1, keepdim=True)).clamp(max=1.0)
                q = q * over.to(q.dtype)
            ps.append(q)
        else:
            ps.append(None)
    return ys, ps


ROWS = [2, 3, 5, 8, 13, 31, 64, 100, 150, 257]


def _protos_to(p, dtype: torch.dtype):
    """A case's prototypes (None, a tensor, or one entry per level, each None or a tensor)
    in `dtype`, the same structure."""
    if isinstance(p, list):
        return [q.to(dtype) if q is not None else None for q in p]
    return p.to(dtype) if p is not None else None


def _case(rng: random.Random, dims, max_log_bound: float, seed: int, max_levels: int = 1,
          rows=None, variant: str = "official", dtype: torch.dtype = torch.float32,
          learn_tau: bool = False, level_labels: str = "halved"):
    n = rng.choice(rows or ROWS)
    d = rng.choice(dims)
    tau = rng.choice([0.01, 0.1, 0.5, 1.0])
    bound = 10 ** rng.uniform(0, max_log_bound)
    labels = rng.choice(["singleton", "few", "many", "one"])
    m = rng.choice([0, 0, 3])
    g = torch.Generator().manual_seed(seed)
    z = torch.randn(n + m, d, generator=g, dtype=torch.float64)
    if rng.random() < 0.3:
        z = z.relu() + 0.01
    frac = 0.3 + 0.7 * torch.rand(n + m, 1, generator=g, dtype=torch.float64)
    z = (z / z.norm(dim=1, keepdim=True).clamp(min=1e-12) * (bound * tau) ** 0.5 * frac).float()
    if rng.random() < 0.15 and n > 3:
        z[1] = z[0]
    p, z = (z[n:] if m else None), z[:n]
    y = {"singleton": torch.randint(0, n, (n,), generator=g),
         "few": torch.randint(0, 3, (n,), generator=g),
         "many": torch.randint(0, max(2, n // 3), (n,), generator=g),
         "one": torch.zeros(n, dtype=torch.long)}[labels]
    if m:
        y = y % m
    kw = dict(temperature=tau, include_self=rng.random() < 0.5, variant=variant,
              reduction=rng.choice(["mean", "sum", "none"]))
    desc = dict(n=n, d=d, m=m, labels=labels, B=round(bound, 1), tau=tau,
                include_self=kw["include_self"], reduction=kw["reduction"])
    if learn_tau:                   # after the draws: the same problems either way
        kw["learn_tau"] = True
        desc.update(learn_tau=True)
    if max_levels > 1:
        y, p = _levels(rng, y, p, max_levels, seed, level_labels,
                       norm_cap=(10 ** max_log_bound * tau) ** 0.5)
        if isinstance(y, list):
            desc.update(levels=len(y), reduction="mean")
    if dtype != torch.float32:      # the rows as a 16-bit caller holds them (same draws)
        z = z.to(dtype)
        p = _protos_to(p, dtype)
        desc.update(dtype=str(dtype).removeprefix("torch."))
    return z, y, p, kw, desc


ROUNDING_SCALES = (3 ** 0.5, 1.1, 0.77, 1.3, 0.9, 1.7, 2.3, 0.6, 1.05, 1.21)
# the fp32 reference as given + 1/sqrt(tau) and each scale, features in order and reversed
N_ROUNDINGS = 1 + 2 * (1 + len(ROUNDING_SCALES))


def _reference_roundings(z, y, p, kw, w):
    """The dense fp32 reference on the same problem with its logits rounded other ways: z and
    the prototypes scaled by c (1/sqrt(tau), then ``ROUNDING_SCALES``) and the temperature by
    c^2 (the same loss in exact arithmetic; the gradients scaled back by c), each with the
    features in their order and reversed (another summation order of every dot product). Their
    errors against float64 sample what fp32 rounding alone costs on the case (docs/LOSS.md,
    case (a))."""
    d = z.shape[1]
    for c in (kw["temperature"] ** -0.5, *ROUNDING_SCALES):
        for order in (list(range(d)), list(range(d))[::-1]):
            def scaled(q, order=order, c=c):
                return None if q is None else q[:, order] * c
            ps = [scaled(q) for q in p] if isinstance(p, list) else scaled(p)
            out = _run(scaled(z), y, ps, {**kw, "temperature": kw["temperature"] * c * c},
                       "reference", w)
            # order is its own inverse (identity or reversal); dL/dtau at tau c^2 is dL/dtau / c^2
            tau_grad = [out.pop() * c * c] if kw.get("learn_tau") else []
            yield [out[0]] + [g[:, order] * c for g in out[1:]] + tau_grad


def weights_and_float64_reference(z, y, p, kw):
    """(w, the float64 dense reference's [loss, gradients...]) of a case: w the upstream weights
    of its rows and prototypes (``_run``'s ``weights``), shared by every run of the case."""
    protos = [q for q in (p if isinstance(p, list) else [p]) if q is not None]
    w = torch.linspace(-1, 2, z.shape[0] + sum(q.shape[0] for q in protos))
    return w, _run(z.double(), y, _protos_to(p, torch.float64), kw, "reference", w.double())


def _logit_bound(z, protos, kw) -> float:
    """B = max |row|^2 / tau over the rows and prototypes: the attention guard's bound (the
    draw's "B" is its ceiling: the rows' norms are scaled by 0.3-1)."""
    return max(q.double().pow(2).sum(1).max().item() for q in [z, *protos]) / kw["temperature"]


def _value_terms(z, protos, kw, n_levels: int) -> float:
    """The size of the terms that cancel in the loss value: a row's loss is its LSE minus the
    mean of its positives' logits, each up to the logit bound B = max |row|^2 / tau. Where one
    key dominates a row's LSE and is its only positive (the row's own key with include_self,
    a singleton class), the two are equal in exact arithmetic and the loss ~0; an engine that
    takes them from two dot products of different rounding (the LSE from its GEMM, the
    positives from class sums) is off by an ulp of B, the dense fp32 reference, which reads
    both from one logit matrix, by nothing (a fuzzing find, 2026-12-05: 80x the rule before
    this term at B 2.3e4, 2 rows; an ulp of B is fp32's resolution of those logits). Scaled
    as the value: per row ("none"), the rows' sum ("sum"; several levels take the mean, as
    ``_run``), and one term per level."""
    rows_summed = n_levels == 1 and kw["reduction"] == "sum"
    return _logit_bound(z, protos, kw) * n_levels * (z.shape[0] if rows_summed else 1)


def case_ratios(z, y, p, kw, engines, dev="cpu", roundings=False,
                terms_dtype: torch.dtype = torch.float32,
                worst_output: dict | None = None) -> dict[str, float]:
    """Each engine's worst error on the case (value and every gradient) over the suite's rule:
    2 x the dense fp32 reference's error + 1e-5 + 1e-4 max|ref|, + 32 ulp of the terms that
    cancel in each (gradients: g max|z| sqrt(d) / tau; the value: ``_value_terms``). With a
    16-bit `terms_dtype` (``--terms-in input``), the gradients' term is instead ONE ulp of that
    dtype: the rule of a path that forms them in 16 bits (the bf16 flash output).
    ``roundings``: the fp32 reference's error in the rule is the largest of its roundings'
    (``_reference_roundings``, the given one included), a diagnostic for cases over the suite's
    rule, never the rule itself. ``worst_output``: a dict that gets, per engine, the name of
    the output with the largest ratio ("value", "dz", "dprototypes[l]", "dtau")."""
    n, d = z.shape
    protos = [q for q in (p if isinstance(p, list) else [p]) if q is not None]
    w, exp = weights_and_float64_reference(z, y, p, kw)
    # the dense fp32 reference; 16-bit rows: on their fp32 copy, its gradients rounded to their
    # dtype as the engines return them (the loss value stays fp32)
    z32, p32 = z.float(), _protos_to(p, torch.float32)
    lows = [_run(z32, y, p32, kw, "reference", w)]
    if roundings:
        lows += list(_reference_roundings(z32, y, p32, kw, w))
    learn_tau = kw.get("learn_tau", False)      # dL/dtau last: float32 whatever the rows
    if z.dtype != torch.float32:
        lows = [[lo[0]] + [g.to(z.dtype).double() for g in lo[1:len(lo) - learn_tau]]
                + lo[len(lo) - learn_tau:] for lo in lows]
    ref_err = [max((lo[j] - e).abs().max().item() for lo in lows) for j, e in enumerate(exp)]
    # the rule's cancelling terms: every level's gradient coefficients (mean: 2 / n each)
    n_levels = len(y) if isinstance(y, list) else 1
    g_max = 2.0 * n_levels / n if kw["reduction"] == "mean" or n_levels > 1 else 2.0
    z_max = max([z.abs().max().item()] + [q.abs().max().item() for q in protos])
    terms = g_max * z_max * d ** 0.5 / kw["temperature"]
    value_terms = _value_terms(z, protos, kw, n_levels)
    # 32 fp32 ulp (the suite's), or ONE ulp of a 16-bit terms_dtype (its output's rounding)
    terms_ulp = torch.finfo(terms_dtype).eps * (32 if terms_dtype == torch.float32 else 1)
    names = (["value", "dz"] + [f"dprototypes[{i}]" for i in range(len(protos))]
             + ["dtau"] * learn_tau)
    out = {}
    for eng in engines:
        got = _run(z, y, p, kw, eng, w, dev if eng != "torch" else "cpu")
        ratio, worst_name = 0.0, names[0]
        for j, (a, e) in enumerate(zip(got, exp, strict=True)):
            rule = 2 * ref_err[j] + 1e-5 + 1e-4 * e.abs().max().item()
            if learn_tau and j == len(exp) - 1:
                pass    # dL/dtau: the suite's rule as it is (test_learnable_temperature)
            elif j:
                rule += terms_ulp * terms
            else:
                rule += 32 * torch.finfo(torch.float32).eps * value_terms
            this = (a - e).abs().max().item() / rule
            if this > ratio:
                ratio, worst_name = this, names[j]
        out[eng] = ratio
        if worst_output is not None:
            worst_output[eng] = worst_name
    return out


def largest_log_bound(dtype: torch.dtype) -> float:
    """The largest --max-log-bound whose cases the fuzz can judge, for both variants: B (= max
    |z_i|^2 / tau, at most 10^bound) within 2^37 and, for 16-bit rows, their entries (of norm up
    to sqrt(B), tau <= 1) finite in their dtype; rounded down to 0.01, a margin of >= 0.6 % over
    the rounding of the rows to their dtype. 2^37 is the official variant's fast-engine range
    (past it the loss raises: a traceback) and, for the exact variant, where the float64 truth
    stops being one: the dense reference adds log w to the logits (logsumexp(s + log w)), so its
    share of keys that tie a row's max (duplicate rows in classes of unequal size) is off by
    ~|s| 2^-53 relative, 1.2e-4 at |s| ~ 1e12 and 2.3x at 1e17, where the torch engine (which
    multiplies the weights) was right and was reported over the rule
    (bench/tied_weights.py)."""
    from hiertail_fast._validation.losses import OFFICIAL_ENGINE_MAX_LOGIT

    largest = min(OFFICIAL_ENGINE_MAX_LOGIT, torch.finfo(dtype).max ** 2)
    return math.floor(100 * math.log10(largest)) / 100


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=" ".join(__doc__.split("\n\n")[0].split()))
    ap.add_argument("--seconds", type=float, default=300.0)
    ap.add_argument("--cases", type=int, default=None,
                    help="stop after this many cases (a run comparable across revisions)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--dims", type=int, nargs="+", default=[1, 2, 3, 8, 16, 40])
    ap.add_argument("--max-log-bound", type=float, default=4.5,
                    help="the logit bound B is log-uniform in [1, 10^this]; at most "
                         "largest_log_bound(): 11.13 (2^37), 9.63 with float16 rows")
    ap.add_argument("--engines", nargs="+", choices=ENGINES, default=None,
                    help=f"default {list(ENGINES)}, less triton on the CPU without "
                         "TRITON_INTERPRET=1 (a GPU machine's --cuda-forms / "
                         "--emulate-attention / --device cpu runs)")
    ap.add_argument("--rows", type=int, nargs="+", default=None,
                    help=f"row counts to draw from (default {ROWS}; >= 512: the symmetric "
                         "engine on one level)")
    ap.add_argument("--levels", type=int, default=1,
                    help="up to this many levels (the hierarchical loss; 1: the cases as before)")
    ap.add_argument("--level-labels", choices=LEVEL_LABELS, default="halved",
                    help="with --levels > 1, level l's labels: y // 2^l (nested), y %% "
                         "ceil(k / 2^l) or drawn anew (levels that do not nest; see _levels)")
    ap.add_argument("--cuda-forms", action="store_true",
                    help="CPU tensors through the engines' CUDA code paths (see above)")
    ap.add_argument("--emulate-attention", action="store_true",
                    help="the attention engine's CUDA branches on CPU tensors, PyTorch's CUDA "
                         "kernels replaced by dense stand-ins (see above)")
    ap.add_argument("--device", choices=["cpu", "cuda"], default=None,
                    help="where the attention and Triton engines run (default: cuda where "
                         "available, cpu with --cuda-forms / --emulate-attention)")
    ap.add_argument("--variant", choices=["official", "exact"], default="official",
                    help="the loss variant of every case (the same draws either way)")
    ap.add_argument("--dtype", choices=["float32", "bfloat16", "float16"], default="float32",
                    help="the rows' and prototypes' dtype (the same draws, rounded to it; the "
                         "float64 reference on the rounded values)")
    ap.add_argument("--terms-in", choices=["float32", "input"], default="float32",
                    help="the gradients' cancelling terms in the rule: 32 fp32 ulp (the "
                         "suite's), or one ulp of the rows' 16-bit dtype (the bf16 flash "
                         "path's output against its own precision)")
    ap.add_argument("--learnable-temperature", action="store_true",
                    help="the temperature a 0-d tensor that requires grad: dL/dtau checked too, "
                         "by the suite's rule (test_learnable_temperature; the same draws)")
    ap.add_argument("--by-ratio", action="store_true",
                    help="also print each engine's worst ratio per range of B / rows and of B")
    ap.add_argument("--case", type=int, default=None,
                    help="run only case K of this seed's sequence (the 'case' printed with a "
                         "case over the rule), with the same options")
    args = ap.parse_args(argv)
    if (not args.seconds > 0 or min(args.dims) < 1 or not args.max_log_bound >= 0
            or (args.cases is not None and args.cases < 1) or args.levels < 1
            or min(args.rows or ROWS) < 2 or (args.case is not None and args.case < 1)
            or (args.case is not None and args.cases is not None and args.case > args.cases)):
        ap.error("--seconds > 0, --cases >= 1, --dims >= 1, --max-log-bound >= 0, --levels >= 1"
                 ", --rows >= 2, 1 <= --case <= --cases")
    largest = largest_log_bound(getattr(torch, args.dtype))
    if args.max_log_bound > largest:
        ap.error(f"--max-log-bound {args.max_log_bound:g}: at most {largest:g} for "
                 f"--variant {args.variant} with {args.dtype} rows (past it the loss or the "
                 f"float64 truth fails; largest_log_bound)")
    args.device = _device(ap, args)
    torch.set_num_threads(1)
    from hiertail_fast.ops._host_reads import cuda_code_paths

    with (cuda_code_paths() if args.cuda_forms else contextlib.nullcontext(),
          _emulated_attention() if args.emulate_attention else contextlib.nullcontext()):
        _fuzz(args)


def _device(ap: argparse.ArgumentParser, args) -> str:
    """The attention and Triton engines' device: --device, else CUDA where there is one; the
    CPU with --cuda-forms / --emulate-attention, which put CPU tensors through CUDA code paths
    (on a GPU machine the emulation's stand-ins got CUDA tensors before this option)."""
    on_cpu = args.cuda_forms or args.emulate_attention
    if args.device == "cuda" and on_cpu:
        ap.error("--cuda-forms and --emulate-attention run on the CPU: not with --device cuda")
    device = asked_device(ap, args.device or ("cpu" if on_cpu else None))
    triton_runs = device == "cuda" or triton_interpreting()
    if args.engines is None:
        args.engines = [e for e in ENGINES if e != "triton" or triton_runs]
    if "triton" in args.engines and not triton_runs:
        ap.error("the triton engine on the CPU needs TRITON_INTERPRET=1 set before the script "
                 "starts (it is set for you on a machine without CUDA)")
    return device


def _emulated_attention():
    """``loss_golden.emulated_attention``: the attention engine takes its CUDA branches (fp32:
    the memory-efficient kernel's contract, head dim padded to 8, bias rows to 16, LSE padded
    to 32) on CPU tensors, each kernel a dense fp32 softmax."""
    import loss_golden

    return loss_golden.emulated_attention()


# the --by-ratio tables: B / rows (the official guard's rows rule) and B (its MAX_LOGIT)
TABLES = {"B / rows": (0.25, 0.5, 0.75, 1.0, 2.0, 4.0, 8.0),
          "B": (64.0, 128.0, 256.0, 512.0, 1024.0, 2048.0, 4096.0)}


def _rows(z, protos) -> int:
    """The rows the attention guard counts: the queries and every level's prototypes."""
    return z.shape[0] + sum(q.shape[0] for q in protos)


def _bucket(value: float, edges) -> int:
    return sum(value > edge for edge in edges)


def _bucket_name(b: int, edges) -> str:
    if b == 0:
        return f"<= {edges[0]:g}"
    if b == len(edges):
        return f"> {edges[-1]:g}"
    return f"({edges[b - 1]:g}, {edges[b]:g}]"


def _print_tables(by_range, engines) -> None:
    """Each engine's worst ratio to the rule per range of B / rows and of B (cases in brackets;
    rows: the queries and every level's prototypes, as the attention guard counts them)."""
    for name, edges in TABLES.items():
        print(f"worst ratio to the rule by {name} (cases in brackets):")
        print("| engine | " + " | ".join(_bucket_name(b, edges) for b in range(len(edges) + 1))
              + " |")
        print("|---" * (len(edges) + 2) + "|")
        for eng in engines:
            cells = [by_range.get((eng, name, b)) for b in range(len(edges) + 1)]
            print(f"| {eng} | " + " | ".join("-" if c is None else f"{c[0]:.2f} ({c[1]})"
                                             for c in cells) + " |")


def _fuzz(args) -> None:
    rng = random.Random(args.seed)
    dev = args.device
    worst: dict[str, tuple[float, dict]] = {}
    by_range: dict[tuple, tuple[float, int]] = {}   # (engine, table, bucket) -> worst, cases
    over = dict.fromkeys(args.engines, 0)
    end, cases = time.time() + args.seconds, 0
    shown = time.time()
    while time.time() < end and (args.cases is None or cases < args.cases):
        if time.time() - shown >= 30:    # progress: a run without failures printed nothing
            shown = time.time()
            print(f"{cases} cases, {max(0, end - shown):.0f} s left; worst so far: "
                  + ", ".join(f"{e} {worst.get(e, (0.0,))[0]:.3f}x" for e in args.engines),
                  flush=True)
        cases += 1
        z, y, p, kw, desc = _case(rng, args.dims, args.max_log_bound, args.seed * 1_000_003 + cases,
                                  args.levels, args.rows, args.variant, getattr(torch, args.dtype),
                                  args.learnable_temperature, args.level_labels)
        if args.case is not None and cases < args.case:
            continue            # the case's draws only: replay reaches case K as the run did
        desc = {"case": cases, **desc}
        terms_dtype = z.dtype if args.terms_in == "input" else torch.float32
        which: dict[str, str] = {}       # each engine's output furthest over the rule
        ratios = case_ratios(z, y, p, kw, args.engines, dev, terms_dtype=terms_dtype,
                             worst_output=which)
        protos = [q for q in (p if isinstance(p, list) else [p]) if q is not None]
        bound = _logit_bound(z, protos, kw)
        buckets = [(name, _bucket(bound / _rows(z, protos) if name == "B / rows" else bound,
                                  edges)) for name, edges in TABLES.items()]
        for eng in args.engines:
            ratio = ratios[eng]
            for key in buckets:
                top, seen = by_range.get((eng, *key), (0.0, 0))
                by_range[(eng, *key)] = (max(top, ratio), seen + 1)
            if ratio > worst.get(eng, (0.0, {}))[0]:
                worst[eng] = (ratio, desc)
            if ratio > 1 or args.case is not None:
                over[eng] += ratio > 1
                other = case_ratios(z, y, p, kw, [eng], dev, roundings=True,
                                    terms_dtype=terms_dtype)[eng]
                print(f"{'over the rule' if ratio > 1 else 'within the rule'}: {eng} "
                      f"{ratio:.2f}x {desc} (with the reference's worst of "
                      f"{N_ROUNDINGS} roundings: {other:.2f}x; worst output: {which[eng]})",
                      flush=True)
        if args.case is not None:
            break
    print(f"{cases} cases, {args.variant} variant, dims {args.dims}, "
          f"B <= 10^{args.max_log_bound:g}, "
          f"levels <= {args.levels}"
          f"{', level labels ' + args.level_labels if args.level_labels != 'halved' else ''}"
          f"{', CUDA code paths on CPU' if args.cuda_forms else ''}"
          f"{', CUDA attention emulated' if args.emulate_attention else ''}"
          f"{', rows in ' + args.dtype if args.dtype != 'float32' else ''}"
          f"{', gradient terms at one ulp of the rows dtype' if args.terms_in == 'input' else ''}"
          f"{', learnable temperature' if args.learnable_temperature else ''}")
    for eng in args.engines:
        ratio, desc = worst.get(eng, (0.0, {}))
        print(f"worst {eng}: {ratio:.3f}x the rule, {over[eng]} case(s) over it {desc}")
    if args.by_ratio:
        _print_tables(by_range, args.engines)

if __name__ == "__main__":
    main()
