"""Result files never lost or silently replaced, and written as a plain open() would
(``_files``, ``data.conversion.save_graph``): corners the mutation audit of 2026-12-03 found
unchecked (each test failed on the mutant it describes, passes on main).

- ``save_graph(g, existing.pt)`` without force must raise FileExistsError and keep the user's
  file (only the .npz branch and ``convert`` were tested).
- ``replace_file_set`` deletes the older generation only "if any of ``current`` exists": with no
  current set to demote, a kept previous generation stays.
- files written through ``replace_file_set`` / ``replace_keeping_prev`` get the existing file's
  mode, else what open(path, "w") gives, not mkstemp's private 0600.
- ``unwritable_file_reason`` reports a read-only target before the work that produces it (the
  suite runs as root, where a chmod'ed file stays writable: os.access is faked, as the other
  tests fake mkstemp for an unwritable folder).

Session 45: an older-generation file that is a folder is refused before any work, and a Ctrl-C
during the rotation is held until its moves are done. Session 46: so are SIGTERM and SIGHUP (a
job scheduler's stop, a closed terminal), then delivered under their own handlers; and the
folder is fsynced after the renames (durable, not only atomic).
"""
from __future__ import annotations

import os
import stat
from pathlib import Path

import pytest
import torch

from hiertail_fast import _files
from hiertail_fast._files import replace_file_set, replace_keeping_prev


def _prev(name: str) -> str:
    stem, dot, ext = name.partition(".")
    return f"{stem}.prev{dot}{ext}"


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


@pytest.mark.parametrize("suffix", [".pt", ".npz"])
def test_save_graph_keeps_an_existing_file_without_force(tmp_path, suffix):
    pytest.importorskip("torch_geometric")
    from hiertail_fast.data.conversion import save_graph
    from hiertail_fast.data.io import GraphData

    graph = GraphData(edge_index=torch.tensor([[0, 1], [1, 0]]), x=torch.ones(3, 2),
                      y=torch.tensor([0, 1, 1]), num_classes=2, name="g")
    out = tmp_path / f"g{suffix}"
    out.write_bytes(b"the user's file")
    with pytest.raises(FileExistsError):
        save_graph(graph, out)
    assert out.read_bytes() == b"the user's file"
    save_graph(graph, out, force=True)
    assert out.read_bytes() != b"the user's file"


def test_older_generation_survives_when_no_current_set_exists(tmp_path):
    (tmp_path / "r.prev.csv").write_text("the previous results")
    written, kept = replace_file_set(
        tmp_path, {"r.csv": lambda p: p.write_text("new")}, ["r.csv"], _prev,
        older=["r.prev.csv"])
    assert kept == [] and written == [tmp_path / "r.csv"]
    assert (tmp_path / "r.csv").read_text() == "new"
    assert (tmp_path / "r.prev.csv").read_text() == "the previous results"


def test_with_a_current_set_the_older_generation_is_replaced(tmp_path):
    (tmp_path / "r.csv").write_text("current")
    (tmp_path / "r.prev.csv").write_text("older")
    replace_file_set(tmp_path, {"r.csv": lambda p: p.write_text("new")}, ["r.csv"], _prev,
                     older=["r.prev.csv"])
    assert (tmp_path / "r.prev.csv").read_text() == "current"
    assert (tmp_path / "r.csv").read_text() == "new"


def test_an_older_generation_file_that_is_a_folder_is_refused_before_any_work(tmp_path):
    """The older generation is deleted file by file: a folder among them failed its unlink
    after every result was written, with the generation's earlier files already gone. It is
    refused up front now, the writers never called and every file left as it was (mutant:
    the older names left out of the first check). With no current set nothing is deleted,
    and the folder is no obstacle."""
    (tmp_path / "r.csv").write_text("current")
    (tmp_path / "r.prev.csv").write_text("older csv")
    (tmp_path / "r.prev.png").mkdir()
    called = []
    writers = {n: (lambda p, n=n: called.append(n) or p.write_text("new"))
               for n in ("r.csv", "r.png")}
    with pytest.raises(FileExistsError, match=r"r\.prev\.png is a directory"):
        replace_file_set(tmp_path, writers, ["r.csv", "r.png"], _prev,
                         older=["r.prev.csv", "r.prev.png"])
    assert called == []
    assert (tmp_path / "r.csv").read_text() == "current"
    assert (tmp_path / "r.prev.csv").read_text() == "older csv"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["r.csv", "r.prev.csv", "r.prev.png"]
    (tmp_path / "r.csv").unlink()
    (tmp_path / "r.prev.csv").unlink()
    replace_file_set(tmp_path, writers, ["r.csv", "r.png"], _prev,
                     older=["r.prev.csv", "r.prev.png"])
    assert (tmp_path / "r.png").read_text() == "new" and (tmp_path / "r.prev.png").is_dir()


def test_ctrl_c_in_the_rotation_waits_for_it_to_finish(tmp_path, monkeypatch):
    """A real SIGINT between the rotation's moves (current -> .prev, new -> current): the
    moves finish, then the KeyboardInterrupt is raised (a DeferredInterrupt, which tells the
    caller the files are in place), so the folder holds the new set and the one it replaced,
    never only the .prev files (mutant: no deferral; this test then finds r.csv missing).
    Python's own SIGINT handler is back afterwards."""
    import signal

    previous = signal.signal(signal.SIGINT, signal.default_int_handler)
    (tmp_path / "r.csv").write_text("current")
    real_replace = _files.os.replace
    sent = []

    def replace_then_ctrl_c(src, dst):
        real_replace(src, dst)
        if not sent and Path(dst).name == "r.prev.csv":     # the first move of the rotation
            sent.append(True)
            os.kill(os.getpid(), signal.SIGINT)
            for _ in range(1000):   # let the handler run here, where it did before the fix
                pass

    monkeypatch.setattr(_files.os, "replace", replace_then_ctrl_c)
    try:
        raised = None
        try:    # (any KeyboardInterrupt caught here: one escaping would stop the whole run)
            replace_file_set(tmp_path, {"r.csv": lambda p: p.write_text("new")}, ["r.csv"],
                             _prev)
        except KeyboardInterrupt as exc:
            raised = exc
        assert sent and type(raised) is _files.DeferredInterrupt, raised
        assert (tmp_path / "r.csv").read_text() == "new"
        assert (tmp_path / "r.prev.csv").read_text() == "current"
        assert signal.getsignal(signal.SIGINT) is signal.default_int_handler
    finally:
        signal.signal(signal.SIGINT, previous)


# a process that rotates r.csv ("current" -> r.prev.csv, "new" -> r.csv) and sends itself
# `sig` between the two moves; {handler}: what the signal's handler is before the rotation
_ROTATE_AND_SIGNAL = """
import os, signal, sys
from pathlib import Path
from hiertail_fast import _files
sig = getattr(signal, sys.argv[2])
{handler}
real_replace, sent = os.replace, []
def replace_then_signal(src, dst):
    real_replace(src, dst)
    if not sent and Path(dst).name == "r.prev.csv":
        sent.append(True)
        os.kill(os.getpid(), sig)
        for _ in range(1000):
            pass
_files.os.replace = replace_then_signal
_files.replace_file_set(Path(sys.argv[1]), {{"r.csv": lambda p: p.write_text("new")}},
                        ["r.csv"], lambda n: "r.prev.csv")
print("survived", signal.getsignal(sig) == {restored}, flush=True)
"""


def _rotate_and_signal(tmp_path, signame, handler="", restored="signal.SIG_DFL"):
    import subprocess
    import sys

    (tmp_path / "r.csv").write_text("current")
    script = _ROTATE_AND_SIGNAL.format(handler=handler, restored=restored)
    return subprocess.run([sys.executable, "-c", script, str(tmp_path), signame],
                          capture_output=True, text=True, timeout=120)


@pytest.mark.parametrize("signame", ["SIGTERM", "SIGHUP"])
def test_sigterm_in_the_rotation_waits_for_it_to_finish(tmp_path, signame):
    """A job scheduler's SIGTERM (or a closed terminal's SIGHUP) between the rotation's moves,
    under the default handler: the process still dies by that signal, but after the moves, so
    the folder holds the new set and the one it replaced (mutant: only SIGINT held; r.csv is
    then missing, the results only in r.prev.csv)."""
    import signal

    done = _rotate_and_signal(tmp_path, signame)
    assert done.returncode == -getattr(signal, signame), (done.returncode, done.stderr)
    assert "survived" not in done.stdout
    assert (tmp_path / "r.csv").read_text() == "new"
    assert (tmp_path / "r.prev.csv").read_text() == "current"


def test_a_callers_sigterm_handler_runs_after_the_rotation(tmp_path):
    """bench/scale.py's own SIGTERM handler (SystemExit(143)) is held too, then runs once the
    moves are done, and is the handler again afterwards."""
    handler = ("def on_term(signum, frame):\n"
               "    print('handler ran', Path(sys.argv[1], 'r.csv').read_text(), flush=True)\n"
               "    raise SystemExit(143)\n"
               "signal.signal(sig, on_term)")
    done = _rotate_and_signal(tmp_path, "SIGTERM", handler)
    assert done.returncode == 143, done.stderr
    assert done.stdout.split() == ["handler", "ran", "new"], done.stdout   # after the moves
    assert (tmp_path / "r.prev.csv").read_text() == "current"
    script = "signal.signal(sig, lambda *a: print('held', flush=True))"
    done = _rotate_and_signal(tmp_path, "SIGTERM", script, restored="True")
    assert done.returncode == 0 and done.stdout.split() == ["held", "survived", "False"], (
        done.stdout, done.stderr)   # the lambda (not SIG_DFL) is back: 'restored' is False


def test_a_callers_sigint_handler_runs_after_the_rotation(tmp_path):
    """A caller's own Ctrl-C handler (not Python's default) is held as well and runs once,
    after the moves, seeing the new file; it was swallowed with the re-raise limited to
    SIGTERM / SIGHUP (b7025ac's SIGINT part, unguarded: every SIGINT test used the default
    handler; a fix-test check, session 68)."""
    handler = ("def on_int(signum, frame):\n"
               "    print('handler ran', Path(sys.argv[1], 'r.csv').read_text(), flush=True)\n"
               "signal.signal(sig, on_int)")
    done = _rotate_and_signal(tmp_path, "SIGINT", handler, restored="on_int")
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == ["handler", "ran", "new", "survived", "True"], done.stdout


def test_an_ignored_sigterm_stays_ignored(tmp_path):
    done = _rotate_and_signal(tmp_path, "SIGTERM", "signal.signal(sig, signal.SIG_IGN)",
                              restored="signal.SIG_IGN")
    assert done.returncode == 0 and done.stdout.split() == ["survived", "True"], done.stderr
    assert (tmp_path / "r.csv").read_text() == "new"


def test_a_held_sigterm_is_delivered_when_the_rotation_fails(tmp_path, monkeypatch):
    """A SIGTERM held while a move fails is not lost to the error: its handler runs (here one
    raising SystemExit, as scale.py's does), the failed move's error as its context."""
    import signal

    (tmp_path / "r.csv").write_text("current")
    real_replace = _files.os.replace

    def replace_signal_then_fail(src, dst):
        if Path(dst).name == "r.prev.csv":
            real_replace(src, dst)
            os.kill(os.getpid(), signal.SIGTERM)
            return
        raise OSError("disk gone")

    def on_term(signum, frame):
        raise SystemExit(128 + signum)

    previous = signal.signal(signal.SIGTERM, on_term)
    monkeypatch.setattr(_files.os, "replace", replace_signal_then_fail)
    try:
        with pytest.raises(SystemExit) as exit_info:
            replace_file_set(tmp_path, {"r.csv": lambda p: p.write_text("new")}, ["r.csv"],
                             _prev)
        assert exit_info.value.code == 143
        assert isinstance(exit_info.value.__context__, OSError)
        assert signal.getsignal(signal.SIGTERM) is on_term
    finally:
        signal.signal(signal.SIGTERM, previous)


@pytest.mark.parametrize("writer", ["replace_file_set", "atomic_path"])
def test_the_folder_is_synced_after_the_renames(tmp_path, monkeypatch, writer):
    """A rename is durable only once its directory is flushed: after the last os.replace the
    folder itself is fsynced (mutant: no folder fsync, a power cut could undo the renames;
    the files' own fsyncs come before their renames)."""
    events = []
    real_replace, real_fsync = _files.os.replace, _files.os.fsync

    def replace(src, dst):
        events.append(("replace", Path(dst).name))
        real_replace(src, dst)

    def fsync(fd):
        mode = os.fstat(fd).st_mode
        events.append(("fsync", "folder" if stat.S_ISDIR(mode) else "file"))
        real_fsync(fd)

    monkeypatch.setattr(_files.os, "replace", replace)
    monkeypatch.setattr(_files.os, "fsync", fsync)
    (tmp_path / "r.csv").write_text("current")
    if writer == "replace_file_set":
        replace_file_set(tmp_path, {"r.csv": lambda p: p.write_text("new")}, ["r.csv"], _prev)
    else:
        with _files.atomic_path(tmp_path / "r.csv") as tmp:
            tmp.write_text("new")
    assert (tmp_path / "r.csv").read_text() == "new"
    last_replace = max(i for i, e in enumerate(events) if e[0] == "replace")
    assert ("fsync", "folder") in events[last_replace:], events
    assert events.index(("fsync", "file")) < last_replace, events


def test_a_folder_that_cannot_be_synced_is_no_error(tmp_path, monkeypatch):
    def refuse(fd):
        raise OSError(22, "Invalid argument")

    monkeypatch.setattr(_files.os, "fsync", lambda fd: refuse(fd) if stat.S_ISDIR(
        os.fstat(fd).st_mode) else None)
    replace_keeping_prev(tmp_path / "res.json", "{}")
    assert (tmp_path / "res.json").read_text() == "{}"
    _files.fsync_folder(tmp_path / "missing")      # cannot be opened: nothing happens


def test_new_result_files_get_the_usual_mode(tmp_path):
    replace_keeping_prev(tmp_path / "res.json", "{}")
    replace_file_set(tmp_path, {"a.csv": lambda p: p.write_text("x")}, ["a.csv"],
                     lambda n: "a.prev.csv")
    want = 0o666 & ~_umask()
    for name in ("res.json", "a.csv"):
        assert stat.S_IMODE((tmp_path / name).stat().st_mode) == want, name


def test_a_replaced_result_file_keeps_its_mode(tmp_path):
    path = tmp_path / "res.json"
    path.write_text("old")
    path.chmod(0o640)
    replace_keeping_prev(path, "new")
    assert path.read_text() == "new"
    assert stat.S_IMODE(path.stat().st_mode) == 0o640


def test_read_only_result_file_is_reported(tmp_path, monkeypatch):
    target = tmp_path / "res.json"
    target.write_text("old")
    real_access = os.access
    monkeypatch.setattr(_files.os, "access",
                        lambda p, mode, **kw: False if (str(p) == str(target) and mode == os.W_OK)
                        else real_access(p, mode, **kw))
    reason = _files.unwritable_file_reason(target)
    assert reason is not None and "read-only" in reason
    assert _files.unwritable_file_reason(tmp_path / "other.json") is None
