"""Run to run on CPU threads: the same call gives the same bits (docs/GUARANTEES.md:
determinism). torch's CPU backward of advanced indexing ``t[idx]`` (index_put_ with
accumulate) adds repeated indices in parallel once the gathered rows pass ~32k elements and
torch has more than one thread, so a gradient through such a gather changed in its last bits
from call to call (a determinism audit: the reference GCN's x gradient in 20 of 20 runs,
GraphSMOTE's and GraphMixup's training runs at --threads 2). Those gathers are
``index_select`` now, whose backward adds in a fixed order. Each test compares 12 calls at 4
threads (more threads than rows' owners: at 2, the augmented adjacency's gather splits into
two disjoint halves and never races; 4 threads race on a 2-CPU machine too)."""
from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch

from hiertail_fast.baselines.graphmixup import GraphMixup, mixup_embeddings
from hiertail_fast.baselines.graphsmote import augmented_adjacency, recon_loss
from hiertail_fast.baselines.sampling import smote_interpolate
from hiertail_fast.graph import CSRGraph
from hiertail_fast.reference.gcn_propagate import gcn_propagate_ref

N, D, E = 2000, 8, 40_000


@pytest.fixture(autouse=True)
def four_threads():
    old = torch.get_num_threads()
    torch.set_num_threads(4)
    yield
    torch.set_num_threads(old)


def _gen(seed: int = 0) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


def _one_gradient(f, x0: torch.Tensor, runs: int = 12) -> torch.Tensor:
    """The gradient of <f(x), fixed weights> at x0, checked to be the same bits in every run."""
    grads = []
    for _ in range(runs):
        x = x0.clone().requires_grad_()
        out = f(x)
        weights = torch.arange(1, out.numel() + 1, dtype=out.dtype).view_as(out).sin()  # != 0
        (out * weights).sum().backward()
        grads.append(x.grad)
    assert len({g.numpy().tobytes() for g in grads}) == 1
    return grads[0]


def _edges() -> torch.Tensor:
    return torch.randint(0, N, (2, E), generator=_gen(1))


def test_reference_gcn_gradient():
    x0, ei = torch.randn(N, D, generator=_gen()), _edges()
    _one_gradient(lambda x: gcn_propagate_ref(x, ei), x0)


def test_graphsmote_reconstruction_and_candidate_weights():
    graph = CSRGraph.from_edge_index(_edges(), num_nodes=N)
    z0 = torch.randn(N, D, generator=_gen()) * 0.1
    _one_gradient(lambda z: recon_loss(z, graph).view(1), z0)
    s = 500                                                  # synthetic rows n .. n + s
    cand_k = torch.randint(0, s, (E,), generator=_gen(2))
    cand_j = torch.randint(0, N, (E,), generator=_gen(3))
    z1 = torch.randn(N + s, D, generator=_gen(4))
    xw = torch.randn(N + s, D, generator=_gen(5))
    _one_gradient(lambda z: augmented_adjacency(graph, z, cand_k, cand_j, "o",
                                                edge_grad=True) @ xw, z1)
    # the operator's own gather of the rows it multiplies (its columns repeat)
    op = augmented_adjacency(graph, z1, cand_k, cand_j, "o")
    _one_gradient(lambda x: op @ x, xw)


def test_smote_and_mixup_interpolation():
    h0 = torch.randn(N * 20, D, generator=_gen())
    neighbour = torch.randint(0, 50, (N * 20,), generator=_gen(1))   # shared neighbours
    _one_gradient(lambda h: smote_interpolate(h, neighbour, _gen(2)), h0)
    # (the round's nearest neighbours: O(m^2) distances, so 2,000 rows of 32 columns)
    h1, rounds = torch.randn(N, 32, generator=_gen(3)), [(0, torch.arange(N))]
    _one_gradient(lambda h: mixup_embeddings(h, rounds, _gen(2))[0], h1)


def test_graphmixup_self_supervised_pairs():
    n = 200                                  # few nodes, many pairs: repeated rows throughout
    pairs = torch.randint(0, n, (2, E), generator=_gen(1))
    torch.manual_seed(0)
    host = SimpleNamespace(pairdis=torch.nn.Linear(D, 2), clusterdis=torch.nn.Linear(D, 3),
                           pair_u=pairs[0], pair_v=pairs[1],
                           pair_label=torch.randint(0, 2, (E,), generator=_gen(2)),
                           path_targets=torch.rand(n, 3, generator=_gen(3)))
    h0 = torch.randn(n, D, generator=_gen())
    _one_gradient(lambda h: torch.stack(GraphMixup.self_supervised_losses(host, h)), h0)
