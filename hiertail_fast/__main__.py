"""The training command line's process entry: ``python -m hiertail_fast``, ``python -m
hiertail_fast.train`` and the ``hiertail-train`` console script all call `main` (options: see
``--help`` and hiertail_fast/_train_cli.py).

`main` sets ``OMP_WAIT_POLICY=PASSIVE`` when the user has not set it, BEFORE torch is imported
(OpenMP reads it once, when torch loads it): spinning OpenMP threads made one Email epoch 1,146 ms
instead of 47 ms on a loaded 2-core machine. Importing this module changes nothing."""
from __future__ import annotations

import os
import sys
from collections.abc import Sequence


def prefer_passive_wait() -> bool:
    """Set OMP_WAIT_POLICY=PASSIVE for this process if unset and torch is not loaded yet (it
    would have no effect then); True when it was set."""
    if "OMP_WAIT_POLICY" in os.environ or "torch" in sys.modules:
        return False
    os.environ["OMP_WAIT_POLICY"] = "PASSIVE"
    return True


def program_name(prog: str | None = None) -> str:
    """The name usage and error lines give the command: ``prog`` when the entry knows it (the
    two ``python -m`` forms pass theirs), else the console script's own name (``hiertail-train``,
    from argv[0]), else ``python -m hiertail_fast.train`` (argv[0] ``-c`` or a ``.py`` file: an
    embedding program)."""
    if prog is not None:
        return prog
    name = os.path.basename(sys.argv[0]) if sys.argv and sys.argv[0] else ""
    if not name or name.startswith("-") or name.endswith(".py"):
        return "python -m hiertail_fast.train"
    return name


def main(argv: Sequence[str] | None = None, prog: str | None = None) -> int:
    """Run the training CLI; exit status 0 (errors exit through SystemExit: 2 for usage)."""
    prefer_passive_wait()
    from hiertail_fast._train_cli import main as cli_main

    cli_main(argv, prog=program_name(prog))
    return 0


if __name__ == "__main__":
    sys.exit(main(prog="python -m hiertail_fast"))
