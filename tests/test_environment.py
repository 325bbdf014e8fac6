"""Environment variables and OpenMP settings (an audit of 2026-11-28): each case gave a wrong
number, a crash deep inside, or a switch silently ignored."""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from hiertail_fast import balanced_contrastive_loss, gcn_propagate
from hiertail_fast.ops import _lse_symmetric, _native

ROOT = Path(__file__).resolve().parents[1]


def test_fewer_openmp_threads_than_torch_plans_for_keep_the_loss_exact():
    """OMP_THREAD_LIMIT=1 with torch at 2 threads: the symmetric engine merged per-thread
    slots no thread had filled (NaN losses; the official variant an IndexError with a garbage
    arg-max). Run in a child process: OpenMP reads the variable when it starts."""
    code = (
        "import torch\n"
        "from hiertail_fast import balanced_contrastive_loss as L\n"
        "torch.set_num_threads(2)\n"
        "g = torch.Generator().manual_seed(0)\n"
        "z = (torch.randn(1200, 32, generator=g) / 32 ** 0.5).requires_grad_()\n"
        "y = torch.randint(0, 12, (1200,), generator=g)\n"
        "for variant in ('exact', 'official'):\n"
        "    z.grad = None\n"
        "    fast = L(z, y, temperature=0.5, variant=variant)\n"
        "    fast.backward()\n"
        "    gf = z.grad.clone(); z.grad = None\n"
        "    ref = L(z, y, temperature=0.5, variant=variant, backend='reference')\n"
        "    ref.backward()\n"
        "    torch.testing.assert_close(fast, ref, rtol=1e-5, atol=1e-6)\n"
        "    torch.testing.assert_close(gf, z.grad, rtol=1e-4, atol=1e-7)\n"
        "print('exact under the limit')\n")
    env = {k: v for k, v in os.environ.items() if not k.startswith("OMP_")}
    env.update(OMP_THREAD_LIMIT="1", HIERTAIL_SYMMETRIC="1")
    proc = subprocess.run([sys.executable, "-c", code], env=env, cwd=ROOT, capture_output=True,
                          text=True, timeout=600)
    assert proc.returncode == 0 and "exact under the limit" in proc.stdout, proc.stderr[-3000:]


@pytest.mark.parametrize("variable, value", [("OMP_THREAD_LIMIT", "1"), ("OMP_DYNAMIC", "true")])
def test_openmp_settings_that_break_torchs_sparse_products_are_refused(monkeypatch, variable,
                                                                       value):
    """Under them torch's CPU CSR x dense product skips rows without an error (torch 2.13,
    800 nodes: off by 8.8 on results ~9): the propagation refuses, naming the variable; at
    one torch thread there is nothing to skip."""
    ei = torch.randint(0, 30, (2, 90), generator=torch.Generator().manual_seed(0))
    x = torch.randn(30, 4)
    threads = torch.get_num_threads()
    monkeypatch.setenv(variable, value)
    try:
        torch.set_num_threads(2)
        with pytest.raises(ValueError, match=f"{variable}.*skips rows"):
            gcn_propagate(x, ei)
        torch.set_num_threads(1)
        monkeypatch.delenv(variable)
        expected = gcn_propagate(x, ei)
        monkeypatch.setenv(variable, value)
        assert torch.equal(gcn_propagate(x, ei), expected)
    finally:
        torch.set_num_threads(threads)


@pytest.mark.parametrize("value, on", [("OFF", False), ("False", False), ("no", False),
                                       ("0", False), ("ON", True), ("1", True), ("", True),
                                       (" 0 ", False), ("off\n", False), ("  ", True)])
def test_switches_read_any_case(monkeypatch, value, on):
    """HIERTAIL_NATIVE=OFF / False / No were read as "on" (only lower case counted). Spaces
    around the value (a .env file's "0 ") are not part of it, and blank is unset (a mutation
    pass, session 73: without the strip "0 " was refused)."""
    monkeypatch.setenv("HIERTAIL_NATIVE", value)
    monkeypatch.setenv("HIERTAIL_SYMMETRIC", value)
    assert _native.enabled() is on and _lse_symmetric.enabled() is on


@pytest.mark.parametrize("name", ["HIERTAIL_NATIVE", "HIERTAIL_SYMMETRIC"])
def test_an_unknown_switch_value_is_an_error_naming_it(monkeypatch, name):
    monkeypatch.setenv(name, "nope")
    z, y = torch.randn(600, 8), torch.arange(600) % 3
    with pytest.raises(ValueError, match=f"{name}='nope' is not one of 1/0"):
        balanced_contrastive_loss(z, y)


@pytest.mark.parametrize("value, message", [("48MB", "not a whole number"),
                                            ("1e6", "not a whole number"),
                                            ("0", "must be >= 1"), ("-5", "must be >= 1")])
def test_block_bytes_must_be_a_positive_integer(monkeypatch, value, message):
    """A bare int() raised "invalid literal for int()" from inside the loss, naming nothing;
    0 and negative values were clamped silently."""
    monkeypatch.setenv("HIERTAIL_CPU_BLOCK_BYTES", value)
    with pytest.raises(ValueError, match=f"HIERTAIL_CPU_BLOCK_BYTES.*{message}"):
        balanced_contrastive_loss(torch.randn(40, 4), torch.arange(40) % 3)
    monkeypatch.setenv("HIERTAIL_CPU_BLOCK_BYTES", " 4096 ")
    balanced_contrastive_loss(torch.randn(40, 4), torch.arange(40) % 3)


def test_an_empty_data_variable_is_unset_for_the_experiments(monkeypatch, tmp_path, capsys):
    """HIERTAIL_DATA='' made the experiments read the working directory as the data folder
    (the training CLI already treated it as unset)."""
    from hiertail_fast.experiments.cli import main

    monkeypatch.setenv("HIERTAIL_DATA", "")
    monkeypatch.chdir(tmp_path)
    with pytest.raises(SystemExit):
        main(["main", "--no-progress", "--device", "cpu", "--out", str(tmp_path / "out")])
    assert "../shared/data" in capsys.readouterr().err


# check_openmp_team (a mutation audit, s42): OMP_THREAD_LIMIT is refused only BELOW torch's
# thread count (its docstring: a limit equal to it starts every thread torch plans for), and
# OMP_DYNAMIC is read as OpenMP reads it (case-insensitive: TRUE is on)
def _case():
    ei = torch.randint(0, 30, (2, 90), generator=torch.Generator().manual_seed(0))
    return torch.randn(30, 4), ei


def test_a_thread_limit_equal_to_torchs_threads_is_accepted(monkeypatch, two_threads):
    x, ei = _case()
    expected = gcn_propagate(x, ei)
    monkeypatch.setenv("OMP_THREAD_LIMIT", "2")
    torch.testing.assert_close(gcn_propagate(x, ei), expected)
    monkeypatch.setenv("OMP_THREAD_LIMIT", "1")
    with pytest.raises(ValueError, match="OMP_THREAD_LIMIT"):
        gcn_propagate(x, ei)


def test_the_baselines_sparse_operator_checks_the_openmp_team(monkeypatch, two_threads):
    """The baselines multiply their adjacency operator with `@`, not csr_matmul: its build
    (sparse_csr) is where the OpenMP team is checked (the s72 audit, p15: without that check
    the operator was built under OMP_THREAD_LIMIT=1 with torch at 2 threads)."""
    from hiertail_fast import CSRGraph
    from hiertail_fast.baselines.layers import adjacency_operator

    _, ei = _case()
    graph = CSRGraph.from_edge_index(ei, num_nodes=30)
    monkeypatch.setenv("OMP_THREAD_LIMIT", "1")
    with pytest.raises(ValueError, match="OMP_THREAD_LIMIT"):
        adjacency_operator(graph, "row")


@pytest.mark.parametrize("value", ["TRUE", "True", " on "])
def test_omp_dynamic_in_any_case_is_refused(monkeypatch, two_threads, value):
    x, ei = _case()
    monkeypatch.setenv("OMP_DYNAMIC", value)
    with pytest.raises(ValueError, match="OMP_DYNAMIC"):
        gcn_propagate(x, ei)


def test_cuda_blocks_keep_a_floor_of_rows_within_free_memory(monkeypatch):
    """On CUDA the 128 MB budget gives 33 rows a block at a million keys (~30,000 blocks of
    ~100 launches per loss): unless the user set $HIERTAIL_CUDA_BLOCK_BYTES, a block keeps
    MIN_CUDA_BLOCK_ROWS rows where a quarter of the free device memory holds the pass's block
    buffers (four fp32 ones: a sixteenth per buffer; fp64 rows: half the rows), fewer where
    it does not, and never fewer than the budget's; free memory counts what PyTorch's caching
    allocator holds unused (in training it keeps most of a card); CPU blocks are as before.
    The attention engine's row-max pass takes the same floor, the learnable temperature's
    pass one for its five temporaries and its bool mask."""
    import hiertail_fast.ops._attention_lse as attention_lse
    import hiertail_fast.ops._lse_torch as lse_torch
    import hiertail_fast.ops._temperature_grad as tgrad

    cuda, cpu = torch.device("cuda"), torch.device("cpu")
    free = {"bytes": 1 << 40, "reserved": 0, "allocated": 0}
    monkeypatch.setattr(torch.cuda, "mem_get_info", lambda device=None: (free["bytes"], 0))
    monkeypatch.setattr(torch.cuda, "memory_reserved", lambda device=None: free["reserved"])
    monkeypatch.setattr(torch.cuda, "memory_allocated", lambda device=None: free["allocated"])
    monkeypatch.delenv("HIERTAIL_CUDA_BLOCK_BYTES", raising=False)
    floor = lse_torch.MIN_CUDA_BLOCK_ROWS
    assert lse_torch._block_rows(10**6, 10**6, cuda) == floor            # budget: 33 rows
    assert lse_torch._block_rows(20_000, 20_000, cuda) == (128 << 20) // (4 * 20_000)  # 1,677
    assert lse_torch._block_rows(300, 10**6, cuda) == 300                # never past the rows
    free["bytes"] = 16 * 4 * 10**6 * 100                                  # room for 100 rows
    assert lse_torch._block_rows(10**6, 10**6, cuda) == 100
    assert lse_torch._block_rows(10**6, 10**6, cuda, 8) == 50             # fp64 buffers
    free.update(bytes=0, reserved=16 * 4 * 10**6 * 100 + 12345, allocated=12345)
    assert lse_torch._block_rows(10**6, 10**6, cuda) == 100               # the allocator's
    free.update(bytes=16 * 4 * 10**6 * 100, reserved=0, allocated=0)
    assert tgrad._block_rows(10**6, 4, cuda) == 16 * 4 * 100 // (4 * 21)  # 76: 5 x 4 + 1 B
    free["bytes"] = 1 << 20                                               # less than the budget
    assert lse_torch._block_rows(10**6, 10**6, cuda) == (128 << 20) // (4 * 10**6)
    free["bytes"] = 1 << 40
    monkeypatch.setenv("HIERTAIL_CUDA_BLOCK_BYTES", str(128 << 20))      # the user's budget
    assert lse_torch._block_rows(10**6, 10**6, cuda) == 33
    monkeypatch.delenv("HIERTAIL_CUDA_BLOCK_BYTES")
    assert lse_torch._block_rows(10**6, 10**6, cpu) == 12                # 48 MB / 4 MB rows

    assert attention_lse._max_block_rows(10**6, cuda) == floor          # its row-max pass
    assert attention_lse._max_block_rows(10**6, cpu) == 12
    assert attention_lse._max_block_rows(5, cpu) == 5
    # the learnable temperature's pass (four [b, N] temporaries in its 64 MB): 4 rows a block
    # at a million keys from its budget, the floor on CUDA, the budget's on CPU
    assert tgrad._block_rows(10**6, 4, cuda) == floor
    assert tgrad._block_rows(20_000, 4, cuda) == floor                    # budget: 209 rows
    assert tgrad._block_rows(10**6, 4, cpu) == (48 << 20) * 4 // 3 // (16 * 10**6)    # 4
    monkeypatch.setenv("HIERTAIL_CUDA_BLOCK_BYTES", str(128 << 20))      # the user's budget
    assert tgrad._block_rows(10**6, 4, cuda) == (64 << 20) // (16 * 10**6)            # 4


def test_cpu_blocks_are_capped_at_max_block_rows(monkeypatch):
    """The torch engine's CPU row blocks: the byte budget's rows, at most MAX_BLOCK_ROWS (the
    caches' cap; CUDA blocks have none), never more than the rows, at least 8 (a second
    mutation audit dropped the cap: 2,097 rows a block at 6,000 keys; only CUDA was tested)."""
    import hiertail_fast.ops._lse_torch as lse_torch

    cpu = torch.device("cpu")
    monkeypatch.delenv("HIERTAIL_CPU_BLOCK_BYTES", raising=False)
    assert lse_torch._block_rows(6000, 6000, cpu) == lse_torch.MAX_BLOCK_ROWS
    assert lse_torch._block_rows(100, 6000, cpu) == 100
    assert lse_torch._block_rows(3, 6000, cpu) == 8
    monkeypatch.setenv("HIERTAIL_CPU_BLOCK_BYTES", str(1 << 20))
    assert lse_torch._block_rows(6000, 6000, cpu) == (1 << 20) // (4 * 6000)          # 43


def test_the_temperature_pass_takes_the_users_cpu_budget_and_the_rows_dtype(monkeypatch):
    """The learnable temperature's CPU blocks: within $HIERTAIL_CPU_BLOCK_BYTES (x 4/3, the
    pass's four temporaries against the engines' three; 64 MB at the default, which is why the
    default alone cannot tell), and fp64 rows half as many as fp32 ones (a second mutation
    audit: a fixed 64 MB budget gave 419 rows a block where 1 MB allows 8; fp64 rows sized as
    fp32 ones took twice the budget)."""
    import hiertail_fast.ops._temperature_grad as tgrad

    cpu = torch.device("cpu")
    monkeypatch.setenv("HIERTAIL_CPU_BLOCK_BYTES", str(1 << 20))
    assert tgrad._block_rows(10_000, 4, cpu) == (1 << 20) * 4 // 3 // (4 * 10_000 * 4)   # 8
    assert tgrad._block_rows(10_000, 8, cpu) == (1 << 20) * 4 // 3 // (4 * 10_000 * 8)   # 4
    monkeypatch.delenv("HIERTAIL_CPU_BLOCK_BYTES")
    assert tgrad._block_rows(100_000, 8, cpu) == (64 << 20) // (4 * 100_000 * 8)         # 20
    assert tgrad._block_rows(100_000, 4, cpu) == (64 << 20) // (4 * 100_000 * 4)         # 41


def test_the_torch_engine_sizes_its_blocks_by_the_rows_dtype(monkeypatch):
    # _block_rows' CUDA floor counts bytes: the engine must pass its rows' element size (8 for
    # float64), or float64 blocks are sized as float32 ones, twice the memory the floor allows
    # (174ff26 tested _block_rows alone: a fix-test check, session 68)
    import hiertail_fast.ops._lse_torch as lse

    seen, real = [], lse._block_rows

    def spy(n_rows, n_cols, device=None, element_size=4):
        seen.append(element_size)
        return real(n_rows, n_cols, device, element_size)

    monkeypatch.setattr(lse, "_block_rows", spy)
    gen = torch.Generator().manual_seed(0)
    for dtype, size in ((torch.float64, 8), (torch.float32, 4)):
        seen.clear()
        z = torch.randn(40, 8, generator=gen, dtype=dtype)
        balanced_contrastive_loss(z, torch.arange(40) % 4, temperature=0.5, backend="torch")
        assert seen and set(seen) == {size}, (dtype, seen)


def test_the_temperature_pass_sizes_its_blocks_with_the_cuda_floor(monkeypatch):
    # the learnable temperature's pass (g_dot_s) keeps the engines' CUDA floor of rows a block
    # through _block_rows; 858b9c4 tested _block_rows alone, and the pass reverted to the
    # budget-only size (4 rows a block at a million keys on a card) passed every test (a
    # fix-test check, session 68)
    import hiertail_fast.ops._temperature_grad as tgrad

    seen, real = [], tgrad._block_rows

    def spy(n, element_size, device):
        seen.append((n, element_size, torch.device(device).type))
        return real(n, element_size, device)

    monkeypatch.setattr(tgrad, "_block_rows", spy)
    gen = torch.Generator().manual_seed(0)
    for dtype, size in ((torch.float32, 4), (torch.float64, 8)):
        seen.clear()
        z = torch.randn(30, 8, generator=gen, dtype=dtype, requires_grad=True)
        tau = torch.tensor(0.5, dtype=dtype, requires_grad=True)
        balanced_contrastive_loss(z, torch.arange(30) % 3, temperature=tau,
                                  variant="official", backend="torch").backward()
        assert tau.grad is not None and seen == [(30, size, "cpu")], seen


@pytest.mark.parametrize("value", ["mkl", "on", "oneDNN3"])
def test_an_unknown_gemm_provider_is_an_error_naming_it(monkeypatch, value):
    """HIERTAIL_CPU_GEMM (read by the symmetric engine at each call) names its choices."""
    if not _lse_symmetric.available():
        pytest.skip("no C compiler: the symmetric engine, which reads it, is off")
    monkeypatch.setenv("HIERTAIL_CPU_GEMM", value)
    z, y = torch.randn(600, 8), torch.arange(600) % 3
    with pytest.raises(ValueError, match=f"HIERTAIL_CPU_GEMM='{value}' is not one of auto, "
                                         "onednn, blas"):
        balanced_contrastive_loss(z, y)
    monkeypatch.setenv("HIERTAIL_CPU_GEMM", " Blas ")
    assert torch.isfinite(balanced_contrastive_loss(z, y))
