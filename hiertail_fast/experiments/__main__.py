"""``python -m hiertail_fast.experiments NAME``: sets the passive OpenMP wait policy before torch
is imported (as the training command does), then runs hiertail_fast/experiments/cli.py."""
from __future__ import annotations

import sys

from hiertail_fast.__main__ import prefer_passive_wait


def main(argv=None) -> int:
    prefer_passive_wait()
    from hiertail_fast.experiments.cli import main as cli_main

    cli_main(argv)
    return 0


if __name__ == "__main__":
    sys.exit(main())
