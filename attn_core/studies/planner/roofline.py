"""One roofline for decoding and prefill, for every page that states a speed: a step takes the longer of its bytes
over the memory bandwidth and its FLOPs over the peak FLOP/s (Williams, Waterman and Patterson 2009, 'Roofline: an
insightful visual performance model', CACM 52(4)). A prediction from data sheets, not a measurement.

    roofline(MODELS["llama-3-8b"], find_device("H100 SXM"), 8192).decode_tokens_per_s   # ≈ 208.3, memory-bound
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any, Sequence

import pandas as pd

from attn_core.engine.untrusted import quoted
from attn_core.mechanisms import MEASURED
from attn_core.studies.planner.builtin import WEIGHTS
from attn_core.studies.planner.devices import Device, find_device
from attn_core.studies.planner.engines import cache_by_engine
from attn_core.spec import DTYPE_BYTES
from attn_core.studies.planner.model import DTYPE_ALIASES, MAX_CONTEXT, Model, plan
from attn_core.studies.planner.weights import BITS, Weights

METHOD = ("a roofline prediction from the vendor's data sheet: max(bytes ÷ bandwidth, FLOPs ÷ FLOP/s); not measured. "
          "A decode step reads the active weights once for the batch and each sequence's cache; its FLOPs are "
          "2 a weight a token plus the attention step's. Prefill reads every weight once and writes the cache; its "
          "FLOPs are 2 a weight a token plus the prompt's attention")
MEMORY, COMPUTE = "memory-bound: bytes", "compute-bound: FLOPs"


@dataclass(frozen=True, kw_only=True)
class WeightsRead:
    """A model's parameters (`total`, and `active`: those one token multiplies by) and their bytes, with where the
    figures come from; `routed`: a mixture of experts, whose batch may reach more than one token's active experts (a
    dense model's active count falls short of its total only by its untied input embedding table)."""

    total: float
    active: float
    total_bytes: float
    active_bytes: float
    source: str
    routed: bool = False


def _published(total: float, active: float, dtype: str, source: str, *, routed: bool = False) -> WeightsRead:
    width = BITS[dtype] / 8
    return WeightsRead(total=total, active=active, total_bytes=total * width, active_bytes=active * width,
                       source=f"{source}; {dtype} weights", routed=routed)


# Published parameter counts of the built-in models (their planner models carry no config.json). What a token reads
# is counted as count_weights counts it from a config.json, so that a built-in model and its own config.json give one
# figure: an untied input embedding table, of which a token reads one row, is not read (525M of Llama 3 8B's 8.03B); a
# tied one is, as the output head every token multiplies by (Gemma 3).
EMBED_LLAMA3_8B = 128_256 * 4096  # vocabulary × width, from its config.json
EMBED_LLAMA3_70B = 128_256 * 8192
EMBED_MISTRAL_7B = 32_000 * 4096
PUBLISHED: dict[str, WeightsRead] = {
    "llama-3-8b": _published(8.03e9, 8.03e9 - EMBED_LLAMA3_8B, "bfloat16",
                             "Meta Llama 3 8B model card: 8.03B; count_weights of its config.json: 8,030,261,248"),
    "llama-3-70b": _published(70.6e9, 70.6e9 - EMBED_LLAMA3_70B, "bfloat16",
                              "Meta Llama 3 70B on Hugging Face: 70.6B; its config.json (80 layers, width 8192, MLP "
                              "28,672, vocabulary 128,256, untied) counts 70,553,706,496"),
    "mistral-7b": _published(7.24e9, 7.24e9 - EMBED_MISTRAL_7B, "bfloat16",
                             "Mistral 7B v0.1 on Hugging Face: 7.24B; count_weights of its config.json: 7,241,732,096"),
    "gemma-3-27b": _published(27.0e9, 27.0e9, "bfloat16",
                              "Gemma 3 Technical Report (arXiv 2503.19786), table 1: 1,416M embedding and 25,600M "
                              "non-embedding parameters for 27B (the 417M vision encoder left out); count_weights of "
                              "google/gemma-3-27b-pt's config.json: 27,009,346,304"),
    "deepseek-v3": _published(671e9, 37e9, "float8",
                              "DeepSeek-V3 Technical Report (arXiv 2412.19437): 671B total, 37B activated a token "
                              "(the 14B multi-token-prediction module left out); released in FP8, whose block scales "
                              "and bf16 embeddings and norms add 0.3% (count_weights: 673.2e9 bytes)", routed=True),
    "qwen3-next-80b-a3b": _published(80e9, 3e9, "bfloat16",
                                     "Qwen3-Next-80B-A3B model card: 80B in total, 3B activated; count_weights of its "
                                     "config.json gives 79.7e9 and 3.56e9 (with the output head)", routed=True),
    "mamba-2-hybrid-8b": _published(8.66e9, 8.66e9, "bfloat16",
                                    "Waleffe et al. 2024 (arXiv 2406.07887), as recalled: 8.66B for the 8B "
                                    "Mamba-2-Hybrid; not verified here"),
    # The models read from a config.json (builtin.CONFIGS): their published totals, against which the weights counted
    # from the config (builtin.WEIGHTS, what the roofline reads) are checked in tests/studies/test_planner_builtin.py
    "gpt-oss-20b": _published(20.91e9, 3.61e9, "bfloat16", "OpenAI, gpt-oss model card (arXiv 2508.10925), table 1: "
                              "20.91B total, 3.61B active (the input embeddings not counted as active)", routed=True),
    "gpt-oss-120b": _published(116.83e9, 5.13e9, "bfloat16", "OpenAI, gpt-oss model card (arXiv 2508.10925), table "
                               "1: 116.83B total, 5.13B active", routed=True),
    "llama-4-scout-17b-16e": _published(109e9, 17e9, "bfloat16", "Meta, Llama 4 model card: 109B total (the vision "
                                        "encoder included), 17B active", routed=True),
    "deepseek-v3.2": _published(671e9, 37e9, "float8", "DeepSeek-V3.2-Exp keeps V3's sizes: 671B total, 37B "
                                "activated (arXiv 2412.19437), the 14B multi-token-prediction module left out",
                                routed=True),
    "kimi-linear-48b-a3b": _published(48e9, 3e9, "bfloat16", "Moonshot AI, 'Kimi Linear' (arXiv 2510.26692) and "
                                      "its model card: 48B total, 3B active", routed=True),
    "minimax-m1": _published(456e9, 45.9e9, "bfloat16", "MiniMax, 'MiniMax-M1' (arXiv 2506.13585): 456B total, "
                             "45.9B activated a token", routed=True),
    "granite-4.0-h-tiny": _published(7e9, 1e9, "bfloat16", "IBM, Granite 4.0 model card: 7B total, 1B active "
                                     "(rounded figures)", routed=True),
    "nemotron-h-8b": _published(8e9, 8e9, "bfloat16", "NVIDIA, 'Nemotron-H' (arXiv 2504.03624): 8B, dense"),
    "mha-8b": _published(8.03e9 + 805_306_368, 8.03e9 + 805_306_368 - EMBED_LLAMA3_8B, "bfloat16",
                         "Llama 3 8B's 8.03B plus the key and value projections of one head per query head: 32 layers "
                         "· 2 · 4096 · (4096 − 1024) = 805,306,368 more"),
}


def weights_read(model: Model, weights: Weights | WeightsRead | tuple[float, float] | None = None) -> WeightsRead:
    """What `model` reads of its weights: a `Weights` (count_weights of its config.json), a WeightsRead, a tuple
    (total bytes, active bytes) whose parameters are counted at the model's dtype width (active < total taken as a
    mixture of experts), or None: for a built-in model, its weights counted from its config (builtin.WEIGHTS:
    gpt-oss's MXFP4 experts, DeepSeek's FP8), else PUBLISHED. ValueError naming `weights` otherwise."""
    if weights is None and model.name.lower() in WEIGHTS:
        counted = weights_read(model, WEIGHTS[model.name.lower()])
        published = PUBLISHED[model.name.lower()]
        return dataclasses.replace(counted, source=f"{counted.source} (published: {published.source})")
    if isinstance(weights, WeightsRead):
        return weights
    if isinstance(weights, Weights):
        return WeightsRead(total=weights.total, active=weights.active, total_bytes=weights.bytes,
                           active_bytes=weights.active_bytes, source=f"counted from a config.json, {weights.dtype}",
                           routed=weights.parts.get("experts", 0) > 0)
    if weights is None:
        key = model.name.lower()
        if key not in PUBLISHED:
            raise ValueError(f"weights of {quoted(model.name, 40)} are not known; give count_weights of its "
                             "config.json, or (total bytes, active bytes)")
        return PUBLISHED[key]
    if (isinstance(weights, tuple) and len(weights) == 2 and all(_positive(w) for w in weights)
            and weights[1] <= weights[0]):
        width = DTYPE_BYTES.get(DTYPE_ALIASES.get(str(model.dtype).lower(), str(model.dtype).lower()), 2)
        return WeightsRead(total=weights[0] / width, active=weights[1] / width, total_bytes=float(weights[0]),
                           active_bytes=float(weights[1]), source="given as bytes", routed=weights[1] < weights[0])
    raise ValueError(f"weights must be a Weights, or (total bytes, active bytes) with 0 < active ≤ total, got "
                     f"{quoted(weights, 60)}")


@dataclass(frozen=True, kw_only=True)
class Roofline:
    """`model` on `device` at `context` tokens for `batch` sequences: a decode step's bytes, FLOPs, time and the
    bound that sets it; prefill of `context` tokens likewise. Bytes in B, times in s."""

    model: str
    device: str
    context: int
    batch: int
    cache_dtype: str
    bandwidth_bytes_per_s: float
    flops_per_s: float
    weights_bytes: float
    active_weights_bytes: float
    cache_bytes: float
    decode_bytes: float
    decode_flops: float
    decode_seconds: float
    decode_bound: str
    prefill_bytes: float
    prefill_flops: float
    prefill_seconds: float
    prefill_bound: str
    device_source: str
    weights_source: str
    notes: tuple[str, ...] = ()

    @property
    def decode_tokens_per_s(self) -> float:
        """Tokens a second across the batch: B ÷ the step's time."""
        return self.batch / self.decode_seconds

    def as_dict(self) -> dict[str, Any]:
        return {"model": self.model, "device": self.device, "context": self.context, "batch": self.batch,
                "cache_dtype": self.cache_dtype, "bandwidth_bytes_per_s": self.bandwidth_bytes_per_s,
                "flops_per_s": self.flops_per_s, "weights_bytes": self.weights_bytes,
                "active_weights_bytes": self.active_weights_bytes, "cache_bytes": self.cache_bytes,
                "decode_bytes": self.decode_bytes, "decode_flops": self.decode_flops,
                "decode_seconds": self.decode_seconds, "decode_tokens_per_s": self.decode_tokens_per_s,
                "decode_bound": self.decode_bound, "prefill_bytes": self.prefill_bytes,
                "prefill_flops": self.prefill_flops, "prefill_seconds": self.prefill_seconds,
                "prefill_bound": self.prefill_bound, "device_source": self.device_source,
                "weights_source": self.weights_source, "method": METHOD, "notes": list(self.notes)}


def roofline(model: Model, device: Device | str, context: int, *, batch: int = 1,
             weights: Weights | WeightsRead | tuple[float, float] | None = None,
             cache_dtype: str = "bfloat16") -> Roofline:
    """The roofline of `model` on `device` (a Device or a name for find_device) at `context` tokens for `batch`
    sequences, the cache in `cache_dtype` (engines.CACHE_DTYPES). Decode step: bytes = active weights + B · a
    sequence's cache (engines.cache_by_engine, token by token); FLOPs = 2 · active parameters · B + B · the attention
    step at the context (`decode_attention_flops`); time = max(bytes ÷ bandwidth, FLOPs ÷ FLOP/s); B ÷ time tokens a
    second. Prefill of the context: bytes = all weights + the cache written; FLOPs = 2 · active parameters · n · B +
    B · plan's prefill attention FLOPs. ValueError with a sentence naming the field otherwise."""
    if not _whole(batch, 1 << 16):
        raise ValueError(f"batch must be a whole number of sequences from 1 to {1 << 16:,}, got {quoted(batch)}")
    chip, read = find_device(device), weights_read(model, weights)
    one = cache_by_engine(model, context, dtype=cache_dtype, engine="formula")  # one sequence, names bad input
    decode_bytes = read.active_bytes + batch * one.bytes
    decode_flops = 2 * read.active * batch + batch * decode_attention_flops(model, context)
    prefill_bytes = read.total_bytes + batch * one.bytes
    prefill_flops = 2 * read.active * context * batch + batch * plan(model, context).prefill_flops
    notes = list(one.notes)
    if context > model.max_context:
        notes.append(f"{context:,} tokens is past the {model.max_context:,} {model.name} was trained for")
    if read.routed and batch > 1:
        notes.append(f"a mixture of experts: {batch} tokens a step route to up to {batch} times the active experts, so "
                     "the step reads between the active weights (counted here) and all of them")
    decode_seconds, decode_bound = _time(decode_bytes, decode_flops, chip)
    prefill_seconds, prefill_bound = _time(prefill_bytes, prefill_flops, chip)
    return Roofline(model=model.name, device=chip.name, context=context, batch=batch, cache_dtype=one.dtype,
                    bandwidth_bytes_per_s=chip.bandwidth_bytes_per_s, flops_per_s=chip.flops_per_s,
                    weights_bytes=read.total_bytes, active_weights_bytes=read.active_bytes,
                    cache_bytes=batch * one.bytes, decode_bytes=decode_bytes, decode_flops=decode_flops,
                    decode_seconds=decode_seconds, decode_bound=decode_bound, prefill_bytes=prefill_bytes,
                    prefill_flops=prefill_flops, prefill_seconds=prefill_seconds, prefill_bound=prefill_bound,
                    device_source=chip.source, weights_source=read.source, notes=tuple(notes))


def decode_attention_flops(model: Model, context: int) -> float:
    """FLOPs of one sequence's attention for one new token at `context`, summed over the layers: each spec's
    Generation.flops (its step_flops, or 2 per cached number for each query head reading it: 4·L·d·H over L tokens,
    q·k and p·v once per query head whatever the key/value heads); a recurrent state's scaled by state_width /
    head_dim, as plan scales its bytes."""
    total, made = 0.0, plan(model, context)
    for kind in made.kinds:
        layer = kind.layer
        spec = MEASURED[layer.mechanism]
        shape = layer.shape(1, context, 1, made.dtype)
        flops = spec.supports.generation.flops(shape, **spec.resolved(layer.params))
        if kind.kind == "state":
            flops *= layer.state_width / layer.head_dim
        total += flops * layer.count
    return total


def crossover_context(model: Model, weights: Weights | WeightsRead | tuple[float, float] | None = None, *,
                      batch: int = 1, cache_dtype: str = "bfloat16") -> int | None:
    """The shortest context at which `batch` sequences' caches, read whole each step, weigh at least the active
    weights (B · cache(n) ≥ active weights): past it the cache, not the weights, sets a decode step's time. None when
    the caches stay lighter to MAX_CONTEXT (a window or a recurrent state stops their growth). Bisected: the cache
    grows with n or stays flat. Independent of the device: both sides are bytes over the same bandwidth."""
    if not _whole(batch, 1 << 16):
        raise ValueError(f"batch must be a whole number of sequences from 1 to {1 << 16:,}, got {quoted(batch)}")
    target = weights_read(model, weights).active_bytes

    def heavier(n: int) -> bool:
        return batch * cache_by_engine(model, n, dtype=cache_dtype, engine="formula").bytes >= target

    if not heavier(MAX_CONTEXT):
        return None
    low, high = 0, MAX_CONTEXT  # heavier(high) holds; heavier(low) does not (or low = 0)
    while high - low > 1:
        mid = (low + high) // 2
        low, high = (low, mid) if heavier(mid) else (mid, high)
    return high


def curve(models: Sequence[Model], device: Device | str, contexts: Sequence[int], *, batch: int = 1,
          weights: dict[str, Weights | WeightsRead | tuple[float, float]] | None = None,
          cache_dtype: str = "bfloat16") -> pd.DataFrame:
    """Each model's roofline at each context, for a chart: DataFrame[model, context, decode_tokens_per_s,
    prefill_seconds, bound (the decode step's), crossover (crossover_context, the same on every row of a model;
    <NA> past MAX_CONTEXT)]. `weights`: by model name, for models PUBLISHED lacks."""
    chip, given = find_device(device), weights or {}
    rows = []
    for model in models:
        read = weights_read(model, given.get(model.name))
        cross = crossover_context(model, read, batch=batch, cache_dtype=cache_dtype)
        for n in contexts:
            made = roofline(model, chip, n, batch=batch, weights=read, cache_dtype=cache_dtype)
            rows.append({"model": model.name, "context": n, "decode_tokens_per_s": made.decode_tokens_per_s,
                         "prefill_seconds": made.prefill_seconds, "bound": made.decode_bound, "crossover": cross})
    frame = pd.DataFrame(rows, columns=["model", "context", "decode_tokens_per_s", "prefill_seconds", "bound",
                                        "crossover"])
    return frame.astype({"crossover": "Int64"})  # <NA> where the caches never pass the weights


def _time(nbytes: float, flops: float, chip: Device) -> tuple[float, str]:
    memory, compute = nbytes / chip.bandwidth_bytes_per_s, flops / chip.flops_per_s
    return (memory, MEMORY) if memory >= compute else (compute, COMPUTE)


def _whole(value: Any, high: int) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and 1 <= value <= high


def _positive(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and 0 < value < float("inf")
