"""StreamingLLM for a windowed cache: the first S tokens kept beside the last window, so that the attention the first
tokens draw (attention sinks) stays once the window has passed them (Xiao et al. 2023, 'Efficient Streaming Language
Models with Attention Sinks', arXiv 2309.17453, §3.2: four initial tokens suffice). Sliding window's `keep_first=S`."""
from __future__ import annotations

import numbers
from typing import Any

import torch

from .. import masks
from ..spec import MechanismSpec, Shape
from ._banded import Extra, banded_attention
from ._cache import KVCache, Ring, attend, kv_bytes, kv_step


def check_keep_first(spec: MechanismSpec, keep_first: Any) -> None:
    """ValueError with a sentence unless `spec`'s generation keeps first tokens (`Generation.keep_first`) and
    `keep_first` is a whole number ≥ 0."""
    gen = spec.supports.generation
    if gen is None or not gen.keep_first:
        from . import MECHANISMS  # the catalogue imports this module

        takers = ", ".join(key for key, s in MECHANISMS.items()
                           if s.supports.generation is not None and s.supports.generation.keep_first)
        raise ValueError(f"{spec.label} cannot keep the first tokens (StreamingLLM): its cache is not a window the "
                         f"first tokens fall out of; choose one of {takers}, or drop keep_first=")
    if not isinstance(keep_first, numbers.Integral) or isinstance(keep_first, bool) or keep_first < 0:
        raise ValueError(f"keep_first must be a whole number of tokens ≥ 0 (StreamingLLM keeps 4), got "
                         f"{keep_first!r}")


def first_keys(keep_first: int, causal: bool) -> masks.Pattern:
    """Query i sees key j iff j < S (causal: and j ≤ i): the kept first tokens."""
    first = masks.Pattern(f"first {keep_first} tokens: j < {keep_first}", lambda i, j: j < keep_first)
    return first & masks.causal if causal else first


def streaming_window(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, *, band: masks.Pattern, block: int,
                     window: int, causal: bool, keep_first: int, key_padding_mask: torch.Tensor | None = None,
                     sinks: torch.Tensor | None = None) -> torch.Tensor:
    """Sliding-window attention where query i also sees the first S = keep_first keys: i sees j iff
    0 ≤ i − j ≤ window (not causal: |i − j| ≤ window) or j < S (causal: and j ≤ i). The first min(S, n) keys join
    each row's band in one softmax as `banded_attention`'s extra keys (a first key inside the band counted once).
    q (B, H, n, D), k and v (B, Hk, n, D) → (B, H, n, D). O(n·(w + S)·D) time, O(n·D) memory."""
    S = min(keep_first, k.shape[2])
    where = torch.arange(S, device=k.device)
    extra = Extra(k[:, :, :S], v[:, :, :S], where, first_keys(S, causal)) if S else None
    return banded_attention(q, k, v, pattern=band, block=block, left=window, right=0 if causal else window,
                            extra=extra, key_padding_mask=key_padding_mask, sinks=sinks)


def remember(k: torch.Tensor, v: torch.Tensor, *, max_len: int | None, window: int, keep_first: int,
             sinks: torch.Tensor | None = None) -> KVCache:
    """Two rings: the last window + 1 tokens (`tokens`, sliding window's) and the first S (`first`, written once,
    never overwritten); the first ring holds the prompt's first min(S, n) tokens, the rest as they are generated.
    O((w + S)·d) memory at any context."""
    params = {"window": window, "keep_first": keep_first}
    cache = KVCache(params, k, v, max_len=max_len, limit=window + 1, sinks=sinks)
    held = min(keep_first, k.shape[2])
    cache.rings["first"] = Ring(k[:, :, :held], v[:, :, :held], limit=keep_first,
                                reserve=min(keep_first, max_len or 0))
    return cache


def step(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, cache: KVCache) -> tuple[torch.Tensor, KVCache]:
    """The new token at position p (causal) against its window, the last w + 1 tokens with itself, and the first
    tokens j < min(S, p − w) that lie outside it, in one softmax (with the sinks, where given): O((w + S)·d). A cache
    without a `first` ring (keep_first = 0) is sliding window's (`kv_step`)."""
    first = cache.rings.get("first")
    if first is None:
        return kv_step(q, k, v, cache)
    w, S, p = cache.params["window"], cache.params["keep_first"], cache.length
    keys, values = cache.append(k, v)
    if first.length < S:
        first.append(k, v)
    before = min(S, max(p - w, 0))
    fk, fv = first.view()
    pairs = ((keys, values),) + (((fk[:, :, :before], fv[:, :, :before]),) if before else ())
    return attend(q, *pairs, sinks=cache.sinks), cache


def cache_bytes(s: Shape, window: int, keep_first: int) -> float:
    """Keys and values of the window's min(n, w + 1) tokens and the first min(n, S): (w + 1 + S) tokens once
    n ≥ w + 1 + S (a first token still inside the window is held twice until the window passes it)."""
    return kv_bytes(s, min(s.Nk, window + 1) + min(s.Nk, keep_first))
