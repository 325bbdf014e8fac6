"""Dense reference of the class-balanced contrastive loss (HierTail SCL Eq. 7 / BCL Eq. 8).

The oracle for the fast backends (``hiertail_fast/ops/balanced_contrastive_loss.py``): plain
PyTorch, N_all x N_all matrices, float64-safe so ``torch.autograd.gradcheck`` runs. Never fast.

Definitions (N_all = N + m rows, DESIGN.md §3)::

    Z_all = cat(z, prototypes)              labels_all = cat(labels, arange(m))
    s_ij  = z_i . z_j / tau                 c(q) = #rows of label q,  w_k = 1 / c(label_k)
    P(i)  = {j : label_j = label_i}         (include_self=True, the official code)
          = {j != i : label_j = label_i}    (include_self=False, the paper's Eq. 7)

    exact:    loss_i = log sum_k w_k exp(s_ik) - (1/|P(i)|) sum_{j in P(i)} s_ij
    official: M_i = max_k s_ik,  S^_ij = exp(s_ij - M_i) + 1e-7,  D_i = sum_k w_k S^_ik
              loss_i = -(1/|P(i)|) sum_{j in P(i)} log(S^_ij / D_i)

The denominator always runs over ALL keys k (i included). ``official`` reproduces the official
code's formula, including the +1e-7 after the row-max shift, which clamps every positive term
at about log(1e-7) = -16.1: on unnormalised embeddings the two variants differ enormously. The
gradient through M_i goes to one arg-max entry: the first index among the maximal logits, then
the first key whose ROW equals that key's row exactly (duplicate rows' logits differ by an ulp
depending on the product's rounding, so the plain arg-max moved with the layout of z: the
reference's gradient changed by up to 10 between a row- and a column-major copy of the same
values; a differential fuzz). The fast engines follow the same rule (``ops/_tied_keys.py``).

A row with an empty positive set (a class of one member with ``include_self=False``)
contributes nothing: its entry is 0 under ``reduction="none"`` and it is left out of the mean
(``"mean"`` averages over contributing rows; with ``include_self=True`` every row contributes,
so this is the official code's mean over all rows). If no row contributes the loss is 0.
"""
from __future__ import annotations

import torch

# the input checks live in _validation; re-exported here for compatibility
from hiertail_fast._validation import (  # noqa: F401
    MIN_TEMPERATURE,
    REDUCTIONS,
    VARIANTS,
    validate_contrastive_inputs,
)

OFFICIAL_EPS = 1e-7


def _reduce(loss: torch.Tensor, contributes: torch.Tensor, reduction: str) -> torch.Tensor:
    loss = torch.where(contributes, loss, torch.zeros_like(loss))
    if reduction == "none":
        return loss
    if reduction == "sum":
        return loss.sum()
    # divided before the sum, as the positives' sum below: rows of loss ~1e37 (logits inside
    # the validated bound) summed past float32's range (an extremes audit)
    return (loss / max(int(contributes.sum()), 1)).sum()


def balanced_contrastive_loss_ref(
    z: torch.Tensor,
    labels: torch.Tensor,
    *,
    prototypes: torch.Tensor | None = None,
    temperature: float | torch.Tensor = 0.1,
    include_self: bool = True,
    reduction: str = "mean",
    variant: str = "exact",
) -> torch.Tensor:
    """Class-balanced contrastive loss, dense reference.

    Args:
        z: [N, d] floating embeddings (not normalised here).
        labels: [N] non-negative integer labels.
        prototypes: optional [m, d] rows appended to ``z``; prototype t gets label t.
        temperature: tau > 0 (a float, or a 0-d float tensor: autograd differentiates it).
        include_self: whether i is its own positive (official code) or not (paper Eq. 7).
        reduction: "mean" (over contributing rows) | "sum" | "none" ([N + m], 0 for rows
            with an empty positive set).
        variant: "exact" (epsilon-free) | "official" (+1e-7 after the row-max shift).

    Returns:
        scalar, or [N + m] for ``reduction="none"``: float32 for 16-bit ``z`` (computed in
        float32, as every backend accumulates them; gradients back in ``z``'s dtype), else
        ``z``'s dtype.
    """
    validate_contrastive_inputs(z, labels, prototypes, temperature, reduction, variant,
                                include_self=include_self)
    labels = labels.long()
    if prototypes is not None:
        m = prototypes.shape[0]
        z_all = torch.cat([z, prototypes], dim=0)
        labels_all = torch.cat([labels, torch.arange(m, device=labels.device)])
    else:
        z_all, labels_all = z, labels
    # 16-bit rows in float32: computed in 16 bits, the official variant's 1e-7 is subnormal in
    # fp16 and its log's gradient 1/(e^(s-M) + 1e-7) ~ 8e6 overflows to inf, inf * 0 = NaN
    z_all = z_all.to(torch.promote_types(z_all.dtype, torch.float32))
    n_all = z_all.shape[0]

    # the logits as every engine forms them, the dot times 1/tau (the same math as / tau, one
    # rounding apart in ~1 of 7 entries): the fp32 reference's error then samples the engines'
    # own rounding of the logits, the one the tests' rule scales with (a fuzzing find: with
    # / tau the engines' dz was 3x the reference's error on a case where their rounding alone
    # made the difference, docs/LOSS.md "Logits formed as the engines form them")
    # A tensor tau (learnable): 1/tau in float64, rounded once to the logits' dtype, as the
    # engines take it (1 / float(tau)); in tau's own dtype a 16-bit tau rounded 1/tau to 8 or
    # 11 bits (bf16 0.07: the loss 8e-4 relative off) or overflowed (fp16 1e-5: a NaN loss)
    # (a numpy float16 the same: 1.0 / np.float16 stays float16)
    inv_tau = (1.0 / temperature.to(torch.float64)).to(z_all.dtype) if isinstance(
        temperature, torch.Tensor) else 1.0 / float(temperature)
    s = (z_all @ z_all.t()) * inv_tau                                      # [N_all, N_all]
    _, inverse, counts = torch.unique(labels_all, return_inverse=True, return_counts=True)
    w = 1.0 / counts[inverse].to(z_all.dtype)                             # [N_all] key weights
    pos = labels_all[:, None] == labels_all[None, :]                      # positive mask
    if not include_self:
        pos = pos & ~torch.eye(n_all, dtype=torch.bool, device=z.device)
    n_pos = pos.sum(dim=1)
    contributes = n_pos > 0
    denom = n_pos.clamp(min=1).to(z_all.dtype)
    zero = torch.zeros((), dtype=z_all.dtype, device=z.device)

    if variant == "exact":
        lse = torch.logsumexp(s + torch.log(w)[None, :], dim=1)
        # each logit divided by |P(i)| before the sum: a big class's Σ s_ij overflowed float32
        # with every s_ij inside the validated bound (-inf; an extremes audit)
        loss = lse - (torch.where(pos, s, zero) / denom[:, None]).sum(dim=1)
    else:
        # not detached: the gradient goes to the arg-max entry, moved to the first key of
        # the same row (see the module docstring)
        row_max = s.gather(1, _first_equal_row(z_all, s.argmax(dim=1))[:, None])
        s_hat = torch.exp(s - row_max) + OFFICIAL_EPS
        d = (s_hat * w[None, :]).sum(dim=1, keepdim=True)
        log_prob = torch.log(s_hat / d)
        loss = -(torch.where(pos, log_prob, zero) / denom[:, None]).sum(dim=1)
    return _reduce(loss, contributes, reduction)


def _first_equal_row(z_all: torch.Tensor, arg: torch.Tensor) -> torch.Tensor:
    """Each key id of ``arg`` moved to the smallest id whose row of ``z_all`` equals its row
    exactly (plain torch: rows grouped by ``torch.unique``, the first id of each group)."""
    _, group = torch.unique(z_all.detach(), dim=0, return_inverse=True)
    ids = torch.arange(z_all.shape[0], device=z_all.device)
    first = torch.full((int(group.max()) + 1 if group.numel() else 0,), z_all.shape[0],
                       dtype=torch.long, device=z_all.device)
    first.scatter_reduce_(0, group, ids, reduce="amin")
    return first[group[arg]]
