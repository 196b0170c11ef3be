"""The cache as engines hold it: in a narrower dtype with its scales, in pages of P tokens, sliding-window layers held
at their window or at full size, and recurrent states kept every N tokens for prefix caching. Pure functions over the
planner's Model and plan(); each engine's rule carries the public text it is read from.

    cache_by_engine(MODELS["gemma-3-27b"], 131072, engine="vllm-uniform").bytes   # 62 GiB, every layer at full size
"""
from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass
from typing import Any

from attn_core.engine.untrusted import quoted
from attn_core.spec import DTYPE_BYTES
from attn_core.studies.planner.model import MAX_CONTEXT, LayerPlan, Model, plan


@dataclass(frozen=True)
class CacheDtype:
    """How a cache value is stored: `values` numbers in a block of `block_bytes` (their codes and their scales)."""

    name: str
    values: int
    block_bytes: float
    description: str

    @property
    def bytes_per_value(self) -> float:
        return self.block_bytes / self.values


CACHE_DTYPES: dict[str, CacheDtype] = {c.name: c for c in (
    CacheDtype("float32", 1, 4, "float32: 4 bytes a value"),
    CacheDtype("bfloat16", 1, 2, "bfloat16: 2 bytes a value, no scale"),
    CacheDtype("float16", 1, 2, "float16: 2 bytes a value, no scale"),
    CacheDtype("fp8", 1, 1, "fp8 e4m3: 1 byte a value; vLLM's fp8 cache keeps one float32 scale per layer for the "
                            "keys and one for the values (per tensor, vLLM docs 'Quantized KV Cache'), 8 bytes a layer "
                            "left out here"),
    CacheDtype("q8_0", 32, 34, "llama.cpp q8_0: blocks of 32 int8 values and one fp16 scale, 34 bytes a 32 "
                               "(ggml's block_q8_0), 1.0625 bytes a value"),
    CacheDtype("q4_0", 32, 18, "llama.cpp q4_0: blocks of 32 4-bit values in 16 bytes and one fp16 scale, 18 bytes a "
                               "32 (ggml's block_q4_0), 0.5625 bytes a value"),
    CacheDtype("kivi-4bit", 32, 20, "KIVI-style int4 (Liu et al. 2024, arXiv 2402.02750): groups of 32 (keys per "
                                    "channel, values per token), 16 bytes of codes plus an fp16 scale and an fp16 zero "
                                    "point, 0.625 bytes a value; the group size is this planner's, and the recent "
                                    "tokens KIVI keeps in full precision are left out"),
    CacheDtype("kivi-2bit", 32, 12, "KIVI-style int2 (arXiv 2402.02750): groups of 32, 8 bytes of codes plus an fp16 "
                                    "scale and zero point, 0.375 bytes a value; the full-precision recent tokens left "
                                    "out"),
    CacheDtype("mla-fp8", 576, 656, "DeepSeek's FlashMLA fp8 latent (multi-head latent attention layers only): a "
                                    "token's 512 latent values in fp8 e4m3 with a float32 scale a 128 (16 bytes) and "
                                    "its 64 rotary values in bf16 (128 bytes), 656 bytes for 576 values"),
)}
DTYPE_ALIASES = {"bf16": "bfloat16", "fp16": "float16", "fp32": "float32", "fp8_e4m3": "fp8", "int4": "kivi-4bit",
                 "int2": "kivi-2bit"}


def cache_dtype(name: str) -> CacheDtype:
    """A cache dtype by name or alias (bf16, fp16, fp8, q8_0, q4_0, kivi-4bit, ...); ValueError listing them."""
    key = DTYPE_ALIASES.get(name.strip().lower(), name.strip().lower()) if isinstance(name, str) else None
    if key not in CACHE_DTYPES:
        raise ValueError(f"cache dtype {quoted(str(name), 20)} is unknown; choose one of "
                         f"{', '.join([*CACHE_DTYPES, *DTYPE_ALIASES])}")
    return CACHE_DTYPES[key]


def bytes_per_value(name: str) -> float:
    """Effective bytes a cached value takes in `name`, its block's scales spread over the block (q4_0: 18 / 32)."""
    return cache_dtype(name).bytes_per_value


def describe_dtype(name: str) -> str:
    """A sentence on how `name` stores a value, with its source."""
    return cache_dtype(name).description


@dataclass(frozen=True)
class Engine:
    """How an engine allocates a layer's cache: `pages` (its default page in tokens; 1: token by token), whether
    sliding-window layers are held at full size (`full_windows`), and the public text the rule is read from."""

    name: str
    label: str
    source: str
    pages: int
    full_windows: bool


ENGINES: dict[str, Engine] = {e.name: e for e in (
    Engine("formula", "each layer's own cache, token by token (the planner's formula)",
           "attn_core.studies.planner.model.plan: each mechanism spec's cache_bytes", 1, False),
    Engine("vllm", "vLLM's hybrid allocator: pages of P tokens, a sliding layer keeping the pages its window covers",
           "vLLM RFC #11382 'Hybrid Memory Allocator' (2024) proposes per-layer-kind allocation; vLLM PR #30166 "
           "(2025) describes its hybrid KV cache manager freeing a sliding layer's pages outside the window",
           16, False),
    Engine("vllm-uniform", "vLLM with one page size for every layer: sliding layers held at full size",
           "as described in vLLM RFC #11382 (2024): 'vLLM can only allocate the same KV cache size for all tokens', "
           "wasting 25% in Gemma-2 and 56.25% in Ministral; still what vLLM does with its hybrid manager disabled",
           16, True),
    Engine("llama.cpp", "llama.cpp: a sliding layer holds its window (token by token)",
           "llama.cpp issue #12637 (2025) asked for Gemma 2 and 3's sliding layers to hold only their window; PR "
           "#13194 'kv-cache : add SWA support' added it (--swa-full keeps full-size caches)", 1, False),
    Engine("llama.cpp-swa-full", "llama.cpp with --swa-full: every layer at full size",
           "llama.cpp PR #13194: --swa-full keeps the sliding layers' caches at full size", 1, True),
)}


@dataclass(frozen=True)
class KindHeld:
    """One layer kind as an engine holds it: `tokens` a layer holds for one sequence (states: the states kept), and
    `bytes` for all `count` layers and the batch."""

    name: str
    kind: str
    count: int
    tokens: int
    bytes: float


@dataclass(frozen=True)
class EngineCache:
    """A model's cache at `context` tokens for `batch` sequences as `engine` holds it, in `dtype`, in pages of
    `page_tokens`, with states kept every `state_every` tokens (None: one, the current)."""

    model: str
    context: int
    batch: int
    engine: str
    label: str
    source: str
    dtype: str
    page_tokens: int
    state_every: int | None
    kinds: tuple[KindHeld, ...]
    notes: tuple[str, ...]

    @property
    def bytes(self) -> float:
        return sum(k.bytes for k in self.kinds)

    @property
    def kv_bytes(self) -> float:
        return sum(k.bytes for k in self.kinds if k.kind == "kv")

    @property
    def state_bytes(self) -> float:
        return sum(k.bytes for k in self.kinds if k.kind == "state")

    def as_dict(self) -> dict[str, Any]:
        return {"model": self.model, "context": self.context, "batch": self.batch, "engine": self.engine,
                "label": self.label, "source": self.source, "dtype": self.dtype, "page_tokens": self.page_tokens,
                "state_every": self.state_every, "bytes": self.bytes, "kv_bytes": self.kv_bytes,
                "state_bytes": self.state_bytes,
                "kinds": [dataclasses.asdict(k) for k in self.kinds], "notes": list(self.notes)}


def paged_tokens(tokens: int, page_tokens: int) -> int:
    """Tokens' room a cache of `tokens` takes in pages of `page_tokens`: ⌈tokens / P⌉ · P (1000 in 16s: 1008)."""
    return -(-tokens // page_tokens) * page_tokens


def window_pages(context: int, window: int, page_tokens: int) -> int:
    """Tokens' room of the pages a sliding layer keeps at `context`: those covering its last `window` tokens,
    positions context − window … context − 1, from page ⌊(context − window) / P⌋ to page ⌈context / P⌉ − 1."""
    if context <= window:
        return paged_tokens(context, page_tokens)
    return (-(-context // page_tokens) - (context - window) // page_tokens) * page_tokens


def states_kept(context: int, every: int) -> int:
    """States a recurrent layer keeps for prefix caching, one every `every` tokens: ⌈context / every⌉."""
    return -(-context // every)


def cache_by_engine(model: Model, context: int, *, dtype: str = "bfloat16", page_tokens: int | None = None,
                    engine: str = "vllm", batch: int = 1, state_every: int | None = None) -> EngineCache:
    """`model`'s cache at `context` tokens for `batch` sequences as `engine` (ENGINES) holds it: keys and values (or
    latents) in `dtype` (CACHE_DTYPES) in pages of `page_tokens` (None: the engine's, 16 for vLLM, token by token
    for the others); a sliding layer at its window or at full size as the engine does; recurrent states as their
    mechanism holds them, one (None) or one every `state_every` tokens (prefix caching: vLLM's Mamba prefix caching
    keeps a state a block, PR #25752). The per-token and state bytes are the mechanism specs' (plan). O(layer kinds).
    ValueError with a sentence naming the field otherwise."""
    held = _engine(engine)
    stored = cache_dtype(dtype)
    pages = held.pages if page_tokens is None else page_tokens
    found = []
    if not _whole(pages, 1 << 16):
        found.append(f"page_tokens must be a whole number of tokens from 1 to {1 << 16:,}, got {quoted(page_tokens)}")
    if state_every is not None and not _whole(state_every, MAX_CONTEXT):
        found.append(f"state_every must be a whole number of tokens from 1 to {MAX_CONTEXT:,}, got "
                     f"{quoted(state_every)}")
    if not _whole(batch, 1 << 16):
        found.append(f"batch must be a whole number from 1 to {1 << 16:,}, got {quoted(batch)}")
    if stored.name == "mla-fp8":
        found += [f"dtype mla-fp8 is DeepSeek's latent layout; layer {quoted(layer.name, 40)} is {layer.mechanism}, "
                  "not mla; choose fp8" for layer in model.layers if layer.mechanism != "mla"]
    if found:
        raise ValueError("; ".join(found))
    made, at_1, at_2 = (plan(model, n) for n in (context, 1, 2))  # plan names a bad model or context
    at_n = made.kinds
    kinds = tuple(_held(k, one, two, context, held, stored, pages, state_every, batch, made.dtype)
                  for k, one, two in zip(at_n, at_1.kinds, at_2.kinds))
    notes = [stored.description]
    if any(k.layer.window for k in at_n):
        notes.append(f"sliding layers: {held.label}; source: {held.source}")
    if state_every is not None and any(k.kind == "state" for k in at_n):
        notes.append(f"recurrent layers keep a state every {state_every:,} tokens, ⌈n / {state_every:,}⌉ = "
                     f"{states_kept(context, state_every):,} a layer, so a request sharing a prefix resumes from the "
                     "last one before it ends (vLLM's Mamba prefix caching, PR #25752: a state a block)")
    return EngineCache(model.name, context, batch, held.name, held.label, held.source, stored.name, pages,
                       state_every, kinds, tuple(notes))


def _held(k: LayerPlan, one: LayerPlan, two: LayerPlan, context: int, engine: Engine, stored: CacheDtype,
          pages: int, state_every: int | None, batch: int, model_dtype: str) -> KindHeld:
    """One kind: a state is kept as its mechanism holds it (engines keep recurrent states unquantized); keys and
    values take the spec's bytes a token, re-stored in `stored`, over the tokens the engine holds."""
    layer = k.layer
    if k.kind == "state":
        kept = states_kept(context, state_every) if state_every else 1
        return KindHeld(layer.name, "state", layer.count, kept, k.bytes_per_layer * kept * layer.count * batch)
    per_token = two.bytes_per_layer - one.bytes_per_layer  # the spec's bytes a token, in the model's dtype
    spec_tokens = round(k.bytes_per_layer / per_token)  # min(n, window) for a sliding layer, n otherwise
    if layer.window and engine.full_windows:
        tokens = paged_tokens(context, pages)
    elif layer.window and spec_tokens < context:
        tokens = window_pages(context, spec_tokens, pages)
    else:
        tokens = paged_tokens(spec_tokens, pages)
    token_bytes = per_token / DTYPE_BYTES[model_dtype] * stored.bytes_per_value
    if stored.name == "mla-fp8":
        token_bytes = _mla_fp8_token_bytes(layer.kv_rank, layer.rope_dim)
    return KindHeld(layer.name, "kv", layer.count, tokens, token_bytes * tokens * layer.count * batch)


def _mla_fp8_token_bytes(kv_rank: int, rope_dim: int) -> float:
    """FlashMLA's fp8 layout for a token: the latent in fp8 with a float32 scale a 128, the rotary key in bf16."""
    return kv_rank + 4 * math.ceil(kv_rank / 128) + 2 * rope_dim


def _engine(name: str) -> Engine:
    key = name.strip().lower() if isinstance(name, str) else None
    if key not in ENGINES:
        raise ValueError(f"engine {quoted(str(name), 30)} is unknown; choose one of {', '.join(ENGINES)}")
    return ENGINES[key]


def _whole(value: Any, high: int) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and 1 <= value <= high
