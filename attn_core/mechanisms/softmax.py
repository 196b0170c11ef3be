"""Textbook softmax attention that materializes the score matrix (Vaswani et al. 2017, arXiv 1706.03762)."""
from __future__ import annotations

import torch

from .. import masks
from ..spec import Cost, Generation, Insight, MechanismSpec, Shape, Supports
from ._cache import KVCache, kv_bytes, kv_step
from ._common import (check_key_padding, check_score_bias, check_sinks, checked_shape, fold, grouped_matmul, scale,
                      sink_weight, softmax_or_zeros, with_options)


def _scores(q: torch.Tensor, k: torch.Tensor, causal: bool, mask: torch.Tensor | None,
            score_bias: torch.Tensor | None = None) -> torch.Tensor:
    B, H, Nq, _ = q.shape
    s = (fold(q * scale(q.shape[-1]), k.shape[1]) @ k.transpose(-2, -1)).view(B, H, Nq, k.shape[-2])
    if score_bias is not None:
        s = s + score_bias.to(s.dtype)
    if causal:
        s.masked_fill_(torch.ones(s.shape[-2:], dtype=torch.bool, device=s.device).triu_(1), float("-inf"))
    if mask is not None:
        s.masked_fill_(~mask, float("-inf"))
    return s


def softmax_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, *, causal: bool = False,
                      mask: torch.Tensor | None = None, key_padding_mask: torch.Tensor | None = None,
                      score_bias: torch.Tensor | None = None, sinks: torch.Tensor | None = None,
                      output_gate: torch.Tensor | None = None, qk_norm: bool | torch.Tensor = False) -> torch.Tensor:
    """softmax(Q Kᵀ/√D [+ bias] [masked]) V.

    q (B, H, Nq, D), k and v (B, Hk, Nk, D) → (B, H, Nq, D). Hk < H: each key/value head is shared by H/Hk
    consecutive query heads, which are stacked as rows of one product (`fold`), so it is never repeated. `mask` is
    boolean, broadcastable to (B, H, Nq, Nk), True where attention is allowed. Causal: query i sees key j iff j ≤ i.
    O(Nq·Nk·D) time, O(Nq·Nk) memory: the scores and the probabilities are both materialized. A fully masked row
    gives NaN, as in the textbook.
    `key_padding_mask` (B, Nk) boolean, True where the key is padding: those keys are filled with −inf too, and then
    a query that sees no key (its keys all padded or masked) outputs zeros instead of NaN.
    `score_bias`: float, broadcastable to (B, H, Nq, Nk), added to the scaled scores before masking (ALiBi, relative
    positions: attn_core.positions.encodings); one more (Nq, Nk) temporary per head when it broadcasts.
    `sinks` (H,): a logit per query head joining every row's denominator with no value (gpt-oss, arXiv 2508.10925):
    each row scaled by σ(ℓ − a_h), ℓ its log-sum-exp (`sink_weight`); a row that sees no key outputs zeros.
    `qk_norm` (True, or a (D,) weight): q and k RMS-normalised per head first (Llama 4, Qwen3, Gemma 3).
    `output_gate` (B, H, Nq, D): gate logits g, out ⊙ σ(g) (arXiv 2505.06708, Qwen3-Next).
    """
    if output_gate is not None or qk_norm is not False:
        return with_options(SPEC, softmax_attention, q, k, v, qk_norm=qk_norm, output_gate=output_gate, causal=causal,
                            mask=mask, key_padding_mask=key_padding_mask, score_bias=score_bias, sinks=sinks)
    checked_shape(SPEC, q, k, v, causal)
    if mask is not None and mask.dtype != torch.bool:
        raise ValueError(f"mask must be boolean (True = attend), got {mask.dtype}")
    if score_bias is not None:
        check_score_bias(SPEC, score_bias, q, k)
    if sinks is not None:
        check_sinks(SPEC, sinks, q)
    if key_padding_mask is None and sinks is not None and mask is None:  # no row is left without a key
        s = _scores(q, k, causal, None, score_bias)
        weight = sink_weight(torch.logsumexp(s, -1), sinks)  # one (Nq, Nk) temporary beside the scores
        p = torch.softmax(s, dim=-1)
        del s  # P·V runs beside the probabilities alone, as without sinks (autograd keeps what it needs)
        out = grouped_matmul(p, v)
        del p
        return out * weight
    if key_padding_mask is None and sinks is None:
        return grouped_matmul(torch.softmax(_scores(q, k, causal, mask, score_bias), dim=-1), v)
    if key_padding_mask is not None:
        check_key_padding(SPEC, key_padding_mask, q, k)
        keep = ~key_padding_mask[:, None, None, :]  # (B, 1, 1, Nk)
        mask = keep if mask is None else mask & keep
    return softmax_or_zeros(_scores(q, k, causal, mask, score_bias), v, sinks)


def _flops(s: Shape) -> float:
    cells = s.Nq * (s.Nq + 1) / 2 if s.causal else s.Nq * s.Nk  # causal keeps j ≤ i
    return 4.0 * s.bh * cells * s.D  # Q Kᵀ and P V, 2·D each per kept cell


def _executed_flops(s: Shape) -> float:
    # Causal too: every (Nq, Nk) score and product is computed; the mask only sets the upper half to −inf.
    return 4.0 * s.bh * s.Nq * s.Nk * s.D


def _memory(s: Shape) -> float:
    # Peak inside softmax: the scores and the probabilities, each (B, H, Nq, Nk).
    return 2.0 * s.bh * s.Nq * s.Nk * s.elem


def _sinks_memory(s: Shape) -> float:
    """With sinks (no padding or mask): the scores beside their log-sum-exp's (Nq, Nk) temporary, then beside the
    probabilities, as without; at the end P·V and its rescaled copy, (B, H, Nq, D) each (the larger where D is
    comparable to n); the rows' weights σ(ℓ − a) held beside throughout, in the inputs' dtype."""
    return max(_memory(s), 2.0 * s.bh * s.Nq * s.D * s.elem) + s.bh * s.Nq * s.elem


def _remember(k, v, *, max_len: int | None = None, sinks: torch.Tensor | None = None) -> KVCache:
    """Key-value cache of every token: a step reads all of it, O(n·d) time and memory at context n."""
    return KVCache({}, k, v, max_len=max_len, sinks=sinks)


def _cache_bytes(s: Shape) -> float:
    """K and V of every token so far."""
    return kv_bytes(s, s.Nk)


SPEC = MechanismSpec(
    label="Softmax (materialized)",
    fn=softmax_attention,
    description="The textbook version: builds the full n×n score matrix, then softmax, then times V.",
    paper="Vaswani et al. 2017, 'Attention Is All You Need', arXiv 1706.03762",
    params=(),
    exact=True,
    cost=Cost(flops=_flops, executed_flops=_executed_flops, memory_bytes=_memory, time_big_o="O(n²·d)",
              memory_big_o="O(n²)", sinks_memory_bytes=_sinks_memory),
    supports=Supports(
        causal=True,
        cross=True,
        padding=True,
        shared_kv=True,
        score_bias=True,
        sinks=True,
        output_gate=True,
        qk_norm=True,
        generation=Generation(remember=_remember, step=kv_step, cache_bytes=_cache_bytes, step_big_o="O(n·d)",
                              cache_big_o="O(n·d)"),
    ),
    insight=Insight(pattern=lambda causal: masks.causal if causal else masks.full),
)
