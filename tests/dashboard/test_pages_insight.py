"""The Accuracy, Patterns, Theory and Learn pages through AppTest (the Compare runs page and the insight charts on
their own: tests/insight/test_insight_charts.py); the helpers other page tests import."""
from __future__ import annotations

import json
from pathlib import Path

import pytest
from streamlit.testing.v1 import AppTest

from attn_core import MECHANISMS
from attn_core.insight import accuracy
from attn_core.engine import results
from tests.apptest_helpers import chart_specs as charts, displayed

ROOT = Path(__file__).resolve().parents[2]
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
    panels = linformer.get("hconcat") or linformer["vconcat"]
    titles = [p["title"]["text"] for p in panels]  # side by side, each title wrapped to its panel's width
    assert "pulled back through F" in " ".join(" ".join(t) if isinstance(t, list) else t for t in titles)


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
    assert len(specs) == len(steps) + 3  # and the rest of the lesson's three (tests/dashboard/test_learn_further_page.py)
    weights = next(s for s in specs if s["title"]["text"].startswith("Weights"))
    cells = [r for r in records(weights, "weight")]
    by_cell = {(r["query"], r["key"]): r["weight"] for r in cells}
    for i, query in enumerate(walk.queries):
        for j, key in enumerate(walk.keys):
            assert by_cell[(query, key)] == pytest.approx(float(walk.weights[0, i, j]))
    read = walk.readout()
    shown = metrics_shown(at)
    assert shown["Spread of Q·K (standard deviation)"] == f"{read['raw_std']:.3g}"
    assert shown["Largest softmax weight"] == (f"{read['max_weight']:.3f}" if read["max_weight"] == read["max_weight"]
                                               else "—")
    exports = {b.key for b in at.get("download_button") if b.key.startswith("learn_dl_")}
    assert len(exports) == 3 * (len(steps) + 3) and "learn_dl_learn-7-weights_png" in exports
    table = at.table[0].value
    assert list(table.index) == ["6 (this sentence)", "1,024", "32,768", "1,048,576"]
    assert list(table["score cells (heads · n²)"]) == ["36", "1,048,576", "1,073,741,824", "1,099,511,627,776"]
    assert list(table["their bytes (float32)"]) == ["144 B", "4.0 MiB", "4.0 GiB", "4.0 TiB"]


def test_learn_page_makes_a_chart_and_its_spec_once_and_a_rerun_reuses_them_until_its_step_changes(monkeypatch):
    """A rerun with the same settings makes no step chart and no spec anew and sends the same specs; d_k changed, the
    charts are made again and show the new size. (A seed no other test uses: the caches are shared by every session
    of the process, and left as they are.)"""
    from attn_core.charts import style
    from attn_core.insight import charts as insight_charts

    made, sent = [], []
    real_chart, real_spec = insight_charts.step_chart, style.page_spec
    monkeypatch.setattr(insight_charts, "step_chart", lambda step, **kw: made.append(step.key) or real_chart(step, **kw))
    monkeypatch.setattr(style, "page_spec", lambda chart: sent.append(1) or real_spec(chart))
    at = page("learn", learn_seed=4242)
    first, specs = len(made), charts(at)
    assert errors(at) == [] and first == len(sent) == len(specs)
    at.run()
    assert (len(made), len(sent)) == (first, first) and charts(at) == specs
    at.session_state["learn_d_k"] = 8
    at.run()
    assert errors(at) == [] and len(made) == len(sent) == 2 * first
    assert any("d_k = 8" in json.dumps(spec) for spec in charts(at)) and charts(at) != specs


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
    from tests.dashboard.test_app import APP

    at = AppTest.from_file(APP, default_timeout=60).run()
    at.switch_page("pages/learn.py").run()
    at.button(key="learn_wall").click().run()
    assert [t.value for t in at.title] == ["Benchmark"] and not at.exception
    job = at.session_state["bench"].job
    assert at.session_state["bench"].preset == "The quadratic wall"
    assert [k for k, _ in job.sweeps[0].mechanisms] == ["softmax", "sliding_window", "linear"]
    job.cancel()
