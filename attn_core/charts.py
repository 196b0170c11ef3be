"""Scaling charts of a sweep: measured points, dashed theory curves, crossovers and skipped points (pure Altair)."""
from __future__ import annotations

import altair as alt
import pandas as pd

from .mechanisms import MECHANISMS

METRICS = {
    # metric column → (display column, unit, divisor from the stored unit, what the chart calls it)
    "time_median_s": ("time_ms", "ms", 1e-3, "Time per call"),
    "peak_bytes": ("memory_mib", "MiB", 2.0**20, "Peak memory above inputs"),
}
# One colour per mechanism, the same in every chart (Okabe–Ito plus brown); unknown keys fall back to grey.
COLOURS = ["#D55E00", "#0072B2", "#009E73", "#CC79A7", "#56B4E9", "#8C564B", "#E69F00", "#000000"]
OTHER_COLOUR = "#7F7F7F"
FONT = "DejaVu Sans, Liberation Sans, Arial, sans-serif"
DASHES = [[8, 4], [2, 3], [12, 4, 2, 4], [4, 4], [16, 6]]
THEORY_HOW = ["Dashed: theory c·f(n), c fitted to the", "measured points (least squares, log space)"]


def series(df: pd.DataFrame) -> pd.Series:
    """The line each row belongs to: the mechanism's label, plus the mask when a frame mixes causal and bidirectional."""
    label = df["label"].astype(str)
    if "causal" in df and df["causal"].nunique() > 1:
        return label + df["causal"].map({True: " · causal", False: " · bidirectional"})
    return label


def colour_scale(df: pd.DataFrame) -> alt.Scale:
    """Colour by mechanism label, each mechanism keeping its catalogue colour."""
    labels = df.drop_duplicates("mechanism")[["mechanism", "label"]] if len(df) else pd.DataFrame(columns=["mechanism", "label"])
    order = list(MECHANISMS)
    domain, colours = [], []
    for key, label in sorted(labels.itertuples(index=False), key=lambda kl: (order.index(kl[0]) if kl[0] in order else 99)):
        domain.append(label)
        colours.append(COLOURS[order.index(key) % len(COLOURS)] if key in order else OTHER_COLOUR)
    return alt.Scale(domain=domain, range=colours)


def _ms(seconds: float) -> str:
    return f"{seconds * 1e3:.4g} ms"


def _mib(nbytes: float) -> str:
    return f"{nbytes / 2**20:,.3f} MiB ({int(nbytes):,} B)"


def points_frame(df: pd.DataFrame, metric: str, log: bool = True) -> pd.DataFrame:
    """One row per point with the plotted value in display units and the tooltip strings; `drawn` is False for points
    that cannot be placed (not measured, or ≤ 0 on a log axis) and `why` then says why."""
    column, _, divisor, _ = METRICS[metric]
    out = df.copy()
    out["series"] = series(df)
    out["mask"] = out["causal"].map({True: "causal", False: "bidirectional"})
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


def scaling_chart(df: pd.DataFrame, metric: str = "time_median_s", *, theory: pd.DataFrame | None = None,
                  crossovers: pd.DataFrame | None = None, log: bool = True, title: str | None = None,
                  subtitle: str | list[str] | None = None, talk: bool = False, width: int = 640,
                  height: int | None = None) -> alt.LayerChart:
    """Metric vs n for every mechanism of a results frame (the contract's columns).

    `theory`: analysis.theory_curves(df, metric) (mechanism, curve, n, value in the metric's unit), drawn dashed.
    `crossovers`: analysis.crossovers(df, metric) (mechanism, baseline, n_star, note), drawn as labelled rules.
    Points that were skipped or failed sit on the bottom edge as crosses whose tooltip gives the reason.
    """
    column, unit, divisor, name = METRICS[metric]
    pts = points_frame(df, metric, log)
    cscale = colour_scale(pts)
    colour = alt.Color("label:N", scale=cscale, title="Mechanism (measured, solid)")
    x = alt.X("n:Q", title="Sequence length n (tokens)" + (", log₂ scale" if log else ""),
              scale=alt.Scale(type="log", base=2) if log else alt.Scale(zero=False), axis=alt.Axis(format=","))
    y = alt.Y(f"{column}:Q", title=_y_title(df, metric, unit, name, log),
              scale=alt.Scale(type="log") if log else alt.Scale(zero=True))
    drawn = pts[pts["drawn"]]
    mixed = pts["mask"].nunique() > 1
    shape = alt.Shape("mask:N", title="Mask") if mixed else alt.value("circle")
    base = alt.Chart(drawn).encode(x=x, y=y, color=colour)
    layers = [base.mark_line(strokeWidth=4 if talk else 2).encode(detail="series:N"),
              base.mark_point(filled=True, size=160 if talk else 60, opacity=1).encode(shape=shape,
                                                                                        tooltip=TOOLTIP)]
    missing = pts[~pts["drawn"]]
    if len(missing):
        layers.append(alt.Chart(missing).mark_point(shape="cross", filled=True, size=220 if talk else 110,
                                                    opacity=0.9).encode(
            x=x, y=alt.value({"expr": "height - 6"}), color=colour,
            tooltip=[alt.Tooltip("series:N", title="Mechanism"), alt.Tooltip("n:Q", title="Sequence length n",
                                                                             format=","),
                     alt.Tooltip("why:N", title="Not drawn"), alt.Tooltip("params:N", title="Parameters")]))
    if theory is not None and len(theory):
        layers.append(_theory_layer(theory, pts, x, y, cscale, column, divisor, talk))
    if crossovers is not None and len(crossovers):
        layers.extend(_crossover_layers(crossovers, pts, x, cscale, talk))
    chart = alt.layer(*layers).properties(width=width, height=height or (480 if talk else 380))
    chart = chart.properties(title=alt.TitleParams(title or default_title(df, metric),
                                                   subtitle=subtitle if subtitle is not None else default_subtitle(df),
                                                   anchor="start"))
    return styled(chart, talk)


def _theory_layer(theory, pts, x, y, cscale, column, divisor, talk):
    names = pts.drop_duplicates("mechanism").set_index("mechanism")["series"]
    curves = theory[theory["mechanism"].isin(names.index)].copy()
    curves["series"] = curves["mechanism"].map(names)
    curves["label"] = curves["mechanism"].map(pts.drop_duplicates("mechanism").set_index("mechanism")["label"])
    curves[column] = curves["value"] / divisor
    curves = curves[curves[column] > 0]
    return alt.Chart(curves).mark_line(strokeDash=[6, 4], strokeWidth=3 if talk else 1.5, opacity=0.8).encode(
        x=x, y=y, color=alt.Color("label:N", scale=cscale),
        strokeDash=alt.StrokeDash("curve:N", title=THEORY_HOW, scale=alt.Scale(range=DASHES)),
        detail="mechanism:N",
        tooltip=[alt.Tooltip("series:N", title="Mechanism"), alt.Tooltip("curve:N", title="Theory curve"),
                 alt.Tooltip("n:Q", title="n", format=","), alt.Tooltip(f"{column}:Q", title="Value", format=".4g")])


def _crossover_layers(crossovers, pts, x, cscale, talk):
    names = pts.drop_duplicates("mechanism").set_index("mechanism")["series"]
    found = crossovers[crossovers["n_star"].notna() & crossovers["mechanism"].isin(names.index)].copy()
    if found.empty:
        return []
    baseline = pts.drop_duplicates("mechanism").set_index("mechanism")["label"]
    found["series"] = found["mechanism"].map(names)
    found["vs"] = found["baseline"].map(baseline).fillna(found["baseline"])
    found["n"] = found["n_star"]
    found["text"] = ["n* ≈ " + f"{n:,.0f}" for n in found["n_star"]]
    found["line"] = [f"{s} overtakes {b} at n* ≈ {n:,.0f}" for s, b, n in
                     zip(found["series"], found["vs"], found["n_star"])]
    colour = alt.Color("label:N", scale=cscale)
    found["label"] = found["mechanism"].map(baseline)
    rule = alt.Chart(found).mark_rule(strokeWidth=3 if talk else 1.5).encode(
        x=x, color=colour, tooltip=[alt.Tooltip("line:N", title="Crossover"), alt.Tooltip("note:N", title="How")])
    text = alt.Chart(found).mark_text(align="left", dx=4, dy=0, baseline="top", angle=0,
                                      fontSize=18 if talk else 11, fontWeight="bold").encode(
        x=x, y=alt.value(4), text="text:N", color=colour)
    return [rule, text]


def _y_title(df, metric, unit, name, log):
    scale = ", log scale" if log else ""
    if metric == "peak_bytes":
        methods = sorted(set(df["memory_method"].dropna().astype(str)) - {""}) if "memory_method" in df else []
        return [f"{name} ({unit})", f"{' / '.join(methods) or 'not measured yet'}{scale}"]
    return [f"{name} ({unit})", f"median wall-clock{scale}"]


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
    return (f"{r['device']} · {r['dtype']} · batch {r['batch']} · {r['heads']} heads · d_model {r['d_model']} "
            f"(head dim {r['head_dim']}) · {r['threads']} threads")


def styled(chart: alt.TopLevelMixin, talk: bool = False) -> alt.TopLevelMixin:
    """House look, with installed fonts so exports show text; talk: large type and thick strokes for a projector."""
    big = 1.6 if talk else 1.0
    return (chart.configure(font=FONT, background="white")
            .configure_title(fontSize=round(17 * big), subtitleFontSize=round(12 * big), color="#000000",
                             subtitleColor="#222222")
            .configure_axis(labelFontSize=round(12 * big), titleFontSize=round(13 * big), labelColor="#000000",
                            titleColor="#000000", gridColor="#DDDDDD", domainColor="#000000", tickColor="#000000")
            .configure_legend(labelFontSize=round(12 * big), titleFontSize=round(12 * big), labelColor="#000000",
                              titleColor="#000000", orient="right", labelLimit=0, titleLimit=0, symbolStrokeWidth=2)
            .configure_view(stroke="#000000" if talk else "#BBBBBB"))
