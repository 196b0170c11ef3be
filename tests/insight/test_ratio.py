"""Compare's ratio chart, read from its Vega-Lite dict: an axis title that fits beside the plot, a plot tall enough
to read, the runs named whole in the subtitle."""
import pandas as pd

from attn_core.charts import style
from attn_core.insight import ratio

RATIOS = pd.DataFrame({"mechanism": ["softmax"] * 3, "label": ["Softmax"] * 3, "params": ["{}"] * 3,
                       "n": [256, 512, 1024], "ratio": [1.0, 1.3, 1.6]})
LONG = "laptop-run-2026-11-28-busy-with-a-video-call-and-slides-open-measured-again.json"  # 80 characters


def test_the_y_title_fits_beside_the_plot_whatever_the_runs_are_called():
    spec = ratio.ratio_chart(RATIOS, LONG, LONG.replace("laptop", "desktop"), "time_median_s").to_dict()
    y = spec["layer"][0]["encoding"]["y"]
    # 13–14 px DejaVu Sans is about 8 px a character: 30 characters take ~240 px of the 360 px beside them
    assert all(len(line) <= 30 for line in y["title"]) and spec["height"] >= 200
    assert LONG not in " ".join(y["title"])  # the names are not on the axis ...
    subtitle = spec["title"]["subtitle"]
    assert "".join(subtitle).replace(" ", "").count(LONG.replace(" ", "")) == 1  # ... but in the subtitle, whole
    assert all(len(line) <= style.SUBTITLE_CHARS for line in subtitle) and not any("…" in s for s in subtitle)
    assert spec["title"]["text"] == "Time of run B ÷ run A"
    memory = ratio.ratio_chart(RATIOS, "a", "b", "peak_bytes").to_dict()
    assert memory["layer"][0]["encoding"]["y"]["title"][0] == "Peak memory, run B ÷ run A"


def test_a_name_with_control_characters_is_shown_as_text():
    spec = ratio.ratio_chart(RATIOS, "a\x1bname", "b\u202ename").to_dict()
    subtitle = " ".join(spec["title"]["subtitle"])
    assert "\x1b" not in subtitle and "\\x1b" in subtitle and "\u202e" not in subtitle


def test_a_hostile_name_exports_to_well_formed_svg():
    from xml.etree import ElementTree

    from attn_core.charts import export
    svg = export.chart_svg(ratio.ratio_chart(RATIOS, "a\x1b]0;x\x07\\\"", "<b>&amp;" * 40)).decode("utf-8")
    ElementTree.fromstring(svg)  # XML 1.0 forbids ESC and BEL: parsed means none is left raw
    assert "\x1b" not in svg and "\x07" not in svg
