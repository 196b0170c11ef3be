"""The planner's charts (pure Altair: DataFrame or chart in, chart out): the mark of a crossover, decode and prefill
by the roofline against the context, one model's designs side by side, and its layer pattern with each kind's mask."""
from __future__ import annotations

import altair as alt
import pandas as pd

from attn_core.charts.style import MAX_COLOURS, REPEAT_DASH, colour_scale, repeated, styled
from attn_core.engine.untrusted import vega_title
from attn_core.insight.charts import n_axis


def marked(chart: alt.LayerChart, n: int | None, text: str) -> alt.LayerChart:
    """A layered chart over the context n (charts.insight.theory_chart) with a dotted vertical rule at `n` and `text`
    at its top; the chart itself when n is None (nothing to mark)."""
    if n is None:
        return chart
    base = alt.Chart(pd.DataFrame({"n": [n], "text": [text]})).encode(x="n:Q")
    made = chart.copy(deep=True)
    made.layer = [*made.layer, base.mark_rule(color="black", strokeDash=[2, 2]),
                  base.mark_text(align="left", dx=4, y=10).encode(text="text:N")]
    return made


PREDICTED = "predicted (roofline), not measured"
_ROOF_METRICS = {"decode_tokens_per_s": ("Decode tokens/s", ",~g"), "prefill_seconds": ("Prefill time (s)", ",~g")}


def _house(chart: alt.TopLevelMixin) -> alt.TopLevelMixin:
    """The house look, as the insight charts have it (room above the title)."""
    return styled(chart).properties(padding={"top": 10, "left": 5, "right": 5, "bottom": 5})


def _models(frame: pd.DataFrame, column: str, most: int | None = None) -> alt.Scale:
    """A colour per model or design, in the house palette (style.colour_scale, none of them a mechanism); with
    `most`, at most that many colours, the lines past them dashed by the chart (`style.repeated`)."""
    lines = (("", str(name)) for name in dict.fromkeys(frame[column]))
    return colour_scale(lines) if most is None else colour_scale(lines, most)


def roofline_chart(frame: pd.DataFrame, metric: str = "decode_tokens_per_s", *, device: str = "") -> alt.LayerChart:
    """A roofline column (decode_tokens_per_s or prefill_seconds) against the context, log-log, a line a model, from
    compare.speed_curves; a ringed point on each line where its cache read passes its weights read (the row marked
    `crossover`). Subtitle: the device and 'predicted (roofline), not measured'."""
    title, fmt = _ROOF_METRICS[metric]
    data = frame.assign(y=frame[metric].astype(float), crossover=frame["crossover"].astype(bool))
    x = alt.X("context:Q", title="Context n (tokens, log₂ scale; K = 1024)", scale=alt.Scale(type="log", base=2),
              axis=n_axis(data["context"]))
    y = alt.Y("y:Q", title=title, scale=alt.Scale(type="log"), axis=alt.Axis(format=fmt))
    scale = _models(data, "model", MAX_COLOURS)  # nine models: eight colours, the ninth dashed
    colour = alt.Color("model:N", scale=scale, title="Model",
                       legend=alt.Legend(labelLimit=0, orient="bottom", direction="vertical"))
    dashed = repeated(scale)
    tooltip = [alt.Tooltip("model:N"), alt.Tooltip("context:Q", format=","), alt.Tooltip("y:Q", title=title,
                                                                                      format=".4g"),
               alt.Tooltip("bound:N", title="decode bound")]
    base = alt.Chart(data).encode(x=x, y=y, color=colour)
    crossed = alt.Chart(data[data["crossover"]]).encode(x=x, y=y, color=colour)
    dash = alt.condition(alt.FieldOneOfPredicate("model", dashed), alt.value(REPEAT_DASH), alt.value([1, 0])) \
        if dashed else alt.value([1, 0])
    layers = [base.mark_line().encode(strokeDash=dash), base.mark_point(filled=True, size=25).encode(tooltip=tooltip),
              crossed.mark_point(size=160, strokeWidth=2, shape="diamond").encode(tooltip=tooltip)]
    where = f" on {device}" if device else ""
    subtitle = [f"{PREDICTED}{where}: max(bytes ÷ bandwidth, FLOPs ÷ FLOP/s) a step",
                "◇ where the cache read passes the weights read"]
    return _house(alt.layer(*layers).properties(width=600, height=340, title=alt.TitleParams(
        f"{title.split(' (')[0]} against the context", subtitle=subtitle, anchor="start")))


_COMPARE = {"cache_per_token": "Cache a token of context (KiB)", "read_bytes": "Bytes a decode step reads (GiB)",
            "decode_tokens_per_s": "Decode tokens/s", "prefill_seconds": "Prefill time (s)"}


def compare_chart(table: pd.DataFrame, metric: str = "cache_per_token", *, context: int | None = None,
                  device: str = "") -> alt.Chart:
    """One bar a design (compare.compare's rows) of `metric`, the design named in full beside its bar."""
    scale = {"cache_per_token": 1024.0, "read_bytes": 2.0 ** 30}.get(metric, 1.0)
    data = table.assign(value=table[metric].astype(float) / scale)
    title = _COMPARE[metric]
    bars = alt.Chart(data).mark_bar().encode(
        y=alt.Y("design:N", sort=list(data["design"]), title=None, axis=alt.Axis(labelLimit=0)),
        x=alt.X("value:Q", title=title), color=alt.Color("design:N", scale=_models(data, "design"), legend=None),
        tooltip=[alt.Tooltip("design:N"), alt.Tooltip("model:N"), alt.Tooltip("value:Q", title=title, format=".4g")])
    labels = bars.mark_text(align="left", dx=4).encode(text=alt.Text("value:Q", format=".3~g"))
    at = f" at {context:,} tokens" if context else ""
    where = f" on {device}" if device else ""
    return _house(alt.layer(bars, labels).properties(width=480, height=28 * len(data), title=alt.TitleParams(
        f"{title.split(' (')[0]}: one model, its designs{at}", subtitle=[f"{PREDICTED}{where}"], anchor="start",
        limit=0)))


def layers_chart(frame: pd.DataFrame, *, title: str = "") -> alt.VConcatChart:
    """Above: the layers in order, one cell a layer coloured by kind (pattern.pattern_frame's 'order' rows); below:
    each kind's mask at a small n, query i down, key j across, a cell filled where i sees j ('mask' rows)."""
    order = frame.loc[frame["part"] == "order", ["layer", "kind", "read"]].astype({"layer": int})
    cells = frame.loc[frame["part"] == "mask", ["kind", "i", "j", "seen", "how"]].astype({"i": int, "j": int})
    kinds = alt.Color("kind:N", scale=_models(order if len(order) else cells, "kind"), title="Kind",
                      legend=alt.Legend(labelLimit=0, orient="bottom", direction="vertical"))
    read = bool(order["read"].all()) if len(order) else False
    strip = alt.Chart(order).mark_rect(stroke="white", strokeWidth=0.5).encode(
        x=alt.X("layer:O", title="layer (first to last)", axis=alt.Axis(labelAngle=0, labelOverlap=True)),
        color=kinds, tooltip=[alt.Tooltip("layer:O"), alt.Tooltip("kind:N")]).properties(
        width=max(300, min(720, 12 * len(order))), height=28, title=alt.TitleParams(
            "Layers in order", subtitle=["read from its config.json" if read else
                                         "order assumed: each kind spread evenly (a model file keeps counts only)"],
            anchor="start"))
    n = int(cells["i"].max()) + 1 if len(cells) else 0
    panel = alt.Chart(cells).mark_rect(stroke="white", strokeWidth=0.5).encode(
        x=alt.X("j:O", title="key j", axis=alt.Axis(values=list(range(0, n, 4)), labelAngle=0)),
        y=alt.Y("i:O", title="query i", axis=alt.Axis(values=list(range(0, n, 4)))),
        color=alt.condition("datum.seen", alt.value("#1f77b4"), alt.value("#eeeeee")),
        tooltip=[alt.Tooltip("kind:N"), alt.Tooltip("how:N"), alt.Tooltip("i:O"), alt.Tooltip("j:O"),
                 alt.Tooltip("seen:N")]).properties(width=9 * n, height=9 * n)
    grid = panel.facet(facet=alt.Facet("kind:N", title=None, header=alt.Header(labelLimit=0)), columns=3).properties(
        title=alt.TitleParams(f"Each kind's mask at n = {n} (blue: query i sees key j)", anchor="start"))
    return _house(alt.vconcat(strip, grid, spacing=24).properties(title=alt.TitleParams(vega_title(title),
                                                                                       anchor="start")))
