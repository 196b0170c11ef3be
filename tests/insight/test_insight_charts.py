"""The Compare runs page through AppTest, and the insight pages' charts on their own: what each draws and names, its
downloads, and talk mode's large type."""
from __future__ import annotations

import json
import math
import re

import pandas as pd
import pytest
from streamlit.testing.v1 import AppTest

from attn_core.insight import accuracy, effective, published, ratio, theory
from attn_core.insight import charts as insight_charts
from attn_core.engine import results
from tests.apptest_helpers import chart_specs as charts, displayed
from tests.dashboard.test_pages_insight import FAST_ACCURACY, errors, page, records, run_bytes


# ---- Compare runs ----

def upload(at: AppTest, *files) -> AppTest:
    at.file_uploader(key="cmp_upload").set_value(list(files))
    return at.run()


def test_compare_page_asks_for_files_first():
    at = page("compare")
    assert errors(at) == [] and charts(at) == []
    assert "Upload one or more saved runs" in at.info[0].value


def test_compare_page_overlays_runs_from_two_machines_with_a_ratio():
    at = upload(page("compare"), ("laptop.json", run_bytes("Laptop CPU", 1.0), "application/json"),
                ("server.csv", run_bytes("Server CPU", 0.25, fmt="csv"), "text/csv"))
    assert errors(at) == []
    overlay, relative, ratio = charts(at)
    shapes = {r["source"] for r in records(overlay, "source")}
    assert shapes == {"laptop.json · Laptop CPU", "server.csv · Server CPU"}
    assert "published, different hardware" in json.dumps(relative)
    ratios = [r["ratio"] for r in records(ratio, "ratio")]
    assert ratios and all(r == pytest.approx(0.25) for r in ratios)
    at.toggle(key="cmp_published").set_value(False).run()
    assert "published, different hardware" not in json.dumps(charts(at)[1])
    at.selectbox(key="cmp_b").set_value("laptop.json").run()
    assert "Run A and run B are the same; choose two different runs." in errors(at)


def test_compare_page_names_generate_runs_and_shows_no_forward_pass_figures_beside_them():
    runs = [(f"{name}.json", run_bytes(name, f, keys=("softmax", "sdpa", "linear"), mode="generate"),
             "application/json") for name, f in (("laptop", 1.0), ("server", 0.5))]
    at = upload(page("compare"), *runs)
    assert errors(at) == []
    overlay, relative, _ = charts(at)
    assert "Time per generated token vs context length, 2 runs" in json.dumps(overlay["title"])
    assert at.toggle(key="cmp_published").disabled and not at.toggle(key="cmp_published").value
    assert "published, different hardware" not in json.dumps(relative)


def test_compare_page_rejects_malformed_foreign_and_oversized_files(monkeypatch):
    monkeypatch.setattr(results, "MAX_FILE_BYTES", 20_000)  # the page's limit, made small enough to test quickly
    good = run_bytes("Laptop CPU", 1.0, ns=(256,))
    at = upload(page("compare"),
                ("broken.json", b'{"format": "attention-lab-run", "rows": [', "application/json"),
                ("foreign.csv", b"city,population\nParis,2100000\n", "text/csv"),
                ("picture.json", bytes(range(256)) * 4, "application/json"),
                ("huge.json", b" " * 30_000 + good, "application/json"),
                ("good.json", good, "application/json"))
    messages = errors(at)
    assert len(messages) == 4
    assert messages[0].startswith("broken.json is not valid JSON")
    assert messages[1].startswith("foreign.csv is not an Attention Lab run")
    assert messages[2].startswith("picture.json is not a text file")
    assert messages[3].startswith("huge.json is 0.0 MiB, larger than")
    assert len(charts(at)) == 2  # the good file is still shown; no ratio with one run
    assert "Upload a second run" in at.info[-1].value


def test_compare_page_says_when_runs_share_no_point():
    at = upload(page("compare"), ("a.json", run_bytes("A", 1.0, ns=(256,)), "application/json"),
                ("b.json", run_bytes("B", 1.0, ns=(512,)), "application/json"))
    assert errors(at) == []
    assert any("a.json and b.json share no point" in displayed(w.value) for w in at.warning)


# ---- charts and exports ----

def test_error_chart_names_the_points_a_log_axis_cannot_show():
    frame = pd.DataFrame({"mechanism": "sliding_window", "label": "Sliding window", "param": "window",
                          "value": [2, 8], "params": ["window=2", "window=8"], "kl": [math.inf, 0.5],
                          "inputs": "gaussian", "seed": 0, "n": 32, "d_model": 32, "heads": 2, "dtype": "float32"})
    spec = insight_charts.error_chart(frame, "kl").to_dict()
    assert any("not drawn" in line and "inf" in line for line in spec["title"]["subtitle"])
    drawn = [r for d in spec["datasets"].values() for r in d]
    assert [r["value"] for r in drawn] == [8]


def test_speed_accuracy_chart_marks_the_front():
    frame = accuracy.speed_accuracy([("sdpa", {}), ("linear", {}), ("performer", {"features": 4})], n=16,
                                    d_model=16, heads=1, repeats=1)
    spec = insight_charts.speed_accuracy_chart(frame).to_dict()
    layers = spec["layer"]
    assert layers[0]["encoding"]["size"]["field"] == "memory_mib"
    front = spec["datasets"][layers[1]["data"]["name"]]
    assert len(front) == int(frame["pareto"].sum()) >= 1


def test_pattern_chart_has_a_panel_per_head_and_independent_colours():
    q, k, v = accuracy.make_inputs("local", 1, 3, 6, 4)
    maps = effective.attention_maps("sliding_window", q, k, v, effective.token_labels("a b c d e f"), window=1)
    spec = insight_charts.pattern_chart(maps["cells"], maps["weights"], title="Sliding window").to_dict()
    cells, weights = spec["vconcat"]
    assert weights["facet"]["field"] == "head" and weights["columns"] == 2 and "facet" not in cells
    assert spec["resolve"]["scale"]["color"] == "independent"


def test_theory_and_fit_charts():
    frame = theory.costs(["softmax", "linformer"], [128, 1024], params={"linformer": {"rank": 256}})
    spec = insight_charts.theory_chart(frame, "total_bytes", budgets={"24 GB GPU": 24 * theory.GIB}).to_dict()
    assert "not applicable at some n: Linformer" in spec["title"]["subtitle"][0]
    assert any(layer["mark"]["type"] == "rule" for layer in spec["layer"])
    table = theory.fit_table(["softmax", "linformer"], {"tiny": 1000.0, "24 GB GPU": 24 * theory.GIB})
    assert "fits nowhere: Linformer" in insight_charts.fit_chart(table).to_dict()["title"]["subtitle"]


def test_reference_layer_leaves_out_baselines_and_adds_no_colour_scale():
    layer = insight_charts.reference_layer(published.relative("speed"), y="speedup").to_dict()
    rows = [r for d in layer["datasets"].values() for r in d]
    assert rows and not {"PyTorch Attention", "Transformer"} & {r["method"] for r in rows}
    assert all("speedup" in r for r in rows)
    assert all("color" not in sub.get("encoding", {}) for sub in layer["layer"])


def test_downloads_are_real_files():
    frame = pd.DataFrame({"mechanism": ["softmax"], "label": ["Softmax (materialized)"], "n": [4], "value": [1.0],
                          "source": ["a · b"], "run": ["a"], "machine": ["b"]})
    chart = insight_charts.relative_chart(frame)
    made = {fmt: (data(), name) for fmt, data, name, _ in insight_charts.downloads(chart, frame, "speed")}
    assert made["PNG"][0].startswith(b"\x89PNG") and made["PNG"][1] == "speed.png"
    assert b"<svg" in made["SVG"][0]
    assert made["CSV"][0].decode().splitlines()[0] == "mechanism,label,n,value,source,run,machine"


def test_ratio_axis_fits_ratios_near_one():
    """Ratios of 1.0 to 1.6 on an axis of about 0.87 to 1.84, not Vega's nice 1 to 10."""
    ratios = pd.DataFrame({"mechanism": ["softmax"] * 3, "label": ["Softmax"] * 3, "params": ["{}"] * 3,
                           "n": [256, 512, 1024], "ratio": [1.0, 1.3, 1.6]})
    y = ratio.ratio_chart(ratios, "A", "B").to_dict()["layer"][0]["encoding"]["y"]
    low, high = y["scale"]["domain"]
    assert y["scale"]["nice"] is False and 0.8 < low < 1.0 and 1.6 < high < 2.0
    assert insight_charts.ratio_domain(pd.Series([0.25, 0.5])) == pytest.approx((0.25 / 1.15, 1.15))


def test_published_figures_are_named_in_a_legend_not_by_labels_that_overlap():
    chart = insight_charts.relative_chart(
        pd.DataFrame({"mechanism": ["linear"] * 2, "label": ["Linear"] * 2, "n": [1024, 4096],
                      "value": [1.5, 4.0], "source": ["a · b"] * 2, "run": ["a"] * 2, "machine": ["b"] * 2}),
        "time_median_s", reference=published.relative("speed"))
    spec = chart.to_dict()
    assert not [layer for layer in _layers(spec) if layer.get("mark", {}).get("type") == "text"]
    svg = insight_charts.downloads(chart, pd.DataFrame(), "x")[1][1]().decode()
    shown = set(re.findall(r"<text[^>]*>([^<]*)</text>", svg))
    tags = {t for t in shown if t.endswith(")") and "(" in t}
    assert len(tags) >= 2 and any(t.startswith("Performer") for t in tags)


def _layers(spec: dict) -> list[dict]:
    """Every layer of a (nested) layered spec."""
    found = []
    for layer in spec.get("layer", []):
        found += [layer] + _layers(layer)
    return found


def test_pattern_heatmaps_are_large_enough_to_read():
    cells = pd.DataFrame([{"head": 0, "i": i, "j": j, "query": str(i), "key": str(j), "computed": i >= j}
                          for i in range(12) for j in range(12)])
    weights = cells.rename(columns={"computed": "weight"}).assign(weight=lambda f: f["weight"] / 12.0)
    spec = insight_charts.pattern_chart(cells, weights, title="t").to_dict()
    assert all(panel["width"] >= 260 and panel["height"] >= 260 for panel in spec["hconcat"])


def test_one_head_of_a_sentence_sits_side_by_side_and_a_long_one_or_two_heads_stack():
    """Two panels of 12 tokens (22 px a cell: 264 px) side by side fit an 850 px column; 20 tokens (440 px) or two
    heads (four panels) would not, and stack."""
    def frame(heads, n):
        cells = pd.DataFrame([{"head": h, "i": i, "j": j, "query": str(i), "key": str(j), "computed": True}
                              for h in range(heads) for i in range(n) for j in range(n)])
        return cells, cells.rename(columns={"computed": "weight"}).assign(weight=1.0 / n)

    assert "hconcat" in insight_charts.pattern_chart(*frame(1, 12), title="t").to_dict()
    assert "vconcat" in insight_charts.pattern_chart(*frame(1, 20), title="t").to_dict()
    assert "vconcat" in insight_charts.pattern_chart(*frame(2, 12), title="t").to_dict()


@pytest.mark.parametrize("name, state", [("accuracy", FAST_ACCURACY), ("theory", {})])
def test_insight_charts_take_talk_modes_large_type(name, state):
    from attn_core.charts.style import TALK_MIN_PX

    plain, talk = page(name, **state), page(name, **state, talk=True)
    for spec in charts(talk):
        config = spec["config"]
        sizes = [config["axis"]["labelFontSize"], config["axis"]["titleFontSize"], config["legend"]["labelFontSize"],
                 config["title"]["fontSize"], config["title"]["subtitleFontSize"], config["text"]["fontSize"]]
        assert min(sizes) >= TALK_MIN_PX
    assert charts(plain) and charts(plain)[0]["config"]["axis"]["labelFontSize"] < TALK_MIN_PX
