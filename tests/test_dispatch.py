"""The automatic-backend table of ops/_dispatch.py and the override rules of choose_backend."""
from __future__ import annotations

import builtins

import pytest
import torch

from hiertail_fast import balanced_contrastive_loss
from hiertail_fast.ops import _dispatch
from hiertail_fast.ops._dispatch import AUTO_BACKEND, BACKENDS, OPS, auto_backend, choose_backend


class _FakeCuda(torch.Tensor):
    """A CPU tensor that reports a CUDA device, to exercise the CUDA rows without a GPU."""

    @property
    def device(self):
        return torch.device("cuda", 0)

    @property
    def is_cuda(self):
        return True


def _fake_cuda() -> torch.Tensor:
    return torch.zeros(3).as_subclass(_FakeCuda)


def test_every_op_has_a_measured_row_for_cpu_and_cuda():
    assert set(AUTO_BACKEND) == set(OPS)
    for op, rows in AUTO_BACKEND.items():
        assert {"cpu", "cuda"} <= set(rows), op
        for device_class, row in rows.items():
            allowed = BACKENDS + _dispatch.OP_BACKENDS.get(op, ())
            assert row.backend in allowed and row.backend != "reference", (op, device_class)
            assert row.evidence.strip(), (op, device_class)
        # triton on CPU is the test interpreter
        assert rows["cpu"].backend in ("torch", "attention")
        assert "H200" in rows["cuda"].evidence  # the card the figures came from


def test_cuda_rows_follow_the_h200_measurements():
    # SUMMARY.md §4 of the 2026-11-26 H200 run; the loss: PyTorch's attention kernels (the
    # prototype of issue 9 on the same H200, 0.0085 s vs triton 0.251 s)
    assert {op: rows["cuda"].backend for op, rows in AUTO_BACKEND.items()} == {
        "gcn_propagate": "torch", "topk_pool": "triton", "nearest_prototype": "triton",
        "balanced_contrastive_loss": "attention"}


def test_attention_row_falls_back_where_the_kernels_are_missing(monkeypatch):
    op = "balanced_contrastive_loss"
    monkeypatch.setattr(_dispatch, "_attention_available", lambda device: False)
    # our torch engine (cuBLAS on CUDA), which measured faster than the Triton kernels there,
    # whether or not triton is importable
    for has_triton in (True, False):
        monkeypatch.setattr(_dispatch, "triton_available", lambda device, t=has_triton: t)
        assert auto_backend(op, "cuda") == "torch"


@pytest.mark.parametrize("op", OPS)
def test_auto_choice_per_device(monkeypatch, op):
    monkeypatch.delenv(_dispatch.ENV_VAR, raising=False)
    assert choose_backend(torch.zeros(3), op=op) == AUTO_BACKEND[op]["cpu"].backend
    monkeypatch.setattr(_dispatch, "triton_available", lambda device: device.type == "cuda")
    assert choose_backend(_fake_cuda(), op=op) == AUTO_BACKEND[op]["cuda"].backend
    assert auto_backend(op, "cuda") == AUTO_BACKEND[op]["cuda"].backend
    assert auto_backend(op, "mps") == "torch"  # a device class without a row


@pytest.mark.parametrize("op", OPS)
def test_cuda_falls_back_to_torch_without_triton(monkeypatch, op):
    monkeypatch.delenv(_dispatch.ENV_VAR, raising=False)
    real_import = builtins.__import__

    def no_triton(name, *args, **kwargs):
        if name == "triton" or name.startswith("triton."):
            raise ImportError("triton is not installed (test)")
        return real_import(name, *args, **kwargs)

    monkeypatch.setattr(builtins, "__import__", no_triton)
    assert not _dispatch.triton_available(torch.device("cuda"))
    # the loss's attention engine needs no triton; every triton row falls back to torch
    expected = "attention" if AUTO_BACKEND[op]["cuda"].backend == "attention" else "torch"
    assert choose_backend(_fake_cuda(), op=op) == expected
    assert choose_backend(_fake_cuda()) == "torch"  # the old rule falls back too


def test_old_rule_without_op(monkeypatch):
    monkeypatch.delenv(_dispatch.ENV_VAR, raising=False)
    assert choose_backend(torch.zeros(3)) == "torch"
    assert choose_backend(torch.zeros(3), None) == "torch"  # positional signature
    monkeypatch.setattr(_dispatch, "triton_available", lambda device: device.type == "cuda")
    assert choose_backend(_fake_cuda()) == "triton"  # CUDA -> triton when no op is named
    assert choose_backend(_fake_cuda(), op="gcn_propagate") == "torch"


def test_overrides_argument_over_env_over_table(monkeypatch):
    monkeypatch.setattr(_dispatch, "triton_available", lambda device: True)
    monkeypatch.setenv(_dispatch.ENV_VAR, "reference")
    for op in OPS:
        assert choose_backend(_fake_cuda(), op=op) == "reference"
        assert choose_backend(_fake_cuda(), "torch", op=op) == "torch"
        assert choose_backend(torch.zeros(3), "triton", op=op) == "triton"
    monkeypatch.setenv(_dispatch.ENV_VAR, " Triton ")
    assert choose_backend(_fake_cuda(), op="gcn_propagate") == "triton"  # env beats the table


def test_forcing_triton_where_it_cannot_run_is_a_clear_error(monkeypatch):
    monkeypatch.setattr(_dispatch, "triton_available", lambda device: False)
    with pytest.raises(ValueError, match="needs CUDA tensors"):
        choose_backend(torch.zeros(3), "triton", op="topk_pool")
    monkeypatch.setenv(_dispatch.ENV_VAR, "triton")
    with pytest.raises(ValueError, match="needs CUDA tensors"):
        choose_backend(torch.zeros(3), op="topk_pool")


def test_bad_arguments(monkeypatch):
    monkeypatch.delenv(_dispatch.ENV_VAR, raising=False)
    with pytest.raises(ValueError, match="backend='cuda'"):
        choose_backend(torch.zeros(3), "cuda")
    with pytest.raises(ValueError, match="op='spmm'"):
        choose_backend(torch.zeros(3), op="spmm")
    with pytest.raises(ValueError, match="op='spmm'"):
        auto_backend("spmm", "cpu")
    with pytest.raises(TypeError, match="torch.Tensor"):
        choose_backend([1.0, 2.0], op="topk_pool")
    # the loss's own list, with its attention engine named
    with pytest.raises(ValueError, match=r"backend='x' is not one of .*'attention'"):
        _dispatch.choose_loss_backend(torch.zeros(3, 2), "x", "exact")
    monkeypatch.setenv(_dispatch.ENV_VAR, "fast")
    with pytest.raises(ValueError, match="HIERTAIL_BACKEND='fast'"):
        choose_backend(torch.zeros(3), op="topk_pool")
    # the loss's own engine is no graph op's backend, named or from the environment, and a
    # forced backend does not skip the op's check (the s72 audit: D24, D25, D26)
    monkeypatch.delenv(_dispatch.ENV_VAR)
    with pytest.raises(ValueError, match="backend='attention' is not one of"):
        choose_backend(torch.zeros(3), "attention", op="nearest_prototype")
    with pytest.raises(ValueError, match="op='spmm'"):
        choose_backend(torch.zeros(3), "torch", op="spmm")
    monkeypatch.setenv(_dispatch.ENV_VAR, "attention")
    with pytest.raises(ValueError, match="HIERTAIL_BACKEND='attention' is not one of"):
        choose_backend(torch.zeros(3), op="topk_pool")
    with pytest.raises(ValueError, match="HIERTAIL_BACKEND='attention' is not one of"):
        balanced_contrastive_loss(torch.randn(6, 2), torch.tensor([0, 0, 1, 1, 2, 2]))


@pytest.mark.parametrize("module, op", [
    ("hiertail_fast.ops.gcn_propagate", "gcn_propagate"),
    ("hiertail_fast.ops.topk_pool", "topk_pool"),
    ("hiertail_fast.ops.nearest_prototype", "nearest_prototype"),
    # the loss's own entry, choose_loss_backend, lives in _dispatch and is its only caller
    ("hiertail_fast.ops._dispatch", "balanced_contrastive_loss"),
])
def test_every_call_site_names_its_op(module, op):
    """Every choose_backend call of an op module passes that op's name (else the table is
    silently bypassed for it)."""
    import ast
    import importlib

    source = importlib.import_module(module).__file__
    tree = ast.parse(open(source, encoding="utf-8").read())
    calls = [c for c in ast.walk(tree) if isinstance(c, ast.Call)
             and getattr(c.func, "id", None) == "choose_backend"]
    assert calls, f"{module} never calls choose_backend"
    for call in calls:
        ops = [k.value.value for k in call.keywords
               if k.arg == "op" and isinstance(k.value, ast.Constant)]
        assert ops == [op], f"{module}:{call.lineno} calls choose_backend without op={op!r}"


def test_loss_engine_refinement_on_cpu(monkeypatch):
    """On CPU the attention engine serves the exact single-level loss only, and only without
    our C kernels (here: switched off; measured); the official variant and several levels keep
    our fused engine."""
    from hiertail_fast.ops.balanced_contrastive_loss import choose_loss_backend

    monkeypatch.delenv(_dispatch.ENV_VAR, raising=False)
    monkeypatch.setenv("HIERTAIL_SYMMETRIC", "0")
    z = torch.zeros(4, 2)
    assert choose_loss_backend(z, None, "exact") == "attention"
    assert choose_loss_backend(z, None, "official") == "torch"
    assert choose_loss_backend(z, None, "exact", n_levels=3) == "torch"
    assert choose_loss_backend(z, None, "exact", n_levels=2) == "torch"  # (> 2 passed; s69)
    assert choose_loss_backend(z, "torch", "exact") == "torch"           # explicit wins
    assert choose_loss_backend(z.double(), None, "exact") == "torch"     # float64: own engine


def test_loss_engine_refinement_on_cuda(monkeypatch):
    """On CUDA (measured on an H200): the attention kernels for the exact single-level loss, our
    torch engine (cuBLAS) for the official variant and for several levels."""
    from hiertail_fast.ops.balanced_contrastive_loss import choose_loss_backend

    monkeypatch.delenv(_dispatch.ENV_VAR, raising=False)
    monkeypatch.setattr(_dispatch, "_attention_available", lambda device: True)
    z = torch.zeros(600, 2).as_subclass(_FakeCuda)
    assert choose_loss_backend(z, None, "exact") == "attention"
    assert choose_loss_backend(z, None, "official") == "torch"
    assert choose_loss_backend(z, None, "exact", n_levels=3) == "torch"
    assert choose_loss_backend(z, None, "exact", n_levels=2) == "torch"  # (> 2 passed; s69)
    assert choose_loss_backend(z, "attention", "official") == "attention"  # explicit wins


def test_the_loss_ops_choose_through_choose_loss_backend():
    import ast
    import importlib

    source = importlib.import_module("hiertail_fast.ops.balanced_contrastive_loss").__file__
    tree = ast.parse(open(source, encoding="utf-8").read())
    names = [getattr(c.func, "id", None) for c in ast.walk(tree) if isinstance(c, ast.Call)]
    assert names.count("choose_loss_backend") == 2          # the single and hierarchical ops
    # ... refined on their concatenated rows in settle_engine, through _apply, which both ops
    # call

    def calls_in(name):
        fn = next(f for f in ast.walk(tree) if isinstance(f, ast.FunctionDef) and f.name == name)
        return [getattr(c.func, "id", None) for c in ast.walk(fn) if isinstance(c, ast.Call)]

    assert names.count("refine_loss_backend") == calls_in("settle_engine").count(
        "refine_loss_backend") == 1
    assert calls_in("_apply").count("settle_engine") == names.count("settle_engine") == 1
    assert names.count("_apply") == 2
    assert "choose_backend" not in names


def _fake_cuda_rows(n: int, bound: float, scale: float = 10.0) -> torch.Tensor:
    """n fp32 rows (as a fake CUDA tensor) whose logits bound scale * max |z_i|^2 is `bound`."""
    z = torch.zeros(n, 2)
    z[:, 0] = (bound / scale) ** 0.5
    return z.as_subclass(_FakeCuda)


def test_automatic_cuda_choices_by_size_dtype_and_logits(monkeypatch):
    """refine_loss_backend, the measured table in ops/_dispatch.py: fp32 goes to triton from
    TRITON_MIN_ROWS[variant] rows while the logits suit its 3xTF32 dots, the official single
    level to attention from ATTENTION_OFFICIAL_MIN_ROWS within its guard (Triton only up to
    TRITON_MAX_DIM columns, the head dim it was measured at); bf16 exact goes to
    attention at any size and level count, bf16 official to triton from TRITON_MIN_ROWS_BF16;
    float64, CPU tensors, small problems, large logits keep the choice; $HIERTAIL_TRITON_FP32_DOT
    =ieee (slow exact dots), a card without TF32 tensor cores or no triton: never triton."""
    from hiertail_fast.ops import _attention_lse, _triton_loss

    monkeypatch.delenv(_triton_loss.FP32_DOT_ENV, raising=False)
    monkeypatch.setattr(_dispatch, "_attention_available", lambda device: True)
    monkeypatch.setattr(_dispatch, "triton_available", lambda device: True)
    monkeypatch.setattr(_triton_loss, "tf32_cores", lambda device: True)   # an H200
    refine, rows = _dispatch.refine_loss_backend, _fake_cuda_rows
    tri, att = _dispatch.TRITON_MIN_ROWS, _dispatch.ATTENTION_OFFICIAL_MIN_ROWS
    assert att < tri["official"] and tri["exact"] <= att
    small = 0.5 * _attention_lse.MAX_LOGIT["official"]            # within every limit
    over = 2.0 * _triton_loss.TF32X3_MAX_LOGIT["exact"]           # over every fp32 limit
    for choice in ("attention", "torch"):
        assert refine(choice, rows(tri["exact"], small), 10.0, "exact") == "triton"
        assert refine(choice, rows(tri["exact"], small), 10.0, "exact", 3) == "triton"
        assert refine(choice, rows(tri["exact"] - 1, small), 10.0, "exact") == choice
        assert refine(choice, rows(tri["exact"], over), 10.0, "exact") == choice
        assert refine(choice, rows(tri["official"], small), 10.0, "official", 3) == "triton"
        assert refine(choice, rows(att, small), 10.0, "official") == "attention"
        assert refine(choice, rows(att, small), 10.0, "official", 3) == choice
        assert refine(choice, rows(att - 1, small), 10.0, "official") == choice
        assert refine(choice, rows(tri["official"], over), 10.0, "official") == choice
        assert refine(choice, rows(tri["exact"], small).double(), 10.0, "exact") == choice
        assert refine(choice, torch.zeros(tri["official"], 2), 10.0, "exact") == choice  # CPU
        # bf16
        b16 = rows(100, over * 2).bfloat16()
        assert refine(choice, b16, 10.0, "exact") == "attention"       # (the op's guard next)
        assert refine(choice, b16, 10.0, "exact", 3) == "attention"
        assert refine(choice, b16, 10.0, "official") == choice
        big16 = rows(_dispatch.TRITON_MIN_ROWS_BF16["official"], small).bfloat16()
        assert refine(choice, big16, 10.0, "official", 3) == "triton"
        # wider than the measured head dim: the Triton rows do not apply
        wide = torch.zeros(tri["official"], _dispatch.TRITON_MAX_DIM + 1)
        wide[:, 0] = (small / 10.0) ** 0.5
        wide = wide.as_subclass(_FakeCuda)
        assert refine(choice, wide, 10.0, "exact") == choice
        assert refine(choice, wide, 10.0, "official") == "attention"
        assert refine(choice, wide.bfloat16(), 10.0, "official") == choice
        # exactly the measured head dim is served (a mutation audit: `<` passed every test)
        at = torch.zeros(tri["exact"], _dispatch.TRITON_MAX_DIM)
        at[:, 0] = (small / 10.0) ** 0.5
        assert refine(choice, at.as_subclass(_FakeCuda), 10.0, "exact") == "triton"
        at16 = torch.zeros(_dispatch.TRITON_MIN_ROWS_BF16["official"], _dispatch.TRITON_MAX_DIM)
        at16[:, 0] = (small / 10.0) ** 0.5
        assert refine(choice, at16.bfloat16().as_subclass(_FakeCuda), 10.0, "official") \
            == "triton"                                # (bf16's `<`: the s72 audit, D16)
        # fp16 rows do not take the fp32 rules (the official single level's attention row)
        assert refine(choice, rows(att, small).half(), 10.0, "official") == choice
    assert refine("reference", rows(tri["exact"], small), 10.0, "exact") == "reference"
    monkeypatch.setenv(_triton_loss.FP32_DOT_ENV, "ieee")
    assert refine("torch", rows(tri["official"], small), 10.0, "official") == "attention"
    assert refine("torch", rows(tri["exact"], small), 10.0, "exact") == "torch"
    monkeypatch.delenv(_triton_loss.FP32_DOT_ENV)
    # a card without TF32 tensor cores (before Ampere): never triton
    monkeypatch.setattr(_triton_loss, "tf32_cores", lambda device: False)
    assert refine("torch", rows(tri["exact"], small), 10.0, "exact") == "torch"
    assert refine("torch", rows(tri["official"], small), 10.0, "official") == "attention"
    big16 = rows(_dispatch.TRITON_MIN_ROWS_BF16["official"], small).bfloat16()
    assert refine("torch", big16, 10.0, "official") == "torch"
    monkeypatch.setattr(_triton_loss, "tf32_cores", lambda device: True)
    monkeypatch.setattr(_dispatch, "triton_available", lambda device: False)
    assert refine("torch", rows(tri["official"], small), 10.0, "official") == "attention"
    assert refine("torch", rows(tri["exact"], small), 10.0, "exact") == "torch"
    # a torch without the attention kernels: never attention, in any row that names it
    # (choose_loss_backend refuses backend="attention" there; the s72 audit, D34 and D35)
    monkeypatch.setattr(_dispatch, "_attention_available", lambda device: False)
    for variant, levels in (("exact", 1), ("exact", 3), ("official", 1), ("official", 3)):
        for z in (rows(att, small), rows(tri["official"], small), rows(100, small).bfloat16(),
                  rows(tri["official"], small).bfloat16()):
            assert refine("torch", z, 10.0, variant, levels) == "torch", (variant, levels, z.dtype)


def test_the_backend_switch_reaches_the_loss(monkeypatch):
    """$HIERTAIL_BACKEND names the loss engine when the call names none (bench/test_epoch.py's
    'torch' rows rely on it); a dispatch that took the automatic choice instead passed every
    test, as only =reference was checked and the op handles that one itself (a mutation
    audit). Without the C kernels the automatic CPU choice would be the attention kernel."""
    monkeypatch.setenv("HIERTAIL_SYMMETRIC", "0")
    assert _dispatch.choose_loss_backend(torch.randn(64, 8), None, "exact") == "attention"
    monkeypatch.setenv("HIERTAIL_BACKEND", "torch")
    assert _dispatch.choose_loss_backend(torch.randn(64, 8), None, "exact") == "torch"


def test_triton_interpret_is_read_as_triton_reads_it(monkeypatch):
    """TRITON_INTERPRET=true (yes, on, y; any case) runs Triton's interpreter as "1" does:
    a CPU request is then not refused as needing CUDA, and the kernels' launchers know they
    are interpreted; "0", "false", "2" or unset: not interpreting."""
    for value in ("1", "true", "TRUE", " yes ", "on", "y"):
        monkeypatch.setenv("TRITON_INTERPRET", value)
        assert _dispatch.triton_interpreting(), value
        reason = _dispatch.triton_unavailable_reason(torch.device("cpu"))
        assert reason is None or "needs CUDA tensors" not in reason, (value, reason)
    for value in ("0", "false", "off", "2", ""):
        monkeypatch.setenv("TRITON_INTERPRET", value)
        assert not _dispatch.triton_interpreting(), value
        assert "needs CUDA tensors" in _dispatch.triton_unavailable_reason(torch.device("cpu"))
    monkeypatch.delenv("TRITON_INTERPRET")
    assert not _dispatch.triton_interpreting()
    pytest.importorskip("triton")
    from hiertail_fast.kernels import _utils

    for value, want in (("true", True), ("false", False), ("1", True)):
        monkeypatch.setenv("TRITON_INTERPRET", value)
        assert _utils.interpreting() is want, value


def test_a_triton_request_names_what_is_missing(monkeypatch):
    """backend="triton" where the kernels cannot run names the missing piece (a packaging
    audit: TRITON_INTERPRET=1 without triton installed, or a source checkout imported without
    installing it, let the request through to a bare ModuleNotFoundError inside the op)."""
    x = torch.zeros(3)
    monkeypatch.setenv("TRITON_INTERPRET", "0")
    with pytest.raises(ValueError, match="needs CUDA tensors"):
        choose_backend(x, "triton")
    # unset, as for most CPU users: the same refusal (not the interpreter, which crashed
    # inside Triton with "0 active drivers")
    monkeypatch.delenv("TRITON_INTERPRET")
    assert "needs CUDA tensors" in _dispatch.triton_unavailable_reason(x.device)
    for other in ("meta", "mps"):      # not only CPU tensors: every device but CUDA (s72, D02)
        assert "needs CUDA tensors" in _dispatch.triton_unavailable_reason(torch.device(other))
    with pytest.raises(ValueError, match="needs CUDA tensors"):
        choose_backend(torch.zeros(3, device="meta"), "triton", op="topk_pool")
    with pytest.raises(ValueError, match="needs CUDA tensors"):
        balanced_contrastive_loss(torch.randn(6, 2), torch.tensor([0, 0, 1, 1, 2, 2]),
                                  backend="triton")
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    real_import = builtins.__import__

    def no_triton(name, *args, **kwargs):
        if name == "triton" or name.startswith("triton."):
            raise ImportError("triton is not installed (test)")
        return real_import(name, *args, **kwargs)

    with monkeypatch.context() as m:
        m.setattr(builtins, "__import__", no_triton)
        assert not _dispatch.triton_available(x.device)
        with pytest.raises(ValueError,
                           match=r"not installed \(pip install 'hiertail_fast\[triton\]'\)"):
            choose_backend(x, "triton")
    pytest.importorskip("triton")
    monkeypatch.setattr(_dispatch, "_kernels_importable", lambda: False)
    assert not _dispatch.triton_available(torch.device("cuda"))
    with pytest.raises(ValueError, match="source checkout imported without being installed"):
        choose_backend(x, "triton")
    monkeypatch.undo()
    assert _dispatch._kernels_importable()  # this test's install maps the kernels
