"""The README's "Energy and cost" block: the quickstart's energy and dollars from its
summary (sim/engine/energy.py), with the power model's sources."""

from __future__ import annotations

from benchmarks.readme.readme_format import table
from benchmarks.readme.readme_runs import Runs
from sim.report.text import num as sig3


def energy_quickstart(runs: Runs) -> str:
    s = runs.summary("quickstart")
    e, c = s["energy"], s["cost"]
    rows = [
        ["energy per request", f"{sig3(e['joules_per_request'])} J"],
        ["energy per million output tokens", f"{sig3(e['kwh_per_m_output_tokens'])} kWh"],
        ["average power (1 GPU, kernels {:.0%} of the time)".format(s["gpu_kernel_fraction"]),
         f"{sig3(e['average_power_w'])} W"],
        ["at this rate for a day", f"{sig3(e['mwh_per_day'] * 1000)} kWh"],
        ["dollars per million output tokens (on demand)",
         f"${sig3(c['usd_per_m_output_tokens']['on_demand'])}"],
    ]
    return table(["quickstart (Llama-3-8B / H200, 2.5 req/s)", "figure"], rows)
