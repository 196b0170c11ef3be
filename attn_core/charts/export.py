"""Charts to files without a browser: PNG, SVG and a self-contained HTML page, through vl-convert."""
from __future__ import annotations

import functools
import io
import json
import os

import altair as alt
import vl_convert as vlc

# Where Debian and Homebrew keep fonts; vl-convert also reads the system's own font directories.
FONT_DIRS = ("/usr/share/fonts/truetype/dejavu", "/usr/share/fonts/truetype/liberation", "/opt/homebrew/share/fonts")


@functools.cache
def _fonts() -> None:
    """Register the installed fonts once per process, so text in PNG and SVG is drawn with real glyphs."""
    for folder in FONT_DIRS:
        if os.path.isdir(folder):
            vlc.register_font_directory(folder)


def _spec(chart: alt.TopLevelMixin | dict) -> dict:
    _fonts()
    return chart if isinstance(chart, dict) else chart.to_dict()


def chart_png(chart: alt.TopLevelMixin | dict, scale: float = 2) -> bytes:
    """PNG of the chart; scale 2 gives a sharp image on a slide."""
    return vlc.vegalite_to_png(_spec(chart), scale=scale)


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
    natural = Image.open(io.BytesIO(vlc.vegalite_to_png(spec, scale=1))).size
    room = [target / scale - (whole - inner) for target, whole, inner in zip(size, natural, plot)]
    if min(room) < 50:
        raise ValueError(f"the chart's titles and legend leave no room for the plot in {size[0]}×{size[1]} pixels "
                         f"at scale {scale}; choose a larger size or a smaller scale")
    spec["width"], spec["height"] = (int(v) for v in room)
    drawn = Image.open(io.BytesIO(vlc.vegalite_to_png(spec, scale=scale))).convert("RGB")
    slide = Image.new("RGB", size, "white")
    slide.paste(drawn.crop((0, 0, min(drawn.width, size[0]), min(drawn.height, size[1]))))
    slide.save(out := io.BytesIO(), format="PNG")  # into memory: the caller writes it (write_atomic) or serves it
    return out.getvalue()


def chart_svg(chart: alt.TopLevelMixin | dict) -> bytes:
    """SVG of the chart with its text as text (the fonts named in the chart's config)."""
    return vlc.vegalite_to_svg(_spec(chart)).encode("utf-8")


# Where vl-convert 1.x writes the spec: raw JSON in an inline script, after the bundled Vega (in the head).
SPEC_AT = '<div id="vega-chart"></div>\n    <script type="text/javascript">\n\n{\n    const spec = '
# Characters that could end the script or start markup inside it, and JavaScript's two odd line ends.
INERT = str.maketrans({"<": "\\u003c", ">": "\\u003e", "&": "\\u0026", "\u2028": "\\u2028",
                       "\u2029": "\\u2029"})


def chart_html(chart: alt.TopLevelMixin | dict) -> bytes:
    """One HTML file holding the chart, its data and the Vega JavaScript: opens offline, tooltips work.
    vl-convert embeds the spec as raw JSON, so a label holding `</script><img onerror=…>` would run; the spec is
    written again with <, >, &, U+2028/9 as \\u escapes (the same strings to JavaScript, inert to HTML)."""
    html = vlc.vegalite_to_html(_spec(chart), bundle=True)
    start = html.rfind(SPEC_AT)  # literal newlines: never inside the JSON, where they are escaped
    if start < 0:
        raise RuntimeError("vl-convert's HTML changed: the chart spec was not found where it was expected")
    start += len(SPEC_AT)
    spec, end = json.JSONDecoder().raw_decode(html, start)
    safe = json.dumps(spec, ensure_ascii=False, allow_nan=False, separators=(",", ":")).translate(INERT)
    return (html[:start] + safe + html[end:]).encode("utf-8")
