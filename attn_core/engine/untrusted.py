"""Text and numbers from outside the program (an uploaded file, its name, a link) made harmless to show or use."""
from __future__ import annotations

import math
import re
from typing import TYPE_CHECKING, Any, Callable, Mapping

if TYPE_CHECKING:
    import pandas as pd

# Every ASCII punctuation character: Markdown (and Streamlit's :color[…] and $…$) can escape each with a backslash.
_PUNCTUATION = re.compile(r"([!-/:-@\[-`{-~])")
SHOWN_CHARS = 40  # of a value quoted back from a link
CELL_CHARS = 32767  # of a CSV cell: Excel's and LibreOffice's most
# A spreadsheet opening a CSV takes a cell that starts with one of these as a formula (OWASP, "CSV Injection").
FORMULA_START = ("=", "+", "-", "@", "\t", "\r")
_JSON_STRING = re.compile(r'"(?:[^"\\]|\\.)*"')
_FORMULA_CHAR = re.compile(r"[=+\-@]")
# What no text from outside may bring as it is: C0 and C1 controls and DEL (ESC starts a terminal's escape sequences,
# BEL ends some), the bidi embeddings, overrides and isolates (they reorder what a line shows), U+FFFE and U+FFFF
# (never characters: XML 1.0 forbids them, as it does every C0 control but tab, line feed and carriage return) and
# lone surrogates (no UTF-8 holds them: Arrow, SQLite and protobuf refuse them).
_CONTROL = re.compile("[\x00-\x1f\x7f-\x9f\u202a-\u202e\u2066-\u2069\ufffe\uffff\ud800-\udfff]")


def clipped(text: str, limit: int) -> str:
    """`text` cut to at most `limit` characters, the last one "…" where it was cut: a 100,000-character label from a
    file would otherwise make every chart and export that shows it slow and huge."""
    return text if len(text) <= limit else text[:limit - 1] + "…"


def printable(text: object, keep: str = "") -> str:
    """`text` with each character of _CONTROL (C0 and C1 controls, DEL, bidi overrides, U+FFFE/U+FFFF, lone
    surrogates) written as its Python escape, visible and inert: ESC as \\x1b, BEL as \\x07, U+202E as \\u202e.
    Those in `keep` (e.g. "\\t\\n\\r", which XML allows) stay as they are. Safe to print on a terminal (nothing
    retitles the window or clears the screen), to hand to vl-convert (which aborts the process on a character XML
    forbids) and to encode as UTF-8; text without such characters comes back unchanged."""
    text = str(text)
    return _CONTROL.sub(lambda m: m.group() if m.group() in keep else ascii(m.group())[1:-1], text)


def printable_data(value: Any, keep: str = "\t\n\r") -> Any:
    """Parsed JSON (a run's stamp, its configuration) with every string, keys included, through `printable`:
    numbers, booleans and clean text come back unchanged."""
    if isinstance(value, str):
        return printable(value, keep)
    if isinstance(value, dict):
        return {printable_data(k, keep): printable_data(v, keep) for k, v in value.items()}
    if isinstance(value, list):
        return [printable_data(v, keep) for v in value]
    return value


def terminal(text: object, limit: int = 200) -> str:
    """Text from a file as one line for a terminal: every control character (line breaks and tabs too) escaped by
    `printable`, then `clipped` to `limit` characters (a 1 MB device name prints as 200)."""
    return clipped(printable(text), limit)


def file_stem(text: object, limit: int = 40) -> str:
    """A file name's stem made of `text` (a model's or a run's name): letters, digits, '.', '-' and '_' kept, every
    other character (a control, a slash, a space) a '-', cut to `limit`; "chart" where nothing is left."""
    stem = "".join(c if c.isalnum() or c in ".-_" else "-" for c in str(text))[:limit]
    return stem.strip(".") or "chart"


def vega_title(text: object) -> str:
    """An axis, legend or tooltip title of a Vega-Lite chart: control characters escaped (`printable`, line ends
    too), then every backslash written as ⧵ (U+29F5, which looks the same). Vega-Lite copies these titles into the
    expression that makes each mark's aria-label without escaping backslashes: a file named `a\\x1b` would put a
    real ESC into the SVG (vl-convert then refuses the PNG), and `\\"` would end the expression's string early."""
    return printable(text).replace("\\", "\u29f5")


def literal(text: object) -> str:
    """`text` escaped so that Streamlit's Markdown (st.error, st.info, st.caption, st.progress…) shows it as typed:
    `![x](http://host/a.png)` stays those characters, never an image the browser fetches, a link or a heading; control
    characters shown as their escapes (`printable`, line breaks and tabs kept)."""
    return _PUNCTUATION.sub(r"\\\1", printable(text, keep="\t\n\r"))


def quoted(value: object, limit: int = SHOWN_CHARS) -> str:
    """A value quoted back in a message: its repr (control characters escaped), cut to `limit` characters; an integer
    of more digits than Python prints is named as one."""
    try:
        text = repr(value)
    except ValueError:
        text = "a number of thousands of digits"
    return clipped(printable(text), limit)


def link_number(name: str, raw: str | list[str], low: float, high: float, whole: bool = True) -> str:
    """The sentence saying why a link's value for a number widget ranging low..high is ignored; '' when it is fine.
    Text, NaN, ±inf, 1e309, fractions where `whole` and values out of range are refused (a whole-number widget
    seeded with 1e309 raises OverflowError inside Streamlit). The value is quoted escaped and cut short."""
    values = raw if isinstance(raw, list) else [raw]
    if all(_fits(v, low, high, whole) for v in values):
        return ""
    allowed = f"a whole number from {low:,} to {high:,}" if whole else f"a number from {low:g} to {high:g}"
    return f"The link's value {_quoted(values)} for `{name}` was ignored: `{name}` takes {allowed}, so its default " \
           "is used."


def link_choice(name: str, raw: str | list[str], allowed: list[str], several: bool = True) -> tuple[list[str], str]:
    """Split a link's values for a choice widget offering `allowed` (the texts it shows, as Streamlit puts them in
    URLs): the values it can take, and the sentence naming the others ('' when there are none). Where not `several`
    (a range slider's two ends) one bad value voids them all. Quoted values are escaped and cut short."""
    values = raw if isinstance(raw, list) else [raw]
    bad = [v for v in values if v not in allowed]
    if not bad:
        return values, ""
    kept = [v for v in values if v in allowed] if several else []
    offered = " · ".join(allowed)
    offered = offered if len(offered) <= 4 * SHOWN_CHARS else offered[:4 * SHOWN_CHARS] + "…"
    what = "and the others are used" if kept else "so its default is used"
    return kept, (f"The link's value {_quoted(bad)} for `{name}` was ignored: `{name}` takes one of "
                  f"{literal(offered)}, {what}.")


def _quoted(values: list[str]) -> str:
    shown = ", ".join(values)
    return literal(shown if len(shown) <= SHOWN_CHARS else shown[:SHOWN_CHARS] + "…")


def _fits(raw: str, low: float, high: float, whole: bool) -> bool:
    try:
        value = float(raw)
    except ValueError:
        return False
    return math.isfinite(value) and low <= value <= high and (value.is_integer() or not whole)


def link_values(query: Mapping[str, list[str]], numbers: Mapping[str, tuple[float, float, bool]],
                choices: Mapping[str, tuple[list[str], bool]],
                plain: Callable[[str, str], str] = lambda key, value: value) -> tuple[dict[str, list[str]], list[str]]:
    """What a link may keep of its values, and why the rest is ignored. `numbers`: key → (low, high, whole) of a number
    widget; `choices`: key → (the texts its widget offers, whether it takes several); `plain(key, value)` first
    rewrites a value into the form the widget shows (1024 → 1,024). Returns, for each of those keys in `query`,
    the values to keep (possibly none), and the sentences (sorted by key) naming the values ignored."""
    kept, notes = {}, {}
    for key in numbers.keys() & query.keys():
        notes[key] = link_number(key, query[key], *numbers[key])
        kept[key] = [] if notes[key] else list(query[key])
    for key in choices.keys() & query.keys():
        kept[key], notes[key] = link_choice(key, [plain(key, v) for v in query[key]], *choices[key])
    return kept, [notes[key] for key in sorted(notes) if notes[key]]


def csv_cell(value: Any) -> Any:
    """A CSV cell that a spreadsheet shows as typed, never runs: text that starts with =, +, -, @, tab or carriage
    return (after any leading ') gets a ' in front, as OWASP advises; numbers and other text are returned as they
    are (a number -1.5 stays a number). `csv_text` takes the ' off again."""
    if isinstance(value, str) and value.lstrip("'").startswith(FORMULA_START):
        return "'" + value
    return value


def csv_text(cell: str) -> str:
    """A text cell as it was before `csv_cell`: the ' it added, and only that one, removed."""
    return cell[1:] if cell.startswith("'") and cell.lstrip("'").startswith(FORMULA_START) else cell


def csv_json(text: str) -> str:
    """JSON text that a spreadsheet splitting it at commas cannot turn into a formula: =, +, - and @ inside its
    strings written as \\u00XX escapes (tab and carriage return are escaped by JSON already). json.loads reads the
    same value back."""
    return _JSON_STRING.sub(lambda m: _FORMULA_CHAR.sub(lambda c: f"\\u{ord(c.group()):04x}", m.group()), text)


def csv_bytes(frame: pd.DataFrame) -> bytes:
    """A frame as UTF-8 CSV, its text cells and column names through `csv_cell` (numbers untouched) and `clipped` to
    CELL_CHARS (a spreadsheet holds no more in a cell; Python's csv module reads no more than 131,072)."""
    def cell(value: Any) -> Any:
        return csv_cell(clipped(value, CELL_CHARS) if isinstance(value, str) else value)

    return frame.rename(columns=cell).map(cell).to_csv(index=False).encode("utf-8")
