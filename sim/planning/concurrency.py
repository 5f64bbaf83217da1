from __future__ import annotations

def is_concurrency_plan(file) -> bool:
    return False
