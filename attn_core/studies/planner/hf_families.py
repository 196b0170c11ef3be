"""The per-family readers of a Hugging Face config: each model_type's layer pattern as its transformers configuration
class derives it (Qwen2Config, Gemma3TextConfig, GptOssConfig, Llama4TextConfig, JambaConfig, ...), and the fields each
knows. A new family is one line of FAMILIES and, at most, one function."""
from __future__ import annotations

import dataclasses
import math
from typing import Any, Callable

from attn_core.studies.planner.hf_fields import _MISSING, MAX_LAYERS, SHOWN, Fields, Mixer
from attn_core.engine.untrusted import quoted

_MOE = {"n_routed_experts", "n_shared_experts", "first_k_dense_replace", "moe_layer_freq", "routed_scaling_factor",
        "n_group", "topk_group", "topk_method", "scoring_func", "ep_size", "aux_loss_alpha", "seq_aux"}
_QWEN_MOE = {"decoder_sparse_step", "mlp_only_layers", "shared_expert_intermediate_size"}
_MAMBA2 = {"mamba_chunk_size", "mamba_conv_bias", "mamba_proj_bias", "time_step_min", "time_step_max",
           "time_step_floor", "time_step_limit", "mamba_dt_min", "mamba_dt_max", "mamba_dt_limit",
           "mamba_dt_init_floor", "use_mamba_kernels", "residual_in_fp32", "rescale_prenorm_residual",
           "mamba_hidden_act", "num_logits_to_keep"}


def _sliding(f: Fields, n: int, is_sliding: Callable[[int], bool], default_window: Any = _MISSING) -> list[Mixer]:
    """Attention layers, those in `layer_types` marked sliding_attention (or, without it, those is_sliding picks)
    seeing the last `sliding_window` tokens."""
    heads, kv, head_dim = f.attention_heads()
    if f.has("layer_types"):
        types = f.kinds("layer_types", n, ("full_attention", "sliding_attention"))
        windowed = [t == "sliding_attention" for t in types]
    else:
        windowed = [is_sliding(i) for i in range(n)]
    window = f.whole("sliding_window", default_window, low=2) if any(windowed) else None
    plain = Mixer("attention", heads, head_dim, kv, qk_norm=f.family in ("qwen3", "gemma3_text", "gemma3"),
                  bias=f.flag("attention_bias", f.family in ("qwen2", "gpt_oss")))
    sliding = dataclasses.replace(plain, window=window)
    return [sliding if w else plain for w in windowed]


def _llama(f: Fields, n: int) -> list[Mixer]:
    return _sliding(f, n, lambda i: False)


def _mistral(f: Fields, n: int) -> list[Mixer]:
    """Mistral and Mixtral: every layer sees the last `sliding_window` tokens when it is set (Mistral 7B v0.1)."""
    return _sliding(f, n, lambda i: f.has("sliding_window"))


def _qwen2(f: Fields, n: int) -> list[Mixer]:
    """Qwen2 and Qwen3: `sliding_window` counts only when `use_sliding_window` is true, and then in the layers from
    `max_window_layers` on (Qwen2Config: sliding_attention iff i >= max_window_layers)."""
    if not f.flag("use_sliding_window", False):
        if f.has("sliding_window"):
            f.notes.append(f"{f.where}sliding_window is set but use_sliding_window is false, so every layer attends "
                           "to the whole context, as transformers runs it")
        if f.has("layer_types") and "sliding_attention" in f.data["layer_types"]:
            f.notes.append(f"{f.where}layer_types marks sliding layers, but use_sliding_window is false: none is")
        return _sliding(_without(f, "layer_types", "sliding_window"), n, lambda i: False)
    first = f.whole("max_window_layers", 28, low=0, high=MAX_LAYERS)
    return _sliding(f, n, lambda i: i >= first)


def _without(f: Fields, *names: str) -> Fields:
    return Fields({k: v for k, v in f.data.items() if k not in names}, f.where, f.family, f.notes)


def _gemma2(f: Fields, n: int) -> list[Mixer]:
    """Gemma 2 (and gpt-oss): sliding and global layers alternate, the first sliding."""
    return _sliding(f, n, lambda i: (i + 1) % 2 == 1)


def _gemma3(f: Fields, n: int) -> list[Mixer]:
    """Gemma 3: one global layer after every sliding_window_pattern − 1 sliding ones (6: 5 to 1)."""
    pattern = 6 if f.has("layer_types") else f.whole("sliding_window_pattern", 6, high=MAX_LAYERS)
    return _sliding(f, n, lambda i: (i + 1) % pattern != 0, 4096)


def _gpt_oss(f: Fields, n: int) -> list[Mixer]:
    mixers = _sliding(f, n, lambda i: (i + 1) % 2 == 1, 128)
    f.notes.append("attention sinks: each head adds a learned logit to its softmax's denominator, a weight, not a "
                   "cached token: they change no byte of the cache")
    return [dataclasses.replace(m, sinks=True, bias=True) for m in mixers]


def _llama4(f: Fields, n: int) -> list[Mixer]:
    """Llama 4: layers with RoPE attend within chunks of attention_chunk_size; every no_rope_layer_interval-th layer
    (no_rope_layers[i] = 0) has no RoPE and attends to everything."""
    heads, kv, head_dim = f.attention_heads()
    if f.has("layer_types"):
        chunked = [t == "chunked_attention"
                   for t in f.kinds("layer_types", n, ("chunked_attention", "full_attention"))]
    elif f.data.get("no_rope_layers"):  # an empty list means the default, as in Llama4TextConfig
        flags = f.data["no_rope_layers"]
        if not isinstance(flags, list) or len(flags) < n or any(x not in (0, 1) or isinstance(x, bool)
                                                                 for x in flags[:n]):
            raise ValueError(f"{f.where}no_rope_layers must list 1 (RoPE) or 0 (none) for each of the {n} layers")
        chunked = [x == 1 for x in flags[:n]]
    else:
        every = f.whole("no_rope_layer_interval", 4, high=MAX_LAYERS)
        chunked = [(i + 1) % every != 0 for i in range(n)]
    if not any(chunked):
        chunk = None
    elif "attention_chunk_size" in f.data:  # null: no chunking, every layer full attention
        chunk = f.maybe("attention_chunk_size", low=2)
    else:
        chunk = f.whole("attention_chunk_size", 8192, low=2)
    plain = Mixer("attention", heads, head_dim, kv)
    if chunk is None:
        return [plain] * n
    f.notes.append(f"chunked attention: a query sees only the tokens of its own chunk of {chunk:,}, so at most "
                   f"{chunk:,} are cached a layer; shown as a window of {chunk:,}, whose prefill FLOPs are about "
                   "twice the chunks' (a query sees its whole window, in a chunk half of it on average)")
    return [dataclasses.replace(plain, chunk=chunk) if c else plain for c in chunked]


def _mla(f: Fields) -> Mixer:
    heads = f.whole("num_attention_heads")
    nope, v = f.whole("qk_nope_head_dim"), f.whole("v_head_dim")
    return Mixer("mla", heads, nope, q_rank=f.maybe("q_lora_rank"), kv_rank=f.whole("kv_lora_rank"),
                 rope_dim=f.whole("qk_rope_head_dim"), nope_dim=nope, v_dim=v)


def _deepseek(f: Fields, n: int) -> list[Mixer]:
    """DeepSeek-V2/V3 (and Kimi K2, a deepseek_v3): multi-head latent attention in every layer; V3.2 adds the
    lightning indexer, whose keys (index_head_dim a token) are cached beside the latent."""
    mla = _mla(f)
    if f.family == "deepseek_v32" or f.has("index_head_dim"):
        mla = dataclasses.replace(mla, index_heads=f.whole("index_n_heads"), index_dim=f.whole("index_head_dim"))
        top = f.maybe("index_topk")
        picked = "top" if top is None else f"{top:,}"
        f.notes.append(f"DeepSeek sparse attention: each query attends to the {picked} tokens its lightning indexer "
                       "picks, so past them the real attention FLOPs grow with n · top-k, not the n² of the mla rows")
    return [mla] * n


def _qwen3_next(f: Fields, n: int) -> list[Mixer]:
    """Qwen3-Next: Gated DeltaNet layers, and a gated attention layer every full_attention_interval-th."""
    if f.has("layer_types"):
        types = f.kinds("layer_types", n, ("linear_attention", "full_attention"))
    else:
        every = f.whole("full_attention_interval", 4, high=MAX_LAYERS)
        types = ["linear_attention" if (i + 1) % every else "full_attention" for i in range(n)]
    heads, kv, head_dim = f.attention_heads()
    full = Mixer("attention", heads, head_dim, kv, gated=True, qk_norm=True)
    kh, kd = f.whole("linear_num_key_heads", 16), f.whole("linear_key_head_dim", 128)
    vh, vd = f.whole("linear_num_value_heads", 32), f.whole("linear_value_head_dim", 128)
    if vh % kh:
        raise ValueError(f"{f.where}linear_num_key_heads {kh} does not divide linear_num_value_heads {vh}")
    linear = Mixer("gated_deltanet", vh, vd, key_heads=kh, key_dim=kd, conv=f.whole("linear_conv_kernel_dim", 4),
                   conv_channels=2 * kh * kd + vh * vd)  # the convolution runs over q, k and v
    return [linear if t == "linear_attention" else full for t in types]


def _minimax(f: Fields, n: int) -> list[Mixer]:
    """MiniMax-01: lightning attention (linear attention with a decay, a head_dim × head_dim state a head) among
    softmax layers; `layer_types`, or the original `attn_type_list` (0 lightning, 1 softmax)."""
    if f.has("layer_types"):
        linear = [t == "linear_attention" for t in f.kinds("layer_types", n, ("linear_attention", "full_attention"))]
    elif f.has("attn_type_list"):
        flags = f.data["attn_type_list"]
        if not isinstance(flags, list) or len(flags) != n or any(x not in (0, 1) or isinstance(x, bool)
                                                                  for x in flags):
            raise ValueError(f"{f.where}attn_type_list must list 0 (lightning) or 1 (softmax) for each of the {n} "
                             "layers")
        linear = [x == 0 for x in flags]
    else:
        linear = [(i + 1) % 2 == 0 for i in range(n)]  # MiniMaxConfig's default
    heads, kv, head_dim = f.attention_heads()
    return [Mixer("lightning", heads, head_dim) if lin else Mixer("attention", heads, head_dim, kv)
            for lin in linear]


def _mamba2_mixer(f: Fields, heads: int, head_dim: int, state: int, groups: int, conv: int,
                  groups_field: str = "n_groups") -> Mixer:
    if heads % groups:
        raise ValueError(f"{f.where}{groups_field} {groups} does not divide the {heads} Mamba-2 heads")
    return Mixer("mamba2", heads, head_dim, key_dim=state, groups=groups, conv=conv,
                 conv_channels=heads * head_dim + 2 * groups * state)  # x, B and C pass the convolution


def _nemotron_h(f: Fields, n: int) -> list[Mixer]:
    """Nemotron-H: hybrid_override_pattern, a letter a layer: M Mamba-2, * attention, - MLP, E mixture of experts."""
    pattern = f.text("hybrid_override_pattern")
    if len(pattern) != n or set(pattern) - set("M*-E"):
        raise ValueError(f"{f.where}hybrid_override_pattern must be {n} letters of M, *, - and E, one a layer, got "
                         f"{quoted(pattern, SHOWN)}")
    heads = f.whole("num_attention_heads")
    kv = f.whole("num_key_value_heads")
    head_dim = f.whole("head_dim") if f.has("head_dim") else f.whole("attention_head_dim")
    attention = Mixer("attention", heads, head_dim, kv)
    mamba = _mamba2_mixer(f, f.whole("mamba_num_heads"), f.whole("mamba_head_dim"), f.whole("ssm_state_size"),
                          f.whole("n_groups", 8), f.whole("conv_kernel", 4))
    return [mamba if c == "M" else attention if c == "*" else None for c in pattern]


def _granite_hybrid(f: Fields, n: int) -> list[Mixer]:
    """Granite 4.0-H: `layer_types` of mamba and attention layers (all Mamba-2 without it)."""
    types = f.kinds("layer_types", n, ("mamba", "attention")) if f.has("layer_types") else ["mamba"] * n
    heads, kv, head_dim = f.attention_heads()
    inner = f.whole("mamba_expand", 2) * f.whole("hidden_size")
    mamba = _mamba2_heads(f, "mamba_n_heads", "mamba_d_head", inner, "mamba_d_state", "mamba_n_groups",
                          "mamba_d_conv")
    return [mamba if t == "mamba" else Mixer("attention", heads, head_dim, kv) for t in types]


def _mamba2_heads(f: Fields, heads_field: str, dim_field: str, inner: int, state: str, groups: str,
                  conv: str) -> Mixer:
    """A Mamba-2 mixer whose head size may be "auto" (the inner width over the heads), as Granite and Falcon-H1
    write it."""
    heads = f.whole(heads_field)
    if f.data.get(dim_field, "auto") == "auto":
        if inner % heads:
            raise ValueError(f"{f.where}{heads_field} {heads} does not divide the Mamba-2 inner width {inner}")
        head_dim = inner // heads
    else:
        head_dim = f.whole(dim_field)
        if heads * head_dim != inner:  # as transformers checks it
            raise ValueError(f"{f.where}{heads_field} {heads} × {dim_field} {head_dim} is not the Mamba-2 inner "
                             f"width {inner}")
    return _mamba2_mixer(f, heads, head_dim, f.whole(state), f.whole(groups, 1), f.whole(conv, 4), groups)


def _falcon_h1(f: Fields, n: int) -> list[tuple[Mixer, Mixer]]:
    """Falcon-H1: every layer runs attention and Mamba-2 side by side (both caches in every layer)."""
    heads, kv, head_dim = f.attention_heads()
    inner = f.whole("mamba_d_ssm") if f.has("mamba_d_ssm") else f.whole("mamba_expand", 2) * f.whole("hidden_size")
    mamba = _mamba2_heads(f, "mamba_n_heads", "mamba_d_head", inner, "mamba_d_state", "mamba_n_groups",
                          "mamba_d_conv")
    return [(Mixer("attention", heads, head_dim, kv), mamba)] * n


def _mamba2(f: Fields, n: int) -> list[Mixer]:
    return [_mamba2_mixer(f, f.whole("num_heads"), f.whole("head_dim"), f.whole("state_size"),
                          f.whole("n_groups", 1), f.whole("conv_kernel", 4))] * n


def _mamba1_mixer(f: Fields, inner: int, state: str, conv: str, rank: str) -> Mixer:
    hidden = f.whole("hidden_size")
    dt_rank = math.ceil(hidden / 16) if f.data.get(rank, "auto") == "auto" else f.whole(rank)
    return Mixer("mamba", inner, 1, key_dim=f.whole(state, 16), dt_rank=dt_rank, conv=f.whole(conv, 4),
                 conv_channels=inner)


def _mamba(f: Fields, n: int) -> list[Mixer]:
    inner = f.whole("intermediate_size") if f.has("intermediate_size") else f.whole("expand", 2) * \
        f.whole("hidden_size")
    return [_mamba1_mixer(f, inner, "state_size", "conv_kernel", "time_step_rank")] * n


def _jamba(f: Fields, n: int) -> list[Mixer]:
    """Jamba: an attention layer where i % attn_layer_period == attn_layer_offset, Mamba (1) elsewhere."""
    period = f.whole("attn_layer_period", 8, high=MAX_LAYERS)
    offset = f.whole("attn_layer_offset", 4, low=0, high=period - 1)
    heads, kv, head_dim = f.attention_heads()
    mamba = _mamba1_mixer(f, f.whole("mamba_expand", 2) * f.whole("hidden_size"), "mamba_d_state", "mamba_d_conv",
                          "mamba_dt_rank")
    return [Mixer("attention", heads, head_dim, kv) if i % period == offset else mamba for i in range(n)]


def _kimi_linear(f: Fields, n: int) -> list[Mixer]:
    """Kimi Linear: linear_attn_config lists its KDA layers and its MLA layers, numbered from 1."""
    linear = f.sub("linear_attn_config")
    kda = set(linear.indices("kda_layers", 0, n))
    full = set(linear.indices("full_attn_layers", 0, n))
    base = 0 if kda | full == set(range(n)) else 1
    if kda & full or kda | full != set(range(base, n + base)):
        raise ValueError(f"{f.where}linear_attn_config: kda_layers and full_attn_layers must share out the layers "
                         f"1 to {n}, each once")
    heads, dim = linear.whole("num_heads"), linear.whole("head_dim")
    kda_mixer = Mixer("kda", heads, dim, key_heads=heads, key_dim=dim, conv=linear.whole("short_conv_kernel_size", 4),
                      conv_channels=3 * heads * dim)  # q, k and v each pass a short convolution
    mla = _mla(f)
    return [kda_mixer if i + base in kda else mla for i in range(n)]


# model_type → (reader, the fields it knows beyond _COMMON). A new family is one line and, at most, one function.
FAMILIES: dict[str, tuple[Callable[[Fields, int], list], frozenset[str]]] = {
    "llama": (_llama, frozenset()),
    "mistral": (_mistral, frozenset({"sliding_window"})),
    "mixtral": (_mistral, frozenset({"sliding_window"})),
    "qwen2": (_qwen2, frozenset({"use_sliding_window", "sliding_window", "max_window_layers", "layer_types",
                                 *_QWEN_MOE})),
    "qwen3": (_qwen2, frozenset({"use_sliding_window", "sliding_window", "max_window_layers", "layer_types",
                                 *_QWEN_MOE})),
    "gemma2": (_gemma2, frozenset({"sliding_window", "layer_types", "query_pre_attn_scalar",
                                   "final_logit_softcapping", "attn_logit_softcapping", "hidden_activation"})),
    "gemma3_text": (_gemma3, frozenset({"sliding_window", "sliding_window_pattern", "layer_types",
                                        "query_pre_attn_scalar", "final_logit_softcapping", "attn_logit_softcapping",
                                        "hidden_activation", "rope_local_base_freq"})),
    "gpt_oss": (_gpt_oss, frozenset({"sliding_window", "layer_types", "experts_per_token", "swiglu_limit",
                                     "swiglu_alpha", "initial_context_length"})),
    "llama4_text": (_llama4, frozenset({"attention_chunk_size", "no_rope_layers", "no_rope_layer_interval",
                                        "layer_types", "intermediate_size_mlp", "moe_layers",
                                        "interleave_moe_layer_step", "attn_temperature_tuning", "floor_scale",
                                        "attn_scale"})),
    "qwen3_next": (_qwen3_next, frozenset({"layer_types", "full_attention_interval", "linear_conv_kernel_dim",
                                           "linear_key_head_dim", "linear_value_head_dim", "linear_num_key_heads",
                                           "linear_num_value_heads", "decoder_sparse_step", "mlp_only_layers",
                                           "shared_expert_intermediate_size"})),
    "deepseek_v3": (_deepseek, frozenset({"q_lora_rank", "kv_lora_rank", "qk_rope_head_dim", "qk_nope_head_dim",
                                          "v_head_dim", "num_nextn_predict_layers", *_MOE})),
    "deepseek_v32": (_deepseek, frozenset({"q_lora_rank", "kv_lora_rank", "qk_rope_head_dim", "qk_nope_head_dim",
                                           "v_head_dim", "num_nextn_predict_layers", "index_n_heads",
                                           "index_head_dim", "index_topk", *_MOE})),
    "kimi_linear": (_kimi_linear, frozenset({"linear_attn_config", "q_lora_rank", "kv_lora_rank",
                                             "qk_rope_head_dim", "qk_nope_head_dim", "v_head_dim", "mla_use_nope",
                                             "num_experts_per_token", "num_shared_experts", "moe_renormalize",
                                             "moe_router_activation_func", "num_expert_group", *_MOE})),
    "nemotron_h": (_nemotron_h, frozenset({"hybrid_override_pattern", "attention_head_dim", "mamba_num_heads",
                                           "mamba_head_dim", "ssm_state_size", "n_groups", "conv_kernel", "expand",
                                           "mlp_hidden_act", "use_bias", "use_conv_bias", "chunk_size",
                                           "sliding_window", "moe_shared_expert_intermediate_size", *_MOE,
                                           *_MAMBA2})),
    "granitemoehybrid": (_granite_hybrid, frozenset({"layer_types", "mamba_n_heads", "mamba_n_groups",
                                                     "mamba_d_state", "mamba_d_head", "mamba_d_conv", "mamba_expand",
                                                     "shared_intermediate_size", "embedding_multiplier",
                                                     "logits_scaling", "residual_multiplier",
                                                     "attention_multiplier", "position_embedding_type", *_MAMBA2})),
    "jamba": (_jamba, frozenset({"attn_layer_period", "attn_layer_offset", "expert_layer_period",
                                 "expert_layer_offset", "mamba_d_state", "mamba_d_conv", "mamba_expand",
                                 "mamba_dt_rank", "sliding_window", *_MAMBA2})),
    "falcon_h1": (_falcon_h1, frozenset({"mamba_d_ssm", "mamba_n_heads", "mamba_d_head", "mamba_n_groups",
                                         "mamba_d_state", "mamba_d_conv", "mamba_expand", "mamba_norm_before_gate",
                                         "mamba_rms_norm", "projectors_bias", "lm_head_multiplier",
                                         "embedding_multiplier", "mlp_multipliers", "key_multiplier",
                                         "attention_out_multiplier", "attention_in_multiplier", "ssm_multipliers",
                                         "ssm_in_multiplier", "ssm_out_multiplier", *_MAMBA2})),
    "mamba2": (_mamba2, frozenset({"num_heads", "state_size", "n_groups", "conv_kernel", "expand", "use_bias",
                                   "use_conv_bias", "chunk_size", "norm_before_gate", "rms_norm",
                                   "tie_embedding_weights", *_MAMBA2})),
    "mamba": (_mamba, frozenset({"state_size", "conv_kernel", "expand", "time_step_rank", "time_step_scale",
                                 "time_step_init_scheme", "use_bias", "use_conv_bias", "use_mambapy", *_MAMBA2})),
    "minimax": (_minimax, frozenset({"layer_types", "attn_type_list", "block_size", "full_attn_alpha_factor",
                                     "full_attn_beta_factor", "linear_attn_alpha_factor", "linear_attn_beta_factor",
                                     "mlp_alpha_factor", "mlp_beta_factor", "sliding_window", "postnorm",
                                     "layernorm_full_attention_alpha", "layernorm_full_attention_beta",
                                     "layernorm_linear_attention_alpha", "layernorm_linear_attention_beta",
                                     "layernorm_mlp_alpha", "layernorm_mlp_beta", "shared_intermediate_size",
                                     "shared_moe_mode"})),
}
ALIASES = {"gemma3": "gemma3_text", "llama4": "llama4_text", "qwen2_moe": "qwen2", "qwen3_moe": "qwen3",
           "deepseek_v2": "deepseek_v3", "kimi_k2": "deepseek_v3", "minimax_m1": "minimax"}
