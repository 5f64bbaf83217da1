"""`llmsim calibrate` and `llmsim validate` (filled in by the calibration harness)."""

from __future__ import annotations


def add_parsers(sub) -> None:
    """Register the calibration subcommands on the main parser's subparsers."""
