"""A model's attention read from its Hugging Face `config.json`, for the planner: the fields its configuration class
uses (`num_key_value_heads`, `layer_types`, `sliding_window`, `kv_lora_rank`, `hybrid_override_pattern`, ...) become
layer kinds with counts, and what cannot be shown as one of the planner's kinds is said in a note (principle 15).

    model, notes = from_hf_config(read_config("config.json"))
    plan(model, 131072).kv_cache_bytes

The layer patterns follow what each transformers configuration class derives from its fields (Qwen2Config,
Gemma3TextConfig, GptOssConfig, Llama4TextConfig, Qwen3NextConfig, JambaConfig, ...); the file is data, never code.
Here: reading the file, the family, and the planner's rows; the per-family readers are in hf_families, the checked
fields and the mixers they make in hf_fields.
"""
from __future__ import annotations

import dataclasses
import json
import os
import re
import stat
from dataclasses import dataclass
from typing import Any

from attn_core.studies.planner.model import MAX_CONTEXT, MAX_NAME, MAX_SOURCE, Layer, Model
from attn_core.studies.planner.hf_fields import MAX_LAYERS, SHOWN, Fields, Mixer, Reading
from attn_core.studies.planner.hf_families import ALIASES, FAMILIES
from attn_core.spec import DTYPE_BYTES
from attn_core.engine.untrusted import clipped, printable, quoted

MAX_CONFIG_BYTES = 4 << 20  # 4 MiB: DeepSeek-V3's config.json is 1.7 KB, a multimodal one a few KB
_MODEL_TYPE = re.compile(r"[A-Za-z0-9_.\-]{1,64}")


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
    reader, known = FAMILIES.get(family, FAMILIES["llama"])  # a generic model: a plain decoder
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


def layer_kinds(config: dict) -> list[str]:
    """Each layer's kind, first layer first, named as from_hf_config names its rows ("full attention", "sliding
    window (1,024)", "Mamba-2", ...): Gemma 3's 62 layers are 5 "sliding window (1,024)" then 1 "full attention", ten
    times, then 2 sliding. A layer of several mixers (Falcon-H1's attention beside Mamba-2) joins their kinds with
    " + "; one without a mixer (Nemotron-H's MLP layers) is ""; the caches beside a kind (a convolution's state,
    DSA's indexer keys) are not layers. O(layers). ValueError naming the field, as `read` gives it."""
    reading = read(config)
    return [" + ".join(_rows(m, reading.max_context, [])[0].name for m in mixers) for mixers in reading.layers]


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
        notes.append("Kimi Delta Attention (kda): a d_k × d_v state a head, the gated delta rule with a decay a key "
                     "channel")
        return Layer(name="KDA", mechanism="kda", count=1, heads=m.heads, head_dim=m.head_dim)
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
