"""bench/engine_ab.py (in-process A/B of the torch engine's alternative paths): every switch
runs end to end on a tiny case, really swaps the path while timing, and restores the library's
own path afterwards."""
from __future__ import annotations

import os
import re
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch

import hiertail_fast.ops._lse_torch as lse_mod
import hiertail_fast.ops._positive_blocks as blocks_mod
import hiertail_fast.ops._positive_keys as keys_mod

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "bench"))
import engine_ab  # noqa: E402

pytestmark = pytest.mark.usefixtures("one_thread")


@pytest.mark.parametrize("switch, levels", [("fold", 1), ("weights", 3), ("rest", 3)])
def test_each_switch_runs_swaps_and_restores(switch, levels, capsys, monkeypatch):
    real = (lse_mod.level_weights, keys_mod.constant_per_group,
            blocks_mod.BlockPositives._rest_columns)
    seen = []
    spy = {"weights": (lse_mod, "level_weights"),
           "fold": (keys_mod, "constant_per_group"),
           "rest": (blocks_mod.BlockPositives, "_rest_columns")}[switch]
    original = getattr(*spy)

    def watch(*a, **k):
        seen.append(getattr(*spy) is watch)
        return original(*a, **k)

    monkeypatch.setattr(*spy, watch)
    assert engine_ab.main(["--switch", switch, "--levels", str(levels), "--n", "150",
                           "--d", "8", "--rounds", "2", "--regimes", "relu"]) == 0
    out = capsys.readouterr().out
    assert "new/old" in out and "relu" in out
    # one block per call at this size: the new path's 2 calls (rounds) reach the spy, the old
    # path's 2 calls do not (4 would mean the switch never swapped); restored after
    assert len(seen) == 2 and all(seen) and getattr(*spy) is watch
    monkeypatch.undo()
    assert (lse_mod.level_weights, keys_mod.constant_per_group,
            blocks_mod.BlockPositives._rest_columns) == real


def test_switch_gemm_runs_each_provider_in_turn_and_restores(capsys, monkeypatch):
    """old = torch.mm (blas), new = oneDNN, alternating; the user's setting after."""
    import hiertail_fast.ops._lse_symmetric as sym
    import hiertail_fast.ops._onednn_gemm as gemm_mod

    if gemm_mod._unavailable() is not None or not sym.available():
        pytest.skip("no oneDNN GEMM or no symmetric engine here")
    monkeypatch.setenv(gemm_mod.ENV_VAR, "BLAS ")
    monkeypatch.setattr(sym, "MIN_ROWS", 1)
    seen = []
    real = sym.lse_fused

    def spy(*a, **k):
        seen.append(gemm_mod.provider())
        return real(*a, **k)

    monkeypatch.setattr(sym, "lse_fused", spy)
    assert engine_ab.main(["--switch", "gemm", "--levels", "1", "--variant", "exact",
                           "--n", "150", "--d", "8", "--rounds", "2", "--regimes", "relu"]) == 0
    assert "new/old" in capsys.readouterr().out
    assert seen == ["blas", "onednn"] * 2              # forward + backward share one call
    assert os.environ[gemm_mod.ENV_VAR] == "BLAS "
    monkeypatch.delenv(gemm_mod.ENV_VAR)              # unset before: unset after
    seen.clear()
    assert engine_ab.main(["--switch", "gemm", "--levels", "1", "--variant", "exact",
                           "--n", "150", "--d", "8", "--rounds", "2", "--regimes", "relu"]) == 0
    assert seen == ["blas", "onednn"] * 2
    assert gemm_mod.ENV_VAR not in os.environ


def test_switch_all_runs_and_restores(capsys):
    real = (lse_mod.level_weights, keys_mod.constant_per_group,
            blocks_mod.BlockPositives._rest_columns)
    assert engine_ab.main(["--switch", "all", "--levels", "1", "--n", "150", "--d", "8",
                           "--rounds", "2", "--regimes", "relu"]) == 0
    assert "new/old" in capsys.readouterr().out
    assert (lse_mod.level_weights, keys_mod.constant_per_group,
            blocks_mod.BlockPositives._rest_columns) == real


def test_bad_arguments_exit_with_a_message():
    with pytest.raises(SystemExit):
        engine_ab.main(["--switch", "fold", "--rounds", "1"])


def test_the_checkout_switch_is_gone():
    """Replaced by ``version_ab.py`` (the other revision with its own C kernels: an older
    ``_positive_blocks.py`` against this checkout's kernel would call it with another
    argument list)."""
    with pytest.raises(SystemExit):
        engine_ab.main(["--switch", "checkout"])


def test_switch_native_swaps_the_kernel_and_times_exact(capsys, monkeypatch):
    """--switch native: the new rounds build the positives with the C kernel, the old rounds
    without it (the torch path); --exact adds the exact variant and the official / exact
    ratios. The library's own ``native_kernel`` is back afterwards."""
    real = blocks_mod.native_kernel
    if real(torch.float32) is None:
        pytest.skip("no C compiler here: nothing to switch")
    built = []
    real_init = blocks_mod.BlockPositives.__init__

    def spy_init(self, *a, **k):
        real_init(self, *a, **k)
        built.append(self.native is not None)

    monkeypatch.setattr(blocks_mod.BlockPositives, "__init__", spy_init)
    assert engine_ab.main(["--switch", "native", "--levels", "1", "--n", "150", "--d", "8",
                           "--rounds", "2", "--regimes", "relu", "--exact"]) == 0
    out = capsys.readouterr().out
    assert "new/exact" in out and "old/exact" in out
    assert built == [False, True, False, True]          # 2 rounds x (old, new)
    assert blocks_mod.native_kernel is real
    with pytest.raises(SystemExit):
        engine_ab.main(["--switch", "native", "--variant", "exact", "--exact"])


def test_switch_blockexp_swaps_the_block_kernel_and_restores(capsys, monkeypatch):
    """--switch blockexp: the new rounds run every block through the C kernel, the old rounds
    through the torch passes; --exact-backend attention times the exact variant on PyTorch's
    kernel. The library's own ``kernel`` is back afterwards."""
    import hiertail_fast.ops._block_exp as block_mod

    real = block_mod.kernel
    if real() is None:
        pytest.skip("no C compiler here: nothing to switch")
    paths = []
    real_native, real_ref = block_mod.native_step, block_mod.reference_step
    monkeypatch.setattr(block_mod, "native_step",
                        lambda *a: paths.append("C") or real_native(*a))
    monkeypatch.setattr(block_mod, "reference_step",
                        lambda *a: paths.append("torch") or real_ref(*a))
    assert engine_ab.main(["--switch", "blockexp", "--levels", "1", "--n", "150", "--d", "8",
                           "--rounds", "2", "--regimes", "relu", "--exact",
                           "--exact-backend", "attention"]) == 0
    out = capsys.readouterr().out
    assert "exact variant on attention" in out and "new/exact" in out
    # one block per loss: 2 rounds x (old, new); the attention backend's exact loss runs no
    # block of ours
    assert paths == ["torch", "C", "torch", "C"]
    assert block_mod.kernel is real


def test_switch_posthreads_sets_and_restores_the_threshold(capsys, monkeypatch):
    seen = []
    real_kernel = blocks_mod.BlockPositives._kernel

    def spy(self, *a, **k):
        seen.append(blocks_mod.PARALLEL_MIN_ENTRIES)
        return real_kernel(self, *a, **k)

    monkeypatch.setattr(blocks_mod.BlockPositives, "_kernel", spy)
    real = blocks_mod.PARALLEL_MIN_ENTRIES
    assert engine_ab.main(["--switch", "posthreads", "--levels", "1", "--n", "150", "--d", "8",
                           "--rounds", "2", "--regimes", "relu"]) == 0
    assert "new/old" in capsys.readouterr().out
    if blocks_mod.native_kernel(torch.float32) is not None:
        assert seen and set(seen) == {real, 1 << 62}
    assert blocks_mod.PARALLEL_MIN_ENTRIES == real


def test_version_ab_times_another_revision(capsys, tmp_path):
    """bench/version_ab.py: HEAD's package unpacked under another name (its imports rewritten,
    nothing of it resolving to this checkout's modules), timed against this checkout; the two
    gradients compared first."""
    import subprocess

    import version_ab

    root = Path(__file__).resolve().parents[1]
    if subprocess.run(["git", "-C", str(root), "rev-parse", "HEAD"],
                      capture_output=True).returncode != 0:
        pytest.skip("not a git checkout")
    pkg = version_ab.unpack_revision("HEAD", tmp_path)
    assert (pkg / "__init__.py").is_file()
    text = "".join(p.read_text() for p in pkg.rglob("*.py"))
    assert "hiertail_fast_rev" in text and "import hiertail_fast\n" not in text
    assert "from hiertail_fast." not in text and "from hiertail_fast import" not in text
    assert version_ab.main(["--rev", "HEAD", "--levels", "1", "--n", "150", "--d", "8",
                            "--rounds", "2", "--regimes", "relu", "--exact"]) == 0
    out = capsys.readouterr().out
    assert "new/old" in out and "new/exact" in out and "grad diff" in out
    assert "torch engine" in out
    calls = []                                     # --backend: both revisions run that engine
    real = version_ab.loss_step
    version_ab.loss_step = lambda *a: calls.append(a[6]) or real(*a)     # (its backend)
    try:
        assert version_ab.main(["--rev", "HEAD", "--n", "60", "--d", "8", "--rounds", "2",
                                "--regimes", "relu", "--backend", "attention"]) == 0
    finally:
        version_ab.loss_step = real
    assert calls == ["attention", "attention"] and "attention engine" in capsys.readouterr().out
    # --learnable-temperature: tau a tensor that requires grad, both revisions' dL/dtau shown
    assert version_ab.main(["--rev", "HEAD", "--n", "60", "--d", "8", "--rounds", "2",
                            "--regimes", "relu", "--learnable-temperature"]) == 0
    out = capsys.readouterr().out
    taus = re.search(r"dL/dtau old (\S+) new (\S+)$", out, re.M)
    assert "learnable tau" in out and "new/float tau" in out and taus, out
    assert float(taus.group(1)) == float(taus.group(2)) != 0.0       # the same revision
    with pytest.raises(SystemExit):
        version_ab.main(["--rev", "no-such-revision-xyz", "--n", "50", "--rounds", "2"])
    if not torch.cuda.is_available():           # --device cuda: a clear refusal without one
        with pytest.raises(SystemExit):
            version_ab.main(["--rev", "HEAD", "--device", "cuda"])
        assert "--device cuda: no CUDA device here" in capsys.readouterr().err


def test_cpu_engine_tools_stay_on_the_cpu_where_cuda_is_the_default(monkeypatch, tmp_path,
                                                                     capsys):
    """engine_ab / block_costs / version_ab (by default) measure the CPU engines' internals:
    on a GPU machine (where bench's DEVICE is "cuda") their cases must still be CPU tensors.
    Emulated here by making "cuda" the default: an unpinned tool would fail moving its case to
    a CUDA-less device."""
    import block_costs
    import loss_grid
    import version_ab

    monkeypatch.setattr(loss_grid, "DEVICE", "cuda")
    assert engine_ab.main(["--switch", "fold", "--levels", "1", "--n", "120", "--d", "8",
                           "--rounds", "2", "--regimes", "relu"]) == 0
    assert block_costs.main(["--sizes", "300", "--dims", "8", "--rounds", "1", "--reps", "1",
                             "--tile", "128", "--out", str(tmp_path / "bc.json")]) == 0
    assert version_ab.main(["--rev", "HEAD", "--n", "120", "--d", "8", "--rounds", "2",
                            "--regimes", "relu"]) == 0
    assert loss_grid.DEVICE == "cuda"                    # restored after each tool
    capsys.readouterr()


def test_epoch_ab_times_a_whole_epoch_against_another_revision(capsys):
    """bench/epoch_ab.py: the same HierTail epoch from HEAD's unpacked package and from this
    checkout, in turn; at HEAD the two losses agree to the bit (the same seeds, graph and
    model), which the line reports before the times."""
    import re
    import subprocess

    import epoch_ab

    root = Path(__file__).resolve().parents[1]
    if subprocess.run(["git", "-C", str(root), "diff", "--quiet", "HEAD", "--",
                       "hiertail_fast"], capture_output=True).returncode != 0:
        pytest.skip("not a git checkout, or the package differs from HEAD")
    assert epoch_ab.main(["--rev", "HEAD", "--nodes", "120", "--rounds", "2", "--classes", "5",
                          "--features", "8", "--hidden", "8"]) == 0
    out = capsys.readouterr().out
    line = next(t for t in out.splitlines() if "nodes" in t and "new/old" in t)
    assert float(re.search(r"max loss rel diff (\S+)", line).group(1)) == 0.0
    # the unpacked package is dropped after the run (a later tool in the same process
    # resolved a stale one, whose directory was gone, and failed on its submodules)
    assert not any(m.startswith("hiertail_fast_rev") for m in sys.modules)
    assert epoch_ab.main(["--rev", "HEAD", "--nodes", "120", "--rounds", "2", "--classes", "5",
                          "--features", "8", "--hidden", "8"]) == 0
    with pytest.raises(SystemExit):
        epoch_ab.main(["--rev", "HEAD", "--nodes", "10", "--classes", "5"])


def test_hub_rows_times_the_propagation_against_another_revision(capsys):
    """bench/hub_rows.py at HEAD against this checkout (the same package): both sides' hub
    errors are reported and equal, and small (float32 against the float64 truth)."""
    import re
    import subprocess

    import hub_rows

    root = Path(__file__).resolve().parents[1]
    if subprocess.run(["git", "-C", str(root), "diff", "--quiet", "HEAD", "--",
                       "hiertail_fast"], capture_output=True).returncode != 0:
        pytest.skip("not a git checkout, or the package differs from HEAD")
    assert hub_rows.main(["--rev", "HEAD", "--nodes", "3000", "--hubs", "2", "--hub-degree",
                          "9000", "--d", "4", "--rounds", "2"]) == 0
    out = capsys.readouterr().out
    errors = {side: float(re.search(rf"^{side}: .*max rel error (\S+),", out, re.M).group(1))
              for side in ("old", "new")}
    assert errors["old"] == errors["new"] < 1e-5 and "new/old" in out
    with pytest.raises(SystemExit):
        hub_rows.main(["--rev", "HEAD", "--rounds", "1"])


@pytest.mark.parametrize("tool", ["hub_rows", "engine_ab", "version_ab", "epoch_ab", "loss_grid",
                                  "attention_guard", "loss_accuracy", "interleaved"])
def test_bench_tools_run_without_pytest(tool, tmp_path):
    """After the main job's plain `pip install -e .` (no pytest): the command-line tools start
    (they took DEVICE from bench/conftest.py, which imports pytest: ModuleNotFoundError);
    interleaved.py, which times the pytest-benchmark suites' own steps, says it needs the
    test extra."""
    from tests._preloaded_cli import run_script

    bench = Path(__file__).resolve().parents[1] / "bench"
    wrapper = tmp_path / "without_pytest.py"   # (the preloaded server imports no pytest)
    wrapper.write_text("import runpy, sys; sys.modules['pytest'] = None; sys.argv = ['x', "
                       f"'--help']; runpy.run_path({str(bench / (tool + '.py'))!r}, "
                       "run_name='__main__')\n")
    proc = run_script(wrapper, timeout=300)
    if tool == "interleaved":
        assert proc.returncode == 1 and "needs the test extra" in proc.stderr
    else:
        assert proc.returncode == 0 and "usage:" in proc.stdout, proc.stderr[-500:]


def test_hub_graph_gives_hub_k_its_in_edges():
    """hub_graph: --per-node random in-edges a node (row 1 the target), and hub k (node k)
    hub_degree / 2^k more, from sources among the nodes."""
    import hub_rows

    for per_node in (2, 0):
        ei = hub_rows.hub_graph(20, 3, 40, per_node, seed=0)
        in_degree = torch.bincount(ei[1], minlength=20)
        expected = torch.full((20,), per_node)
        expected[:3] += torch.tensor([40, 20, 10])
        assert torch.equal(in_degree, expected), per_node
        assert ei.shape == (2, 20 * per_node + 70) and 0 <= int(ei.min()) <= int(ei.max()) < 20


@pytest.mark.parametrize("args", [["--nodes", "2", "--hubs", "4"], ["--per-node", "-1"]])
def test_hub_rows_refuses_a_graph_it_cannot_build(args, capsys):
    import hub_rows

    with pytest.raises(SystemExit) as exit_:
        hub_rows.main(["--rev", "HEAD", *args])
    assert exit_.value.code == 2
    assert "--rounds >= 2, --nodes >= --hubs >= 1, --per-node >= 0" in capsys.readouterr().err


def test_hub_rows_reports_each_sides_times_errors_and_ratio(monkeypatch, capsys):
    """Each side's line: the median (best) of the rounds after the first, the hub rows' forward
    error then the x gradient's; then new / old of the medians."""
    import contextlib

    import hub_rows

    import hiertail_fast

    now = [0.0]
    steps = {"old": iter([0, 100, 1, 3]), "new": iter([0, 100, 4, 6])}   # seconds a step
    real = hiertail_fast.gcn_propagate

    def timed(side, off=0.0):
        def propagate(x, graph, **kw):
            now[0] += next(steps[side])
            out = real(x, graph, **kw)
            return out + off * out.detach()           # a forward error, the gradient exact
        return propagate

    old = SimpleNamespace(CSRGraph=hiertail_fast.CSRGraph, gcn_propagate=timed("old", 1e-3))
    monkeypatch.setattr(hub_rows, "revision_package",
                        lambda rev, header: contextlib.nullcontext(old))
    monkeypatch.setattr(hub_rows, "time", SimpleNamespace(perf_counter=lambda: now[0]))
    x64_steps = iter([real])
    monkeypatch.setattr(hiertail_fast, "gcn_propagate",
                        lambda x, g, **kw: (next(x64_steps, None) or timed("new"))(x, g, **kw))
    assert hub_rows.main(["--rev", "X", "--nodes", "300", "--hubs", "2", "--hub-degree", "600",
                          "--d", "4", "--rounds", "3"]) == 0
    out = capsys.readouterr().out
    lines = {m[0]: m[1:] for m in re.findall(
        r"^(old|new): fwd\+bwd (\S+) s \(best (\S+)\)  hub rows' max rel error (\S+), "
        r"x grad (\S+)$", out, re.M)}
    assert lines["old"][:2] == ("2.0000", "1.0000") and lines["new"][:2] == ("5.0000", "4.0000")
    assert float(lines["old"][2]) == pytest.approx(1e-3, rel=1e-2)
    assert float(lines["old"][3]) < 1e-5 and max(map(float, lines["new"][2:])) < 1e-5
    assert "new/old 2.500" in out
