"""The Plan a model page: a built-in model's figures as the planner gives them, a Hugging Face config.json or a model
file read or refused with a sentence, weights, cache and roofline speeds against hand arithmetic, its designs and
layer pattern, and the chart of every built-in model's cache."""
from __future__ import annotations

import json

import pytest
from streamlit.runtime.media_file_manager import MediaFileManager
from streamlit.testing.v1 import AppTest

from attn_core.studies.planner import model as planner, measure as planner_measure
from tests.apptest_helpers import chart_specs, displayed
from tests.dashboard.test_app import APP, routed  # noqa: F401


def planner_page(**settings) -> AppTest:
    at = AppTest.from_file(APP, default_timeout=60).run()
    at.switch_page("pages/planner.py").run()
    for key, value in settings.items():
        for kind in ("selectbox", "select_slider", "number_input"):
            found = [w for w in at.get(kind) if w.key == key]
            if found:
                found[0].set_value(value)
        at.run()
    return at


def metrics(at: AppTest) -> dict[str, str]:
    return {m.label: m.value for m in at.metric}


def chart_titled(at: AppTest, title: str) -> dict:
    """The one chart whose title starts with `title`."""
    (spec,) = [s for s in chart_specs(at) if str(s.get("title", {}).get("text", "")).startswith(title)]
    return spec


CACHE_CHART = "Cache of the whole model vs context length"
# Meta-Llama-3-8B's config.json, its published values
LLAMA_CONFIG = {"model_type": "llama", "num_hidden_layers": 32, "num_attention_heads": 32, "num_key_value_heads": 8,
                "head_dim": 128, "hidden_size": 4096, "intermediate_size": 14336, "vocab_size": 128256,
                "max_position_embeddings": 8192, "torch_dtype": "bfloat16", "tie_word_embeddings": False,
                "rope_theta": 500000.0, "**not bold** [a link](http://x)": 1}


def uploaded(at: AppTest, name: str, data: bytes) -> AppTest:
    at.file_uploader(key="plan_upload").set_value((name, data, "application/json"))
    return at.run()


def edit(at: AppTest, key: str, edited=None, added=(), deleted=()) -> AppTest:
    """Edit the layer table as its editor reports edits (st.data_editor's state: rows by position)."""
    at.session_state[key] = {"edited_rows": edited or {}, "added_rows": list(added), "deleted_rows": list(deleted)}
    return at.run()


def texts(elements) -> list[str]:
    return [e.value.replace("\\", "") for e in elements]


def test_llama_3_8b_at_128k_shows_its_16_gib_cache_and_every_model_s_curve():
    at = planner_page(plan_model="llama-3-8b", plan_n=131072)
    assert not at.exception and [t.value for t in at.title] == ["Plan a model"]
    assert metrics(at)["KV cache"] == "16.0 GiB"
    assert metrics(at)["Recurrent state"] == "0 B"
    assert any("past the 8,192 the model was trained for" in c.value.replace("\\", "") for c in at.caption)
    spec = chart_titled(at, CACHE_CHART)
    drawn = {r["label"] for r in spec["datasets"]["points"]} if "points" in spec["datasets"] else {
        r["label"] for data in spec["datasets"].values() for r in data if "label" in r}
    assert drawn >= {m.name for m in planner.MODELS.values()}


def test_qwen3_next_holds_a_flat_state_beside_its_cache():
    at = planner_page(plan_model="qwen3-next-80b-a3b", plan_n=4096, plan_dtype="float32")
    assert metrics(at)["Recurrent state"] == "72.0 MiB"  # 36 layers · 32 heads · 128 · 128 · 4 bytes (fp32 states)
    table = next(d.value for d in at.dataframe if "holds" in d.value)  # after the editor's own table
    assert list(table["holds"]) == ["recurrent state", "keys and values"]


def test_a_gpu_too_small_for_weights_and_cache_is_said_so_and_the_model_file_is_offered():
    # 8.03e9 · 2 bytes of weights (14.96 GiB) and 16 GiB of cache at 128k, against the RTX 4090's 24 GiB
    at = planner_page(plan_model="llama-3-8b", plan_n=131072, plan_device="rtx 4090")
    said = " ".join(c.value.replace("\\", "") for c in at.caption)
    assert "Weights and cache 31.0 GiB against its 24.0 GiB: does not fit" in said
    at = planner_page(plan_model="llama-3-8b", plan_n=4096, plan_device="rtx 4090")
    assert "Weights and cache 15.5 GiB against its 24.0 GiB: fits" in " ".join(
        c.value.replace("\\", "") for c in at.caption)
    assert [b.key for b in at.get("download_button") if b.key == "plan_dl_model"] == ["plan_dl_model"]


def test_the_hybrid_control_turns_layers_into_states_and_says_where_it_holds_less():
    at = planner_page(plan_model="llama-3-8b", plan_n=131072)
    shown = metrics(at)
    assert shown["Holds less from"] == "128 tokens"  # a 128 × 128 state per key/value head = 128 tokens of K and V
    want = planner.plan(planner.hybrid(planner.find("llama-3-8b"), 0.75), 131072).total_bytes
    assert shown["Hybrid: cache and state"] == f"{want / 2**30:.1f} GiB"
    spec = chart_titled(at, CACHE_CHART)
    assert "Llama-3-8B (24 of 32 full attention → gated_deltanet)" in str(spec)
    assert "the hybrid holds less from here" in json.dumps(spec)  # the crossover, marked


def test_measure_on_this_machine_predicts_with_its_method_the_check_runs_and_a_failure_is_a_sentence(monkeypatch):
    at = planner_page(plan_model="llama-3-8b", plan_n=8192, plan_budget=1.0)
    assert "Predicted decode" not in metrics(at) and "Hybrid: predicted decode" not in metrics(at)
    # 8 attention layers' keys and values (8 · 2 · 8 heads · 128 · 2 bytes · 8,192 = 256 MiB) and 24 Gated DeltaNet
    # states (24 · 8 · 128 · 128 · 4 bytes = 12 MiB), read whole by a new token, against Llama's 1 GiB
    assert metrics(at)["Hybrid: a new token reads"] == "268.0 MiB"
    assert [m.delta for m in at.metric if m.label == "Hybrid: a new token reads"] == ["-74%"]
    assert any("Hybrid decode tokens/s: measure below" in c for c in texts(at.caption))
    at.button(key="plan_measure").click().run()
    assert not at.exception and not at.error
    shown = metrics(at)
    assert shown["Predicted decode"].endswith("tokens/s") and shown["Predicted prefill of 8,192 tokens"].endswith(" s")
    assert shown["Hybrid: predicted decode"].endswith("tokens/s")  # the model's kinds and Gated DeltaNet, timed
    at.selectbox(key="plan_hybrid_kind").set_value("mamba2").run()  # a kind not timed: said, not predicted
    assert "Hybrid: predicted decode" not in metrics(at) and "Predicted decode" in metrics(at)
    assert any("measure below to time this model and Mamba-2 (SSD) layers" in c for c in texts(at.caption))
    at.selectbox(key="plan_hybrid_kind").set_value("gated_deltanet").run()
    said = " ".join(c.value.replace("\\", "") for c in at.caption)
    assert "Method: predicted, not measured" in said and "timed on 4 of its 32 heads" in said
    assert chart_titled(at, "Predicted tokens per second")  # the decode speed predicted from the timings
    at.button(key="plan_check").click().run()
    assert not at.exception and not at.error
    assert any(label.startswith("Stack decode step at") for label in metrics(at))

    def broken(*args, **kwargs):
        raise RuntimeError("the kernel fell over")
    monkeypatch.setattr(planner_measure, "measure_kinds", broken)
    at.button(key="plan_measure").click().run()
    assert not at.exception
    assert [e.value for e in at.error] == ["The measurement did not run: the kernel fell over"]
    assert "Predicted decode" not in metrics(at)


@pytest.fixture
def files(monkeypatch) -> dict:
    """What the page's download buttons offer, by file name."""
    offered, original = {}, MediaFileManager.add

    def record(self, data, mimetype, coordinates, file_name=None, **kwargs):
        offered[file_name] = data
        return original(self, data, mimetype, coordinates, file_name=file_name, **kwargs)
    monkeypatch.setattr(MediaFileManager, "add", record)
    return offered


def test_an_edited_field_changes_the_plan_the_chart_and_the_file_offered(files):
    at = planner_page(plan_model="llama-3-8b", plan_n=131072)
    at = edit(at, "plan_layers_llama-3-8b", {0: {"kv_heads": 4}})
    assert not at.exception and not at.error
    assert metrics(at)["KV cache"] == "8.0 GiB"  # 2 · 32 layers · 4 heads · 128 · 2 bytes · 131,072
    assert "Configuration: edited here from Llama-3-8B" in texts(at.caption)
    saved = planner.Model.from_json(files["llama-3-8b.json"])
    assert saved.layers[0].kv_heads == 4 and saved.source == "edited here from Llama-3-8B"
    assert "Llama-3-8B (yours)" in json.dumps(chart_titled(at, CACHE_CHART))  # beside the built-in one, told apart
    at = edit(at, "plan_layers_llama-3-8b", {0: {"kv_heads": 4}}, added=[
        {"name": "Mamba-2", "mechanism": "mamba2", "count": 8, "heads": 32, "head_dim": 64, "state_dim": 128}])
    assert metrics(at)["Recurrent state"] == "8.0 MiB"  # 8 layers · 32 heads · 64 · 128 · 4 bytes


@pytest.mark.parametrize("edited, added, sentence", [
    ({0: {"kv_heads": 3}}, [], "layers[0] (full attention): kv_heads 3 does not divide the 32 heads; choose a divisor"),
    ({0: {"window": 512}}, [], "window is set, but Softmax (fused SDPA) takes no window"),
    ({}, [{"name": "half a row", "mechanism": "mamba2"}], "layers[1] (half a row): count must be a whole number"),
    ({0: {"state_dim": 64}}, [], "state_dim is set, but Softmax (fused SDPA) keeps no state of a width to set"),
])
def test_a_bad_edit_shows_the_sentence_naming_the_field_and_nothing_else(edited, added, sentence):
    at = edit(planner_page(plan_model="llama-3-8b"), "plan_layers_llama-3-8b", edited, added)
    assert not at.exception
    (error,) = texts(at.error)
    assert error.startswith("This model cannot be planned: ") and sentence in error
    assert not at.metric and not chart_specs(at)


def test_a_new_model_starts_from_scratch_and_is_built_field_by_field(files):
    at = planner_page(plan_model="new", plan_n=131072)
    assert not at.exception and [s.value for s in at.subheader][0] == "My model"
    assert metrics(at)["KV cache"] == "256.0 MiB"  # 1 layer · 2 · 8 heads · 64 · 2 bytes · 131,072
    at.text_input(key="plan_name_new").set_value("Tiny recurrent").run()
    at = edit(at, "plan_layers_new", {0: {"mechanism": "gated_deltanet", "count": 4}})
    assert [s.value for s in at.subheader][0] == "Tiny recurrent"
    built = planner.Model.from_json(files["tiny-recurrent.json"])
    assert [(k.mechanism, k.count, k.heads, k.head_dim) for k in built.layers] == [("gated_deltanet", 4, 8, 64)]
    assert metrics(at)["KV cache"] == "0 B" and metrics(at)["Recurrent state"] == "512.0 KiB"  # 4 · 8 · 64² · 4
    at.text_input(key="plan_name_new").set_value("").run()
    assert texts(at.error) == ["This model cannot be planned: name must be a text of 1 to 80 characters"]


def test_a_config_json_is_planned_with_its_weights_cache_and_roofline_by_hand():
    at = uploaded(planner_page(plan_n=8192, plan_device="h100 sxm"), "config.json", json.dumps(LLAMA_CONFIG).encode())
    assert not at.exception and not at.error
    shown = metrics(at)
    # parameters: embeddings and output head 2 · 128,256 · 4,096; attention 32 · (2 · 4096² + 2 · 4096 · 1024); MLP
    # 32 · 3 · 4096 · 14,336; norms 65 · 4096 = 8,030,261,248; a token reads all but the input embedding table
    total = 2 * 128256 * 4096 + 32 * (2 * 4096**2 + 2 * 4096 * 1024) + 32 * 3 * 4096 * 14336 + 65 * 4096
    active = total - 128256 * 4096
    assert shown["Weights"] == f"{2 * total / 2**30:.1f} GiB" == "15.0 GiB"
    assert shown["Weights a token reads"] == f"{2 * active / 2**30:.1f} GiB" == "14.0 GiB"
    cache = 2 * 32 * 8 * 128 * 2 * 8192  # K and V · layers · kv heads · head_dim · bf16 · tokens = 1 GiB
    assert shown["Cache"] == "1.0 GiB" and shown["KV cache"] == "1.0 GiB"
    # H100 SXM: 3.35e12 bytes/s; a decode step reads the active weights and the cache once: memory-bound
    assert shown["Decode tokens/s"] == f"{3.35e12 / (2 * active + cache):,.1f}" == "208.3"
    said = " ".join(c.value.replace("\\", "") for c in at.caption)
    assert "on H100 SXM, predicted (roofline), not measured: decode memory-bound: bytes, prefill compute-bound: FLOPs" \
        in said
    assert "weights, MLPs and activations are left out" not in said
    assert "read as a config.json" in said
    notes = [c.value for c in at.caption if "fields this reader does not use" in c.value]
    assert notes and "\\*\\*not bold\\*\\*" in notes[0]  # a field's name from the file, escaped: never bold
    assert chart_titled(at, "Decode tokens/s against the context") and chart_titled(at, "Prefill time against")
    designs = next(d.value for d in at.dataframe if "design" in d.value)
    assert list(designs.set_index("design").loc[["as is", "MQA"], "a token"]) == ["128.0 KiB", "16.0 KiB"]
    assert designs.set_index("design").loc["MQA", "bound: decode, prefill"] == "bytes, FLOPs"
    layers = next(s for s in chart_specs(at) if "vconcat" in s)
    assert "read from its config.json" in json.dumps(layers)


@pytest.mark.parametrize("name, data, sentence", [
    ("**evil**.json", json.dumps({**LLAMA_CONFIG, "num_hidden_layers": 10**9}).encode(), "num_hidden_layers"),
    ("x.json", b"\xff\xfe", "the file is not UTF-8 text"),
], ids=["a-billion-layers", "not-utf8"])
def test_a_hostile_upload_is_refused_with_one_sentence_and_nothing_drawn(name, data, sentence):
    at = uploaded(planner_page(), name, data)
    assert not at.exception
    (error,) = [e.value for e in at.error]
    assert displayed(error).startswith(f"The file {name} is not a model this page can plan: ")
    assert "*" not in error.replace("\\*", "")  # literal(): markup in a file's name is shown as text, never bold
    assert sentence in displayed(error)
    assert not at.metric and not chart_specs(at)

