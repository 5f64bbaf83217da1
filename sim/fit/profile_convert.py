"""Convert measured kernel data into gpu_profiles/<gpu>/ tables, and fit roofline efficiencies.

Two sources, picked by what SRC holds:

- a measurement folder (``ceilings.csv``, ``gemm.csv`` … as in /work/shared/data/h200):
  ``python -m sim.cli.maintain profile-convert /work/shared/data/h200 gpu_profiles/h200-sxm``
  writes gemm.csv, attn_prefill.csv, attn_decode.csv and elementwise.csv into DST;
- Vidur's per-operator profiles (``mlp_<gpu>_<model>.csv``, MIT):
  ``python -m sim.cli.maintain profile-convert /work/shared/data/peers gpu_profiles``
  writes gemm.csv and elementwise.csv (tensor-parallel 1 rows) into DST/<profile>/
  and copies the license next to them.

Either way it then prints the roofline efficiencies fitted to each gemm.csv written
(`fit_gemm_efficiency`), using the datasheet numbers of DST's profile.yaml when there
is one; those figures are what the profile.yaml `efficiency` blocks quote.
"""

from __future__ import annotations

import shutil
from pathlib import Path

import numpy as np
import pandas as pd

DECODE_IMPLS = {"contig": "contiguous", "paged_triton": "paged_reference",
                "paged_gather": "paged_gather"}
PEER_PROFILES = {"a100": "a100-80gb", "h100": "h100-sxm"}  # Vidur's device name -> ours
PEER_LICENSE = "LICENSE-vidur-MIT"
BF16 = 2  # bytes per element


def _median_by(df: pd.DataFrame, keys: list[str]) -> pd.DataFrame:
    """One row per key: duplicates (the same shape measured twice) become their median."""
    return df.groupby(keys, as_index=False)["ms"].median().sort_values(keys)


def convert_measured(src: Path, dst: Path) -> list[Path]:
    """The H200-style measurement folder -> the four profile tables in dst."""
    dst.mkdir(parents=True, exist_ok=True)
    gemm = _median_by(pd.read_csv(src / "gemm.csv"), ["K", "N", "M"])[["M", "K", "N", "ms"]]
    pre = pd.read_csv(src / "attn_prefill.csv")
    pre = pre[["impl", "batch", "seq", "hq", "hkv", "d", "ms", "peak_mib"]]
    pre = pre.sort_values(["impl", "hq", "hkv", "d", "batch", "seq"])
    dec = pd.read_csv(src / "attn_decode.csv")
    unknown = set(dec["impl"]) - set(DECODE_IMPLS)
    if unknown:
        raise ValueError(f"{src / 'attn_decode.csv'}: unknown impl {sorted(unknown)}")
    dec["impl"] = dec["impl"].map(DECODE_IMPLS)
    mixed = dec["ctx"].isna()
    dec.loc[mixed, "ctx"] = (dec.loc[mixed, "sum_ctx"] / dec.loc[mixed, "batch"]).round()
    dec["ctx"] = dec["ctx"].astype(int)
    cols = ["impl", "batch", "ctx", "sum_ctx", "max_ctx", "hq", "hkv", "d", "block", "ms"]
    dec = dec[cols].sort_values(["impl", "hq", "hkv", "d", "batch", "ctx", "sum_ctx"])
    elem = _median_by(pd.read_csv(src / "elementwise.csv"), ["op", "H", "M"])
    elem = elem[["op", "M", "H", "ms"]]
    out = []
    for name, df in [("gemm", gemm), ("attn_prefill", pre), ("attn_decode", dec),
                     ("elementwise", elem)]:
        p = dst / f"{name}.csv"
        df.to_csv(p, index=False)
        out.append(p)
    return out


def peer_tables(csv: Path) -> tuple[pd.DataFrame, pd.DataFrame]:
    """(gemm, elementwise) rows of one Vidur mlp_*.csv at tensor-parallel 1.

    Shapes follow F.linear(x[M, K], W[N, K]) with M = num_tokens: attn_pre_proj is
    the fused qkv (K = n_embd, N = (n_head + 2 n_kv_head) head_dim), attn_post_proj
    is o, mlp_up_proj is the fused gate+up of a gated MLP, mlp_down_proj is down.
    """
    df = pd.read_csv(csv)
    df = df[df["num_tensor_parallel_workers"] == 1]
    if not df["use_gated_mlp"].all():
        raise ValueError(f"{csv}: only gated MLPs are converted")
    emb, ffn = df["n_embd"].iloc[0], df["n_expanded_embd"].iloc[0]
    hd = emb // df["n_head"].iloc[0]
    qkv = (df["n_head"].iloc[0] + 2 * df["n_kv_head"].iloc[0]) * hd
    shapes = {"attn_pre_proj": (emb, qkv), "attn_post_proj": (emb, emb),
              "mlp_up_proj": (emb, 2 * ffn), "mlp_down_proj": (ffn, emb)}
    elems = {"input_layernorm": ("rmsnorm", emb), "add": ("residual_add", emb),
             "mlp_act": ("silu_mul", ffn)}
    gemm = [pd.DataFrame({"M": df["num_tokens"], "K": k, "N": n,
                          "ms": df[f"time_stats.{op}.median"]}) for op, (k, n) in shapes.items()]
    elem = [pd.DataFrame({"op": name, "M": df["num_tokens"], "H": h,
                          "ms": df[f"time_stats.{op}.median"]}) for op, (name, h) in elems.items()]
    return pd.concat(gemm), pd.concat(elem)


def convert_peers(src: Path, dst_root: Path) -> list[Path]:
    """Vidur mlp_<gpu>_<model>.csv files -> gemm.csv and elementwise.csv per profile."""
    by_profile: dict[str, list[tuple[pd.DataFrame, pd.DataFrame]]] = {}
    for csv in sorted(src.glob("mlp_*.csv")):
        gpu = csv.name.split("_")[1]
        if gpu in PEER_PROFILES:
            by_profile.setdefault(PEER_PROFILES[gpu], []).append(peer_tables(csv))
    out = []
    for profile, tables in by_profile.items():
        dst = dst_root / profile
        dst.mkdir(parents=True, exist_ok=True)
        gemm = _median_by(pd.concat([g for g, _ in tables]), ["K", "N", "M"])
        elem = _median_by(pd.concat([e for _, e in tables]), ["op", "H", "M"])
        gemm[["M", "K", "N", "ms"]].to_csv(dst / "gemm.csv", index=False)
        elem[["op", "M", "H", "ms"]].to_csv(dst / "elementwise.csv", index=False)
        shutil.copyfile(src / PEER_LICENSE, dst / PEER_LICENSE)
        out += [dst / "gemm.csv", dst / "elementwise.csv"]
    return out


def fit_gemm_efficiency(gemm: pd.DataFrame, tflops: float, tbs: float) -> dict[str, float]:
    """Fit t = floor + max(flops / (tflops·flops_eff), bytes / (tbs·bw_eff)) to GEMM rows.

    Least squares in log time by a coarse grid search (steps 0.05 and 5 µs) refined
    around its best point (steps 0.01 and 1 µs). Returns the efficiencies, the floor
    (ms) and the fit's median and 90th-percentile relative error over the rows.
    """
    m, k, n = (gemm[c].to_numpy(float) for c in "MKN")
    t = gemm["ms"].to_numpy(float)
    flop_ms = 2 * m * k * n / (tflops * 1e9)  # at 100 % of datasheet, in ms
    byte_ms = (m * k + k * n + m * n) * BF16 / (tbs * 1e9)

    def search(effs: np.ndarray, floors: np.ndarray) -> tuple[float, float, float]:
        best = (np.inf, 0.0, 0.0, 0.0)
        for fl in floors:
            pred = fl + np.maximum(flop_ms[None, None, :] / effs[:, None, None],
                                   byte_ms[None, None, :] / effs[None, :, None])
            loss = ((np.log(pred) - np.log(t)) ** 2).mean(axis=2)
            i, j = np.unravel_index(np.argmin(loss), loss.shape)
            if loss[i, j] < best[0]:
                best = (loss[i, j], effs[i], effs[j], fl)
        return best[1:]

    ef, eb, fl = search(np.arange(0.30, 1.0001, 0.05), np.arange(0.0, 0.0301, 0.005))
    fine = np.arange(-0.05, 0.0501, 0.01)
    effs = np.unique(np.clip(np.round(np.concatenate([ef + fine, eb + fine]), 2), 0.3, 1.0))
    ef, eb, fl = search(effs, np.unique(np.clip(np.round(fl + fine / 10, 3), 0.0, None)))
    rel = np.abs(fl + np.maximum(flop_ms / ef, byte_ms / eb) - t) / t
    return {"flops": round(float(ef), 2), "mem_bw": round(float(eb), 2),
            "gemm_floor_ms": round(float(fl), 3),
            "median_rel_err": round(float(np.median(rel)), 3),
            "p90_rel_err": round(float(np.quantile(rel, 0.9)), 3)}


def _grid_fit(predict, grid_a: np.ndarray, grid_b: np.ndarray, t: np.ndarray) -> tuple:
    """(a, b, median, 90th-percentile relative error) minimising the squared log error."""
    logt = np.log(t)
    _, a, b = min((((np.log(predict(a, b)) - logt) ** 2).mean(), a, b)
                  for a in grid_a for b in grid_b)
    rel = np.abs(predict(a, b) - t) / t
    return float(a), float(b), *(round(float(np.quantile(rel, q)), 3) for q in (0.5, 0.9))


def fit_attention_efficiency(prefill: pd.DataFrame, decode: pd.DataFrame, tflops: float,
                             tbs: float, gemm: dict[str, float]) -> dict:
    """Fit the attention terms of the roofline model to measured attention tables.

    flash: t = floor + flops / (tflops·eff); naive: t = floor + max(flops / GEMM rate,
    scores · bytes_per_score / GEMM bandwidth); each decode impl (uniform rows only):
    t = floor + KV bytes / (tbs·eff), where `paged_reference` (the Triton teaching kernel)
    reads K/V once per query head, not once per KV head. Returns the Efficiency fields
    and the errors.
    """
    out: dict = {"attn_decode_bw": {}, "attn_decode_floor_ms": {}, "errors": {}}
    floors = np.round(np.arange(0.0, 0.2001, 0.001), 3)
    effs = np.round(np.arange(0.05, 1.0001, 0.01), 2)
    f = prefill[prefill["impl"] == "flash"]
    flops = (4 * f["batch"] * f["hq"] * f["d"] * f["seq"] ** 2 / 2).to_numpy(float)
    e, fl, *err = _grid_fit(lambda e, fl: fl + flops / (tflops * 1e9 * e), effs, floors[:51],
                            f["ms"].to_numpy(float))
    out.update(attn_prefill_flops=e, attn_prefill_floor_ms=fl)
    out["errors"]["flash"] = err
    n = prefill[prefill["impl"] == "naive"]
    flop_ms = (4 * n["batch"] * n["hq"] * n["d"] * n["seq"] ** 2 / 2).to_numpy(float) / (
        tflops * 1e9 * gemm["flops"])
    score_ms = (n["batch"] * n["hq"] * n["seq"] ** 2).to_numpy(float) / (tbs * 1e9 * gemm["mem_bw"])
    bps, fl, *err = _grid_fit(lambda b, fl: fl + np.maximum(flop_ms, score_ms * b),
                              np.arange(10.0, 100.0), floors[:51], n["ms"].to_numpy(float))
    out.update(naive_bytes_per_score=bps)
    out["errors"]["naive"] = err
    uniform = decode[decode["ctx"] == decode["max_ctx"]]
    for impl, d in uniform.groupby("impl"):
        heads = d["hq"] if impl == "paged_reference" else d["hkv"]
        kv = ((d["sum_ctx"] * 2 * heads * d["d"] + d["batch"] * 2 * d["hq"] * d["d"]) * BF16)
        kv_ms = kv.to_numpy(float) / (tbs * 1e9)
        e, fl, *err = _grid_fit(lambda e, fl, x=kv_ms: fl + x / e, effs, floors,
                                d["ms"].to_numpy(float))
        out["attn_decode_bw"][impl], out["attn_decode_floor_ms"][impl] = e, fl
        out["errors"][impl] = err
    return out


def fit_efficiencies(profile_dir: Path) -> dict:
    """The roofline efficiencies fitted to a profile folder's tables as the simulator uses
    them (a flushed profile's write-back removed, sim/costmodel/l2flush.py): the GEMM terms, and
    the attention terms where the folder has attention tables."""
    from sim.costmodel.profiles import tables_as_used

    facts, tables = tables_as_used(str(profile_dir))
    tflops, tbs = facts.datasheet_tflops, facts.datasheet_mem_bw_tbs
    fit = {"gemm": fit_gemm_efficiency(pd.DataFrame(tables["gemm"]), tflops, tbs)}
    if "attn_prefill" in tables and "attn_decode" in tables:
        fit["attention"] = fit_attention_efficiency(
            pd.DataFrame(tables["attn_prefill"]), pd.DataFrame(tables["attn_decode"]),
            tflops, tbs, fit["gemm"])
    return fit


def fit_report(profile_dir: Path) -> list[str]:
    """The roofline fits of a converted profile folder, one line each (none without
    gemm.csv and profile.yaml)."""
    if not ((profile_dir / "gemm.csv").is_file() and (profile_dir / "profile.yaml").is_file()):
        return []
    return [f"{profile_dir.name}: {part} roofline fit {fit}" for part, fit in fit_efficiencies(profile_dir).items()]
