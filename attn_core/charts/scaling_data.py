"""A sweep's rows as a scaling chart's datasets, in display units: the series names, each point's value, IQR and
tooltip texts, and the theory curves and crossovers joined to the chart's lines (pandas only)."""
from __future__ import annotations

import json
import math

import numpy as np
import pandas as pd

from ..engine import analysis

METRICS = {
    # metric column → (display column, unit, divisor from the stored unit, what the chart calls it)
    "time_median_s": ("time_ms", "ms", 1e-3, "Time per call"),
    "peak_bytes": ("memory_mib", "MiB", 2.0**20, "Peak memory above inputs"),
}
# analysis' curve kinds; a roofline's legend names the device's figure (analysis.roofline)
CURVES = {"spec": "each mechanism's own cost (spec)", "n²": "O(n²)", "n": "O(n)",
          "roofline": "hardware limit (matmul, measured)"}


def with_series(df: pd.DataFrame) -> pd.DataFrame:
    """Adds `line` (the mechanism with any non-default parameters: one colour) and `series` (the line, plus the mask
    when the frame mixes causal and bidirectional rows: one drawn line)."""
    out = df.copy()
    where = df["positions"] if "positions" in df else ["none"] * len(df)
    by = df["implementation"] if "implementation" in df.columns else ["ours"] * len(df)
    sinks = df["sinks"] if "sinks" in df.columns else [False] * len(df)
    kept = df["keep_first"] if "keep_first" in df.columns else [0] * len(df)
    out["line"] = pd.Series([analysis.series_name(*row) for row in
                             zip(df["mechanism"], df["label"], df["params"], df["heads"], df["kv_heads"], where, by,
                                 sinks, kept)],
                            index=df.index, dtype=object)
    out["mask"] = df["causal"].map({True: "causal", False: "bidirectional"}).astype(object)
    out["series"] = out["line"] + (" · " + out["mask"] if df["causal"].nunique() > 1 else "")
    return out


def _ms(seconds: float) -> str:
    return f"{seconds * 1e3:.4g} ms"


def _mib(nbytes: float) -> str:
    return f"{nbytes / 2**20:,.3f} MiB ({int(nbytes):,} B)"


def points_frame(df: pd.DataFrame, metric: str, log: bool = True) -> pd.DataFrame:
    """One row per point with the plotted value in display units, the 25th and 75th percentiles of its time samples
    (iqr_low, iqr_high, time only) and the tooltip strings; `drawn` is False for points that cannot be placed (not
    measured, or ≤ 0 on a log axis) and `why` then says why; `hollow` marks disturbed points on the time chart."""
    column, _, divisor, _ = METRICS[metric]
    out = with_series(df)
    out[column] = out[metric] / divisor
    ok = out["status"].eq("ok") & out[metric].notna()
    out["drawn"] = ok & (out[column] > 0 if log else True)
    out["hollow"] = out["drawn"] & out["disturbed"].astype(bool) & (metric == "time_median_s")
    out["why"] = ""
    out.loc[~ok, "why"] = out["status"].astype(str) + ": " + out["reason"].fillna("").astype(str)
    out.loc[out["status"].eq("ok") & ~ok, "why"] = [_unmeasured(metric, m) for m in
                                                   out.loc[out["status"].eq("ok") & ~ok, "memory_method"]]
    out.loc[ok & ~out["drawn"], "why"] = "measured 0, which a log axis cannot show"
    quartiles = [np.percentile(t, [25, 75]) / 1e-3 if len(t) else (math.nan, math.nan) for t in out["time_samples"]]
    out["iqr_low"], out["iqr_high"] = [q[0] for q in quartiles], [q[1] for q in quartiles]
    out["time"] = [_ms(t) + f" median, IQR {lo:.4g}–{hi:.4g} ms (25th–75th percentile), {int(r)} repeats"
                   if pd.notna(t) and pd.notna(lo) else
                   _ms(t) + f" median, IQR {_ms(i)}, {int(r)} repeats" if pd.notna(t) else "not measured"
                   for t, i, r, lo, hi in zip(out["time_median_s"], out["time_iqr_s"], out["repeats"].fillna(0),
                                              out["iqr_low"], out["iqr_high"])]
    out["memory"] = [_mib(b) if pd.notna(b) else "not measured" for b in out["peak_bytes"]]
    out["predicted"] = [_mib(b) if pd.notna(b) else "—" for b in out["predicted_bytes"]]
    out["throughput"] = [_throughput(g, p) for g, p in zip(out["gflops"], out["pct_of_device"])]
    out["contention"] = [_contention(d, c, r) for d, c, r in zip(out["disturbed"], out["foreign_cpu"],
                                                                 out["retaken"])]
    return out


def _unmeasured(metric: str, method: str) -> str:
    """Why an ok point has no value: its memory_method holds the reason when memory was not measured."""
    if metric == "peak_bytes":
        return method if method.startswith("not measured") else "memory not measured"
    return "not timed"


def _throughput(gflops: float, pct: float) -> str:
    if pd.isna(gflops):
        return "—"
    text = f"{gflops:.3g} GFLOP/s on executed FLOPs ({pct:.3g}% of the device's matmul)"
    return text + f"; {analysis.ABOVE_DEVICE}" if pct > 100 else text


def _contention(disturbed: bool, cores: float, retaken: int) -> str:
    """'measured while other programs used 0.9 cores; re-measured 3 samples', or what was seen of a clean point."""
    used = f"used {cores:.1f} cores" if pd.notna(cores) else "were running"
    again = f"; re-measured {int(retaken)} {'sample' if retaken == 1 else 'samples'}" if retaken else ""
    if disturbed:
        return f"measured while other programs {used}{again} (left out of the fits)"
    if retaken:
        return f"clean after {int(retaken)} disturbed {'sample was' if retaken == 1 else 'samples were'} re-measured"
    return f"clean: other programs used {cores:.1f} cores" if pd.notna(cores) else "not recorded"


def chart_frames(df: pd.DataFrame, metric: str, *, theory: pd.DataFrame | None = None,
                 crossovers: pd.DataFrame | None = None, log: bool = True) -> dict[str, pd.DataFrame]:
    """The datasets a scaling chart draws, in display units and by name: lines (the clean drawn points, which the
    solid lines join: a disturbed point joined to them drew V shapes and spikes), bars (every drawn time point, for
    the IQR bars), points (drawn filled), disturbed (drawn hollow, alone), missing (not drawn: crosses on the bottom
    edge), theory (dashed curves) and crossings (n* marks). Empty ones are left out, points excepted."""
    column, _, divisor, _ = METRICS[metric]
    keep = ["mechanism", "label", "params", "causal", "n", column, "line", "series", "mask", "status", "drawn", "why",
            "time", "memory", "predicted", "memory_method", "throughput", "contention"]
    pts = points_frame(df, metric, log)  # only what the chart draws or shows goes into the spec: it stays small
    drawn = pts[pts["drawn"]]
    spread = ["iqr_low", "iqr_high"] if metric == "time_median_s" else []
    frames = {"lines": drawn.loc[~drawn["hollow"], ["n", column, "line", "series", "mask"]],
              "bars": drawn[["n", column, *spread, "line", "series", "mask"]] if spread else drawn.iloc[:0],
              "points": drawn.loc[~drawn["hollow"], keep],
              "disturbed": drawn.loc[drawn["hollow"], keep].assign(busy="busy"),  # the legend's one entry
              "missing": pts.loc[~pts["drawn"], keep]}
    pts = pts[keep]
    if theory is not None and len(theory):
        frames["theory"] = _theory_frames(theory, pts, column, divisor)
    if crossovers is not None and len(crossovers):
        frames["crossings"] = _crossover_frame(crossovers, pts, metric)
    return {name: frame for name, frame in frames.items() if name == "points" or len(frame)}


def records(frames: dict[str, pd.DataFrame]) -> dict[str, list[dict]]:
    """The frames as Vega-Lite datasets: lists of JSON-ready rows (NaN becomes null)."""
    return {name: json.loads(frame.to_json(orient="records", double_precision=15)) for name, frame in frames.items()}


def _attach(frame: pd.DataFrame, pts: pd.DataFrame) -> pd.DataFrame:
    """Analysis rows joined to the chart's line and series names (by mechanism, params and mask where present, and
    by the analysis' series name, which is the chart's line: it tells implementations of one mechanism apart)."""
    keys = [k for k in ("mechanism", "params", "causal") if k in frame.columns]
    if "series" in frame.columns:
        frame, keys = frame.rename(columns={"series": "line"}), keys + ["line"]
    names = pts.drop_duplicates(keys)[list(dict.fromkeys(keys + ["line", "series", "label"]))]
    return frame.drop(columns=[c for c in ("label",) if c in frame.columns]).merge(names, on=keys)


def _theory_frames(theory, pts, column, divisor):
    curves = _attach(theory[[c for c in ("mechanism", "params", "causal", "curve", "kind", "n", "value", "series")
                             if c in theory.columns]], pts)
    curves[column] = curves["value"] / divisor
    curves = curves[curves[column] > 0]
    if "kind" not in curves:
        curves["kind"] = "spec"
    curves["kind_label"] = curves["kind"].map(CURVES).fillna(curves["kind"])
    roof = curves["kind"] == "roofline"
    curves.loc[roof, "kind_label"] = curves.loc[roof, "curve"]  # names the device's GFLOP/s
    return curves


def _crossover_frame(crossovers, pts, metric):
    found = _attach(crossovers.loc[crossovers["n_star"].notna(), [c for c in ("mechanism", "params", "causal",
                                                                                "baseline", "n_star", "note",
                                                                                "series")
                                                                      if c in crossovers.columns]], pts)
    column = METRICS[metric][0]
    labels = pts.drop_duplicates("mechanism").set_index("mechanism")["label"]
    found["n"] = found["n_star"]
    found[column] = [_value_at(pts[pts["drawn"] & (pts["series"] == s)], column, n)
                     for s, n in zip(found["series"], found["n_star"])]
    found["line_text"] = [f"{s} overtakes {labels.get(b, b)} at n* ≈ {analysis.rounded_n(n):,}"
                          for s, b, n in zip(found["series"], found["baseline"], found["n_star"])]
    return found.sort_values("n_star").reset_index(drop=True)


def _value_at(series_pts: pd.DataFrame, column: str, n: float) -> float:
    """The series' value at n, interpolated in log-log space between its measured points (where n* falls)."""
    s = series_pts.sort_values("n")
    if s.empty:
        return math.nan
    return float(np.exp(np.interp(np.log(n), np.log(s["n"].astype(float)), np.log(s[column].astype(float)))))
