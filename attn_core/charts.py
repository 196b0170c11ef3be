"""Scaling charts of a sweep: measured points, dashed theory curves, crossovers and skipped points (pure Altair)."""
from __future__ import annotations

import math

import altair as alt
import numpy as np
import pandas as pd

from . import analysis
from .mechanisms import MECHANISMS

METRICS = {
    # metric column → (display column, unit, divisor from the stored unit, what the chart calls it)
    "time_median_s": ("time_ms", "ms", 1e-3, "Time per call"),
    "peak_bytes": ("memory_mib", "MiB", 2.0**20, "Peak memory above inputs"),
}
CURVES = {"spec": "each mechanism's own cost (spec)", "n²": "O(n²)", "n": "O(n)"}  # analysis' curve kinds
# One colour per mechanism in every chart (Okabe–Ito plus brown); a second setting of one mechanism takes a spare.
COLOURS = ["#D55E00", "#0072B2", "#009E73", "#CC79A7", "#56B4E9", "#8C564B", "#E69F00", "#000000"]
SPARE_COLOURS = ["#7F7F7F", "#BCBD22", "#17BECF", "#9467BD", "#E377C2", "#AEC7E8"]
DASHES = {"spec": [8, 4], "n²": [2, 3], "n": [12, 4, 2, 4]}
# How the engine times a call on each device (env.device_timer), as the axis says it.
TIME_METHODS = {"cuda": "median of CUDA-event timings", "mps": "median wall-clock, synchronized",
                "cpu": "median wall-clock"}
FONT = "DejaVu Sans, Liberation Sans, Arial, sans-serif"
THEORY_HOW = ["Dashed: theory c·f(n), c fitted to the", "measured points (least squares, log space)"]


def with_series(df: pd.DataFrame) -> pd.DataFrame:
    """Adds `line` (the mechanism with any non-default parameters: one colour) and `series` (the line, plus the mask
    when the frame mixes causal and bidirectional rows: one drawn line)."""
    out = df.copy()
    out["line"] = pd.Series([analysis.series_name(m, lab, p) for m, lab, p in
                             zip(df["mechanism"], df["label"], df["params"])], index=df.index, dtype=object)
    out["mask"] = df["causal"].map({True: "causal", False: "bidirectional"}).astype(object)
    out["series"] = out["line"] + (" · " + out["mask"] if df["causal"].nunique() > 1 else "")
    return out


def colour_scale(pts: pd.DataFrame) -> alt.Scale:
    """Each line's colour: its mechanism's catalogue colour, or a spare one for a second setting of a mechanism."""
    order = list(MECHANISMS)
    lines = pts.drop_duplicates("line")[["mechanism", "line"]]
    lines = lines.assign(rank=[order.index(m) if m in order else len(order) for m in lines["mechanism"]])
    domain, colours, used, spare = [], [], set(), iter(SPARE_COLOURS * 4)
    for mechanism, line, rank in lines.sort_values("rank", kind="stable").itertuples(index=False):
        first = mechanism in order and mechanism not in used
        used.add(mechanism)
        domain.append(line)
        colours.append(COLOURS[rank % len(COLOURS)] if first else next(spare))
    return alt.Scale(domain=domain, range=colours)


def _ms(seconds: float) -> str:
    return f"{seconds * 1e3:.4g} ms"


def _mib(nbytes: float) -> str:
    return f"{nbytes / 2**20:,.3f} MiB ({int(nbytes):,} B)"


def points_frame(df: pd.DataFrame, metric: str, log: bool = True) -> pd.DataFrame:
    """One row per point with the plotted value in display units and the tooltip strings; `drawn` is False for points
    that cannot be placed (not measured, or ≤ 0 on a log axis) and `why` then says why."""
    column, _, divisor, _ = METRICS[metric]
    out = with_series(df)
    out[column] = out[metric] / divisor
    ok = out["status"].eq("ok") & out[metric].notna()
    out["drawn"] = ok & (out[column] > 0 if log else True)
    out["why"] = ""
    out.loc[~ok, "why"] = out["status"].astype(str) + ": " + out["reason"].fillna("").astype(str)
    out.loc[ok & ~out["drawn"], "why"] = "measured 0, which a log axis cannot show"
    out["time"] = [_ms(t) + f" median, IQR {_ms(i)}, {int(r)} repeats" if pd.notna(t) else "not measured"
                   for t, i, r in zip(out["time_median_s"], out["time_iqr_s"], out["repeats"].fillna(0))]
    out["memory"] = [_mib(b) if pd.notna(b) else "not measured" for b in out["peak_bytes"]]
    out["predicted"] = [_mib(b) if pd.notna(b) else "—" for b in out["predicted_bytes"]]
    out["throughput"] = [f"{g:.3g} GFLOP/s ({p:.3g}% of the device's matmul)" if pd.notna(g) else "—"
                         for g, p in zip(out["gflops"], out["pct_of_device"])]
    return out


TOOLTIP = [
    alt.Tooltip("series:N", title="Mechanism"),
    alt.Tooltip("n:Q", title="Sequence length n", format=","),
    alt.Tooltip("time:N", title="Time per call"),
    alt.Tooltip("memory:N", title="Peak memory above inputs"),
    alt.Tooltip("predicted:N", title="Predicted memory (spec)"),
    alt.Tooltip("memory_method:N", title="Memory measured by"),
    alt.Tooltip("throughput:N", title="Achieved"),
    alt.Tooltip("params:N", title="Parameters"),
    alt.Tooltip("status:N", title="Status"),
]


def analyse(df: pd.DataFrame, metric: str, baseline: str = "softmax") -> tuple[pd.DataFrame, pd.DataFrame]:
    """analysis.theory_curves and analysis.crossovers, computed separately for causal and bidirectional rows."""
    theory, crossings = [], []
    for causal, part in df.groupby("causal", sort=False):
        theory.append(analysis.theory_curves(part, metric).assign(causal=causal))
        crossings.append(analysis.crossovers(part, metric, baseline).assign(causal=causal))
    if not theory:
        return analysis.theory_curves(df, metric), analysis.crossovers(df, metric, baseline)
    return pd.concat(theory, ignore_index=True), pd.concat(crossings, ignore_index=True)


def figure(df: pd.DataFrame, metric: str = "time_median_s", *, log: bool = True, baseline: str = "softmax",
           curves: tuple[str, ...] = ("spec",), talk: bool = False, title: str | None = None,
           subtitle: str | None = None) -> alt.LayerChart:
    """The dashboard's chart of one metric: measured points, the chosen theory curves (kinds of CURVES) and n*."""
    theory, crossings = analyse(df, metric, baseline)
    return scaling_chart(df, metric, theory=theory[theory["kind"].isin(curves)], crossovers=crossings, log=log,
                         talk=talk, title=title, subtitle=subtitle)


def scaling_chart(df: pd.DataFrame, metric: str = "time_median_s", *, theory: pd.DataFrame | None = None,
                  crossovers: pd.DataFrame | None = None, log: bool = True, title: str | None = None,
                  subtitle: str | list[str] | None = None, talk: bool = False, width: int | None = None,
                  height: int | None = None) -> alt.LayerChart:
    """Metric vs n for every series of a results frame (the contract's columns).

    `theory`: rows of analysis.theory_curves (mechanism, curve, n, value in the metric's unit, kind), drawn dashed.
    `crossovers`: rows of analysis.crossovers (mechanism, baseline, n_star, note), drawn as a ring at the crossing.
    Points that were skipped or failed sit on the bottom edge as crosses whose tooltip gives the reason.
    """
    column, unit, divisor, name = METRICS[metric]
    pts = points_frame(df, metric, log)
    cscale = colour_scale(pts)
    colour = alt.Color("line:N", scale=cscale, title="Mechanism (measured, solid)")
    x = alt.X("n:Q", title="Sequence length n (tokens)" + (", log₂ scale" if log else ""),
              scale=alt.Scale(type="log", base=2) if log else alt.Scale(zero=False), axis=alt.Axis(format=","))
    y = alt.Y(f"{column}:Q", title=_y_title(df, metric, unit, name, log),
              scale=alt.Scale(type="log", nice=False, padding=8) if log else alt.Scale(zero=True))
    shape = alt.Shape("mask:N", title="Mask") if pts["mask"].nunique() > 1 else alt.value("circle")
    keep = ["mechanism", "label", "params", "causal", "n", column, "line", "series", "mask", "status", "drawn", "why",
            "time", "memory", "predicted", "memory_method", "throughput"]
    pts = pts[keep]  # only what the chart draws or shows: the spec stays small and quick to send
    base = alt.Chart(pts[pts["drawn"]]).encode(x=x, y=y, color=colour)
    layers = [base.mark_line(strokeWidth=4 if talk else 2).encode(detail="series:N"),
              base.mark_point(filled=True, size=160 if talk else 60, opacity=1).encode(shape=shape, tooltip=TOOLTIP)]
    missing = pts[~pts["drawn"]]
    if len(missing):
        layers.append(alt.Chart(missing).mark_point(shape="cross", filled=True, size=220 if talk else 110).encode(
            x=x, y=alt.value({"expr": "height - 6"}), color=colour,
            tooltip=[alt.Tooltip("series:N", title="Mechanism"),
                     alt.Tooltip("n:Q", title="Sequence length n", format=","),
                     alt.Tooltip("why:N", title="Not drawn"), alt.Tooltip("params:N", title="Parameters")]))
    if theory is not None and len(theory):
        layers.extend(_theory_layers(theory, pts, x, y, cscale, column, divisor, talk))
    if crossovers is not None and len(crossovers):
        layers.extend(_crossover_layers(crossovers, pts, x, y, cscale, metric, talk))
    # One constructor call: each .properties() or .configure_*() would deep-copy every layer and its data.
    return alt.LayerChart(layer=layers, width=width or (900 if talk else 640), height=height or (500 if talk else 380),
                          title=alt.TitleParams(title or default_title(df, metric), anchor="start",
                                                subtitle=subtitle if subtitle is not None else default_subtitle(df)),
                          config=house_config(talk))


def _attach(frame: pd.DataFrame, pts: pd.DataFrame) -> pd.DataFrame:
    """Analysis rows joined to the chart's line and series names (by mechanism, params and mask where present)."""
    keys = [k for k in ("mechanism", "params", "causal") if k in frame.columns]
    names = pts.drop_duplicates(keys)[keys + ["line", "series", "label"]]
    return frame.drop(columns=[c for c in ("series", "label") if c in frame.columns]).merge(names, on=keys)


def _theory_layers(theory, pts, x, y, cscale, column, divisor, talk):
    curves = _attach(theory[[c for c in ("mechanism", "params", "causal", "curve", "kind", "n", "value")
                             if c in theory.columns]], pts)
    curves[column] = curves["value"] / divisor
    curves = curves[curves[column] > 0]
    if "kind" not in curves:
        curves["kind"] = "spec"
    curves["kind_label"] = curves["kind"].map(CURVES).fillna(curves["kind"])
    kinds = [k for k in DASHES if k in set(curves["kind"])]
    dash = alt.StrokeDash("kind_label:N", title=THEORY_HOW,
                          scale=alt.Scale(domain=[CURVES[k] for k in kinds], range=[DASHES[k] for k in kinds]))
    line = alt.Chart(curves).mark_line(strokeWidth=3 if talk else 1.5, opacity=0.85).encode(
        x=x, y=y, color=alt.Color("line:N", scale=cscale), strokeDash=dash, detail="series:N",
        tooltip=[alt.Tooltip("series:N", title="Mechanism"), alt.Tooltip("curve:N", title="Theory curve"),
                 alt.Tooltip("n:Q", title="n", format=","), alt.Tooltip(f"{column}:Q", title="Value", format=".4g")])
    ends = curves[curves["kind"] == "spec"].sort_values("n").groupby("series", sort=False).tail(1)
    ends = ends.assign(text=ends["curve"].str.replace(" fit", ""))
    label = alt.Chart(ends).mark_text(align="right", baseline="bottom", dx=-2, dy=-4,
                                      fontSize=16 if talk else 10).encode(
        x=x, y=y, text="text:N", color=alt.Color("line:N", scale=cscale))
    return [line, label]


def _crossover_layers(crossovers, pts, x, y, cscale, metric, talk):
    found = _attach(crossovers.loc[crossovers["n_star"].notna(), [c for c in ("mechanism", "params", "causal",
                                                                                "baseline", "n_star", "note")
                                                                      if c in crossovers.columns]], pts)
    if found.empty:
        return []
    column = METRICS[metric][0]
    labels = pts.drop_duplicates("mechanism").set_index("mechanism")["label"]
    found["n"] = found["n_star"]
    found[column] = [_value_at(pts[pts["drawn"] & (pts["series"] == s)], column, n)
                     for s, n in zip(found["series"], found["n_star"])]
    found["text"] = [f"n* ≈ {n:,.0f}" for n in found["n_star"]]
    found["line_text"] = [f"{s} overtakes {labels.get(b, b)} at n* ≈ {n:,.0f}"
                          for s, b, n in zip(found["series"], found["baseline"], found["n_star"])]
    colour = alt.Color("line:N", scale=cscale)
    tooltip = [alt.Tooltip("line_text:N", title="Crossover"), alt.Tooltip("note:N", title="How")]
    rule = alt.Chart(found).mark_rule(strokeWidth=2 if talk else 1, strokeDash=[3, 3]).encode(
        x=x, color=colour, tooltip=tooltip)
    ring = alt.Chart(found).mark_point(shape="circle", filled=False, size=700 if talk else 300,
                                       strokeWidth=3 if talk else 2).encode(x=x, y=y, color=colour, tooltip=tooltip)
    found = found.sort_values("n_star").reset_index(drop=True)
    texts = [alt.Chart(part).mark_text(align=align, baseline=baseline, dx=dx, dy=dy, fontWeight="bold",
                                       fontSize=18 if talk else 11).encode(x=x, y=y, text="text:N", color=colour)
             for part, (align, baseline, dx, dy) in ((found.iloc[0::2], ("left", "top", 10, 8)),
                                                     (found.iloc[1::2], ("right", "bottom", -10, -8)))
             if len(part)]  # neighbouring labels on opposite sides, so close crossings stay readable
    return [rule, ring, *texts]


def _value_at(series_pts: pd.DataFrame, column: str, n: float) -> float:
    """The series' value at n, interpolated in log-log space between its measured points (where n* falls)."""
    s = series_pts.sort_values("n")
    if s.empty:
        return math.nan
    return float(np.exp(np.interp(np.log(n), np.log(s["n"].astype(float)), np.log(s[column].astype(float)))))


def _y_title(df, metric, unit, name, log):
    scale = ", log scale" if log else ""
    if metric == "peak_bytes":
        methods = sorted(set(df["memory_method"].dropna().astype(str)) - {""}) if "memory_method" in df else []
        return [f"{name} ({unit})", f"{' / '.join(methods) or 'not measured yet'}{scale}"]
    devices = sorted(set(df["device"])) if "device" in df and len(df) else ["cpu"]
    how = " / ".join(TIME_METHODS.get(d, TIME_METHODS["cpu"]) for d in devices)
    return [f"{name} ({unit})", f"{how}{scale}"]


def default_title(df: pd.DataFrame, metric: str) -> str:
    mode = df["mode"].iloc[0] if len(df) and "mode" in df else "forward"
    if metric == "peak_bytes":
        return f"Peak memory of one {mode} call vs sequence length"
    return f"Time per {mode} call vs sequence length"


def default_subtitle(df: pd.DataFrame) -> str:
    """Where and how it was measured: device, dtype and the problem size held fixed."""
    if not len(df):
        return ""
    r = df.iloc[0]
    threads = f" · {int(r['threads'])} threads" if pd.notna(r["threads"]) else ""
    return (f"{r['device']} · {r['dtype']} · batch {r['batch']} · {r['heads']} heads · d_model {r['d_model']} "
            f"(head dim {r['head_dim']}){threads}")


SUMMARY_COLUMNS = {
    "series": "Mechanism", "time_exponent": "time ∝ n^k: k", "memory_exponent": "memory ∝ n^k: k",
    "speedup_vs_softmax": "speed-up vs softmax (×)", "memory_saving_vs_softmax": "memory saving vs softmax (×)",
    "at_n_vs_softmax": "at n (vs softmax)", "speedup_vs_sdpa": "speed-up vs SDPA (×)",
    "memory_saving_vs_sdpa": "memory saving vs SDPA (×)", "at_n_vs_sdpa": "at n (vs SDPA)",
    "gflops": "GFLOP/s at largest n", "pct_of_device": "% of device matmul", "memory_method": "memory measured by",
    "ok_points": "points measured", "points": "points planned",
}


def summary_table(df: pd.DataFrame) -> pd.DataFrame:
    """analysis.summary with readable column names and units, one row per series (and mask, when mixed)."""
    parts = []
    mixed = df["causal"].nunique() > 1
    for causal, part in df.groupby("causal", sort=False):
        table = analysis.summary(part)
        if mixed:
            table["series"] = table["series"] + (" · causal" if causal else " · bidirectional")
        parts.append(table)
    table = pd.concat(parts, ignore_index=True) if parts else analysis.summary(df)
    table = table[list(SUMMARY_COLUMNS)].rename(columns=SUMMARY_COLUMNS).round(3)
    return table.dropna(axis=1, how="all")  # e.g. the SDPA comparisons when SDPA was not measured


def house_config(talk: bool = False) -> alt.Config:
    """House look, with installed fonts so exports show text; talk: large type and thick strokes for a projector."""
    big = 1.6 if talk else 1.0
    return alt.Config(
        font=FONT, background="white",
        title=alt.TitleConfig(fontSize=round(17 * big), subtitleFontSize=round(12 * big), color="#000000",
                              subtitleColor="#222222"),
        axis=alt.AxisConfig(labelFontSize=round(12 * big), titleFontSize=round(13 * big), labelColor="#000000",
                            titleColor="#000000", gridColor="#DDDDDD", domainColor="#000000", tickColor="#000000"),
        legend=alt.LegendConfig(labelFontSize=round(12 * big), titleFontSize=round(12 * big), labelColor="#000000",
                                titleColor="#000000", orient="right", labelLimit=0, titleLimit=0,
                                symbolStrokeWidth=2),
        view=alt.ViewConfig(stroke="#000000" if talk else "#BBBBBB"))


def styled(chart: alt.TopLevelMixin, talk: bool = False) -> alt.TopLevelMixin:
    """Any chart in the house look (see house_config)."""
    return chart.properties(config=house_config(talk))
