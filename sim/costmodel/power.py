"""A GPU's power draw and the energy of a run: the `power:` block of a profile.yaml.

One GPU draws `idle_w` when no kernel runs (the idle-with-a-CUDA-context level of a
server whose model stays loaded) and `board_w` (the datasheet's board power, TDP) while
its kernels run, so over an interval of length T with kernel seconds K

    E = idle_w x T + (board_w - idle_w) x K,    mean power = idle_w + (board_w - idle_w) x K / T.

The utilisation is the simulation's kernel-time fraction K / T: the published
measurements found here give no separate power for memory-bound (decode) and
compute-bound (prefill) kernels on these GPUs, so both draw board power while they run.
That makes the figure an upper bound at high load: measured LLM serving at batch 128
draws about 600 W on an H100 SXM and 593 W on an H200 SXM, 85 % of their 700 W board
power (sources in each profile.yaml). The model never sees a scenario: it takes a
profile's `PowerSpec` and kernel times.
"""

from __future__ import annotations

from dataclasses import dataclass, field

_WATTS = {"gt": 0}
J_PER_KWH = 3.6e6


@dataclass(frozen=True)
class PowerSpec:
    """profile.yaml `power:`: one GPU's power levels, each with where it comes from."""

    board_w: float = field(metadata=_WATTS)  # datasheet board power (TDP)
    idle_w: float = field(metadata={"ge": 0})  # no kernel running, model loaded
    board_source: str = ""
    idle_source: str = ""
    idle_basis: str = "assumed"  # measured / derived / assumed
    shape: str = "linear in the kernel-time fraction between idle_w and board_w"

    def check(self) -> tuple[str, str] | None:
        if self.idle_w >= self.board_w:
            return "idle_w", f"{self.idle_w} is not below board_w {self.board_w} (allowed: < board_w)"
        if self.idle_basis not in ("measured", "derived", "assumed"):
            return "idle_basis", f"{self.idle_basis!r} (allowed: measured, derived, assumed)"
        return None

    def watts(self, kernel_fraction: float) -> float:
        """Mean power of one GPU whose kernels run `kernel_fraction` of the time (0..1)."""
        u = min(max(kernel_fraction, 0.0), 1.0)
        return self.idle_w + (self.board_w - self.idle_w) * u

    def energy_j(self, duration_s: float, kernel_s: float, gpus: int = 1) -> float:
        """Joules drawn by `gpus` GPUs over `duration_s` with `kernel_s` kernel seconds
        each (kernel time capped at the duration)."""
        k = min(max(kernel_s, 0.0), duration_s)
        return gpus * (self.idle_w * duration_s + (self.board_w - self.idle_w) * k)

    def sources(self) -> list[str]:
        return [f"board power {self.board_w:g} W: {self.board_source}",
                f"idle power {self.idle_w:g} W ({self.idle_basis}): {self.idle_source}",
                f"shape: {self.shape}"]


def replica_energy(power: PowerSpec | None, gpus: int, duration_s: float,
                   kernel_s: float) -> dict | None:
    """One replica (all GPUs of its tensor/pipeline group) over the run; None without a
    power model."""
    if power is None:
        return None
    e = power.energy_j(duration_s, kernel_s, gpus)
    return {"gpus": gpus, "energy_j": e, "average_power_w": e / duration_s if duration_s else 0.0,
            "kernel_fraction": min(1.0, kernel_s / duration_s) if duration_s else 0.0}


def energy_figures(replicas: list[dict | None], duration_s: float, finished: int,
                   output_tokens: int, sources: list[str]) -> dict:
    """The summary's `energy`: totals over the replicas' figures (replica_energy)."""
    if not replicas or any(r is None for r in replicas):
        return {"available": False,
                "note": "no power model (a `power:` block in profile.yaml) for a GPU of this run"}
    total = sum(r["energy_j"] for r in replicas)
    watts = total / duration_s if duration_s else 0.0
    return {
        "available": True,
        "energy_j": total,
        "joules_per_request": total / finished if finished else None,
        "kwh_per_m_output_tokens": total / output_tokens * 1e6 / J_PER_KWH if output_tokens else None,
        "average_power_w": watts,
        "mwh_per_day": watts * 86400 / J_PER_KWH / 1000,
        "basis": "power model: idle + (board - idle) x kernel-time fraction, per GPU "
                 "(sim/costmodel/power.py); an upper bound at high load",
        "sources": sources,
    }
