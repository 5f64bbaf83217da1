"""llmsim: a discrete-event simulator of LLM inference serving."""

from __future__ import annotations

__version__ = "0.1.0"
