"""Charts to files without a browser: PNG, SVG and a self-contained HTML page, through vl-convert, which runs in a
child process (vl_child.py): a panic there aborts that process, never the caller, and the export fails with a sentence
(ExportError)."""
from __future__ import annotations

import io
import json
import os
import signal
import subprocess
import sys
import threading
from typing import Any

import altair as alt

from attn_core.engine.untrusted import clipped, printable, vega_title

# Where Debian and Homebrew keep fonts; vl-convert also reads the system's own font directories.
FONT_DIRS = ("/usr/share/fonts/truetype/dejavu", "/usr/share/fonts/truetype/liberation", "/opt/homebrew/share/fonts")
RENDER_TIMEOUT_S = 60.0  # one conversion; a child past it is killed and the export refused with a sentence
SPEC_TEXT_CHARS = 300  # any one text of a chart's spec (a title, a label, a field name) is cut to this many
# Vega-Lite's properties that hold an expression (a legend's labelExpr embeds every label): escaped, never cut
EXPRESSIONS = frozenset({"labelExpr", "expr", "test", "calculate", "filter", "signal", "update"})
# The child, run by path with -P (no script folder on sys.path): it imports vl-convert only, not attn_core and torch.
CHILD = (sys.executable, "-P", os.path.join(os.path.dirname(os.path.abspath(__file__)), "vl_child.py"))


class ExportError(RuntimeError):
    """A chart that could not be drawn to a file: the renderer failed, died or ran past its time; the message says
    which, and the caller lives on."""


def chart_text(value: Any, key: str = "") -> Any:
    """Every string of a Vega-Lite spec (titles, axis and legend titles, labels, data values, field names: keys too)
    with what XML cannot hold written as escapes (`printable`, tab and line ends kept) and cut to SPEC_TEXT_CHARS:
    vl-convert aborts its whole process on BEL, ESC, NUL or U+FFFF, and draws a 1 MB label for minutes. A "title"
    (of an axis, a legend, a tooltip) goes through `vega_title`, its backslashes made inert; an expression (EXPRESSIONS)
    is never cut, which would break it. Numbers, booleans and clean text come back unchanged. `key`: the value's."""
    if isinstance(value, str):
        if key in EXPRESSIONS:
            return printable(value, keep="\t\n\r")
        value = clipped(value, SPEC_TEXT_CHARS)  # first: a megabyte is not scanned whole
        return clipped(vega_title(value) if key == "title" else printable(value, keep="\t\n\r"), SPEC_TEXT_CHARS)
    if isinstance(value, dict):
        return {chart_text(k): chart_text(v, k) for k, v in value.items()}
    if isinstance(value, list):
        return [chart_text(v, key) for v in value]
    return value


def _spec(chart: alt.TopLevelMixin | dict) -> dict:
    return chart_text(chart if isinstance(chart, dict) else chart.to_dict())


class _Renderer:
    """One vl_child process, started at the first export and again after one dies or is killed; conversions go
    through it one at a time (a lock: Streamlit serves sessions from threads)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._child: subprocess.Popen | None = None
        self._owner = 0  # the process that started the child: a forked copy of this one starts its own

    def convert(self, to: str, spec: dict, options: dict, timeout_s: float) -> bytes:
        request = json.dumps({"to": to, "spec": spec, "options": options, "fonts": FONT_DIRS},
                             allow_nan=False).encode("utf-8")
        with self._lock:
            child = self._running()
            stopped = threading.Event()  # set when the watchdog kills the child
            watchdog = threading.Timer(timeout_s, lambda: (stopped.set(), child.kill()))
            watchdog.start()
            try:
                child.stdin.write(len(request).to_bytes(8, "big") + request)
                child.stdin.flush()
                head = child.stdout.read(9)
                body = child.stdout.read(int.from_bytes(head[1:], "big")) if len(head) == 9 else b""
            except (OSError, ValueError):  # the pipe broke: the child died while reading the request
                head, body = b"", b""
            finally:
                watchdog.cancel()
            if len(head) < 9 or len(body) < int.from_bytes(head[1:], "big"):
                self._discard(child)
                why = (f"took longer than {timeout_s:.0f} s and was stopped" if stopped.is_set() else
                       f"crashed ({_exit_text(child.returncode)})")
                raise ExportError(f"The chart could not be drawn as {to.upper()}: the renderer (vl-convert) {why}; "
                                  "the server is unaffected: try again, or export the chart as HTML.")
        if head[:1] != b"+":
            raise ExportError(f"The chart could not be drawn as {to.upper()}: vl-convert refused it "
                              f"({clipped(printable(body.decode('utf-8', 'replace')), 300)}).")
        return body

    def _running(self) -> subprocess.Popen:
        if self._child is None or self._child.poll() is not None or self._owner != os.getpid():
            if self._child is not None and self._owner == os.getpid():
                self._discard(self._child)
            # stderr is the caller's: a panic's message lands in the server's log
            self._child = subprocess.Popen(CHILD, stdin=subprocess.PIPE, stdout=subprocess.PIPE)
            self._owner = os.getpid()
        return self._child

    def _discard(self, child: subprocess.Popen) -> None:
        child.kill()
        child.wait()
        for pipe in (child.stdin, child.stdout):
            try:
                pipe.close()
            except OSError:  # a broken pipe's unflushed bytes
                pass
        if self._child is child:
            self._child = None


def _exit_text(code: int | None) -> str:
    """'killed by SIGABRT', 'exit code 1': how the child ended."""
    if code is not None and code < 0:
        try:
            return f"killed by {signal.Signals(-code).name}"
        except ValueError:
            return f"killed by signal {-code}"
    return f"exit code {code}"


_renderer = _Renderer()


def _convert(to: str, spec: dict, timeout_s: float = RENDER_TIMEOUT_S, **options: Any) -> bytes:
    """vl-convert's `vegalite_to_{to}(spec, **options)` in the child process; ExportError with a sentence when it
    fails. `spec` goes as it is: the public functions clean it first (`_spec`)."""
    return _renderer.convert(to, spec, options, timeout_s)


def chart_png(chart: alt.TopLevelMixin | dict, scale: float = 2) -> bytes:
    """PNG of the chart; scale 2 gives a sharp image on a slide."""
    return _convert("png", _spec(chart), scale=scale)


SLIDE = (1920, 1080)  # a 16:9 slide's pixels


def chart_slide_png(chart: alt.TopLevelMixin | dict, size: tuple[int, int] = SLIDE, scale: float = 2) -> bytes:
    """PNG of the chart filling a slide: exactly `size` pixels (16:9 by default). The plot is resized so that it,
    its titles and its legend fill size / scale at once (their room is measured by one render at the chart's own
    size); what rounding leaves is white margin."""
    from PIL import Image

    spec = dict(_spec(chart))
    plot = (spec.get("width"), spec.get("height"))
    if not all(isinstance(v, (int, float)) for v in plot):
        raise ValueError("a slide needs a chart of fixed width and height; give the chart a width= and height=")
    natural = Image.open(io.BytesIO(_convert("png", spec, scale=1))).size
    room = [target / scale - (whole - inner) for target, whole, inner in zip(size, natural, plot)]
    if min(room) < 50:
        raise ValueError(f"the chart's titles and legend leave no room for the plot in {size[0]}×{size[1]} pixels "
                         f"at scale {scale}; choose a larger size or a smaller scale")
    spec["width"], spec["height"] = (int(v) for v in room)
    drawn = Image.open(io.BytesIO(_convert("png", spec, scale=scale))).convert("RGB")
    slide = Image.new("RGB", size, "white")
    slide.paste(drawn.crop((0, 0, min(drawn.width, size[0]), min(drawn.height, size[1]))))
    slide.save(out := io.BytesIO(), format="PNG")  # into memory: the caller writes it (write_atomic) or serves it
    return out.getvalue()


def chart_svg(chart: alt.TopLevelMixin | dict) -> bytes:
    """SVG of the chart with its text as text (the fonts named in the chart's config)."""
    return _convert("svg", _spec(chart))


# Where vl-convert 1.x writes the spec: raw JSON in an inline script, after the bundled Vega (in the head).
SPEC_AT = '<div id="vega-chart"></div>\n    <script type="text/javascript">\n\n{\n    const spec = '
# Characters that could end the script or start markup inside it, and JavaScript's two odd line ends.
INERT = str.maketrans({"<": "\\u003c", ">": "\\u003e", "&": "\\u0026", "\u2028": "\\u2028",
                       "\u2029": "\\u2029"})


def chart_html(chart: alt.TopLevelMixin | dict) -> bytes:
    """One HTML file holding the chart, its data and the Vega JavaScript: opens offline, tooltips work.
    vl-convert embeds the spec as raw JSON, so a label holding `</script><img onerror=…>` would run; the spec is
    written again with <, >, &, U+2028/9 as \\u escapes (the same strings to JavaScript, inert to HTML)."""
    html = _convert("html", _spec(chart), bundle=True).decode("utf-8")
    start = html.rfind(SPEC_AT)  # literal newlines: never inside the JSON, where they are escaped
    if start < 0:
        raise RuntimeError("vl-convert's HTML changed: the chart spec was not found where it was expected")
    start += len(SPEC_AT)
    spec, end = json.JSONDecoder().raw_decode(html, start)
    safe = json.dumps(spec, ensure_ascii=False, allow_nan=False, separators=(",", ":")).translate(INERT)
    return (html[:start] + safe + html[end:]).encode("utf-8")
