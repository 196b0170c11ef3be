"""When does compiling pay off: the total time of k calls, compile + mask + k × time per call, against k for each
implementation of one problem at one n, the break-even k against our kernel marked where it exists (pure Altair)."""
from __future__ import annotations

import math

import altair as alt
import numpy as np
import pandas as pd

from ..engine import analysis
from .style import colour_scale, styled, wrapped

K_MIN_MAX = 1000  # the k axis reaches at least this far, and 4× past the largest break-even k
GRID = 41  # log-spaced k per line


def payoff_ns(df: pd.DataFrame) -> list[int]:
    """The n at which an implementation other than ours has an ok point: those a payoff chart can be drawn at."""
    return sorted({int(n) for n in analysis.one_time_costs(df)["n"]})


def calls(k: float) -> str:
    """k to three significant figures, with thousands separators: '3,100', '12.4'."""
    return f"{float(f'{k:.3g}'):,.0f}" if k >= 100 else f"{k:.3g}"


def _once(row: pd.Series) -> float:
    """compile_s + mask_s, a cost not measured (NaN: nothing compiled or built) counting 0."""
    return sum(float(row.get(c, math.nan)) for c in analysis.ONCE_COLUMNS if pd.notna(row.get(c, math.nan)))


def _at(df: pd.DataFrame, n: int) -> pd.DataFrame:
    """The ok timed rows at n with their series name and one-time total (ours: none)."""
    ok = analysis.ok_points(df[df["n"] == n], "time_median_s")
    once = [0.0 if r.get("implementation", "ours") == "ours" else _once(r) for _, r in ok.iterrows()]
    return ok.assign(series=[analysis.row_series_name(r) for _, r in ok.iterrows()], once_s=once)


def break_even(df: pd.DataFrame, n: int) -> pd.DataFrame:
    """For each implementation other than ours at n: the calls k* after which its k calls take less in all than
    ours, k* = (compile + mask) ÷ (ours' time per call − its own), medians. NaN, with a note saying why, where it is
    not faster per call or ours was not measured. DataFrame[series, implementation, once_s, time_s, ours_time_s,
    k_star, note]."""
    rows, at = [], _at(df, n)
    by = at["implementation"] if "implementation" in at else pd.Series("ours", index=at.index)
    ours = at[by == "ours"]
    for _, r in at[by != "ours"].iterrows():
        mine = ours[(ours[analysis.SAME_PROBLEM] == r[analysis.SAME_PROBLEM]).all(axis=1)]
        t, once = float(r["time_median_s"]), float(r["once_s"])
        t_ours = float(mine["time_median_s"].iloc[0]) if len(mine) else math.nan
        k_star, note = math.nan, f"our kernel was not measured at n = {n:,}"
        if len(mine) and t < t_ours:
            k_star = once / (t_ours - t)
            note = ("faster from the first call" if k_star <= 1 else
                    f"pays off after k ≈ {calls(k_star)} calls ({once:.3g} s once, {(t_ours - t) * 1e3:.3g} ms saved "
                    "a call)")
        elif len(mine):
            note = f"never pays off: {t * 1e3:.3g} ms a call against ours {t_ours * 1e3:.3g} ms"
        rows.append({"series": r["series"], "implementation": r["implementation"], "once_s": once, "time_s": t,
                     "ours_time_s": t_ours, "k_star": k_star, "note": note})
    return pd.DataFrame(rows, columns=["series", "implementation", "once_s", "time_s", "ours_time_s", "k_star",
                                       "note"])


def payoff_frame(df: pd.DataFrame, n: int, k_max: float | None = None) -> pd.DataFrame:
    """Per ok series at n, the total seconds of k calls, once_s + k·time_s, on GRID log-spaced k from 1 to k_max
    (default: K_MIN_MAX, or 4× the largest break-even k past it). DataFrame[series, mechanism, implementation, k,
    total_s, once_s, time_s]."""
    at = _at(df, n)
    if k_max is None:
        stars = break_even(df, n)["k_star"].dropna()
        k_max = max(K_MIN_MAX, 10 ** math.ceil(math.log10(4 * stars.max()))) if len(stars) else K_MIN_MAX
    ks = np.geomspace(1, k_max, GRID)
    rows = [{"series": r["series"], "mechanism": r["mechanism"], "implementation": r.get("implementation", "ours"),
             "k": float(k), "total_s": r["once_s"] + k * float(r["time_median_s"]), "once_s": r["once_s"],
             "time_s": float(r["time_median_s"])} for _, r in at.iterrows() for k in ks]
    return pd.DataFrame(rows, columns=["series", "mechanism", "implementation", "k", "total_s", "once_s", "time_s"])


def payoff_chart(df: pd.DataFrame, n: int, *, talk: bool = False) -> alt.TopLevelMixin:
    """Total seconds of k calls against k (log-log), one line per implementation at n, a point and a label at each
    break-even k* past the first call; the subtitle says how the total is made and where Flex is faster."""
    lines = payoff_frame(df, n)
    even = break_even(df, n)
    marks = even[even["k_star"] > 1].assign(total_s=lambda e: e["once_s"] + e["k_star"] * e["time_s"],
                                            label=lambda e: [f"k* ≈ {calls(k)}" for k in e["k_star"]])
    colour = alt.Color("series:N", title="Implementation", scale=colour_scale(
        lines.drop_duplicates("series")[["mechanism", "series"]].itertuples(index=False)))
    x = alt.X("k:Q", title="Calls k (log scale)", scale=alt.Scale(type="log"))
    y = alt.Y("total_s:Q", title="Total seconds of k calls (log scale)", scale=alt.Scale(type="log"))
    tooltip = [alt.Tooltip("series:N", title="Implementation"), alt.Tooltip("k:Q", format=",.3g"),
               alt.Tooltip("total_s:Q", title="total (s)", format=".4g"),
               alt.Tooltip("once_s:Q", title="once: compile + mask (s)", format=".3g"),
               alt.Tooltip("time_s:Q", title="a call (s, median)", format=".3g")]
    layers = [alt.Chart(lines).mark_line(strokeWidth=2).encode(x=x, y=y, color=colour, tooltip=tooltip)]
    if len(marks):
        base = alt.Chart(marks).encode(x="k_star:Q", y="total_s:Q")
        layers += [base.mark_point(shape="diamond", filled=True, size=140, color="black").encode(
                       tooltip=[alt.Tooltip("series:N", title="Implementation"), alt.Tooltip("note:N", title="")]),
                   base.mark_text(align="left", dx=8, dy=-10, color="black").encode(text="label:N")]
    subtitle = ["total = compile + block mask (once, not in the time per call) + k × the median time per call;",
                "a one-time cost not measured (nothing compiled at this n) counts 0"]
    if faster := analysis.flex_faster(df[df["n"] == n]):
        subtitle.append(faster.split(":")[0] + f" at n = {n:,}.")
    title = alt.TitleParams(f"When does compiling pay off? n = {n:,}", subtitle=wrapped(subtitle), anchor="start")
    return styled(alt.layer(*layers).properties(width=620, height=380, title=title), talk=talk)


ONE_TIME_COLUMNS = {"series": "Implementation", "n": "n", "compile_s": "compile (s, once, not in the time)",
                    "mask_s": "block or dense mask (s, once, not in the time)",
                    "time_ms": "time per call (ms, median)"}


def one_time_table(df: pd.DataFrame) -> pd.DataFrame:
    """analysis.one_time_costs with readable names: a run's compile and mask seconds beside its time per call."""
    costs = analysis.one_time_costs(df)
    return costs.assign(time_ms=costs["time_median_s"] * 1e3)[list(ONE_TIME_COLUMNS)].rename(
        columns=ONE_TIME_COLUMNS).round(4)
