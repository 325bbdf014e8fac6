"""GraphSMOTE_T / GraphSMOTE_O as the LTE4G / HierTail copy runs them (PROTOCOL_AND_BASELINES.md
§2.6-2.7), in linear memory.

Per epoch: H = Encoder(X, Â) (train mode); SMOTE on the detached embeddings of each tail class
(``recon`` up_scale rule, one λ per class and round by default), h_new differentiable; the
decoder's z = [H; h_new] Wᵀ gives P = σ(z zᵀ). The official code materialises P, the mask M and
the augmented adjacency as dense (n+s)² matrices; here

- ``L_rec`` = Σ_ij w_ij (P_ij − Ā_ij)² over the n×n block (Ā = binarised A+I, w = 1 on its
  entries, |Ā|/(n² − |Ā|) elsewhere) is computed exactly as w₀·Σ P² (row blocks recomputed in the
  backward: O(block·n) live memory, O(n²h) time as the official code) plus an O(|E|h)
  correction on the entries of Ā (`recon_loss`);
- the augmented graph B only has entries at the mask's positions: the original block (A+I), the
  synthetic rows' candidates cand(k) = N̄(v_k) ∪ N̄(nn(v_k)) and their transpose (no
  synthetic–synthetic block, so no self-loop on a synthetic node), so P is only evaluated there,
  O(s·deg·h), and B is applied as an operator, never formed (`augmented_adjacency`). _T keeps
  the candidates with P ≥ 0.5 at weight 1, _O keeps them with weight P; B is detached (as the
  copy does for both; with ``edge_grad`` _O's weights keep their gradient, O(s·deg·h) in the
  backward) and row-normalised D⁻¹B.

L = CE over training + synthetic nodes + rw·L_rec (rw 1e-6). With ``ep_pre`` > 0 (LTE4G's copy:
50; HierTail's and HeroLT's: 0) the loop is preceded by ``ep_pre`` pre-training epochs of the
edge generator as the official code runs them: train mode, L_rec alone (SMOTE still drawn, so
the λ stream advances as there), encoder + decoder stepped, the classifier untouched (it gets no
gradient, so the shared Adam skips it), no evaluation, stopped once 500 epochs passed the
lowest L_rec; the loop's Adam state carries on from them (the official optimisers are the same
objects). Evaluation: Classifier(Encoder(X,
Â), Â) on the original graph — with the faithful ``adj_norm="none"`` Â is the unnormalised A+I
there although training used the row-normalised B (the copy's §1.1 inconsistency).
"""
from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn

from hiertail_fast.baselines.config import BaselineConfig
from hiertail_fast.baselines.layers import AugmentedAdjacency
from hiertail_fast.baselines.methods import METHODS, BaselineMethod, MethodContext
from hiertail_fast.baselines.sampling import (
    _gather_rows,
    same_class_nearest_neighbour,
    smote_interpolate,
    upsample_rounds,
)
from hiertail_fast.graph import CSRGraph
from hiertail_fast.ops._autograd import eager_twin, first_order_backward

_BLOCK_ELEMS = 1 << 22   # rows × n of one block of P (16 MB in fp32)
_PRETRAIN_CONVERGED = 500   # official: pre-training stops 500 epochs after its lowest L_rec


class Decoder(nn.Module):
    """Edge generator: P = σ((H Wᵀ)(H Wᵀ)ᵀ), W [h, h] initialised U(±1/√h); `embed` gives
    z = H Wᵀ, P is never formed here."""

    def __init__(self, hidden: int) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.empty(hidden, hidden))
        s = 1.0 / math.sqrt(hidden)
        nn.init.uniform_(self.weight, -s, s)

    def embed(self, h: torch.Tensor) -> torch.Tensor:
        return h @ self.weight.T


@eager_twin
class _SumSqSigmoidGram(torch.autograd.Function):
    """Σ_ij σ(z_i·z_j)² over all n² pairs, in row blocks of ``block`` rows: the forward keeps
    nothing but z, the backward recomputes each block (dL/ds = 2σ²(1 − σ) · grad); O(block·n)
    live memory either way, O(n²·d) time."""

    @staticmethod
    def forward(z: torch.Tensor, block: int) -> torch.Tensor:
        total = z.new_zeros((), dtype=torch.float64)
        for lo in range(0, z.shape[0], block):
            total += torch.sigmoid(z[lo:lo + block] @ z.T).square().sum(dtype=torch.float64)
        return total.to(z.dtype)

    @staticmethod
    def setup_context(ctx, inputs, output):
        z, ctx.block = inputs
        ctx.save_for_backward(z)

    @staticmethod
    @first_order_backward("GraphSMOTE's sum of squared sigmoid Gram entries")
    def backward(ctx, grad: torch.Tensor):
        (z,) = ctx.saved_tensors
        gz = torch.zeros_like(z)
        for lo in range(0, z.shape[0], ctx.block):
            zb = z[lo:lo + ctx.block]
            p = torch.sigmoid(zb @ z.T)
            g = p.square_().mul_(1.0 - p.sqrt()).mul_(2.0 * grad)   # 2 σ² (1 − σ)
            gz[lo:lo + ctx.block] += g @ z                            # as rows
            gz += g.T @ zb                                            # as columns
        return gz, None   # None: block is not differentiable


def recon_loss(z: torch.Tensor, graph: CSRGraph) -> torch.Tensor:
    """The official ``adj_mse_loss(P, Ā)`` with P = σ(z zᵀ) [n, n] and Ā the binarised
    ``graph`` (its entries, whatever their weights): Σ_ij w_ij (P_ij − Ā_ij)², w = 1 on
    entries, |Ā| / (n² − |Ā|) elsewhere. Exact; O(block·n + |E|·h) memory."""
    n = z.shape[0]
    if graph.num_nodes != n:
        raise ValueError(f"z has {n} rows, the graph {graph.num_nodes} nodes")
    row, col = graph.row_index(), graph.indices
    key = torch.unique(row * n + col)                      # binarised: duplicates count once
    e = key.numel()
    w0 = e / (n * n - e) if n * n > e else 0.0
    total = _SumSqSigmoidGram.run(z, max(1, _BLOCK_ELEMS // max(n, 1)))
    r, c = key // n, key % n
    # index_select (reproducible backward on CPU threads; see reference/gcn_propagate.py)
    pe = torch.sigmoid((z.index_select(0, r) * z.index_select(0, c)).sum(1))
    return w0 * total + ((pe - 1.0) ** 2 - w0 * pe * pe).sum()


def recon_loss_dense(z: torch.Tensor, adj: torch.Tensor) -> torch.Tensor:
    """The official dense ``adj_mse_loss`` (test oracle): O(n²) memory."""
    p = torch.sigmoid(z @ z.T)
    tgt = (adj != 0).to(p.dtype)
    e = int(tgt.sum())
    w = torch.where(tgt > 0, torch.ones_like(p), torch.full_like(p, e / (tgt.numel() - e)))
    return (w * (p - tgt) ** 2).sum()


def candidate_edges(graph: CSRGraph, sources: torch.Tensor, neighbours: torch.Tensor):
    """(k, j): the union of the rows of sources[k] and neighbours[k] of the binarised graph,
    sorted by (k, j), no duplicates. O(s·deg) memory."""
    n = graph.num_nodes
    k1, c1, _ = _gather_rows(graph, sources)
    k2, c2, _ = _gather_rows(graph, neighbours)
    key = torch.unique(torch.cat([k1 * n + c1, k2 * n + c2]))
    return key // n, key % n


def augmented_adjacency(graph: CSRGraph, z: torch.Tensor, cand_k: torch.Tensor,
                        cand_j: torch.Tensor, variant: str, edge_grad: bool = False,
                        norm: str = "none") -> AugmentedAdjacency:
    """B [n+s, n+s] as an operator (``norm="row"``: D⁻¹B): A+I's entries at weight 1, synthetic
    row n+k and column n+k at the candidates j with weight 1[P ≥ 0.5] (``"t"``, zeros dropped)
    or P (``"o"``), where P_kj = σ(z[n+k]·z[j]); s = z.shape[0] − n. Detached (the HierTail
    copy) unless ``edge_grad`` (``"o"`` only: the weights, and so the degrees, keep their
    gradient to z, as the paper's _O; O(|cand|·h) in the backward, `AugmentedAdjacency`)."""
    if variant not in ("t", "o"):
        raise ValueError(f"variant must be 't' or 'o', got {variant!r}")
    if edge_grad and variant == "t":
        raise ValueError("edge_grad needs continuous weights (variant 'o')")
    n = graph.num_nodes
    with torch.set_grad_enabled(edge_grad and torch.is_grad_enabled()):
        p = torch.sigmoid((z.index_select(0, n + cand_k) * z.index_select(0, cand_j))
                          .sum(1)).float()
    if variant == "t":
        keep = p >= 0.5
        cand_k, cand_j, p = cand_k[keep], cand_j[keep], torch.ones_like(p[keep])
    return AugmentedAdjacency(graph, z.shape[0] - n, cand_k, cand_j, p, norm)


def augmented_graph_dense(adj: torch.Tensor, z: torch.Tensor, sources: torch.Tensor,
                          neighbours: torch.Tensor, variant: str,
                          edge_grad: bool = False) -> torch.Tensor:
    """The official dense construction of B (test oracle; O((n+s)²))."""
    n = adj.shape[0]
    a = (adj != 0).float()
    a_new = (a[sources] + a[neighbours]).clamp(0, 1)
    m = torch.zeros(z.shape[0], z.shape[0])
    m[:n, :n] = a
    m[n:, :n] = a_new
    m[:n, n:] = a_new.T
    p = torch.sigmoid(z @ z.T)
    p = p if edge_grad else p.detach()
    b = ((p >= 0.5).float() if variant == "t" else p) * m
    b = torch.cat([torch.cat([adj, b[:n, n:]], 1), b[n:]])     # original block := A
    return (b != 0).float() if variant == "t" else b


class _GraphSmote(BaselineMethod):
    uses_tail = True
    variant = "t"

    def __init__(self, ctx: MethodContext, cfg: BaselineConfig) -> None:
        if cfg.resolved_classifier != "gnn":
            raise ValueError("GraphSMOTE's classifier is always the GNN classifier (§2.6)")
        super().__init__(ctx, cfg)
        self.decoder = Decoder(cfg.hidden)
        self.rounds = upsample_rounds(ctx.y, ctx.train_idx, ctx.num_classes, cfg.im_class_num,
                                      cfg.up_scale, "recon")
        self.num_synthetic = sum(int(r.numel()) for _, r in self.rounds)

    def train_loss(self) -> torch.Tensor:
        return self._forward(pretrain=False)

    def pretrain(self, opt: torch.optim.Optimizer) -> int:
        """``ep_pre`` epochs of L_rec alone (see the module docstring); returns epochs run."""
        losses: list[float] = []
        for epoch in range(self.cfg.ep_pre):
            self.train()
            opt.zero_grad(set_to_none=True)
            loss = self._forward(pretrain=True)
            loss.backward()
            opt.step()
            losses.append(float(loss.detach()))
            if epoch - losses.index(min(losses)) > _PRETRAIN_CONVERGED:
                break
        return len(losses)

    def _forward(self, pretrain: bool) -> torch.Tensor:
        c = self.ctx
        n = c.x.shape[0]
        h = self.encoder(c.x, self.adj)
        new, labels, srcs, nbrs = [], [], [], []
        for cls, r in self.rounds:
            h_r = h[r]
            nb = same_class_nearest_neighbour(h_r)
            new.append(smote_interpolate(h_r, nb, c.generator,
                                         per_node=self.cfg.smote_lambda == "node"))
            labels.append(torch.full((r.numel(),), cls, dtype=torch.long, device=h.device))
            srcs.append(r)
            nbrs.append(r[nb])                       # the neighbour's GLOBAL id (LTE4G fix)
        h_all = torch.cat([h, *new])
        z = self.decoder.embed(h_all)
        l_rec = recon_loss(z[:n], c.graph)
        if pretrain:
            return l_rec
        if new:
            ck, cj = candidate_edges(c.graph, torch.cat(srcs), torch.cat(nbrs))
        else:
            ck = cj = torch.zeros(0, dtype=torch.long, device=h.device)
        # training: always the row-normalised B (official), whatever adj_norm
        b = augmented_adjacency(c.graph, z, ck, cj, self.variant, self.cfg.edge_grad, "row")
        logits = self.classifier(h_all, b)
        train = torch.cat([c.train_idx, n + torch.arange(h_all.shape[0] - n, device=h.device)])
        y_all = torch.cat([c.y, *labels])
        return F.cross_entropy(logits[train], y_all[train]) + self.cfg.rec_weight * l_rec

    def info(self) -> dict:
        return {"num_synthetic": self.num_synthetic}


class GraphSmoteT(_GraphSmote):
    """§2.6 GraphSMOTE_T: thresholded predicted edges (P ≥ 0.5) of the synthetic nodes."""

    name = "graphsmote_t"
    variant = "t"


class GraphSmoteO(_GraphSmote):
    """§2.7 GraphSMOTE_O: continuous predicted edge weights P of the synthetic nodes; detached
    as the HierTail copy does (the decoder learns from rw·L_rec only), or with
    ``edge_grad=True`` differentiable (the paper's / original repo's ``--opt_new_G``: the node
    loss also trains the edge generator)."""

    name = "graphsmote_o"
    variant = "o"


METHODS.update({m.name: m for m in (GraphSmoteT, GraphSmoteO)})
