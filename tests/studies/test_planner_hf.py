"""Hugging Face configs read into the planner: each model type's published config.json planned at a context and its
cache checked against the bytes worked out by hand, and the weights counted against the published parameter counts
(broken or hostile configs and files: tests/studies/test_planner_hf_refusals.py)."""
from __future__ import annotations

from attn_core.studies.planner.model import plan
from attn_core.studies.planner.hf_config import from_hf_config
from attn_core.studies.planner.weights import count_weights
from tests.hf_configs import (ALL, DEEPSEEK_V3, DEEPSEEK_V32, FALCON_H1_34B, GEMMA2_9B, GEMMA3_1B, GEMMA3_27B,
                              GPT_OSS_20B, GRANITE_H, JAMBA, KIMI_LINEAR, LLAMA3_8B, LLAMA4_SCOUT, MAMBA_CODESTRAL,
                              MINIMAX_01, MISTRAL_7B, MIXTRAL_8X7B, NEMOTRON_H_8B, QWEN25_7B, QWEN3_8B, QWEN3_NEXT)

GIB = 2**30
BF16, FP32 = 2, 4


def kv(layers: int, kv_heads: int, head_dim: int, tokens: int) -> int:
    """Keys and values in bf16: 2 · layers · key/value heads · head_dim · 2 bytes, a token."""
    return 2 * layers * kv_heads * head_dim * tokens * BF16


def planned(config: dict, context: int):
    model, notes = from_hf_config(config)
    return plan(model, context), model, notes


# --- caches worked out by hand ------------------------------------------------------------------------------------

def test_llama_3_8b_holds_16_gib_at_128k():
    made, model, notes = planned(LLAMA3_8B, 131072)
    # 32 layers · 2 (K and V) · 8 heads · 128 · 131,072 tokens · 2 bytes = 17,179,869,184 = 16 GiB
    assert made.kv_cache_bytes == 32 * 2 * 8 * 128 * 131072 * 2 == 16 * GIB
    assert made.state_bytes == 0 and model.layer_count == 32 and model.max_context == 8192
    assert notes == []  # every field of the published config is one the reader knows


def test_mistral_caches_a_window_of_4096_tokens_in_every_layer():
    made, _, _ = planned(MISTRAL_7B, 32768)
    assert made.kv_cache_bytes == 32 * 2 * 8 * 128 * 4096 * 2  # 2 GiB: the window, not the 32,768 tokens
    assert planned(MISTRAL_7B, 1000)[0].kv_cache_bytes == 32 * 2 * 8 * 128 * 1000 * 2  # under the window: all


def test_qwen2_s_sliding_window_counts_only_when_use_sliding_window_is_true():
    off, _, notes = planned(QWEN25_7B, 131072)
    assert off.kv_cache_bytes == 28 * 2 * 4 * 128 * 131072 * 2  # 7 GiB: sliding_window 131,072 alone changes nothing
    assert any("use_sliding_window is false" in n for n in notes)
    # use_sliding_window true, every layer below max_window_layers 28 full: all 28 are still full attention
    same, _, _ = planned({**QWEN25_7B, "use_sliding_window": True, "sliding_window": 4096}, 131072)
    assert same.kv_cache_bytes == off.kv_cache_bytes
    # max_window_layers 21: layers 21 … 27 (7 layers) see the last 4096 tokens, layers 0 … 20 everything
    on, model, _ = planned({**QWEN25_7B, "use_sliding_window": True, "sliding_window": 4096,
                            "max_window_layers": 21}, 131072)
    assert on.kv_cache_bytes == 21 * 2 * 4 * 128 * 131072 * 2 + 7 * 2 * 4 * 128 * 4096 * 2
    assert [(layer.mechanism, layer.count) for layer in model.layers] == [("sdpa", 21), ("sliding_window", 7)]


def test_qwen3_8b_with_a_null_window_is_full_attention():
    made, _, _ = planned(QWEN3_8B, 32768)
    assert made.kv_cache_bytes == 36 * 2 * 8 * 128 * 32768 * 2  # 4.5 GiB


def test_gemma_2_alternates_a_4096_window_and_global_layers():
    made, model, _ = planned(GEMMA2_9B, 8192)
    # 42 layers: 21 sliding (even indices), 21 global; 8 key/value heads of 256; its config keeps float32
    assert made.kv_cache_bytes == 21 * 2 * 8 * 256 * 4096 * 4 + 21 * 2 * 8 * 256 * 8192 * 4
    assert model.dtype == "float32"


def test_gemma_3_keeps_five_local_layers_of_1024_to_one_global():
    made, model, _ = planned(GEMMA3_27B, 131072)
    # 62 layers, every 6th global (indices 5, 11, …, 59: 10), 52 with a window of 1024; 16 key/value heads of 128
    assert made.kv_cache_bytes == 52 * 2 * 16 * 128 * 1024 * 2 + 10 * 2 * 16 * 128 * 131072 * 2
    assert [(layer.window, layer.count) for layer in model.layers] == [(1024, 52), (None, 10)]


def test_gemma_3_text_reads_layer_types_and_the_pattern_alike():
    made, _, _ = planned(GEMMA3_1B, 32768)
    # 26 layers: indices 5, 11, 17, 23 global (4), 22 with a window of 512; 1 key/value head of 256
    assert made.kv_cache_bytes == 22 * 2 * 1 * 256 * 512 * 2 + 4 * 2 * 1 * 256 * 32768 * 2
    types = ["full_attention" if (i + 1) % 6 == 0 else "sliding_attention" for i in range(26)]
    listed = {k: v for k, v in GEMMA3_1B.items() if k != "sliding_window_pattern"} | {"layer_types": types}
    assert planned(listed, 32768)[0].kv_cache_bytes == made.kv_cache_bytes


def test_gpt_oss_alternates_a_128_window_and_notes_its_sinks():
    made, _, notes = planned(GPT_OSS_20B, 131072)
    # 12 sliding layers of 128 tokens and 12 full, 8 key/value heads of 64
    assert made.kv_cache_bytes == 12 * 2 * 8 * 64 * 128 * 2 + 12 * 2 * 8 * 64 * 131072 * 2
    assert any("sinks" in n for n in notes)


def test_llama_4_caches_a_chunk_in_rope_layers_and_everything_in_every_fourth():
    made, model, notes = planned(LLAMA4_SCOUT, 1 << 20)
    # 48 layers; every 4th (12) without RoPE attends to all 1,048,576 tokens; 36 chunked hold at most 8192
    assert made.kv_cache_bytes == 36 * 2 * 8 * 128 * 8192 * 2 + 12 * 2 * 8 * 128 * (1 << 20) * 2
    assert model.max_context == 10485760 and any("chunk" in n for n in notes)


def test_qwen3_next_holds_attention_a_state_and_a_convolution_state():
    made, model, _ = planned(QWEN3_NEXT, 262144)
    # 12 gated attention layers: 2 key/value heads of 256 over 262,144 tokens
    attention = 12 * 2 * 2 * 256 * 262144 * 2
    # 36 Gated DeltaNet layers: 32 value heads, each a 128 × 128 state in float32
    state = 36 * 32 * 128 * 128 * FP32
    # their convolutions keep the last 3 inputs of q, k and v: 2 · 16 · 128 + 32 · 128 = 8192 channels, in bf16
    conv = 36 * 3 * 8192 * 2
    assert made.state_bytes == state and made.kv_cache_bytes == attention + conv
    assert sum(layer.count for layer in model.layers if layer.mechanism != "sliding_window") == 48


def test_deepseek_v3_caches_the_latent_and_the_rotary_key():
    made, _, _ = planned(DEEPSEEK_V3, 131072)
    assert made.kv_cache_bytes == 61 * (512 + 64) * 131072 * 2  # 61 layers · 576 values · 2 bytes a token: 8.6 GiB


def test_deepseek_v32_adds_the_indexer_keys():
    made, _, notes = planned(DEEPSEEK_V32, 131072)
    assert made.kv_cache_bytes == 61 * (512 + 64) * 131072 * 2 + 61 * 128 * 131072 * 2  # + 128 values a token a layer
    assert any("top-k" in n for n in notes)


def test_kimi_linear_has_20_kda_and_7_mla_layers():
    made, model, notes = planned(KIMI_LINEAR, 1 << 20)
    mla = 7 * (512 + 64) * (1 << 20) * 2  # 7 MLA layers, 576 values a token
    state = 20 * 32 * 128 * 128 * FP32  # 20 KDA layers of 32 heads, each a 128 × 128 state
    conv = 20 * 3 * (3 * 32 * 128) * 2  # their q, k and v convolutions keep 3 inputs of 3 · 4096 channels
    assert made.kv_cache_bytes == mla + conv and made.state_bytes == state
    assert any("Kimi Delta Attention" in n for n in notes)


def test_nemotron_h_reads_its_pattern():
    made, _, _ = planned(NEMOTRON_H_8B, 8192)
    # 4 attention layers ('*'), 8 key/value heads of 128; 24 Mamba-2 layers ('M') of 128 heads, 64 × 128 states
    attention = 4 * 2 * 8 * 128 * 8192 * 2
    state = 24 * 128 * 64 * 128 * FP32
    conv = 24 * 3 * (128 * 64 + 2 * 8 * 128) * 2  # x, B and C: 8192 + 2048 channels, 3 inputs each
    assert made.state_bytes == state and made.kv_cache_bytes == attention + conv


def test_granite_4_h_reads_layer_types():
    made, _, _ = planned(GRANITE_H, 131072)
    attention = 4 * 2 * 4 * 128 * 131072 * 2  # 4 attention layers, 4 key/value heads of 1536 / 12 = 128
    state = 36 * 48 * 64 * 128 * FP32  # 36 Mamba-2 layers, 48 heads of 64, state 128
    conv = 36 * 3 * (48 * 64 + 2 * 1 * 128) * 2
    assert made.state_bytes == state and made.kv_cache_bytes == attention + conv


def test_jamba_has_one_attention_layer_in_eight_and_mamba_states():
    made, _, _ = planned(JAMBA, 262144)
    attention = 4 * 2 * 8 * 128 * 262144 * 2  # layers 4, 12, 20, 28: 8 key/value heads of 4096 / 32 = 128
    state = 28 * 8192 * 16 * FP32  # 28 Mamba layers, a 16-wide state for each of 2 · 4096 channels
    conv = 28 * 3 * 8192 * 2
    assert made.state_bytes == state and made.kv_cache_bytes == attention + conv


def test_falcon_h1_runs_attention_and_mamba_in_every_layer():
    made, _, _ = planned(FALCON_H1_34B, 131072)
    attention = 72 * 2 * 4 * 128 * 131072 * 2
    state = 72 * 32 * 128 * 256 * FP32  # 32 heads of 128, state 256
    conv = 72 * 3 * (4096 + 2 * 2 * 256) * 2
    assert made.state_bytes == state and made.kv_cache_bytes == attention + conv


def test_mamba_2_holds_a_state_whatever_the_context():
    short, _, _ = planned(MAMBA_CODESTRAL, 1024)
    made, _, _ = planned(MAMBA_CODESTRAL, 1 << 20)
    assert made.state_bytes == 64 * 128 * 64 * 128 * FP32 == short.state_bytes  # 256 MiB
    assert made.kv_cache_bytes == 64 * 3 * (128 * 64 + 2 * 8 * 128) * 2  # the convolutions only


def test_minimax_shows_lightning_layers_as_linear_states():
    made, _, _ = planned(MINIMAX_01, 1 << 20)
    assert made.kv_cache_bytes == 10 * 2 * 8 * 128 * (1 << 20) * 2  # 10 softmax layers
    assert made.state_bytes == 70 * 64 * (128 * 128 + 128) * FP32  # 70 lightning layers, 64 heads (and normaliser)


def test_every_model_type_is_planned_and_named():
    for family, config in ALL.items():
        model, notes = from_hf_config(config)
        assert model.problems() == [] and all(isinstance(n, str) for n in notes), family
    assert from_hf_config(LLAMA3_8B, name="My Llama")[0].name == "My Llama"


def test_unknown_fields_are_listed_in_one_note():
    _, notes = from_hf_config({**LLAMA3_8B, "frobnicate": 1, "zz_extra": [1, 2]})
    listed = [n for n in notes if "does not use" in n]
    assert len(listed) == 1 and "frobnicate" in listed[0] and "zz_extra" in listed[0]
    _, many = from_hf_config({**LLAMA3_8B, **{f"k{i:02}": i for i in range(30)}})
    assert any("and 18 more" in n for n in many)  # 30 unknown: 12 named, 18 counted


def test_an_unknown_model_type_with_attention_fields_is_read_as_a_plain_decoder():
    model, notes = from_hf_config({**LLAMA3_8B, "model_type": "my_llama"})
    assert plan(model, 4096).kv_cache_bytes == 32 * 2 * 8 * 128 * 4096 * 2
    assert "not one this reader knows" in notes[0]


# --- weights against published counts -----------------------------------------------------------------------------

def close(value: float, published: float, within: float = 0.02) -> bool:
    return abs(value - published) <= within * published


def test_llama_3_8b_weights():
    w = count_weights(LLAMA3_8B)
    # embeddings and head 2 · 128,256 · 4096 = 1,050,673,152; attention 32 · (2 · 4096² + 2 · 4096 · 1024)
    # = 1,342,177,280; MLP 32 · 3 · 4096 · 14,336 = 5,637,144,576; norms 65 · 4096 = 266,240: 8,030,261,248
    assert w.total == 2 * 128256 * 4096 + 32 * (2 * 4096**2 + 2 * 4096 * 1024) + 32 * 3 * 4096 * 14336 + 65 * 4096
    assert close(w.total, 8.03e9, 0.001)  # Meta's model card: 8.03B
    assert w.bytes == 2 * w.total and w.dtype == "bfloat16"
    assert w.active == w.total - 128256 * 4096  # a token reads one row of the embedding table


def test_qwen2_5_7b_weights():
    w = count_weights(QWEN25_7B)
    assert close(w.total, 7.61e9, 0.005)  # Qwen2.5 model card: 7.61B parameters


def test_gpt_oss_20b_total_active_and_mxfp4_bytes():
    w = count_weights(GPT_OSS_20B)
    # OpenAI, "gpt-oss-120b & gpt-oss-20b Model Card" (2025), table 1: 20.91B total, 3.61B active per token
    assert close(w.total, 20.91e9) and close(w.active, 3.61e9)
    # experts: 24 layers · 32 · (3 · 2880² weights) at 4.25 bits (MXFP4: 4-bit values, an 8-bit scale per 32)
    experts = 24 * 32 * 3 * 2880**2
    assert w.parts["experts"] > experts and "mxfp4" in w.dtype
    assert close(w.bytes, experts * 4.25 / 8 + (w.total - experts) * 2, 1e-9)  # about 13.8 GB


def test_deepseek_v3_counts_671b_without_its_mtp_module():
    w = count_weights(DEEPSEEK_V3)
    # DeepSeek-V3 technical report (arXiv 2412.19437): 671B total, 37B activated for each token; the model card's
    # 685B adds the 14B multi-token prediction module, which is not counted here
    assert close(w.total, 671e9) and close(w.active, 37e9)
    assert any("not counted" in n for n in w.notes)
    assert w.bytes < 0.52 * count_weights(DEEPSEEK_V3, dtype="bfloat16").bytes  # FP8 linear layers: about half


def test_mixtral_8x7b_total_and_active():
    w = count_weights(MIXTRAL_8X7B)
    # Mistral AI, "Mixtral of experts" (2023): 46.7B total parameters, 12.9B used per token
    assert close(w.total, 46.7e9) and close(w.active, 12.9e9)


def test_jamba_and_minimax_totals():
    jamba = count_weights(JAMBA)
    assert close(jamba.total, 52e9) and close(jamba.active, 12e9)  # AI21's Jamba card: 52B total, 12B active
    assert close(count_weights(MINIMAX_01).total, 456e9)  # MiniMax-01 report (arXiv 2501.08313): 456B total


def test_tied_embeddings_are_counted_once_and_the_dtype_can_be_overridden():
    tied = count_weights({**LLAMA3_8B, "tie_word_embeddings": True})
    assert tied.total == count_weights(LLAMA3_8B).total - 128256 * 4096 and tied.parts["lm_head"] == 0
    assert count_weights(LLAMA3_8B, dtype="int4").bytes == count_weights(LLAMA3_8B).total / 2


def test_every_model_type_s_weights_are_counted():
    for family, config in ALL.items():
        w = count_weights(config)
        assert 0 < w.active <= w.total == sum(w.parts.values()), family
