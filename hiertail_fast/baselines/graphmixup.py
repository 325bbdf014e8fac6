"""GraphMixup (PROTOCOL_AND_BASELINES.md §2.8) with the GCN backbone, in linear memory.

Per epoch (train mode): H = Encoder(X, A) — A the raw binarised adjacency without self-loops as
the official code (``self_loops=True``: A+I), unnormalised unless ``adj_norm="row"``; mixup of
each tail class (`mixup_rounds`, the RL scale k entering the round count) in the embedding
space: h_new = H_v + λ(H_nn − H_v), one λ per round, the nearest neighbour from the detached
embeddings of the class (``mixup_neighbour="local"`` reproduces the official bug: the
neighbour's index INSIDE the class is used as a node id, for its embedding and its edges);
z = [H; h_new] Wᵀ, P = σ(z zᵀ); the synthetic nodes' candidate edges cand = A[v] ∪ A[nn] get
weight P (``edge_mode="continuous"``, NOT detached) or 1[P ≥ 0.5] (``"discrete"``, detached),
no synthetic–synthetic edge; logits = Classifier([H; h_new], B) — P evaluated only at the
candidates and B applied as an operator (`AugmentedAdjacency`), never an (n+s)² matrix.

Losses: L_rec = adj_mse_loss(P[:n, :n], A) / n (`graphsmote.recon_loss`: blocked, O(block·n)
memory, O(n²h) time — the math is a sum over all n² pairs); L_dis = NLL of
log-softmax(Linear(|h_u − h_v|)) on the sampled local-path pairs; L_clu = MSE(Linear(H), T)
with the global-path targets T [n, clu_nclass] (`mixup_targets`: no n×n matrix anywhere).

Phases on the harness's epochs (the harness steps ONE Adam over all parameters per epoch; a
parameter without a gradient is not stepped, so the official three Adams are reproduced):
- epochs [0, P): pre-train, L = L_rec + dis_w·L_dis + clu_w·L_clu + 0·CE — every module steps,
  the classifier only by weight decay, as the official code. P = ``pretrain_epochs``, default
  min(2010, epochs // 2): the official 2,010, but at most half the run.
- epochs [P, …): fine-tune, L = CE over training + synthetic nodes; the decoder's weight is
  detached (the official ``optimizer_de`` does not step) but the edge weights P still carry the
  gradient to the encoder. From fine-tune epoch ``q_start_epoch`` (50) the Q-agent
  (`QLearningScale`) moves k until its stopping rule fires; its reward is the change of the
  validation Macro-F1 of the TRAINING forward pass (dropout on, augmented graph), as official.
Model selection is the harness's (eval-mode val Macro-F1, patience), not the official
every-5-epochs test-set check (the spec's recommendation), over the fine-tune epochs only, as
the official early stopping (``selection_start``): the pre-train's classifier does not learn,
and until 2026-11-26 the harness validated and selected from epoch 0 with P capped at the
patience, so a run whose validation F1 peaked early in the pre-train stopped ~2 epochs into
fine-tuning (3 of 10 Email seeds with ``adj_norm="row"``: bAcc ~2 %).
"""
from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from hiertail_fast.baselines.config import BaselineConfig
from hiertail_fast.baselines.graphsmote import Decoder, candidate_edges, recon_loss
from hiertail_fast.baselines.layers import AugmentedAdjacency, adjacency_operator
from hiertail_fast.baselines.methods import METHODS, BaselineMethod, MethodContext
from hiertail_fast.baselines.mixup_targets import (
    cluster_centres,
    global_path_targets,
    local_path_pairs,
    partition,
    raw_adjacency,
)
from hiertail_fast.baselines.sampling import (
    check_synthetic_count,
    same_class_nearest_neighbour,
    tail_rounds,
)
from hiertail_fast.metrics import macro_f1

OFFICIAL_PRETRAIN_EPOCHS = 2010


def mixup_rounds(y: torch.Tensor, train_idx: torch.Tensor, num_classes: int,
                 im_class_num: int, up_scale: float, scale: float
                 ) -> list[tuple[int, torch.Tensor]]:
    """[(class c, source nodes of one round)], the official ``utils.mixup`` order: per tail
    class (C−1, C−2, …) with T_c its training nodes, n_c = |T_c|, avg = ⌊|train|/C⌋:
    up_scale = 0: r = ⌊avg/n_c + k⌋ − 1 full rounds over T_c and a last round over the first
    ⌊n_c·(avg/n_c + k − 1 − r)⌋ (none when r < 0); up_scale > 0: ⌊up_scale⌋ full rounds and
    one over the first ⌊n_c·(up_scale − ⌊up_scale⌋)⌋. k = ``scale`` (the Q-agent's). Empty
    rounds and classes without training nodes are skipped (the official code crashes there)."""

    def parts(n_c: int, avg: int) -> list[int]:
        if up_scale == 0:
            full = int(avg / n_c + scale) - 1
            rest = avg / n_c + scale - 1 - full if full >= 0 else 0.0
            full = max(full, 0)
        else:
            full, rest = int(up_scale), up_scale - int(up_scale)
            check_synthetic_count(full * n_c, y.shape[0], f"up_scale={up_scale}")
        return [n_c] * full + ([int(n_c * rest)] if rest != 0 else [])

    return tail_rounds(y, train_idx, num_classes, im_class_num, up_scale, parts)


def mixup_embeddings(h: torch.Tensor, rounds: list[tuple[int, torch.Tensor]],
                     generator: torch.Generator, neighbour: str = "global"):
    """(h_new [s, d], labels [s], sources [s], neighbours [s]) of the rounds: for round nodes
    R, nn = the nearest other node of R by the detached embeddings (local index); the
    neighbour's node id is R[nn] (``"global"``) or nn itself (``"local"``: the official bug);
    h_new = h[R] + λ(h[nb] − h[R]), one λ ~ U(0, 1) per round from ``generator``,
    differentiable in h through both endpoints."""
    if neighbour not in ("global", "local"):
        raise ValueError(f"neighbour must be 'global' or 'local', got {neighbour!r}")
    new, labels, srcs, nbrs = [], [], [], []
    for cls, r in rounds:
        nn_local = same_class_nearest_neighbour(h[r])
        nb = r[nn_local] if neighbour == "global" else nn_local
        lam = torch.rand(1, generator=generator, dtype=torch.float64).item()
        # nb repeats: index_select (reproducible backward; see reference/gcn_propagate.py)
        new.append(h[r] + (h.index_select(0, nb) - h[r]) * lam)
        labels.append(torch.full((r.numel(),), cls, dtype=torch.long, device=h.device))
        srcs.append(r)
        nbrs.append(nb)
    if not new:
        empty = torch.zeros(0, dtype=torch.long, device=h.device)
        return h.new_zeros(0, h.shape[1]), empty, empty, empty
    return torch.cat(new), torch.cat(labels), torch.cat(srcs), torch.cat(nbrs)


class QLearningScale:
    """The official tabular Q-learning of the up-sampling scale k (``QLearning.py``).

    State: str(k) (Python float, as official, so 0.1 + 0.05 is its own state). Actions: 0 =
    k + step (capped at +1), 1 = k − step (floored at −1). Reward: sign(F1_now − F1_before).
    Every transition is terminal, so Q[s, a] += lr·(reward − Q[s, a]). ε-greedy with
    P(greedy) = 0.9 (ties broken at random). Draws from ``generator``.
    """

    def __init__(self, generator: torch.Generator, step: float = 0.05, lr: float = 0.1,
                 greedy: float = 0.9) -> None:
        self.generator, self.step, self.lr, self.greedy = generator, step, lr, greedy
        self.q: dict[str, list[float]] = {}
        self.last_k, self.k, self.action = 0.0, 0.0, None
        self.record = [0.0]            # k per fine-tune epoch, as the official k_record
        self.updates = 0

    def _state(self, k: float) -> list[float]:
        return self.q.setdefault(str(k), [0.0, 0.0])

    def choose(self, k: float) -> int:
        q = self._state(k)
        if torch.rand((), generator=self.generator).item() < self.greedy:
            best = [a for a in (0, 1) if q[a] == max(q)]
            return best[int(torch.randint(len(best), (), generator=self.generator))]
        return int(torch.randint(2, (), generator=self.generator))

    def learn(self, k: float, action: int, reward: float) -> None:
        q = self._state(k)
        q[action] += self.lr * (reward - q[action])   # terminal: the target is the reward

    def move(self, k: float, action: int) -> float:
        if action == 0:
            return k + self.step if k + self.step <= 1.0 else 1.0
        return k - self.step if k - self.step >= -1.0 else -1.0

    def update(self, f1_now: float, f1_before: float) -> float:
        """One official ``Run_QL``: learn from the last action, act again; returns the new k."""
        if self.action is not None:
            reward = float((f1_now > f1_before) - (f1_now < f1_before))
            self.learn(self.last_k, self.action, reward)
        self.action = self.choose(self.k)
        self.last_k, self.k = self.k, self.move(self.k, self.action)
        self.updates += 1
        return self.k

    def stopped(self, delta_k: float, window: int = 20, min_records: int = 150) -> bool:
        """The official ``isTerminal``: ≥ min_records values of k and the last ``window`` of
        them spanning ≤ delta_k."""
        if len(self.record) < min_records:
            return False
        last = self.record[-window:]
        return max(last) - min(last) <= delta_k


def pretrain_length(cfg: BaselineConfig, epochs: int | None) -> int:
    """The pre-training epochs on the harness (module docstring)."""
    if cfg.pretrain_epochs is not None:
        p = cfg.pretrain_epochs
    else:
        p = OFFICIAL_PRETRAIN_EPOCHS
        if epochs is not None:
            p = min(p, epochs // 2)
    if epochs is not None and p >= epochs:
        raise ValueError(f"pretrain_epochs={p} leaves no fine-tuning epoch in a run of "
                         f"{epochs} epochs")
    return p


class GraphMixup(BaselineMethod):
    """§2.8 GraphMixup on the GCN backbone (module docstring)."""

    name = "graphmixup"
    uses_tail = True

    def __init__(self, ctx: MethodContext, cfg: BaselineConfig) -> None:
        super().__init__(ctx, cfg)
        # the Q-agent's reward: the validation Macro-F1 of the training forward pass; a context
        # without validation nodes (a caller other than the harness) falls back to the
        # training nodes, and info() says so
        self.reward_idx = ctx.val_idx if ctx.val_idx is not None else ctx.train_idx
        self.reward_nodes = "val" if ctx.val_idx is not None else "train (no val_idx given)"
        dev, h = ctx.x.device, cfg.hidden
        self.graph_mx = raw_adjacency(ctx.graph, cfg.self_loops)
        self.adj = adjacency_operator(self.graph_mx, cfg.resolved_adj_norm)
        self.decoder = Decoder(h)
        self.pairdis = nn.Linear(h, cfg.dis_nclass)       # local-path: hop class of a pair
        self.clusterdis = nn.Linear(h, cfg.clu_nclass)    # global-path: 1/hop to each centre
        a0 = raw_adjacency(ctx.graph.to("cpu"), False)     # the targets' graph: raw A
        u, v, lab = local_path_pairs(a0, cfg.dis_nclass, cfg.k_num, ctx.generator)
        self.pair_u, self.pair_v, self.pair_label = u.to(dev), v.to(dev), lab.to(dev)
        part, self.partitioner = partition(a0, cfg.clu_nclass)
        ids, centres = cluster_centres(a0, part)
        self.path_targets = global_path_targets(a0, ids, centres, cfg.clu_nclass).to(dev)
        self.pretrain_epochs = pretrain_length(cfg, ctx.epochs)
        self.agent = QLearningScale(ctx.generator)
        self.epoch = 0
        self.f1_last = self.f1_now = 0.0
        self.num_synthetic = 0

    def self_supervised_losses(self, h: torch.Tensor):
        """(L_dis, L_clu) on the original nodes' embeddings h [n, d]."""
        diff = h.index_select(0, self.pair_u) - h.index_select(0, self.pair_v)  # (as above)
        logp = F.log_softmax(self.pairdis(diff.abs()), dim=1)
        return (F.nll_loss(logp, self.pair_label),
                F.mse_loss(self.clusterdis(h), self.path_targets))

    def train_loss(self) -> torch.Tensor:
        c, cfg = self.ctx, self.cfg
        n = c.x.shape[0]
        pretrain = self.epoch < self.pretrain_epochs
        h = self.encoder(c.x, self.adj)
        rounds = mixup_rounds(c.y, c.train_idx, c.num_classes, cfg.im_class_num, cfg.up_scale,
                              self.agent.k)
        h_new, y_new, src, nbr = mixup_embeddings(h, rounds, c.generator, cfg.mixup_neighbour)
        self.num_synthetic = int(h_new.shape[0])
        h_all = torch.cat([h, h_new])
        # fine-tune: the decoder does not step, but P still passes gradient to the encoder
        w = self.decoder.weight if pretrain else self.decoder.weight.detach()
        z = h_all @ w.T
        ck, cj = candidate_edges(self.graph_mx, src, nbr)
        # P only at the candidates (index_select: reproducible backward, as above)
        p = torch.sigmoid((z.index_select(0, n + ck) * z.index_select(0, cj)).sum(1))
        if cfg.edge_mode == "discrete":                     # 1[P ≥ 0.5], detached
            keep = p.detach() >= 0.5
            ck, cj, p = ck[keep], cj[keep], torch.ones_like(p[keep]).detach()
        b = AugmentedAdjacency(self.graph_mx, self.num_synthetic, ck, cj, p, cfg.resolved_adj_norm)
        logits = self.classifier(h_all, b)
        train = torch.cat([c.train_idx, n + torch.arange(self.num_synthetic, device=h.device)])
        ce = F.cross_entropy(logits[train], torch.cat([c.y, y_new])[train])
        if pretrain:
            loss = recon_loss(z[:n], self.graph_mx) / n + 0 * ce
            l_dis, l_clu = self.self_supervised_losses(h)
            if cfg.dis_weight != 0:
                loss = loss + cfg.dis_weight * l_dis
            if cfg.clu_weight != 0:
                loss = loss + cfg.clu_weight * l_clu
        else:
            loss = ce
            if (self.epoch - self.pretrain_epochs >= cfg.q_start_epoch
                    and not self.agent.stopped(cfg.delta_k)):
                self.agent.update(self.f1_now, self.f1_last)   # k for the next epoch
            self.agent.record.append(self.agent.k)
        with torch.no_grad():      # the official val-F1: the training forward's output
            f1 = macro_f1(c.y[self.reward_idx].cpu(), logits[self.reward_idx].argmax(1).cpu())
        self.f1_last, self.f1_now = self.f1_now, f1
        self.epoch += 1
        return loss

    def selection_start(self) -> int:
        return self.pretrain_epochs

    def info(self) -> dict:
        p = self.pretrain_epochs
        return {
            "num_synthetic": self.num_synthetic,
            "schedule": {
                "pretrain_epochs": p,
                "finetune_from_epoch": p,
                "q_learning_from_epoch": p + self.cfg.q_start_epoch,
                "rule": "harness epochs [0, P) pre-train (L_rec + L_dis + L_clu + 0·CE), "
                        "[P, end) fine-tune (CE); P = pretrain_epochs or "
                        "min(2010, epochs // 2); Q-agent from fine-tune epoch "
                        "q_start_epoch until its stopping rule; model selection and "
                        "patience over [P, end)",
            },
            "epochs_trained": self.epoch,
            "q_updates": self.agent.updates,
            "q_stopped": self.agent.stopped(self.cfg.delta_k),
            "scale_k": self.agent.k,
            "local_path_pairs": int(self.pair_u.numel()),
            "partitioner": self.partitioner,
            "q_reward_nodes": self.reward_nodes,
        }


METHODS[GraphMixup.name] = GraphMixup
