"""argparse value types shared by the subcommands: a bad value is argparse's one-line
usage error (sim/cli/main.py makes every usage error one line, exit 2)."""

from __future__ import annotations

import argparse
import math

from sim.io.specload import SpecError, parse_cli_value


def parse_sets(pairs: list[str]) -> dict[str, object]:
    """`--set FIELD=VALUE` pairs as overrides: dotted field -> value as YAML reads it."""
    out = {}
    for p in pairs or []:
        if "=" not in p or not p.split("=", 1)[0].strip():
            raise SpecError("--set", p, "expected FIELD.PATH=VALUE (allowed: e.g. "
                            "workload.arrival.rate=3, cluster.groups.1.gpu=h100-sxm)")
        k, v = p.split("=", 1)
        out[k.strip()] = parse_cli_value(v, f"--set {k.strip()}")
    return out


def whole_number(text: str) -> int:
    """An argparse type: a whole number from 1 to 10**8 (workers, requests)."""
    try:
        value = int(text)
    except ValueError:
        value = 0
    if not 1 <= value <= 10**8:
        raise argparse.ArgumentTypeError(f"expected a whole number from 1 to 10^8, got '{text}'")
    return value


def workers_or_auto(text: str) -> int | str:
    """An argparse type: "auto" or a whole number from 1 to 10**8 (worker processes)."""
    if text.strip().lower() == "auto":
        return "auto"
    try:
        return whole_number(text)
    except argparse.ArgumentTypeError:
        raise argparse.ArgumentTypeError(
            f"expected auto or a whole number from 1 to 10^8, got '{text}'") from None


def positive_seconds(text: str) -> float:
    """An argparse type: a finite number of seconds above 0."""
    try:
        value = float(text)
    except ValueError:
        value = math.nan
    if not (math.isfinite(value) and value > 0):
        raise argparse.ArgumentTypeError(f"expected a finite number of seconds above 0, got '{text}'")
    return value
