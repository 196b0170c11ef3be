"""Generating token by token: a prompt's causal outputs and cache (`prefill`), then one `step` per new token against
that cache, for every mechanism whose spec has a `Generation` (softmax's key-value cache; a fixed-size state for
kernelized attention, Katharopoulos et al. 2020, 'Transformers are RNNs', arXiv 2006.16236)."""
from __future__ import annotations

import numbers
from typing import Any

import torch

from attn_core.api import check_seed, get
from attn_core.mechanisms._cache import Cache, KVCache, Ring, StateCache
from attn_core.mechanisms._common import _VALIDATED, check_finite, check_qkv, check_sinks, own_precision
from attn_core.mechanisms._streaming import check_keep_first
from attn_core.spec import Generation, MechanismSpec, Shape

__all__ = ["Cache", "KVCache", "Ring", "StateCache", "cache_bytes", "can_generate", "prefill", "remember", "step"]


def can_generate(key: str) -> tuple[bool, str]:
    """(True, '') when mechanism `key` generates token by token, else (False, the sentence that says why not)."""
    spec = get(key)
    return spec.supports.generation is not None, "" if spec.supports.generation else _reason(spec)


def prefill(key: str, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, *, max_len: int | None = None,
            **params: Any) -> tuple[torch.Tensor, Cache]:
    """The causal outputs of a prompt q (B, H, n, D), k and v (B, Hk, n, D) → (B, H, n, D), and the cache the next
    token needs (Hk key/value heads, for a mechanism with spec.supports.shared_kv: a cache Hk/H of multi-head's).

    `max_len`: the longest context expected (≥ n), so that the cache is allocated once; without it, a key-value
    cache starts at n tokens and doubles when full. `params`: the mechanism's parameters and random state, as for
    its forward call (Performer's `projection`, or a `seed` to draw it from); `keep_first=S` for a windowed cache
    that keeps the first S tokens too (StreamingLLM, arXiv 2309.17453; spec.supports.generation.keep_first). ValueError
    with a sentence for a mechanism that cannot generate, bad shapes or settings.
    """
    spec, gen, kw = _checked(key, q, k, v, max_len, params)
    with own_precision(q.device.type, {"q": q, "k": k, "v": v, **kw}) as given:  # under autocast: its dtype
        q, k, v, kw = given.pop("q"), given.pop("k"), given.pop("v"), given
        if gen.prefill is not None:
            out, cache = gen.prefill(q, k, v, max_len=max_len, **kw)
        else:
            out, cache = spec.fn(q, k, v, causal=True, **kw), gen.remember(k, v, max_len=max_len, **kw)
    return out, _owned(cache, spec)


def remember(key: str, k: torch.Tensor, v: torch.Tensor, *, max_len: int | None = None, **params: Any) -> Cache:
    """The cache of a prompt's keys and values (B, Hk, n, D) without its outputs: what `prefill` returns beside them,
    at O(n) cost where the prompt's own attention may be quadratic (for timing steps at long contexts)."""
    spec, gen, kw = _checked(key, k, k, v, max_len, params)
    with own_precision(k.device.type, {"k": k, "v": v, **kw}) as given:  # under autocast: its dtype
        k, v, kw = given.pop("k"), given.pop("v"), given
        return _owned(gen.remember(k, v, max_len=max_len, **kw), spec)


def step(key: str, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, cache: Cache) -> tuple[torch.Tensor, Cache]:
    """One new token's q (B, H, 1, D), k and v (B, Hk, 1, D) → its output (B, H, 1, D) and the cache, written in
    place: it sees
    every token so far that its mechanism's causal pattern lets it see. The arguments are checked against the cache
    (mechanism, batch, heads, head dimension, dtype, device) except inside `_common.validated()`, where a timed loop
    does not pay for it."""
    gen = _generation(get(key))
    with own_precision(q.device.type, {"q": q, "k": k, "v": v}) as given:  # under autocast: its dtype (the cache's)
        q, k, v = given["q"], given["k"], given["v"]
        if not _VALIDATED.get():
            _check_step(key, q, k, v, cache)
        return gen.step(q, k, v, cache)


def cache_bytes(key: str, shape: Shape, **params: Any) -> float:
    """Bytes the cache of mechanism `key` holds in use after a context of shape.Nk tokens (its `used_bytes`)."""
    spec = get(key)
    if "seed" in params:
        check_seed(params["seed"], spec)
    first = _keep_first(spec, params)
    spec.check_params(params, extra=(*spec.state.keys, "seed"))
    return _generation(spec).cache_bytes(shape, **spec.resolved(params), **first)


def _keep_first(spec: MechanismSpec, params: dict) -> dict:
    """{'keep_first': S} popped from `params` and checked (StreamingLLM), or {} where absent or 0."""
    if "keep_first" not in params:
        return {}
    first = params.pop("keep_first")
    check_keep_first(spec, first)
    return {"keep_first": first} if first else {}


def _owned(cache: Cache, spec: MechanismSpec) -> Cache:
    """The cache a mechanism built, marked with the registry's key for it (mechanisms never name themselves), so
    that `step` can tell it from another mechanism's."""
    cache.key = spec.key
    return cache


def _reason(spec: MechanismSpec) -> str:
    return spec.supports.no_generation or "its spec gives no generation form"


def _generation(spec: MechanismSpec) -> Generation:
    if spec.supports.generation is None:
        raise ValueError(f"{spec.label} cannot generate token by token: {_reason(spec)}")
    return spec.supports.generation


def _checked(key: str, q, k, v, max_len, params: dict) -> tuple[MechanismSpec, Generation, dict]:
    """Spec, generation form and the keyword arguments (parameters with defaults, random state) for a prompt."""
    spec = get(key)
    gen = _generation(spec)
    if "seed" in params:  # a seed draws the random state; a mechanism without one refuses it with a sentence
        check_seed(params["seed"], spec)
    check_qkv(q, k, v)
    check_finite(q=q, k=k, v=v)
    sinks = params.pop("sinks", None)  # (H,) sink logits: to the forward pass and into the cache, for every step
    if sinks is not None:
        check_sinks(spec, sinks, q)
    first = _keep_first(spec, params)
    spec.check(Shape.of(q, k, causal=True), params)
    n = k.shape[-2]
    if max_len is not None and (not isinstance(max_len, numbers.Integral) or isinstance(max_len, bool)
                                or max_len < n):
        raise ValueError(f"max_len = {max_len!r} cannot hold the prompt of {n} tokens; pass an integer ≥ {n}, or "
                         f"None to let the cache grow")
    given = (*spec.state.keys, "seed") if spec.state.init else spec.state.keys  # a seed draws the random state
    state = {name: params[name] for name in given if name in params}
    return spec, gen, {**spec.resolved(params), **state, **({} if sinks is None else {"sinks": sinks}), **first}


def _check_step(key: str, q, k, v, cache) -> None:
    if not isinstance(cache, Cache):
        raise ValueError(f"cache must be what prefill or remember returned, got {type(cache).__name__}")
    if cache.key != key:
        raise ValueError(f"this cache belongs to {cache.key!r}; step it with {cache.key!r}, or prefill a cache "
                         f"for {key!r}")
    B, Hk, D = cache.batch_heads_dim
    for name, t in (("k", k), ("v", v)):
        if isinstance(t, torch.Tensor) and tuple(t.shape) != (B, Hk, 1, D):
            raise ValueError(f"{name} must have shape {(B, Hk, 1, D)}, one new token for this cache of batch {B}, "
                             f"{Hk} key/value heads, head dimension {D}; got {tuple(t.shape)}")
    if isinstance(q, torch.Tensor) and (q.dim() != 4 or q.shape[0] != B or q.shape[2:] != (1, D) or q.shape[1] % Hk):
        raise ValueError(f"q must have shape ({B}, heads, 1, {D}), one new token for this cache of batch {B}, head "
                         f"dimension {D}, with heads a multiple of its {Hk} key/value heads; got {tuple(q.shape)}")
    check_qkv(q, k, v)
    if q.dtype != cache.dtype or q.device != cache.device:
        raise ValueError(f"the new token is {q.dtype} on {q.device} but the cache holds {cache.dtype} on "
                         f"{cache.device}; pass the token in the prompt's dtype and device")
    check_finite(q=q, k=k, v=v)
