"""The command lines' argument parser: argparse with a one-line error.

argparse prints the whole usage before an error; for the trainer (~80 options) that is ~60
lines with the message last. Here an error is one line, ``PROG: error: MESSAGE (PROG --help
lists the options)``, exit code 2 as argparse's; ``--help`` is unchanged."""
from __future__ import annotations

import argparse


class ArgumentParser(argparse.ArgumentParser):
    def error(self, message: str):
        self.exit(2, f"{self.prog}: error: {message} ({self.prog} --help lists the options)\n")


def path_arg(value: str):
    """``type=`` of a path option: a ``Path``, refusing the empty string, which ``Path("")``
    silently turns into the current folder (``--root ""`` read the working directory's
    files, where the library's ``resolve_root("")`` refuses it)."""
    from pathlib import Path

    if not value:
        raise argparse.ArgumentTypeError("an empty path (use '.' for the current folder)")
    return Path(value)
