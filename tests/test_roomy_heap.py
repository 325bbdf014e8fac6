"""glibc's heap padding while the CPU loss runs on oneDNN (``ops/_roomy_heap.py``): the choice
(environment, C library, the user's own malloc tuning), what the scope sets and puts back
(nested, on error, in a forked child), the values glibc accepts, and the symmetric engine: the
scope around oneDNN's tiles only, and the same numbers with and without it."""
from __future__ import annotations

import os
import re
import subprocess
import sys
import threading

import pytest
import torch

import hiertail_fast.ops._lse_symmetric as sym
from hiertail_fast import balanced_contrastive_loss
from hiertail_fast.ops import _onednn_gemm as og
from hiertail_fast.ops import _roomy_heap as heap

GLIBC = heap._mallopt() is not None


def _thp_always() -> bool:
    """Transparent huge pages for every anonymous mapping: page faults then come per 2 MiB
    where they can, and counting them says nothing about 4 KiB pages."""
    try:
        with open("/sys/kernel/mm/transparent_hugepage/enabled", encoding="ascii") as f:
            return "[always]" in f.read()
    except OSError:
        return False


@pytest.fixture
def recorder(monkeypatch):
    """A fake mallopt recording its calls; no malloc variables in the environment."""
    calls = []

    def mallopt(param, value):
        calls.append((param, value))
        return 1

    monkeypatch.setattr(heap, "_mallopt", lambda: mallopt)
    _no_user_tuning(monkeypatch)
    return calls


SET = [(heap.M_MMAP_THRESHOLD, 32 << 20), (heap.M_TOP_PAD, 32 << 20)]
RESTORE = [(heap.M_TOP_PAD, 128 << 10)]


def test_choice_reads_the_environment(monkeypatch):
    monkeypatch.delenv(heap.ENV_VAR, raising=False)
    assert heap.choice() == "auto"
    for raw, value in [("", "auto"), (" KEEP ", "keep"), ("Auto", "auto")]:
        monkeypatch.setenv(heap.ENV_VAR, raw)
        assert heap.choice() == value
    monkeypatch.setenv(heap.ENV_VAR, "off")
    with pytest.raises(ValueError, match="HIERTAIL_CPU_HEAP='off' is not one of auto, keep"):
        heap.choice()
    with pytest.raises(ValueError, match="HIERTAIL_CPU_HEAP"):
        heap.why_not()


def test_the_scope_pads_the_heap_and_puts_the_top_pad_back(recorder):
    assert heap.why_not() is None
    with heap.roomy_heap():
        assert recorder == SET
    assert recorder == SET + RESTORE
    recorder.clear()
    with pytest.raises(RuntimeError, match="boom"), heap.roomy_heap():
        raise RuntimeError("boom")
    assert recorder == SET + RESTORE and heap._depth == 0


def test_nested_and_concurrent_scopes_set_once_and_restore_once(recorder):
    with heap.roomy_heap():
        with heap.roomy_heap():
            pass
        assert recorder == SET                  # the inner exit kept the pad: one scope open
    assert recorder == SET + RESTORE
    recorder.clear()
    inside, leave = threading.Barrier(5), threading.Event()

    def worker():
        with heap.roomy_heap():
            inside.wait()
            leave.wait()

    threads = [threading.Thread(target=worker) for _ in range(4)]
    for t in threads:
        t.start()
    inside.wait()
    assert recorder == SET and heap._depth == 4
    leave.set()
    for t in threads:
        t.join()
    assert recorder == SET + RESTORE and heap._depth == 0


@pytest.mark.parametrize("env,why", [
    ({heap.ENV_VAR: "keep"}, "HIERTAIL_CPU_HEAP=keep"),
    ({"MALLOC_TOP_PAD_": "0"}, r"the user tuned malloc \(MALLOC_TOP_PAD_ is set\)"),
    ({"MALLOC_MMAP_MAX_": "0"}, r"the user tuned malloc \(MALLOC_MMAP_MAX_ is set\)"),
    ({"GLIBC_TUNABLES": "glibc.malloc.trim_threshold=0"},
     r"the user tuned malloc \(GLIBC_TUNABLES is set\)"),
    ({"GLIBC_TUNABLES": "glibc.cpu.hwcaps=-AVX512F:glibc.malloc.top_pad=0"},
     r"the user tuned malloc \(GLIBC_TUNABLES is set\)"),
])
def test_the_heap_is_left_alone_where_asked_or_tuned_by_the_user(monkeypatch, recorder, env,
                                                                 why):
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    assert re.fullmatch(why, str(heap.why_not()))
    with heap.roomy_heap():
        pass
    assert recorder == []


@pytest.mark.parametrize("env", [
    {"GLIBC_TUNABLES": "glibc.cpu.hwcaps=-AVX512F"},
    {"GLIBC_TUNABLES": "glibc.malloc.arena_max=2"},
    {"MALLOC_ARENA_MAX": "2"},          # set by many container images: not what we change
])
def test_settings_the_scope_does_not_touch_do_not_count(monkeypatch, recorder, env):
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    assert heap.why_not() is None


def test_without_glibc_the_scope_is_a_no_op(monkeypatch, recorder):
    monkeypatch.setattr(heap, "_mallopt", lambda: None)
    assert heap.why_not() == "the C library is not glibc"
    with heap.roomy_heap():
        pass
    assert heap._depth == 0


def test_a_forked_child_gets_a_new_lock_and_the_pad_back(monkeypatch, recorder):
    monkeypatch.setattr(heap, "_depth", 2)
    held = heap._lock
    held.acquire()              # as if another thread of the parent held it at the fork
    try:
        heap._after_fork_in_child()
        assert heap._depth == 0 and heap._lock is not held and not heap._lock.locked()
        assert recorder == RESTORE
        recorder.clear()
        heap._after_fork_in_child()             # no scope open: nothing to put back
        assert recorder == []
    finally:
        held.release()


@pytest.mark.skipif(not GLIBC, reason="glibc's mallopt only")
@pytest.mark.skipif(_thp_always(), reason="transparent huge pages 'always': faults per 2 MiB")
def test_inside_the_scope_a_freed_tile_is_reused_without_page_faults():
    """The mechanism, in a child (the suite's heap stays as it is), with glibc at its most
    forgetful: the trim threshold 0 (every free at the top hands the pages back) and so its
    dynamic mmap threshold frozen at the 128 KiB start (any mallopt does that). Every 4 MiB
    tensor is then a fresh mmap faulted in page by page (1,024 faults); inside the scope both
    settings count: the mmap threshold sends the tiles to the heap, and the top pad keeps
    their pages when the trim gives the rest back. The pad's pages are touched once, by the
    first tiles, then reused."""
    code = """if True:
        import resource, torch
        from hiertail_fast.ops import _roomy_heap as h
        assert h._mallopt()(-1, 0) == 1                # M_TRIM_THRESHOLD: trim at every free

        def faults_of_20_tiles():
            before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
            for _ in range(20):
                t = torch.empty(1 << 20)               # 4 MiB, as one oneDNN logits tile
                t.fill_(1.0)
                del t
            return resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before

        outside = faults_of_20_tiles()
        with h.roomy_heap():
            first = faults_of_20_tiles()        # the tiles walk up through the fresh pad once
            inside = faults_of_20_tiles()
        print(outside, first, inside)
    """
    env = {k: v for k, v in os.environ.items()
           if k not in (*heap.USER_MALLOC_VARS, "GLIBC_TUNABLES", heap.ENV_VAR)}
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         check=True, env=env)
    outside, first, inside = map(int, out.stdout.split())
    assert outside >= 20 * 1000           # each tile faulted in anew
    pad_pages = heap.TOP_PAD // 4096
    assert first <= pad_pages + 2 * 1024  # the pad and a tile touched once ...
    assert inside <= 1024                 # ... then reused: no tile faults in again


def test_the_pad_holds_the_engines_tiles():
    """A oneDNN tile (and the keys' product beside it) fits below the mmap threshold and in
    the kept top pad: the next tile reuses pages already touched."""
    tile = sym.ONEDNN_TILE_BYTES
    assert tile < heap.MMAP_THRESHOLD and 2 * tile <= heap.TOP_PAD


def _no_user_tuning(monkeypatch) -> None:
    """The runner's own malloc variables (if any) out of the way, and the setting unset."""
    for name in (*heap.USER_MALLOC_VARS, "GLIBC_TUNABLES", heap.ENV_VAR):
        monkeypatch.delenv(name, raising=False)


def _spy(monkeypatch) -> list:
    entered = []
    real = heap.roomy_heap

    def spy():
        entered.append(heap.why_not())
        return real()

    monkeypatch.setattr(heap, "roomy_heap", spy)
    return entered


def _loss_and_grad(n=700):
    gen = torch.Generator().manual_seed(11)
    z = torch.nn.functional.normalize(torch.randn(n, 32, generator=gen), dim=1)
    y = torch.randint(0, 5, (n,), generator=gen)
    z.requires_grad_()
    loss = balanced_contrastive_loss(z, y, temperature=0.1, backend="torch")
    loss.backward()
    return loss.detach(), z.grad


@pytest.mark.skipif(not sym.available(), reason="no C compiler: the symmetric engine is off")
def test_the_engine_pads_only_around_onednn_tiles(monkeypatch):
    _no_user_tuning(monkeypatch)
    monkeypatch.setenv(sym.ENV_VAR, "1")
    monkeypatch.setenv(og.ENV_VAR, "blas")
    entered = _spy(monkeypatch)
    _loss_and_grad()
    assert entered == []
    if og._unavailable() is not None:
        pytest.skip(f"oneDNN: {og._unavailable()}")
    monkeypatch.setenv(og.ENV_VAR, "onednn")
    _loss_and_grad()
    assert entered == [None if GLIBC else "the C library is not glibc"] and heap._depth == 0


@pytest.mark.skipif(not sym.available(), reason="no C compiler: the symmetric engine is off")
@pytest.mark.parametrize("gemm", ["blas", "onednn"])
def test_a_bad_heap_setting_is_an_error_on_every_provider(monkeypatch, gemm):
    if gemm == "onednn" and og._unavailable() is not None:
        pytest.skip(f"oneDNN: {og._unavailable()}")
    monkeypatch.setenv(sym.ENV_VAR, "1")
    monkeypatch.setenv(og.ENV_VAR, gemm)
    monkeypatch.setenv(heap.ENV_VAR, "yes")
    with pytest.raises(ValueError, match="HIERTAIL_CPU_HEAP='yes' is not one of auto, keep"):
        _loss_and_grad()


@pytest.mark.skipif(not sym.available() or og._unavailable() is not None,
                    reason="needs the symmetric engine on oneDNN")
def test_the_numbers_do_not_depend_on_the_heap(monkeypatch):
    """The padding changes where tiles live, not what is computed: bit for bit (glibc's real
    mallopt where there is one)."""
    monkeypatch.setenv(sym.ENV_VAR, "1")
    monkeypatch.setenv(og.ENV_VAR, "onednn")
    _no_user_tuning(monkeypatch)
    entered = _spy(monkeypatch)
    monkeypatch.setenv(heap.ENV_VAR, "keep")
    loss_keep, grad_keep = _loss_and_grad()
    monkeypatch.setenv(heap.ENV_VAR, "auto")
    loss_auto, grad_auto = _loss_and_grad()
    assert entered == ["HIERTAIL_CPU_HEAP=keep", None if GLIBC else "the C library is not glibc"]
    assert torch.equal(loss_keep, loss_auto) and torch.equal(grad_keep, grad_auto)
