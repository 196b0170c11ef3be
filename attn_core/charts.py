"""Scaling charts of a sweep: measured points, dashed theory curves, crossovers and skipped points (pure Altair)."""
from __future__ import annotations

import json
import math
from dataclasses import dataclass

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
    alt.Tooltip("n:Q", title="Sequence length n", format=",d"),
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
    frames = chart_frames(df, metric, theory=theory, crossovers=crossovers, log=log)
    return layered(chart_shape(df, frames, metric, log=log, talk=talk, title=title, subtitle=subtitle,
                               width=width, height=height), frames)


@dataclass(frozen=True)
class ChartShape:
    """Everything a scaling chart's spec depends on except its data rows: equal shapes give specs that differ only
    in their datasets."""

    metric: str
    log: bool
    talk: bool
    width: int
    height: int
    title: str
    subtitle: str | tuple[str, ...]
    y_title: tuple[str, ...]
    lines: tuple[str, ...]  # the colour scale's domain ...
    colours: tuple[str, ...]  # ... and range
    masks: bool  # causal and bidirectional rows mixed: points told apart by shape
    datasets: tuple[str, ...]  # which of chart_frames' datasets exist
    kinds: tuple[str, ...]  # which kinds of theory curve are drawn
    ticks: tuple[int, ...]  # the measured lengths, as the x axis' ticks when they are few (else Vega's own)


def chart_shape(df: pd.DataFrame, frames: dict[str, pd.DataFrame], metric: str, *, log: bool = True,
                talk: bool = False, title: str | None = None, subtitle: str | list[str] | None = None,
                width: int | None = None, height: int | None = None) -> ChartShape:
    _, unit, _, name = METRICS[metric]
    every = pd.concat([frames["points"], frames.get("missing", frames["points"].iloc[0:0])])
    scale = colour_scale(every)
    theory = frames.get("theory")
    return ChartShape(metric, log, talk, width or (900 if talk else 640), height or (500 if talk else 380),
                      title or default_title(df, metric),
                      tuple(subtitle) if isinstance(subtitle, list) else
                      (subtitle if subtitle is not None else default_subtitle(df)),
                      tuple(_y_title(df, metric, unit, name, log)), tuple(scale.domain), tuple(scale.range),
                      every["mask"].nunique() > 1, tuple(frames),
                      tuple(k for k in DASHES if theory is not None and k in set(theory["kind"])),
                      tuple(sorted(set(df["n"].astype(int)))) if 1 < df["n"].nunique() <= 9 else ())


def chart_frames(df: pd.DataFrame, metric: str, *, theory: pd.DataFrame | None = None,
                 crossovers: pd.DataFrame | None = None, log: bool = True) -> dict[str, pd.DataFrame]:
    """The datasets a scaling chart draws, in display units and by name: points (measured), missing (not drawn:
    crosses on the bottom edge), theory and theory_ends (dashed curves and their labels), crossings_left and
    crossings_right (n* marks, neighbours labelled on opposite sides). Empty ones are left out, points excepted."""
    column, _, divisor, _ = METRICS[metric]
    keep = ["mechanism", "label", "params", "causal", "n", column, "line", "series", "mask", "status", "drawn", "why",
            "time", "memory", "predicted", "memory_method", "throughput"]
    pts = points_frame(df, metric, log)[keep]  # only what the chart draws or shows: the spec stays small
    frames = {"points": pts[pts["drawn"]], "missing": pts[~pts["drawn"]]}
    if theory is not None and len(theory):
        frames["theory"], frames["theory_ends"] = _theory_frames(theory, pts, column, divisor)
    if crossovers is not None and len(crossovers):
        found = _crossover_frame(crossovers, pts, metric)
        frames["crossings_left"], frames["crossings_right"] = found.iloc[0::2], found.iloc[1::2]
    return {name: frame for name, frame in frames.items() if name == "points" or len(frame)}


def records(frames: dict[str, pd.DataFrame]) -> dict[str, list[dict]]:
    """The frames as Vega-Lite datasets: lists of JSON-ready rows (NaN becomes null)."""
    return {name: json.loads(frame.to_json(orient="records", double_precision=15)) for name, frame in frames.items()}


def layered(shape: ChartShape, frames: dict[str, pd.DataFrame] | None = None) -> alt.LayerChart:
    """The layered chart of a shape, each layer reading one named dataset of `frames` (None: datasets left out, to
    be put into the spec later, as LiveSpec does)."""
    column = METRICS[shape.metric][0]
    cscale = alt.Scale(domain=list(shape.lines), range=list(shape.colours))
    colour = alt.Color("line:N", scale=cscale, title="Mechanism (measured, solid)")
    x = alt.X("n:Q", title="Sequence length n (tokens)" + (", log₂ scale" if shape.log else ""),
              scale=alt.Scale(type="log", base=2) if shape.log else alt.Scale(zero=False),
              axis=alt.Axis(format=",d", values=list(shape.ticks)) if shape.ticks and shape.log else
              alt.Axis(format=",d"))
    y = alt.Y(f"{column}:Q", title=list(shape.y_title),
              scale=alt.Scale(type="log", nice=False, padding=8) if shape.log else alt.Scale(zero=True))
    talk = shape.talk
    base = alt.Chart(alt.NamedData(name="points")).encode(x=x, y=y, color=colour)
    layers = [base.mark_line(strokeWidth=4 if talk else 2).encode(detail="series:N"),
              base.mark_point(filled=True, size=160 if talk else 60, opacity=1).encode(
                  shape=alt.Shape("mask:N", title="Mask") if shape.masks else alt.value("circle"), tooltip=TOOLTIP)]
    if "missing" in shape.datasets:
        layers.append(alt.Chart(alt.NamedData(name="missing")).mark_point(
            shape="cross", filled=True, size=220 if talk else 110).encode(
            x=x, y=alt.value({"expr": "height - 6"}), color=colour,
            tooltip=[alt.Tooltip("series:N", title="Mechanism"),
                     alt.Tooltip("n:Q", title="Sequence length n", format=",d"),
                     alt.Tooltip("why:N", title="Not drawn"), alt.Tooltip("params:N", title="Parameters")]))
    if "theory" in shape.datasets:
        layers.extend(_theory_layers(shape, x, y, cscale, column))
    layers.extend(_crossover_layers(shape, x, y, cscale))
    # One constructor call: each .properties() or .configure_*() would deep-copy every layer.
    data = {} if frames is None else {"datasets": records(frames)}
    return alt.LayerChart(layer=layers, width=shape.width, height=shape.height, **data,
                          title=alt.TitleParams(shape.title, anchor="start", subtitle=shape.subtitle),
                          config=house_config(talk))


class LiveSpec:
    """One chart's Vega-Lite spec kept between updates of a live sweep: built with Altair only for a shape not seen
    before (a new mechanism, another axis or title); otherwise the new rows are put into the spec of that shape,
    which costs a small fraction of a build (the CPU a dashboard takes is taken from the measurement beside it)."""

    KEEP = 16  # shapes remembered: running the same sweep again draws its first point without a build

    def __init__(self) -> None:
        self.specs: dict[ChartShape, dict] = {}
        self.shape: ChartShape | None = None

    @property
    def spec(self) -> dict:
        return self.specs[self.shape]

    def update(self, df: pd.DataFrame, metric: str, *, log: bool = True, baseline: str = "softmax",
               curves: tuple[str, ...] = ("spec",), talk: bool = False, title: str | None = None,
               subtitle: str | None = None) -> dict:
        theory, crossings = analyse(df, metric, baseline)
        frames = chart_frames(df, metric, theory=theory[theory["kind"].isin(curves)], crossovers=crossings, log=log)
        self.shape = chart_shape(df, frames, metric, log=log, talk=talk, title=title, subtitle=subtitle)
        if self.shape not in self.specs:
            if len(self.specs) >= self.KEEP:
                self.specs.pop(next(iter(self.specs)))
            self.specs[self.shape] = layered(self.shape).to_dict(validate=False)
        return {**self.spec, "datasets": records(frames)}  # a new dict: a caller may take the datasets out


def _attach(frame: pd.DataFrame, pts: pd.DataFrame) -> pd.DataFrame:
    """Analysis rows joined to the chart's line and series names (by mechanism, params and mask where present)."""
    keys = [k for k in ("mechanism", "params", "causal") if k in frame.columns]
    names = pts.drop_duplicates(keys)[keys + ["line", "series", "label"]]
    return frame.drop(columns=[c for c in ("series", "label") if c in frame.columns]).merge(names, on=keys)


def _theory_frames(theory, pts, column, divisor):
    curves = _attach(theory[[c for c in ("mechanism", "params", "causal", "curve", "kind", "n", "value")
                             if c in theory.columns]], pts)
    curves[column] = curves["value"] / divisor
    curves = curves[curves[column] > 0]
    if "kind" not in curves:
        curves["kind"] = "spec"
    curves["kind_label"] = curves["kind"].map(CURVES).fillna(curves["kind"])
    ends = curves[curves["kind"] == "spec"].sort_values("n").groupby("series", sort=False).tail(1)
    return curves, ends.assign(text=ends["curve"].str.replace(" fit", ""))


def _theory_layers(shape, x, y, cscale, column):
    dash = alt.StrokeDash("kind_label:N", title=THEORY_HOW, scale=alt.Scale(
        domain=[CURVES[k] for k in shape.kinds], range=[DASHES[k] for k in shape.kinds]))
    line = alt.Chart(alt.NamedData(name="theory")).mark_line(strokeWidth=3 if shape.talk else 1.5,
                                                             opacity=0.85).encode(
        x=x, y=y, color=alt.Color("line:N", scale=cscale), strokeDash=dash, detail="series:N",
        tooltip=[alt.Tooltip("series:N", title="Mechanism"), alt.Tooltip("curve:N", title="Theory curve"),
                 alt.Tooltip("n:Q", title="n", format=",d"), alt.Tooltip(f"{column}:Q", title="Value", format=".4g")])
    if "theory_ends" not in shape.datasets:
        return [line]
    label = alt.Chart(alt.NamedData(name="theory_ends")).mark_text(
        align="right", baseline="bottom", dx=-2, dy=-4, fontSize=16 if shape.talk else 10).encode(
        x=x, y=y, text="text:N", color=alt.Color("line:N", scale=cscale))
    return [line, label]


def _crossover_frame(crossovers, pts, metric):
    found = _attach(crossovers.loc[crossovers["n_star"].notna(), [c for c in ("mechanism", "params", "causal",
                                                                                "baseline", "n_star", "note")
                                                                      if c in crossovers.columns]], pts)
    column = METRICS[metric][0]
    labels = pts.drop_duplicates("mechanism").set_index("mechanism")["label"]
    found["n"] = found["n_star"]
    found[column] = [_value_at(pts[pts["drawn"] & (pts["series"] == s)], column, n)
                     for s, n in zip(found["series"], found["n_star"])]
    found["text"] = [f"n* ≈ {n:,.0f}" for n in found["n_star"]]
    found["line_text"] = [f"{s} overtakes {labels.get(b, b)} at n* ≈ {n:,.0f}"
                          for s, b, n in zip(found["series"], found["baseline"], found["n_star"])]
    return found.sort_values("n_star").reset_index(drop=True)


def _crossover_layers(shape, x, y, cscale):
    colour = alt.Color("line:N", scale=cscale)
    tooltip = [alt.Tooltip("line_text:N", title="Crossover"), alt.Tooltip("note:N", title="How")]
    layers = []
    for name, (align, baseline, dx, dy) in (("crossings_left", ("left", "top", 10, 8)),
                                            ("crossings_right", ("right", "bottom", -10, -8))):
        if name not in shape.datasets:
            continue
        found = alt.Chart(alt.NamedData(name=name))
        layers += [found.mark_rule(strokeWidth=2 if shape.talk else 1, strokeDash=[3, 3]).encode(
                       x=x, color=colour, tooltip=tooltip),
                   found.mark_point(shape="circle", filled=False, size=700 if shape.talk else 300,
                                    strokeWidth=3 if shape.talk else 2).encode(x=x, y=y, color=colour,
                                                                               tooltip=tooltip),
                   found.mark_text(align=align, baseline=baseline, dx=dx, dy=dy, fontWeight="bold",
                                   fontSize=18 if shape.talk else 11).encode(x=x, y=y, text="text:N", color=colour)]
    return layers


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
