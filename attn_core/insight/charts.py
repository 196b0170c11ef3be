"""Charts beyond speed: errors, speed–accuracy, attention patterns, theory at scale, runs from several machines and
published references (pure Altair: DataFrame in, chart out)."""
from __future__ import annotations

import json
import math
import textwrap
from functools import partial

import altair as alt
import numpy as np
import pandas as pd
import torch

from attn_core.charts import export
from attn_core.engine.analysis import generating
from attn_core.insight.accuracy import METRIC_LABELS
from attn_core.charts.style import REFERENCE_GREY, colour_scale, styled
from attn_core.insight.effective import matrix_frame
from attn_core.insight.published import PUBLISHED
from attn_core.insight.theory import DECODE_EXTRAPOLATION, EXTRAPOLATION
from attn_core.engine.untrusted import csv_bytes, file_stem

MIB = float(1 << 20)
LOG2_X = alt.Scale(type="log", base=2)


def _finish(chart: alt.TopLevelMixin) -> alt.TopLevelMixin:
    """The house look, with room above the title (a stretched chart in a page otherwise clips its top line)."""
    return styled(chart).properties(padding={"top": 10, "left": 5, "right": 5, "bottom": 5})


REFERENCE_DASHES = [[2, 3], [8, 3], [8, 3, 2, 3], [14, 4], [1, 2], [4, 4, 1, 4]]


def mechanism_colours(frame: pd.DataFrame) -> alt.Scale:
    """Colour by mechanism label, each mechanism in its home colour (the Benchmark page's), one distinct colour per
    label (style.colour_scale); grey is left to published figures."""
    pairs = frame.drop_duplicates("mechanism")[["mechanism", "label"]].astype(str).itertuples(index=False)
    return colour_scale(pairs)


def _colour(frame: pd.DataFrame, title: str = "Mechanism") -> alt.Color:
    return alt.Color("label:N", scale=mechanism_colours(frame), title=title)


def _finite(frame: pd.DataFrame, column: str, positive: bool = True) -> pd.DataFrame:
    values = pd.to_numeric(frame[column], errors="coerce")
    keep = values.map(math.isfinite) & ((values > 0) if positive else True)
    return frame[keep]


def _left_out(frame: pd.DataFrame, kept: pd.DataFrame, column: str) -> str:
    """A subtitle line naming the points a log axis cannot show, or ''."""
    gone = frame.loc[frame.index.difference(kept.index)]
    if gone.empty:
        return ""
    what = ", ".join(sorted(set(gone["label"].astype(str) + " (" + gone[column].astype(str) + ")")))
    return f"not drawn (infinite, zero or undefined on a log axis): {what}"


def error_chart(frame: pd.DataFrame, metric: str = "rel_fro", *, title: str | None = None) -> alt.TopLevelMixin:
    """Error `metric` vs the swept parameter value (columns param, value, label, mechanism and the metric), log-log."""
    kept = _finite(frame, metric, positive=metric != "cosine")
    param = str(frame["param"].iloc[0]) if len(frame) else "parameter"
    log_y = metric != "cosine"
    base = alt.Chart(kept).encode(
        x=alt.X("value:Q", title=f"{param} (log₂ scale)", scale=LOG2_X, axis=alt.Axis(format=",")),
        y=alt.Y(f"{metric}:Q", title=METRIC_LABELS[metric] + (", log scale" if log_y else ""),
                scale=alt.Scale(type="log") if log_y else alt.Scale(zero=False)),
        color=_colour(frame))
    tooltip = [alt.Tooltip("label:N", title="Mechanism"), alt.Tooltip("params:N", title="Parameters"),
               alt.Tooltip(f"{metric}:Q", title=METRIC_LABELS[metric], format=".4g")]
    chart = alt.layer(base.mark_line(), base.mark_point(filled=True, size=70).encode(tooltip=tooltip))
    subtitle = [_inputs_line(frame), _left_out(frame, kept, metric)] if len(frame) else []
    return _finish(chart.properties(width=560, height=340, title=alt.TitleParams(
        title or f"{METRIC_LABELS[metric][0].upper()}{METRIC_LABELS[metric][1:]} vs {param}",
        subtitle=[s for s in subtitle if s],
        anchor="start")))


def _inputs_line(frame: pd.DataFrame) -> str:
    r = frame.iloc[0]
    return (f"{r['inputs']} inputs, seed {r['seed']} · n {r['n']} · d_model {r['d_model']} · {r['heads']} heads · "
            f"{r['dtype']} · against float64 exact softmax")


def speed_accuracy_chart(frame: pd.DataFrame) -> alt.TopLevelMixin:
    """Time vs relative error, bubble area = predicted peak memory, the Pareto front (column `pareto`) joined by a
    black line and ringed. Lower-left is better."""
    data = frame.assign(time_ms=frame["time_s"] * 1e3, memory_mib=frame["predicted_bytes"] / MIB,
                        front=frame["pareto"].map({True: "on the Pareto front", False: "dominated"}))
    kept = _finite(data, "rel_fro")
    x = alt.X("time_ms:Q", title="Time per call (ms, in-process quick timing, log scale)", scale=alt.Scale(type="log"))
    y = alt.Y("rel_fro:Q", title=["Relative Frobenius error", "vs softmax (log scale)"],  # two lines: whole in talk
              scale=alt.Scale(type="log"))                                                  # mode's type too
    tooltip = [alt.Tooltip("label:N", title="Mechanism"), alt.Tooltip("params:N", title="Parameters"),
               alt.Tooltip("time_ms:Q", title="Time (ms)", format=".3g"),
               alt.Tooltip("rel_fro:Q", title="Relative error", format=".3g"),
               alt.Tooltip("memory_mib:Q", title="Predicted memory (MiB)", format=".3g"),
               alt.Tooltip("front:N", title="Pareto")]
    bubbles = alt.Chart(kept).mark_circle(opacity=0.65).encode(
        x=x, y=y, color=_colour(frame), tooltip=tooltip,
        size=alt.Size("memory_mib:Q", title="Predicted peak memory (MiB)", scale=alt.Scale(range=[30, 900])))
    front = kept[kept["pareto"]].sort_values("time_ms")
    line = alt.Chart(front).mark_line(color="black", strokeWidth=1.5, interpolate="step-after").encode(x=x, y=y)
    rings = alt.Chart(front).mark_point(color="black", size=260, strokeWidth=1.5).encode(x=x, y=y, tooltip=tooltip)
    subtitle = [_inputs_line(frame), "black line and rings: the Pareto front (nothing is both faster and closer)"]
    note = _left_out(data, kept, "rel_fro")
    return _finish(alt.layer(bubbles, line, rings).properties(width=560, height=380, title=alt.TitleParams(
        "Speed vs accuracy", subtitle=subtitle + ([note] if note else []), anchor="start")))


def _panels(frame: pd.DataFrame, *, value: str, value_title: str, x_title: str, binary: bool) -> alt.TopLevelMixin:
    """Unstyled heatmap of a matrix_frame: queries down, keys across, in order; one panel per head, two to a row."""
    rows = frame.drop_duplicates("i").sort_values("i")["query"].tolist()
    cols = frame.drop_duplicates("j").sort_values("j")["key"].tolist()
    side = _side(frame)
    if binary:
        data = frame.assign(cell=frame[value].astype(bool).map({True: "computed", False: "not computed"}))
        colour = alt.Color("cell:N", legend=None, scale=alt.Scale(domain=["computed", "not computed"],
                                                                  range=["#0072B2", "#EEEEEE"]))
        shown = alt.Tooltip("cell:N", title="cell")
    else:
        data = frame
        signed = bool((frame[value] < 0).any())  # a linear map, not a distribution: diverging around 0
        colour = alt.Color(f"{value}:Q", title=value_title, scale=alt.Scale(
            scheme="redblue", domainMid=0, reverse=True) if signed else alt.Scale(scheme="viridis"))
        shown = alt.Tooltip(f"{value}:Q", title=value_title, format=".3g")
    show_labels = len(cols) <= 64
    base = alt.Chart(data).mark_rect().encode(
        x=alt.X("key:N", sort=cols, title=x_title, axis=alt.Axis(labels=show_labels, labelAngle=-60, ticks=False)),
        y=alt.Y("query:N", sort=rows, title="query", axis=alt.Axis(labels=show_labels, ticks=False)),
        color=colour,
        tooltip=[alt.Tooltip("head:O", title="head"), alt.Tooltip("query:N"), alt.Tooltip("key:N", title=x_title),
                 shown]).properties(width=side, height=side)
    if frame["head"].nunique() > 1:
        return base.facet(facet=alt.Facet("head:O", title=None, header=alt.Header(labelExpr="'head ' + datum.value")),
                          columns=2)  # two panels to a row at most: four heads wrap
    return base


def pattern_chart(cells: pd.DataFrame, weights: pd.DataFrame, *, title: str, subtitle: str | list[str] = "",
                  x_title: str = "key", cells_x_title: str = "key",
                  weights_title: str = "Effective attention") -> alt.TopLevelMixin:
    """The cells a mechanism computes (blue; effective.attention_maps 'cells') and the weights it applies, one panel
    per head ('weights'), each with its own colour scale. Side by side for one head of up to 13 tokens (two panels
    and their axes fit the 850 px column of a 1280 px window with the sidebar open, and the whole chart a 720 px
    window's height); one above the other otherwise (never wider than two panels)."""
    beside = weights["head"].nunique() == 1 and _side(weights) <= SIDE_BY_SIDE_MAX
    lines = (lambda text: textwrap.wrap(text, _side(weights) // 7) or [""]) if beside else (lambda text: text)
    # side by side, a title longer than its panel would widen the chart past the column: wrapped to the panel's
    # width (about 7 px a character at Vega's 13 px title font)
    left = _panels(cells, value="computed", value_title="", x_title=cells_x_title, binary=True).properties(
        title=alt.TitleParams(lines("Cells computed (blue)"), anchor="start"))
    right = _panels(weights, value="weight", value_title="weight", x_title=x_title, binary=False).properties(
        title=alt.TitleParams(lines(weights_title), anchor="start"))
    chart = (alt.hconcat(left, right, spacing=40) if beside else alt.vconcat(left, right, spacing=30)).resolve_scale(
        color="independent")
    return _finish(chart.properties(title=alt.TitleParams(title, subtitle=subtitle, anchor="start")))


SIDE_BY_SIDE_MAX = 290  # px a panel: 13 tokens at 22 px a cell; two such panels, axes and a legend make ~800 px


def _side(frame: pd.DataFrame) -> int:
    """A heatmap panel's side in px: 22 a cell, at least 260 (readable on a wide screen, not a stamp), at most 440."""
    return max(260, min(440, 22 * max(frame["i"].nunique(), frame["j"].nunique())))


def step_frame(step) -> pd.DataFrame:
    """A lesson step's matrix as tidy rows (head, i, j, query, key, value; matrix_frame), −∞ cells `masked` with an
    empty value, `shade` the value drawn (0 for −∞) and `text` what a cell says."""
    m = step.matrix
    finite = torch.isfinite(m)
    frame = matrix_frame(torch.where(finite, m, torch.zeros_like(m)), step.rows, step.columns, value=step.value)
    frame["masked"] = (~finite).flatten().numpy()
    frame["shade"] = frame[step.value]
    frame.loc[frame["masked"], step.value] = float("nan")
    frame["text"] = ["−∞" if hidden else f"{v:.2f}" for v, hidden in zip(frame[step.value], frame["masked"])]
    return frame


def step_chart(step, *, cell: int = 44, numbers: bool = True) -> alt.TopLevelMixin:
    """One step of lesson.steps as a heatmap per head, `cell` pixels a side: rows down, columns across, each cell's
    value written in it (`numbers`), −∞ cells grey and written "−∞"; signed values on a diverging scale around 0."""
    frame = step_frame(step)
    big = float(frame["shade"].abs().max()) or 1.0
    frame["dark"] = frame["shade"].abs() > 0.55 * big  # white text on the darkest cells
    signed = bool((frame[step.value] < 0).any())
    scale = (alt.Scale(scheme="redblue", domainMid=0, reverse=True, domain=[-big, big]) if signed else
             alt.Scale(scheme="blues", domain=[0, big]))
    x = alt.X("key:N", sort=step.columns, title=None, axis=alt.Axis(labelAngle=-45, orient="top"))
    y = alt.Y("query:N", sort=step.rows, title=None)
    tooltip = [alt.Tooltip("head:O"), alt.Tooltip("query:N", title="row"), alt.Tooltip("key:N", title="column"),
               alt.Tooltip("text:N", title=step.value)]
    cells = alt.Chart(frame).encode(x=x, y=y)
    layers = [cells.mark_rect(stroke="white", strokeWidth=1).encode(
                  color=alt.condition("datum.masked", alt.value("#CCCCCC"), alt.Color(
                      "shade:Q", scale=scale, title=step.value)), tooltip=tooltip)]
    if numbers:
        layers.append(cells.mark_text().encode(
            text="text:N", color=alt.condition("datum.dark", alt.value("white"), alt.value("black"))))
    chart = alt.layer(*layers).properties(width=cell * len(step.columns), height=cell * len(step.rows))
    if step.matrix.shape[0] > 1:  # panels numbered from 1 (matrix_frame); named by step.panels when given
        names = json.dumps(["", *step.panels]) + "[datum.value]" if step.panels else "'head ' + datum.value"
        chart = chart.facet(column=alt.Column("head:O", title=None, header=alt.Header(labelExpr=names)))
    # "pad": the cells keep their size and the axes and legend are added around them (a page's "fit" squeezed all
    # of it into the cells' width)
    return _finish(chart.properties(title=alt.TitleParams(step.title, subtitle=[step.shape], anchor="start",
                                                          limit=0),  # never cut short
                                    autosize=alt.AutoSizeParams(type="pad")))


def n_axis(ns: pd.Series) -> alt.Axis:
    """Ticks at powers of two (every other one past 16 octaves), labelled 512, 1K, 128K, 1M with K = 1024."""
    if ns.empty:
        return alt.Axis()
    low, high = int(math.log2(max(1, ns.min()))), math.ceil(math.log2(ns.max()))
    step = 1 if high - low <= 10 else 2
    expr = ("datum.value >= 1048576 ? format(datum.value / 1048576, '~g') + 'M' : datum.value >= 1024 ? "
            "format(datum.value / 1024, '~g') + 'K' : format(datum.value, '~g')")
    return alt.Axis(values=[2 ** e for e in range(low, high + 1, step)], labelExpr=expr)


GENERATION_METRICS = ("cache_bytes", "tokens_per_s")  # theory.generation_costs: per context length n


def theory_chart(frame: pd.DataFrame, metric: str = "flops", *, budgets: dict[str, float] | None = None,
                 legend: str = "Mechanism") -> alt.TopLevelMixin:
    """A theory column (flops, total_bytes, memory_bytes, predicted_time_s) vs n, log-log, from theory.costs; or a
    generation column (cache_bytes, tokens_per_s) vs the context length, from theory.generation_costs.

    budgets (name → bytes), for a memory metric: horizontal rules, so the chart shows where each mechanism stops
    fitting. Invalid points (status ≠ 'ok') are left out and named in the subtitle. `legend`: what a line is
    (planner.curves draws models).
    """
    names = {"flops": "FLOPs (theory, from the specs)", "memory_bytes": "Predicted peak above inputs (GiB)",
             "total_bytes": "Inputs + predicted peak (GiB)",
             "predicted_time_s": "Predicted time (s), extrapolated",
             "cache_bytes": "Cache of the whole model (GiB)",
             "tokens_per_s": "Predicted tokens per second, extrapolated"}
    scale = 2.0 ** 30 if metric.endswith("bytes") else 1.0
    data = frame[frame["status"] == "ok"].assign(y=lambda f: f[metric] / scale)
    kept = _finite(data, "y")
    length = "Context length" if metric in GENERATION_METRICS else "Sequence length"
    x = alt.X("n:Q", title=f"{length} n (tokens, log₂ scale; K = 1024)", scale=LOG2_X, axis=n_axis(kept["n"]))
    y = alt.Y("y:Q", title=names[metric], scale=alt.Scale(type="log"),
              axis=alt.Axis(format="~s" if metric == "flops" else ",~g"))  # FLOPs as 1G, 1T, 1P
    base = alt.Chart(kept).encode(x=x, y=y, color=_colour(frame, legend))
    layers = [base.mark_line(), base.mark_point(filled=True, size=30).encode(
        tooltip=[alt.Tooltip("label:N", title=legend), alt.Tooltip("n:Q", format=","),
                 alt.Tooltip("y:Q", title=names[metric], format=".4g")])]
    if budgets and metric.endswith("bytes"):
        rules = pd.DataFrame({"budget": list(budgets), "y": [b / scale for b in budgets.values()]})
        rule = alt.Chart(rules).encode(y="y:Q")
        layers += [rule.mark_rule(color="black", strokeDash=[4, 3]),
                   alt.Chart(budget_labels(budgets, scale)).mark_text(align="left", dx=4, dy=-6, x=0).encode(
                       y="y:Q", text="budget:N")]
    invalid = sorted(set(frame.loc[frame["status"] != "ok", "label"]))
    subtitle = [f"not applicable at some n: {', '.join(invalid)}"] if invalid else []
    if together := coinciding(kept, "y"):
        subtitle.append("one line hides another (the same values): " + "; ".join(" = ".join(g) for g in together))
    if metric == "predicted_time_s":
        subtitle.insert(0, EXTRAPOLATION)
    if metric == "tokens_per_s":
        subtitle[0:0] = DECODE_EXTRAPOLATION.split("; ")  # two lines
    if budgets and metric.endswith("bytes"):
        subtitle.append("dashed: memory budgets, in GiB (a '24 GB' GPU holds 24 GiB)")
    return _finish(alt.layer(*layers).properties(width=600, height=380, title=alt.TitleParams(
        names[metric].split(" (")[0].removesuffix(", extrapolated") + f" vs {length.lower()}", subtitle=subtitle,
        anchor="start")))


def coinciding(frame: pd.DataFrame, value: str) -> list[list[str]]:
    """The groups of labels whose lines lie on one another (the same value at every n, to 1 part in 10⁶), each in
    the frame's order; a line drawn last hides the others, so the chart says so."""
    lines = {name: g.set_index("n")[value].sort_index() for name, g in frame.groupby("label", sort=False)}
    groups: list[list[str]] = []
    for name, line in lines.items():
        for group in groups:
            other = lines[group[0]]
            if line.index.equals(other.index) and np.allclose(line.to_numpy(), other.to_numpy(), rtol=1e-6, atol=0):
                group.append(name)
                break
        else:
            groups.append([name])
    return [g for g in groups if len(g) > 1]


def budget_labels(budgets: dict[str, float], scale: float, apart: float = 1.4) -> pd.DataFrame:
    """One label per group of budgets closer than a factor `apart` (their texts would print on one another on a log
    axis): 'this device · 24 GB GPU' at the group's lowest rule."""
    rows: list[dict] = []
    for name, value in sorted(budgets.items(), key=lambda kv: kv[1]):
        if rows and value / scale < rows[-1]["y"] * apart:
            rows[-1]["budget"] += f" · {name}"
        else:
            rows.append({"budget": name, "y": value / scale})
    return pd.DataFrame(rows, columns=["budget", "y"])


def bar_domain(longest: float, low: float, room: float = 0.7) -> tuple[float, float]:
    """A log axis from `low` on which the longest bar ends within `room` of the width (at the decade above it, or
    earlier): the label written past a bar's end stays inside the plot."""
    return low, max(10.0 ** math.ceil(math.log10(longest)), low * (longest / low) ** (1 / room))


def fit_chart(table: pd.DataFrame) -> alt.TopLevelMixin:
    """Largest n that fits each budget (theory.fit_table), one bar per mechanism, one panel per budget."""
    data = table[table["largest_n"] > 0]
    low = 10.0 ** math.floor(math.log10(data["largest_n"].min() / 3)) if len(data) else 1.0
    data = data.assign(start=low)  # bars on a log axis start above 0: a decade below the shortest
    domain = list(bar_domain(float(data["largest_n"].max()), low)) if len(data) else [low, 10 * low]
    base = alt.Chart(data).encode(
        y=alt.Y("label:N", title=None, sort=list(dict.fromkeys(table["label"]))),
        x=alt.X("largest_n:Q", title="Largest n that fits (log scale)", axis=alt.Axis(format="~s", values=[
            10.0 ** e for e in range(round(math.log10(low)), math.floor(math.log10(domain[1])) + 1)]),  # decades
                scale=alt.Scale(type="log", domain=domain, nice=False)),
        color=alt.Color("label:N", scale=mechanism_colours(table), legend=None))
    bars = base.mark_bar().encode(x2="start:Q", tooltip=[alt.Tooltip("label:N", title="Mechanism"),
                                           alt.Tooltip("budget:N"), alt.Tooltip("largest_n:Q", format=",")])
    text = base.mark_text(align="left", dx=3).encode(text=alt.Text("largest_n:Q", format=","))
    chart = alt.layer(bars, text).properties(width=460, height=20 * table["label"].nunique())
    nothing = sorted(set(table.loc[table["largest_n"] == 0, "label"]))
    subtitle = "inputs + predicted forward peak ≤ budget" + (f"; fits nowhere: {', '.join(nothing)}" if nothing
                                                             else "")
    return _finish(chart.facet(row=alt.Row("budget:N", title=None, sort=list(dict.fromkeys(table["budget"])),
                                           header=alt.Header(labelAngle=0, labelAlign="left", labelFontWeight="bold")
                                           )).properties(title=alt.TitleParams(
            "What fits in memory", subtitle=subtitle, anchor="start")))


RUN_METRICS = {"time_median_s": ("time_ms", 1e-3, "Time per call (ms, median)"),
               "peak_bytes": ("memory_mib", MIB, "Peak memory above inputs (MiB)")}
GENERATE_TITLES = {"time_median_s": "Time per generated token (ms, median)", "peak_bytes": "Cache memory (MiB)"}
RELATIVE_TITLES = {"time_median_s": "Speed-up vs {baseline} (×, higher is faster)",
                   "peak_bytes": "Memory ÷ {baseline}'s (lower is leaner)"}


def _measured(frame: pd.DataFrame, y: str, y_title: str, extra_ns: pd.Series | None = None) -> list[alt.Chart]:
    """Lines and points of runs: colour = mechanism, shape = run · machine, log-log (ticks also cover extra_ns)."""
    kept = _finite(frame, y)
    ns = kept["n"] if extra_ns is None else pd.concat([kept["n"], extra_ns])
    x = alt.X("n:Q", title="Sequence length n (tokens, log₂ scale; K = 1024)", scale=LOG2_X, axis=n_axis(ns))
    base = alt.Chart(kept).encode(x=x, y=alt.Y(f"{y}:Q", title=y_title, scale=alt.Scale(type="log")),
                                  color=_colour(frame))
    tooltip = [alt.Tooltip("label:N", title="Mechanism"), alt.Tooltip("source:N", title="Run · machine"),
               alt.Tooltip("n:Q", format=","), alt.Tooltip(f"{y}:Q", title=y_title, format=".4g")]
    return [base.mark_line(strokeWidth=1.5).encode(detail="series:N"),
            base.mark_point(filled=True, size=70).encode(shape=alt.Shape("source:N", title="Run · machine"),
                                                          tooltip=tooltip)]


def runs_chart(frame: pd.DataFrame, metric: str = "time_median_s") -> alt.TopLevelMixin:
    """Several runs overlaid (reference.runs_frame): metric vs n, colour = mechanism, shape = run · machine."""
    column, divisor, y_title = RUN_METRICS[metric]
    length = "sequence length"
    if generating(frame):  # runs of generate mode: a token's step against a context, the cache's bytes
        y_title, length = GENERATE_TITLES[metric], "context length"
    data = frame.assign(**{column: frame[metric] / divisor,
                           "series": frame["source"].astype(str) + " · " + frame["label"].astype(str)})
    return _finish(alt.layer(*_measured(data, column, y_title)).properties(width=620, height=400, title=alt.TitleParams(
        f"{y_title.split(' (')[0]} vs {length}, {data['source'].nunique()} runs", anchor="start",
        subtitle="colour: mechanism · shape: run and machine")))


def ratio_domain(ratios: pd.Series, pad: float = 1.15) -> tuple[float, float]:
    """The ratio axis: the data and the line at 1, padded by `pad` (log scale); Vega's nice log domain ran 1 to 10
    for ratios of 1.0 to 1.6."""
    low, high = (min(float(ratios.min()), 1.0), max(float(ratios.max()), 1.0)) if len(ratios) else (1.0, 1.0)
    return low / pad, high * pad


def reference_layer(reference: pd.DataFrame, *, x: str = "n", y: str = "value") -> alt.LayerChart:
    """Published figures (reference.relative) as grey lines, one dash pattern per method, named in a legend of
    their own (end labels at one point overlapped), with hollow diamonds, to layer on a relative speed or memory
    chart whose x and y fields are `x` and `y`. Each paper's own baseline (1 by definition) is left out. Unstyled,
    so it can still be layered; it adds no colour or shape scale, so it never disturbs the measured legend."""
    data = reference[reference["method"] != reference["baseline"]].rename(columns={"n": x, "value": y})
    data = data.assign(what=data["method"] + " · " + data["short"] + " (" + PUBLISHED + ")",
                       tag=data["method"] + " (" + data["short"].str.split(" · ").str[0] + ")")
    ends = data.sort_values(x).groupby(["source", "method"], as_index=False).last()
    enc = {"x": alt.X(f"{x}:Q"), "y": alt.Y(f"{y}:Q")}
    tooltip = [alt.Tooltip("what:N", title="Published"), alt.Tooltip(f"{x}:Q", title="n", format=","),
               alt.Tooltip(f"{y}:Q", title="relative to standard attention", format=".3g"),
               alt.Tooltip("setup:N", title="Setup"), alt.Tooltip("citation:N", title="Source")]
    tags = list(dict.fromkeys(ends["tag"]))
    dash = alt.StrokeDash("tag:N", title=f"Grey: {PUBLISHED}", scale=alt.Scale(
        domain=tags, range=[REFERENCE_DASHES[i % len(REFERENCE_DASHES)] for i in range(len(tags))]),
        legend=alt.Legend(symbolStrokeColor=REFERENCE_GREY, symbolStrokeWidth=2))
    return alt.layer(
        alt.Chart(data).mark_line(color=REFERENCE_GREY, strokeWidth=1.5).encode(detail="what:N", strokeDash=dash,
                                                                                 **enc),
        alt.Chart(data).mark_point(shape="diamond", color=REFERENCE_GREY, filled=False, size=60).encode(
            tooltip=tooltip, **enc))


def relative_chart(frame: pd.DataFrame, metric: str = "time_median_s", *, baseline_label: str = "softmax",
                   reference: pd.DataFrame | None = None) -> alt.TopLevelMixin:
    """Each mechanism relative to a baseline per run (reference.relative_to_baseline): colour = mechanism,
    shape = run · machine; `reference` (reference.relative) overlays published figures in grey."""
    y_title = RELATIVE_TITLES[metric].format(baseline=baseline_label)
    data = frame.assign(series=frame["source"].astype(str) + " · " + frame["label"].astype(str))
    subtitle = ["colour: mechanism · shape: run and machine"]
    if reference is not None and len(data):  # published points within an octave of the measured range
        reference = reference[reference["n"].between(data["n"].min() / 2, data["n"].max() * 2)]
    layers = _measured(data, "value", y_title, extra_ns=reference["n"] if reference is not None else None)
    if reference is not None and len(reference):
        layers.append(reference_layer(reference))
        sources = "; ".join(sorted(set(reference["short"])))
        subtitle.append(f"grey, one dash pattern per method: {PUBLISHED} ({sources}), relative to each paper's "
                        "standard attention")
    title = "Speed-up" if metric == "time_median_s" else "Memory"
    return _finish(alt.layer(*layers).properties(width=620, height=400, title=alt.TitleParams(
        f"{title} relative to {baseline_label}", subtitle=subtitle, anchor="start")))


def downloads(chart: alt.TopLevelMixin, frame: pd.DataFrame, stem: str) -> list[tuple[str, object, str, str]]:
    """What a page offers for one chart: (label, zero-argument function making the bytes, file name, MIME type)
    for PNG, SVG and the chart's data as CSV. Functions, so nothing is rendered until a button is pressed."""
    stem = file_stem(stem, 80)
    return [("PNG", partial(export.chart_png, chart), f"{stem}.png", "image/png"),
            ("SVG", partial(export.chart_svg, chart), f"{stem}.svg", "image/svg+xml"),
            ("CSV", partial(csv_bytes, frame), f"{stem}.csv", "text/csv")]
