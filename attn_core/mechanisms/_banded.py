"""Exact attention for banded patterns, block by block, without any n×n tensor (shared by local and sliding window)."""
from __future__ import annotations

import math

import torch
import torch.nn.functional as F

from ..masks import Pattern

# Scores held at once per chunk of query blocks, in elements (over all batch·heads): bounds the workspace.
CHUNK_ELEMS = 1 << 21


def chunk_blocks(heads: int, block: int, span: int) -> int:
    """How many query blocks one chunk processes: as many as keep heads·c·block·span ≤ CHUNK_ELEMS."""
    return max(1, CHUNK_ELEMS // (heads * block * span))


def _key_slab(x: torch.Tensor, start: int, stop: int) -> torch.Tensor:
    """x[:, :, start:stop] along the sequence, zero rows where [start, stop) leaves [0, n)."""
    n = x.shape[-2]
    inside = x[:, :, max(start, 0):min(stop, n)]
    if start >= 0 and stop <= n:
        return inside
    return F.pad(inside, (0, 0, max(0, -start), max(0, stop - n)))


def banded_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, *, pattern: Pattern, block: int,
                     left: int, right: int) -> torch.Tensor:
    """softmax(Q Kᵀ/√D masked by `pattern`) V for self-attention, q, k, v (B, H, n, D) → (B, H, n, D).

    Query block β (rows [β·block, (β+1)·block)) may only see keys in [β·block − left, (β+1)·block + right): a
    window of S = left + block + right keys taken as a strided view. Within it the allowed cells are the same for
    every block (the pattern is invariant under shifts by `block`), so one (block, S) mask serves all; keys
    outside [0, n) are masked per block. Chunks of query blocks bound the workspace to about CHUNK_ELEMS scores.
    O(n·S·D) time, O(n·D) memory.
    """
    B, H, n, D = q.shape
    span = left + block + right
    n_blocks = math.ceil(n / block)
    base = block * math.ceil(left / block)  # a block-aligned query position with every window key at ≥ 0
    r = torch.arange(block, device=q.device)[:, None]
    t = torch.arange(span, device=q.device)[None, :]
    keep = pattern(base + r, base - left + t)  # (block, S), the same for every block
    neg = torch.finfo(q.dtype).min / 2  # finite: a padded query row with no visible key must not produce NaN
    inner_bias = torch.zeros(block, span, dtype=q.dtype, device=q.device).masked_fill_(~keep, neg)
    out = q.new_empty(B, H, n, D)
    step = chunk_blocks(B * H, block, span)
    for first in range(0, n_blocks, step):
        c = min(step, n_blocks - first)
        qs, qe = first * block, min(n, (first + c) * block)
        qc = F.pad(q[:, :, qs:qe], (0, 0, 0, c * block - (qe - qs))) * (1.0 / math.sqrt(D))
        ks = qs - left
        kw = _key_slab(k, ks, qs + c * block + right).unfold(2, span, block)  # (B, H, c, D, S) view
        vw = _key_slab(v, ks, qs + c * block + right).unfold(2, span, block)
        bias = inner_bias
        if ks < 0 or qs + c * block + right > n:  # edge chunk: mask the zero-padded keys
            pos = ks + block * torch.arange(c, device=q.device)[:, None, None] + t  # (c, 1, S)
            bias = inner_bias.masked_fill((pos < 0) | (pos >= n), neg)
        p = torch.softmax((qc.view(B, H, c, block, D) @ kw).add_(bias), dim=-1)  # (B, H, c, block, S)
        out[:, :, qs:qe] = (p @ vw.transpose(-1, -2)).view(B, H, c * block, D)[:, :, : qe - qs]
    return out
