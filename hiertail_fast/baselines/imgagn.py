"""ImGAGN (Qu et al., KDD'21), multi-class, on the HierTail harness (PROTOCOL_AND_BASELINES.md
§2.9), in O((n+s)·(F+h) + |E| + Σ_c s_c·n_c) memory.

The official code is binary (minority vs majority). Our multi-class adaptation follows the
spec's recommendation:

- tail classes: the last ``im_class_num`` labels (3), as the harness's other up-sampling
  baselines. A tail class c with n_c ≥ 1 training nodes gets its own generator G_c (the official
  MLP: z ∈ ℝ¹⁰⁰ ~ N(0, I), 100 → 200 → 200 → n_c, ReLU, ReLU, (tanh + 1)/2) and
  s_c = ⌊gen_ratio·max_c' n_c'⌋ − n_c generated nodes labelled c (official: ratio·|majority| −
  |minority| nodes labelled minority). Generators are independent, so summing their losses
  gives each its own official gradient.
- generated node j of class c: a_j = softmax(G_c(z_j)) over class c's training nodes X_c,
  features a_j·X_c, linked both ways to every training node i of class c with a_ji > 1/n_c; the
  graph max(A, Aᵀ) + I, row-normalised (official ``add_edges``).
- discriminator D: gc1 (F→h), ReLU, dropout, then a class head gc2 (h→C) and a real/fake head
  gc3 (h→2), GraphConv layers on that graph. L_D = CE_class(training + generated nodes) +
  CE_real/fake(training nodes = real 0, generated = fake 1).
- L_G = Σ_c CE_real/fake(D(x_gen) → real) + CE_class(D(x_gen) → c) + mean_{i, j} ‖x_i − x_gen_j‖₂
  (official ``euclidean_dist``). D sees the generated nodes as the official code does, on the
  graph where they only have a self-loop, i.e. alone (Â's row is [1]); its parameters are
  detached and its dropout off. Faithful (``gen_adv_grad=False``): the features are detached
  too (the official ``.data``), so only the distance trains G; True: they are not.

Schedule on the harness's epochs (one optimiser step each): cycles of ``disc_steps`` + 1 epochs.
The first epoch of a cycle draws z and generates the cycle's nodes with the current G (fixed
for the cycle: buffers ``gen_weight_k``, so the harness's best state restores them); epochs 0 ..
disc_steps − 1 of the cycle are D steps, the last one is the G step on the same z. That is the
official order (epochs_gen × [generate, ``epochs`` D steps, G step], 10 × (100 + 1)); the
harness's early stopping picks the number of cycles. Each step reaches one side only, the other
side's gradients stay None and the shared Adam skips it: the update of the official two Adams
(equal lr and weight decay).

Deviations (recorded by `info`): the harness's split and val-Macro-F1 selection replace the
official 10-fold CV on the training nodes and its (recall + acc)/2 selection; G's output covers
the class's training nodes only (official: training + TEST minority nodes, the test columns
unused — label leakage); the official constant −mean‖X_min − X_maj‖ in L_D is dropped (no
gradient; O(|min|·|maj|·F)); the G step's D outputs use the current D (official: the D before
the cycle's D steps — no gradient reaches D or, faithfully, G, either way); the harness's raw
features (official: row-normalised). Evaluation: D on the graph with the cycle's generated nodes,
as the official code.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from hiertail_fast.baselines.config import BaselineConfig
from hiertail_fast.baselines.layers import GraphConv, adjacency_operator
from hiertail_fast.baselines.methods import METHODS, MethodContext, OwnArchitectureMethod
from hiertail_fast.baselines.sampling import check_synthetic_count, tail_classes
from hiertail_fast.graph import CSRGraph

NOISE_DIM, GEN_HIDDEN = 100, 200   # official Generator


class Generator(nn.Module):
    """z [s, 100] -> [s, out] in (0, 1): Linear 100→200, ReLU, 200→200, ReLU, 200→out,
    (tanh + 1)/2 (official ``Generator``; PyTorch's default Linear init)."""

    def __init__(self, out_features: int) -> None:
        super().__init__()
        self.fc1 = nn.Linear(NOISE_DIM, GEN_HIDDEN)
        self.fc2 = nn.Linear(GEN_HIDDEN, GEN_HIDDEN)
        self.fc3 = nn.Linear(GEN_HIDDEN, out_features)

    def forward(self, z: torch.Tensor) -> torch.Tensor:
        return (torch.tanh(self.fc3(F.relu(self.fc2(F.relu(self.fc1(z)))))) + 1.0) / 2.0


class Discriminator(nn.Module):
    """gc1 (F→h), ReLU, dropout; class head gc2 (h→C), real/fake head gc3 (h→2)."""

    def __init__(self, in_features: int, hidden: int, num_classes: int, dropout: float) -> None:
        super().__init__()
        self.gc1 = GraphConv(in_features, hidden)
        self.gc2 = GraphConv(hidden, num_classes)
        self.gc3 = GraphConv(hidden, 2)
        self.dropout = float(dropout)

    def forward(self, x: torch.Tensor, adj: torch.Tensor):
        h = F.dropout(F.relu(self.gc1(x, adj)), self.dropout, self.training)
        return self.gc2(h, adj), self.gc3(h, adj)

    def alone(self, x: torch.Tensor):
        """(class, real/fake) logits of nodes whose only edge is their self-loop (Â row [1]),
        no dropout, parameters detached (no gradient reaches D)."""
        w = {k: p.detach() for k, p in self.named_parameters()}
        h = F.relu(x @ w["gc1.weight"] + w["gc1.bias"])
        return h @ w["gc2.weight"] + w["gc2.bias"], h @ w["gc3.weight"] + w["gc3.bias"]


def euclidean_dist(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    """[m, k] distances ‖x_i − y_j‖₂ as the official code computes them (squared norms minus
    2xyᵀ, clamped at 1e-12 before the square root: finite gradients at 0)."""
    d = x.pow(2).sum(1, keepdim=True) + y.pow(2).sum(1)[None, :] - 2.0 * x @ y.T
    return d.clamp_min(1e-12).sqrt()


def generated_graph(struct: CSRGraph, owners: list[torch.Tensor],
                    weights: list[torch.Tensor]) -> CSRGraph:
    """Unit-weight graph [n+s, n+s]: ``struct`` (A+I), then per block k the generated nodes
    (numbered in block order after n) linked both ways to ``owners[k][i]`` where
    ``weights[k][j, i]`` > 1/n_k, plus their self-loops. O(|E| + Σ s_k·n_k)."""
    n = struct.num_nodes
    rows, cols = [struct.row_index()], [struct.indices]
    offset = n
    for nodes, a in zip(owners, weights, strict=True):
        j, i = torch.nonzero(a > 1.0 / a.shape[1], as_tuple=True)
        rows += [offset + j, nodes[i]]
        cols += [nodes[i], offset + j]
        offset += a.shape[0]
    loops = torch.arange(n, offset, device=struct.device)
    return CSRGraph._from_coo(torch.cat(rows + [loops]), torch.cat(cols + [loops]), None, offset,
                              dedupe=False)


def generated_graph_dense(adj: torch.Tensor, owners: list[torch.Tensor],
                          weights: list[torch.Tensor]) -> torch.Tensor:
    """The official construction (test oracle, O((n+s)²)): adj [n, n] without self-loops plus
    the generated → owner entries, max(A, Aᵀ), + I, row-normalised."""
    n, s = adj.shape[0], sum(a.shape[0] for a in weights)
    big = torch.zeros(n + s, n + s)
    big[:n, :n] = adj
    offset = n
    for nodes, a in zip(owners, weights, strict=True):
        j, i = torch.nonzero(a > 1.0 / a.shape[1], as_tuple=True)
        big[offset + j, nodes[i]] = 1.0
        offset += a.shape[0]
    big = torch.maximum(big, big.T) + torch.eye(n + s)
    return big / big.sum(1, keepdim=True)


class ImGAGN(OwnArchitectureMethod):
    """§2.9 ImGAGN, multi-class (see the module docstring). ``steps`` counts training steps."""

    name = "imgagn"
    uses_tail = True

    def __init__(self, ctx: MethodContext, cfg: BaselineConfig) -> None:
        super().__init__(ctx, cfg)     # D and G replace encoder / classifier; adj = D^-1(A+I)
        f = ctx.x.shape[1]
        self.disc = Discriminator(f, cfg.hidden, ctx.num_classes, cfg.dropout)
        train = ctx.train_idx.sort().values
        y_train = ctx.y[train]
        n_max = int(torch.bincount(y_train, minlength=ctx.num_classes).max())
        self.blocks: list[tuple[int, torch.Tensor, int]] = []     # (class, its nodes, s_c)
        gens = []
        planned = 0
        for c in tail_classes(ctx.num_classes, cfg.im_class_num):
            nodes = train[y_train == c]
            s_c = int(cfg.gen_ratio * n_max) - nodes.numel()
            if nodes.numel() == 0 or s_c <= 0:
                continue
            planned += s_c
            check_synthetic_count(planned, ctx.x.shape[0], f"gen_ratio={cfg.gen_ratio}")
            self.register_buffer(f"gen_weight_{len(gens)}", torch.zeros(s_c, nodes.numel()))
            self.blocks.append((c, nodes, s_c))
            gens.append(Generator(nodes.numel()))
        self.generators = nn.ModuleList(gens)
        self.register_buffer("generated", torch.tensor(False))
        self.num_synthetic = sum(s for _, _, s in self.blocks)
        self.steps = self.generator_steps = self.discriminator_steps = 0
        self._z: list[torch.Tensor] = []
        self._cache = None
        self.register_load_state_dict_post_hook(lambda module, _keys: module._drop_cache())

    def _drop_cache(self) -> None:
        self._cache = None

    def gen_weights(self) -> list[torch.Tensor]:
        return [getattr(self, f"gen_weight_{k}") for k in range(len(self.blocks))]

    def augmented(self):
        """(X_aug [n+s, F], row-normalised Â_aug, labels of the generated nodes) of the
        current cycle, rebuilt only when the generated weights change."""
        if self._cache is None:
            x = self.ctx.x
            ws = self.gen_weights()
            feats = [a @ x[nodes] for a, (_, nodes, _) in zip(ws, self.blocks, strict=True)]
            graph = generated_graph(self.struct, [nodes for _, nodes, _ in self.blocks], ws)
            labels = torch.cat([torch.full((s,), c, dtype=torch.long, device=x.device)
                                for c, _, s in self.blocks] or [self.ctx.y[:0]])
            self._cache = (torch.cat([x, *feats]), adjacency_operator(graph, "row"), labels)
        return self._cache

    def generate(self) -> None:
        """A new cycle: fresh z per block (the run's generator), a = softmax(G(z)) stored."""
        dev = self.ctx.x.device
        self._z = [torch.randn(s, NOISE_DIM, generator=self.ctx.generator,
                               dtype=self.ctx.x.dtype).to(dev) for _, _, s in self.blocks]
        with torch.no_grad():
            for buf, g, z in zip(self.gen_weights(), self.generators, self._z, strict=True):
                buf.copy_(F.softmax(g(z), dim=1))
        self.generated.fill_(True)
        self._drop_cache()

    def forward(self, x: torch.Tensor, adj: torch.Tensor) -> torch.Tensor:
        return self.disc(x, adj)[0]

    def predict(self) -> torch.Tensor:
        if not bool(self.generated) or not self.blocks:
            return self(self.ctx.x, self.adj)
        x_aug, adj, _ = self.augmented()
        return self(x_aug, adj)[: self.ctx.x.shape[0]]

    def train_loss(self) -> torch.Tensor:
        cycle = self.cfg.disc_steps + 1
        pos = self.steps % cycle
        self.steps += 1
        if self.blocks and pos == 0:
            self.generate()
        if not self.blocks or pos < self.cfg.disc_steps:
            self.discriminator_steps += 1
            return self.discriminator_loss()
        self.generator_steps += 1
        return self.generator_loss()

    def discriminator_loss(self) -> torch.Tensor:
        c = self.ctx
        n = c.x.shape[0]
        if self.blocks:
            x_aug, adj, labels = self.augmented()
        else:
            x_aug, adj, labels = c.x, self.adj, c.y[:0]
        cls, rf = self.disc(x_aug, adj)
        idx = torch.cat([c.train_idx, n + torch.arange(labels.numel(), device=c.x.device)])
        y = torch.cat([c.y[c.train_idx], labels])
        fake = torch.cat([torch.zeros_like(c.train_idx), torch.ones_like(labels)])
        return F.cross_entropy(cls[idx], y) + F.cross_entropy(rf[idx], fake)

    def generator_loss(self) -> torch.Tensor:
        adv = self.cfg.gen_adv_grad
        c_x, total = self.ctx.x, None
        for (cls_id, nodes, s), g, z in zip(self.blocks, self.generators, self._z, strict=True):
            x_c = c_x[nodes]
            x_gen = F.softmax(g(z), dim=1) @ x_c
            with torch.set_grad_enabled(adv and torch.is_grad_enabled()):
                cls, rf = self.disc.alone(x_gen if adv else x_gen.detach())
                real = torch.zeros(s, dtype=torch.long, device=x_gen.device)
                adv_loss = F.cross_entropy(rf, real) + F.cross_entropy(cls, real + cls_id)
            loss = adv_loss + euclidean_dist(x_c, x_gen).mean()
            total = loss if total is None else total + loss
        return total

    def info(self) -> dict:
        k = self.cfg.disc_steps
        return {"num_synthetic": self.num_synthetic,
                "generated_per_class": {str(c): s for c, _, s in self.blocks},
                "generator_steps": self.generator_steps,
                "discriminator_steps": self.discriminator_steps,
                "schedule": f"cycles of {k + 1} harness epochs: generate with the current G, "
                            f"{k} discriminator epochs, 1 generator epoch (official: 10 x "
                            "(100 + 1)); no 10-fold CV, selection by val Macro-F1",
                "aggregation": "row, D^-1(max(A, A^T) + I) (official)"}


METHODS[ImGAGN.name] = ImGAGN
