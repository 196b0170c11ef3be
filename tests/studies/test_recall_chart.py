"""Recall's charts read from their Vega-Lite dicts: the names every other page uses, no label drawn on another, a
subtitle in whole lines."""
import pandas as pd

from attn_core.charts import style
from attn_core.studies.recall import mqar as recall
from attn_core.studies.recall import chart

LONG = ("seq 64, 16 pairs, vocabulary 128, d_model 64, 1200 steps · Intel(R) Xeon(R) CPU @ 2.20GHz, 2 cores, 1 "
        "thread(s) used, load average 1.02 at the end")


def test_cli_keys_become_the_names_the_other_pages_use():
    # written out by hand from the catalogue's labels: a default parameter is left out, a changed one shown
    assert chart.display_name("gated_deltanet:chunk=32") == "Gated DeltaNet"
    assert chart.display_name("sliding_window:window=8") == "Sliding window (window=8)"
    assert chart.display_name("sdpa:kv_heads=1") == "Softmax (fused SDPA) · MQA"
    assert chart.display_name("sdpa:kv_heads=2") == "Softmax (fused SDPA) · GQA-2"
    assert chart.display_name("softmax") == "Softmax (materialized)"
    assert chart.display_name("not_a_key:x=1") == "not_a_key:x=1"  # a saved file's own name, as written


def test_the_shipped_reference_is_drawn_by_name_without_labels_on_each_other():
    ref = recall.frame(recall.reference()["results"])
    spec = chart.recall_scatter(ref, chance=0.01, subtitle=LONG).to_dict()
    assert not [layer for layer in spec["layer"] if layer["mark"] in ("text", {"type": "text"})
                or isinstance(layer["mark"], dict) and layer["mark"]["type"] == "text"]  # no name beside a dot
    colour = spec["layer"][0]["encoding"]["color"]
    assert colour["field"] == "name" and spec["layer"][0]["encoding"]["shape"]["field"] == "name"
    assert "gated_deltanet:chunk=32" not in colour["scale"]["domain"] and "Gated DeltaNet" in colour["scale"]["domain"]
    assert len(set(colour["scale"]["range"])) == len(colour["scale"]["domain"]) <= style.MAX_COLOURS
    subtitle = spec["title"]["subtitle"]
    assert " ".join(subtitle) == LONG and all(len(line) <= style.SUBTITLE_CHARS for line in subtitle)


def test_training_curves_are_coloured_by_name():
    curves = pd.DataFrame({"mechanism": ["sliding_window:window=8"] * 2, "key": ["sliding_window"] * 2,
                           "lr": [0.01, 0.01], "step": [1, 2], "loss": [2.0, 1.0], "accuracy": [0.1, 0.2]})
    spec = chart.curves_chart(curves).to_dict()
    colour = spec["encoding"]["color"] if "encoding" in spec else spec["layer"][0]["encoding"]["color"]
    assert colour["scale"]["domain"] == ["Sliding window (window=8)"]
