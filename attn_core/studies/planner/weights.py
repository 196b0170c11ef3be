"""A model's weights counted from its Hugging Face `config.json`: the parameters of each part (embeddings, attention of
each kind, MLPs, experts, norms, the output head), those a token uses, and their bytes in the checkpoint's dtype or
quantization. Read from the same fields the planner reads (hf_config.read), never from a class per model.

    count_weights(read_config("config.json")).total   # Meta-Llama-3-8B: 8.03e9
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from attn_core.studies.planner.hf_config import read
from attn_core.studies.planner.hf_fields import _MISSING, MAX_VOCAB, SHOWN, Fields, Mixer, Reading
from attn_core.engine.untrusted import quoted

# Bits a parameter. MXFP4 (Open Compute Project, "OCP Microscaling Formats (MX) Specification" v1.0, 2023): blocks of
# 32 FP4 (E2M1) values sharing one 8-bit (E8M0) scale, so (32 · 4 + 8) / 32 = 4.25 bits a value.
BITS = {"float64": 64, "float32": 32, "bfloat16": 16, "float16": 16, "float8": 8, "float8_e4m3fn": 8,
        "float8_e5m2": 8, "fp8": 8, "int8": 8, "int4": 4, "mxfp4": 4.25}
PARTS = ("embeddings", "attention", "mlp", "experts", "norms", "lm_head")
_VOCAB = {"gemma3_text": 262208}  # Gemma3TextConfig's default, which gemma-3 configs' text_config leave out
_ALIASES = {"bf16": "bfloat16", "fp16": "float16", "fp32": "float32", "half": "float16", "float": "float32"}


@dataclass(frozen=True)
class Weights:
    """A model's parameters: `total`; `active`, those one token's forward pass multiplies by (every weight but the
    routed experts it is not sent to and the input embedding table, of which it reads one row: OpenAI's model card
    counts gpt-oss's 3.6B active so); `bytes` and `active_bytes` in `dtype` (a quantization where the config has
    one); `parts`: parameters by part (PARTS); `notes`: what was assumed or left out."""

    total: int
    active: int
    bytes: float
    active_bytes: float
    dtype: str
    parts: dict[str, int] = field(default_factory=dict)
    notes: tuple[str, ...] = ()


@dataclass
class _Tally:
    """Parameters by part, what a token uses of them, and which are linear-layer (and expert) matrices, which a
    quantization narrows."""

    parts: dict[str, float] = field(default_factory=lambda: dict.fromkeys(PARTS, 0.0))
    active: dict[str, float] = field(default_factory=lambda: dict.fromkeys(PARTS, 0.0))
    by_kind: dict[str, list[float]] = field(default_factory=lambda: {"linear": [0.0, 0.0], "expert": [0.0, 0.0],
                                                                      "other": [0.0, 0.0]})

    def add(self, part: str, params: float, *, kind: str = "linear", used: float = 1.0) -> None:
        self.parts[part] += params
        self.active[part] += params * used
        self.by_kind[kind][0] += params
        self.by_kind[kind][1] += params * used


def count_weights(config: dict, *, dtype: str | None = None) -> Weights:
    """The weights of the model a Hugging Face config describes (a dict, e.g. from hf_config.read_config), their bytes
    in `dtype` (None: the config's torch_dtype and quantization_config; or one of BITS for every weight).
    ValueError with a sentence naming the field otherwise."""
    reading = read(config)
    f, notes = reading.fields, list(reading.notes)
    f.notes = notes  # the defaults this count takes are noted with the reading's
    hidden = f.whole("hidden_size")
    vocab = f.whole("vocab_size", _VOCAB.get(reading.family, _MISSING), high=MAX_VOCAB)
    tally = _Tally()
    tied = f.flag("tie_word_embeddings", reading.family in ("gemma2", "gemma3_text"))
    tally.add("embeddings", vocab * hidden, kind="other", used=1.0 if tied else 0.0)
    if not tied:
        tally.add("lm_head", vocab * hidden, kind="other")
    experts = _experts(f, reading)
    for i, (mixers, mlp) in enumerate(zip(reading.layers, _mlp_layers(f, reading, experts))):
        for mixer in mixers:
            tally.add("attention", _mixer(mixer, hidden, reading.family))
            tally.add("norms", 2 * mixer.head_dim if mixer.qk_norm else 0, kind="other")
        tally.add("norms", _norms_a_layer(reading.family) * hidden, kind="other")
        _mlp(tally, mlp, hidden, f, experts)
    tally.add("norms", hidden, kind="other")
    if f.has("num_nextn_predict_layers"):
        notes.append(f"the {f.whole('num_nextn_predict_layers', low=0)} multi-token prediction layer(s) "
                     "(num_nextn_predict_layers) are not counted: DeepSeek-V3's 671B leaves out its 14B MTP module")
    left = [k for k in ("vision_config", "audio_config") if config.get(k) is not None]
    if left:
        notes.append(f"the text model's weights only: the encoders of {', '.join(left)} are not counted")
    name, bits = _bits(config, f, dtype, notes)
    weights_bytes = sum(tally.by_kind[k][0] * bits[k] for k in bits) / 8
    active_bytes = sum(tally.by_kind[k][1] * bits[k] for k in bits) / 8
    return Weights(total=round(sum(tally.parts.values())), active=round(sum(tally.active.values())),
                   bytes=weights_bytes, active_bytes=active_bytes, dtype=name,
                   parts={k: round(v) for k, v in tally.parts.items()}, notes=tuple(dict.fromkeys(notes)))


def _norms_a_layer(family: str) -> int:
    """RMSNorm weights of `hidden` a layer: before the mixer and before the MLP (Gemma 2 and 3 also after each;
    Nemotron-H and Mamba blocks have one mixer and one norm)."""
    return {"gemma2": 4, "gemma3_text": 4, "nemotron_h": 1, "mamba2": 1, "mamba": 1}.get(family, 2)


def _mixer(m: Mixer, hidden: int, family: str) -> int:
    """Parameters of one layer's token mixer, its projections, gates, convolution and per-head vectors."""
    if m.kind == "attention":
        q, kv = m.heads * m.head_dim, (m.kv_heads or m.heads) * m.head_dim
        biases = (q + 2 * kv + (hidden if family != "qwen2" else 0)) if m.bias else 0  # Qwen2: q, k, v only
        return hidden * q * (2 if m.gated else 1) + 2 * hidden * kv + q * hidden + biases + (m.heads if m.sinks else 0)
    if m.kind == "mla":
        return _mla(m, hidden)
    if m.kind == "gated_deltanet":
        keys, values = m.key_heads * m.key_dim, m.heads * m.head_dim
        return (hidden * (2 * keys + 2 * values) + hidden * 2 * m.heads  # in_proj_qkvz, in_proj_ba (β and the gate)
                + m.conv_channels * m.conv + 2 * m.heads + m.head_dim + values * hidden)  # conv, A, dt, norm, out
    if m.kind == "kda":
        width = m.heads * m.head_dim
        return (3 * hidden * width + m.conv_channels * m.conv  # q, k, v and their short convolutions
                + 2 * (hidden * m.head_dim + m.head_dim * width)  # the low-rank decay and output gates
                + hidden * m.heads + m.heads + width + m.head_dim + width * hidden)  # β, A, dt bias, norm, out
    if m.kind == "lightning":
        width = m.heads * m.head_dim
        return 4 * hidden * width + width + width * hidden  # q, k, v and the output gate; norm; out
    if m.kind == "mamba2":
        inner, bc = m.heads * m.head_dim, 2 * m.groups * m.key_dim
        return (hidden * (2 * inner + bc + m.heads) + m.conv_channels * (m.conv + 1)  # in_proj (z x B C dt), conv
                + 3 * m.heads + inner + inner * hidden)  # A, D, dt bias; gated norm; out_proj
    inner, state = m.heads, m.key_dim  # Mamba (1): a channel each
    return (hidden * 2 * inner + inner * (m.conv + 1) + inner * (m.dt_rank + 2 * state)  # in_proj, conv, x_proj
            + m.dt_rank * inner + inner + inner * state + inner + inner * hidden)  # dt_proj, A, D, out_proj


def _mla(m: Mixer, hidden: int) -> int:
    """Multi-head latent attention (DeepSeek-V2, arXiv 2405.04434, section 2.1): queries through a q_rank latent
    (and its norm) where q_lora_rank is set; keys and values from a kv_rank latent plus a shared rotary key; the
    V3.2 indexer's query, key, key norm and head weights."""
    q_width = m.heads * (m.nope_dim + m.rope_dim)
    query = hidden * m.q_rank + m.q_rank + m.q_rank * q_width if m.q_rank else hidden * q_width
    latent = hidden * (m.kv_rank + m.rope_dim) + m.kv_rank + m.kv_rank * m.heads * (m.nope_dim + m.v_dim)
    total = query + latent + m.heads * m.v_dim * hidden
    if m.index_dim:
        total += ((m.q_rank or hidden) * m.index_heads * m.index_dim + hidden * m.index_dim + 2 * m.index_dim
                  + hidden * m.index_heads)
    return total


@dataclass(frozen=True)
class _Experts:
    count: int  # routed experts a MoE layer (0: none)
    per_token: int
    size: int  # intermediate width of one routed expert
    shared: int  # intermediate width of the shared experts together
    gated: bool  # SwiGLU-like, 3 matrices (Nemotron-H's squared ReLU: 2)
    biases: bool  # gpt-oss: the experts' and the router's biases
    dense: int  # intermediate width of a dense layer's MLP


_COUNT = ("n_routed_experts", "num_local_experts", "num_experts")  # DeepSeek; Mixtral, gpt-oss; Qwen, Kimi
_PER_TOKEN = ("num_experts_per_tok", "experts_per_token", "num_experts_per_token")


def _first(f: Fields, names: tuple[str, ...], **limits: int) -> int | None:
    name = next((k for k in names if f.has(k)), None)
    return None if name is None else f.whole(name, **limits)


def _experts(f: Fields, reading: Reading) -> _Experts:
    count = _first(f, _COUNT, low=0, high=1 << 16) or 0
    per_token = _first(f, _PER_TOKEN, high=max(count, 1))
    if count and per_token is None:
        raise ValueError(f"{f.where}num_experts_per_tok is missing; a mixture of experts needs it")
    size = f.whole("moe_intermediate_size" if f.has("moe_intermediate_size") else "intermediate_size") if count else 0
    act = f.data.get("mlp_hidden_act", f.data.get("hidden_act"))
    return _Experts(count, per_token or 0, size, _shared(f, reading, size), act != "relu2",
                    reading.family == "gpt_oss", _dense_width(f, reading))


def _dense_width(f: Fields, reading: Reading) -> int:
    """A dense MLP's width: Llama 4's intermediate_size_mlp (its intermediate_size is an expert's), Granite's
    shared_intermediate_size, or intermediate_size; Mamba models have no MLP."""
    if reading.family in ("mamba2", "mamba"):
        return 0
    if f.has("intermediate_size_mlp"):
        return f.whole("intermediate_size_mlp")
    return f.whole("shared_intermediate_size" if reading.family == "granitemoehybrid" else "intermediate_size")


def _shared(f: Fields, reading: Reading, size: int) -> int:
    """The shared experts' width: DeepSeek's n_shared_experts of moe_intermediate_size, Qwen's one of
    shared_expert_intermediate_size, Llama 4's one expert, Granite's shared_mlp, Nemotron-H's."""
    for key in ("n_shared_experts", "num_shared_experts"):
        if f.has(key):
            return f.whole(key, low=0) * size
    for key in ("shared_expert_intermediate_size", "moe_shared_expert_intermediate_size"):
        if f.has(key):
            return f.whole(key, low=0)
    if reading.family == "granitemoehybrid" and f.has("shared_intermediate_size"):
        return f.whole("shared_intermediate_size", low=0)
    return size if reading.family == "llama4_text" else 0


def _mlp_layers(f: Fields, reading: Reading, e: _Experts) -> list[str | None]:
    """Each layer's MLP: 'moe', 'dense' or None (a Mamba block, a Nemotron-H mixer layer)."""
    n = len(reading.layers)
    if reading.family in ("mamba2", "mamba"):
        return [None] * n
    if reading.pattern is not None:
        return [{"-": "dense", "E": "moe"}.get(c) for c in reading.pattern]
    if not e.count:
        return ["dense"] * n
    return ["moe" if _is_moe(f, reading.family, i, n) else "dense" for i in range(n)]


def _is_moe(f: Fields, family: str, i: int, n: int) -> bool:
    if family in ("deepseek_v3", "deepseek_v32", "kimi_linear"):
        return i >= f.whole("first_k_dense_replace", 0, low=0, high=n) and i % f.whole("moe_layer_freq", 1) == 0
    if family in ("qwen2", "qwen3", "qwen3_next"):
        dense = f.indices("mlp_only_layers", 0, n - 1, []) if f.has("mlp_only_layers") else []
        return i not in dense and (i + 1) % f.whole("decoder_sparse_step", 1) == 0
    if family == "llama4_text":
        if f.has("moe_layers"):
            return i in f.indices("moe_layers", 0, n - 1)
        step = f.whole("interleave_moe_layer_step", 1)
        return i % step == step - 1
    if family == "jamba":
        return i % f.whole("expert_layer_period", 2) == f.whole("expert_layer_offset", 1, low=0)
    return True


def _mlp(tally: _Tally, kind: str | None, hidden: int, f: Fields, e: _Experts) -> None:
    matrices = 3 if e.gated else 2
    if kind == "dense":
        tally.add("mlp", matrices * hidden * e.dense)
    elif kind == "moe":
        one = matrices * hidden * e.size
        used = e.per_token / e.count
        tally.add("experts", e.count * one, kind="expert", used=used)
        if e.biases:  # gpt-oss: gate_up and down biases of each expert
            tally.add("experts", e.count * ((matrices - 1) * e.size + hidden), kind="other", used=used)
        tally.add("experts", matrices * hidden * e.shared)  # shared experts: every token
        if f.has("shared_expert_intermediate_size"):
            tally.add("experts", hidden, kind="other")  # Qwen's sigmoid gate on the shared expert
        router_bias = e.count if e.biases or f.data.get("topk_method") == "noaux_tc" else 0
        tally.add("experts", e.count * hidden + router_bias, kind="other")


def _bits(config: dict, f: Fields, dtype: str | None, notes: list[str]) -> tuple[str, dict[str, float]]:
    """The dtype's name and bits a parameter of each kind (linear matrices, expert matrices, the rest)."""
    if dtype is not None:
        name = _dtype_name(dtype)
        if name is None:
            raise ValueError(f"dtype {quoted(dtype, SHOWN)} is not one weights are counted in; choose one of "
                             f"{', '.join(BITS)}")
        return name, dict.fromkeys(("linear", "expert", "other"), BITS[name])
    base = _config_dtype(config, f, notes)
    bits = dict.fromkeys(("linear", "expert", "other"), BITS[base])
    quant = f.data.get("quantization_config", config.get("quantization_config"))
    if quant is None:
        return base, bits
    if not isinstance(quant, dict):
        raise ValueError(f"quantization_config must be a JSON object, got {quoted(quant, SHOWN)}")
    method = quant.get("quant_method")
    if method == "mxfp4":
        notes.append("MXFP4 experts: 4.25 bits a weight (4-bit values and one 8-bit scale a block of 32, the OCP "
                     "Microscaling spec); attention, router, embeddings and biases stay in " + base)
        return f"{base} + mxfp4 experts", {**bits, "expert": BITS["mxfp4"]}
    if method == "fp8":
        block = quant.get("weight_block_size")
        scale = 32 / (block[0] * block[1]) if _block(block) else 0.0  # a float32 scale a block
        notes.append(f"FP8 linear layers: 8 bits a weight{' and a float32 scale a block' if scale else ''}; "
                     f"embeddings, norms, routers stay in {base}")
        return f"{base} + fp8 linear layers", {**bits, "linear": 8 + scale, "expert": 8 + scale}
    width = _quant_bits(quant)
    if width is not None:
        notes.append(f"{quoted(method, 20)} quantization: {width} bits a linear weight, its scales not counted")
        return f"{base} + {width}-bit linear layers", {**bits, "linear": width, "expert": width}
    notes.append(f"quantization_config {quoted(method, 20)} is not one this reader knows: weights counted in {base}")
    return base, bits


def _block(block: Any) -> bool:
    return (isinstance(block, list) and len(block) == 2 and all(isinstance(b, int) and not isinstance(b, bool)
                                                                 and 1 <= b <= 1 << 16 for b in block))


def _quant_bits(quant: dict) -> int | None:
    if quant.get("load_in_4bit") is True:
        return 4
    if quant.get("load_in_8bit") is True:
        return 8
    width = quant.get("bits")
    return width if isinstance(width, int) and not isinstance(width, bool) and 1 <= width <= 16 else None


def _dtype_name(value: Any) -> str | None:
    if not isinstance(value, str):
        return None
    name = value.strip().lower().removeprefix("torch.")
    name = _ALIASES.get(name, name)
    return name if name in BITS else None


def _config_dtype(config: dict, f: Fields, notes: list[str]) -> str:
    for data in (f.data, config):
        for key in ("torch_dtype", "dtype"):
            if data.get(key) is not None:
                name = _dtype_name(data[key])
                if name is None:
                    raise ValueError(f"{key} {quoted(data[key], SHOWN)} is not a dtype weights are held in; choose "
                                     f"one of {', '.join(BITS)}")
                return name
    notes.append("torch_dtype is not given: weights counted in bfloat16")
    return "bfloat16"
