"""In-process A/B of the loss (torch engine, or ``--backend attention``) against another git
revision of the package, ROUND-ROBIN, on CPU (default) or, with ``--device cuda``, on a GPU.

``engine_ab.py`` switches between two paths that the current code keeps. A change that replaces
code (nothing left to switch back to) is measured against the package as it was at an earlier
revision: ``git archive REV hiertail_fast`` is unpacked into a temporary directory as the
package ``hiertail_fast_rev`` (its imports rewritten to that name; its C kernels build from
their own sources into the same cache, under their own hash), imported beside this checkout's
package, and the two losses are timed round by round in one process with the floor + exp
anchor (and, with ``--exact``, this checkout's exact variant), so the VM's drift hits them alike.
Before timing, the two gradients are compared (max |difference| / max |gradient|), so a
speed-up that changed the numbers shows.

    python bench/version_ab.py --rev HEAD~1 --levels 1 --variant official --regimes relu randn
    python bench/version_ab.py --rev 9905973 --levels 3 --exact --rounds 9
    python bench/version_ab.py --device cuda --rev 9f412c2 --n 20000 --regimes relu  # a card

Run it on an idle machine (``bench/idle_window.sh``); the load average is printed.
"""
from __future__ import annotations

import argparse
import contextlib
import importlib
import os
import re
import subprocess
import sys
import tarfile
import tempfile
from io import BytesIO
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).parent))
import loss_grid  # noqa: E402
from _device import asked_device  # noqa: E402
from engine_ab import add_case_arguments, round_robin_medians  # noqa: E402
from loss_grid import floor_step, make_case  # noqa: E402

import hiertail_fast  # noqa: E402

REPO = Path(__file__).resolve().parent.parent
REV_NAME = "hiertail_fast_rev"


def unpack_revision(rev: str, into: Path, repo: Path = REPO) -> Path:
    """``hiertail_fast`` at git revision ``rev`` as the package ``REV_NAME`` under ``into``."""
    proc = subprocess.run(["git", "-C", str(repo), "archive", "--format=tar", rev,
                           "hiertail_fast"], capture_output=True, timeout=120)
    if proc.returncode != 0:
        raise SystemExit(f"git archive {rev} failed: {proc.stderr.decode().strip()}")
    with tarfile.open(fileobj=BytesIO(proc.stdout)) as tar:
        if hasattr(tarfile, "data_filter"):        # Python >= 3.11.4 / 3.12
            tar.extractall(into, filter="data")
        else:
            tar.extractall(into)
    pkg = into / REV_NAME
    (into / "hiertail_fast").rename(pkg)
    word = re.compile(r"\bhiertail_fast\b")
    for path in pkg.rglob("*.py"):
        path.write_text(word.sub(REV_NAME, path.read_text()))
    return pkg


@contextlib.contextmanager
def revision_package(rev: str, header: str):
    """``hiertail_fast`` at git revision ``rev``, imported as ``REV_NAME`` for the with block
    (unpacked into a temporary directory), after printing the load average, torch's thread
    count and ``header``. A module of that name imported before (another revision's, whose
    directory is gone) is dropped first, and this one after the block: in one process a second
    tool resolved the first one's stale package and failed importing its submodules."""
    with tempfile.TemporaryDirectory(prefix="version_ab-") as tmp:
        unpack_revision(rev, Path(tmp))
        _forget_revision()
        sys.path.insert(0, tmp)
        try:
            pkg = importlib.import_module(REV_NAME)
        finally:
            sys.path.remove(tmp)
        print(f"load average {os.getloadavg()}, {torch.get_num_threads()} threads, old = "
              f"{rev}, new = this checkout, {header}", flush=True)
        try:
            yield pkg
        finally:
            _forget_revision()


def _forget_revision() -> None:
    for name in [m for m in sys.modules if m == REV_NAME or m.startswith(REV_NAME + ".")]:
        del sys.modules[name]


def loss_step(pkg, z, ys, ps, tau: float, variant: str, backend: str = "torch",
              learn_tau: bool = False):
    """Forward + backward of the loss of package ``pkg`` (engine `backend`); returns the
    gradient (``learn_tau``: tau a 0-d tensor that requires grad, and the step returns
    (dL/dz, dL/dtau))."""
    def step():
        zz = z.detach().requires_grad_()
        t = torch.tensor(tau, device=z.device, requires_grad=True) if learn_tau else tau
        if len(ys) == 1:
            loss = pkg.balanced_contrastive_loss(zz, ys[0], prototypes=ps[0], temperature=t,
                                                 variant=variant, backend=backend)
        else:
            loss = pkg.hierarchical_contrastive_loss(zz, ys, ps, temperature=t,
                                                     variant=variant, backend=backend)
        loss.backward()
        loss_grid._sync()              # (CUDA: the step's time is its kernels' too)
        return (zz.grad, t.grad) if learn_tau else zz.grad
    return step


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=" ".join(__doc__.split("\n\n")[0].split()))
    p.add_argument("--rev", required=True, help="the git revision to compare with (old)")
    add_case_arguments(p, levels=1, rounds=11)
    p.add_argument("--exact", action="store_true",
                   help="also time this checkout's exact variant (new / exact ratios)")
    p.add_argument("--backend", choices=("torch", "attention"), default="torch",
                   help="the loss engine both revisions run (default torch)")
    p.add_argument("--learnable-temperature", action="store_true",
                   help="tau a 0-d tensor that requires grad in every step (dL/dtau printed)")
    p.add_argument("--device", choices=("cpu", "cuda"), default="cpu",
                   help="where the cases run (default cpu, also on a GPU machine: the CPU "
                        "engines' internals); cuda: the torch engine's CUDA paths")
    args = p.parse_args(argv)
    if args.n < 1 or args.d < 1 or args.rounds < 2:
        p.error("--n and --d must be positive and --rounds at least 2")
    return loss_grid.on_device(asked_device(p, args.device))(_compare)(args)


def _compare(args) -> int:
    with revision_package(args.rev, f"N {args.n}, d {args.d}, L {args.levels}, {args.variant}, "
                          f"tau {args.tau:g}, {args.backend} engine, {args.rounds} rounds "
                          f"(first dropped)"
                          f"{', learnable tau' if args.learnable_temperature else ''}") as old_pkg:
        for regime in args.regimes:
            z, ys, ps = make_case(regime, args.n, args.d, args.levels)
            learn = args.learnable_temperature
            steps = {"old": loss_step(old_pkg, z, ys, ps, args.tau, args.variant, args.backend,
                                      learn),
                     "new": loss_step(hiertail_fast, z, ys, ps, args.tau, args.variant,
                                      args.backend, learn),
                     "floor+exp": floor_step(z, ps, with_exp=True)}
            if args.exact:
                steps["exact"] = loss_step(hiertail_fast, z, ys, ps, args.tau, "exact",
                                           args.backend, learn)
            if learn:          # what learning tau costs: this checkout with a float tau
                steps["float tau"] = loss_step(hiertail_fast, z, ys, ps, args.tau, args.variant,
                                               args.backend)
            g_old, g_new = steps["old"](), steps["new"]()
            taus = ""
            if learn:
                (g_old, t_old), (g_new, t_new) = g_old, g_new
                taus = f"  dL/dtau old {t_old.item():.9g} new {t_new.item():.9g}"
            diff = float((g_old - g_new).abs().max() / g_old.abs().max().clamp(min=1e-30))
            med = round_robin_medians(steps, args.rounds)
            line = (f"{regime:10s} old {med['old']:.4f} s  new {med['new']:.4f} s  "
                    f"floor+exp {med['floor+exp']:.4f} s  new/old {med['new'] / med['old']:.3f}"
                    f"  grad diff {diff:.1e}")
            if args.exact:
                line += (f"  exact {med['exact']:.4f} s  new/exact "
                         f"{med['new'] / med['exact']:.3f}")
            if learn:
                line += (f"  float tau {med['float tau']:.4f} s  new/float tau "
                         f"{med['new'] / med['float tau']:.3f}")
            print(line + taus, flush=True)
    print(f"load average {os.getloadavg()}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
