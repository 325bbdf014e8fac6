"""bench/loss_golden.py: the bit-for-bit guard for loss refactors records every engine's calls
in both code paths and tells any difference apart, errors included."""
from __future__ import annotations

import pytest
import torch

from tests.conftest import load_bench, on_backend_device


def test_records_repeat_bit_for_bit_and_any_change_shows(tmp_path):
    on_backend_device("triton")      # its cases are CPU tensors: the interpreter (skip on CUDA)
    golden = load_bench("bench_loss_golden", "loss_golden.py")
    shape = ((33, 5, 2),)                       # the two-level problem: the cheapest
    a, b = golden.record(shape), golden.record(shape)
    assert a and not golden.differences(a, b)
    forms = {k[3] for k in a} | {k[4] for k in a}
    assert {"cpu", "cuda", "torch", "attention", "attention[kernels]", "triton",
            "reference"} <= forms
    # 33 rows, logit bound over max(64, 33): fp32 exact calls under "attention" run the torch
    # engine (the guard's rows rule), "attention[kernels]" the kernels, whose rounding differs
    exact = [k for k in a if k[4] == "torch" and k[5] == "exact" and "float32" in k[6]]
    assert exact
    def on(k, engine):
        return {k: a[(*k[:4], engine, *k[5:])]}

    assert not any(golden.differences({k: a[k]}, on(k, "attention")) for k in exact)
    assert any(golden.differences({k: a[k]}, on(k, "attention[kernels]")) for k in exact)
    assert all(len(v) == 2 for v in a.values()), [v for v in a.values() if len(v) == 1][:3]
    assert all(k[7] == "mean" for k in a if k[2] > 1)     # the hierarchical loss: mean only
    key = next(k for k in a if k[3] == "cuda" and k[4] == "attention" and "bfloat16" in k[6])
    value, grad = b[key]
    nudged = grad.clone()
    nudged.view(-1)[0] = torch.nextafter(nudged.view(-1)[0].float(),
                                         torch.tensor(float("inf"))).to(grad.dtype)
    b[key] = (value, nudged if not torch.equal(nudged, grad) else grad + 1)
    other = next(k for k in a if k != key)
    b[other] = ("RuntimeError: made up",)
    del b[next(k for k in a if k not in (key, other))]
    diff = golden.differences(a, b)
    assert len(diff) == 3 and any("only in one record" in line for line in diff)
    assert any(str(key) in line for line in diff) and any("made up" in line for line in diff)
    path_a, path_b = tmp_path / "a.pt", tmp_path / "b.pt"
    torch.save(a, path_a)
    torch.save(b, path_b)
    assert golden.main(["compare", str(path_a), str(path_a)]) == 0
    assert golden.main(["compare", str(path_a), str(path_b)]) == 1


def test_the_grid_problems_and_a_failing_call_are_recorded_as_documented():
    """The one-level problem has a class of three and a singleton; a call that raises is
    recorded by its error's type and message (two calls failing alike must say the same)."""
    golden = load_bench("bench_loss_golden", "loss_golden.py")
    _, z, ys, ps = next(golden._problems())
    counts = torch.bincount(ys[0]).tolist()
    assert 3 in counts and 1 in counts
    got = golden._one_call(z, ys, ps, "torch", "exact", torch.float32, "bogus", False, False)
    assert len(got) == 1 and got[0].startswith("ValueError: reduction='bogus'"), got


def test_the_emulated_attention_kernels_keep_their_contracts():
    """The stand-in of PyTorch's memory-efficient kernel returns the LSE padded to a multiple
    of 32 columns (NaN past the rows), which the engine's adapter must cut off; flash
    attention's applies its scale and returns O in the operands' dtype."""
    golden = load_bench("bench_loss_golden", "loss_golden.py")
    gen = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(1, 1, 5, 8, generator=gen) for _ in range(3))
    bias = torch.randn(1, 1, 5, 5, generator=gen)
    out, lse, *_ = golden._fake_efficient(q, k, v, bias, True, 0.0, False, scale=0.5)
    s = 0.5 * q @ k.transpose(-1, -2) + bias
    assert lse.shape == (1, 1, 32) and lse[..., 5:].isnan().all()
    torch.testing.assert_close(lse[..., :5], torch.logsumexp(s, -1))
    torch.testing.assert_close(out, torch.softmax(s, -1) @ v)
    qb, kb, vb = (t.to(torch.bfloat16) for t in (q, k, v))
    out, lse = golden._fake_flash(qb, kb, vb, 0.0, False, False, scale=0.5)
    s = 0.5 * qb.float() @ kb.float().transpose(-1, -2)
    assert out.dtype == torch.bfloat16 and lse.shape == (1, 1, 5)
    torch.testing.assert_close(lse, torch.logsumexp(s, -1))
    torch.testing.assert_close(out.float(), torch.softmax(s, -1) @ vb.float(), atol=2e-2,
                               rtol=2e-2)


def test_rows_rules_off_lifts_both_variants_rules_and_puts_them_back():
    """While inside, a small problem's limit is MAX_LOGIT for the official variant as for the
    exact one; afterwards the rows rules are back."""
    import hiertail_fast.ops._attention_lse as attn

    golden = load_bench("bench_loss_golden", "loss_golden.py")
    def limits():
        return {v: attn.rows_limit(v, torch.float32, 4) for v in ("official", "exact")}

    before = limits()
    assert all(before[v] < attn.MAX_LOGIT[v] for v in before)
    with golden.rows_rules_off():
        assert limits() == attn.MAX_LOGIT
    assert limits() == before


def test_differences_tell_each_kind_of_change_once_per_call():
    """A dtype change, a zero turned NaN, another error message, a call only in either record:
    each a difference, one line per differing call."""
    golden = load_bench("bench_loss_golden", "loss_golden.py")
    v, g = torch.tensor([0.0, 1.0]), torch.tensor([[1.0, 2.0]])
    a = {"same": (v, g), "dtype": (v, g), "nan": (v, g), "both": (v, g),
         "error": ("ValueError: one",)}
    b = {"same": (v.clone(), g.clone()), "dtype": (v.double(), g.double()),
         "nan": (torch.tensor([float("nan"), 1.0]), g), "both": (v + 1, g + 1),
         "error": ("ValueError: two",), "new": ("RuntimeError: x",)}
    expected = ["both", "dtype", "error", "nan", "only in one record: new"]
    assert sorted(golden.differences(a, b)) == expected
    assert sorted(golden.differences(b, a)) == expected


def test_record_and_compare_from_the_command_line(tmp_path, monkeypatch, capsys):
    """record: checks its file before running the grid, writes into a new folder and counts the
    calls that raised; compare: exit 1 on a single differing call, 0 on equal records, and a
    file that is not a record is refused with argparse's error."""
    golden = load_bench("bench_loss_golden", "loss_golden.py")
    t = torch.tensor([1.0, 2.0])
    ran = []
    calls = {("ok",): (t, t), ("raised",): ("ValueError: x",), ("too",): ("TypeError: y",)}
    monkeypatch.setattr(golden, "record", lambda: ran.append(1) or calls)
    with pytest.raises(SystemExit) as exc:
        golden.main(["record", str(tmp_path)])                      # a folder
    assert exc.value.code == 2 and f"record {tmp_path} cannot be written" in \
        capsys.readouterr().err and not ran
    path_a = tmp_path / "new" / "a.pt"
    assert golden.main(["record", str(path_a)]) == 0
    assert "3 calls recorded (2 raised)" in capsys.readouterr().out
    a = torch.load(path_a)
    assert not golden.differences(a, calls)
    path_b, path_c = tmp_path / "b.pt", tmp_path / "c.pt"
    torch.save({**a, ("ok",): (t, t + 1)}, path_b)
    torch.save(torch.zeros(2), path_c)
    assert golden.main(["compare", str(path_a), str(path_a)]) == 0
    capsys.readouterr()
    assert golden.main(["compare", str(path_a), str(path_b)]) == 1
    assert "3 calls, 1 differ" in capsys.readouterr().out
    with pytest.raises(SystemExit) as exc:
        golden.main(["compare", str(path_a), str(path_c)])
    assert exc.value.code == 2 and "(TypeError: not a dict of calls)" in capsys.readouterr().err


def test_differences_tell_an_infinity_from_the_largest_finite_value():
    """An inf that turns into the dtype's largest finite value (or back) is a difference, of
    either sign; the same infinities and NaNs in both records are not."""
    golden = load_bench("bench_loss_golden", "loss_golden.py")
    big, inf = torch.finfo(torch.float32).max, float("inf")
    g = torch.ones(2)
    for sign in (1.0, -1.0):
        a = {"k": (torch.tensor([sign * inf, 1.0]), g)}
        b = {"k": (torch.tensor([sign * big, 1.0]), g)}
        assert golden.differences(a, b) == golden.differences(b, a) == ["k"], sign
    same = {"k": (torch.tensor([inf, -inf, float("nan")]), g)}
    assert golden.differences(same, {"k": (same["k"][0].clone(), g.clone())}) == []
