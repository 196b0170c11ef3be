"""Helpers shared by the AppTest suites."""
from __future__ import annotations

import json
import re

from streamlit.dataframe_util import convert_arrow_bytes_to_pandas_df
from streamlit.testing.v1 import AppTest


def chart_specs(at: AppTest) -> list[dict]:
    """Each chart's Vega-Lite spec with its datasets put back as lists of records (Streamlit ships them as Arrow)."""
    specs = []
    for chart in at.get("vega_lite_chart"):
        spec = json.loads(chart.proto.spec)
        spec.setdefault("datasets", {}).update(
            {d.name: convert_arrow_bytes_to_pandas_df(d.data.data).to_dict("records") for d in chart.proto.datasets})
        specs.append(spec)
    return specs


def displayed(markdown: str) -> str:
    """The text a Markdown body shows once its backslash escapes are read (pages escape text from files)."""
    return re.sub(r"\\([!-/:-@\[-`{-~])", r"\1", markdown)
