"""Compare's chart of one run against another: run B ÷ run A at each common point, its axis title short enough to fit
beside the plot (the runs' names, which may be long file names, go in the subtitle)."""
from __future__ import annotations

import altair as alt
import pandas as pd

from attn_core.charts.style import wrapped
from attn_core.engine.untrusted import clipped, printable
from attn_core.insight.charts import LOG2_X, _colour, _finish, _finite, n_axis, ratio_domain

WHAT = {"time_median_s": "Time", "peak_bytes": "Peak memory"}
HEIGHT, WIDTH = 360, 620  # the plot's pixels: the y title's two lines (under 30 characters) fit beside 360
NAME_CHARS = 240  # of a run's name (a file's, or a kept run's title): three subtitle lines at most, never a page


def y_title(metric: str) -> list[str]:
    """The ratio axis' title: two short lines, whatever the runs are called (a title longer than the plot made
    Vega shrink the plot to fit the title's height, 40 px at one point)."""
    return [f"{WHAT[metric]}, run B ÷ run A", "(log scale)"]


def ratio_chart(ratios: pd.DataFrame, a_name: str, b_name: str, metric: str = "time_median_s") -> alt.TopLevelMixin:
    """Run B ÷ run A per point (published.run_ratio: columns label, params, n, ratio), log scale, a dashed rule at 1
    (the same on both); the runs named in the subtitle, each on lines of their own."""
    a_name, b_name = (clipped(printable(name), NAME_CHARS) for name in (a_name, b_name))  # file names: text only
    kept = _finite(ratios, "ratio")
    x = alt.X("n:Q", title="Sequence length n (tokens, log₂ scale; K = 1024)", scale=LOG2_X, axis=n_axis(kept["n"]))
    y = alt.Y("ratio:Q", title=y_title(metric), scale=alt.Scale(type="log", nice=False,
                                                               domain=list(ratio_domain(kept["ratio"]))))
    base = alt.Chart(kept).encode(x=x, y=y, color=_colour(ratios))
    layers = [base.mark_line().encode(detail="params:N"), base.mark_point(filled=True, size=70).encode(
        tooltip=[alt.Tooltip("label:N", title="Mechanism"), alt.Tooltip("params:N", title="Parameters"),
                 alt.Tooltip("n:Q", format=","), alt.Tooltip("ratio:Q", format=".3g")]),
        alt.Chart(pd.DataFrame({"one": [1.0]})).mark_rule(color="black", strokeDash=[4, 3]).encode(y="one:Q")]
    subtitle = wrapped([f"A: {a_name}", f"B: {b_name}", "above 1: B took more; below 1: less"])
    return _finish(alt.layer(*layers).properties(width=WIDTH, height=HEIGHT, title=alt.TitleParams(
        f"{WHAT[metric]} of run B ÷ run A", subtitle=subtitle, anchor="start")))
