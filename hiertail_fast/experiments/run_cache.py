"""The experiments' per-run cache: one JSON file per finished run, named by a hash of the run's
identity, and what identifies the code (`code_version`) and the data (`data_fingerprint`) a
record was made with (the package docstring of `hiertail_fast.experiments.runner` tells the
whole contract: resume, claims, fingerprints)."""
from __future__ import annotations

import hashlib
import json
import os
import subprocess
from functools import lru_cache
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from hiertail_fast._files import atomic_write_text, claim, folder_lock
from hiertail_fast._protocol import METRICS

if TYPE_CHECKING:
    from hiertail_fast.experiments.runner import RunSpec


def git(*args: str) -> str | None:
    """``git ARGS`` in this package's checkout; None when git or the checkout is absent."""
    try:
        res = subprocess.run(["git", *args], cwd=Path(__file__).resolve().parent,
                             capture_output=True, text=True, timeout=10)
    except (OSError, subprocess.SubprocessError):
        return None
    return res.stdout.strip() if res.returncode == 0 else None


@lru_cache(maxsize=1)
def code_version() -> dict:
    """The code the runs of this process train with: the commit (and whether tracked files
    differ) when this package runs from a git checkout of itself, and the package's version.
    An installed copy (site-packages, perhaps inside a user's own repository, whose commit is
    not this code's) has no commit: its ``git_commit`` / ``git_dirty`` are None."""
    from hiertail_fast import __version__

    tracked = git("ls-files", "--error-unmatch", "--", "__init__.py") is not None
    dirty = git("status", "--porcelain", "--untracked-files=no") if tracked else None
    return {"git_commit": git("rev-parse", "HEAD") if tracked else None,
            "git_dirty": None if dirty is None else bool(dirty),
            "package_version": __version__}


def code_key(record: dict) -> tuple:
    """What identifies the code of a run record or provenance: its commit when it has one,
    else its package version (records written before versions were recorded have None)."""
    if record.get("git_commit") is not None:
        return (record["git_commit"], record.get("git_dirty"), None)
    return (None, None, record.get("package_version"))


def code_text(key: tuple) -> str:
    """A `code_key` for a summary: the commit, or the package version of an installed copy."""
    commit, dirty, version = key
    if commit is not None:
        return f"`{commit}`" + (" (uncommitted changes)" if dirty else "")
    return f"version `{version}` (no git checkout)" if version else "`None`"


def data_fingerprint(data) -> str:
    """``"sha256:<hex>"`` of a graph's content as a run sees it: x, edge_index and y (each its
    name, dtype, shape and bytes, C order). Two graphs of the same shape but other features,
    edges or labels get different fingerprints."""
    h = hashlib.sha256()
    for name in ("x", "edge_index", "y"):
        value = getattr(data, name)
        if hasattr(value, "detach"):
            value = value.detach().cpu().contiguous().numpy()
        a = np.ascontiguousarray(value)
        h.update(f"{name}:{a.dtype.str}:{list(a.shape)};".encode())
        h.update(a.tobytes())
    return "sha256:" + h.hexdigest()


def _safe(text: str) -> str:
    return "".join(c if c.isalnum() or c in "._=-" else "_" for c in text)[:80]


# what `RunCache.lookup` says of a run of other data of the same shape, which `RunCache.put`
# keeps beside the new one (run_specs' notice says so only then)
OTHER_DATA = "was made from other data of the same shape"


class RunCache:
    """One JSON file per finished run; the file name carries a hash of the run's identity."""

    def __init__(self, root: Path) -> None:
        self.root = Path(root)

    def path(self, spec: RunSpec, identity: dict) -> Path:
        digest = hashlib.sha256(json.dumps(identity, sort_keys=True).encode()).hexdigest()[:12]
        return (self.root / _safe(spec.dataset)
                / f"{_safe(spec.method)}-{digest}-s{identity['seed']}.json")

    def lookup(self, spec: RunSpec, identity: dict, fingerprint: str | None = None
               ) -> tuple[dict | None, str | None]:
        """(the cached record or None, why a file that exists is not used, or None).

        Not used: a file that cannot be read or parsed (truncated, corrupt), and a record whose
        ``data_fingerprint`` differs from ``fingerprint`` (same shape, other data). A record
        without a fingerprint (made before it existed) is used: see the module docstring."""
        p = self.path(spec, identity)
        if not p.is_file():
            return None, None
        try:
            record = json.loads(p.read_text())
        except (OSError, UnicodeDecodeError, ValueError) as exc:
            return None, f"warning: cached run {p} cannot be read ({exc}); treated as missing"
        if not _is_run_record(record):
            return None, (f"warning: cached run {p} is not a complete run record "
                          "(corrupt); treated as missing")
        if record.get("identity") != identity:
            return None, None
        cached = record.get("data_fingerprint")
        if fingerprint is not None and cached is not None and cached != fingerprint:
            kept = self._kept(p, fingerprint, identity)  # this data's run, kept by a put
            if kept is not None:
                return kept, None
            return None, (f"cached run {p} {OTHER_DATA} "
                          f"(data fingerprint {str(cached)[:19]}, this data {fingerprint[:19]}); "
                          "treated as missing")
        return record, None

    @staticmethod
    def _version_path(p: Path, fingerprint: str) -> Path:
        """Where the run of `p`'s identity made from the data of `fingerprint` is kept when
        the run of other data of the same shape takes `p`."""
        return p.with_name(f"{p.stem}.data-{str(fingerprint).split(':')[-1][:16]}.json")

    def _kept(self, p: Path, fingerprint: str, identity: dict) -> dict | None:
        """The run `put` kept beside `p` for the data of `fingerprint`: served only whole,
        of that data (its full fingerprint) and of this run (its identity, as `lookup`
        checks `p`'s: a file copied into place, or a 48-bit digest shared, is not this run)."""
        try:
            record = json.loads(self._version_path(p, fingerprint).read_text())
        except (OSError, UnicodeDecodeError, ValueError):
            return None
        ok = (_is_run_record(record) and record.get("data_fingerprint") == fingerprint
              and record.get("identity") == identity)
        return record if ok else None

    def claim(self, spec: RunSpec, identity: dict, *, wait: bool):
        """`claim` (hiertail_fast._files) of the run: the flock on ``.<run file
        stem>.training`` beside its file, while this process trains it."""
        p = self.path(spec, identity)
        p.parent.mkdir(parents=True, exist_ok=True)
        return claim(p.with_name(f".{p.stem}.training"), wait=wait)

    def get(self, spec: RunSpec, identity: dict, fingerprint: str | None = None) -> dict | None:
        return self.lookup(spec, identity, fingerprint)[0]

    def put(self, spec: RunSpec, identity: dict, record: dict) -> Path:
        """Write `record` as its identity's run; a run of other data of the same shape in that
        file is first moved beside it (``<name>.data-<its fingerprint>.json``), where
        `lookup` finds it again when that data comes back (it was overwritten: switching
        between two versions of a dataset retrained every run each time)."""
        p = self.path(spec, identity)
        p.parent.mkdir(parents=True, exist_ok=True)
        # the read, move and write as one step among commands sharing --runs-dir: two that
        # retrained this run on other data at once each moved the file the other had just
        # moved (a crash after training) or kept the wrong run beside it
        with folder_lock(p.parent):
            try:
                old = json.loads(p.read_text())
            except (OSError, UnicodeDecodeError, ValueError):
                old = None
            cached = old.get("data_fingerprint") if isinstance(old, dict) else None
            if cached and cached != record.get("data_fingerprint"):
                os.replace(p, self._version_path(p, cached))
            atomic_write_text(p, json.dumps(record, indent=1, default=_json_default) + "\n")
        return p


def _json_default(obj: Any):
    if isinstance(obj, np.integer):
        return int(obj)
    if isinstance(obj, np.floating):
        return float(obj)
    if isinstance(obj, np.ndarray):
        return obj.tolist()
    raise TypeError(f"not JSON serialisable: {type(obj).__name__}")


def _is_run_record(record: Any) -> bool:
    """Whether a cached file holds a whole run: a diverged run's message, or a result with the
    test metrics and epochs the summaries read, and its wall time. (A record with an empty or
    partial result was used and crashed the summary with a KeyError after all training.)"""
    if not isinstance(record, dict) or not isinstance(record.get("wall_s"), (int, float)):
        return False
    if isinstance(record.get("diverged"), str):
        return True
    result = record.get("result")
    test = result.get("test") if isinstance(result, dict) else None
    return (isinstance(test, dict) and "epochs_run" in result
            and all(isinstance(test.get(m), (int, float)) for m in METRICS))
