"""The Plan a model page: a built-in model's figures as the planner gives them, a model file read or refused with a
sentence, and the chart of every built-in model's cache."""
from __future__ import annotations

import json

from streamlit.testing.v1 import AppTest

from attn_core import planner, planner_measure
from tests.apptest_helpers import chart_specs
from tests.test_app import APP, routed  # noqa: F401


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


def test_llama_3_8b_at_128k_shows_its_16_gib_cache_and_every_model_s_curve():
    at = planner_page(plan_model="llama-3-8b", plan_n=131072)
    assert not at.exception and [t.value for t in at.title] == ["Plan a model"]
    assert metrics(at)["KV cache"] == "16.0 GiB"
    assert metrics(at)["Recurrent state"] == "0 B"
    assert any("past the 8,192 the model was trained for" in c.value.replace("\\", "") for c in at.caption)
    (spec,) = chart_specs(at)
    drawn = {r["label"] for r in spec["datasets"]["points"]} if "points" in spec["datasets"] else {
        r["label"] for data in spec["datasets"].values() for r in data if "label" in r}
    assert drawn >= {m.name for m in planner.MODELS.values()}


def test_qwen3_next_holds_a_flat_state_beside_its_cache_in_fp32():
    at = planner_page(plan_model="qwen3-next-80b-a3b", plan_n=4096, plan_dtype="float32")
    assert metrics(at)["Recurrent state"] == "72.0 MiB"
    table = at.dataframe[0].value
    assert list(table["holds"]) == ["recurrent state", "keys and values"]


def test_a_gpu_too_small_for_the_cache_is_said_so_and_the_model_file_is_offered():
    at = planner_page(plan_model="llama-3-8b", plan_n=131072, plan_gpu=8.0)
    said = " ".join(c.value.replace("\\", "") for c in at.caption)
    assert "the GPU (8.0 GiB): does not fit" in said
    at = planner_page(plan_model="llama-3-8b", plan_n=4096, plan_gpu=8.0)
    assert "the GPU (8.0 GiB): fits" in " ".join(c.value.replace("\\", "") for c in at.caption)
    assert [b.key for b in at.get("download_button") if b.key == "plan_dl_model"] == ["plan_dl_model"]


def test_the_hybrid_control_turns_layers_into_states_and_says_where_it_holds_less():
    at = planner_page(plan_model="llama-3-8b", plan_n=131072)
    shown = metrics(at)
    assert shown["Holds less from"] == "128 tokens"  # a 128 × 128 state per key/value head = 128 tokens of K and V
    want = planner.plan(planner.hybrid(planner.find("llama-3-8b"), 0.75), 131072).total_bytes
    assert shown["Hybrid: cache and state"] == f"{want / 2**30:.1f} GiB"
    (spec,) = chart_specs(at)
    assert "Llama-3-8B (24 of 32 full attention → gated_deltanet)" in str(spec)
    assert "the hybrid holds less from here" in json.dumps(spec)  # the crossover, marked


def test_measure_on_this_machine_predicts_with_its_method_the_check_runs_and_a_failure_is_a_sentence(monkeypatch):
    at = planner_page(plan_model="llama-3-8b", plan_n=8192, plan_budget=1.0)
    assert "Predicted decode" not in metrics(at)
    at.button(key="plan_measure").click().run()
    assert not at.exception and not at.error
    shown = metrics(at)
    assert shown["Predicted decode"].endswith("tokens/s") and shown["Predicted prefill of 8,192 tokens"].endswith(" s")
    said = " ".join(c.value.replace("\\", "") for c in at.caption)
    assert "Method: predicted, not measured" in said and "timed on 4 of its 32 heads" in said
    assert len(chart_specs(at)) == 2  # the caches, and the predicted decode speed
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
