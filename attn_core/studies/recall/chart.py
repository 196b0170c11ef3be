"""Associative recall's charts: accuracy while training, and recall against what a mechanism holds and the time it
took (pure Altair: the frames of attn_core.studies.recall.mqar in, a chart out)."""
from __future__ import annotations

import json
import math

import altair as alt
import pandas as pd

from attn_core.engine.analysis import series_name
from attn_core.engine.problem import sharing
from attn_core.insight.charts import _finish, _finite
from attn_core.charts.style import REFERENCE_GREY, colour_scale, wrapped
from attn_core.mechanisms import MECHANISMS


def display_name(name: str) -> str:
    """The name every other page gives a CLI setting: 'gated_deltanet:chunk=32' → 'Gated DeltaNet (chunk=32)',
    'sdpa:kv_heads=1' → 'Softmax (fused SDPA) · MQA' (analysis.series_name; parameters at their default are left
    out). A key outside the catalogue (a saved file's) is kept as written."""
    key, *pairs = str(name).split(":")
    if key not in MECHANISMS:
        return str(name)
    params = {k: _value(v) for k, _, v in (pair.partition("=") for pair in pairs)}
    kv_heads = params.pop("kv_heads", None)
    shown = series_name(key, MECHANISMS[key].label, json.dumps(params))
    return shown if kv_heads is None else f"{shown} · {sharing(0, int(kv_heads))}"


def _value(text: str):
    """A parameter's value as the CLI wrote it: a number where it reads as one (so '64' equals a default of 64)."""
    try:
        return json.loads(text)
    except ValueError:
        return text


def named(frame: pd.DataFrame) -> pd.DataFrame:
    """`frame` with `name`, the display name of its `mechanism` column."""
    return frame.assign(name=[display_name(m) for m in frame["mechanism"]])


def _colour(frame: pd.DataFrame) -> alt.Color:
    """One colour per mechanism setting, by its display name, its mechanism's home colour first."""
    pairs = frame.drop_duplicates("name")[["key", "name"]].astype(str).itertuples(index=False)
    return alt.Color("name:N", scale=colour_scale(pairs), title="Mechanism")


def _chance(chance: float | None) -> list[alt.Chart]:
    if chance is None or not math.isfinite(chance):
        return []
    rule = pd.DataFrame({"accuracy": [chance], "what": [f"chance, {chance:.3f}"]})
    return [alt.Chart(rule).mark_rule(color=REFERENCE_GREY, strokeDash=[4, 4]).encode(
        y="accuracy:Q", tooltip=alt.Tooltip("what:N", title="Guessing a value"))]


def curves_chart(curves: pd.DataFrame, *, chance: float | None = None, title: str = "Recall while training"
                 ) -> alt.TopLevelMixin:
    """Training-batch answer accuracy against step (columns mechanism, key, lr, step, accuracy): a line per
    mechanism and learning rate (the rate dashed), chance as a grey dashed rule."""
    data = named(curves).assign(lr_text=curves["lr"].map("{:g}".format))
    base = alt.Chart(data).encode(
        x=alt.X("step:Q", title="Training step"),
        y=alt.Y("accuracy:Q", title="Answers right in the training batch", scale=alt.Scale(domain=[0, 1])),
        color=_colour(data), strokeDash=alt.StrokeDash("lr_text:N", title="Learning rate"),
        tooltip=[alt.Tooltip("name:N", title="Mechanism"), alt.Tooltip("lr_text:N", title="Learning rate"),
                 alt.Tooltip("step:Q", title="Step"), alt.Tooltip("accuracy:Q", title="Accuracy", format=".3f"),
                 alt.Tooltip("loss:Q", title="Loss", format=".3f")])
    return _finish(alt.layer(base.mark_line(), *_chance(chance)).properties(
        width=560, height=300, title=alt.TitleParams(title, anchor="start")))


AXES = {"state_bytes": ("Cache or state one layer holds for one sequence (bytes, log scale)", True),
        "train_s": ("Measured training time, all learning rates (s, log scale)", True)}


def recall_scatter(results: pd.DataFrame, x: str = "state_bytes", *, chance: float | None = None,
                   title: str = "Recall against what the mechanism holds", subtitle: str = "") -> alt.TopLevelMixin:
    """Held-out accuracy against `x` (state_bytes or train_s, log scale), one dot per mechanism (columns mechanism,
    key, accuracy and x), named by colour in the legend (names beside the dots lay on each other where two
    mechanisms hold the same state); mechanisms without a value on the log axis are named in the subtitle, which is
    wrapped into whole lines."""
    axis_title, _ = AXES[x]
    data = named(results).assign(accuracy=pd.to_numeric(results["accuracy"], errors="coerce"))
    kept = _finite(data, x)
    gone = sorted(set(data["name"].astype(str)) - set(kept["name"].astype(str)))
    base = alt.Chart(kept).encode(
        x=alt.X(f"{x}:Q", title=axis_title, scale=alt.Scale(type="log"), axis=alt.Axis(format="~s")),
        y=alt.Y("accuracy:Q", title="Held-out recall accuracy", scale=alt.Scale(domain=[0, 1])),
        color=_colour(data),
        tooltip=[alt.Tooltip("name:N", title="Mechanism"), alt.Tooltip("accuracy:Q", title="Accuracy",
                                                                            format=".3f"),
                 alt.Tooltip("state_bytes:Q", title="State bytes a layer", format=",.0f"),
                 alt.Tooltip("train_s:Q", title="Train time (s)", format=".1f")])
    dots = base.mark_point(size=160, filled=True, opacity=0.9).encode(shape=alt.Shape("name:N", title="Mechanism"))
    left_out = f"not drawn, no {'cache or state' if x == 'state_bytes' else 'time'}: {', '.join(gone)}" if gone else ""
    lines = wrapped([line for line in (subtitle, left_out) if line])
    return _finish(alt.layer(dots, *_chance(chance)).properties(
        width=560, height=340, title=alt.TitleParams(title, subtitle=lines, anchor="start")))
