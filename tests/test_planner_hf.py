"""Hugging Face configs read into the planner: each model type's published config.json planned at a context and its
cache checked against the bytes worked out by hand; the weights counted against the published parameter counts; and
broken or hostile configs and files refused with a ValueError naming the field."""
from __future__ import annotations

import copy
import json
import os

import pytest

from attn_core.studies.planner.model import plan
from attn_core.studies.planner.hf_config import from_hf_config, parse_config, read_config
from attn_core.studies.planner.weights import count_weights

GIB = 2**30
BF16, FP32 = 2, 4


def kv(layers: int, kv_heads: int, head_dim: int, tokens: int) -> int:
    """Keys and values in bf16: 2 · layers · key/value heads · head_dim · 2 bytes, a token."""
    return 2 * layers * kv_heads * head_dim * tokens * BF16


# --- published configs, as dicts (the values of each model's config.json) ---------------------------------------

# meta-llama/Meta-Llama-3-8B, config.json
LLAMA3_8B = {"architectures": ["LlamaForCausalLM"], "model_type": "llama", "vocab_size": 128256, "hidden_size": 4096,
             "intermediate_size": 14336, "num_hidden_layers": 32, "num_attention_heads": 32, "num_key_value_heads": 8,
             "max_position_embeddings": 8192, "rope_theta": 500000.0, "rms_norm_eps": 1e-05, "hidden_act": "silu",
             "tie_word_embeddings": False, "torch_dtype": "bfloat16", "bos_token_id": 128000,
             "eos_token_id": 128001}
# mistralai/Mistral-7B-v0.1, config.json
MISTRAL_7B = {"model_type": "mistral", "vocab_size": 32000, "hidden_size": 4096, "intermediate_size": 14336,
              "num_hidden_layers": 32, "num_attention_heads": 32, "num_key_value_heads": 8,
              "max_position_embeddings": 32768, "sliding_window": 4096, "rope_theta": 10000.0,
              "tie_word_embeddings": False, "torch_dtype": "bfloat16"}
# Qwen/Qwen2.5-7B, config.json
QWEN25_7B = {"architectures": ["Qwen2ForCausalLM"], "model_type": "qwen2", "vocab_size": 152064, "hidden_size": 3584,
             "intermediate_size": 18944, "num_hidden_layers": 28, "num_attention_heads": 28, "num_key_value_heads": 4,
             "max_position_embeddings": 131072, "max_window_layers": 28, "sliding_window": 131072,
             "use_sliding_window": False, "rope_theta": 1000000.0, "tie_word_embeddings": False,
             "torch_dtype": "bfloat16"}
# Qwen/Qwen3-8B, config.json
QWEN3_8B = {"model_type": "qwen3", "vocab_size": 151936, "hidden_size": 4096, "intermediate_size": 12288,
            "num_hidden_layers": 36, "num_attention_heads": 32, "num_key_value_heads": 8, "head_dim": 128,
            "max_position_embeddings": 40960, "max_window_layers": 36, "sliding_window": None,
            "use_sliding_window": False, "tie_word_embeddings": False, "torch_dtype": "bfloat16"}
# google/gemma-2-9b, config.json
GEMMA2_9B = {"model_type": "gemma2", "vocab_size": 256000, "hidden_size": 3584, "intermediate_size": 14336,
             "num_hidden_layers": 42, "num_attention_heads": 16, "num_key_value_heads": 8, "head_dim": 256,
             "max_position_embeddings": 8192, "sliding_window": 4096, "query_pre_attn_scalar": 256,
             "final_logit_softcapping": 30.0, "attn_logit_softcapping": 50.0, "cache_implementation": "hybrid",
             "hidden_activation": "gelu_pytorch_tanh", "torch_dtype": "float32"}
# google/gemma-3-27b-it, config.json: a multimodal wrapper around its text_config
GEMMA3_27B = {"architectures": ["Gemma3ForConditionalGeneration"], "model_type": "gemma3", "mm_tokens_per_image": 256,
              "boi_token_index": 255999, "eoi_token_index": 256000, "image_token_index": 262144,
              "text_config": {"model_type": "gemma3_text", "head_dim": 128, "hidden_size": 5376,
                              "intermediate_size": 21504, "num_attention_heads": 32, "num_hidden_layers": 62,
                              "num_key_value_heads": 16, "query_pre_attn_scalar": 168, "sliding_window": 1024,
                              "sliding_window_pattern": 6, "rope_scaling": {"factor": 8.0, "rope_type": "linear"}},
              "vision_config": {"model_type": "siglip_vision_model", "hidden_size": 1152},
              "torch_dtype": "bfloat16"}
# google/gemma-3-1b-it, config.json: a text model at the top level
GEMMA3_1B = {"model_type": "gemma3_text", "vocab_size": 262144, "hidden_size": 1152, "intermediate_size": 6912,
             "num_hidden_layers": 26, "num_attention_heads": 4, "num_key_value_heads": 1, "head_dim": 256,
             "max_position_embeddings": 32768, "sliding_window": 512, "sliding_window_pattern": 6,
             "torch_dtype": "bfloat16"}
# openai/gpt-oss-20b, config.json
GPT_OSS_20B = {"architectures": ["GptOssForCausalLM"], "model_type": "gpt_oss", "vocab_size": 201088,
               "hidden_size": 2880, "intermediate_size": 2880, "num_hidden_layers": 24, "num_attention_heads": 64,
               "num_key_value_heads": 8, "head_dim": 64, "sliding_window": 128, "max_position_embeddings": 131072,
               "initial_context_length": 4096, "num_local_experts": 32, "num_experts_per_tok": 4,
               "experts_per_token": 4, "attention_bias": True, "tie_word_embeddings": False, "swiglu_limit": 7.0,
               "layer_types": ["sliding_attention", "full_attention"] * 12, "torch_dtype": "bfloat16",
               "rope_scaling": {"rope_type": "yarn", "factor": 32.0, "original_max_position_embeddings": 4096},
               "quantization_config": {"quant_method": "mxfp4", "modules_to_not_convert": [
                   "model.layers.*.self_attn", "model.layers.*.mlp.router", "model.embed_tokens", "lm_head"]}}
# meta-llama/Llama-4-Scout-17B-16E, config.json (its text_config)
LLAMA4_SCOUT = {"model_type": "llama4", "architectures": ["Llama4ForConditionalGeneration"],
                "text_config": {"model_type": "llama4_text", "hidden_size": 5120, "intermediate_size": 8192,
                                "intermediate_size_mlp": 16384, "num_hidden_layers": 48, "num_attention_heads": 40,
                                "num_key_value_heads": 8, "head_dim": 128, "attention_chunk_size": 8192,
                                "no_rope_layers": [], "vocab_size": 202048, "num_local_experts": 16,
                                "num_experts_per_tok": 1, "interleave_moe_layer_step": 1,
                                "max_position_embeddings": 10485760, "torch_dtype": "bfloat16"},
                "vision_config": {"model_type": "llama4_vision_model"}, "torch_dtype": "bfloat16"}
# Qwen/Qwen3-Next-80B-A3B-Instruct, config.json
QWEN3_NEXT = {"model_type": "qwen3_next", "vocab_size": 151936, "hidden_size": 2048, "intermediate_size": 5120,
              "num_hidden_layers": 48, "num_attention_heads": 16, "num_key_value_heads": 2, "head_dim": 256,
              "full_attention_interval": 4, "linear_conv_kernel_dim": 4, "linear_key_head_dim": 128,
              "linear_value_head_dim": 128, "linear_num_key_heads": 16, "linear_num_value_heads": 32,
              "num_experts": 512, "num_experts_per_tok": 10, "moe_intermediate_size": 512,
              "shared_expert_intermediate_size": 512, "decoder_sparse_step": 1, "mlp_only_layers": [],
              "max_position_embeddings": 262144, "partial_rotary_factor": 0.25, "tie_word_embeddings": False,
              "torch_dtype": "bfloat16"}
# deepseek-ai/DeepSeek-V3, config.json
DEEPSEEK_V3 = {"architectures": ["DeepseekV3ForCausalLM"], "model_type": "deepseek_v3", "vocab_size": 129280,
               "hidden_size": 7168, "intermediate_size": 18432, "moe_intermediate_size": 2048,
               "num_hidden_layers": 61, "num_nextn_predict_layers": 1, "num_attention_heads": 128,
               "num_key_value_heads": 128, "n_shared_experts": 1, "n_routed_experts": 256, "routed_scaling_factor": 2.5,
               "kv_lora_rank": 512, "q_lora_rank": 1536, "qk_rope_head_dim": 64, "v_head_dim": 128,
               "qk_nope_head_dim": 128, "topk_method": "noaux_tc", "n_group": 8, "topk_group": 4,
               "num_experts_per_tok": 8, "moe_layer_freq": 1, "first_k_dense_replace": 3, "norm_topk_prob": True,
               "scoring_func": "sigmoid", "max_position_embeddings": 163840, "tie_word_embeddings": False,
               "torch_dtype": "bfloat16", "quantization_config": {"activation_scheme": "dynamic", "fmt": "e4m3",
                                                                  "quant_method": "fp8",
                                                                  "weight_block_size": [128, 128]}}
# deepseek-ai/DeepSeek-V3.2-Exp, config.json: V3's sizes and the lightning indexer
DEEPSEEK_V32 = {**DEEPSEEK_V3, "model_type": "deepseek_v32", "index_head_dim": 128, "index_n_heads": 64,
                "index_topk": 2048}
# moonshotai/Kimi-Linear-48B-A3B-Instruct, config.json (linear_attn_config numbers layers from 1)
KIMI_LINEAR = {"model_type": "kimi_linear", "vocab_size": 163840, "hidden_size": 2304, "intermediate_size": 9216,
               "num_hidden_layers": 27, "num_attention_heads": 32, "num_key_value_heads": 32, "kv_lora_rank": 512,
               "q_lora_rank": None, "qk_nope_head_dim": 128, "qk_rope_head_dim": 64, "v_head_dim": 128,
               "mla_use_nope": True, "moe_intermediate_size": 1024, "num_experts": 256, "num_experts_per_token": 8,
               "num_shared_experts": 1, "first_k_dense_replace": 1, "moe_layer_freq": 1,
               "max_position_embeddings": 1048576, "torch_dtype": "bfloat16",
               "linear_attn_config": {"full_attn_layers": [4, 8, 12, 16, 20, 24, 27],
                                      "kda_layers": [i for i in range(1, 28) if i not in (4, 8, 12, 16, 20, 24, 27)],
                                      "num_heads": 32, "head_dim": 128, "short_conv_kernel_size": 4}}
# nvidia/Nemotron-H-8B-Base-8K, config.json
NEMOTRON_H_8B = {"model_type": "nemotron_h", "vocab_size": 131072, "hidden_size": 4096, "intermediate_size": 21504,
                 "num_hidden_layers": 52, "hybrid_override_pattern":
                     "M-M-M-M*-M-M-M-M-M*-M-M-M-M-M*-M-M-M-M-M*-M-M-M-M-M-",
                 "num_attention_heads": 32, "num_key_value_heads": 8, "head_dim": 128, "mamba_num_heads": 128,
                 "mamba_head_dim": 64, "ssm_state_size": 128, "n_groups": 8, "conv_kernel": 4, "expand": 2,
                 "mlp_hidden_act": "relu2", "max_position_embeddings": 8192, "tie_word_embeddings": False,
                 "torch_dtype": "bfloat16"}
# ibm-granite/granite-4.0-h-tiny, config.json: its sizes, attention in 4 of 40 layers
GRANITE_H = {"model_type": "granitemoehybrid", "vocab_size": 100352, "hidden_size": 1536, "intermediate_size": 512,
             "shared_intermediate_size": 1024, "num_hidden_layers": 40, "num_attention_heads": 12,
             "num_key_value_heads": 4, "mamba_n_heads": 48, "mamba_d_head": 64, "mamba_d_state": 128,
             "mamba_n_groups": 1, "mamba_d_conv": 4, "mamba_expand": 2, "num_local_experts": 64,
             "num_experts_per_tok": 6, "max_position_embeddings": 131072, "tie_word_embeddings": True,
             "layer_types": ["attention" if i in (5, 15, 25, 35) else "mamba" for i in range(40)],
             "torch_dtype": "bfloat16"}
# ai21labs/Jamba-v0.1, config.json
JAMBA = {"model_type": "jamba", "vocab_size": 65536, "hidden_size": 4096, "intermediate_size": 14336,
         "num_hidden_layers": 32, "num_attention_heads": 32, "num_key_value_heads": 8, "attn_layer_period": 8,
         "attn_layer_offset": 4, "expert_layer_period": 2, "expert_layer_offset": 1, "mamba_d_state": 16,
         "mamba_d_conv": 4, "mamba_expand": 2, "mamba_dt_rank": 256, "num_experts": 16, "num_experts_per_tok": 2,
         "max_position_embeddings": 262144, "tie_word_embeddings": False, "torch_dtype": "bfloat16"}
# tiiuae/Falcon-H1-34B-Instruct, config.json: attention and Mamba-2 side by side in every layer
FALCON_H1_34B = {"model_type": "falcon_h1", "vocab_size": 261120, "hidden_size": 5120, "intermediate_size": 21504,
                 "num_hidden_layers": 72, "num_attention_heads": 20, "num_key_value_heads": 4, "head_dim": 128,
                 "mamba_d_ssm": 4096, "mamba_n_heads": 32, "mamba_d_head": 128, "mamba_d_state": 256,
                 "mamba_n_groups": 2, "mamba_d_conv": 4, "max_position_embeddings": 262144,
                 "torch_dtype": "bfloat16"}
# mistralai/Mamba-Codestral-7B-v0.1, config.json
MAMBA_CODESTRAL = {"model_type": "mamba2", "vocab_size": 32768, "hidden_size": 4096, "num_hidden_layers": 64,
                   "num_heads": 128, "head_dim": 64, "state_size": 128, "n_groups": 8, "conv_kernel": 4, "expand": 2,
                   "tie_word_embeddings": False, "torch_dtype": "bfloat16"}
# MiniMaxAI/MiniMax-Text-01, config.json: attn_type_list, 0 lightning and 1 softmax, one softmax layer in 8
MINIMAX_01 = {"model_type": "minimax", "vocab_size": 200064, "hidden_size": 6144, "intermediate_size": 9216,
              "num_hidden_layers": 80, "num_attention_heads": 64, "num_key_value_heads": 8, "head_dim": 128,
              "attn_type_list": ([0] * 7 + [1]) * 10, "num_local_experts": 32, "num_experts_per_tok": 2,
              "max_position_embeddings": 10240000, "tie_word_embeddings": False, "torch_dtype": "bfloat16"}
# mistralai/Mixtral-8x7B-v0.1, config.json
MIXTRAL_8X7B = {"model_type": "mixtral", "vocab_size": 32000, "hidden_size": 4096, "intermediate_size": 14336,
                "num_hidden_layers": 32, "num_attention_heads": 32, "num_key_value_heads": 8,
                "num_local_experts": 8, "num_experts_per_tok": 2, "sliding_window": None,
                "max_position_embeddings": 32768, "tie_word_embeddings": False, "torch_dtype": "bfloat16"}

ALL = {"llama": LLAMA3_8B, "mistral": MISTRAL_7B, "qwen2": QWEN25_7B, "qwen3": QWEN3_8B, "gemma2": GEMMA2_9B,
       "gemma3": GEMMA3_27B, "gemma3_text": GEMMA3_1B, "gpt_oss": GPT_OSS_20B, "llama4": LLAMA4_SCOUT,
       "qwen3_next": QWEN3_NEXT, "deepseek_v3": DEEPSEEK_V3, "deepseek_v32": DEEPSEEK_V32,
       "kimi_linear": KIMI_LINEAR, "nemotron_h": NEMOTRON_H_8B, "granitemoehybrid": GRANITE_H, "jamba": JAMBA,
       "falcon_h1": FALCON_H1_34B, "mamba2": MAMBA_CODESTRAL, "minimax": MINIMAX_01, "mixtral": MIXTRAL_8X7B}


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


# --- hostile and broken configs -----------------------------------------------------------------------------------

def without(config: dict, key: str) -> dict:
    return {k: v for k, v in config.items() if k != key}


HOSTILE = [
    (without(LLAMA3_8B, "num_hidden_layers"), "num_hidden_layers"),
    ({**LLAMA3_8B, "num_hidden_layers": -1}, "num_hidden_layers"),
    ({**LLAMA3_8B, "num_hidden_layers": "32"}, "num_hidden_layers"),
    ({**LLAMA3_8B, "num_hidden_layers": 1e30}, "num_hidden_layers"),
    ({**LLAMA3_8B, "num_hidden_layers": 10**30}, "num_hidden_layers"),
    ({**LLAMA3_8B, "num_hidden_layers": True}, "num_hidden_layers"),
    ({**LLAMA3_8B, "num_hidden_layers": 32.0}, "num_hidden_layers"),
    ({**LLAMA3_8B, "num_attention_heads": 0}, "num_attention_heads"),
    ({**LLAMA3_8B, "num_key_value_heads": 3}, "num_key_value_heads"),
    ({**LLAMA3_8B, "head_dim": -128}, "head_dim"),
    ({**LLAMA3_8B, "max_position_embeddings": 10**12}, "max_position_embeddings"),
    ({**GEMMA3_27B, "text_config": "gemma"}, "text_config"),
    ({**GEMMA3_27B, "text_config": [1, 2]}, "text_config"),
    ({**GEMMA3_1B, "layer_types": ["sliding_attention"] * 5}, "layer_types"),
    ({**GEMMA3_1B, "layer_types": ["sliding_attention"] * 25 + ["dilated_attention"]}, "layer_types[25]"),
    ({**GEMMA3_1B, "layer_types": "sliding_attention"}, "layer_types"),
    ({**GEMMA3_1B, "sliding_window": 0}, "sliding_window"),
    ({**MISTRAL_7B, "sliding_window": "4096"}, "sliding_window"),
    ({**QWEN25_7B, "use_sliding_window": "yes"}, "use_sliding_window"),
    ({**QWEN25_7B, "use_sliding_window": True, "max_window_layers": -1}, "max_window_layers"),
    ({**LLAMA3_8B, "model_type": "<script>alert(1)</script>"}, "model_type"),
    ({**LLAMA3_8B, "model_type": 42}, "model_type"),
    ({"model_type": "resnet", "num_hidden_layers": 50, "hidden_size": 2048}, "model_type"),
    ({**NEMOTRON_H_8B, "hybrid_override_pattern": "M*-"}, "hybrid_override_pattern"),
    ({**NEMOTRON_H_8B, "hybrid_override_pattern": "X" * 52}, "hybrid_override_pattern"),
    ({**KIMI_LINEAR, "linear_attn_config": "kda"}, "linear_attn_config"),
    ({**KIMI_LINEAR, "linear_attn_config": {**KIMI_LINEAR["linear_attn_config"], "kda_layers": [1, 2, 4]}},
     "linear_attn_config"),
    (without(DEEPSEEK_V3, "kv_lora_rank"), "kv_lora_rank"),
    ({**DEEPSEEK_V3, "qk_rope_head_dim": 1e30}, "qk_rope_head_dim"),
    ({**NEMOTRON_H_8B, "n_groups": 3}, "n_groups"),
    ({**QWEN3_NEXT, "linear_num_key_heads": 5}, "linear_num_key_heads"),
    ({**JAMBA, "attn_layer_offset": 8}, "attn_layer_offset"),
    ({**LLAMA4_SCOUT, "text_config": {**LLAMA4_SCOUT["text_config"], "no_rope_layers": [2] * 48}},
     "no_rope_layers"),
    ({**LLAMA4_SCOUT, "text_config": {**LLAMA4_SCOUT["text_config"], "attention_chunk_size": "big"}},
     "attention_chunk_size"),
    ({**MINIMAX_01, "attn_type_list": [0, 1]}, "attn_type_list"),
    ({**GRANITE_H, "mamba_n_heads": 7}, "mamba_n_heads"),
    ({**FALCON_H1_34B, "mamba_d_state": None}, "mamba_d_state"),
    ({**MAMBA_CODESTRAL, "state_size": [128]}, "state_size"),
]


@pytest.mark.parametrize("config, field", HOSTILE, ids=[f"{i}-{f}" for i, (_, f) in enumerate(HOSTILE)])
def test_a_config_that_cannot_be_planned_is_refused_naming_its_field(config, field):
    with pytest.raises(ValueError) as planned_error:
        from_hf_config(config)
    with pytest.raises(ValueError) as counted_error:
        count_weights(config)
    for error in (planned_error, counted_error):
        message = str(error.value)
        assert field in message, message
        assert len(message) < 400 and "\n" not in message  # one sentence, values clipped


@pytest.mark.parametrize("call, field", [
    (lambda: from_hf_config(LLAMA3_8B, name=7), "name"),
    (lambda: count_weights(without(LLAMA3_8B, "vocab_size")), "vocab_size"),
    (lambda: count_weights({**MIXTRAL_8X7B, "num_experts_per_tok": 9}), "num_experts_per_tok"),
    (lambda: count_weights({**LLAMA3_8B, "torch_dtype": "int3"}), "torch_dtype"),
    (lambda: count_weights({**LLAMA3_8B, "quantization_config": ["fp8"]}), "quantization_config"),
    (lambda: count_weights(LLAMA3_8B, dtype="float7"), "dtype"),
    (lambda: from_hf_config([LLAMA3_8B]), "JSON object"),
])
def test_other_bad_inputs_are_refused_by_name(call, field):
    with pytest.raises(ValueError, match=field):
        call()


def test_a_long_value_is_clipped_in_the_message():
    with pytest.raises(ValueError) as e:
        from_hf_config({**LLAMA3_8B, "num_hidden_layers": "x" * 100000})
    assert len(str(e.value)) < 200


JUNK = [None, -1, 0, 1, 2**62, 10**400, 1e30, float("nan"), True, "x", "<b>", [], [1], {}, {"a": 1}]


def test_no_field_set_to_junk_raises_anything_but_a_value_error():
    """Every field of every config above set to each junk value: planned and counted, or refused with ValueError."""
    for config in ALL.values():
        nested = "text_config" in config
        fields = config["text_config"] if nested else config
        for key in fields:
            for junk in JUNK:
                broken = copy.deepcopy(config)
                (broken["text_config"] if nested else broken)[key] = junk
                for call in (from_hf_config, count_weights):
                    try:
                        call(broken)
                    except ValueError:
                        pass


NESTED = [(KIMI_LINEAR, "linear_attn_config"), (GPT_OSS_20B, "quantization_config"),
          (DEEPSEEK_V3, "quantization_config")]


def test_no_nested_field_set_to_junk_raises_anything_but_a_value_error():
    for config, key in NESTED:
        for inner in config[key]:
            for junk in JUNK:
                broken = copy.deepcopy(config)
                broken[key][inner] = junk
                for call in (from_hf_config, count_weights):
                    try:
                        call(broken)
                    except ValueError:
                        pass
    odd_keys = {**LLAMA3_8B, 1: 2, None: 3, ("a",): 4}  # a dict built in code may have keys JSON cannot
    assert any("does not use" in n for n in from_hf_config(odd_keys)[1])


# --- files --------------------------------------------------------------------------------------------------------

def write(tmp_path, text: str | bytes, name: str = "config.json"):
    path = tmp_path / name
    path.write_bytes(text if isinstance(text, bytes) else text.encode())
    return path


def test_a_config_file_is_read(tmp_path):
    model, _ = from_hf_config(read_config(write(tmp_path, json.dumps(GEMMA3_27B))))
    assert plan(model, 131072).kv_cache_bytes == 52 * 2 * 16 * 128 * 1024 * 2 + 10 * 2 * 16 * 128 * 131072 * 2
    assert read_config(str(write(tmp_path, b"\xef\xbb\xbf" + json.dumps(LLAMA3_8B).encode()))) == LLAMA3_8B


def test_infinity_in_a_field_the_planner_does_not_read_is_noted(tmp_path):
    # transformers saves Mamba-2's time_step_limit (0.0, inf) as [0.0, Infinity]
    text = json.dumps({**MAMBA_CODESTRAL, "time_step_limit": [0.0, float("inf")]})
    assert "Infinity" in text
    _, notes = from_hf_config(read_config(write(tmp_path, text)))
    assert any("time_step_limit[1]" in n for n in notes)


def sparse(tmp_path, size: int):
    path = tmp_path / "big.json"
    with open(path, "wb") as f:
        f.truncate(size)
    return path


@pytest.mark.skipif(not hasattr(os, "mkfifo"), reason="FIFOs are POSIX")
def test_a_fifo_is_refused_without_waiting_for_a_writer(tmp_path):
    fifo = tmp_path / "config.json"
    os.mkfifo(fifo)
    with pytest.raises(ValueError, match="not a regular file"):
        read_config(fifo)


@pytest.mark.parametrize("make, words", [
    (lambda p: p, "not a regular file"),  # a directory
    (lambda p: write(p, b"{" + b" " * (5 << 20) + b"}"), "bytes"),  # 5 MB
    (lambda p: sparse(p, 50 << 20), "52,428,800 bytes"),  # 50 MB, refused before a byte is read
    (lambda p: write(p, "{'model_type': 'llama'}"), "not JSON"),
    (lambda p: write(p, "[1, 2, 3]"), "this one a list"),
    (lambda p: write(p, '"llama"'), "this one a text"),
    (lambda p: write(p, b"\xff\xfe{}"), "UTF-8"),
    (lambda p: write(p, "[" * 100000 + "]" * 100000), "not JSON"),
    (lambda p: write(p, '{"vocab_size": ' + "9" * 5000 + "}"), "not JSON"),
    (lambda p: p / "missing.json", "cannot be opened"),
])
def test_a_file_that_is_not_a_config_is_refused_in_a_sentence(tmp_path, make, words):
    with pytest.raises(ValueError, match=words):
        read_config(make(tmp_path))


@pytest.mark.skipif(not os.path.exists("/dev/zero"), reason="no /dev/zero")
def test_a_device_is_refused():
    with pytest.raises(ValueError, match="not a regular file"):
        read_config("/dev/zero")


@pytest.mark.parametrize("text, field", [
    ('{"model_type": "llama", "num_hidden_layers": NaN, "num_attention_heads": 32}', "num_hidden_layers"),
    ('{"model_type": "llama", "num_hidden_layers": 32, "num_attention_heads": Infinity}', "num_attention_heads"),
    ('{"model_type": "gemma3", "text_config": {"num_hidden_layers": -Infinity, "num_attention_heads": 8}}',
     "text_config.num_hidden_layers"),
])
def test_nan_or_infinity_in_a_size_is_refused_by_name(text, field):
    config = parse_config(text)
    with pytest.raises(ValueError, match=field.replace(".", r"\.")):
        from_hf_config(config)


def test_code_in_a_config_is_text_never_run():
    config = parse_config('{"model_type": "__import__(\'os\').system(\'false\')", "num_hidden_layers": 1}')
    with pytest.raises(ValueError, match="model_type"):
        from_hf_config(config)
