"""Where the benchmark tools write their results: checked before the run (a loss grid can take
hours; an unwritable --out was found after it, with a traceback), written atomically, and an
earlier result kept as NAME.prev.EXT (one generation, said on stdout), as scale.py and
gpu_report.py keep theirs: a second run never silently replaces the first."""
from __future__ import annotations

import argparse
from pathlib import Path

from hiertail_fast._files import replace_keeping_prev, unwritable_file_reason


def check_targets(parser: argparse.ArgumentParser, option: str, *paths: Path) -> None:
    """parser.error (exit 2, one line) unless every path can be written, its .prev too."""
    for path in paths:
        problem = unwritable_file_reason(Path(path), keeps_prev=True)
        if problem:
            parser.error(f"{option} {paths[0]} cannot be written: {problem}")


def write_result(path: Path, text: str) -> None:
    """``text`` to ``path`` atomically, an existing file kept as its .prev (printed)."""
    kept = replace_keeping_prev(Path(path), text)
    if kept is not None:
        print(f"the previous {Path(path).name} is kept as {kept}")
