"""The planner's built-in models, each with its source: the models people choose between now as their published
config.json, written out here as dicts and read through `from_hf_config` (so their weights are counted from the same
fields, `count_weights`), and the older ones as layer kinds written by hand from their papers and configs. The
configs are data from the model cards' repositories, recalled as published (no network here): each says which.

    MODELS["gpt-oss-20b"].layers    # 12 sliding-window (128) and 12 full attention layers
    WEIGHTS["gpt-oss-20b"].active   # 3.6e9 of 20.9e9 parameters
"""
from __future__ import annotations

import dataclasses

from attn_core.studies.planner.hf_config import from_hf_config
from attn_core.studies.planner.model import Layer, Model
from attn_core.studies.planner.weights import Weights, count_weights


def _attention(count: int, heads: int, kv_heads: int | None, *, name: str = "full attention",
               mechanism: str = "sdpa", window: int | None = None) -> Layer:
    return Layer(name=name, mechanism=mechanism, count=count, heads=heads, kv_heads=kv_heads, head_dim=128,
                 window=window)


_BY_HAND = (
    # Meta, Llama 3 8B and 70B, config.json: hidden 4096 / 8192, 32 / 80 layers, 32 / 64 heads of 128, 8 key/value
    # heads; context 8192
    Model(name="Llama-3-8B", layers=(_attention(32, 32, 8),), max_context=8192,
          source="Meta, meta-llama/Meta-Llama-3-8B config.json: 32 layers, 32 heads of 128, 8 key/value heads"),
    Model(name="Llama-3-70B", layers=(_attention(80, 64, 8),), max_context=8192,
          source="Meta, meta-llama/Meta-Llama-3-70B config.json: 80 layers, 64 heads of 128, 8 key/value heads"),
    Model(name="Mistral-7B", max_context=8192,
          layers=(_attention(32, 32, 8, name="sliding window", mechanism="sliding_window", window=4096),),
          source="Jiang et al. 2023, 'Mistral 7B', arXiv 2310.06825, table 1: 32 layers, 32 heads of 128, 8 "
                 "key/value heads, window 4096, context 8192"),
    Model(name="Gemma-3-27B", max_context=131072,
          layers=(_attention(52, 32, 16, name="local (sliding window)", mechanism="sliding_window", window=1024),
                  _attention(10, 32, 16, name="global")),
          source="Gemma Team 2025, 'Gemma 3 Technical Report', arXiv 2503.19786, and google/gemma-3-27b-pt "
                 "config.json: 62 layers, 5 local (window 1024) to 1 global, 32 heads of 128, 16 key/value heads"),
    Model(name="DeepSeek-V3", max_context=131072,
          layers=(Layer(name="multi-head latent attention", mechanism="mla", count=61, heads=128, head_dim=128,
                        kv_rank=512, rope_dim=64, prefill_mechanism="mla_naive"),),
          source="DeepSeek-AI 2024, 'DeepSeek-V3 Technical Report', arXiv 2412.19437, section 4.2: 61 layers, 128 "
                 "heads of 128, latent 512, rotary key 64"),
    Model(name="Qwen3-Next-80B-A3B", max_context=262144,
          layers=(Layer(name="Gated DeltaNet", mechanism="gated_deltanet", count=36, heads=32, head_dim=128),
                  Layer(name="gated attention", mechanism="sdpa", count=12, heads=16, kv_heads=2, head_dim=256)),
          source="Qwen, Qwen/Qwen3-Next-80B-A3B-Instruct model card and config.json: 48 layers, 12 × (3 Gated "
                 "DeltaNet, 1 gated attention); attention 16 query and 2 key/value heads of 256; Gated DeltaNet 32 "
                 "value heads and 16 query-key heads of 128 (q and k are repeated to the 32 value heads, so each "
                 "holds a 128 × 128 state); the short convolutions' few cached tokens are left out"),
    # The paper's abstract gives the shares (43% Mamba-2, 7% attention, 50% MLP); Megatron-LM's examples/mamba README
    # the counts, 24, 4 and 28 of 56 layers in its --hybrid-layer-pattern for the report's 8B hybrid; its script for
    # those checkpoints the sizes: --hidden-size 4096 --num-attention-heads 32
    # --num-query-groups 8, and the Mamba-2 sizes it leaves at megatron.core's HybridConfig and MambaMixer defaults
    # (mamba_state_dim 128, mamba_head_dim 64, mamba_num_groups 8, expand 2), the same as state-spaces/mamba's
    # Mamba2 defaults (d_state 128, headdim 64, expand 2): 2 · 4096 / 64 = 128 heads, each a 64 × 128 state.
    Model(name="Mamba-2-Hybrid-8B", max_context=131072,
          layers=(Layer(name="Mamba-2", mechanism="mamba2", count=24, heads=128, head_dim=64, state_dim=128),
                  _attention(4, 32, 8, name="self-attention")),
          source="Waleffe et al. 2024, 'An Empirical Study of Mamba-based Language Models', arXiv 2406.07887: 56 "
                 "layers, 24 Mamba-2, 4 self-attention, 28 MLP; NVIDIA Megatron-LM examples/mamba (README, "
                 "run_text_gen_server_8b.sh): width 4096, attention 32 heads of 128 over 8 key/value groups; Mamba-2 "
                 "at the code's defaults, state 128, head 64, expand 2: 128 heads, each a 64 × 128 state; context "
                 "128k for nvidia/mamba2-hybrid-8b-3t-128k. States counted as this build's mamba2 kernel holds them, "
                 "in float32 (state-spaces/mamba keeps them in the weights' dtype); the 4-token convolution states "
                 "are left out"),
    Model(name="MHA-8B", layers=(_attention(32, 32, None, name="multi-head attention"),), max_context=8192,
          source="a baseline, not a released model: Llama 3 8B's width with one key/value head per query head"),
)

# --- published configs (the fields the reader uses; the rest of each file, token ids and the like, left out) ---

# openai/gpt-oss-20b and openai/gpt-oss-120b, config.json: 24 or 36 layers alternating a 128-token window and full
# attention, 64 query heads of 64 over 8 key/value heads with a learned sink each, 32 or 128 experts of 2880 (4 a
# token), the experts in MXFP4
_GPT_OSS = {"architectures": ["GptOssForCausalLM"], "model_type": "gpt_oss", "vocab_size": 201088,
            "hidden_size": 2880, "intermediate_size": 2880, "num_attention_heads": 64, "num_key_value_heads": 8,
            "head_dim": 64, "sliding_window": 128, "max_position_embeddings": 131072, "initial_context_length": 4096,
            "num_experts_per_tok": 4, "experts_per_token": 4, "attention_bias": True, "tie_word_embeddings": False,
            "swiglu_limit": 7.0, "rope_theta": 150000, "torch_dtype": "bfloat16",
            "rope_scaling": {"rope_type": "yarn", "factor": 32.0, "original_max_position_embeddings": 4096},
            "quantization_config": {"quant_method": "mxfp4", "modules_to_not_convert": [
                "model.layers.*.self_attn", "model.layers.*.mlp.router", "model.embed_tokens", "lm_head"]}}


def _gpt_oss(layers: int, experts: int) -> dict:
    return {**_GPT_OSS, "num_hidden_layers": layers, "num_local_experts": experts,
            "layer_types": ["sliding_attention", "full_attention"] * (layers // 2)}


# meta-llama/Llama-4-Scout-17B-16E, config.json's text_config: 48 layers, 40 query heads of 128 over 8, chunks of
# 8192 in the RoPE layers and every 4th layer global without RoPE; 16 routed experts (1 a token) and a shared one
_LLAMA4_SCOUT = {"model_type": "llama4", "architectures": ["Llama4ForConditionalGeneration"],
                 "text_config": {"model_type": "llama4_text", "hidden_size": 5120, "intermediate_size": 8192,
                                 "intermediate_size_mlp": 16384, "num_hidden_layers": 48, "num_attention_heads": 40,
                                 "num_key_value_heads": 8, "head_dim": 128, "attention_chunk_size": 8192,
                                 "no_rope_layers": [], "vocab_size": 202048, "num_local_experts": 16,
                                 "num_experts_per_tok": 1, "interleave_moe_layer_step": 1,
                                 "max_position_embeddings": 10485760, "rope_theta": 500000.0,
                                 "torch_dtype": "bfloat16"},
                 "vision_config": {"model_type": "llama4_vision_model"}, "torch_dtype": "bfloat16"}
# deepseek-ai/DeepSeek-V3.2-Exp, config.json: DeepSeek-V3's 61 MLA layers (latent 512, rotary key 64; 128 heads),
# 256 routed experts of 2048 (8 a token) and a shared one, the first 3 layers dense; FP8 weights in blocks of
# 128 × 128; and DeepSeek sparse attention's lightning indexer (64 heads, keys of 128, the top 2048 tokens)
_DEEPSEEK_V32 = {"architectures": ["DeepseekV32ForCausalLM"], "model_type": "deepseek_v32", "vocab_size": 129280,
                 "hidden_size": 7168, "intermediate_size": 18432, "moe_intermediate_size": 2048,
                 "num_hidden_layers": 61, "num_nextn_predict_layers": 1, "num_attention_heads": 128,
                 "num_key_value_heads": 128, "n_shared_experts": 1, "n_routed_experts": 256,
                 "routed_scaling_factor": 2.5, "kv_lora_rank": 512, "q_lora_rank": 1536, "qk_rope_head_dim": 64,
                 "v_head_dim": 128, "qk_nope_head_dim": 128, "topk_method": "noaux_tc", "n_group": 8,
                 "topk_group": 4, "num_experts_per_tok": 8, "moe_layer_freq": 1, "first_k_dense_replace": 3,
                 "norm_topk_prob": True, "scoring_func": "sigmoid", "max_position_embeddings": 163840,
                 "index_head_dim": 128, "index_n_heads": 64, "index_topk": 2048, "tie_word_embeddings": False,
                 "torch_dtype": "bfloat16",
                 "quantization_config": {"activation_scheme": "dynamic", "fmt": "e4m3", "quant_method": "fp8",
                                         "weight_block_size": [128, 128]}}
# moonshotai/Kimi-Linear-48B-A3B-Instruct, config.json: 27 layers, KDA in 20 and MLA (latent 512, rotary 64) in
# layers 4, 8, …, 24 and 27 (numbered from 1); 256 experts of 1024 (8 a token) and a shared one, the first dense
_KIMI_MLA = (4, 8, 12, 16, 20, 24, 27)
_KIMI_LINEAR = {"model_type": "kimi_linear", "architectures": ["KimiLinearForCausalLM"], "vocab_size": 163840,
                "hidden_size": 2304, "intermediate_size": 9216, "num_hidden_layers": 27, "num_attention_heads": 32,
                "num_key_value_heads": 32, "kv_lora_rank": 512, "q_lora_rank": None, "qk_nope_head_dim": 128,
                "qk_rope_head_dim": 64, "v_head_dim": 128, "mla_use_nope": True, "moe_intermediate_size": 1024,
                "num_experts": 256, "num_experts_per_token": 8, "num_shared_experts": 1, "first_k_dense_replace": 1,
                "moe_layer_freq": 1, "max_position_embeddings": 1048576, "tie_word_embeddings": False,
                "torch_dtype": "bfloat16",
                "linear_attn_config": {"full_attn_layers": list(_KIMI_MLA),
                                       "kda_layers": [i for i in range(1, 28) if i not in _KIMI_MLA],
                                       "num_heads": 32, "head_dim": 128, "short_conv_kernel_size": 4}}
# MiniMaxAI/MiniMax-M1-80k, config.json (MiniMax-Text-01's architecture): 80 layers, 7 lightning-attention layers
# to 1 softmax layer (attn_type_list: 0 lightning, 1 softmax), 64 heads of 128, 8 key/value heads in the softmax
# layers; 32 experts of 9216, 2 a token
_MINIMAX_M1 = {"model_type": "minimax_m1", "architectures": ["MiniMaxM1ForCausalLM"], "vocab_size": 200064,
               "hidden_size": 6144, "intermediate_size": 9216, "num_hidden_layers": 80, "num_attention_heads": 64,
               "num_key_value_heads": 8, "head_dim": 128, "attn_type_list": ([0] * 7 + [1]) * 10,
               "num_local_experts": 32, "num_experts_per_tok": 2, "max_position_embeddings": 10240000,
               "rope_theta": 10000000, "tie_word_embeddings": False, "torch_dtype": "bfloat16"}
# ibm-granite/granite-4.0-h-tiny, config.json: 40 layers, attention (12 heads of 128 over 4) in layers 5, 15, 25 and
# 35, Mamba-2 (48 heads of 64, state 128, 1 group) in the rest; 64 experts of 512 (6 a token) and a shared MLP of 1024
_GRANITE_4_H_TINY = {"model_type": "granitemoehybrid", "architectures": ["GraniteMoeHybridForCausalLM"],
                     "vocab_size": 100352, "hidden_size": 1536, "intermediate_size": 512,
                     "shared_intermediate_size": 1024, "num_hidden_layers": 40, "num_attention_heads": 12,
                     "num_key_value_heads": 4, "mamba_n_heads": 48, "mamba_d_head": 64, "mamba_d_state": 128,
                     "mamba_n_groups": 1, "mamba_d_conv": 4, "mamba_expand": 2, "num_local_experts": 64,
                     "num_experts_per_tok": 6, "max_position_embeddings": 131072, "tie_word_embeddings": True,
                     "position_embedding_type": "nope",
                     "layer_types": ["attention" if i in (5, 15, 25, 35) else "mamba" for i in range(40)],
                     "torch_dtype": "bfloat16"}
# nvidia/Nemotron-H-8B-Base-8K, config.json: 52 layers by hybrid_override_pattern, 24 Mamba-2 ('M': 128 heads of 64,
# state 128, 8 groups), 4 attention ('*': 32 heads of 128 over 8) and 24 squared-ReLU MLPs ('-') of 21504
_NEMOTRON_H_8B = {"model_type": "nemotron_h", "architectures": ["NemotronHForCausalLM"], "vocab_size": 131072,
                  "hidden_size": 4096, "intermediate_size": 21504, "num_hidden_layers": 52,
                  "hybrid_override_pattern": "M-M-M-M*-M-M-M-M-M*-M-M-M-M-M*-M-M-M-M-M*-M-M-M-M-M-",
                  "num_attention_heads": 32, "num_key_value_heads": 8, "head_dim": 128, "mamba_num_heads": 128,
                  "mamba_head_dim": 64, "ssm_state_size": 128, "n_groups": 8, "conv_kernel": 4, "expand": 2,
                  "mlp_hidden_act": "relu2", "max_position_embeddings": 8192, "tie_word_embeddings": False,
                  "torch_dtype": "bfloat16"}

# name → (config, source). The source names the config and the published totals the weights are checked against
# (tests/studies/test_planner_builtin.py).
CONFIGS: dict[str, tuple[dict, str]] = {
    "gpt-oss-20b": (_gpt_oss(24, 32),
                    "OpenAI, openai/gpt-oss-20b config.json: 24 layers alternating a 128-token window and full "
                    "attention, 64 heads of 64 over 8 key/value heads, sinks; 32 experts, 4 a token, in MXFP4. "
                    "'gpt-oss-120b & gpt-oss-20b Model Card' (arXiv 2508.10925), table 1: 20.91B total, 3.61B "
                    "active"),
    "gpt-oss-120b": (_gpt_oss(36, 128),
                     "OpenAI, openai/gpt-oss-120b config.json: 36 layers alternating a 128-token window and full "
                     "attention, 64 heads of 64 over 8 key/value heads, sinks; 128 experts, 4 a token, in MXFP4. "
                     "'gpt-oss-120b & gpt-oss-20b Model Card' (arXiv 2508.10925), table 1: 116.83B total, 5.13B "
                     "active"),
    "Llama-4-Scout-17B-16E": (_LLAMA4_SCOUT,
                              "Meta, meta-llama/Llama-4-Scout-17B-16E config.json (text_config): 48 layers, 40 heads "
                              "of 128 over 8 key/value heads, chunks of 8192 in 36 layers, every 4th layer global; "
                              "16 experts, 1 a token, and a shared one. Meta's model card: 109B total, 17B active"),
    "DeepSeek-V3.2": (_DEEPSEEK_V32,
                      "DeepSeek-AI, deepseek-ai/DeepSeek-V3.2-Exp config.json: 61 MLA layers (128 heads, latent 512, "
                      "rotary key 64) and the sparse attention's lightning indexer (64 heads, keys of 128, top "
                      "2048); 256 experts, 8 a token, FP8. V3's totals (arXiv 2412.19437): 671B, 37B active"),
    "Kimi-Linear-48B-A3B": (_KIMI_LINEAR,
                            "Moonshot AI, moonshotai/Kimi-Linear-48B-A3B-Instruct config.json: 27 layers, 20 KDA (32 "
                            "heads of 128) and 7 MLA (latent 512, rotary 64); 256 experts, 8 a token. 'Kimi "
                            "Linear' (arXiv 2510.26692): 48B total, 3B active"),
    "MiniMax-M1": (_MINIMAX_M1,
                   "MiniMax, MiniMaxAI/MiniMax-M1-80k config.json: 80 layers, 7 lightning attention to 1 softmax "
                   "(64 heads of 128, 8 key/value heads); 32 experts, 2 a token. 'MiniMax-M1' (arXiv 2506.13585): "
                   "456B total, 45.9B active"),
    "Granite-4.0-H-Tiny": (_GRANITE_4_H_TINY,
                           "IBM, ibm-granite/granite-4.0-h-tiny config.json: 40 layers, 36 Mamba-2 (48 heads of 64, "
                           "state 128) and 4 attention (12 heads of 128 over 4); 64 experts, 6 a token, and a shared "
                           "MLP. IBM's Granite 4.0 model card: 7B total, 1B active"),
    "Nemotron-H-8B": (_NEMOTRON_H_8B,
                      "NVIDIA, nvidia/Nemotron-H-8B-Base-8K config.json: 52 layers, 24 Mamba-2 (128 heads of 64, "
                      "state 128), 4 attention (32 heads of 128 over 8), 24 MLP. 'Nemotron-H' (arXiv 2504.03624): "
                      "8B"),
}


def from_config(name: str, config: dict, source: str) -> tuple[Model, Weights, list[str]]:
    """A built-in model read from its config (`from_hf_config`) with its name and source, its weights counted from
    the same config (`count_weights`), and the notes of both on what they showed otherwise or left out."""
    model, notes = from_hf_config(config, name=name)
    weights = count_weights(config)
    return dataclasses.replace(model, source=source), weights, list(dict.fromkeys([*notes, *weights.notes]))


_READ = {name: from_config(name, config, source) for name, (config, source) in CONFIGS.items()}
_ORDER = ("llama-3-8b", "llama-3-70b", "mistral-7b", "gemma-3-27b", "gpt-oss-20b", "gpt-oss-120b",
          "llama-4-scout-17b-16e", "deepseek-v3", "deepseek-v3.2", "kimi-linear-48b-a3b", "qwen3-next-80b-a3b",
          "minimax-m1", "granite-4.0-h-tiny", "nemotron-h-8b", "mamba-2-hybrid-8b", "mha-8b")
_ALL = {m.name.lower(): m for m in (*_BY_HAND, *(read[0] for read in _READ.values()))}
MODELS: dict[str, Model] = {key: _ALL[key] for key in _ORDER}
# the weights of the models read from a config, counted from it; the others' are published counts (roofline.PUBLISHED)
WEIGHTS: dict[str, Weights] = {name.lower(): read[1] for name, read in _READ.items()}
NOTES: dict[str, list[str]] = {name.lower(): read[2] for name, read in _READ.items()}
CONFIG: dict[str, dict] = {name.lower(): config for name, (config, _) in CONFIGS.items()}  # by MODELS' keys
# The MLP beside each layer of the models written by hand (those read from a config take theirs from it): hidden
# width, the intermediate width a token runs through, gated (SwiGLU or GeGLU: 3 matrices) or not, layers with one.
# From their config.json files: Llama 3 8B / 70B 14,336 / 28,672; Mistral 7B 14,336; Gemma 3 27B 5376 and 21,504;
# DeepSeek-V3 18,432 dense, 8 routed experts of 2048 and a shared one a token (18,432 too); Qwen3-Next 2048 and 10
# experts of 512 and a shared 512. Mamba-2-Hybrid-8B: Megatron-LM's script, --ffn-hidden-size 16384 in its 28 MLP
# layers, squared ReLU (not gated) as recalled, not verified here.
MLPS: dict[str, tuple[int, int, bool, int]] = {
    "llama-3-8b": (4096, 14336, True, 32), "llama-3-70b": (8192, 28672, True, 80),
    "mistral-7b": (4096, 14336, True, 32), "gemma-3-27b": (5376, 21504, True, 62),
    "deepseek-v3": (7168, 18432, True, 61), "qwen3-next-80b-a3b": (2048, 10 * 512 + 512, True, 48),
    "mamba-2-hybrid-8b": (4096, 16384, False, 28), "mha-8b": (4096, 14336, True, 32)}
