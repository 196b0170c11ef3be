"""pattern.py, upload.py and the planner's charts: the layers in order (read from a config.json, or spread), each
kind's mask against index loops written here, an uploaded file told apart and refused with a sentence, and the
charts' specs."""
from __future__ import annotations

import json

import pytest

from attn_core.studies.planner import chart, compare, hf_config, model as planner, pattern, upload
from attn_core.studies.planner.model import Layer
from tests.hf_configs import GEMMA3_1B, GEMMA3_27B, GPT_OSS_20B

# Meta-Llama-3-8B's config.json, its published values
LLAMA_CONFIG = {"model_type": "llama", "num_hidden_layers": 32, "num_attention_heads": 32, "num_key_value_heads": 8,
                "head_dim": 128, "hidden_size": 4096, "intermediate_size": 14336, "vocab_size": 128256,
                "max_position_embeddings": 8192, "torch_dtype": "bfloat16", "tie_word_embeddings": False}


def seen(frame, kind: str, n: int) -> list[list[bool]]:
    cells = frame[(frame["part"] == "mask") & (frame["kind"] == kind)]
    grid = [[False] * n for _ in range(n)]
    for row in cells.itertuples():
        grid[int(row.i)][int(row.j)] = bool(row.seen)
    return grid


def test_an_even_spread_places_qwen3_next_s_attention_every_fourth_layer_as_its_config_does():
    order, read = pattern.layer_order(planner.find("qwen3-next-80b-a3b"))
    assert not read and len(order) == 48
    assert [i for i, k in enumerate(order) if k == "gated attention"] == list(range(3, 48, 4))


def test_a_config_s_own_layer_order_is_read():
    config = {**LLAMA_CONFIG, "model_type": "gemma3_text", "num_hidden_layers": 12, "sliding_window": 1024,
              "layer_types": (["sliding_attention"] * 5 + ["full_attention"]) * 2}
    model = upload.read_upload(json.dumps(config).encode()).model
    order, read = pattern.layer_order(model, config)
    assert read and [i for i, k in enumerate(order) if k == "full attention"] == [5, 11]


def five_local_one_global(n: int, local: str) -> list[str]:
    """Gemma 3's order written out: layer i (from 0) is global iff i + 1 is a multiple of 6."""
    order = []
    for i in range(n):
        order.append("full attention" if (i + 1) % 6 == 0 else local)
    return order


def test_layer_kinds_reads_gemma_3_s_five_local_to_one_global_from_sliding_window_pattern():
    # google/gemma-3-27b-it: 62 layers, sliding_window_pattern 6, a window of 1,024: globals at 5, 11, …, 59 (10 of
    # them), the last two layers local
    kinds = hf_config.layer_kinds(GEMMA3_27B)
    assert kinds == five_local_one_global(62, "sliding window (1,024)")
    assert [i for i, k in enumerate(kinds) if k == "full attention"] == [5, 11, 17, 23, 29, 35, 41, 47, 53, 59]
    assert kinds.count("sliding window (1,024)") == 52


def test_layer_kinds_reads_gemma_3_s_layer_types_over_its_pattern():
    types = []
    for i in range(26):  # gemma-3-1b's 26 layers as transformers writes layer_types: 5 sliding, then 1 full
        types.append("full_attention" if (i + 1) % 6 == 0 else "sliding_attention")
    # a sliding_window_pattern of 2 beside it is not what the layers are: layer_types is
    config = {**GEMMA3_1B, "sliding_window_pattern": 2, "layer_types": types}
    kinds = hf_config.layer_kinds(config)
    assert kinds == five_local_one_global(26, "sliding window (512)")
    assert [i for i, k in enumerate(kinds) if k == "full attention"] == [5, 11, 17, 23]
    other = {**GEMMA3_1B, "layer_types": ["full_attention", "sliding_attention"] * 13}  # not 5 : 1, read as written
    assert hf_config.layer_kinds(other)[:4] == ["full attention", "sliding window (512)"] * 2


def test_layer_kinds_reads_gpt_oss_alternating_and_the_pattern_orders_the_model_by_it():
    # openai/gpt-oss-20b: layer_types sliding, full, sliding, … over 24 layers, a window of 128
    kinds = hf_config.layer_kinds(GPT_OSS_20B)
    assert kinds == ["sliding window (128)" if i % 2 == 0 else "full attention" for i in range(24)]
    model, _ = hf_config.from_hf_config(GPT_OSS_20B)
    assert pattern.layer_order(model, GPT_OSS_20B) == (kinds, True)
    gemma, _ = hf_config.from_hf_config(GEMMA3_27B)
    order, read = pattern.layer_order(gemma, GEMMA3_27B)
    assert read and order == five_local_one_global(62, "sliding window (1,024)")


def test_layer_kinds_refuses_a_config_it_cannot_read_by_the_field():
    with pytest.raises(ValueError, match="num_hidden_layers"):
        hf_config.layer_kinds({k: v for k, v in GPT_OSS_20B.items() if k != "num_hidden_layers"})
    with pytest.raises(ValueError, match="layer_types"):
        hf_config.layer_kinds({**GPT_OSS_20B, "layer_types": ["sliding_attention"] * 3})  # 3 of 24 layers
    # the pattern, given a config the reader refuses, spreads the kinds and says the order is assumed
    model, _ = hf_config.from_hf_config(GPT_OSS_20B)
    assert not pattern.layer_order(model, {"model_type": 5})[1]


@pytest.mark.parametrize("layer, rule", [
    (Layer(name="full", mechanism="sdpa", count=1, heads=4, head_dim=8), lambda i, j: j <= i),
    (Layer(name="w", mechanism="sliding_window", count=1, heads=4, head_dim=8, window=4), lambda i, j: 0 <= i - j < 4),
    (Layer(name="chunked attention (8, as a window)", mechanism="sliding_window", count=1, heads=4, head_dim=8,
           window=8), lambda i, j: i // 8 == j // 8 and j <= i),
    (Layer(name="state", mechanism="gated_deltanet", count=1, heads=4, head_dim=8), lambda i, j: j <= i),
])
def test_each_kind_s_mask_is_the_rule_in_words(layer, rule):
    n = 16
    frame = pattern.pattern_frame(planner.Model(name="m", layers=(layer,), max_context=64), n)
    assert seen(frame, layer.name, n) == [[rule(i, j) for j in range(n)] for i in range(n)]


def test_a_long_window_is_drawn_in_proportion_and_selected_kinds_say_the_data_chooses():
    mask, how = pattern.kind_mask(Layer(name="w", mechanism="sliding_window", count=1, heads=4, head_dim=8,
                                        window=4096), 16, 8192)
    assert how == "sliding window of 4,096, drawn as 8 of 16"
    assert [int(mask[i].sum()) for i in range(16)] == [min(i + 1, 8) for i in range(16)]
    mask, how = pattern.kind_mask(Layer(name="t", mechanism="topk", count=1, heads=4, head_dim=8), 16, 8192)
    assert how.startswith("selected from seeded random inputs") and "top_k 4" in how
    assert all(int(mask[i].sum()) <= min(4, i + 1) and not mask[i, i + 1:].any() for i in range(16))  # causal, ≤ 4


def test_an_upload_is_told_apart_and_a_config_s_weights_are_counted():
    got = upload.read_upload(json.dumps(LLAMA_CONFIG).encode())
    assert got.kind == "config.json" and got.model.layers[0].kv_heads == 8
    # embeddings and head 2 · 128,256 · 4,096; attention 32 · (2 · 4096² + 2 · 4096 · 1024); MLP 32 · 3 · 4096 ·
    # 14,336; norms 65 · 4096
    assert got.weights.total == 2 * 128256 * 4096 + 32 * (2 * 4096**2 + 2 * 4096 * 1024) + 32 * 3 * 4096 * 14336 \
        + 65 * 4096 == 8_030_261_248
    own = upload.read_upload(planner.find("mistral-7b").to_json().encode())
    assert own.kind == "model file" and own.model == planner.find("mistral-7b") and own.weights is None


@pytest.mark.parametrize("raw, sentence", [
    (b"\xff\xfe\x00", "the file is not UTF-8 text"),
    (json.dumps({**LLAMA_CONFIG, "num_hidden_layers": 10**9}).encode(), "num_hidden_layers"),
    (json.dumps({**LLAMA_CONFIG, "model_type": "<img src=x>"}).encode(), "model_type must be a short name"),
    (b"[1, 2]", "a model file is a JSON object with a list of 'layers'"),
    (b" " * (upload.MAX_UPLOAD + 1), "over the 1,048,576"),
], ids=["not-utf8", "a-billion-layers", "markup-model-type", "a-list", "too-large"])
def test_a_hostile_upload_is_refused_with_a_sentence(raw, sentence):
    with pytest.raises(ValueError) as caught:
        upload.read_upload(raw)
    assert sentence in str(caught.value)


def test_the_roofline_and_designs_charts_carry_their_data_and_marks():
    frame = compare.speed_curves([planner.find("llama-3-8b")], "H100 SXM", [1024, 1 << 20])
    spec = chart.roofline_chart(frame, "decode_tokens_per_s", device="H100 SXM").to_dict()
    assert "predicted (roofline), not measured on H100 SXM" in json.dumps(spec)
    assert any(layer["mark"].get("shape") == "diamond" for layer in spec["layer"])
    table, _ = compare.compare(planner.find("llama-3-8b"), "H100 SXM", 8192)
    spec = chart.compare_chart(table, "cache_per_token").to_dict()
    data = next(iter(spec["datasets"].values()))
    assert [round(r["value"]) for r in data][:4] == [128, 512, 128, 16]  # KiB a token: as is, MHA, GQA 8, MQA


def test_the_layers_chart_draws_the_order_above_the_masks():
    spec = chart.layers_chart(pattern.pattern_frame(planner.find("gemma-3-27b"), 8), title="Gemma").to_dict()
    assert spec["title"]["text"] == "Gemma" and len(spec["vconcat"]) == 2
