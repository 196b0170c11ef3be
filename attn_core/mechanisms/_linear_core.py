"""Kernelized attention φ(Q)·(φ(K)ᵀV), non-causal and causal by chunked prefix sums (shared by linear and
Performer; Katharopoulos et al. 2020, arXiv 2006.16236, eq. 4–6)."""
from __future__ import annotations

import torch
import torch.nn.functional as F


def causal_chunk(features: int) -> int:
    """Queries per chunk of the causal form: state size (n/C)·m·D stays ≤ n·D when C ≥ m."""
    return max(64, features)


def linear_attention_core(phi_q: torch.Tensor, phi_k: torch.Tensor, v: torch.Tensor, causal: bool) -> torch.Tensor:
    """out_i = φ(q_i)ᵀ Σ_j φ(k_j) v_jᵀ / φ(q_i)ᵀ Σ_j φ(k_j), over all j (causal: j ≤ i).

    phi_q (B, H, Nq, m), phi_k (B, H, Nk, m), v (B, H, Nk, D) → (B, H, Nq, D). Non-causal: O(n·m·D) time,
    O(m·D) state. Causal: the sequence in chunks of C; within a chunk the masked (C, C) products, across chunks an
    exclusive prefix sum of per-chunk states, (n/C, m, D); never a per-position (n, m, D) tensor.
    """
    if not causal:
        kv = phi_k.transpose(-2, -1) @ v  # (B, H, m, D)
        den = phi_q @ phi_k.sum(-2, keepdim=True).transpose(-2, -1)  # (B, H, Nq, 1)
        return (phi_q @ kv) / den.clamp_min(torch.finfo(den.dtype).tiny)
    B, H, n, m = phi_q.shape
    C = min(causal_chunk(m), n)
    nc = -(-n // C)
    pad = nc * C - n  # zero rows of φ(K) add nothing to any sum; padded query rows are dropped
    qc = F.pad(phi_q, (0, 0, 0, pad)).view(B, H, nc, C, m)
    kc = F.pad(phi_k, (0, 0, 0, pad)).view(B, H, nc, C, m)
    vc = F.pad(v, (0, 0, 0, pad)).view(B, H, nc, C, v.shape[-1])
    kv = kc.transpose(-2, -1) @ vc  # (B, H, nc, m, D): each chunk's own Σ φ(k) vᵀ
    state = kv.cumsum(2).sub_(kv)  # exclusive prefix: the chunks before this one
    ksum = kc.sum(-2)  # (B, H, nc, m)
    zstate = ksum.cumsum(2).sub_(ksum)
    intra = (qc @ kc.transpose(-2, -1)).tril_()  # (B, H, nc, C, C), j ≤ i inside the chunk
    num = intra @ vc + qc @ state
    den = intra.sum(-1, keepdim=True) + qc @ zstate.unsqueeze(-1)
    out = num / den.clamp_min(torch.finfo(den.dtype).tiny)
    return out.view(B, H, nc * C, -1)[:, :, :n]


def linear_core_memory(heads: int, nq: int, nk: int, m: int, d: int, elem: int, causal: bool) -> float:
    """Predicted peak bytes of linear_attention_core above its φ inputs (output included)."""
    if not causal:
        return heads * (2 * nq * d + nq + m * d + m) * elem
    C = min(causal_chunk(m), nq)
    n = -(-nq // C) * C
    return heads * (2 * (n // C) * m * d + n * C + 2 * n * d + 2 * n) * elem
