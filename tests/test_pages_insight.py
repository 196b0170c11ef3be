"""The Accuracy, Patterns, Theory and Compare runs pages through AppTest, and the charts they draw."""
from __future__ import annotations

import json
import math
import re
from pathlib import Path

import pandas as pd
import pytest
from streamlit.testing.v1 import AppTest

from attn_core import MECHANISMS
from attn_core.insight import accuracy, effective, published, theory
from attn_core.insight import charts as insight_charts
from attn_core.engine import results
from tests.apptest_helpers import chart_specs as charts, displayed

ROOT = Path(__file__).resolve().parents[1]
SENTENCE_WORDS = "the cat sat on the mat because it was tired and warm".split()
FAST_ACCURACY = {"acc_n": 32, "acc_d_model": 32, "acc_heads": 2, "acc_scatter": False}


def page(name: str, **state) -> AppTest:
    """A page run once with widget values preset by key (so the first run is already small)."""
    at = AppTest.from_file(str(ROOT / "pages" / f"{name}.py"), default_timeout=60)
    for key, value in state.items():
        at.session_state[key] = value
    return at.run()


def errors(at: AppTest) -> list[str]:
    assert not at.exception, [e.value for e in at.exception]
    return [displayed(e.value) for e in at.error]


def records(spec: dict, column: str) -> list[dict]:
    """All rows of a chart's datasets that have `column`."""
    return [r for rows in spec["datasets"].values() for r in rows if column in r]


def run_bytes(device: str, factor: float, ns=(256, 512, 1024), keys=("softmax", "sdpa", "linformer"),
              fmt: str = "json", mode: str = "forward") -> bytes:
    """A small saved run: time ∝ n² (softmax, sdpa) or n (linformer), scaled by `factor`, from `device`."""
    rows = []
    for key in keys:
        spec = MECHANISMS[key]
        for n in ns:
            t = factor * (1e-9 * n * n if spec.exact else 1e-6 * n)
            rows.append(dict(mechanism=key, label=spec.label, exact=spec.exact, params=json.dumps(spec.defaults),
                             n=n, batch=1, heads=4, d_model=256, head_dim=64, dtype="float32", device="cpu",
                             mode=mode, causal=False, status="ok", reason="", time_median_s=t,
                             time_iqr_s=t / 10, time_samples=[t, t], repeats=2, peak_bytes=float(n * 1000),
                             memory_method="test", predicted_bytes=float(n * 1000), theory_flops=1.0, gflops=1.0,
                             device_gflops=1.0, pct_of_device=1.0, sdpa_backend="math", threads=2.0))
    run = results.Run(results.frame_from_rows(rows), {"device_name": device, "device": "cpu"}, {})
    return results.to_json_bytes(run) if fmt == "json" else results.to_csv_bytes(run)


# ---- Accuracy ----

def test_accuracy_page_runs_with_defaults():
    at = page("accuracy")
    assert errors(at) == []
    assert len(charts(at)) == 1  # error vs features; the speed–accuracy scatter waits for its toggle
    table = at.dataframe[0].value
    assert table["parameters"].tolist() == [f"features={v}" for v in accuracy.sweep_values("performer", "features",
                                                                                             256)]
    assert {b.key for b in at.get("download_button")} == {"acc_dl_error_png", "acc_dl_error_svg", "acc_dl_error_csv"}


def test_accuracy_page_opens_on_the_working_regime_and_one_click_shows_the_hard_case():
    """Performer on gentle inputs: the error falls as features grow, to a few percent; the button shows unit-variance
    inputs, where it stays above 100 %, and says why."""
    at = page("accuracy")
    error = at.dataframe[0].value["relative Frobenius error"]
    assert at.selectbox(key="acc_inputs_performer").value == "gentle"
    assert error.is_monotonic_decreasing and error.iloc[-1] < 0.1
    assert not any("hard case" in i.value for i in at.info)
    at.button(key="acc_flip").click().run()
    assert at.selectbox(key="acc_inputs_performer").value == "gaussian"
    assert at.dataframe[0].value["relative Frobenius error"].min() > 1
    assert any("hard case for Performer" in i.value and "exp(‖q‖² + ‖k‖²)" in i.value for i in at.info)
    at.button(key="acc_flip").click().run()
    assert at.selectbox(key="acc_inputs_performer").value == "gentle"


def test_accuracy_tables_name_their_columns_for_a_reader():
    at = page("accuracy", **{**FAST_ACCURACY, "acc_scatter": True})
    for table in (t.value for t in at.dataframe):
        assert not {"rel_fro", "time_s", "predicted_bytes", "params"} & set(table.columns)
        assert "relative Frobenius error" in table.columns and "time (ms)" in table.columns


def test_accuracy_page_times_every_mechanism_on_request():
    at = page("accuracy", **{**FAST_ACCURACY, "acc_scatter": True})
    assert errors(at) == []
    error, scatter = charts(at)
    # every mechanism that runs without a causal mask (the page's default): not one that runs causal only
    assert {r["mechanism"] for r in records(scatter, "time_ms")} == {k for k, s in MECHANISMS.items()
                                                                       if not s.supports.causal_only}
    only = [s for s in MECHANISMS.values() if s.supports.causal_only]
    (said,) = [c.value for c in at.caption if c.value.startswith("Not on the scatter at these settings")]
    assert all(f"{s.label} runs causal only" in said.replace("\\", "") for s in only) and only
    assert "acc_dl_scatter_svg" in {b.key for b in at.get("download_button")}


def test_accuracy_sweep_renders_the_values_asked_for():
    at = page("accuracy", **FAST_ACCURACY, acc_mechanism="sliding_window", acc_values_sliding_window_window="2, 8")
    assert errors(at) == []
    (spec,) = charts(at)
    assert sorted({p["value"] for p in records(spec, "value")}) == [2, 8]
    assert at.dataframe[0].value["parameters"].tolist() == ["window=2", "window=8"]


@pytest.mark.parametrize("state,sentence", [
    ({"acc_values_performer_features": "16, lots"}, "Values must be numbers separated by commas"),
    ({"acc_mechanism": "linformer", "acc_values_linformer_rank": "8, 64"}, "choose rank ≤ 32"),
    ({"acc_d_model": 31}, "d_model 31 is not divisible by 2 heads; choose a multiple of 2"),
    ({"acc_mechanism": "linformer", "acc_causal": True}, "Linformer cannot be causal"),
])
def test_accuracy_page_refuses_invalid_settings_with_a_sentence(state, sentence):
    at = page("accuracy", **{**FAST_ACCURACY, **state})
    assert any(sentence in e for e in errors(at))
    assert charts(at) == []


def test_accuracy_page_without_a_parameter_shows_one_row():
    at = page("accuracy", **FAST_ACCURACY, acc_mechanism="linear")
    assert errors(at) == [] and charts(at) == []
    assert len(at.dataframe[0].value) == 1


# ---- Patterns ----

def test_patterns_page_runs_with_defaults():
    at = page("patterns")
    assert errors(at) == []
    specs = charts(at)
    assert len(specs) == 4  # softmax beside the three default mechanisms
    assert any("Inputs are not a trained model" in i.value for i in at.info)
    assert any("n=1024" in t for s in specs for t in s["title"]["subtitle"])


def test_patterns_page_counts_cells_and_pulls_linformer_back():
    at = page("patterns", pat_mechanisms=["sliding_window", "linformer"], pat_sliding_window_window=64,
              pat_linformer_rank=4, pat_pull_back=True)
    assert errors(at) == []
    subtitles = [t for s in charts(at) for t in s["title"]["subtitle"]]
    assert "Sliding window, window=64, n=1024: 12.2% of the n² cells" in subtitles
    linformer = charts(at)[-1]
    assert "pulled back through F" in json.dumps(linformer)


def test_patterns_page_draws_the_cells_topk_and_nsa_read():
    at = page("patterns", pat_mechanisms=["topk", "nsa"], pat_causal=True, pat_heads=1, pat_count_n=256)
    assert errors(at) == []
    specs = charts(at)
    subtitles = [t for s in specs for t in s["title"]["subtitle"]]
    assert not any("implicitly" in t for t in subtitles)
    topk = next(t for t in subtitles if t.startswith("Top-k"))
    assert "read by softmax (each query's top_k keys); the indexer scores every earlier key" in topk
    nsa = next(t for t in subtitles if t.startswith("NSA"))
    assert "of the n² cells read in full (the selected blocks and the window" in nsa
    assert "compressed block means a query" in nsa

    def drawn(spec):  # the cells panel's computed flags, by (query, key) label
        return {(r["query"], r["key"]): r["computed"] for r in records(spec, "computed")}

    words = len(SENTENCE_WORDS)
    topk_cells, nsa_cells = drawn(specs[1]), drawn(specs[2])
    kept = sum(topk_cells.values())  # small top_k = n // 4 = 3 keys a query, fewer while fewer are seen
    assert kept == sum(min(3, t + 1) for t in range(words)) < words * (words + 1) // 2
    assert any(key.startswith("c0 ") for _, key in nsa_cells)  # the compressed blocks, after the keys
    assert "compressed blocks" in json.dumps(specs[2])


@pytest.mark.parametrize("state,sentence", [
    ({"pat_sentence": "   "}, "The sentence is empty"),
    ({"pat_linformer_rank": 40}, "choose rank ≤ 12 (the sentence has 12 words)"),
    ({"pat_causal": True}, "Linformer cannot be causal"),
])
def test_patterns_page_refuses_invalid_settings(state, sentence):
    at = page("patterns", **state)
    assert any(sentence in e for e in errors(at))
    assert charts(at) == []


# ---- Theory ----

def test_theory_page_runs_with_defaults():
    at = page("theory")
    assert errors(at) == []
    # the default selection tells one story (quadratic, windowed, linear); every mechanism stays on offer
    assert at.multiselect(key="th_mechanisms").value == ["softmax", "sliding_window", "linear"]
    assert at.multiselect(key="th_mechanisms").options == [s.label for s in MECHANISMS.values()]
    flops = next(c for c in charts(at) if "FLOP" in json.dumps(c.get("title", "")))
    story = {MECHANISMS[k].label for k in ("softmax", "sliding_window", "linear")}
    assert {r["label"] for r in records(flops, "label")} == story
    assert len(charts(at)) == 6  # FLOPs, memory, time, what fits; the model's cache, its tokens per second
    assert any("An extrapolation, not a measurement" in w.value for w in at.warning)
    assert any("each generated token reads the whole cache once" in w.value for w in at.warning)
    big_o = at.dataframe[-1].value
    assert big_o["mechanism"].tolist() == list(MECHANISMS)


def test_theory_page_shows_a_whole_models_cache_and_what_fits():
    at = page("theory", th_mechanisms=["softmax", "sliding_window", "linear", "linformer"], th_budget=2.0)
    assert errors(at) == []
    assert any(c.value.startswith("Not drawn: Linformer: Its projections") for c in at.caption)
    fits = at.dataframe[1].value.set_index("mechanism")
    # Llama 3 8B's 8 key/value heads for 32 query heads: 32 layers × 8 heads × 128 dims × 2 (K and V) × 2 bytes =
    # 128 KiB a token: 2 GiB hold 16,384 tokens; with a key/value head for every query head, a quarter of that
    assert fits.loc["Softmax (materialized)", "custom"] == "16,384 tokens"
    mha = page("theory", th_mechanisms=["softmax"], th_budget=2.0, th_model_kv=0)
    assert mha.dataframe[1].value.set_index("mechanism").loc["Softmax (materialized)", "custom"] == "4,096 tokens"
    assert fits.loc["Linear (elu+1)", "custom"] == "any length"
    assert "Linformer" not in " ".join(fits.index)
    cache = [c for c in charts(at) if "Cache of the whole model" in json.dumps(c)]
    assert len(cache) == 1 and "Context length n" in json.dumps(cache[0])


def test_theory_page_shows_the_tokens_an_nsa_decode_step_reads():
    at = page("theory", th_mechanisms=["softmax", "nsa"], th_n=(1024, 65536))
    assert errors(at) == []
    reads = [d.value for d in at.dataframe if "tokens_read" in d.value.columns]
    assert len(reads) == 1
    # the paper's Table 4 less one compressed block each: 2048, 2560, 3584, 5632 at 8K … 64K
    assert reads[0]["context"].tolist() == [8192, 16384, 32768, 65536]
    assert reads[0]["tokens_read"].tolist() == [2047, 2559, 3583, 5631]
    assert reads[0]["mechanism"].unique().tolist() == ["NSA"]
    assert any(c.value.startswith("NSA: The paper's Table 4") and "one less each" in c.value for c in at.caption)
    softmax = page("theory", th_mechanisms=["softmax"], th_n=(1024, 65536))
    assert not any("tokens_read" in d.value.columns for d in softmax.dataframe)


@pytest.mark.parametrize("state,sentence", [
    ({"th_heads": 6}, "d_model 1024 is not divisible by 6 heads; choose a multiple of 6"),
    ({"th_mechanisms": []}, "Choose at least one mechanism."),
    ({"th_source": "a figure I type", "th_gflops": 0.0}, "Type a matmul throughput above 0 GFLOP/s"),
])
def test_theory_page_refuses_invalid_settings(state, sentence):
    at = page("theory", **state)
    assert any(e.startswith(sentence) for e in errors(at))
    assert charts(at) == []


def test_theory_page_with_a_typed_throughput_and_a_custom_budget():
    at = page("theory", th_source="a figure I type", th_gflops=1000.0, th_budget=2.0, th_causal=True,
              th_mechanisms=["softmax", "sdpa", "linformer", "linear"])
    assert errors(at) == []
    assert any("Linformer cannot be causal" in w.value for w in at.warning)
    fits = at.dataframe[0].value
    assert "custom" in fits.columns and fits.loc["Softmax (materialized)", "custom"] < fits.loc[
        "Softmax (fused SDPA)", "custom"]


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
    y = insight_charts.ratio_chart(ratios, "A", "B").to_dict()["layer"][0]["encoding"]["y"]
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
    assert all(panel["width"] >= 260 and panel["height"] >= 260 for panel in spec["vconcat"])


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


# ---- Learn ----

def metrics_shown(at: AppTest) -> dict[str, str]:
    return {m.label: m.value for m in at.metric}


def test_learn_page_walks_the_sentence_with_every_number_from_the_library():
    from attn_core.insight import lesson

    at = page("learn")
    assert errors(at) == []
    walk = lesson.walk("the cat sat on the mat", lesson.Setup())
    steps = lesson.steps(walk)
    assert [h.value for h in at.subheader][:len(steps)] == [f"{i}. {s.title}" for i, s in enumerate(steps, 1)]
    specs = charts(at)
    assert len(specs) == len(steps) + 3  # and the rest of the lesson's three (tests/test_learn_further_page.py)
    weights = next(s for s in specs if s["title"]["text"].startswith("Weights"))
    cells = [r for r in records(weights, "weight")]
    by_cell = {(r["query"], r["key"]): r["weight"] for r in cells}
    for i, query in enumerate(walk.queries):
        for j, key in enumerate(walk.keys):
            assert by_cell[(query, key)] == pytest.approx(float(walk.weights[0, i, j]))
    read = walk.readout()
    shown = metrics_shown(at)
    assert shown["Spread of Q·K (standard deviation)"] == f"{read['raw_std']:.3g}"
    assert shown["Largest softmax weight"] == f"{read['max_weight']:.3f}"
    exports = {b.key for b in at.get("download_button") if b.key.startswith("learn_dl_")}
    assert len(exports) == 3 * (len(steps) + 3) and "learn_dl_learn-7-weights_png" in exports
    table = at.table[0].value
    assert list(table.index) == ["6 (this sentence)", "1,024", "32,768", "1,048,576"]
    assert list(table["score cells (heads · n²)"]) == ["36", "1,048,576", "1,073,741,824", "1,099,511,627,776"]
    assert list(table["their bytes (float32)"]) == ["144 B", "4.0 MiB", "4.0 GiB", "4.0 TiB"]


def test_learn_page_shows_saturation_without_the_scale():
    at = page("learn", learn_d_k=512, learn_scaled=False,
              learn_sentence="one two three four five six seven eight nine ten eleven twelve")
    assert errors(at) == []
    assert float(metrics_shown(at)["Largest softmax weight"]) > 0.99
    assert float(metrics_shown(at)["Spread of Q·K (standard deviation)"]) > 15
    assert any("Not scaled" in h.value for h in at.subheader)


@pytest.mark.parametrize("state, present, absent", [
    ({"learn_causal": True, "learn_pad": 1}, "Masked: −∞ before the softmax", None),
    ({"learn_score": "additive"}, "Scores e = vᵀ tanh(q W_a + k U_a)", "Scaled S / √d_k"),
    ({"learn_cross": True, "learn_source": "le chat"}, "Keys K = X_source W_K", "Masked: −∞ before the softmax"),
    ({"learn_heads": 3}, "Heads concatenated", None)])
def test_learn_page_follows_its_settings(state, present, absent):
    at = page("learn", **state)
    assert errors(at) == []
    titles = [h.value.split(". ", 1)[1] for h in at.subheader if ". " in h.value]
    assert present in titles and (absent is None or absent not in titles)
    if state.get("learn_heads") == 3:
        assert any("facet" in spec for spec in charts(at))
    if state.get("learn_causal"):
        masked = next(s for s in charts(at) if s["title"]["text"].startswith("Masked"))
        assert {r["text"] for r in records(masked, "masked") if r["masked"]} == {"−∞"}


@pytest.mark.parametrize("state, sentence", [
    ({"learn_sentence": "   "}, "The sentence is empty; type a few words."),
    ({"learn_sentence": " ".join(["w"] * 13)}, "use at most 12"),
    ({"learn_causal": True, "learn_cross": True}, "A causal mask needs self-attention")])
def test_learn_page_refuses_bad_settings_with_a_sentence(state, sentence):
    at = page("learn", **state)
    assert any(sentence in e for e in errors(at)) and charts(at) == []


def test_learn_page_leads_to_the_quadratic_wall_measured_live():
    from tests.test_app import APP

    at = AppTest.from_file(APP, default_timeout=60).run()
    at.switch_page("pages/learn.py").run()
    at.button(key="learn_wall").click().run()
    assert [t.value for t in at.title] == ["Benchmark"] and not at.exception
    job = at.session_state["bench"].job
    assert at.session_state["bench"].preset == "The quadratic wall"
    assert [k for k, _ in job.sweeps[0].mechanisms] == ["softmax", "sliding_window", "linear"]
    job.cancel()
