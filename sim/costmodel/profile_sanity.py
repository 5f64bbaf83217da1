"""Profile sanity at load: no measured kernel faster than its GPU can run.

Every row of a kernel table is checked against the GPU's ceilings: its FLOP rate
against the dense bf16 peak (the measured GEMM ceiling `peak_tflops` where the profile
has one, else the datasheet), its HBM traffic against the datasheet bandwidth. A row
above a ceiling is raised to the ceiling's time (capped) and counted, so
`llmsim gpus` can say how many points of a table were impossible as measured (a
timing artefact, or a table measured on another part).

The work of a row is what the kernel must do at the least: GEMM 2·M·K·N FLOPs and
its operands' bytes; causal attention 2·b·hq·d·seq² FLOPs; decode reads each KV head
once (2·ctx·hkv·d elements per sequence); elementwise ops their ELEMENTWISE_BYTES.
"""

from __future__ import annotations

from collections.abc import Callable

BF16 = 2  # bytes per element


def _work(table: str, elementwise_bytes: dict[str, int]) -> Callable[[dict], tuple[float, float]]:
    """(FLOPs, bytes) of a row of `table`, the least any kernel must do."""
    if table == "gemm":
        return lambda r: (2 * r["M"] * r["K"] * r["N"],
                          (r["M"] * r["K"] + r["K"] * r["N"] + r["M"] * r["N"]) * BF16)
    if table == "attn_prefill":
        return lambda r: (2 * r["batch"] * r["hq"] * r["d"] * r["seq"] ** 2,
                          3 * r["batch"] * r["seq"] * r["hkv"] * r["d"] * BF16)
    if table == "attn_decode":
        return lambda r: (4 * r["sum_ctx"] * r["hq"] * r["d"],
                          (r["sum_ctx"] * 2 * r["hkv"] + r["batch"] * 2 * r["hq"]) * r["d"] * BF16)
    return lambda r: (0.0, r["M"] * r["H"] * elementwise_bytes[r["op"]])


def cap_tables(tables: dict[str, list[dict]], tflops: float, tbs: float,
               elementwise_bytes: dict[str, int]) -> dict[str, int]:
    """Raise every row faster than `tflops` (dense, TFLOP/s) or `tbs` (HBM, TB/s) to the
    ceiling's time, in place; returns the number of rows capped per table."""
    flop_per_ms, byte_per_ms = tflops * 1e9, tbs * 1e9
    capped = {}
    for table, rows in tables.items():
        work, n = _work(table, elementwise_bytes), 0
        for r in rows:
            flops, nbytes = work(r)
            least = max(flops / flop_per_ms, nbytes / byte_per_ms)
            if r["ms"] < least:
                r["ms"], n = least, n + 1
        capped[table] = n
    return capped
