"""The command lines' argument parser: argparse with a one-line error.

argparse prints the whole usage before an error; for the trainer (~80 options) that is ~60
lines with the message last. Here an error is one line, ``PROG: error: MESSAGE (PROG --help
lists the options)``, exit code 2 as argparse's; ``--help`` is unchanged."""
from __future__ import annotations

import argparse
import math
import re
from collections.abc import Sequence


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


def bounded(kind, low: float, strict: bool, largest: int | None = None):
    """``type=`` of a finite `kind` number > low (strict) or >= low (ints read exactly, "1e5"
    too, at most ``largest``: ``exact_int``'s default, int64, when None)."""
    bound = ("an integer " if kind is int else "a finite number ") + (
        f"> {low:g}" if strict else f">= {low:g}")

    def parse(text: str):
        if kind is int:
            value = exact_int(text) if largest is None else exact_int(text, largest)
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
    """``type=`` of a count or size: an int > 0 ("100000" or "1e5", read exactly: ``exact_int``,
    refused above int64, ``MAX_COUNT``) or a finite float > 0; anything else an argparse error
    (exit 2, one line), not a traceback from the run. One family with ``non_negative`` and
    ``bounded``: the bench tools' positive type and the command lines' wrote two wordings."""
    return bounded(kind, 0, strict=True)


def non_negative(kind: type):
    """``type=`` of an int or a finite float >= 0 (``bounded``)."""
    return bounded(kind, 0, strict=False)


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


# a run's seed: _validation.check_seed's range ([0, SEED_MAX]: torch.manual_seed takes
# [-2**63, 2**64), the natural split's numpy generator only >= 0)
SEED_MIN = 0
MAX_SEED_COUNT = 100_000


def seed_arg(text: str) -> int:
    """argparse type of --seed-base / --data-seed: an integer in [0, SEED_MAX], "1e3" too."""
    from hiertail_fast._validation import SEED_MAX  # (imported when used: torch-free here)

    return bounded(int, SEED_MIN, strict=False, largest=SEED_MAX)(text)


def threads_arg(text: str) -> int:
    """argparse type of --threads: an integer in [1, the CPUs available] (check_threads)."""
    from hiertail_fast._validation import check_threads

    value = positive(int)(text)
    try:
        return check_threads(value, "threads")
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc).replace("threads must", "must", 1)) from None


def _is_count(values: Sequence[str]) -> bool:
    """Whether --seeds ``values`` is a count (one value, no comma) rather than a list."""
    return len(values) == 1 and "," not in values[0]


def parse_seeds(values: Sequence[str], base: int = 123) -> list[int]:
    """``["3"]`` -> 3 seeds from ``base``; ``["1,2,5"]`` or ``["1", "2", "5"]`` -> that list.

    Seeds must be distinct (the same seed twice would count one run twice in the mean ± std)
    and within what ``torch.manual_seed`` accepts."""
    from hiertail_fast._validation import SEED_MAX

    items = [v for text in values for v in text.split(",") if v.strip()]
    try:
        nums = [int(v) for v in items]
    except ValueError as exc:
        raise ValueError(f"--seeds takes integers (a count or a list), got {values}") from exc
    if not nums:
        raise ValueError("--seeds is empty")
    if _is_count(values):
        if not SEED_MIN <= base <= SEED_MAX:
            raise ValueError(f"--seed-base must lie in [{SEED_MIN}, {SEED_MAX}], got {base}")
        if not 1 <= nums[0] <= MAX_SEED_COUNT:
            raise ValueError(f"--seeds count must lie in [1, {MAX_SEED_COUNT}], got {nums[0]}")
        nums = list(range(base, base + nums[0]))
    for seed in (nums[0], nums[-1]) if _is_count(values) else nums:
        if not SEED_MIN <= seed <= SEED_MAX:
            raise ValueError(f"--seeds: seed {seed} is out of range [{SEED_MIN}, {SEED_MAX}]")
    if len(set(nums)) < len(nums):
        repeated = sorted({s for s in nums if nums.count(s) > 1})
        raise ValueError(f"--seeds lists {', '.join(map(str, repeated))} more than once "
                         "(each seed is one run of the mean ± std)")
    return nums


# A --seeds count above the protocol's 10 seeds is said on stderr before anything trains:
# `--seeds 125` reads as "seed 125" but is 125 seeds (123..247), hours of runs unasked for.
NOTED_SEED_COUNT = 10


def seed_count_notice(values: Sequence[str] | None, seeds: Sequence[int]) -> str | None:
    """The stderr line for a --seeds ``values`` that was read as a count above
    ``NOTED_SEED_COUNT`` (``seeds`` as parse_seeds returned them), naming how to give one
    seed; None for a list or a small count."""
    if not values or not _is_count(values) or len(seeds) <= NOTED_SEED_COUNT:
        return None
    count = values[0].strip()
    return (f"note: --seeds {count} is a count: {len(seeds)} seeds, {seeds[0]}..{seeds[-1]} "
            f"(the seed {count} alone: --seeds {count}, or --seed-base {count} --seeds 1)")


def device_error(text: str) -> str | None:
    """Why `text` is not a usable --device, or None (``check_device``'s refusal, as the
    command lines print it: one line, exit 2, before anything loads)."""
    from hiertail_fast._validation import check_device

    try:
        check_device(text, "--device")
    except ValueError as exc:
        return str(exc)
    return None
