"""The training CLI on a busy machine: seconds per epoch with the cores taken by other jobs.

Starts ``--busy`` busy-loop processes (default: one per core), then runs
``python -m hiertail_fast.train`` on the same data in three thread set-ups and prints the time per
epoch the CLI reports:

    default        the CLI's own choice (OMP_WAIT_POLICY=PASSIVE, 1 thread below 5,000 nodes)
    passive-2      OMP_WAIT_POLICY=PASSIVE, --threads 2
    active-2       OMP_WAIT_POLICY=ACTIVE, --threads 2 (spinning OpenMP workers: the old default)

    python bench/busy_machine.py --data ../shared/data/email.npz
"""
from __future__ import annotations

import argparse
import os
import re
import subprocess
import sys
import time
from pathlib import Path

from hiertail_fast._argparse import positive

MODES = {
    "default": ({}, []),
    "passive-2": ({"OMP_WAIT_POLICY": "PASSIVE"}, ["--threads", "2"]),
    "active-2": ({"OMP_WAIT_POLICY": "ACTIVE"}, ["--threads", "2"]),
}


def run_cli(data: Path, epochs: int, env_extra: dict, extra: list[str]) -> float:
    env = {k: v for k, v in os.environ.items() if k != "OMP_WAIT_POLICY"}
    env.update(env_extra)
    out = subprocess.run(
        [sys.executable, "-m", "hiertail_fast.train", "--data", str(data), "--epochs",
         str(epochs), "--patience", str(epochs), "--seeds", "1", *extra],
        capture_output=True, text=True, env=env, timeout=1800, check=True).stdout
    match = re.search(r"time/epoch ([0-9.]+) ms", out)
    if match is None:
        raise RuntimeError(f"no 'time/epoch' line in the CLI's output:\n{out}")
    return float(match.group(1))


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=" ".join(__doc__.split("\n\n")[0].split()))
    parser.add_argument("--data", type=Path, required=True)
    parser.add_argument("--epochs", type=positive(int), default=30)
    parser.add_argument("--busy", type=int, default=os.cpu_count() or 1,
                        help="busy-loop processes to start (0: measure on the idle machine)")
    args = parser.parse_args(argv)
    if not args.data.is_file():
        parser.error(f"--data {args.data} is not a file")
    if args.busy < 0:
        parser.error(f"--busy must be >= 0, got {args.busy}")
    loops = [subprocess.Popen([sys.executable, "-c", "while True: pass"])
             for _ in range(args.busy)]
    try:
        time.sleep(2 if loops else 0)
        print(f"{args.busy} busy-loop processes, load average {os.getloadavg()}")
        for name, (env_extra, extra) in MODES.items():
            print(f"  {name:10s} {run_cli(args.data, args.epochs, env_extra, extra):9.1f} "
                  "ms/epoch", flush=True)
    finally:
        for p in loops:
            p.kill()
            p.wait()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
