"""Published Hugging Face config.json files as dicts (the values of each model's file), which the planner's tests
read: tests/studies/test_planner_hf.py (caches and weights) and tests/studies/test_planner_hf_refusals.py (broken configs)."""
from __future__ import annotations

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
