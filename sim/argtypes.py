"""argparse value types shared by the subcommands: a bad value is argparse's one-line
usage error (sim/cli.py makes every usage error one line, exit 2)."""

from __future__ import annotations

import argparse
import math


def whole_number(text: str) -> int:
    """An argparse type: a whole number from 1 to 10**8 (workers, requests)."""
    try:
        value = int(text)
    except ValueError:
        value = 0
    if not 1 <= value <= 10**8:
        raise argparse.ArgumentTypeError(f"expected a whole number from 1 to 10^8, got '{text}'")
    return value


def positive_seconds(text: str) -> float:
    """An argparse type: a finite number of seconds above 0."""
    try:
        value = float(text)
    except ValueError:
        value = math.nan
    if not (math.isfinite(value) and value > 0):
        raise argparse.ArgumentTypeError(f"expected a finite number of seconds above 0, got '{text}'")
    return value
