"""Result files of the command lines (``python -m hiertail_fast.train --json``, bench/scale.py):
check that a target can be written BEFORE the hours of work that produce it, and write through a
temporary file in the same directory + ``os.replace``, so that a failed write (full disk, a
kill) never leaves a truncated file in place of the old one."""
from __future__ import annotations

import os
import signal
import sys
import tempfile
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

# Longest file name where a folder's limit cannot be read, or reads as none (pathconf's -1):
# 255, in bytes on Linux, in UTF-16 units on macOS (APFS, HFS+) and Windows (NTFS).
NAME_MAX = 255
# Where a name's length counts UTF-16 units, not bytes (the limit pathconf reports on macOS is
# in those units too: 255 bytes would refuse a legal 100-character CJK name there).
_UTF16_NAMES = sys.platform in ("darwin", "win32")
# How much of a result file's name its temporary file's name carries (bytes): enough to tell
# whose a leftover is; bounded, so that a target whose own name is near the file system's
# limit still gets a temporary name under it (`.NAME.XXXXXXXX.tmp` with the whole name went
# over it: a 245-character --json name passed the checks, then failed after the training).
TEMP_NAME_BYTES = 64
# The longest suffix a temporary name repeats (a writer such as matplotlib reads the format
# there: ".png", ".json"); a longer one is no format, and would lengthen the name past the
# limit again (a review's find: "r.xxxx...", 242 bytes).
TEMP_SUFFIX_BYTES = 16


def _temp_prefix(name: str) -> str:
    """``.NAME.`` for a temporary file beside `name`, NAME cut to TEMP_NAME_BYTES bytes."""
    return "." + os.fsencode(name)[:TEMP_NAME_BYTES].decode("utf-8", errors="ignore") + "."


def _temp_suffix(name: str) -> str:
    """``.tmp`` + `name`'s own suffix where that is a short one (``TEMP_SUFFIX_BYTES``)."""
    suffix = Path(name).suffix
    return ".tmp" + (suffix if len(os.fsencode(suffix)) <= TEMP_SUFFIX_BYTES else "")


def _name_max(folder: Path) -> int:
    """The longest file name the file system of `folder` (or its nearest existing ancestor)
    takes, in the units of ``_name_length``."""
    probe = Path(folder)
    try:
        while not probe.exists() and probe.parent != probe:
            probe = probe.parent
        limit = int(os.pathconf(probe, "PC_NAME_MAX"))
    except (OSError, ValueError, AttributeError):   # no pathconf (Windows), no such limit
        return NAME_MAX
    return limit if limit > 0 else NAME_MAX         # -1: "no limit" reported; 0: unset


def _name_length(name: str) -> tuple[int, str]:
    """(length, unit) of `name` as the file system counts it: bytes, or UTF-16 units on macOS
    and Windows."""
    if _UTF16_NAMES:
        return len(name.encode("utf-16-le", errors="surrogatepass")) // 2, "characters"
    return len(os.fsencode(name)), "bytes"


def _name_reason(path: Path, *names: str) -> str | None:
    """Why `names` (the file's, and names it will get, e.g. its .prev) cannot be created beside
    `path`: longer than the file system takes (a later write would fail after the work)."""
    limit = _name_max(path.parent)
    for name in names:
        size, unit = _name_length(name)
        if size > limit:
            return (f"the file name {name!r} is {size} {unit} long, over this file system's "
                    f"limit of {limit}")
    return None


def unwritable_dir_reason(directory: Path) -> str | None:
    """Why files cannot be created in `directory` (created later if missing), or None.

    Probes with a real temporary file in the directory, or in its nearest existing ancestor
    when it does not exist yet (nothing is created on the way). An OSError of the probing
    itself (a name too long for the file system, a permission on the way) is the reason."""
    try:
        return _unwritable_dir_reason(Path(directory))
    except OSError as exc:
        return f"{directory} cannot be used ({exc.strerror or exc})"


def _unwritable_dir_reason(directory: Path) -> str | None:
    probe = directory
    while not probe.exists():
        if probe.parent == probe:
            break
        if probe.is_symlink():  # a dangling link: mkdir would fail on it
            return f"{probe} is a broken symbolic link"
        probe = probe.parent
    if not probe.is_dir():
        return f"{probe} is not a directory" if probe == directory else (
            f"{probe} (a parent of {directory}) is not a directory")
    try:
        fd, name = tempfile.mkstemp(dir=probe, prefix=".write-probe-")
    except OSError as exc:
        return f"cannot create files in {probe} ({exc.strerror or exc})"
    os.close(fd)
    os.unlink(name)
    return None


def not_regular_reason(path: Path) -> str | None:
    """Why a result file must not be written at `path`, which exists and is no regular file
    (links followed), or None. Results are written to a temporary file and renamed over
    `path`: a device, FIFO or socket there would be replaced (``--json /dev/null`` run as root
    replaced the machine's /dev/null with a JSON file)."""
    path = Path(path)
    if path.is_dir():
        return f"{path} is a directory"
    if path.exists() and not path.is_file():
        return (f"{path} is not a regular file (a device, FIFO or socket), which writing the "
                f"results would replace")
    return None


def unwritable_file_reason(path: Path, *, keeps_prev: bool = False) -> str | None:
    """Why `path` cannot be (re)written as a file, or None. ``keeps_prev``: the writer keeps
    an existing `path` as :func:`prev_path` (``replace_keeping_prev``), which must be
    replaceable too — checked before the work, not found after it. A path that names a folder
    (``.``, ``/``, ``x/..``), a name longer than the file system takes, and an OSError of the
    checks themselves are reasons too (each was a traceback, or a failure after the work)."""
    path = Path(path)
    if path.name in ("", ".", ".."):
        return f"{path} names a folder, not a file"
    try:
        return _unwritable_file_reason(path, keeps_prev)
    except OSError as exc:
        return f"{path} cannot be used ({exc.strerror or exc})"


def _unwritable_file_reason(path: Path, keeps_prev: bool) -> str | None:
    problem = _name_reason(path, path.name)
    if problem is None:
        problem = not_regular_reason(path)
    if problem is None and path.exists() and not os.access(path, os.W_OK):
        problem = f"{path} is read-only"
    if problem is None and keeps_prev and path.exists():
        problem = _name_reason(path, prev_path(path).name)
    if problem is None and keeps_prev and path.exists():
        prev = not_regular_reason(prev_path(path))
        problem = prev and f"the file it replaces is kept as {prev_path(path)}, but {prev}"
    return problem or unwritable_dir_reason(path.parent)


def _new_file_mode(path: Path) -> int:
    """The existing file's permissions, else what a plain ``open(path, "w")`` would give."""
    try:
        return path.stat().st_mode & 0o777
    except OSError:
        umask = os.umask(0)
        os.umask(umask)
        return 0o666 & ~umask


def fsync_folder(folder: Path) -> None:
    """Flush `folder`'s entries to disk: a rename is durable only once its directory is (after a
    power cut the file's data was on disk, but the name could still point at the old file, or
    at nothing). Best effort: where a folder cannot be opened or synced (Windows, some
    network file systems), nothing happens."""
    try:
        fd = os.open(folder, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


@contextmanager
def atomic_path(path: Path, *, overwrite: bool = True) -> Iterator[Path]:
    """Yield a temporary path beside `path`; on success it replaces `path` atomically, on any
    error it is removed and `path` is left untouched. Missing parent directories are created.
    ``overwrite=False``: FileExistsError when `path` appeared meanwhile (a hard link, which
    never replaces; without hard links on the file system, a plain replace)."""
    path = Path(path)
    problem = not_regular_reason(path)
    if problem:                     # never renamed over a directory, device or FIFO
        raise FileExistsError(problem)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, name = tempfile.mkstemp(dir=path.parent, prefix=_temp_prefix(path.name), suffix=".tmp")
    os.close(fd)
    tmp = Path(name)
    try:
        yield tmp
        os.chmod(tmp, _new_file_mode(path))  # mkstemp's 0600 -> the usual file mode
        with open(tmp, "rb+") as fh:  # the data on disk before the rename makes it visible
            os.fsync(fh.fileno())
        if overwrite:
            os.replace(tmp, path)
        else:
            try:
                os.link(tmp, path)
            except FileExistsError:
                raise FileExistsError(f"{path} exists: pass force=True (--force) to "
                                      "overwrite it") from None
            except OSError:  # no hard links on this file system
                os.replace(tmp, path)
        fsync_folder(path.parent)
    finally:
        tmp.unlink(missing_ok=True)


def check_new_output(path: Path, *, force: bool) -> None:
    """:func:`write_atomic`'s refusals, for callers that check every output before any work:
    FileNotFoundError when the directory of ``path`` does not exist, FileExistsError when
    ``path`` exists and not ``force``."""
    path = Path(path)
    if not path.parent.is_dir():
        raise FileNotFoundError(f"output directory {path.parent} does not exist")
    if path.exists() and not force:
        raise FileExistsError(f"{path} exists: pass force=True (--force) to overwrite it")


def write_atomic(path: Any, write: Callable[[Path], None], *, force: bool = False) -> Path:
    """Call ``write(tmp)`` on a temporary path next to ``path``, then move it to ``path``.

    Raises FileExistsError when ``path`` exists and not ``force``; FileNotFoundError when its
    directory does not exist. The temporary file is removed on any failure.
    """
    path = Path(path)
    check_new_output(path, force=force)
    with atomic_path(path, overwrite=force) as tmp:
        write(tmp)
    return path


def atomic_write_text(path: Path, text: str) -> None:
    with atomic_path(path) as tmp:
        tmp.write_text(text)


try:
    import fcntl
except ImportError:         # (not on Windows: no lock there)
    fcntl = None

_HELD = threading.local()      # .depth: folder -> how many times this THREAD holds its lock


@contextmanager
def folder_lock(folder: Path) -> Iterator[None]:
    """Hold an exclusive advisory lock on `folder` (``flock`` of the directory itself: no lock
    file is left in a user's folder) while result files there are chosen and rotated. Two
    processes writing results into one folder (parallel experiment commands sharing --out,
    two --json of one file) each checked what was there and then rotated what was there by
    the time they wrote: one's summary was demoted to .prev or deleted, or the rotation
    crashed on a file the other had just moved (a concurrency audit). Re-entrant within a
    thread; two threads of one process exclude each other too (each takes the flock on a
    descriptor of its own, and flock locks of two descriptors conflict: the count of holds
    was per process, so a second thread walked in unlocked and a write lost the .prev it
    should have kept; a thread audit). Best effort where the folder cannot be opened or
    locked (no error)."""
    key = os.path.realpath(folder)
    held = _HELD.__dict__.setdefault("depth", {})
    depth = held.get(key, 0)
    held[key] = depth + 1
    fd = None
    try:
        if depth == 0 and fcntl is not None:
            try:
                fd = os.open(key, os.O_RDONLY)
                fcntl.flock(fd, fcntl.LOCK_EX)
            except OSError:
                if fd is not None:
                    os.close(fd)
                fd = None
        yield
    finally:
        if fd is not None:
            os.close(fd)            # (closing releases the lock)
        held[key] -= 1
        if not held[key]:
            del held[key]


@contextmanager
def claim(path: Path, *, wait: bool) -> Iterator[bool]:
    """Claim the work that `path` names (a run to train) among processes: an exclusive
    ``flock`` on the claim file `path` (created, and removed when released). Yields True while
    held; False when another process holds it and ``wait`` is False (without waiting); with
    ``wait`` it blocks until the holder is done. Best effort, like `folder_lock`: where the
    file cannot be made or locked (no fcntl on Windows, a read-only folder) it yields True,
    and two processes may then both do the work, which wastes time but changes no result.

    Why a file: a run is ~1 h on BlogCatalog, and two commands sharing --runs-dir whose
    seeds overlapped trained the same runs side by side (three did here). The holder removes
    the file only while it is still the file it locked (a waiter that got the lock on the
    removed file must not remove a newer claimant's file)."""
    path = Path(path)
    fd = None
    if fcntl is not None:
        try:
            fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
        except OSError:
            fd = None
    if fd is None:
        yield True
        return
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | (0 if wait else fcntl.LOCK_NB))
        except BlockingIOError:
            yield False
            return
        except OSError:
            pass                        # (locking unsupported here: best effort, held)
        try:
            yield True
        finally:
            try:
                if os.stat(path).st_ino == os.fstat(fd).st_ino:
                    os.unlink(path)
            except OSError:
                pass
    finally:
        os.close(fd)                    # (closing releases the lock)


def replace_file_set(out: Path, writers: dict, current: list, prev_of,
                     older: list = ()) -> tuple[list[Path], list[Path]]:
    """Write a set of result files into `out` as one set, keeping the set it replaces.

    ``writers``: file name -> function writing that file at the path it is given. Every file is
    first written to a temporary file in `out` (mode and data on disk); only when all are
    complete, and if any of ``current`` (the names of the set in place) exists, the files of
    ``older`` (the generation before, removed whole so generations never mix) are deleted and
    each existing ``current`` file moves to ``prev_of(name)``; then the new files are renamed
    into place. A failure before that (a plot error, a full disk) leaves `out` as it was.
    Returns (written paths, kept previous paths)."""
    out = Path(out)
    rotating = any((out / c).exists() for c in current)
    problem = next((r for r in (not_regular_reason(out / n) for n in (
        *writers, *(prev_of(c) for c in current if (out / c).exists()),
        *(older if rotating else ()))) if r), None)
    # never renamed over a directory, device or FIFO; an older-generation file that is one
    # would fail its unlink below, after the work, with part of that generation deleted
    if problem:
        raise FileExistsError(problem)
    out.mkdir(parents=True, exist_ok=True)
    temps: dict[str, Path] = {}
    try:
        for name, write in writers.items():
            # (the name's own suffix last: writers such as matplotlib read the format there)
            fd, tmp = tempfile.mkstemp(dir=out, prefix=_temp_prefix(name),
                                       suffix=_temp_suffix(name))
            os.close(fd)
            temps[name] = Path(tmp)
            write(temps[name])
            os.chmod(temps[name], _new_file_mode(out / name))
            with open(temps[name], "rb+") as fh:
                os.fsync(fh.fileno())
        kept = []
        # the rotation as one step among processes, and for Ctrl-C: between the moves of the
        # current set to .prev and of the new one into place, only .prev files exist
        with folder_lock(out), interrupts_deferred():
            if any((out / name).exists() for name in current):
                for p in older:
                    (out / p).unlink(missing_ok=True)
                for name in current:
                    try:
                        os.replace(out / name, out / prev_of(name))
                    except FileNotFoundError:   # not there (moved by a process that does
                        continue                # not take the lock): nothing to keep
                    kept.append(out / prev_of(name))
            for name, tmp in temps.items():
                os.replace(tmp, out / name)
            fsync_folder(out)
    finally:
        for tmp in temps.values():
            tmp.unlink(missing_ok=True)
    return [out / name for name in writers], kept


class DeferredInterrupt(KeyboardInterrupt):
    """A Ctrl-C that :func:`interrupts_deferred` held, raised once its block was done: the
    files it moved are all in place (a plain KeyboardInterrupt from ``replace_file_set``
    came before its rotation: the folder is as it was)."""


# the signals that end a command from outside: Ctrl-C, a scheduler's or `kill`'s SIGTERM, a
# closed terminal's SIGHUP (where the platform has it)
_HELD_SIGNALS = tuple(getattr(signal, name) for name in ("SIGINT", "SIGTERM", "SIGHUP")
                      if hasattr(signal, name))


@contextmanager
def interrupts_deferred() -> Iterator[None]:
    """Hold SIGINT (Ctrl-C), SIGTERM and SIGHUP until the block is done, then deliver them.
    For the few file moves that must not stop half-way (a Ctrl-C, or a job scheduler's
    SIGTERM, in ``replace_file_set``'s rotation left the results only as ``NAME.prev.json``).
    A Ctrl-C under Python's own handler comes out as ``DeferredInterrupt`` (a
    KeyboardInterrupt saying the block finished); any other held signal is raised again
    under the handler it had, so a default SIGTERM still ends the process, only a few
    milliseconds later, and a handler of the caller's runs as it would have. Main thread
    only (where signal handlers run); an ignored signal, or one whose handler was not set
    from Python, is left alone. If the block raises, the other held signals are delivered
    all the same (a SIGTERM must not be lost to a failed rename); a held Ctrl-C gives way to
    the block's error."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    handlers = {sig: signal.getsignal(sig) for sig in _HELD_SIGNALS}
    handlers = {sig: h for sig, h in handlers.items() if h not in (signal.SIG_IGN, None)}
    caught: list[int] = []
    done = False
    try:
        for sig in handlers:
            signal.signal(sig, lambda signum, frame: caught.append(signum))
        yield
        done = True
    finally:
        for sig, handler in handlers.items():
            signal.signal(sig, handler)
        for sig in dict.fromkeys(caught):
            if sig != signal.SIGINT or handlers[sig] is not signal.default_int_handler:
                signal.raise_signal(sig)
    # a Ctrl-C held while the block raised gives way to that error (the files are not all in
    # place, which DeferredInterrupt would say they are)
    if done and signal.SIGINT in caught and handlers[signal.SIGINT] is signal.default_int_handler:
        raise DeferredInterrupt


def prev_path(path: Path) -> Path:
    """Where the previous generation of result file `path` is kept: ``res.json`` ->
    ``res.prev.json`` (the scheme of ``scale.prev.csv``)."""
    path = Path(path)
    return path.with_name(f"{path.stem}.prev{path.suffix}")


def replace_keeping_prev(path: Path, text: str) -> Path | None:
    """Write `text` to `path` atomically; an existing `path` is first moved to
    :func:`prev_path` (one generation, replacing an older one). Returns that path, or None
    when there was nothing to keep. On a failed write `path` is left as it was."""
    path = Path(path)
    _, kept = replace_file_set(path.parent, {path.name: lambda tmp: tmp.write_text(text)},
                               [path.name], lambda name: prev_path(path).name)
    return kept[0] if kept else None


def overwritten_input(out: Path, inputs: list[Path]) -> Path | None:
    """The first of `inputs` (files, or folders read whole, such as a PyG dataset's) that
    writing `out` would replace or write into, else None (links followed)."""
    for src in inputs:
        resolved, folder = Path(out).resolve(), Path(src).resolve()
        if same_file(out, src) or folder in resolved.parents:
            return Path(src)
    return None


def same_file(a: Path, b: Path) -> bool:
    """Whether paths `a` and `b` name the same file (links followed); where one does not exist
    yet, whether they resolve to the same path. (An output that is an input must be refused
    before it overwrites it.)"""
    try:
        return os.path.samefile(a, b)
    except OSError:                 # one of them does not exist (yet)
        return Path(a).resolve() == Path(b).resolve()
