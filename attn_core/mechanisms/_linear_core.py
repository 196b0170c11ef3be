"""Kernelized attention φ(Q)·(φ(K)ᵀV), non-causal and causal by chunked prefix sums (shared by linear and
Performer; Katharopoulos et al. 2020, arXiv 2006.16236, eq. 4–6)."""
from __future__ import annotations

import math

import torch
import torch.nn.functional as F


def causal_chunk(m: int, d: int) -> int:
    """Positions per chunk of the causal form. The chunk states hold (n/C)·m·d numbers and the masked in-chunk
    products n·C, so C ≈ √(m·d) balances them (a power of two in [32, 256])."""
    return 1 << max(5, min(8, round(math.log2(math.sqrt(m * d)))))


def exclusive_prefix_sum(x: torch.Tensor) -> torch.Tensor:
    """out[:, :, i] = Σ_{j < i} x[:, :, j] along dim 2. A loop of contiguous slab additions: torch.cumsum along a
    middle dimension runs about 10× slower here on the CPU (132 ms against 13 ms for (1, 8, 256, 64, 64))."""
    out = torch.zeros_like(x)
    for i in range(1, x.shape[2]):
        out[:, :, i] = out[:, :, i - 1] + x[:, :, i - 1]
    return out


HALF = (torch.float16, torch.bfloat16)


def work_dtype(dtype: torch.dtype) -> torch.dtype:
    """float32 for float16/bfloat16, else `dtype`: the precision the feature maps and sums over keys run in."""
    return torch.float32 if dtype in HALF else dtype


def linear_attention_core(phi_q: torch.Tensor, phi_k: torch.Tensor, v: torch.Tensor, causal: bool) -> torch.Tensor:
    """out_i = φ(q_i)ᵀ Σ_j φ(k_j) v_jᵀ / φ(q_i)ᵀ Σ_j φ(k_j), over all j (causal: j ≤ i).

    phi_q (B, H, Nq, m), phi_k (B, H, Nk, m), v (B, H, Nk, D) → (B, H, Nq, D) in v's dtype. Non-causal: O(n·m·D)
    time, O(m·D) state. Causal: the sequence in chunks of C; within a chunk the masked (C, C) products, across chunks
    an exclusive prefix sum of per-chunk states, (n/C, m, D); never a per-position (n, m, D) tensor.
    float16/bfloat16 run in float32 (`work_dtype`), cast back at the end: in half precision φ(q)·Σφ(k) overflows
    (float16 passes 65504 once n·D nears 6·10⁴) and the causal prefix sums lose the early rows (float16 Performer:
    max error 3.3 against float64, 4·10⁻⁶ in float32).
    """
    out_dtype = v.dtype
    work = work_dtype(out_dtype)
    phi_q, phi_k, v = phi_q.to(work), phi_k.to(work), v.to(work)  # no copy unless half
    if not causal:
        kv = phi_k.transpose(-2, -1) @ v  # (B, H, m, D)
        den = phi_q @ phi_k.sum(-2, keepdim=True).transpose(-2, -1)  # (B, H, Nq, 1)
        return ((phi_q @ kv) / den.clamp_min(torch.finfo(den.dtype).tiny)).to(out_dtype)
    B, H, n, m = phi_q.shape
    C = min(causal_chunk(m, v.shape[-1]), n)
    nc = -(-n // C)
    if nc * C != n:  # zero rows of φ(K) add nothing to any sum; padded query rows are dropped
        phi_q, phi_k, v = (F.pad(x, (0, 0, 0, nc * C - n)) for x in (phi_q, phi_k, v))
    qc, kc, vc = phi_q.view(B, H, nc, C, m), phi_k.view(B, H, nc, C, m), v.view(B, H, nc, C, v.shape[-1])
    kv = kc.transpose(-2, -1) @ vc  # (B, H, nc, m, D): each chunk's own Σ φ(k) vᵀ
    state = exclusive_prefix_sum(kv)  # the chunks before this one
    del kv
    zstate = exclusive_prefix_sum(kc.sum(-2))  # (B, H, nc, m)
    intra = (qc @ kc.transpose(-2, -1)).tril_()  # (B, H, nc, C, C), j ≤ i inside the chunk
    den = intra.sum(-1, keepdim=True).add_(qc @ zstate.unsqueeze(-1))
    num = intra @ vc
    del intra
    num = num.add_(qc @ state)
    out = (num / den.clamp_min(torch.finfo(den.dtype).tiny)).view(B, H, nc * C, -1)[:, :, :n]
    return out.to(out_dtype)


def linear_core_flops(heads: int, nq: int, nk: int, m: int, d: int, causal: bool, *, executed: bool = False) -> float:
    """Matmul FLOPs of linear_attention_core with φ of width m. Both forms: the state φ(K)ᵀV (2·Nk·m·D), its product
    with φ(Q) (2·Nq·m·D), the normalizer φ(Q)·Σφ(K) (2·Nq·m). Causal adds the in-chunk products φ(Q_c)φ(K_c)ᵀ and
    their product with V_c, 2·(m + D) per cell: useful counts the cells j ≤ i of the real positions, `executed` every
    chunk's full C×C block and all the work of the zero rows that pad n to whole chunks."""
    if not causal:
        return heads * (2.0 * nk * m * d + 2.0 * nq * m * d + 2.0 * nq * m)
    C = min(causal_chunk(m, d), nq)
    if executed:
        return heads * -(-nq // C) * C * (4.0 * m * d + 2.0 * m + 2.0 * C * (m + d))
    full, rest = divmod(nq, C)
    cells = full * C * (C + 1) / 2 + rest * (rest + 1) / 2  # in-chunk pairs with j ≤ i
    return heads * (nq * (4.0 * m * d + 2.0 * m) + 2.0 * cells * (m + d))


def linear_core_memory(heads: int, nq: int, m: int, d: int, elem: int, causal: bool, nk: int | None = None) -> float:
    """Predicted peak bytes of linear_attention_core above its φ inputs (output included), from the order in
    which it allocates: the largest set of tensors alive at once. Half precision (elem 2) takes float32 φ, works in
    float32 on a float32 copy of v (Nk·D) and ends with the cast of the output (Nq·D·elem)."""
    w = max(elem, 4)  # bytes of the work dtype
    copy = (nk or nq) * d if elem < w else 0  # in numbers of w bytes
    cast = nq * d * elem / w if elem < w else 0
    if not causal:
        return heads * (copy + m * d + m + 2 * nq + 2 * nq * d) * w
    C = min(causal_chunk(m, d), nq)
    n = -(-nq // C) * C
    state, zs, intra, nd = (n // C) * m * d, (n // C) * m, n * C, n * d
    alive = max(2 * state,  # the exclusive prefix sum beside the per-chunk states
                state + zs + intra + n + nd,  # in-chunk products and their sums, the numerator
                state + zs + n + 2 * nd,  # numerator and the contribution of earlier chunks
                state + zs + 2 * n + 2 * nd,  # the division into the output
                state + zs + n + 2 * nd + cast)  # its cast back to half precision
    if n != nq:  # zero-padded copies of φ(Q), φ(K) and V replace the φ inputs (and the copy of v)
        return heads * max(copy + n * (2 * m + d), (n - nq) * 2 * m + nd + alive) * w
    return heads * (copy + alive) * w
