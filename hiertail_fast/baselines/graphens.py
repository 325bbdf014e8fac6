"""GraphENS (Park et al., ICLR'22) as its official code runs it (PROTOCOL_AND_BASELINES.md §2.10),
on the HierTail harness, in O(n·F + n·h + |E| + s·(F + deg)) memory.

Every training step (one harness epoch; the official epoch counter is ``steps``, from 1) builds
s = Σ_c (max_c' n_c' − n_c) synthetic ego networks, one per draw:

1. pairs: for every class, (max − n_c) sources drawn uniformly with replacement from its
   training nodes; as many destinations from all training nodes with probability ∝ log(n_c)/n_c;
   pairs sorted by source; λ ~ Beta(2, 2) per synthetic node (the median of three uniforms).
2. steps ≤ ``warmup_epochs`` (1): the synthetic node gets its source's neighbours (edges point
   INTO the synthetic node only) and the features λ·x_src + (1 − λ)·x_dst.
   Later steps: p = softmax(mean_{self+nbrs}(previous step's logits) / τ), KL = KL(p_src‖p_dst)
   clipped at 0, [w_src, w_dst] = softmax([0, −KL]); the neighbours are the first d_i draws
   without replacement from w_src·N[src] + w_dst·N[dst] (N[j] = the uniform distribution on j's
   neighbours), d_i drawn from the degree histogram and capped at deg(src); features: the
   saliency-masked mixup (`saliency_mixup`) with g = |∂L/∂X| of the previous backward.
3. L = CE over the training nodes and the synthetic nodes (labelled with the source's class).

The backbone is the official GCN: 2 × (mean-aggregating conv D⁻¹(A+I) — the repo's gcn_norm
uses the target degree twice —, ReLU), dropout, Linear; weight decay on the convolutions only.
Evaluation runs on the original graph (no edge points out of a synthetic node).

Memory: the official code builds N as a dense n×n matrix (a Python loop over nodes) and mixes and
samples dense s×n rows. Here N is the graph itself: row j's support is j's neighbour list and
its value 1/deg(j), so the mixture of row src and row dst lives on N(src) ∪ N(dst) and is built
sparsely (`mixed_neighbour_distribution`, O(Σ deg(src) + deg(dst))). Sampling k nodes without
replacement ∝ w is exactly taking the k largest log w_j + G_j with G_j iid Gumbel(0, 1) (the
Gumbel-top-k trick), so it is done on the support alone; the Gumbel noise of a (row, column) pair
is a counter-based hash of (step seed, row, column) (`hashed_gumbel`), so the dense reference
(`sample_neighbours_dense`, the official s×n construction) draws the very same nodes. The
official 1e-12 floor on every column is dropped: the support always holds ≥ deg(src) ≥ d_i nodes,
so the floor only gave off-support nodes a ~1e-12 chance.

Deviations (recorded by `info`): the harness's split, model selection on val Macro-F1 and fixed
lr (the official code selects by val accuracy with ReduceLROnPlateau over 2,000 epochs); the
harness's raw features (the official code row-normalises them); a self-loop of the harness's A+I
is not a neighbour in N or the degree (the official data has none; the conv adds its own); a
saliency mask of ⌊F·keep_prob⌋ = 0 features is no mask (the official code fails there).
"""
from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from hiertail_fast.baselines.config import BaselineConfig
from hiertail_fast.baselines.layers import GraphConv, adjacency_operator
from hiertail_fast.baselines.methods import METHODS, MethodContext, OwnArchitectureMethod
from hiertail_fast.baselines.sampling import _gather_rows
from hiertail_fast.graph import CSRGraph

_M32 = 0xFFFFFFFF
N_LAYERS = 2   # official n_layer


def _mul32(x: torch.Tensor, c: int) -> torch.Tensor:
    """x·c mod 2³² for x in [0, 2³²), in 16-bit halves so no int64 product overflows."""
    lo, hi = c & 0xFFFF, c >> 16
    return (x * lo + (((x * hi) & 0xFFFF) << 16)) & _M32


def _mix32(x: torch.Tensor) -> torch.Tensor:
    """The 'lowbias32' integer hash (C. Wellons): a bijection of [0, 2³²) with good avalanche."""
    x = x ^ (x >> 16)
    x = _mul32(x, 0x7FEB352D)
    x = x ^ (x >> 15)
    x = _mul32(x, 0x846CA68B)
    return x ^ (x >> 16)


def hashed_gumbel(seed: int, a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """Gumbel(0, 1) noise, float64, for every (a, b) pair (int64 ids in [0, 2³²), broadcast):
    a pure function of (seed, a, b), so any subset of pairs, in any order, on any device, gets
    the numbers the full dense grid would."""
    s = _mix32(torch.tensor(int(seed) & _M32, dtype=torch.long, device=a.device))
    h = _mix32(_mix32(s ^ a.long()) ^ b.long())
    u = (h.double() + 0.5) / 2.0**32                      # in (0, 1), never 0 or 1
    return -torch.log(-torch.log(u))


def grouped_topk(group: torch.Tensor, keys: torch.Tensor, k: torch.Tensor) -> torch.Tensor:
    """Positions of the ``k[g]`` largest ``keys`` of every group g (``group`` int64 ids into
    ``k``), groups ascending, keys descending inside a group. O(m log m) for m entries."""
    order = torch.argsort(keys, descending=True, stable=True)
    order = order[torch.argsort(group[order], stable=True)]
    g = group[order]
    counts = torch.bincount(g, minlength=k.numel())
    start = torch.cumsum(counts, 0) - counts
    rank = torch.arange(g.numel(), device=g.device) - start[g]
    return order[rank < k[g]]


def mixed_neighbour_distribution(nbrs: CSRGraph, src: torch.Tensor, dst: torch.Tensor,
                                 w_src: torch.Tensor, w_dst: torch.Tensor):
    """(i, j, p) with p = w_src[i]·N[src_i, j] + w_dst[i]·N[dst_i, j] > 0, N[v] = the uniform
    distribution on v's neighbours in ``nbrs`` (CSR row v; no self-loops), sorted by (i, j).
    O(Σ deg(src_i) + deg(dst_i)) memory; the official dense rows are O(s·n)."""
    n = nbrs.num_nodes
    deg = (nbrs.indptr[1:] - nbrs.indptr[:-1]).to(torch.float32)
    inv = torch.where(deg > 0, 1.0 / deg.clamp_min(1.0), torch.zeros_like(deg))   # N's values
    k1, c1, _ = _gather_rows(nbrs, src)
    k2, c2, _ = _gather_rows(nbrs, dst)
    vals = torch.cat([w_src[k1] * inv[src[k1]], w_dst[k2] * inv[dst[k2]]])
    key, where = torch.unique(torch.cat([k1 * n + c1, k2 * n + c2]), return_inverse=True)
    p = torch.zeros(key.numel(), dtype=vals.dtype, device=vals.device).index_add_(0, where, vals)
    return key // n, key % n, p


def sample_neighbours(nbrs: CSRGraph, src: torch.Tensor, dst: torch.Tensor, w_src: torch.Tensor,
                      w_dst: torch.Tensor, degree: torch.Tensor, seed: int):
    """(i, j): synthetic node i's neighbours, the first ``degree[i]`` draws without replacement
    from its mixed distribution (Gumbel-top-k on its support), in draw order."""
    i, j, p = mixed_neighbour_distribution(nbrs, src, dst, w_src, w_dst)
    keys = torch.log(p.double()) + hashed_gumbel(seed, i, j)
    sel = grouped_topk(i, keys, degree.to(i.device))
    return i[sel], j[sel]


def neighbour_distribution_dense(nbrs: CSRGraph) -> torch.Tensor:
    """The official dense N [n, n] (test oracle, O(n²)): row v = L1-normalised indicator of v's
    neighbours."""
    n = nbrs.num_nodes
    a = torch.zeros(n, n)
    a[nbrs.row_index(), nbrs.indices] = 1.0
    return F.normalize(a, p=1, dim=1)


def sample_neighbours_dense(dist: torch.Tensor, src: torch.Tensor, dst: torch.Tensor,
                            w_src: torch.Tensor, w_dst: torch.Tensor, degree: torch.Tensor,
                            seed: int):
    """The official construction (test oracle, O(s·n)): dense mixed rows, then the first d_i
    draws of each, with the same Gumbel noise as `sample_neighbours` (no 1e-12 floor)."""
    mixed = w_src[:, None] * dist[src] + w_dst[:, None] * dist[dst]
    s, n = mixed.shape
    keys = torch.log(mixed.double()) + hashed_gumbel(seed, torch.arange(s)[:, None],
                                                     torch.arange(n)[None, :])
    order = torch.argsort(keys, dim=1, descending=True, stable=True)
    take = torch.arange(n)[None, :] < degree[:, None]
    return torch.arange(s)[:, None].expand(s, n)[take], order[take]


def saliency_mixup(x: torch.Tensor, src: torch.Tensor, dst: torch.Tensor, lam: torch.Tensor,
                   saliency: torch.Tensor | None = None, kl: torch.Tensor | None = None,
                   keep_prob: float = 0.01, seed: int = 0) -> torch.Tensor:
    """The synthetic features [s, F]: Λ·x_src + (1 − Λ)·x_dst with Λ = λ_i everywhere except the
    saliency mask, where Λ = 1 (the source's value). The mask: K = ⌊F·keep_prob⌋ features drawn
    without replacement ∝ |saliency[dst]| + 1e-10; with ``kl`` only the first ⌊σ(KL_i/3)·K⌋
    draws count (the rest are replaced by the first draw, so at least one is kept). No
    ``saliency`` (warmup) or K = 0: plain mixup."""
    s, f = src.numel(), x.shape[1]
    lam_m = lam.reshape(-1, 1).to(x.dtype).expand(s, f).clone()
    k = int(f * keep_prob)
    if saliency is not None and k > 0 and s > 0:
        g = saliency[dst].abs() + 1e-10
        g = g / g.sum(1, keepdim=True)
        rows = torch.arange(s, device=x.device)
        keys = torch.log(g.double()) + hashed_gumbel(seed, rows[:, None],
                                                     torch.arange(f, device=x.device)[None, :])
        idx = keys.topk(k, dim=1).indices                      # in draw order
        if kl is not None:
            keep = (torch.sigmoid(kl.reshape(-1) / 3.0) * k).long()
            late = torch.arange(k, device=x.device)[None, :] >= keep[:, None]
            idx = torch.where(late, idx[:, :1], idx)
        lam_m.scatter_(1, idx, 1.0)
    return lam_m * x[src] + (1.0 - lam_m) * x[dst]


class GraphENS(OwnArchitectureMethod):
    """§2.10 GraphENS (see the module docstring). ``steps`` counts training steps."""

    name = "graphens"

    def __init__(self, ctx: MethodContext, cfg: BaselineConfig) -> None:
        super().__init__(ctx, cfg)             # struct = unit-weight A+I, adj = its mean
        f = ctx.x.shape[1]
        self.nbrs = self.struct.remove_self_loops()
        self.deg = self.nbrs.indptr[1:] - self.nbrs.indptr[:-1]
        self.degree_hist = torch.bincount(self.deg.cpu()).double()   # official degree_dist
        dims = [f] + [cfg.hidden] * N_LAYERS
        self.convs = nn.ModuleList(GraphConv(a, b)
                                   for a, b in zip(dims[:-1], dims[1:], strict=True))
        for conv in self.convs:                      # PyG GCNConv: glorot weight, zero bias
            nn.init.xavier_uniform_(conv.weight)
            nn.init.zeros_(conv.bias)
        self.linear = nn.Linear(cfg.hidden, ctx.num_classes)
        # per class its training nodes by ascending id (official idx_info); empty classes skipped
        train = ctx.train_idx.sort().values
        y_train = ctx.y[train]
        order = torch.argsort(y_train, stable=True)
        self.pool = train[order]                           # idx_info concatenated
        counts = torch.bincount(y_train, minlength=ctx.num_classes).cpu()
        present = counts > 0
        self.class_count = counts[present]
        self.class_start = (torch.cumsum(counts, 0) - counts)[present]
        self.draws = int(counts.max()) - self.class_count        # max − n_c per class
        self.num_synthetic = int(self.draws.sum())
        logn = torch.log(counts.double())                        # destinations ∝ log n_c / n_c
        self.dst_prob = torch.where(present, logn / counts.clamp_min(1), 0.0).repeat_interleave(
            counts)
        self.keep_features = int(f * cfg.keep_prob)
        self.steps = 0
        self._prev_logits: torch.Tensor | None = None
        self._saliency: torch.Tensor | None = None

    def forward(self, x: torch.Tensor, adj: torch.Tensor) -> torch.Tensor:
        for conv in self.convs:
            x = F.relu(conv(x, adj))
        return self.linear(F.dropout(x, self.cfg.dropout, self.training))

    def predict(self) -> torch.Tensor:
        return self(self.ctx.x, self.adj)

    def param_groups(self) -> list[dict]:
        return [{"params": list(self.convs.parameters())},
                {"params": list(self.linear.parameters()), "weight_decay": 0.0}]

    def sample_pairs(self) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """(src, dst, λ) of this step's s synthetic nodes, sorted by source."""
        gen, dev = self.ctx.generator, self.ctx.x.device
        s = self.num_synthetic
        cls = torch.repeat_interleave(torch.arange(self.draws.numel()), self.draws)
        u = torch.rand(s, generator=gen, dtype=torch.float64)
        local = torch.minimum((u * self.class_count[cls]).long(), self.class_count[cls] - 1)
        src = self.pool[(self.class_start[cls] + local).to(dev)]
        dst = self.pool[torch.multinomial(self.dst_prob, s, replacement=True,
                                          generator=gen).to(dev)] if s else src
        src, order = torch.sort(src, stable=True)
        lam = torch.rand(s, 3, generator=gen).median(dim=1).values    # Beta(2, 2)
        return src, dst[order], lam.to(dev)

    def _keep_saliency(self, grad: torch.Tensor) -> None:
        self._saliency = grad[: self.ctx.x.shape[0]].detach()

    def train_loss(self) -> torch.Tensor:
        c = self.ctx
        n, dev = c.x.shape[0], c.x.device
        self.steps += 1
        s = self.num_synthetic
        src, dst, lam = self.sample_pairs()
        seed_nb, seed_sal = torch.randint(0, 2**31 - 1, (2,), generator=c.generator).tolist()
        if self.steps > self.cfg.warmup_epochs and self._prev_logits is not None:
            with torch.no_grad():
                p = F.softmax((self.adj @ self._prev_logits) / self.cfg.pred_temp, dim=1)
                kl = F.kl_div(torch.log(p[dst]), p[src], reduction="none").sum(1).clamp_min(0)
                w = F.softmax(torch.stack([torch.zeros_like(kl), -kl], 1), dim=1)
                d = torch.multinomial(self.degree_hist, s, replacement=True,
                                      generator=c.generator).to(dev) if s else src
                d = torch.minimum(d, self.deg[src])
                i, j = sample_neighbours(self.nbrs, src, dst, w[:, 0], w[:, 1], d, seed_nb)
            mixed = saliency_mixup(c.x, src, dst, lam, self._saliency, kl,
                                   self.cfg.keep_prob, seed_sal)
        else:                                       # warmup: the source's neighbours, mixup
            i, j, _ = _gather_rows(self.nbrs, src)
            mixed = saliency_mixup(c.x, src, dst, lam)
        x_in = torch.cat([c.x, mixed]).detach().requires_grad_(True)
        x_in.register_hook(self._keep_saliency)     # |∂L/∂X| for the next step's mask
        new = n + torch.arange(s, device=dev)
        aug = CSRGraph._from_coo(torch.cat([self.struct.row_index(), n + i, new]),
                                 torch.cat([self.struct.indices, j, new]), None, n + s,
                                 dedupe=False)
        out = self(x_in, adjacency_operator(aug, "row"))
        self._prev_logits = out[:n].detach()
        idx = torch.cat([c.train_idx, new])
        y_all = torch.cat([c.y, c.y[src]])
        return F.cross_entropy(out[idx], y_all[idx])

    def info(self) -> dict:
        w = self.cfg.warmup_epochs
        return {"num_synthetic_per_epoch": self.num_synthetic,
                "saliency_features_kept": self.keep_features,
                "training_steps": self.steps,
                "schedule": f"one harness epoch = one official GraphENS epoch: epochs 1..{w} "
                            "warmup (source's neighbours, plain mixup), then neighbour sampling "
                            "and saliency mixup; no LR scheduler, selection by val Macro-F1",
                "aggregation": "mean, D^-1(A+I) (official gcn_norm)"}


METHODS[GraphENS.name] = GraphENS
