"""A model's attention read from its Hugging Face `config.json`, for the planner: the fields its configuration class
uses (`num_key_value_heads`, `layer_types`, `sliding_window`, `kv_lora_rank`, `hybrid_override_pattern`, ...) become
layer kinds with counts, and what cannot be shown as one of the planner's kinds is said in a note (principle 15).

    model, notes = from_hf_config(read_config("config.json"))
    plan(model, 131072).kv_cache_bytes

The layer patterns follow what each transformers configuration class derives from its fields (Qwen2Config,
Gemma3TextConfig, GptOssConfig, Llama4TextConfig, Qwen3NextConfig, JambaConfig, ...); the file is data, never code.
"""
from __future__ import annotations

import dataclasses
import json
import math
import os
import re
import stat
from dataclasses import dataclass
from typing import Any, Callable

from attn_core.studies.planner.model import MAX_CONTEXT, MAX_NAME, MAX_SIZE, MAX_SOURCE, Layer, Model
from attn_core.spec import DTYPE_BYTES
from attn_core.engine.untrusted import clipped, printable, quoted

MAX_CONFIG_BYTES = 4 << 20  # 4 MiB: DeepSeek-V3's config.json is 1.7 KB, a multimodal one a few KB
MAX_LAYERS = 16384  # no published model has more than a few hundred layers
MAX_VOCAB = 1 << 24
SHOWN = 40  # characters of a value quoted back in a message
_MODEL_TYPE = re.compile(r"[A-Za-z0-9_.\-]{1,64}")
_MISSING = object()


@dataclass(frozen=True)
class NonFinite:
    """A NaN or ±Infinity constant from a JSON file (which JSON itself does not allow, and Python writes): kept as
    this marker, never as a number, so a size holding one is refused by name; one in a field the planner does not
    read (Mamba-2's `time_step_limit: [0.0, Infinity]`, as transformers saves it) is only noted."""

    text: str

    def __repr__(self) -> str:
        return self.text


def read_config(path: str | os.PathLike) -> dict:
    """The JSON object of a `config.json` at `path`: a regular file of at most MAX_CONFIG_BYTES, UTF-8 JSON whose top
    level is an object. Nothing in it is run (json.loads only). ValueError with one sentence for a path that is not
    a regular file (a directory, a FIFO, a device), a larger file, text that is not JSON, or another top level."""
    if not isinstance(path, (str, os.PathLike)):
        raise ValueError(f"path must be a file name, got {quoted(path, SHOWN)}")
    shown = quoted(os.fspath(path), SHOWN)
    try:
        # O_NONBLOCK: opening a FIFO must not wait for a writer; the descriptor is then checked, not the name.
        fd = os.open(path, os.O_RDONLY | getattr(os, "O_NONBLOCK", 0))
    except (OSError, ValueError) as e:
        raise ValueError(f"config file {shown} cannot be opened ({clipped(printable(e), 80)})") from None
    try:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode):
            raise ValueError(f"config file {shown} is not a regular file (a directory, a pipe or a device); "
                             "choose a config.json")
        if info.st_size > MAX_CONFIG_BYTES:
            raise ValueError(f"config file {shown} is {info.st_size:,} bytes, over the {MAX_CONFIG_BYTES:,} a "
                             "config.json can need; choose the model's config.json")
        with os.fdopen(os.dup(fd), "rb") as f:
            raw = f.read(MAX_CONFIG_BYTES + 1)
    except OSError as e:
        raise ValueError(f"config file {shown} cannot be read ({clipped(printable(e), 80)})") from None
    finally:
        os.close(fd)
    if len(raw) > MAX_CONFIG_BYTES:  # it grew after fstat
        raise ValueError(f"config file {shown} is over the {MAX_CONFIG_BYTES:,} bytes a config.json can need")
    return parse_config(raw)


def parse_config(raw: bytes | str) -> dict:
    """The JSON object of a config's text (UTF-8 bytes, a byte-order mark allowed); ValueError otherwise."""
    try:
        text = raw.decode("utf-8-sig") if isinstance(raw, bytes) else raw
        data = json.loads(text, parse_constant=NonFinite)
    except UnicodeDecodeError:
        raise ValueError("the config is not UTF-8 text, so not a config.json") from None
    except (ValueError, RecursionError) as e:  # bad JSON, an integer of thousands of digits, deep nesting
        raise ValueError(f"the config is not JSON ({clipped(printable(e), 80)})") from None
    if not isinstance(data, dict):
        raise ValueError(f"a config.json holds a JSON object, this one a {_json_kind(data)}")
    return data


def _json_kind(value: Any) -> str:
    names = {list: "list", str: "text", bool: "true or false", int: "number", float: "number", type(None): "null"}
    return names.get(type(value), "constant")


class Fields:
    """The fields of one config object (`where`: its path, e.g. "text_config."), read with a check each: a wrong type,
    a size out of range or a missing field raises ValueError naming the field; a default used is noted."""

    def __init__(self, data: dict, where: str, family: str, notes: list[str]):
        self.data, self.where, self.family, self.notes = data, where, family, notes

    def has(self, name: str) -> bool:
        return self.data.get(name) is not None

    def _get(self, name: str, default: Any) -> Any:
        if self.has(name):
            return self.data[name]
        if default is _MISSING:
            raise ValueError(f"{self.where}{name} is missing; a {self.family} config needs it")
        if default is not None:
            self.notes.append(f"{self.where}{name} is not given: {default!r} used, as transformers does")
        return default

    def whole(self, name: str, default: Any = _MISSING, *, low: int = 1, high: int = MAX_SIZE) -> int:
        value = self._get(name, default)
        if not (isinstance(value, int) and not isinstance(value, bool) and low <= value <= high):
            raise ValueError(f"{self.where}{name} must be a whole number from {low:,} to {high:,}, got "
                             f"{quoted(value, SHOWN)}")
        return value

    def maybe(self, name: str, *, low: int = 1, high: int = MAX_SIZE) -> int | None:
        """A size that may be absent or null (a window, a rank): None then."""
        return self.whole(name, low=low, high=high) if self.has(name) else None

    def flag(self, name: str, default: bool) -> bool:
        value = self.data[name] if self.has(name) else default
        if not isinstance(value, bool):
            raise ValueError(f"{self.where}{name} must be true or false, got {quoted(value, SHOWN)}")
        return value

    def text(self, name: str, default: Any = _MISSING) -> str:
        value = self._get(name, default)
        if not isinstance(value, str) or not 0 < len(value) <= 4096:
            raise ValueError(f"{self.where}{name} must be a text, got {quoted(value, SHOWN)}")
        return value

    def kinds(self, name: str, length: int, allowed: tuple[str, ...]) -> list[str]:
        """A list of `length` texts, each one of `allowed` (layer_types)."""
        value = self.data[name]
        if not isinstance(value, list) or len(value) != length:
            raise ValueError(f"{self.where}{name} must list one kind for each of the {length} layers, got "
                             f"{_length(value)}")
        for i, kind in enumerate(value):
            if kind not in allowed:
                raise ValueError(f"{self.where}{name}[{i}] is {quoted(kind, SHOWN)}, not a kind this reader knows; "
                                 f"a {self.family} layer is one of {', '.join(allowed)}")
        return value

    def indices(self, name: str, low: int, high: int, default: Any = _MISSING) -> list[int]:
        """A list of distinct whole numbers from low to high (layer indices)."""
        value = self._get(name, default)
        if not isinstance(value, list) or len(value) > MAX_LAYERS:
            raise ValueError(f"{self.where}{name} must be a list of layer numbers, got {quoted(value, SHOWN)}")
        for i, item in enumerate(value):
            if not (isinstance(item, int) and not isinstance(item, bool) and low <= item <= high):
                raise ValueError(f"{self.where}{name}[{i}] must be a layer number from {low} to {high}, got "
                                 f"{quoted(item, SHOWN)}")
        if len(set(value)) != len(value):
            raise ValueError(f"{self.where}{name} lists a layer twice")
        return value

    def sub(self, name: str, default: Any = _MISSING) -> "Fields":
        value = self._get(name, default)
        if not isinstance(value, dict):
            raise ValueError(f"{self.where}{name} must be a JSON object, got {quoted(value, SHOWN)}")
        return Fields(value, f"{self.where}{name}.", self.family, self.notes)

    def attention_heads(self) -> tuple[int, int, int]:
        """(query heads, key/value heads, head_dim), the first dividing by the second."""
        heads = self.whole("num_attention_heads")
        kv = self.whole("num_key_value_heads", heads)
        if heads % kv:
            raise ValueError(f"{self.where}num_key_value_heads {kv} does not divide num_attention_heads {heads}")
        if self.has("head_dim"):
            return heads, kv, self.whole("head_dim")
        hidden = self.whole("hidden_size")
        if hidden % heads:
            raise ValueError(f"{self.where}head_dim is missing and hidden_size {hidden} does not divide by "
                             f"num_attention_heads {heads}")
        return heads, kv, hidden // heads


def _length(value: Any) -> str:
    return f"{len(value)} entries" if isinstance(value, list) else quoted(value, SHOWN)


@dataclass(frozen=True)
class Mixer:
    """One layer's token mixer as the config gives it. `kind`: 'attention' (softmax over every cached token, or the
    last `window`, or its own chunk of `chunk`), 'mla', 'gated_deltanet', 'kda', 'mamba2', 'mamba' (Mamba-1) or
    'lightning'. Recurrent kinds: `heads` value heads of `head_dim`, `key_heads` of `key_dim` (a state is
    key_dim × head_dim a head); `conv` the short convolution's kernel over `conv_channels`. MLA: the ranks and widths
    of DeepSeek-V2's names; `index_heads`, `index_dim`: DeepSeek-V3.2's lightning indexer."""

    kind: str
    heads: int
    head_dim: int
    kv_heads: int | None = None
    window: int | None = None
    chunk: int | None = None
    gated: bool = False  # Qwen3-Next's attention: q_proj also makes an output gate
    sinks: bool = False  # gpt-oss: a learned logit a head in each softmax
    qk_norm: bool = False
    bias: bool = False
    key_heads: int | None = None
    key_dim: int | None = None
    groups: int | None = None
    dt_rank: int | None = None
    conv: int | None = None
    conv_channels: int | None = None
    q_rank: int | None = None
    kv_rank: int | None = None
    rope_dim: int | None = None
    nope_dim: int | None = None
    v_dim: int | None = None
    index_heads: int | None = None
    index_dim: int | None = None


@dataclass(frozen=True)
class Reading:
    """A config read once: its family (model_type), the fields (the text model's), each layer's mixers in order
    (Falcon-H1's layers have two), and what was noted on the way."""

    family: str
    fields: Fields
    layers: tuple[tuple[Mixer, ...], ...]
    pattern: str | None  # Nemotron-H's hybrid_override_pattern (it also says which layers have an MLP)
    max_context: int  # max_position_embeddings
    notes: tuple[str, ...]


# Fields any decoder config may carry, which the planner does not need; not "unknown".
_COMMON = frozenset("""model_type architectures transformers_version _name_or_path torch_dtype dtype vocab_size
hidden_size intermediate_size num_hidden_layers num_attention_heads num_key_value_heads head_dim max_position_embeddings
tie_word_embeddings rms_norm_eps layer_norm_eps layer_norm_epsilon norm_eps rope_theta rope_scaling rope_parameters
partial_rotary_factor hidden_act initializer_range use_cache attention_dropout attention_bias mlp_bias bos_token_id
eos_token_id pad_token_id quantization_config auto_map pretraining_tp output_router_logits router_aux_loss_coef
router_jitter_noise num_experts_per_tok num_local_experts num_experts moe_intermediate_size norm_topk_prob
use_qk_norm text_config vision_config audio_config generation_config return_dict output_attentions
output_hidden_states is_decoder chunk_size_feed_forward id2label label2id problem_type tokenizer_class
task_specific_params torchscript use_bfloat16 tf_legacy_loss pruned_heads cache_implementation hidden_dropout
embd_pdrop resid_pdrop""".split())
_WRAPPER = frozenset("""model_type architectures transformers_version _name_or_path torch_dtype dtype text_config
vision_config audio_config image_token_index image_token_id boi_token_index eoi_token_index boi_token_id
eoi_token_id mm_tokens_per_image initializer_range tie_word_embeddings quantization_config auto_map
projector_hidden_act vision_feature_layer vision_feature_select_strategy multimodal_projector_bias
image_seq_length pad_token_id bos_token_id eos_token_id""".split())
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


def read(config: dict) -> Reading:
    """The config's text model (a nested `text_config` where there is one), its family and each layer's mixers.
    ValueError with a sentence naming the field that cannot be used."""
    if not isinstance(config, dict):
        raise ValueError(f"a config is a JSON object, this one a {_json_kind(config)}")
    notes: list[str] = []
    outer = config.get("model_type")
    text, where = config, ""
    if "text_config" in config:
        if not isinstance(config["text_config"], dict):
            raise ValueError(f"text_config must be a JSON object, got {quoted(config['text_config'], SHOWN)}")
        text, where = config["text_config"], "text_config."
        notes += _unknown(config, _WRAPPER, "")
    family = _family(text.get("model_type", outer), where, text)
    reader, known = FAMILIES.get(family, (_llama, frozenset()))
    f = Fields(text, where, family, notes)
    n = f.whole("num_hidden_layers", high=MAX_LAYERS)
    if f.has("max_position_embeddings"):
        max_context = f.whole("max_position_embeddings", high=MAX_CONTEXT * 16)
    else:
        max_context = 131072
        notes.append(f"{where}max_position_embeddings is not given: the plan takes 131,072 tokens as its context")
    layers = tuple(m if isinstance(m, tuple) else (m,) if m is not None else () for m in reader(f, n))
    notes += _unknown(text, _COMMON | known, where)
    notes += _non_finite(config)
    pattern = f.data.get("hybrid_override_pattern") if family == "nemotron_h" else None
    return Reading(family, f, layers, pattern, max_context, tuple(notes))


def _family(model_type: Any, where: str, text: dict) -> str:
    if model_type is not None and not (isinstance(model_type, str) and _MODEL_TYPE.fullmatch(model_type)):
        raise ValueError(f"{where}model_type must be a short name of letters, digits, '_', '.' or '-', got "
                         f"{quoted(model_type, SHOWN)}")
    family = ALIASES.get(model_type, model_type)
    if family in FAMILIES:
        return family
    if all(text.get(k) is not None for k in ("num_hidden_layers", "num_attention_heads")):
        return f"generic:{model_type or 'unnamed'}"  # read as a plain decoder; noted by from_hf_config
    raise ValueError(f"{where}model_type {quoted(model_type, SHOWN)} is not one of the {len(FAMILIES) + len(ALIASES)} "
                     "this reader knows (llama, qwen3, gemma3, deepseek_v3, nemotron_h, ...) and the config has no "
                     "num_attention_heads to read it as a plain decoder")


def _unknown(data: dict, known: frozenset[str], where: str) -> list[str]:
    """One note listing the keys of `data` this reader does not know, compactly (at most 12, each cut short)."""
    unknown = sorted((k for k in data if k not in known), key=str)
    if not unknown:
        return []
    shown = ", ".join(clipped(printable(k), 30) for k in unknown[:12])
    more = f" and {len(unknown) - 12} more" if len(unknown) > 12 else ""
    return [f"fields this reader does not use, left out of the plan: {where}{shown}{more}"]


def _non_finite(config: dict) -> list[str]:
    found: list[str] = []

    def walk(value: Any, path: str, depth: int) -> None:
        if isinstance(value, NonFinite):
            found.append(path)
        elif isinstance(value, dict) and depth < 8:
            for k, v in value.items():
                walk(v, f"{path}.{printable(k)}" if path else printable(k), depth + 1)
        elif isinstance(value, list) and depth < 8:
            for i, v in enumerate(value[:4096]):
                walk(v, f"{path}[{i}]", depth + 1)

    walk(config, "", 0)
    if not found:
        return []
    return [f"NaN or Infinity in {', '.join(clipped(p, 40) for p in found[:6])}: a field the planner does not read, "
            "so it is left aside"]


def from_hf_config(config: dict, *, name: str | None = None) -> tuple[Model, list[str]]:
    """The planner's model of a Hugging Face config (a dict, e.g. from read_config) and the notes on what it could not
    show exactly. Each layer's mixers become layer kinds with counts: attention (sliding and chunked as windows),
    MLA, Gated DeltaNet (KDA too), Mamba-2 (Mamba too), lightning attention (as linear attention), and the short
    convolutions' states of recurrent layers as their own rows. ValueError naming the field otherwise."""
    reading = read(config)
    notes = list(reading.notes)
    f = reading.fields
    if reading.family.startswith("generic:"):
        notes.insert(0, f"model_type {quoted(reading.family[8:], SHOWN)} is not one this reader knows: read as a "
                        "plain decoder, every layer full attention of its num_key_value_heads")
    max_context = reading.max_context
    dtype = _cache_dtype(config, f, notes)
    rows: list[Layer] = []
    for mixers in reading.layers:
        for mixer in mixers:
            rows += _rows(mixer, max_context, notes)
    model = Model(name=_name(name, config, reading), layers=_grouped(rows), dtype=dtype, max_context=max_context,
                  source=clipped(f"Hugging Face config.json, model_type {printable(reading.family)}", MAX_SOURCE))
    if found := model.problems():
        raise ValueError("; ".join(found))
    return model, list(dict.fromkeys(notes))  # each note once


def _rows(m: Mixer, max_context: int, notes: list[str]) -> list[Layer]:
    """The planner's rows for one layer's mixer: its own kind, and any cache beside it (a convolution's last
    inputs, DSA's indexer keys) as a row of its own."""
    if m.kind == "attention":
        window = m.chunk or m.window
        if window is not None and window >= max_context:
            notes.append(f"a window of {window:,} is as long as the {max_context:,}-token context: full attention")
            window = None
        if window is None:
            return [Layer(name="full attention", mechanism="sdpa", count=1, heads=m.heads, head_dim=m.head_dim,
                          kv_heads=m.kv_heads)]
        label = f"chunked attention ({window:,}, as a window)" if m.chunk else f"sliding window ({window:,})"
        return [Layer(name=label, mechanism="sliding_window", count=1, heads=m.heads, head_dim=m.head_dim,
                      kv_heads=m.kv_heads, window=window)]
    if m.kind == "mla":
        rows = [Layer(name="multi-head latent attention", mechanism="mla", count=1, heads=m.heads,
                      head_dim=m.nope_dim, kv_rank=m.kv_rank, rope_dim=m.rope_dim, prefill_mechanism="mla_naive")]
        if m.index_dim:
            rows.append(_indexer(m, notes))
        return rows
    return [_recurrent(m, notes), *_conv_state(m, notes)]


def _recurrent(m: Mixer, notes: list[str]) -> Layer:
    if m.kind == "gated_deltanet":
        return Layer(name="Gated DeltaNet", mechanism="gated_deltanet", count=1, heads=m.heads, head_dim=m.head_dim,
                     state_dim=None if m.key_dim == m.head_dim else m.key_dim)
    if m.kind == "kda":
        notes.append("Kimi Delta Attention shown as Gated DeltaNet: its state, d_k × d_v a head, is the same size; "
                     "only its gate (a decay per channel, not per head) differs")
        return Layer(name="KDA (as Gated DeltaNet)", mechanism="gated_deltanet", count=1, heads=m.heads,
                     head_dim=m.head_dim)
    if m.kind == "lightning":
        notes.append("lightning attention shown as linear attention: a head_dim × head_dim state a head (the linear "
                     "kind also keeps a head_dim normaliser, 1/head_dim more)")
        return Layer(name="lightning attention (as linear)", mechanism="linear", count=1, heads=m.heads,
                     head_dim=m.head_dim)
    if m.kind == "mamba" and m.heads % m.key_dim == 0:
        notes.append("Mamba (1) keeps a d_state state a channel: shown as Mamba-2 heads of d_state × d_state, the "
                     "same bytes")
        return Layer(name="Mamba", mechanism="mamba2", count=1, heads=m.heads // m.key_dim, head_dim=m.key_dim)
    if m.kind == "mamba":
        return Layer(name="Mamba", mechanism="mamba2", count=1, heads=m.heads, head_dim=1, state_dim=m.key_dim)
    return Layer(name="Mamba-2", mechanism="mamba2", count=1, heads=m.heads, head_dim=m.head_dim,
                 state_dim=None if m.key_dim == m.head_dim else m.key_dim)


def _conv_state(m: Mixer, notes: list[str]) -> list[Layer]:
    """A short convolution caches its last conv − 1 inputs of conv_channels: shown as a window of conv − 1 tokens
    over one key/value head of conv_channels / 2 (keys and values: 2 · (conv − 1) · channels / 2 elements)."""
    if not m.conv or m.conv < 2:
        return []
    kept = m.conv - 1
    if kept < 2 or m.conv_channels % 2:
        notes.append(f"{_LABEL[m.kind]}: its convolution state, {kept} × {m.conv_channels:,} values a layer, is "
                     "left out (too small to show as a window)")
        return []
    notes.append(f"{_LABEL[m.kind]} convolution state: the last {kept} inputs of {m.conv_channels:,} channels a "
                 f"layer, shown as a sliding window of {kept} tokens over one head of half the channels: the same "
                 "bytes, prefill FLOPs of the convolution's order; a row of its own in the same layers, which "
                 "Model.layer_count counts again")
    return [Layer(name=f"{_LABEL[m.kind]} convolution state", mechanism="sliding_window", count=1, heads=1,
                  kv_heads=1, head_dim=m.conv_channels // 2, window=kept)]


_LABEL = {"gated_deltanet": "Gated DeltaNet", "kda": "KDA", "mamba2": "Mamba-2", "mamba": "Mamba"}


def _indexer(m: Mixer, notes: list[str]) -> Layer:
    """DSA's lightning indexer caches one key of index_dim a token a layer: shown as attention of index_heads
    queries over one key/value head of index_dim / 2 (the same bytes, and the same scoring FLOPs, 2 · heads ·
    index_dim a pair of tokens)."""
    notes.append(f"DSA lightning indexer: {m.index_dim} key values a token a layer cached beside the latent, shown "
                 f"as its own row (attention of {m.index_heads} heads over one key/value head of {m.index_dim // 2}); "
                 "DeepSeek keeps them in FP8, the plan in the model's dtype")
    return Layer(name="DSA indexer keys", mechanism="sdpa", count=1, heads=m.index_heads, kv_heads=1,
                 head_dim=max(1, m.index_dim // 2))


def _grouped(rows: list[Layer]) -> tuple[Layer, ...]:
    """Rows of one layer each merged into kinds with counts, in the order each kind first appears."""
    counts: dict[Layer, int] = {}
    for row in rows:
        counts[row] = counts.get(row, 0) + 1
    return tuple(dataclasses.replace(row, count=count) for row, count in counts.items())


def _cache_dtype(config: dict, f: Fields, notes: list[str]) -> str:
    """The dtype the cache is held in: the config's torch_dtype (or dtype), the text model's first."""
    for data in (f.data, config):
        for key in ("torch_dtype", "dtype"):
            value = data.get(key)
            if isinstance(value, str) and value.removeprefix("torch.") in DTYPE_BYTES:
                return value.removeprefix("torch.")
            if value is not None:
                notes.append(f"{key} {quoted(value, SHOWN)} is not a dtype a cache is planned in: bfloat16 used")
                return "bfloat16"
    notes.append("torch_dtype is not given: the cache is planned in bfloat16")
    return "bfloat16"


def _name(name: Any, config: dict, reading: Reading) -> str:
    if name is not None:
        if not isinstance(name, str) or not name.strip():
            raise ValueError(f"name must be a text, got {quoted(name, SHOWN)}")
        return clipped(printable(name.strip()), MAX_NAME)
    given = config.get("_name_or_path")
    if isinstance(given, str) and given.strip():
        return clipped(printable(given.strip().rstrip("/").rsplit("/", 1)[-1]), MAX_NAME)
    family = reading.family.removeprefix("generic:")
    return clipped(f"{printable(family)} ({len(reading.layers)} layers)", MAX_NAME)
