"""Fixed strided sparse attention (Sparse Transformer, Child et al. 2019, arXiv 1904.10509)."""
from __future__ import annotations

import math

import torch
import torch.nn.functional as F

from .. import masks
from ..spec import Cost, Generation, Insight, MechanismSpec, Param, Shape, Supports
from ._banded import chunk_blocks, dead_below, padding_bias, query_blocks, write_blocks
from ._cache import KVCache, Ring, attend, kv_bytes
from ._common import check_key_padding, checked_shape


def sparse_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, *, causal: bool = False,
                     stride: int = 128, key_padding_mask: torch.Tensor | None = None) -> torch.Tensor:
    """Exact attention under the 'fixed' pattern: query i sees key j iff ⌊i/s⌋ = ⌊j/s⌋ (its block of size s =
    stride) or j mod s = s − 1 (a summary key); causal also needs j ≤ i.

    q (B, H, n, D), k and v (B, Hk, n, D) → (B, H, n, D). Each block of queries is scored against its own block
    and the n/s summary keys (those of its own block counted once), one joint softmax over both; the H/Hk query
    heads sharing a key/value head are one block's rows (`query_blocks`), so a block's keys are gathered once per
    key/value head. O(n·(s + n/s)·d) time (s ≈ √n gives O(n·√n)); chunks of query blocks bound the scores held
    at once, so memory is O(n·d + s·(s + n/s)). `key_padding_mask` (B, n) boolean, True where the key is padding:
    a per-key bias, gathered as the keys are (own blocks and summaries), is added to the scores; a query that sees
    no unpadded key outputs zeros.
    """
    checked_shape(SPEC, q, k, v, causal, stride=stride)
    if key_padding_mask is not None:
        check_key_padding(SPEC, key_padding_mask, q, k)
    B, H, n, D = q.shape
    s = min(stride, n)
    nb = math.ceil(n / s)
    tail = nb * s - n
    kb, vb = ((F.pad(x, (0, 0, 0, tail)) if tail else x).reshape(B, x.shape[1], nb, s, D) for x in (k, v))
    ksum, vsum = k[:, :, s - 1::s], v[:, :, s - 1::s]  # (B, Hk, m, D): summary keys, m = ⌊n/s⌋
    m = ksum.shape[-2]
    out = q.new_empty(B, H, n, D)
    step = chunk_blocks(B * H, s, s + m)
    pad = psum = None
    if key_padding_mask is not None:  # (B, 1, n, 1) → own blocks (B, 1, nb, 1, s) and summaries (B, 1, m)
        pad = padding_bias(key_padding_mask, q.dtype)
        psum = pad[:, :, s - 1::s, 0]
        pad = (F.pad(pad, (0, 0, 0, tail)) if tail else pad).view(B, 1, nb, 1, s)
    for a in range(0, nb, step):
        z = slice(a, min(nb, a + step))
        qc = query_blocks(q, k.shape[1], a * s, z.stop - a, s)  # (B, Hk, c, r·s, D), scaled
        write_blocks(out, _chunk(qc, kb[:, :, z], vb[:, :, z], ksum, vsum, _bias(z, s, m, n, causal, q),
                                 None if pad is None else pad[:, :, z], psum), a * s, s)
    return out


def _chunk(qc, kc, vc, ksum, vsum, bias, pad=None, psum=None):
    """One chunk of c query blocks qc (B, Hk, c, r·s, D), scaled, the r query heads sharing a key/value head as
    each block's rows, against their own blocks kc, vc (B, Hk, c, s, D) and the summary keys → (B, Hk, c, r·s, D).
    `bias` (c, s, s + m); `pad` (B, 1, c, 1, s) and `psum` (B, 1, m): key-padding biases of the own blocks' keys
    and of the summaries."""
    B, Hk, c, rows, _ = qc.shape
    s = kc.shape[-2]
    keys = torch.cat([kc, ksum[:, :, None].expand(-1, -1, c, -1, -1)], dim=-2)  # (B, Hk, c, s + m, D)
    values = torch.cat([vc, vsum[:, :, None].expand(-1, -1, c, -1, -1)], dim=-2)
    by_row, bias = (B, Hk, c, rows // s, s, -1), bias[:, None]  # a block's rows as (head of the group, row)
    if pad is None:  # no named scores: they die inside softmax, as the memory prediction assumes
        p = torch.softmax((qc @ keys.transpose(-1, -2)).view(by_row).add_(bias), dim=-1)
        return p.flatten(3, 4) @ values
    scores = (qc @ keys.transpose(-1, -2)).view(by_row).add_(bias)
    summaries = psum[:, :, None, None].expand(-1, -1, c, 1, -1)  # (B, 1, c, 1, m)
    scores.add_(torch.cat([pad, summaries], dim=-1)[:, :, :, None])  # (B, 1, c, 1, 1, s + m)
    scores = scores.flatten(3, 4)
    dead = scores.amax(-1, keepdim=True) < dead_below(scores.dtype)
    p = torch.softmax(scores, dim=-1)
    del scores
    return (p @ values).masked_fill_(dead, 0.0)


def _bias(blocks: slice, s: int, m: int, n: int, causal: bool, like: torch.Tensor) -> torch.Tensor:
    """(c, s, s + m) additive mask for query blocks `blocks`: own-block keys (padding past n excluded; j ≤ i when
    causal), then the m summary keys (not the own block's, counted in the local part; earlier blocks when causal)."""
    beta = torch.arange(blocks.start, blocks.stop, device=like.device)[:, None, None]  # (c, 1, 1)
    r, u = torch.arange(s, device=like.device), torch.arange(m, device=like.device)
    local_ok = (beta * s + r < n).expand(-1, s, s)
    if causal:
        local_ok = local_ok & (r[None, :] <= r[:, None])
    summary_ok = ((u < beta) if causal else (u != beta)).expand(-1, s, m)
    ok = torch.cat([local_ok, summary_ok], dim=-1)
    lowest = torch.finfo(like.dtype).min / 2
    return torch.zeros(ok.shape, dtype=like.dtype, device=like.device).masked_fill_(~ok, lowest)


def _pattern(causal: bool, stride: int = 128) -> masks.Pattern:
    return masks.strided(stride) & masks.causal if causal else masks.strided(stride)


def _flops(s: Shape, stride: int = 128) -> float:
    st = min(stride, s.Nq)
    keys = st + s.Nq // st - 1 if not s.causal else (st + 1) / 2 + (s.Nq // st) / 2
    return 4.0 * s.bh * s.Nq * keys * s.D


def _executed_flops(s: Shape, stride: int = 128) -> float:
    # Every query block, the last zero-padded to st rows, against its st own keys and all ⌊n/st⌋ summaries, masked
    # cells included: Q Kᵀ and P V.
    st = min(stride, s.Nq)
    return 4.0 * s.bh * -(-s.Nq // st) * st * (st + s.Nq // st) * s.D


def _memory(s: Shape, stride: int = 128) -> float:
    st = min(stride, s.Nq)
    nb, m = -(-s.Nq // st), s.Nq // st
    rows = min(chunk_blocks(s.bh, st, st + m), nb) * st  # query rows (all heads' blocks) in the first, largest chunk
    padded = 2 * s.bk * nb * st * s.D if nb * st != s.Nq else 0  # zero-padded copies of k, v
    keys = 2 * s.bk * (rows // st) * (st + m) * s.D  # the chunk's gathered keys and values, Hk heads
    scores = s.bh * rows * (st + m)
    # Output, the chunk's mask, scaled queries, keys and values, its scores beside the probabilities or the
    # probabilities beside P V.
    return (s.bh * s.Nq * s.D + padded + rows * (st + m) + s.bh * rows * s.D + keys + scores
            + max(scores, s.bh * rows * s.D)) * s.elem


def _remember(k, v, *, max_len: int | None = None, stride: int = 128) -> KVCache:
    """Two rings: the current block (`stride` tokens, slot = position mod stride) and the summary keys so far, the
    last token of each finished block (growing by one every `stride` tokens). O(s + n/s) memory at context n."""
    cache = KVCache({"stride": stride}, k, v, max_len=max_len, limit=stride)
    cache.rings["summaries"] = Ring(k[:, :, stride - 1::stride], v[:, :, stride - 1::stride],
                                    reserve=(max_len or 0) // stride)
    return cache


def _step(q, k, v, cache: KVCache):
    """The new token at position p (causal) against its own block up to p and the summaries of the earlier blocks,
    one joint softmax: O((s + n/s)·d). The last token of a block joins the summaries after its own step."""
    stride, position = cache.params["stride"], cache.length
    keys, values = cache.append(k, v)
    own = position % stride + 1  # its block's tokens so far, in slots 0 … own − 1
    summaries = cache.rings["summaries"]
    out = attend(q, (keys[:, :, :own], values[:, :, :own]), summaries.view())
    if own == stride:
        summaries.append(k, v)
    return out, cache


def _cache_bytes(s: Shape, stride: int = 128) -> float:
    return kv_bytes(s, min(s.Nk, stride) + s.Nk // stride)


SPEC = MechanismSpec(
    label="Sparse (fixed strided)",
    fn=sparse_attention,
    description="Each token sees its own block plus one 'summary' token from every block: O(n·√n) at stride √n.",
    paper="Child et al. 2019, 'Generating Long Sequences with Sparse Transformers', arXiv 1904.10509",
    params=(Param("stride", 128, 1, 1 << 16, "Block size; every stride-th key is a summary all queries see.",
                  log=True, small=lambda n: max(1, round(math.sqrt(n))), tokens=True),),
    exact=True,
    cost=Cost(flops=_flops, executed_flops=_executed_flops, memory_bytes=_memory, time_big_o="O(n·(s + n/s)·d)",
              memory_big_o="O(n·d + s·(s + n/s))"),
    supports=Supports(
        causal=True,
        cross=False,
        padding=True,
        shared_kv=True,
        generation=Generation(remember=_remember, step=_step, cache_bytes=_cache_bytes,
                              step_big_o="O((s + n/s)·d)", cache_big_o="O((s + n/s)·d)"),
    ),
    insight=Insight(
        pattern=_pattern,
        regime=("local", "gaussian", "With unrelated tokens softmax spreads weight over the whole sequence, and a "
                "fixed pattern drops all of it that falls outside the pattern (the dropped mass)."),
    ),
)
