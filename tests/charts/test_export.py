"""Exports made without a browser: real PNG and SVG with real glyphs, and an HTML page that needs no network."""
import io
import re

import altair as alt
import pandas as pd
import pytest
from PIL import Image

from attn_core.charts import export, scaling, style


def title_only(text: str) -> alt.Chart:
    """A chart whose only ink is its title, in the house font."""
    frame = pd.DataFrame({"x": [0]})
    chart = alt.Chart(frame).mark_point(opacity=0).encode(x=alt.X("x:Q", axis=None))
    return style.styled(chart.properties(width=400, height=10, title=text))


def ink_width(png: bytes) -> int:
    """Width in pixels of the dark pixels of an image."""
    image = Image.open(io.BytesIO(png)).convert("L")
    dark = image.point(lambda v: 255 if v < 128 else 0)
    box = dark.getbbox()
    return 0 if box is None else box[2] - box[0]


def test_png_is_a_png_at_the_requested_scale():
    chart = title_only("Attention")
    one, two = Image.open(io.BytesIO(export.chart_png(chart, scale=1))), Image.open(
        io.BytesIO(export.chart_png(chart, scale=2)))
    assert one.format == "PNG" and two.size[0] == pytest.approx(2 * one.size[0], abs=2)


def test_png_text_is_drawn_with_a_real_font():
    # With real glyphs "iiiiiiii" is far narrower than "WWWWWWWW"; missing fonts draw nothing or equal boxes.
    narrow, wide = (ink_width(export.chart_png(title_only(t), scale=1)) for t in ("iiiiiiii", "WWWWWWWW"))
    assert narrow > 0 and wide > 2.5 * narrow


def test_svg_keeps_text_and_names_the_installed_font():
    svg = export.chart_svg(title_only("Quadratic wall")).decode()
    assert svg.lstrip().startswith("<svg") and "Quadratic wall" in svg and "DejaVu Sans" in svg


def test_html_is_self_contained():
    html = export.chart_html(title_only("Offline")).decode()
    assert "Offline" in html and "vegaEmbed" in html
    assert not re.search(r"<script[^>]+src=", html), "the page must not load scripts from the network"
    assert not re.search(r"<link[^>]+href=\"https?:", html)


def test_a_scaling_chart_exports_to_every_format():
    from test_charts import results_frame

    chart = scaling.scaling_chart(results_frame(), "peak_bytes")
    assert export.chart_png(chart)[:8] == b"\x89PNG\r\n\x1a\n"
    assert b"Peak memory" in export.chart_svg(chart)
    assert b"Softmax (materialized)" in export.chart_html(chart)


def test_a_slide_png_is_1920_by_1080_and_filled_by_the_chart():
    frame = pd.DataFrame({"n": [64, 128, 256], "ms": [1.0, 3.0, 9.0], "series": ["a", "b", "c"]})
    chart = alt.Chart(frame).mark_line().encode(x="n:Q", y="ms:Q", color="series:N").properties(
        width=640, height=250, title="A wide chart")
    image = Image.open(io.BytesIO(export.chart_slide_png(chart))).convert("L")
    assert image.size == (1920, 1080)
    left, top, right, bottom = image.point(lambda v: 255 if v < 200 else 0).getbbox()  # where the ink is
    assert right - left > 0.9 * 1920 and bottom - top > 0.9 * 1080  # filled, not letterboxed
    as_shown = Image.open(io.BytesIO(export.chart_png(chart)))
    assert as_shown.width / as_shown.height > 2  # the chart's own shape is still there
    with pytest.raises(ValueError, match="no room for the plot"):
        export.chart_slide_png(chart, size=(200, 100))
