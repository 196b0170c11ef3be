"""The model planner: every built-in model's cache recomputed by hand from its published configuration, the prefill
FLOPs against the plain formula, model files read back and refused with sentences naming the field, and the CLI."""
from __future__ import annotations

import io
import json
import re

import numpy as np
import pandas as pd
import pytest

from attn_core import cli
from attn_core.studies.planner import model as planner

GIB = 2**30
BF16 = 2


def kv(layers: int, kv_heads: int, head_dim: int, tokens: int, elem: int = BF16) -> int:
    """Keys and values: 2 · layers · key/value heads · head_dim · bytes, a token."""
    return 2 * layers * kv_heads * head_dim * elem * tokens


@pytest.mark.parametrize("name, context, want", [
    ("llama-3-8b", 131072, kv(32, 8, 128, 131072)),  # 128 KiB a token: 16 GiB at 128k
    ("llama-3-70b", 131072, kv(80, 8, 128, 131072)),
    ("mha-8b", 131072, kv(32, 32, 128, 131072)),
    ("mistral-7b", 131072, kv(32, 8, 128, 4096)),  # a ring of the 4096 tokens the window sees
    ("mistral-7b", 1000, kv(32, 8, 128, 1000)),
    ("gemma-3-27b", 131072, kv(52, 16, 128, 1024) + kv(10, 16, 128, 131072)),
    ("deepseek-v3", 131072, 61 * (512 + 64) * BF16 * 131072),  # the latent and the shared rotary key only
])
def test_each_built_in_model_s_cache_is_what_its_configuration_gives(name, context, want):
    made = planner.plan(planner.find(name), context)
    assert made.kv_cache_bytes == want and made.state_bytes == 0
    assert made.decode_bytes == want  # a new token reads every cache whole


def test_qwen3_next_keeps_keys_and_values_in_a_quarter_of_its_layers_and_a_flat_state_in_the_rest():
    """12 gated attention layers of 2 key/value heads of 256; 36 Gated DeltaNet layers, 32 heads each holding a
    128 × 128 state, in float32 (the spec's state dtype for half inputs)."""
    model = planner.find("Qwen3-Next-80B-A3B")
    for context in (4096, 262144):
        made = planner.plan(model, context)
        assert made.kv_cache_bytes == kv(12, 2, 256, context)
        assert made.state_bytes == 36 * 32 * 128 * 128 * 4
        assert [k.kind for k in made.kinds] == ["state", "kv"]


def test_the_mamba_2_hybrid_holds_4_attention_layers_of_keys_and_24_mamba_2_states_of_64_by_128():
    """NVIDIA's Mamba-2-Hybrid 8B from its published configuration: 4 self-attention layers of 8 key/value groups of
    128 (32 query heads over a width of 4096); 24 Mamba-2 layers of 2 · 4096 / 64 = 128 heads, each holding a
    head_dim 64 × d_state 128 state, in float32 (the mamba2 kernel's state dtype for half inputs). Counted: the SSM
    states only; the convolutions' 4 cached tokens of (8192 + 2 · 8 · 128) channels are left out."""
    model = planner.find("Mamba-2-Hybrid-8B")
    heads, head_dim, d_state = 2 * 4096 // 64, 64, 128
    assert model.layer_count == 28  # 24 + 4 of the 56: the 28 MLP layers hold nothing across tokens
    for context in (4096, 131072):
        made = planner.plan(model, context)
        assert made.kv_cache_bytes == kv(4, 8, 4096 // 32, context)  # 2 GiB at 128k
        assert made.state_bytes == 24 * heads * head_dim * d_state * 4  # 96 MiB, whatever the context
        assert made.decode_bytes == made.kv_cache_bytes + made.state_bytes
    assert planner.plan(model, 131072).kv_cache_bytes == 2 * GIB
    assert any("64 × 128 state a head is counted in the bytes" in note for note in planner.plan(model, 8).notes)


def test_a_state_dim_scales_the_state_bytes_and_leaves_the_square_state_as_it_was():
    square = planner.Layer(name="m", mechanism="mamba2", count=3, heads=4, head_dim=32)
    model = planner.Model(name="m", layers=(square,), dtype="float32")
    assert planner.plan(model, 64).state_bytes == 3 * 4 * 32 * 32 * 4
    for mechanism, per_head in (("mamba2", 32 * 48), ("gated_deltanet", 32 * 48), ("linear", 48 * (32 + 1))):
        wide = planner.Layer(name="m", mechanism=mechanism, count=3, heads=4, head_dim=32, state_dim=48)
        made = planner.plan(planner.Model(name="m", layers=(wide,), dtype="float32"), 64)
        assert made.state_bytes == 3 * 4 * per_head * 4  # linear attention: S (48 × 32) and its normaliser z (48)
    assert planner.Layer(name="m", mechanism="mamba2", count=1, heads=1, head_dim=32, state_dim=32).state_width == 32


def test_llama_3_8b_holds_16_gib_at_128k_in_bf16_and_32_in_fp32():
    model = planner.find("Llama-3-8B")
    assert planner.plan(model, 131072).kv_cache_bytes == 16 * GIB
    assert planner.plan(model, 131072, dtype="fp32").kv_cache_bytes == 32 * GIB
    assert planner.plan(model, 131072, batch=4).kv_cache_bytes == 64 * GIB


def test_prefill_flops_of_full_attention_are_the_causal_formula():
    n = 4096
    made = planner.plan(planner.find("llama-3-8b"), n)
    assert made.prefill_flops == 32 * 4 * 32 * 128 * n * (n + 1) / 2  # Q Kᵀ and P V over the kept cells


def test_deepseek_prefills_in_the_naive_form_and_reads_the_latent_when_decoding():
    (layer,) = planner.find("deepseek-v3").layers
    naive = planner.plan(planner.Model(name="x", layers=(layer,)), 8192).prefill_flops
    absorbed = planner.plan(planner.Model(name="y", layers=(
        planner.Layer(**{**layer.__dict__, "prefill_mechanism": None}),)), 8192).prefill_flops
    assert naive < absorbed


def test_a_context_past_the_trained_one_is_planned_with_a_note():
    made = planner.plan(planner.find("llama-3-8b"), 1 << 20)
    assert any("past the 8,192 the model was trained for" in note for note in made.notes)
    assert not any("past" in note for note in planner.plan(planner.find("llama-3-8b"), 8192).notes)


@pytest.mark.parametrize("name", list(planner.MODELS))
def test_a_model_file_reads_back_as_the_same_model(name):
    model = planner.MODELS[name]
    assert model.problems() == []
    assert planner.Model.from_json(model.to_json()) == model


@pytest.mark.parametrize("change, sentence", [
    ({"kv_heads": 3}, "kv_heads 3 does not divide the 32 heads"),
    ({"count": 0}, "count must be a whole number from 1"),
    ({"heads": -4}, "heads must be a whole number from 1"),
    ({"head_dim": 10**12}, "head_dim must be a whole number from 1"),
    ({"count": True}, "count must be a whole number"),
    ({"mechanism": "flash"}, "mechanism 'flash' is not one this build knows"),
    ({"window": 9000, "mechanism": "sliding_window"}, "window 9,000 is longer than the model's context 8,192"),
    ({"window": 512}, "window is set, but Softmax (fused SDPA) takes no window"),
    ({"kv_rank": 64}, "kv_rank is set, but Softmax (fused SDPA) has no latent"),
    ({"mechanism": "linformer"}, "cannot generate token by token"),
    ({"colour": "red"}, "layers[0] has no field 'colour'"),
    ({"state_dim": 128}, "state_dim is set, but Softmax (fused SDPA) keeps no state of a width to set"),
    ({"state_dim": 0, "mechanism": "mamba2"}, "state_dim must be a whole number from 1"),
    ({"state_dim": "wide", "mechanism": "mamba2"}, "state_dim must be a whole number from 1"),
])
def test_impossible_layers_are_refused_with_a_sentence_naming_the_field(change, sentence):
    data = json.loads(planner.find("llama-3-8b").to_json())
    data["layers"][0].update(change)
    with pytest.raises(ValueError, match=re.escape(sentence)):
        planner.Model.from_json(json.dumps(data))


@pytest.mark.parametrize("text, sentence", [
    ("not json", "it is not JSON"),
    ("[]", "a JSON object with a list of 'layers'"),
    ('{"layers": []}', "at least one kind of layer"),
    ('{"layers": [], "dtype": "int8"}', "dtype 'int8' is unknown"),
    ('{"layers": [1]}', r"layers\[0\] must be an object"),
    ('{"layers": [{"name": "a"}]}', r"layers\[0\] lacks mechanism"),
    ("[" * 100000, "not JSON"),
])
def test_bad_model_files_are_refused_with_a_sentence(text, sentence):
    with pytest.raises(ValueError, match=sentence):
        planner.Model.from_json(text)


@pytest.mark.parametrize("kwargs, sentence", [
    ({"context": 0}, "context must be a whole number of tokens from 1 to 1,048,576"),
    ({"context": (1 << 20) + 1}, "context must be"),
    ({"context": 4096.0}, "context must be"),
    ({"context": 4096, "batch": 0}, "batch must be"),
    ({"context": 4096, "dtype": "int4"}, "dtype 'int4' is unknown"),
])
def test_impossible_plans_are_refused_with_a_sentence(kwargs, sentence):
    with pytest.raises(ValueError, match=sentence):
        planner.plan(planner.find("llama-3-8b"), **kwargs)


def run(*argv: str) -> tuple[int, str, str]:
    out, err = io.StringIO(), io.StringIO()
    return cli.main(list(argv), out, err), out.getvalue(), err.getvalue()


def test_the_cli_prints_the_plan_and_its_json():
    code, out, _ = run("plan", "LLAMA-3-8B", "--context", "128k")
    assert code == 0 and "KV cache 16.0 GiB" in out and "512.0 MiB a layer" in out
    code, out, _ = run("plan", "gemma-3-27b", "--context", "1M", "--json")
    data = json.loads(out)
    assert code == 0 and data["context"] == 1 << 20 and data["state_bytes"] == 0
    assert data["kv_cache_bytes"] == kv(52, 16, 128, 1024) + kv(10, 16, 128, 1 << 20)
    assert [layer["kind"] for layer in data["layers"]] == ["kv", "kv"]


def test_the_cli_reads_a_model_file_and_refuses_a_bad_one(tmp_path):
    path = tmp_path / "mine.json"
    path.write_text(planner.find("mistral-7b").to_json())
    code, out, _ = run("plan", str(path), "--context", "4096", "--json")
    assert code == 0 and json.loads(out)["kv_cache_bytes"] == kv(32, 8, 128, 4096)
    path.write_text('{"layers": [{"name": "x", "mechanism": "sdpa", "count": 2, "heads": 6, "kv_heads": 4, '
                    '"head_dim": 64}]}')
    code, _, err = run("plan", str(path))
    assert code == 2 and "kv_heads 4 does not divide the 6 heads" in err
    for argv, sentence in ((("plan", "gpt-9"), "no built-in model 'gpt-9'"),
                           (("plan", "llama-3-8b", "--context", "2M"), "context must be"),
                           (("plan", "llama-3-8b", "--context", "12q"), "is not a number of tokens")):
        code, _, err = run(*argv)
        assert code == 2 and sentence in err


def test_a_hybrid_turns_a_share_of_the_first_kind_into_state_layers():
    llama = planner.find("llama-3-8b")
    mixed = planner.hybrid(llama, 0.75)
    assert [(k.mechanism, k.count) for k in mixed.layers] == [("sdpa", 8), ("gated_deltanet", 24)]
    made = planner.plan(mixed, 131072)
    assert made.kv_cache_bytes == kv(8, 8, 128, 131072)
    assert made.state_bytes == 24 * 8 * 128 * 128 * 4  # one 128 × 128 float32 state per key/value head
    assert planner.hybrid(llama, 0).layers == llama.layers
    assert [k.mechanism for k in planner.hybrid(llama, 1).layers] == ["gated_deltanet"]
    with pytest.raises(ValueError, match="share must be a fraction from 0 to 1"):
        planner.hybrid(llama, 1.5)


def test_the_crossover_is_where_the_state_costs_what_the_cache_it_replaces_costs():
    """A Gated DeltaNet layer of 8 key/value heads holds 8 · 128 · 128 · 4 bytes; the attention layer it replaces
    holds 2 · 8 · 128 · 2 bytes a token: they cost the same at 128 tokens, and the hybrid holds less from there on."""
    llama = planner.find("llama-3-8b")
    mixed = planner.hybrid(llama, 0.75)
    assert planner.crossover(mixed, llama) == 128
    assert planner.crossover(llama, mixed) is None
    for n in (127, 128, 129, 1 << 20):
        assert (planner.plan(mixed, n).total_bytes <= planner.plan(llama, n).total_bytes) == (n >= 128)


@pytest.mark.parametrize("name", list(planner.MODELS))
def test_a_model_read_back_from_its_table_is_the_same_model(name):
    model = planner.MODELS[name]
    rows = planner.layers_frame(model).to_dict("records")
    again = planner.from_rows(rows, name=model.name, dtype=model.dtype, max_context=model.max_context,
                              source=model.source)
    assert again == model


def test_table_cells_are_read_as_fields_blanks_unset_and_whole_floats_whole():
    rows = [{"name": " local ", "mechanism": "sliding_window", "count": 2.0, "heads": np.int64(8), "head_dim": 64,
             "kv_heads": float("nan"), "window": pd.NA, "prefill_mechanism": "", "colour": "red"}]
    model = planner.from_rows(rows, name="m", max_context=4096)
    assert model.layers == (planner.Layer(name="local", mechanism="sliding_window", count=2, heads=8, head_dim=64),)
    rows[0].update(window=512.0, count=2.5)
    with pytest.raises(ValueError, match=r"layers\[0\] \(local\): count must be a whole number from 1 to .*, got 2.5"):
        planner.from_rows(rows, name="m", max_context=4096)
    rows[0]["count"] = 2
    assert planner.from_rows(rows, name="m", max_context=4096).layers[0].window == 512
    with pytest.raises(ValueError, match="name must be a text of 1 to 80 characters"):
        planner.from_rows(rows, name="  ")
    with pytest.raises(ValueError, match="a model lists at most 64 kinds of layer"):
        planner.from_rows(rows * 65, name="m", max_context=4096)
