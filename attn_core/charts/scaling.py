"""Scaling charts of a sweep: measured points with their IQR, dashed theory curves and the hardware limit, crossovers,
skipped points, and the note under a chart (pure Altair)."""
from __future__ import annotations

import json
import math
from dataclasses import dataclass

import altair as alt
import numpy as np
import pandas as pd

from ..engine import analysis
from .style import MAX_COLOURS, REPEAT_DASH, colour_scale, house_config, repeated, wrapped
# the datasets a chart draws (scaling_data): pages and tests import them from here
from .scaling_data import CURVES, METRICS, chart_frames, points_frame, records, with_series

__all__ = ["BUSY_FOOTNOTE", "CURVES", "ChartShape", "DASHES", "EMPTY_DOMAIN", "GENERATE_NAMES", "LiveSpec",
           "MASK_DASHES", "METRICS", "ROOFLINE_HOW", "SUMMARY_COLUMNS", "THEORY_HOW", "TIME_METHODS", "TOOLTIP",
           "analyse", "chart_frames", "chart_note", "chart_shape", "default_subtitle", "default_title", "figure",
           "layered", "length_name", "metric_name", "points_frame", "records", "scaling_chart", "summary_table",
           "tooltip", "with_series"]

# What METRICS are called for a sweep generating token by token (mode "generate")
GENERATE_NAMES = {"time_median_s": "Time per generated token", "peak_bytes": "Cache memory"}
DASHES = {"spec": [8, 4], "n²": [2, 3], "n": [12, 4, 2, 4], "roofline": [1, 4]}
# Measured lines when a chart mixes masks: bidirectional solid, causal a dash-dot no theory curve uses
MASK_DASHES = {"bidirectional": [1, 0], "causal": [14, 4, 3, 4]}
# How the engine times a call on each device (env.device_timer), as the axis says it.
TIME_METHODS = {"cuda": "median of CUDA-event timings", "mps": "median wall-clock, synchronized",
                "cpu": "median wall-clock"}
THEORY_HOW = ["Dashed: theory, scaled to the clean points"]  # how: the page's "How this was measured"
BUSY_FOOTNOTE = "Hollow: timed while the computer was busy; left out of the dashed curves"  # one subtitle line
# The on-screen legend of hollow points (the footnote is the export's): lines, so the plot keeps its width
BUSY_LEGEND = ("Hollow: timed while the", "computer was busy; left out", "of the lines and dashed curves")
BUSY_LABEL = "busy"  # scaling_data gives each hollow point this value
TITLE_CHARS = 60  # a title line's characters at most: 18 px type is ~10 px a character
SAME_VALUES = 0.02  # relative: two lines within 2 % at every common n lie on each other at any size a chart has
ROOFLINE_HOW = ["Dotted: executed FLOPs at the device's", "measured matmul throughput"]
EMPTY_DOMAIN = {True: (1.0, 10.0), False: (0.0, 1.0)}  # a y scale with nothing to draw (log, linear): keeps its height


def metric_name(df: pd.DataFrame, metric: str) -> str:
    """What a chart of `metric` calls its values: 'Time per call', or 'Time per generated token' when generating."""
    return GENERATE_NAMES[metric] if analysis.generating(df) else METRICS[metric][3]


def length_name(generate: bool) -> str:
    return "Context length n" if generate else "Sequence length n"


def tooltip(generate: bool) -> list[alt.Tooltip]:
    """A point's tooltip, its names as the chart's."""
    names = GENERATE_NAMES if generate else {m: v[3] for m, v in METRICS.items()}
    return [alt.Tooltip("series:N", title="Mechanism"), alt.Tooltip("n:Q", title=length_name(generate), format=",d"),
            alt.Tooltip("time:N", title=names["time_median_s"]), alt.Tooltip("memory:N", title=names["peak_bytes"]),
            *TOOLTIP]


TOOLTIP = [  # the rest of a point's tooltip
    alt.Tooltip("predicted:N", title="Predicted memory (spec)"),
    alt.Tooltip("memory_method:N", title="Memory measured by"),
    alt.Tooltip("throughput:N", title="Achieved"),
    alt.Tooltip("contention:N", title="Other programs"),
    alt.Tooltip("params:N", title="Parameters"),
    alt.Tooltip("status:N", title="Status"),
]


def analyse(df: pd.DataFrame, metric: str, baseline: str = "softmax",
            roofline: bool = False) -> tuple[pd.DataFrame, pd.DataFrame]:
    """analysis.theory_curves (with analysis.roofline for time when asked, one device figure for all) and
    analysis.crossovers, computed separately for causal and bidirectional rows."""
    theory, crossings = [], []
    gflops = analysis.device_gflops(df)
    for causal, part in df.groupby("causal", sort=False):
        curves = analysis.theory_curves(part, metric)
        if roofline and metric == "time_median_s":
            curves = pd.concat([curves, analysis.roofline(part, gflops)], ignore_index=True)
        theory.append(curves.assign(causal=causal))
        crossings.append(analysis.crossovers(part, metric, baseline).assign(causal=causal))
    if not theory:
        return analysis.theory_curves(df, metric), analysis.crossovers(df, metric, baseline)
    return pd.concat(theory, ignore_index=True), pd.concat(crossings, ignore_index=True)


def figure(df: pd.DataFrame, metric: str = "time_median_s", *, log: bool = True, baseline: str = "softmax",
           curves: tuple[str, ...] = ("spec",), talk: bool = False, title: str | None = None,
           subtitle: str | None = None) -> alt.LayerChart:
    """The dashboard's chart of one metric as a file shows it: measured points, the chosen theory curves (kinds of
    CURVES) and n*; a time chart with disturbed points says so in one footnote line under its subtitle (the page
    says how many beside)."""
    theory, crossings = analyse(df, metric, baseline, "roofline" in curves)
    if metric == "time_median_s" and df["disturbed"].any():
        subtitle = [subtitle if subtitle is not None else default_subtitle(df), BUSY_FOOTNOTE]
    return scaling_chart(df, metric, theory=theory[theory["kind"].isin(curves)], crossovers=crossings, log=log,
                         talk=talk, title=title, subtitle=subtitle)


def scaling_chart(df: pd.DataFrame, metric: str = "time_median_s", *, theory: pd.DataFrame | None = None,
                  crossovers: pd.DataFrame | None = None, log: bool = True, title: str | None = None,
                  subtitle: str | list[str] | None = None, talk: bool = False, width: int | None = None,
                  height: int | None = None) -> alt.LayerChart:
    """Metric vs n for every series of a results frame (the contract's columns).

    `theory`: rows of analysis.theory_curves or analysis.roofline (mechanism, curve, n, value in the metric's unit,
    kind), drawn dashed. `crossovers`: rows of analysis.crossovers (mechanism, baseline, n_star, note), drawn as a
    ring at the crossing. Points that were skipped, failed or not measured sit on the bottom edge as crosses whose
    tooltip gives the reason; disturbed points are hollow; a time point's IQR is an error bar.
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
    width: int | str  # pixels, or "container": the page's box (a page fits it to the screen)
    height: int | str
    title: str | tuple[str, ...]  # one line, or lines (a long title is wrapped, never cut)
    subtitle: str | tuple[str, ...]
    y_title: tuple[str, ...]
    lines: tuple[str, ...]  # the colour scale's domain ...
    colours: tuple[str, ...]  # ... and range
    masks: bool  # causal and bidirectional rows mixed: points told apart by shape
    datasets: tuple[str, ...]  # which of chart_frames' datasets exist
    kinds: tuple[str, ...]  # which kinds of theory curve are drawn ...
    dash_labels: tuple[str, ...]  # ... and their legend entries
    ticks: tuple[int, ...]  # the measured lengths, as the x axis' ticks when they are few (else Vega's own)
    formulas: tuple[tuple[str, str], ...]  # line → its theory formula, written into the colour legend
    y_domain: tuple[float, ...] = ()  # set only when the values span no range (none, or all equal): Vega's own else
    generate: bool = False  # generation steps: time per token against the context, the cache's memory
    dashed: tuple[str, ...] = ()  # measured lines drawn dashed: on an earlier line, or repeating its colour


def chart_shape(df: pd.DataFrame, frames: dict[str, pd.DataFrame], metric: str, *, log: bool = True,
                talk: bool = False, title: str | None = None, subtitle: str | list[str] | None = None,
                width: int | str | None = None, height: int | str | None = None) -> ChartShape:
    unit, name = METRICS[metric][1], metric_name(df, metric)
    every = pd.concat([frames[key] for key in ("points", "disturbed", "missing") if key in frames])
    scale = colour_scale(every.drop_duplicates("line")[["mechanism", "line"]].itertuples(index=False), MAX_COLOURS)
    theory = frames.get("theory")
    kinds = tuple(k for k in DASHES if theory is not None and k in set(theory["kind"]))
    labels = tuple(theory.loc[theory["kind"] == k, "kind_label"].iloc[0] for k in kinds)
    spec_curves = theory[theory["kind"] == "spec"].drop_duplicates("line") if theory is not None else theory
    formulas = () if spec_curves is None else tuple(zip(spec_curves["line"], spec_curves["curve"].str.replace(
        " fit", "")))
    drawn = pd.concat([frames[key] for key in ("points", "disturbed") if key in frames])
    on = on_each_other(drawn, METRICS[metric][0])
    masks = every["mask"].nunique() > 1
    lines = [subtitle if subtitle is not None else default_subtitle(df)] if not isinstance(subtitle, list) else subtitle
    if on:
        lines = [*lines, "; ".join(f"{upper} lies on {lower}" for upper, lower in on.items()) + " (the same values)"
                 + ("" if masks else ": drawn dashed")]
    if again := repeated(scale):
        lines = [*lines, f"More than {MAX_COLOURS} lines: {', '.join(again)} repeat an earlier colour"
                 + ("" if masks else ", dashed")]
    dashed = tuple(dict.fromkeys([*on, *again])) if not masks else ()
    return ChartShape(metric, log, talk, width or (900 if talk else 640), height or (500 if talk else 380),
                      _one_or_lines(wrapped(title or default_title(df, metric), TITLE_CHARS)),
                      _one_or_lines(wrapped(lines)),
                      tuple(_y_title(df, metric, unit, name, log)), tuple(scale.domain), tuple(scale.range),
                      masks, tuple(frames), kinds, labels,
                      tuple(sorted(set(df["n"].astype(int)))) if 1 < df["n"].nunique() <= 9 else (),
                      formulas, _fixed_domain(frames, METRICS[metric][0], log), analysis.generating(df), dashed)


def _one_or_lines(lines: list[str]) -> str | tuple[str, ...]:
    """A subtitle as Vega-Lite takes it: one line as its text ('' for none), more as a tuple of lines."""
    return tuple(lines) if len(lines) > 1 else (lines[0] if lines else "")


def on_each_other(drawn: pd.DataFrame, column: str) -> dict[str, str]:
    """Lines drawn on an earlier line: {line: the earlier line} for each pair whose values differ by at most
    SAME_VALUES (relative) at every n both have, at least two of them (MLA absorbed's cache is MLA naive's).
    O(lines² · points)."""
    values = {line: part.groupby("n")[column].median() for line, part in drawn.groupby("line", sort=False)}
    found: dict[str, str] = {}
    names = list(values)
    for i, upper in enumerate(names):
        for lower in names[:i]:
            common = values[upper].index.intersection(values[lower].index)
            a, b = values[upper][common].to_numpy(float), values[lower][common].to_numpy(float)
            if len(common) >= 2 and lower not in found and np.all(np.abs(a - b) <= SAME_VALUES * np.abs(b)):
                found[upper] = lower
                break
    return found


def _fixed_domain(frames: dict[str, pd.DataFrame], column: str, log: bool) -> tuple[float, ...]:
    """A y domain where Vega's own would draw a flat axis with odd ticks: on a log axis, values within one decade get
    the powers of ten around them (stable while points arrive); on a linear one, equal values get 0 to twice them;
    no value gets EMPTY_DOMAIN. () otherwise: Vega's own."""
    values = pd.concat([frame[c] for frame in frames.values() for c in (column, "iqr_low", "iqr_high")
                        if c in frame]).astype(float)
    values = values[np.isfinite(values) & ((values > 0) if log else True)]
    if values.empty:
        return EMPTY_DOMAIN[log]
    low, high = float(values.min()), float(values.max())
    if log:
        if high >= 10 * low:
            return ()
        bottom, top = 10.0 ** math.floor(math.log10(low)), 10.0 ** math.ceil(math.log10(high))
        return bottom, max(top, bottom * 10)
    if high - low > 1e-9 * max(abs(low), abs(high)):
        return ()
    return (0.0, 2 * high) if high > 0 else (2 * low, 0.0) if low < 0 else EMPTY_DOMAIN[log]


def layered(shape: ChartShape, frames: dict[str, pd.DataFrame] | None = None) -> alt.LayerChart:
    """The layered chart of a shape, each layer reading one named dataset of `frames` (None: datasets left out, to
    be put into the spec later, as LiveSpec does)."""
    column = METRICS[shape.metric][0]
    cscale = alt.Scale(domain=list(shape.lines), range=list(shape.colours))
    # the error bars' lighter rules would set the symbols' opacity; a formula follows its mechanism's name (labels
    # placed on the chart overlapped each other and the lines)
    table = json.dumps(dict(shape.formulas))
    named = {"labelExpr": f"({table})[datum.label] ? datum.label + ' — ' + ({table})[datum.label] : datum.label"
             } if shape.formulas else {}
    colour = alt.Color("line:N", scale=cscale, title="Mechanism (measured)" + (" — its cost" if shape.formulas
                                                                               else ""),
                       legend=alt.Legend(symbolOpacity=1, **named))
    x = alt.X("n:Q", title=f"{length_name(shape.generate)} (tokens)" + (", log₂ scale" if shape.log else ""),
              scale=alt.Scale(type="log", base=2) if shape.log else alt.Scale(zero=False),
              axis=alt.Axis(format=",d", values=list(shape.ticks)) if shape.ticks and shape.log else
              alt.Axis(format=",d"))
    domain = {"domain": list(shape.y_domain)} if shape.y_domain else {}
    yscale = (alt.Scale(type="log", nice=False, padding=8, **domain) if shape.log else
              alt.Scale(zero=True, **domain))
    y = alt.Y(f"{column}:Q", title=list(shape.y_title), scale=yscale)
    layers = _measured_layers(shape, x, y, yscale, colour)
    if "theory" in shape.datasets:
        layers.extend(_theory_layers(shape, x, y, cscale, column))
    layers.extend(_crossover_layers(shape, x, y, cscale))
    # One constructor call: each .properties() or .configure_*() would deep-copy every layer.
    data = {} if frames is None else {"datasets": records(frames)}
    fit = {"autosize": alt.AutoSizeParams(type="fit", contains="padding")} if "container" in (shape.width,
                                                                                         shape.height) else {}
    return alt.LayerChart(layer=layers, width=shape.width, height=shape.height, **data, **fit,
                          title=alt.TitleParams(shape.title, anchor="start", subtitle=shape.subtitle),
                          resolve=alt.Resolve(scale=alt.ScaleResolveMap(shape="independent",
                                                                        strokeDash="independent")),
                          config=house_config(shape.talk))


def _measured_layers(shape: ChartShape, x: alt.X, y: alt.Y, yscale: alt.Scale, colour: alt.Color) -> list:
    """The measured layers: lines and IQR bars (or a note where nothing is drawn), filled points, hollow
    (disturbed) points, and crosses on the bottom edge for points not drawn."""
    talk = shape.talk
    # the masks' points differ in shape too; the line style's legend names them
    marker = {"shape": alt.Shape("mask:N", legend=None) if shape.masks else alt.value("circle"),
              "tooltip": tooltip(shape.generate)}
    layers = []
    if "lines" in shape.datasets:  # the clean points only: a hollow point stands alone
        layers.extend(_line_layers(shape, x, y, colour))
    if "bars" in shape.datasets:  # the IQR of every drawn time point: 25th to 75th percentile of the samples
        layers.append(alt.Chart(alt.NamedData(name="bars")).mark_errorbar(ticks=True, thickness=2 if talk else 1)
                      .encode(x=x, y=alt.Y("iqr_low:Q", title=list(shape.y_title), scale=yscale), y2="iqr_high:Q",
                              color=colour))
    if not {"lines", "disturbed"} & set(shape.datasets):
        layers.append(alt.Chart(alt.InlineData(values=[{}])).mark_text(
            text="No measured value to draw", fontSize=18 if talk else 12, color="#555555").encode(
            x=alt.value({"expr": "width / 2"}), y=alt.value({"expr": "height / 2"})))
    if "disturbed" in shape.datasets:  # what hollow means, in a legend of its own (invisible points, under the rest)
        layers.append(alt.Chart(alt.NamedData(name="disturbed")).mark_point(size=0, opacity=0).encode(
            x=x, y=y, shape=alt.Shape("busy:N", title=list(BUSY_LEGEND), scale=alt.Scale(
                domain=[BUSY_LABEL], range=["circle"]), legend=alt.Legend(
                symbolFillColor="transparent", symbolStrokeColor="#000000", symbolOpacity=1,
                symbolStrokeWidth=3 if talk else 2, symbolSize=220 if talk else 120))))
    layers.append(alt.Chart(alt.NamedData(name="points")).mark_point(
        filled=True, size=160 if talk else 60, opacity=1).encode(x=x, y=y, color=colour, **marker))
    if "disturbed" in shape.datasets:  # timed while other programs took CPU: hollow, left out of the fits
        layers.append(alt.Chart(alt.NamedData(name="disturbed")).mark_point(
            filled=False, size=160 if talk else 60, opacity=1, strokeWidth=3 if talk else 2).encode(
            x=x, y=y, color=colour, **marker))
    if "missing" in shape.datasets:
        layers.append(alt.Chart(alt.NamedData(name="missing")).mark_point(
            shape="cross", filled=True, size=220 if talk else 110).encode(
            x=x, y=alt.value({"expr": "height - 6"}), color=colour,
            tooltip=[alt.Tooltip("series:N", title="Mechanism"),
                     alt.Tooltip("n:Q", title=length_name(shape.generate), format=",d"),
                     alt.Tooltip("why:N", title="Not drawn"), alt.Tooltip("params:N", title="Parameters")]))
    return layers


def _line_layers(shape: ChartShape, x: alt.X, y: alt.Y, colour: alt.Color) -> list:
    """The solid lines through the clean points (told apart by mask when the chart mixes them), and the lines of
    shape.dashed drawn dashed on top of them (a line on another, or one repeating another's colour)."""
    drawn = alt.Chart(alt.NamedData(name="lines")).encode(x=x, y=y, color=colour, detail="series:N")
    width = 4 if shape.talk else 2
    if shape.masks:
        return [drawn.mark_line(strokeWidth=width).encode(strokeDash=alt.StrokeDash(
            "mask:N", title="Mask (line style)", scale=alt.Scale(domain=list(MASK_DASHES),
                                                                  range=list(MASK_DASHES.values()))))]
    if not shape.dashed:
        return [drawn.mark_line(strokeWidth=width)]
    dashed = alt.FieldOneOfPredicate(field="line", oneOf=list(shape.dashed))
    return [drawn.mark_line(strokeWidth=width).transform_filter(alt.LogicalNotPredicate(**{"not": dashed})),
            drawn.mark_line(strokeWidth=width, strokeDash=REPEAT_DASH).transform_filter(dashed)]


def chart_note(df: pd.DataFrame, metric: str = "time_median_s", *, log: bool = True,
               curves: tuple[str, ...] = ("spec",)) -> str:
    """The note a page shows under a chart: the points not drawn and why, series left without a fitted curve,
    a missing hardware limit, and points above 100 % of the device's matmul; '' when there is nothing to say."""
    if df.empty:
        return ""
    pts = points_frame(df, metric, log)
    lines = []
    why = pts.loc[~pts["drawn"], "why"].value_counts(sort=False)
    if len(why):
        lines.append("Not drawn (crosses on the bottom edge): " + "; ".join(
            f"{k} {'point' if k == 1 else 'points'}, {reason}" for reason, k in why.items()) + ".")
    if metric == "time_median_s":
        if set(curves) - {"roofline"}:
            lines += [f"No theory curve for {name}: every point of it was disturbed."
                      for name in analysis.unfitted(df, metric)]
        if "roofline" in curves and not math.isfinite(analysis.device_gflops(df)):
            lines.append("No hardware limit: this sweep did not measure the device's matmul throughput.")
        above = int((pts["drawn"] & (pts["pct_of_device"] > 100)).sum())
        if above:
            lines.append(f"{above} {'point is' if above == 1 else 'points are'} {analysis.ABOVE_DEVICE}.")
    return " ".join(lines)


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
               subtitle: str | None = None, fit: bool = False) -> dict:
        """The spec for these rows; `fit`: as wide and tall as the page's box around it (width and height
        "container"), which a page sizes to the screen."""
        theory, crossings = analyse(df, metric, baseline, "roofline" in curves)
        frames = chart_frames(df, metric, theory=theory[theory["kind"].isin(curves)], crossovers=crossings, log=log)
        size = {"width": "container", "height": "container"} if fit else {}
        self.shape = chart_shape(df, frames, metric, log=log, talk=talk, title=title, subtitle=subtitle, **size)
        if self.shape not in self.specs:
            if len(self.specs) >= self.KEEP:
                self.specs.pop(next(iter(self.specs)))
            self.specs[self.shape] = layered(self.shape).to_dict(validate=False)
        return {**self.spec, "datasets": records(frames)}  # a new dict: a caller may take the datasets out


def _theory_layers(shape, x, y, cscale, column):
    how = ROOFLINE_HOW if shape.kinds == ("roofline",) else THEORY_HOW
    dash = alt.StrokeDash("kind_label:N", title=how, scale=alt.Scale(
        domain=list(shape.dash_labels), range=[DASHES[k] for k in shape.kinds]))
    line = alt.Chart(alt.NamedData(name="theory")).mark_line(strokeWidth=3 if shape.talk else 1.5,
                                                             opacity=0.85).encode(
        x=x, y=y, color=alt.Color("line:N", scale=cscale), strokeDash=dash, detail="series:N",
        tooltip=[alt.Tooltip("series:N", title="Mechanism"), alt.Tooltip("curve:N", title="Theory curve"),
                 alt.Tooltip("n:Q", title="n", format=",d"), alt.Tooltip(f"{column}:Q", title="Value", format=".4g")])
    return [line]


def _crossover_layers(shape, x, y, cscale):
    """Each n*: a dotted rule and a ring in its mechanism's colour, named in a legend of its own ("Linear overtakes
    Softmax at n* ≈ 303"): labels on the chart overlapped each other and the lines, and did not say the pair."""
    colour = alt.Color("line:N", scale=cscale)
    tooltip = [alt.Tooltip("line_text:N", title="Crossover"), alt.Tooltip("note:N", title="How")]
    if "crossings" not in shape.datasets:
        return []
    found = alt.Chart(alt.NamedData(name="crossings"))
    named = alt.Shape("line_text:N", title="Crossover n* (ring, dotted rule)", scale=alt.Scale(range=["circle"]),
                      legend=alt.Legend(symbolFillColor="transparent", symbolStrokeColor="#000000",
                                        symbolStrokeWidth=2, symbolSize=300 if shape.talk else 150))
    return [found.mark_rule(strokeWidth=2 if shape.talk else 1, strokeDash=[3, 3]).encode(
                x=x, color=colour, tooltip=tooltip),
            found.mark_point(filled=False, size=700 if shape.talk else 300, strokeWidth=3 if shape.talk else 2,
                             opacity=1).encode(x=x, y=y, color=colour, shape=named, tooltip=tooltip)]


def _y_title(df, metric, unit, name, log):
    """The axis' name and unit, and how the drawn values were measured: never why others were not (see note)."""
    scale = ", log scale" if log else ""
    if metric == "peak_bytes":
        measured = df[df["status"].eq("ok") & df["peak_bytes"].notna()] if len(df) else df
        methods = sorted(set(measured["memory_method"].astype(str)) - {""})
        how = " / ".join(methods) + scale if methods else scale.removeprefix(", ")
        return [f"{name} ({unit})", how] if how else [f"{name} ({unit})"]
    devices = sorted(set(df["device"])) if "device" in df and len(df) else ["cpu"]
    how = " / ".join(TIME_METHODS.get(d, TIME_METHODS["cpu"]) for d in devices)
    return [f"{name} ({unit})", f"{how}{scale}"]


def default_title(df: pd.DataFrame, metric: str) -> str:
    if analysis.generating(df):
        return f"{GENERATE_NAMES[metric]} vs context length"
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
    # each ratio beside the n it was taken at: the two may differ (a disturbed time at the largest n)
    "speedup_vs_softmax": "speed-up vs softmax (×)", "at_n_vs_softmax": "speed-up at n",
    "memory_saving_vs_softmax": "memory saving vs softmax (×)", "memory_at_n_vs_softmax": "memory saving at n",
    "speedup_vs_sdpa": "speed-up vs SDPA (×)", "at_n_vs_sdpa": "speed-up vs SDPA at n",
    "memory_saving_vs_sdpa": "memory saving vs SDPA (×)", "memory_at_n_vs_sdpa": "memory saving vs SDPA at n",
    "gflops": "GFLOP/s at largest n (executed FLOPs)", "useful_gflops": "GFLOP/s at largest n (useful FLOPs)",
    "pct_of_device": "% of device matmul (executed FLOPs)", "memory_method": "memory measured by",
    "ok_points": "points measured", "points": "points planned", "note": "note",
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
    if not table["note"].astype(bool).any():
        table = table.drop(columns="note")
    empty = [c for c in table if table[c].isna().all() and c not in (SUMMARY_COLUMNS["time_exponent"],
                                                                    SUMMARY_COLUMNS["memory_exponent"])]
    return table.drop(columns=empty)  # e.g. the SDPA comparisons when SDPA was not measured (summary_notes)
