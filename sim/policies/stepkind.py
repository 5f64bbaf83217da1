"""The one list of step kinds that plans, the engine's step log and steps.csv share.

There is no prefill phase or decode phase in a request (`sim/policies/batch.py`); a step
kind says what one step computes: prompts from the start (`PREFILL`), one token for every
running request (`DECODE`), a speculative round that verifies drafted tokens (`VERIFY`),
or decodes and prefill chunks together (`MIXED`). Plans that compute nothing say why:
`IDLE` (nothing to do), `PREEMPT` (victims leave, nobody runs) or `REJECT` (requests that
can never be served leave). The step log stores the first four as their integer codes,
and steps.csv writes their lower-case names.
"""

from __future__ import annotations

from enum import IntEnum


class StepKind(IntEnum):
    PREFILL = 0
    DECODE = 1
    VERIFY = 2
    MIXED = 3
    IDLE = 4      # the plans below compute nothing (never in a step log)
    PREEMPT = 5
    REJECT = 6

    @property
    def label(self) -> str:
        """The kind as steps.csv writes it."""
        return self.name.lower()


# step-log codes 0..3, in code order (hot loops bind members to names: an enum's class
# attribute costs a lookup through its metaclass)
LOGGED_KINDS = (StepKind.PREFILL, StepKind.DECODE, StepKind.VERIFY, StepKind.MIXED)
