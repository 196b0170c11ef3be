"""Differential attention: the difference of two softmax maps, so noise both give a key cancels (Ye et al. 2024,
'Differential Transformer', arXiv 2410.05258)."""
from __future__ import annotations

import dataclasses

import torch

from .. import masks
from ..spec import Cost, Generation, Insight, MechanismSpec, Param, Shape, Supports
from ._cache import KVCache, kv_bytes
from ._common import check_key_padding, checked_shape, first_key, fold, repeated, scale, trusted, unfold
from .sdpa import _executed_flops as _flash_flops, _memory as _flash_memory, shared_sdpa  # the kernel's own model


def _half(d: int) -> int:
    """D/2, the width of Q₁, Q₂, K₁, K₂; ValueError for an odd head dim, which has no halves."""
    if d % 2:
        raise ValueError(f"differential attention splits the head dim into two halves, so it must be even; got "
                         f"head_dim = {d}: choose an even head_dim (d_model a multiple of 2·heads)")
    return d // 2


def differential_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, *, causal: bool = False,
                           lam: float = 0.8, key_padding_mask: torch.Tensor | None = None) -> torch.Tensor:
    """softmax(Q₁K₁ᵀ/√(D/2)) V − λ·softmax(Q₂K₂ᵀ/√(D/2)) V, with Q = [Q₁ | Q₂], K = [K₁ | K₂] cut into halves
    along the head dim and V whole.

    q (B, H, Nq, D), k and v (B, Hk, Nk, D) → (B, H, Nq, D); D even. Causal: query i sees key j iff j ≤ i. The
    paper's layer also learns λ (as exp(λ_q1·λ_k1) − exp(λ_q2·λ_k2) + λ_init), normalises each head (GroupNorm) and
    scales it by 1 − λ_init: those are parts of the layer around the operator, left to the caller; λ here is a number.
    Runs as four calls of the fused kernel (`shared_sdpa`), each score map against each half of V: PyTorch's CPU
    flash kernel takes one head dim for q, k and v (other shapes fall back to its materializing math path), so each
    map is computed twice: 8·Nq·Nk·D FLOPs a head where the formula needs 6. O(n²·d) time, O(n·d) memory: no n×n
    tensor. Hk < H: the kernel reads each shared head in place.
    `key_padding_mask` (B, Nk) boolean, True where the key is padding: both softmaxes skip those keys, and a query
    that sees no unpadded key outputs zeros.
    """
    s = checked_shape(SPEC, q, k, v, causal, lam=lam)
    half = _half(s.D)
    keep, dead = None, None
    if key_padding_mask is not None:
        check_key_padding(SPEC, key_padding_mask, q, k)
        keep, dead = _padding(key_padding_mask, causal, s.Nq, q.device)
    first, second = slice(None, half), slice(half, None)
    parts = []
    for side in (first, second):  # each half of V against both maps
        one = _softmax_times(q[..., first], k[..., first], v[..., side], causal, keep)
        two = _softmax_times(q[..., second], k[..., second], v[..., side], causal, keep)
        parts.append(torch.sub(one, two, alpha=lam))
        del one, two  # before the next half's calls
    out = torch.cat(parts, dim=-1)
    return out if dead is None else out.masked_fill(dead[:, None, :, None], 0.0)


def _softmax_times(q, k, v, causal: bool, keep: torch.Tensor | None) -> torch.Tensor:
    """softmax(q kᵀ/√(q's width)) v through the fused kernel (its default scale is q's width)."""
    if keep is None:
        return shared_sdpa(q, k, v, is_causal=causal)
    return shared_sdpa(q, k, v, attn_mask=keep)


def _padding(key_padding_mask: torch.Tensor, causal: bool, nq: int, device) -> tuple[torch.Tensor, torch.Tensor]:
    """(keep, dead): the kernel's boolean mask, (B, 1, 1, Nk), or (B, 1, Nq, Nk) joined with the causal one, and
    the (B, Nq) queries that see no unpadded key (the first unpadded key lies past the last one they see)."""
    nk = key_padding_mask.shape[-1]
    keep = ~key_padding_mask[:, None, None, :]
    if causal:
        keep = keep & torch.ones(nq, nk, dtype=torch.bool, device=device).tril_()
    last = torch.arange(nq, device=device) if causal else torch.full((nq,), nk - 1, device=device)
    return keep, first_key(key_padding_mask)[:, None] > last


def signed_weights(q: torch.Tensor, k: torch.Tensor, causal: bool, lam: float) -> torch.Tensor:
    """softmax(Q₁K₁ᵀ/√(D/2)) − λ·softmax(Q₂K₂ᵀ/√(D/2)), (…, Nq, Nk), for q (…, Nq, D) and k (…, Nk, D) with one
    leading shape; causal: j ≤ i. Rows sum to 1 − λ; entries may be negative. Materialized: O(Nq·Nk)."""
    half = _half(q.shape[-1])
    maps = []
    for part in (slice(None, half), slice(half, None)):
        s = (q[..., part] * scale(half)) @ k[..., part].transpose(-2, -1)
        if causal:
            s = s.masked_fill(torch.ones(s.shape[-2:], dtype=torch.bool, device=s.device).triu_(1), float("-inf"))
        maps.append(torch.softmax(s, dim=-1))
    return maps[0] - lam * maps[1]


def _effective(q, k, v, causal: bool, state: dict, lam: float = 0.8) -> tuple[torch.Tensor, torch.Tensor]:
    """The signed weights (B, H, Nq, Nk), causal: j ≤ i, applied to v (shared heads repeated)."""
    k, v = repeated(q, k, v)
    return signed_weights(q, k, causal, lam), v


def _flops(s: Shape, lam: float = 0.8) -> float:
    """Per kept cell and query head: two half-width scores (2·D/2 each) and two products with the whole V (2·D
    each), 6·D."""
    cells = s.Nq * (s.Nq + 1) / 2 if s.causal else s.Nq * s.Nk  # causal keeps j ≤ i
    return 6.0 * s.bh * cells * s.D


def _halved(s: Shape) -> Shape:
    """The shape of each of the four kernel calls: q, k and v all D/2 wide."""
    return dataclasses.replace(s, D=s.D // 2)


def _executed_flops(s: Shape, lam: float = 0.8) -> float:
    """Four calls of the fused kernel at head dim D/2, each as sdpa's spec counts it (its tiles when causal)."""
    return 4.0 * _flash_flops(_halved(s))


def _memory(s: Shape, lam: float = 0.8) -> float:
    """The halves' outputs, each bh·Nq·D/2: the second half's first map (one output) and the first half's
    difference alive while the kernel runs its second map (its output, log-sum-exp and scratch: sdpa's model at
    D/2); or the four halves alive at the end (two differences and the whole output)."""
    half_out = s.bh * s.Nq * (s.D // 2) * s.elem
    return max(2.0 * half_out + _flash_memory(_halved(s)), 4.0 * half_out)


def _remember(k, v, *, max_len: int | None = None, lam: float = 0.8) -> KVCache:
    """Key-value cache of every token, as softmax's: a step reads all of it, O(n·d) time and memory at context n."""
    if not trusted():
        _half(k.shape[-1])
    return KVCache({"lam": lam}, k, v, max_len=max_len)


def _step(q, k, v, cache: KVCache) -> tuple[torch.Tensor, KVCache]:
    """The new token's query against every cached key (it sees them all): the two maps over the L cached keys, their
    signed difference times V, O(L·D). The query heads sharing a key/value head are rows of one query (`fold`)."""
    keys, values = cache.append(k, v)
    weights = signed_weights(fold(q, keys.shape[1]), keys, False, cache.params["lam"])
    return unfold(weights @ values, q.shape[1]), cache


def _step_flops(s: Shape, lam: float = 0.8) -> float:
    """Per query head and cached token: two half-width scores (2·D/2 each) and one product of the signed weights
    with V (2·D): 4·D."""
    return 4.0 * s.bh * s.Nk * s.D


def _cache_bytes(s: Shape, lam: float = 0.8) -> float:
    """K and V of every token so far."""
    return kv_bytes(s, s.Nk)


SPEC = MechanismSpec(
    label="Differential",
    fn=differential_attention,
    description="Two softmax maps from the halves of q and k, the second scaled by λ and subtracted: attention that "
                "both maps give a key cancels. Its own model, not an approximation of softmax.",
    paper="Ye et al. 2024, 'Differential Transformer', arXiv 2410.05258",
    params=(Param("lam", 0.8, 0.0, 1.0, "λ, the weight of the subtracted map (the paper learns it, from λ_init "
                  "between 0.2 and 0.8); 0: softmax over the first halves of q and k alone.", kind=float),),
    exact=False,
    cost=Cost(flops=_flops, executed_flops=_executed_flops, memory_bytes=_memory, time_big_o="O(n²·d)",
              memory_big_o="O(n·d)"),
    supports=Supports(
        causal=True,
        cross=True,
        padding=True,
        shared_kv=True,
        generation=Generation(remember=_remember, step=_step, cache_bytes=_cache_bytes, step_flops=_step_flops,
                              step_big_o="O(n·d)", cache_big_o="O(n·d)"),
    ),
    insight=Insight(
        pattern=lambda causal, lam=0.8: masks.causal if causal else masks.full,  # every pair scored
        effective=_effective,
        regime=("peaky", "gentle", "Differential attention is its own model, not an approximation of softmax: its "
                "weights are the difference of two softmax maps over different halves of q and k, rows summing to "
                "1 − λ, some negative. Where one map singles out a few keys (peaky inputs) the output follows it; "
                "where both spread evenly (gentle inputs) they cancel, by design, and the output shrinks by 1 − λ."),
        accuracy_note="Differential attention is not an approximation of softmax: these errors are the distance "
                      "between two models, softmax(Q₁K₁ᵀ) − λ·softmax(Q₂K₂ᵀ) on the halves of q and k, and "
                      "softmax(QKᵀ), not an approximation error. Its KL is undefined (signed weights).",
    ),
)
