"""Text and numbers from outside the program (an uploaded file, its name, a link) made harmless to show or use."""
from __future__ import annotations

import math
import re

# Every ASCII punctuation character: Markdown (and Streamlit's :color[…] and $…$) can escape each with a backslash.
_PUNCTUATION = re.compile(r"([!-/:-@\[-`{-~])")
SHOWN_CHARS = 40  # of a value quoted back from a link


def literal(text: object) -> str:
    """`text` escaped so that Streamlit's Markdown (st.error, st.info, st.caption, st.progress…) shows it as typed:
    `![x](http://host/a.png)` stays those characters, never an image the browser fetches, a link or a heading."""
    return _PUNCTUATION.sub(r"\\\1", str(text))


def link_number(name: str, raw: str | list[str], low: float, high: float, whole: bool = True) -> str:
    """The sentence saying why a link's value for a number widget ranging low..high is ignored; '' when it is fine.
    Text, NaN, ±inf, 1e309, fractions where `whole` and values out of range are refused (a whole-number widget
    seeded with 1e309 raises OverflowError inside Streamlit). The value is quoted escaped and cut short."""
    values = raw if isinstance(raw, list) else [raw]
    if all(_fits(v, low, high, whole) for v in values):
        return ""
    shown = ", ".join(values)
    shown = shown if len(shown) <= SHOWN_CHARS else shown[:SHOWN_CHARS] + "…"
    allowed = f"a whole number from {low:,} to {high:,}" if whole else f"a number from {low:g} to {high:g}"
    return f"The link's value {literal(shown)} for `{name}` was ignored: `{name}` takes {allowed}, so its default " \
           "is used."


def _fits(raw: str, low: float, high: float, whole: bool) -> bool:
    try:
        value = float(raw)
    except ValueError:
        return False
    return math.isfinite(value) and low <= value <= high and (value.is_integer() or not whole)
