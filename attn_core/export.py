"""Charts to files without a browser: PNG, SVG and a self-contained HTML page, through vl-convert."""
from __future__ import annotations

import functools
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


def chart_svg(chart: alt.TopLevelMixin | dict) -> bytes:
    """SVG of the chart with its text as text (the fonts named in the chart's config)."""
    return vlc.vegalite_to_svg(_spec(chart)).encode("utf-8")


def chart_html(chart: alt.TopLevelMixin | dict) -> bytes:
    """One HTML file holding the chart, its data and the Vega JavaScript: opens offline, tooltips work."""
    return vlc.vegalite_to_html(_spec(chart), bundle=True).encode("utf-8")
