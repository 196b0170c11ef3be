"""Exact attention for banded patterns, block by block, without any n×n tensor (shared by local, sliding window and
Longformer), and the dense rows of global tokens (Longformer, BigBird)."""
from __future__ import annotations

import math
from typing import NamedTuple

import torch
import torch.nn.functional as F

from ..masks import Pattern
from ..spec import Shape
from .sdpa import SPEC as SDPA

# Scores held at once per chunk of query blocks, in elements (over all batch·heads): bounds the workspace.
CHUNK_ELEMS = 1 << 21


class Extra(NamedTuple):
    """Keys every query block may see besides its band (Longformer's global tokens): keys and values (B, H, g, D)
    at sequence positions (g,), kept for query i where `pattern` allows and the band's pattern does not (so a key
    inside the band is counted once)."""

    k: torch.Tensor
    v: torch.Tensor
    positions: torch.Tensor
    pattern: Pattern


def chunk_blocks(heads: int, block: int, span: int) -> int:
    """How many query blocks one chunk processes: as many as keep heads·c·block·span ≤ CHUNK_ELEMS."""
    return max(1, CHUNK_ELEMS // (heads * block * span))


def banded_memory(heads: int, n: int, d: int, elem: int, *, block: int, left: int, right: int,
                  extra: int = 0, dtype: str = "float32") -> float:
    """Predicted peak bytes of banded_attention above its inputs: reached in the first chunk, which holds the output,
    the (block, S) mask, its scaled queries, zero-padded key and value slabs when it touches an edge, its edge mask,
    and the scores and probabilities (B·H·rows·S each). With `extra` keys (`_merged`) instead of those two: the
    extra keys' copies and masks, the chunk's (rows, S + extra) bias, its joined keys and values and what the
    fused kernel allocates (the sdpa spec's prediction for that call)."""
    span = left + block + right
    rows = min(chunk_blocks(heads, block, span + extra), -(-n // block)) * block
    edge = left > 0 or rows + right > n
    slabs = 2 * heads * (rows + left + right) * d * elem + rows * span * elem if edge else 0
    held = heads * n * d * elem + block * span * (elem + 1) + heads * rows * d * elem + slabs
    if not extra:
        return held + 2 * heads * rows * span * elem
    c, keys = rows // block, span + extra
    masks = rows * (8 + extra * (elem + 1) + keys * elem)  # query positions, the extra keys' mask and bias, bias
    fused = SDPA.cost.memory_bytes(Shape(heads, c, block, keys, d, dtype=dtype))
    return held + 2 * heads * extra * d * elem + masks + 2 * heads * c * keys * d * elem + fused


def banded_flops(heads: int, n: int, d: int, *, block: int, left: int, right: int) -> float:
    """FLOPs banded_attention executes: Q Kᵀ and P V for every query block, the last zero-padded to `block` rows,
    against its whole window of S = left + block + right keys, masked cells and zero keys past the ends included."""
    return 4.0 * heads * math.ceil(n / block) * block * (left + block + right) * d


def _key_slab(x: torch.Tensor, start: int, stop: int) -> torch.Tensor:
    """x[:, :, start:stop] along the sequence, zero rows where [start, stop) leaves [0, n)."""
    n = x.shape[-2]
    inside = x[:, :, max(start, 0):min(stop, n)]
    if start >= 0 and stop <= n:
        return inside
    return F.pad(inside, (0, 0, max(0, -start), max(0, stop - n)))


def padding_bias(key_padding_mask: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """(B, 1, Nk, 1) additive key bias: 0, or a quarter of the lowest finite value where the key is padding. With
    the pattern's floor of half the lowest value the sum stays finite (no −inf, so no NaN); a row whose best score
    lies below `dead_below` saw no unpadded key."""
    bias = torch.zeros(key_padding_mask.shape, dtype=dtype, device=key_padding_mask.device)
    return bias.masked_fill_(key_padding_mask, torch.finfo(dtype).min / 4)[:, None, :, None]


def dead_below(dtype: torch.dtype) -> float:
    """Scores (with their biases) below this are masked or padded keys: finite scores are far above it."""
    return torch.finfo(dtype).min / 8


def softmax_seen(scores: torch.Tensor, values: torch.Tensor) -> torch.Tensor:
    """softmax(scores) @ values, its biases already in the scores; a row whose best score lies below `dead_below`
    (it sees no unpadded key) outputs zeros."""
    dead = scores.amax(-1, keepdim=True) < dead_below(scores.dtype)
    return (torch.softmax(scores, dim=-1) @ values).masked_fill_(dead, 0.0)


def banded_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, *, pattern: Pattern, block: int,
                     left: int, right: int, extra: Extra | None = None,
                     key_padding_mask: torch.Tensor | None = None) -> torch.Tensor:
    """softmax(Q Kᵀ/√D masked by `pattern`) V for self-attention, q, k, v (B, H, n, D) → (B, H, n, D).

    Query block β (rows [β·block, (β+1)·block)) may only see keys in [β·block − left, (β+1)·block + right): a
    window of S = left + block + right keys taken as a strided view. Within it the allowed cells are the same for
    every block (the pattern is invariant under shifts by `block`), so one (block, S) mask serves all; keys
    outside [0, n) are masked per block. Chunks of query blocks bound the workspace to about CHUNK_ELEMS scores.
    O(n·S·D) time, O(n·D) memory. `extra` adds g keys every block is scored against too, in the same softmax
    (`_merged`): O(n·(S + g)·D) time. `key_padding_mask` (B, n) boolean, True where the key is padding: a per-key
    bias (`padding_bias`), cut into windows as the keys are (and taken at the extra keys' positions), is added to
    each block's scores, which are then held per chunk (the fused kernel takes no per-batch bias here); a query that
    sees no unpadded key outputs zeros. No n×n tensor either way.
    """
    B, H, n, D = q.shape
    span = left + block + right
    n_blocks = math.ceil(n / block)
    base = block * math.ceil(left / block)  # a block-aligned query position with every window key at ≥ 0
    r = torch.arange(block, device=q.device)[:, None]
    t = torch.arange(span, device=q.device)[None, :]
    keep = pattern(base + r, base - left + t)  # (block, S), the same for every block
    # A finite floor, not −inf: a padded query row that sees no key must not turn into NaN (nor its gradients).
    inner_bias = torch.zeros(block, span, dtype=q.dtype, device=q.device).masked_fill_(~keep, torch.finfo(q.dtype).min / 2)
    out = q.new_empty(B, H, n, D)
    step = chunk_blocks(B * H, block, span + (0 if extra is None else len(extra.positions)))
    pad = None if key_padding_mask is None else padding_bias(key_padding_mask, q.dtype)
    for first in range(0, n_blocks, step):
        c = min(step, n_blocks - first)
        qs, qe = first * block, min(n, (first + c) * block)
        out[:, :, qs:qe] = _chunk(q, k, v, qs, c, block, left, right, inner_bias, pattern, extra,
                                  pad)[:, :, : qe - qs]
    return out


def _chunk(q, k, v, qs: int, c: int, block: int, left: int, right: int, inner_bias: torch.Tensor, pattern: Pattern,
           extra: Extra | None, pad: torch.Tensor | None = None) -> torch.Tensor:
    """Output rows [qs, qs + c·block) of banded_attention, (B, H, c·block, D); its temporaries die on return."""
    B, H, n, D = q.shape
    span = inner_bias.shape[-1]
    qc = F.pad(q[:, :, qs:min(n, qs + c * block)], (0, 0, 0, max(0, qs + c * block - n))) * (1.0 / math.sqrt(D))
    ks, ke = qs - left, qs + c * block + right
    kw = _key_slab(k, ks, ke).unfold(2, span, block)  # (B, H, c, D, S): a view, no copy
    vw = _key_slab(v, ks, ke).unfold(2, span, block)
    bias = inner_bias
    if ks < 0 or ke > n:  # edge chunk: mask the zero-padded keys
        pos = ks + block * torch.arange(c, device=q.device)[:, None, None] + torch.arange(span, device=q.device)
        bias = inner_bias.masked_fill((pos < 0) | (pos >= n), torch.finfo(q.dtype).min / 2)  # (c, block, S)
    if extra is not None and pad is None:
        return _merged(qc, kw, vw, bias, qs, pattern, extra)
    if pad is None:  # no named scores: they die inside softmax, as the memory prediction assumes
        p = torch.softmax((qc.view(B, H, c, block, D) @ kw).add_(bias), dim=-1)  # (B, H, c, block, S)
        return (p @ vw.transpose(-1, -2)).view(B, H, c * block, D)
    s = (qc.view(B, H, c, block, D) @ kw).add_(bias)
    s.add_(_key_slab(pad, ks, ke).unfold(2, span, block))  # (B, 1, c, 1, S): the padding of each block's keys
    if extra is None:
        return softmax_seen(s, vw.transpose(-1, -2)).view(B, H, c * block, D)
    side = _extra_bias(qs, c * block, pattern, extra, qc.dtype).view(c, block, -1)  # (c, block, g)
    t = (qc @ extra.k.transpose(-2, -1)).view(B, H, c, block, -1).add_(side)
    t.add_(pad[:, :, extra.positions].view(B, 1, 1, 1, -1))  # the extra keys' padding
    values = torch.cat([vw.transpose(-1, -2), extra.v[:, :, None].expand(B, H, c, -1, D)], dim=-2)
    return softmax_seen(torch.cat([s, t], dim=-1), values).view(B, H, c * block, D)


def _extra_bias(qs: int, rows: int, pattern: Pattern, extra: Extra, dtype: torch.dtype) -> torch.Tensor:
    """(rows, g) additive bias of query rows [qs, qs + rows) against the extra keys: 0 where the extra pattern
    allows a key the band does not hold already, the floor elsewhere."""
    i = torch.arange(qs, qs + rows, device=extra.positions.device)[:, None]
    p = extra.positions[None, :]
    keep = extra.pattern(i, p) & ~pattern(i, p)
    return torch.zeros(keep.shape, dtype=dtype, device=keep.device).masked_fill_(~keep, floor(dtype))


def _merged(qc: torch.Tensor, kw: torch.Tensor, vw: torch.Tensor, bias: torch.Tensor, qs: int, pattern: Pattern,
            extra: Extra) -> torch.Tensor:
    """A chunk's c query blocks against their band of S keys and the g extra keys, one softmax over S + g: the
    extra keys joined to every block's window (a key the band holds already is masked among the extra ones), the
    softmax and product fused by PyTorch's kernel (`F.scaled_dot_product_attention`, no scores held).
    qc (B, H, c·block, D) already scaled, kw (B, H, c, D, S), vw likewise, bias (block or c, block, S)
    → (B, H, c·block, D)."""
    B, H, c, D, S = kw.shape
    block = qc.shape[-2] // c
    side = _extra_bias(qs, c * block, pattern, extra, qc.dtype)  # (c·block, g)
    bias = torch.cat([bias.expand(c, block, S), side.view(c, block, -1)], dim=-1)  # (c, block, S + g)
    keys, values = (torch.cat([w.transpose(-1, -2), x[:, :, None].expand(B, H, c, -1, D)], dim=-2)
                    .view(B * H, c, -1, D) for w, x in ((kw, extra.k), (vw, extra.v)))  # (B·H, c, S + g, D)
    queries = qc.reshape(B * H, c, block, D)
    return F.scaled_dot_product_attention(queries, keys, values, attn_mask=bias[None], scale=1.0).view(B, H, -1, D)


def dense_rows(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, out: torch.Tensor, positions: torch.Tensor,
               causal: bool, key_padding_mask: torch.Tensor | None = None) -> None:
    """Rows `positions` of `out` (B, H, n, D) replaced by softmax attention over all n keys (causal: j ≤ i): the
    global tokens' rows, through PyTorch's fused kernel (`F.scaled_dot_product_attention`, no (rows, n) scores
    held). Causal, in slabs of rows whose (rows, n) additive mask holds about CHUNK_ELEMS entries.
    `key_padding_mask` (B, n), True where the key is padding: left out by a per-key bias, a slab's (rows, n)
    scores then held (a row that sees no unpadded key outputs zeros). O(g·n·D) time, O(n·D) memory beyond the
    output."""
    B, H, n, D = q.shape
    rows = dense_slab(n, len(positions), causal or key_padding_mask is not None)
    pad = None if key_padding_mask is None else padding_bias(key_padding_mask, q.dtype).transpose(-2, -1)
    for first in range(0, len(positions), rows):
        p = positions[first:first + rows]
        mask = None
        if causal:  # j = i stays: no row is empty
            future = torch.arange(n, device=q.device) > p[:, None]
            mask = torch.zeros(future.shape, dtype=q.dtype, device=q.device).masked_fill_(future, floor(q.dtype))
        if pad is None:
            seen = F.scaled_dot_product_attention(q.index_select(2, p), k, v,
                                                  attn_mask=None if mask is None else mask[None, None])
        else:  # (B, 1, 1, n) padding beside the (rows, n) mask
            scores = (q.index_select(2, p) * (1.0 / math.sqrt(D))) @ k.transpose(-2, -1)
            seen = softmax_seen(scores.add_(pad if mask is None else pad + mask), v)
        out.index_copy_(2, p, seen)


def dense_slab(n: int, count: int, causal: bool) -> int:
    """Rows per slab of dense_rows: all of them, or as many as keep a causal (rows, n) mask to CHUNK_ELEMS."""
    return max(1, min(count, CHUNK_ELEMS // n)) if causal else max(1, count)


def floor(dtype: torch.dtype) -> float:
    """A finite stand-in for −∞ in additive masks: a row that sees no key gives no NaN."""
    return torch.finfo(dtype).min / 2


def dense_rows_memory(batch: int, heads: int, n: int, d: int, dtype: str, count: int, causal: bool) -> float:
    """Peak bytes of dense_rows for `count` rows beside the output it writes into: one slab's queries, what the fused
    kernel allocates for them (the sdpa spec's prediction), and, causal, the slab's (rows, n) mask and its bias."""
    if not count:
        return 0.0
    rows = dense_slab(n, count, causal)
    shape = Shape(batch, heads, rows, n, d, dtype=dtype)
    mask = rows * n * (1 + shape.elem) if causal else 0
    return 8 * count + shape.bh * rows * d * shape.elem + SDPA.cost.memory_bytes(shape) + mask
