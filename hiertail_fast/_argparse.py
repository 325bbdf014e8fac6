"""The command lines' argument parser: argparse with a one-line error.

argparse prints the whole usage before an error; for the trainer (~80 options) that is ~60
lines with the message last. Here an error is one line, ``PROG: error: MESSAGE (PROG --help
lists the options)``, exit code 2 as argparse's; ``--help`` is unchanged."""
from __future__ import annotations

import argparse
import math


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


def positive(kind: type):
    """``type=`` of a count or size: a positive int ("100000" or "1e5") or a positive finite
    float; anything else an argparse error (exit 2, one line), not a traceback from the run."""
    def convert(text: str):
        try:
            number = float(text)
        except ValueError:
            what = "an integer" if kind is int else "a number"
            raise argparse.ArgumentTypeError(f"{text!r} is not {what}") from None
        if kind is int and (not math.isfinite(number) or number != int(number)):
            raise argparse.ArgumentTypeError(f"{text!r} is not an integer")
        if not (number > 0 and math.isfinite(number)):
            raise argparse.ArgumentTypeError(f"{text!r} must be a positive "
                                             + ("integer" if kind is int else "number"))
        return kind(number)
    return convert
