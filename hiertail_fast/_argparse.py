"""The command lines' argument parser: argparse with a one-line error.

argparse prints the whole usage before an error; for the trainer (~80 options) that is ~60
lines with the message last. Here an error is one line, ``PROG: error: MESSAGE (PROG --help
lists the options)``, exit code 2 as argparse's; ``--help`` is unchanged."""
from __future__ import annotations

import argparse
import math
import re


class ArgumentParser(argparse.ArgumentParser):
    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        # A value that starts like a negative number ("-1,2", "-5e3", "-3,") is a value, as
        # later argparse releases read it; older ones (3.11, 3.12.1, 3.13.0 among them) took
        # only "-1" / "-1.5" so, and "--seeds -1,2" failed as "expected at least one argument"
        # instead of naming the seed (a fresh-user audit). None of our options looks like a
        # negative number.
        if hasattr(self, "_negative_number_matcher"):
            self._negative_number_matcher = re.compile(r"-\.?\d")

    def error(self, message: str):
        self.exit(2, f"{self.prog}: error: {message} ({self.prog} --help lists the options)\n")


def path_arg(value: str):
    """``type=`` of a FILE option: a ``Path``, refusing the empty string, which ``Path("")``
    silently turns into the current folder (``--root ""`` read the working directory's
    files, where the library's ``resolve_root("")`` refuses it)."""
    return _path(value, "a file name is needed")


def dir_arg(value: str):
    """``type=`` of a FOLDER option: ``path_arg``'s refusal, with the spelling of the current
    folder (which a file option must not suggest: ``--json .`` names no file)."""
    return _path(value, "use '.' for the current folder")


def _path(value: str, hint: str):
    from pathlib import Path

    if not value:
        raise argparse.ArgumentTypeError(f"an empty path ({hint})")
    return Path(value)


def bounded(kind, low: float, strict: bool):
    """``type=`` of a finite `kind` number > low (strict) or >= low (ints read exactly, "1e5"
    too)."""
    bound = ("an integer " if kind is int else "a finite number ") + (
        f"> {low:g}" if strict else f">= {low:g}")

    def parse(text: str):
        if kind is int:
            value = exact_int(text)
        else:
            try:
                value = kind(text)
            except ValueError:
                raise argparse.ArgumentTypeError(f"{text!r} is not a number") from None
        if not math.isfinite(value) or (value <= low if strict else value < low):
            raise argparse.ArgumentTypeError(f"must be {bound}, got {text}")
        return value
    return parse


def temperature_arg(text: str) -> float:
    """``type=`` of a loss temperature: ``bounded`` at MIN_TEMPERATURE, what the loss takes and
    the trainer's --tau reads (the bench tools' own "> 0" let 1e-7 or inf through, to a
    traceback from inside the loss: an audit of the tools)."""
    from hiertail_fast._validation import MIN_TEMPERATURE

    return bounded(float, MIN_TEMPERATURE, strict=False)(text)


# The largest count an int option takes: torch's sizes and seeds are int64.
MAX_COUNT = 2**63 - 1


def positive(kind: type):
    """``type=`` of a count or size: a positive int ("100000" or "1e5") or a positive finite
    float; anything else an argparse error (exit 2, one line), not a traceback from the run.
    Counts are read exactly (``decimal``, not through a float: "9007199254740993" stays that
    number, where a float made it ...992) and refused above int64 (``MAX_COUNT``; "1e999999"
    would otherwise build a million-digit int)."""
    def convert(text: str):
        if kind is int:
            return _count(text)
        try:
            number = float(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{text!r} is not a number") from None
        if not (number > 0 and math.isfinite(number)):
            raise argparse.ArgumentTypeError(f"{text!r} must be a positive number")
        return number
    return convert


def _count(text: str) -> int:
    number = exact_int(text)
    if number <= 0:
        raise argparse.ArgumentTypeError(f"{text!r} must be a positive integer")
    return number


def exact_int(text: str, largest: int = MAX_COUNT) -> int:
    """An integer option's value, read exactly: "100000", "1e5" or "2.0" (an integer however
    written; int() refused "1e5" as "not an integer"), never through a float (above 2**53 a
    float rounds); at most ``largest`` in size (int64's maximum by default; a seed's is
    2**64 - 1), checked on the exponent before int() expands the digits."""
    from decimal import Decimal, InvalidOperation

    try:
        number = Decimal(text)
    except InvalidOperation:
        raise argparse.ArgumentTypeError(f"{text!r} is not an integer") from None
    if not number.is_finite() or number != number.to_integral_value():
        raise argparse.ArgumentTypeError(f"{text!r} is not an integer")
    if number.adjusted() > len(str(largest)) or abs(int(number)) > largest:
        raise argparse.ArgumentTypeError(
            f"{text!r} is too large (at most {largest})" if number > 0 else
            f"{text!r} is too small (at least -{largest})")
    return int(number)
