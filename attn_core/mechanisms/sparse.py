"""Fixed strided sparse attention (Sparse Transformer, Child et al. 2019, arXiv 1904.10509)."""
from __future__ import annotations

import math

import torch
import torch.nn.functional as F

from .. import masks
from ..spec import MechanismSpec, Param, Shape
from ._banded import chunk_blocks
from ._common import checked_shape


def sparse_attention(q, k, v, *, causal: bool = False, stride: int = 128):
    """Exact attention under the 'fixed' pattern: query i sees key j iff ⌊i/s⌋ = ⌊j/s⌋ (its block of size s =
    stride) or j mod s = s − 1 (a summary key); causal also needs j ≤ i.

    q, k, v (B, H, n, D) → (B, H, n, D). Each block of queries is scored against its own block and the n/s summary
    keys (those of its own block counted once), one joint softmax over both. O(n·(s + n/s)·d) time, O(n·(s + n/s))
    memory for the scores, processed in chunks of blocks; s ≈ √n gives O(n·√n).
    """
    shape = checked_shape(SPEC, q, k, v, causal, stride=stride)
    B, H, n, D = q.shape
    s = min(stride, n)
    nb = math.ceil(n / s)
    pad = nb * s - n
    qb = F.pad(q, (0, 0, 0, pad)).view(B, H, nb, s, D)
    kb = F.pad(k, (0, 0, 0, pad)).view(B, H, nb, s, D)
    vb = F.pad(v, (0, 0, 0, pad)).view(B, H, nb, s, D)
    ksum, vsum = k[:, :, s - 1::s], v[:, :, s - 1::s]  # (B, H, m, D): summary keys, m = ⌊n/s⌋
    m = ksum.shape[-2]
    neg = torch.finfo(q.dtype).min / 2
    r = torch.arange(s, device=q.device)
    local_ok = (r[None, :] < s - pad) | (torch.arange(nb, device=q.device)[:, None, None] < nb - 1)  # (nb, 1, s)
    if causal:
        local_ok = local_ok & (r[None, :] <= r[:, None])  # (nb, s, s)
    beta, u = torch.arange(nb, device=q.device)[:, None, None], torch.arange(m, device=q.device)
    summary_ok = (u < beta) if causal else (u != beta)  # (nb, 1, m): own block's summary is in the local part
    bias = torch.cat([torch.zeros(local_ok.shape, dtype=q.dtype, device=q.device).masked_fill_(~local_ok, neg)
                      .expand(nb, s, s), torch.zeros(summary_ok.shape, dtype=q.dtype, device=q.device)
                      .masked_fill_(~summary_ok, neg).expand(nb, s, m)], dim=-1)  # (nb, s, s + m)
    out = q.new_empty(B, H, nb * s, D)
    step = chunk_blocks(B * H, s, s + m)
    for a in range(0, nb, step):
        z = slice(a, min(nb, a + step))
        qc = qb[:, :, z] * (1.0 / math.sqrt(D))
        scores = torch.cat([qc @ kb[:, :, z].transpose(-1, -2), qc @ ksum[:, :, None].transpose(-1, -2)], dim=-1)
        p = torch.softmax(scores.add_(bias[z]), dim=-1)  # (B, H, c, s, s + m)
        o = p[..., :s] @ vb[:, :, z] + p[..., s:] @ vsum[:, :, None]
        out[:, :, a * s:z.stop * s] = o.flatten(2, 3)
    return out[:, :, :n]


def _pattern(causal: bool, stride: int = 128) -> masks.Pattern:
    return masks.strided(stride) & masks.causal if causal else masks.strided(stride)


def _flops(s: Shape, stride: int = 128) -> float:
    st = min(stride, s.Nq)
    keys = st + s.Nq // st - 1 if not s.causal else (st + 1) / 2 + (s.Nq // st) / 2
    return 4.0 * s.heads * s.Nq * keys * s.D


def _memory(s: Shape, stride: int = 128) -> float:
    st = min(stride, s.Nq)
    nb, m = -(-s.Nq // st), s.Nq // st
    rows = min(chunk_blocks(s.heads, st, st + m), nb) * st
    padded = 3 * s.heads * (nb * st - s.Nq) * s.D * s.elem if nb * st != s.Nq else 0
    # Output (padded length), the chunk's scores and probabilities, the mask bias, padded copies of q, k, v.
    return (s.heads * nb * st * s.D * s.elem + 2 * s.heads * rows * (st + m) * s.elem
            + nb * st * (st + m) * s.elem + padded)


SPEC = MechanismSpec(
    key="sparse",
    label="Sparse (fixed strided)",
    fn=sparse_attention,
    description="Each token sees its own block plus one 'summary' token from every block: O(n·√n) at stride √n.",
    paper="Child et al. 2019, 'Generating Long Sequences with Sparse Transformers', arXiv 1904.10509",
    params=(Param("stride", 128, 1, 1 << 16, "Block size; every stride-th key is a summary all queries see.",
                  log=True),),
    exact=True,
    supports_causal=True,
    supports_cross=False,
    time_big_o="O(n·(s + n/s)·d)",
    memory_big_o="O(n·(s + n/s))",
    flops=_flops,
    memory_bytes=_memory,
    pattern=_pattern,
)
