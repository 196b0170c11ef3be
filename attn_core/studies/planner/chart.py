"""The planner's marks on its charts (pure Altair: chart in, chart out)."""
from __future__ import annotations

import altair as alt
import pandas as pd


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
