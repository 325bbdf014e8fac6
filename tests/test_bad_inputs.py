"""Bad-input table: each public function x each class of bad input -> the exact exception type
and a message that names the offending argument (never an error from deep inside torch)."""
from __future__ import annotations

import numpy as np
import pytest
import torch

from hiertail_fast import (
    BalancedContrastiveLoss,
    CSRGraph,
    GCNConv,
    TopKPool,
    balanced_accuracy,
    balanced_contrastive_loss,
    gcn_propagate,
    hierarchical_contrastive_loss,
    load_npz,
    macro_f1,
    nearest_prototype,
    topk_pool,
    topk_unpool,
)
from hiertail_fast.nn.hiertail import HierTail, HierTailConfig, prepare_graph
from hiertail_fast.reference.gcn_propagate import gcn_propagate_ref

pytestmark = pytest.mark.usefixtures("one_thread")

NAN, INF = float("nan"), float("inf")
EI = torch.tensor([[0, 1, 2], [1, 2, 0]])
X = torch.randn(3, 4)
P = torch.randn(4)
Z = torch.randn(5, 4)
Y = torch.tensor([0, 0, 1, 1, 2])
PROTOS = torch.randn(2, 4)


def _with(t: torch.Tensor, value: float) -> torch.Tensor:
    t = t.clone()
    t.view(-1)[-1] = value
    return t


def _graph():
    return CSRGraph.from_edge_index(EI, num_nodes=3)


def _nested(t: torch.Tensor, layout=torch.strided) -> torch.Tensor:
    """`t` as a one-element nested tensor (the old API's default layout is torch.strided, so
    only ``is_nested`` tells it from a plain tensor); torch warns the API is a prototype."""
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return torch.nested.nested_tensor([t], layout=layout)


def _gcn(**kw):
    args = dict(x=X, graph_or_edge_index=_graph())
    args.update(kw)
    x, graph = args.pop("x"), args.pop("graph_or_edge_index")
    return lambda: gcn_propagate(x, graph, **args)


def _pool(**kw):
    args = dict(x=X, graph_or_edge_index=EI, score_weight=P, ratio=0.5)
    args.update(kw)
    return lambda: topk_pool(**args)


def _unpool(**kw):
    args = dict(x_pooled=torch.ones(2, 3), perm=torch.tensor([0, 2]), num_nodes=4)
    args.update(kw)
    return lambda: topk_unpool(**args)


def _near(**kw):
    args = dict(z=Z, prototypes=PROTOS)
    args.update(kw)
    return lambda: nearest_prototype(**args)


def _conv_with_weight(value: float) -> GCNConv:
    conv = GCNConv(4, 2)                                   # in >= out: Â (x Wᵀ)
    with torch.no_grad():
        conv.weight.fill_(value)
    return conv


def _bcl(**kw):
    args = dict(z=Z, labels=Y, prototypes=PROTOS, temperature=0.1)
    args.update(kw)
    return lambda: balanced_contrastive_loss(**args)


def _hier(**kw):
    args = dict(z=Z, level_labels=[Y], level_prototypes=[PROTOS], temperature=0.1)
    args.update(kw)
    return lambda: hierarchical_contrastive_loss(**args)


def _csr(**kw):
    args = dict(edge_index=EI, edge_weight=None, num_nodes=3)
    args.update(kw)
    return lambda: CSRGraph.from_edge_index(**args)


CASES = [
    # ---- gcn_propagate
    ("gcn x type", _gcn(x=X.tolist()), TypeError, "x must be a torch.Tensor"),
    ("gcn x dim", _gcn(x=X[0]), ValueError, "x must be 2-D"),
    ("gcn x dtype", _gcn(x=X.long()), TypeError, "x must be a floating-point"),
    ("gcn x nan", _gcn(x=_with(X, NAN)), ValueError, "x contains NaN or Inf"),
    ("gcn x inf", _gcn(x=_with(X, -INF)), ValueError, "x contains NaN or Inf"),
    ("gcn rows", _gcn(x=torch.randn(4, 4)), ValueError, "x has 4 rows but the graph has 3"),
    ("gcn ei negative", _gcn(graph_or_edge_index=EI - 1), ValueError,
     "edge_index has negative node indices"),
    ("gcn ei range", _gcn(graph_or_edge_index=EI + 1), ValueError,
     "edge_index refers to node 3"),
    ("gcn ei dtype", _gcn(graph_or_edge_index=EI.float()), TypeError,
     "edge_index must be an integer tensor"),
    ("gcn weight length", _gcn(graph_or_edge_index=EI, edge_weight=torch.ones(2)), ValueError,
     "edge_weight has 2 entries"),
    ("gcn weight nan", _gcn(graph_or_edge_index=EI, edge_weight=_with(torch.ones(3), NAN)),
     ValueError, "edge_weight contains NaN or Inf"),
    ("gcn weight dtype", _gcn(graph_or_edge_index=EI, edge_weight=torch.ones(3, dtype=int)),
     TypeError, "edge_weight must be a floating-point tensor"),
    ("gcn negative degree", _gcn(graph_or_edge_index=EI, edge_weight=torch.tensor(
        [1.0, -4.0, 1.0])), ValueError, "node 2 has GCN degree"),
    ("gcn backend", _gcn(backend="cuda"), ValueError, "backend='cuda' is not one of"),
    ("gcn num_nodes", _gcn(num_nodes=5), ValueError, "num_nodes=5 but the graph has 3"),
    ("gcn improved str", _gcn(improved="no"), TypeError, "improved must be a bool"),
    ("gcn self-loops int", _gcn(add_self_loops=0), TypeError, "add_self_loops must be a bool"),
    # ---- topk_pool / topk_unpool
    ("pool x type", _pool(x=np.ones((3, 4))), TypeError, "x must be a torch.Tensor"),
    ("pool x nan", _pool(x=_with(X, NAN)), ValueError, "x contains NaN or Inf"),
    ("pool p dim", _pool(score_weight=torch.ones(2, 4)), ValueError, "score_weight must have"),
    ("pool p length", _pool(score_weight=torch.ones(5)), ValueError, "score_weight must have"),
    ("pool p dtype", _pool(score_weight=P.double()), TypeError, "score_weight has dtype"),
    ("pool p inf", _pool(score_weight=_with(P, INF)), ValueError, "score_weight contains NaN"),
    ("pool p zero", _pool(score_weight=torch.zeros(4)), ValueError, "score_weight is all zeros"),
    ("pool ratio zero", _pool(ratio=0.0), ValueError, "a float ratio must lie in"),
    ("pool ratio nan", _pool(ratio=NAN), ValueError, "a float ratio must lie in"),
    ("pool ratio count", _pool(ratio=0), ValueError, "an integer ratio is a node count"),
    ("pool ratio bool", _pool(ratio=True), TypeError, "ratio must be a float"),
    ("pool ratio str", _pool(ratio="half"), TypeError, "ratio must be a float"),
    ("pool ei range", _pool(graph_or_edge_index=EI * 2), ValueError, "edge_index refers to"),
    ("pool backend", _pool(backend="gpu"), ValueError, "backend='gpu' is not one of"),
    ("unpool perm range", _unpool(perm=torch.tensor([0, 4])), ValueError,
     "perm refers to node 4"),
    ("unpool perm negative", _unpool(perm=torch.tensor([-1, 2])), ValueError,
     "perm has negative entries"),
    ("unpool perm repeated", _unpool(perm=torch.tensor([2, 2])), ValueError,
     "perm has repeated node indices"),
    ("unpool perm length", _unpool(perm=torch.tensor([0])), ValueError, "perm has 1 entries"),
    # a 0-d perm was scattered as if it were [2] (a mutation pass, session 73)
    ("unpool perm 0-d", _unpool(x_pooled=torch.ones(1, 3), perm=torch.tensor(2)), ValueError,
     "perm must be 1-D, got shape ()"),
    ("unpool perm dtype", _unpool(perm=torch.tensor([0.0, 2.0])), TypeError,
     "perm must be an integer tensor"),
    ("unpool num_nodes negative", _unpool(x_pooled=torch.ones(0, 3), perm=torch.zeros(
        0, dtype=torch.long), num_nodes=-1), ValueError, "num_nodes must be >= 0"),
    ("unpool num_nodes float", _unpool(num_nodes=4.0), TypeError, "num_nodes must be an int"),
    ("unpool x dim", _unpool(x_pooled=torch.ones(2)), ValueError, "x_pooled must be 2-D"),
    # ---- nearest_prototype
    ("near z type", _near(z=[[1.0]]), TypeError, "z must be a torch.Tensor"),
    ("near z dim", _near(z=Z[0]), ValueError, "z must be 2-D"),
    ("near z nan", _near(z=_with(Z, NAN)), ValueError, "z contains NaN or Inf"),
    ("near protos inf", _near(prototypes=_with(PROTOS, INF)), ValueError,
     "prototypes contains NaN or Inf"),
    ("near protos empty", _near(prototypes=PROTOS[:0]), ValueError,
     "prototypes must have at least one row"),
    ("near width", _near(prototypes=torch.ones(2, 3)), ValueError, "z has 4 features"),
    ("near dtype", _near(prototypes=PROTOS.double()), TypeError, "prototypes have"),
    ("near backend", _near(backend="fast"), ValueError, "backend='fast' is not one of"),
    # ---- balanced / hierarchical contrastive loss
    ("bcl z dtype", _bcl(z=Z.long()), TypeError, "z must be a floating-point"),
    ("bcl z nan", _bcl(z=_with(Z, NAN)), ValueError, "z contains NaN or Inf"),
    ("bcl z empty", _bcl(z=Z[:0], labels=Y[:0]), ValueError, "z is empty"),
    ("bcl labels length", _bcl(labels=Y[:3]), ValueError, "labels has 3 entries"),
    ("bcl labels negative", _bcl(labels=_with(Y, -1)), ValueError,
     "labels has negative entries"),
    ("bcl labels dtype", _bcl(labels=Y.float()), TypeError, "labels must be an integer"),
    ("bcl protos width", _bcl(prototypes=torch.ones(2, 3)), ValueError, "prototypes have width"),
    ("bcl protos nan", _bcl(prototypes=_with(PROTOS, NAN)), ValueError,
     "prototypes contains NaN"),
    ("bcl tau zero", _bcl(temperature=0.0), ValueError, "temperature must be a finite"),
    ("bcl tau tiny", _bcl(temperature=1e-45), ValueError, "temperature must be a finite"),
    ("bcl tau inf", _bcl(temperature=INF), ValueError, "temperature must be a finite"),
    ("bcl tau type", _bcl(temperature="0.1"), TypeError, "temperature must be a float"),
    ("bcl tau tensor shape", _bcl(temperature=torch.tensor([0.1])), TypeError,
     "a tensor temperature must be a 0-d floating-point tensor"),
    ("bcl tau tensor int", _bcl(temperature=torch.tensor(1)), TypeError,
     "a tensor temperature must be a 0-d floating-point tensor"),
    ("bcl tau tensor nan", _bcl(temperature=torch.tensor(NAN)), ValueError,
     "temperature must be a finite"),
    ("hier tau tensor tiny", _hier(temperature=torch.tensor(1e-9)), ValueError,
     "temperature must be a finite"),
    ("bcl reduction", _bcl(reduction="avg"), ValueError, "reduction='avg' is not one of"),
    ("bcl variant", _bcl(variant="paper"), ValueError, "variant='paper' is not one of"),
    ("bcl backend", _bcl(backend="cpu"), ValueError, "backend='cpu' is not one of"),
    ("bcl include_self str", _bcl(include_self="no"), TypeError, "include_self must be a bool"),
    ("hier include_self None", _hier(include_self=None), TypeError,
     "include_self must be a bool"),
    ("hier levels", _hier(level_prototypes=[]), ValueError, "need one prototype tensor"),
    # (the cases from here to the next comment: checks whose deletion passed every test in a
    # mutation audit; the inputs then crashed inside torch or gave a value)
    ("hier no level", _hier(level_labels=[], level_prototypes=[]), ValueError,
     "at least one level"),
    ("bcl protos dtype", _bcl(prototypes=PROTOS.double()), TypeError,
     "prototypes are torch.float64 but z is torch.float32"),
    ("hier protos dtype", _hier(z=Z.half(), level_prototypes=[PROTOS]), TypeError,
     "prototypes are torch.float32 but z is torch.float16"),
    ("bcl tau bool", _bcl(temperature=True), TypeError, "temperature must be a float"),
    ("bcl logits in headroom", _bcl(
        z=torch.nn.functional.normalize(Z, dim=1) * (torch.finfo(torch.float32).max * 0.05)
        ** 0.5, prototypes=None), ValueError, "the logits overflow"),
    ("gcn weight dim", _gcn(graph_or_edge_index=EI, edge_weight=torch.ones(3, 1)), ValueError,
     "edge_weight must be 1-D"),
    ("csr weight dim", _csr(edge_weight=torch.ones(1, 3)), ValueError, "edge_weight must be 1-D"),
    ("pool weight dim", _pool(edge_weight=torch.ones(3, 1)), ValueError,
     "edge_weight must be 1-D"),
    ("pool score_weight 2-D", _pool(score_weight=torch.randn(2, 2)), ValueError,
     "score_weight must have shape"),
    ("unpool num_nodes float tensor", _unpool(num_nodes=torch.tensor(5.9)), TypeError,
     "num_nodes must be an int"),
    # the public reference checks num_nodes as the op does (it accepted 3.7, "3" and True)
    ("gcn ref num_nodes float", lambda: gcn_propagate_ref(X, EI, num_nodes=3.7), TypeError,
     "num_nodes must be an int"),
    ("gcn ref num_nodes str", lambda: gcn_propagate_ref(X, EI, num_nodes="3"), TypeError,
     "num_nodes must be an int"),
    ("gcn ref num_nodes bool", lambda: gcn_propagate_ref(X, EI, num_nodes=True), TypeError,
     "num_nodes must be an int"),
    ("gcn ref num_nodes wrong", lambda: gcn_propagate_ref(X, EI, num_nodes=4), ValueError,
     "num_nodes=4 but x has 3 rows"),
    ("hier type", _hier(level_labels=Y), TypeError, "level_labels and level_prototypes"),
    ("hier labels negative", _hier(level_labels=[_with(Y, -3)]), ValueError,
     "labels has negative entries"),
    ("hier tau", _hier(temperature=-1.0), ValueError, "temperature must be a finite"),
    # an int beyond float's range (OverflowError before), a temperature with no values (meta:
    # Tensor.item()'s error from inside torch before), None / an int for a level list
    ("bcl tau int beyond float", _bcl(temperature=10 ** 400), ValueError,
     "got an int beyond float's range"),
    ("bcl tau meta", _bcl(temperature=torch.tensor(0.1, device="meta")), ValueError,
     "temperature is on the meta device"),
    ("hier tau meta", _hier(temperature=torch.tensor(0.1, device="meta")), ValueError,
     "temperature is on the meta device"),
    ("module tau meta", lambda: BalancedContrastiveLoss(torch.tensor(0.1, device="meta")),
     ValueError, "temperature is on the meta device"),
    ("module tau int beyond float", lambda: BalancedContrastiveLoss(10 ** 400), ValueError,
     "got an int beyond float's range"),
    ("hier prototypes None", _hier(level_prototypes=None), TypeError,
     "level_prototypes is NoneType"),
    ("hier labels int", _hier(level_labels=3), TypeError, "level_labels is int"),
    # a str / bytes is iterable: split into one "level" per character, its error named an
    # entry (6b44917's str / bytes part, unguarded: a fix-test check, session 68)
    ("hier labels str", _hier(level_labels="ab"), TypeError, "level_labels is str"),
    ("hier labels bytes", _hier(level_labels=b"ab"), TypeError, "level_labels is bytes"),
    # ---- nested tensors (torch.nested): every check and op failed with torch's "Internal
    # error: NestedTensorImpl doesn't support sizes"; a jagged edge_index read as a sparse
    # adjacency
    *[(f"{name} nested {str(layout)[6:]}", call(layout), TypeError,
       f"{arg} must be a plain tensor, got a nested tensor") for layout in (
        torch.strided, torch.jagged) for name, arg, call in (
        ("bcl z", "z", lambda lay: _bcl(z=_nested(Z, lay))),
        ("bcl prototypes", "prototypes", lambda lay: _bcl(prototypes=_nested(PROTOS, lay))),
        ("hier z", "z", lambda lay: _hier(z=_nested(Z, lay))),
        ("gcn x", "x", lambda lay: _gcn(x=_nested(X, lay))),
        ("gcn edge_index", "graph_or_edge_index",
         lambda lay: _gcn(graph_or_edge_index=_nested(EI.float(), lay).long())),
        ("pool x", "x", lambda lay: _pool(x=_nested(X, lay))),
        ("pool edge_index", "edge_index",
         lambda lay: _pool(graph_or_edge_index=_nested(EI.float(), lay).long())),
        ("near z", "z", lambda lay: _near(z=_nested(Z, lay))),
        ("near prototypes", "prototypes", lambda lay: _near(prototypes=_nested(PROTOS, lay))))],
    ("bcl labels nested", _bcl(labels=_nested(Y)), TypeError,
     "labels must be a plain tensor, got a nested tensor"),
    ("bcl temperature nested", _bcl(temperature=_nested(torch.tensor(0.1))), TypeError,
     "temperature must be a plain tensor, got a nested tensor"),
    ("gcn weight nested", _gcn(graph_or_edge_index=EI, edge_weight=_nested(torch.ones(3))),
     TypeError, "edge_weight must be a plain tensor, got a nested tensor"),
    ("pool score_weight nested", _pool(score_weight=_nested(P)), TypeError,
     "score_weight must be a plain tensor, got a nested tensor"),
    ("csr edge_index nested", lambda: CSRGraph.from_edge_index(_nested(EI), num_nodes=3),
     TypeError, "edge_index must be a plain tensor, got a nested tensor"),
    # ---- the loss: layouts, devices, number types and ranges a fuzzer found loose
    ("bcl z sparse", _bcl(z=Z.to_sparse()), TypeError, "z must be a dense (strided) tensor"),
    ("bcl z csr", _bcl(z=Z.to_sparse_csr()), TypeError, "z must be a dense (strided) tensor"),
    ("bcl labels sparse", _bcl(labels=Y.to_sparse()), TypeError,
     "labels must be a dense (strided) tensor"),
    ("bcl labels meta", _bcl(labels=Y.to("meta")), ValueError, "labels are on meta but z is on"),
    ("bcl z meta", _bcl(z=Z.to("meta"), prototypes=None), ValueError,
     "z is on the meta device"),
    ("bcl tau fraction", _bcl(temperature=__import__("fractions").Fraction(1, 10)), TypeError,
     "temperature must be a float"),
    ("bcl tau tensor beyond fp32", _bcl(temperature=torch.tensor(1e300, dtype=torch.float64)),
     ValueError, "a tensor temperature must be <="),
    ("bcl logits overflow", _bcl(z=Z * 2e19), ValueError, "the logits overflow torch.float32"),
    ("bcl logits overflow protos", _bcl(prototypes=PROTOS * 1e19, temperature=1.0), ValueError,
     "the logits overflow torch.float32"),
    ("bcl logits overflow bf16", _bcl(z=(Z * 1e18).bfloat16(), prototypes=None, temperature=1e-3),
     ValueError, "the logits overflow torch.float32"),
    ("bcl logits overflow fp64", _bcl(z=Z.double() * 1e155, prototypes=None, temperature=1.0),
     ValueError, "the logits overflow torch.float64"),
    ("hier logits overflow", _hier(z=Z * 2e19), ValueError, "the logits overflow"),
    # the dot products overflow before the division by tau > 1, the logits' bound would not:
    # a NaN loss on every backend, silently; a float64 bound past float's range raised an
    # OverflowError (no ValueError)
    ("bcl dots overflow tau > 1", _bcl(z=torch.tensor([[1.85e19], [1.0], [2.0]]),
                                       labels=torch.tensor([0, 0, 1]), prototypes=None,
                                       temperature=1000.0), ValueError,
     "the logits overflow torch.float32, their dot products z_i·z_k already"),
    ("hier dots overflow tau > 1", _hier(z=Z * 1e19, level_prototypes=[None],
                                         level_labels=[Y], temperature=1e30), ValueError,
     "their dot products z_i·z_k already"),
    ("bcl dots overflow fp64", _bcl(z=torch.tensor([[1e200], [2e200]], dtype=torch.float64),
                                    labels=torch.tensor([0, 1]), prototypes=None,
                                    temperature=1e300), ValueError,
     "the logits overflow torch.float64, their dot products z_i·z_k already, before the "
     "division by the temperature: max ‖z_i‖² = ~1e401"),
    # (a mutation pass, session 73) the limit is 1/16 of the dtype's largest value, not 1/2:
    # logits of 0.1 x float32's max at tau 1 gave a loss of ~1e30 or one of the other sign by
    # backend; the message's size is the true one where a prototype's (or any) norm overflows
    # float32, beside a zero row (its own size: ~1enan; z's only: "14.4", another cause)
    ("bcl logits past a 16th", _bcl(z=torch.nn.functional.normalize(Z, dim=1) * (
        torch.finfo(torch.float32).max * 0.1) ** 0.5, prototypes=None, temperature=1.0),
     ValueError, "the logits overflow torch.float32"),
    ("bcl protos norm overflows", _bcl(prototypes=torch.tensor([[3e38, 3e38, 0.0, 0.0],
                                                                 [1.0, 1.0, 1.0, 1.0]]),
                                       temperature=0.5), ValueError,
     "their dot products z_i·z_k already, before the division by the temperature: "
     "max ‖z_i‖² = 1.8e+77 > 2.13e+37"),
    ("bcl norm overflows beside a zero row", _bcl(z=torch.tensor([[3e38, 3e38, 0.0, 0.0],
                                                                   [0.0, 0.0, 0.0, 0.0],
                                                                   [1.0, 2.0, 0.0, 0.0]]),
                                                   labels=torch.tensor([0, 0, 1]),
                                                   prototypes=None, temperature=0.5),
     ValueError, "max ‖z_i‖² = 1.8e+77 > 2.13e+37"),
    # an edge_weight beside a CSRGraph (whose weights are stored in it) was dropped silently
    ("conv csr weight", lambda: GCNConv(4, 2)(X, CSRGraph.from_edge_index(EI, num_nodes=3),
                                              torch.ones(3)), ValueError,
     "edge_weight must be None when a CSRGraph or a sparse adjacency is given"),
    # too few features: named as x's, not as the module's weight that does not match them
    ("pool module x narrow", lambda: TopKPool(4, 0.5)(torch.randn(5, 3), EI), ValueError,
     "x has 3 features, TopKPool(4) expects 4"),
    # GCNConv's own product x·Wᵀ overflowing (in >= out: the product goes into the
    # propagation, whose check blamed the user's finite x)
    ("conv product overflow", lambda: _conv_with_weight(1.0)(torch.full((3, 4), 2e38), EI),
     ValueError, "GCNConv: x·Wᵀ holds NaN or Inf although x is finite (the product overflows"),
    ("conv weight nan", lambda: _conv_with_weight(float("nan"))(torch.ones(3, 4), EI),
     ValueError, "GCNConv: x·Wᵀ holds NaN or Inf although x is finite (the weight holds NaN"),
    ("module reduction", lambda: BalancedContrastiveLoss(reduction="avg"), ValueError,
     "reduction='avg' is not one of"),
    ("module tau", lambda: BalancedContrastiveLoss(temperature=-1.0), ValueError,
     "temperature must be a finite"),
    ("module variant", lambda: BalancedContrastiveLoss(variant="paper2"), ValueError,
     "variant='paper2' is not one of"),
    # ---- CSRGraph construction
    ("csr num_nodes bool", _csr(num_nodes=True), TypeError, "num_nodes must be an int"),
    ("csr num_nodes float", _csr(num_nodes=3.0), TypeError, "num_nodes must be an int"),
    ("csr num_nodes negative", _csr(num_nodes=-2), ValueError, "num_nodes must be >= 0"),
    ("csr ei shape", _csr(edge_index=EI[0]), ValueError, "edge_index must have shape"),
    ("csr ei type", _csr(edge_index=EI.tolist()), TypeError, "edge_index must be a torch"),
    ("csr weight inf", _csr(edge_weight=_with(torch.ones(3), INF)), ValueError,
     "edge_weight contains NaN or Inf"),
    ("csr symmetrize str", _csr(symmetrize="yes"), TypeError, "symmetrize must be a bool"),
    ("csr dedupe int", _csr(dedupe=1), TypeError, "dedupe must be a bool"),
    ("csr self-loops None", _csr(remove_self_loops=None), TypeError,
     "remove_self_loops must be a bool"),
    ("csr indices range", lambda: CSRGraph(torch.tensor([0, 1, 2]), torch.tensor([0, 5])),
     ValueError, "indices must lie in"),
    ("csr indptr order", lambda: CSRGraph(torch.tensor([0, 2, 1, 2]), torch.tensor([0, 1])),
     ValueError, "indptr must be non-decreasing"),
    # ---- dtypes with (almost) no CPU kernels, and the graph arguments' layouts and devices
    # (an API audit: NotImplementedError / "Tensor.item() cannot be called on meta tensors"
    # from deep inside torch before)
    *[(f"{what} {dt}".replace("torch.", ""), call(dt), TypeError, msg)
      for dt in (torch.uint16, torch.uint32, torch.uint64)
      for what, call, msg in (
          ("bcl labels", lambda dt: _bcl(labels=Y.to(dt)), "labels must be an integer tensor"),
          ("hier labels", lambda dt: _hier(level_labels=[Y.to(dt)]),
           "labels must be an integer tensor"),
          ("gcn ei", lambda dt: _gcn(graph_or_edge_index=EI.to(dt)),
           "edge_index must be an integer tensor"),
          ("pool ei", lambda dt: _pool(graph_or_edge_index=EI.to(dt)),
           "edge_index must be an integer tensor"),
          ("unpool perm", lambda dt: _unpool(perm=torch.tensor([0, 2]).to(dt)),
           "perm must be an integer tensor"),
          ("csr ei", lambda dt: _csr(edge_index=EI.to(dt)), "edge_index must be an integer"),
          ("csr indices", lambda dt: lambda: CSRGraph(torch.tensor([0, 1, 2]),
                                                      torch.tensor([1, 0]).to(dt)),
           "indices must be an integer tensor"),
          ("subgraph nodes", lambda dt: lambda: _graph().subgraph(torch.tensor([0, 1]).to(dt)),
           "nodes must be an integer tensor"))],
    *[(f"{what} {dt}".replace("torch.", ""), call(dt), TypeError, msg)
      for dt in (torch.float8_e4m3fn, torch.float8_e5m2)
      for what, call, msg in (
          ("bcl z", lambda dt: _bcl(z=Z.to(dt), prototypes=None),
           "z must be a floating-point tensor (float32"),
          ("bcl tau tensor", lambda dt: _bcl(temperature=torch.tensor(0.5).to(dt)),
           "a tensor temperature must be a 0-d floating-point tensor"),
          ("gcn x", lambda dt: _gcn(x=X.to(dt)), "x must be a floating-point tensor (float32"),
          ("gcn weight", lambda dt: _gcn(graph_or_edge_index=EI,
                                         edge_weight=torch.ones(3).to(dt)),
           "edge_weight must be a floating-point tensor"),
          ("pool x", lambda dt: _pool(x=X.to(dt), score_weight=P.to(dt)),
           "x must be a floating-point tensor"),
          ("near z", lambda dt: _near(z=Z.to(dt), prototypes=PROTOS.to(dt)),
           "z must be a floating-point tensor"))],
    ("gcn ei meta", _gcn(graph_or_edge_index=EI.to("meta")), ValueError,
     "edge_index is on the meta device"),
    ("gcn weight meta", _gcn(graph_or_edge_index=EI, edge_weight=torch.ones(3, device="meta")),
     ValueError, "edge_weight is on the meta device"),
    ("gcn weight sparse", _gcn(graph_or_edge_index=EI, edge_weight=torch.ones(3).to_sparse()),
     TypeError, "edge_weight must be a dense (strided) tensor"),
    ("pool p meta", _pool(score_weight=P.to("meta")), ValueError,
     "score_weight is on the meta device"),
    ("pool p sparse", _pool(score_weight=P.to_sparse()), TypeError,
     "score_weight must be a dense (strided) tensor"),
    ("pool weight sparse", _pool(edge_weight=torch.ones(3).to_sparse()), TypeError,
     "edge_weight must be a dense (strided) tensor"),
    ("csr indptr meta", lambda: CSRGraph(torch.tensor([0, 1, 2]).to("meta"),
                                         torch.tensor([1, 0]).to("meta")),
     ValueError, "indptr is on the meta device"),
    ("csr indptr sparse", lambda: CSRGraph(torch.tensor([0, 1, 2]).to_sparse(),
                                           torch.tensor([1, 0])),
     TypeError, "indptr must be a dense (strided) tensor"),
]


@pytest.mark.parametrize("backend", ["reference", "torch"])
@pytest.mark.parametrize("call, exc, msg", [c[1:] for c in CASES], ids=[c[0] for c in CASES])
def test_bad_input(call, exc, msg, backend, monkeypatch):
    monkeypatch.setenv("HIERTAIL_BACKEND", backend)  # the same answer from every backend
    with pytest.raises(exc) as info:
        call()
    assert type(info.value) is exc  # the exact type, not a subclass from deep inside torch
    assert msg in str(info.value), str(info.value)


def _masked(t: torch.Tensor) -> torch.Tensor:
    """`t` as a torch.masked.MaskedTensor, every entry present (a prototype API: it warns)."""
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return torch.masked.masked_tensor(t, torch.ones_like(t, dtype=torch.bool))


@pytest.mark.parametrize("wrap, kind", [(_nested, "a nested tensor"), (_masked, "a MaskedTensor")],
                         ids=["nested", "masked"])
@pytest.mark.parametrize("call, arg", [
    (lambda w: HierTail(4, 3)(w(X), EI), "x"),
    (lambda w: GCNConv(4, 2)(w(X), EI), "x"),
    (lambda w: prepare_graph(w(EI), 3), "edge_index"),
    (lambda w: BalancedContrastiveLoss()(w(Z), Y), "z"),
    (lambda w: balanced_contrastive_loss(Z, w(Y)), "labels"),
    (lambda w: gcn_propagate(w(X), EI), "x"),
    (lambda w: topk_pool(w(X), EI, P, ratio=0.5), "x"),
    (lambda w: nearest_prototype(w(Z), PROTOS), "z"),
    (lambda w: balanced_accuracy(w(Y), Y), "y_true"),
    (lambda w: macro_f1(Y, w(Y)), "y_pred"),
], ids=["HierTail", "GCNConv", "prepare_graph", "loss module", "loss labels", "gcn_propagate",
        "topk_pool", "nearest_prototype", "metric y_true", "metric y_pred"])
def test_tensor_containers_are_refused_by_name(call, arg, wrap, kind):
    """Nested tensors and MaskedTensors are refused naming the argument, by the modules and
    the metrics too (before: torch's 'NestedTensorImpl doesn't support sizes', a
    MaskedTensor's 'Multiple dispatch failed for aten.linalg_vector_norm', a conversion
    error)."""
    with pytest.raises(TypeError, match=f"^{arg} must be a plain tensor, got {kind}"):
        call(wrap)


@pytest.fixture(scope="module")
def model_output():
    torch.manual_seed(0)
    model = HierTail(4, 3, HierTailConfig.paper(hidden=8))
    n = 10
    return model, model(torch.randn(n, 4), prepare_graph(torch.randint(0, n, (2, 20)), n)), n


@pytest.mark.parametrize("y, idx, exc, msg", [
    ("range", None, ValueError, "the labels go up to 7 but the model's num_classes is 3"),
    ("negative", None, ValueError, "y has negative entries"),
    ("float", None, TypeError, "y must be an integer tensor"),
    ("length", None, ValueError, "y has 9 entries, expected 10"),
    (None, "range", ValueError, "train_idx refers to node 10"),
    (None, "negative", ValueError, "train_idx has negative entries"),
    (None, "empty", ValueError, "train_idx must be a non-empty"),
    (None, "dim", ValueError, "train_idx must be 1-D"),
    # a 0-d node id: refused as itself, not later as a z of the wrong shape (a mutation pass)
    (None, "0-d", ValueError, "train_idx must be 1-D, got shape ()"),
    (None, "duplicate", ValueError, "train_idx has duplicate node ids"),
    # a PyG train_mask, as is or as 0/1 integers: named as a mask, with the conversion
    (None, "mask", TypeError, "got a boolean mask: pass mask.nonzero().view(-1)"),
    (None, "0/1 mask", ValueError, "duplicate node ids (it looks like a 0/1 mask: pass"),
])
def test_hiertail_loss_bad_input(model_output, y, idx, exc, msg):
    model, out, n = model_output
    labels = {None: torch.arange(n) % 3, "range": torch.full((n,), 7),
              "negative": torch.full((n,), -1), "float": torch.zeros(n),
              "length": torch.zeros(n - 1, dtype=torch.long)}[y]
    train = {None: torch.arange(4), "range": torch.tensor([1, 10]),
             "negative": torch.tensor([-2]), "empty": torch.zeros(0, dtype=torch.long),
             "dim": torch.zeros(1, 2, dtype=torch.long),
             "0-d": torch.tensor(3),
             "duplicate": torch.tensor([3, 1, 3]),
             "mask": torch.arange(n) < 4, "0/1 mask": (torch.arange(n) < 4).long()}[idx]
    with pytest.raises(exc) as info:
        model.loss(out, labels, train)
    assert type(info.value) is exc and msg in str(info.value), str(info.value)


@pytest.mark.parametrize("content, msg", [
    (b"", "not a readable .npz file"),
    (b"PK\x03\x04 truncated zip", "not a readable .npz file"),
])
def test_load_npz_bad_file(tmp_path, content, msg):
    path = tmp_path / "bad.npz"
    path.write_bytes(content)
    with pytest.raises(ValueError) as info:
        load_npz(path)
    assert str(info.value).startswith(str(path)) and msg in str(info.value)
    with pytest.raises(FileNotFoundError, match="graph file not found"):
        load_npz(tmp_path / "missing.npz")


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a second device (CUDA)")
@pytest.mark.parametrize("call, msg", [
    (lambda: nearest_prototype(Z, PROTOS.cuda()), "z is on cpu but prototypes are on cuda"),
    (lambda: gcn_propagate(X.cuda(), _graph()), "graph is on cpu but x is on cuda"),
    (lambda: topk_pool(X, EI, P.cuda(), 0.5), "score_weight is on cuda"),
    (lambda: balanced_contrastive_loss(Z, Y.cuda()), "labels are on cuda"),
])
def test_device_mismatch(call, msg):
    with pytest.raises(ValueError, match=msg):
        call()


def test_device_mismatch_on_any_machine():
    """The same checks with the meta device standing in for a second one (the test above needs
    CUDA): a graph built there (validate=False: its arrays hold no values) or prototypes."""
    from hiertail_fast._validation import check_prototypes_match

    meta_graph = CSRGraph(torch.tensor([0, 1, 2, 2]).to("meta"), torch.tensor([1, 0]).to("meta"),
                          None, 3, validate=False)
    with pytest.raises(ValueError, match="graph is on meta but x is on cpu"):
        gcn_propagate(torch.randn(3, 2), meta_graph)
    with pytest.raises(ValueError, match="graph is on meta but x is on cpu"):
        topk_pool(torch.randn(3, 2), meta_graph, torch.randn(2), 0.5)
    # public calls refuse meta prototypes earlier (not a device that computes): the helper
    z = torch.randn(4, 3)
    with pytest.raises(ValueError, match="prototypes are on meta but z is on cpu"):
        check_prototypes_match(torch.randn(2, 3).to("meta"), z)
    check_prototypes_match(torch.randn(2, 3), z)


def test_flags_are_bools_everywhere(tmp_path):
    # a boolean switch given as anything but a bool is a TypeError naming it, never read by
    # its truthiness ("no" is truthy); numpy bools are bools
    from hiertail_fast import BalancedContrastiveLoss, GCNConv, load_dataset

    graph = _graph()
    calls = {
        "improved": lambda: GCNConv(4, 2, improved="no"),
        "bias": lambda: GCNConv(4, 2, bias=None),
        "add_self_loops": lambda: graph.gcn_norm_values(add_self_loops="no"),
        "include_self": lambda: BalancedContrastiveLoss(include_self="no"),
        "remaining": lambda: graph.with_self_loops(remaining=0),
        "return_entry_index": lambda: graph.subgraph(torch.tensor([0, 1]),
                                                     return_entry_index="no"),
        "relabel_by_size": lambda: load_npz(tmp_path / "g.npz", relabel_by_size="no"),
        "download": lambda: load_dataset("email", tmp_path, download="no"),
    }
    for name, call in calls.items():
        with pytest.raises(TypeError, match=f"{name} must be a bool"):
            call()
    # numpy bools pass and mean what they say
    conv = GCNConv(4, 2, improved=np.False_, bias=np.True_)
    assert conv.improved is False and conv.bias is not None
    a = gcn_propagate(X, graph, improved=np.True_, add_self_loops=np.bool_(False))
    torch.testing.assert_close(a, gcn_propagate(X, graph, improved=True, add_self_loops=False))
    exp = balanced_contrastive_loss(Z, Y, include_self=False)
    torch.testing.assert_close(balanced_contrastive_loss(Z, Y, include_self=np.False_), exp)
