"""Associative recall's charts: accuracy while training, and recall against what a mechanism holds and the time it
took (pure Altair: the frames of attn_core.studies.recall.mqar in, a chart out)."""
from __future__ import annotations

import math

import altair as alt
import pandas as pd

from attn_core.insight.charts import _finish, _finite
from attn_core.charts.style import REFERENCE_GREY, colour_scale


def _colour(frame: pd.DataFrame) -> alt.Color:
    """One line per mechanism setting ('sliding_window:window=4'), its mechanism's home colour first."""
    pairs = frame.drop_duplicates("mechanism")[["key", "mechanism"]].astype(str).itertuples(index=False)
    return alt.Color("mechanism:N", scale=colour_scale(pairs), title="Mechanism")


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
    data = curves.assign(lr_text=curves["lr"].map("{:g}".format))
    base = alt.Chart(data).encode(
        x=alt.X("step:Q", title="Training step"),
        y=alt.Y("accuracy:Q", title="Answers right in the training batch", scale=alt.Scale(domain=[0, 1])),
        color=_colour(data), strokeDash=alt.StrokeDash("lr_text:N", title="Learning rate"),
        tooltip=[alt.Tooltip("mechanism:N", title="Mechanism"), alt.Tooltip("lr_text:N", title="Learning rate"),
                 alt.Tooltip("step:Q", title="Step"), alt.Tooltip("accuracy:Q", title="Accuracy", format=".3f"),
                 alt.Tooltip("loss:Q", title="Loss", format=".3f")])
    return _finish(alt.layer(base.mark_line(), *_chance(chance)).properties(
        width=560, height=300, title=alt.TitleParams(title, anchor="start")))


AXES = {"state_bytes": ("Cache or state one layer holds for one sequence (bytes, log scale)", True),
        "train_s": ("Measured training time, all learning rates (s, log scale)", True)}


def recall_scatter(results: pd.DataFrame, x: str = "state_bytes", *, chance: float | None = None,
                   title: str = "Recall against what the mechanism holds", subtitle: str = "") -> alt.TopLevelMixin:
    """Held-out accuracy against `x` (state_bytes or train_s, log scale), one labelled dot per mechanism (columns
    mechanism, key, accuracy and x); mechanisms without a value on the log axis are named in the subtitle."""
    axis_title, _ = AXES[x]
    data = results.assign(accuracy=pd.to_numeric(results["accuracy"], errors="coerce"))
    kept = _finite(data, x)
    gone = sorted(set(data["mechanism"].astype(str)) - set(kept["mechanism"].astype(str)))
    base = alt.Chart(kept).encode(
        x=alt.X(f"{x}:Q", title=axis_title, scale=alt.Scale(type="log"), axis=alt.Axis(format="~s")),
        y=alt.Y("accuracy:Q", title="Held-out recall accuracy", scale=alt.Scale(domain=[0, 1])),
        color=_colour(data),
        tooltip=[alt.Tooltip("mechanism:N", title="Mechanism"), alt.Tooltip("accuracy:Q", title="Accuracy",
                                                                            format=".3f"),
                 alt.Tooltip("state_bytes:Q", title="State bytes a layer", format=",.0f"),
                 alt.Tooltip("train_s:Q", title="Train time (s)", format=".1f")])
    dots = base.mark_circle(size=160, opacity=0.9)
    names = base.mark_text(align="left", dx=9, dy=-7).encode(text="mechanism:N")
    left_out = f"not drawn, no {'cache or state' if x == 'state_bytes' else 'time'}: {', '.join(gone)}" if gone else ""
    lines = [line for line in (subtitle, left_out) if line]
    return _finish(alt.layer(dots, names, *_chance(chance)).properties(
        width=560, height=340, title=alt.TitleParams(title, subtitle=lines, anchor="start")))
