"""Sigmoid attention: each weight is the sigmoid of its own score, with no normalisation over the keys (Ramapuram
et al. 2024, 'Theory, Analysis, and Best Practices for Sigmoid Self-Attention', arXiv 2409.04431)."""
from __future__ import annotations

import math

import torch

from .. import masks
from ..spec import Cost, Generation, Insight, MechanismSpec, Param, Shape, Supports
from ._cache import KVCache, kv_bytes
from ._common import HALF, check_key_padding, checked_shape, fold, repeated, scale, unfold, workspace

# The score workspace held at once, in elements over all batch·heads: one chunk of query rows against its keys.
CHUNK_ELEMS = 1 << 20


def chunk_rows(bk: int, nq: int, nk: int, device: str = "cpu") -> int:
    """Query rows per chunk: as many as keep bk·rows·Nk within CHUNK_ELEMS (on a GPU, `workspace`'s multiple of it;
    bk = B·Hk: one query head of each group at a time), at least one."""
    return max(1, min(nq, workspace(CHUNK_ELEMS, device) // (bk * nk)))


def _chunks(nq: int, rows: int, causal: bool, nk: int):
    """(start, stop, keys) of each chunk of query rows: keys is Nk, or `stop` when causal (later keys are masked)."""
    for start in range(0, nq, rows):
        stop = min(nq, start + rows)
        yield start, stop, stop if causal else nk


def seen(nq: int, nk: int, causal: bool, key_padding_mask: torch.Tensor | None) -> torch.Tensor:
    """m_i, the keys query i sees, at least 1: (1, Nq), or (B, Nq) with padding; float64. Causal: i + 1 (its
    unpadded keys up to i); otherwise Nk (its unpadded keys)."""
    if key_padding_mask is None:
        m = torch.arange(1, nq + 1) if causal else torch.full((nq,), nk)
        return m.to(torch.float64)[None]
    keep = (~key_padding_mask).to(torch.float64)
    m = keep.cumsum(-1) if causal else keep.sum(-1, keepdim=True).expand(-1, nq)
    return m.clamp_min(1.0)  # a query that sees no key: every weight is masked to 0 anyway


def offsets(nq: int, nk: int, causal: bool, bias: float, like: torch.Tensor,
            key_padding_mask: torch.Tensor | None = None) -> torch.Tensor:
    """b_i = bias − ln m_i (`seen`), (1 or B, Nq) in `like`'s dtype and device."""
    return (bias - torch.log(seen(nq, nk, causal, key_padding_mask))).to(like.device, like.dtype)


def sigmoid_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, *, causal: bool = False, bias: float = 0.0,
                      key_padding_mask: torch.Tensor | None = None) -> torch.Tensor:
    """out_i = Σ_j σ(q_i·k_j/√D + b_i) v_j with b_i = bias − ln m_i, m_i the keys query i sees.

    The paper's bias is b = −ln n for sequences of n tokens (bias = 0 here, non-causal); this library counts the
    keys each query sees, so a causal query i gets −ln(i + 1) and a padded sequence the count of its real keys: a
    prefix, a padded batch and generation step by step then all equal the full forward, row by row. `bias` shifts
    every b_i (bias = ln n − ln n_train gives a fixed b = −ln n_train to a non-causal call on n keys). The weights do
    not sum to 1 over the keys, and nothing renormalises them: padded keys (and, causal, later ones) weigh 0.
    q (B, H, Nq, D), k and v (B, Hk, Nk, D) → (B, H, Nq, D). Query rows in chunks of `chunk_rows`, each against
    its keys (causal: those up to its last row), one query head of each group at a time: one chunk's weights exist
    at a time, at most max(CHUNK_ELEMS, B·Hk·Nk) elements. O(Nq·Nk·D) time, O(n·d) memory in the forward; autograd
    keeps every chunk's weights, O(Nq·Nk) in training. Hk < H: the H/Hk query heads sharing a key/value head take
    their turns against it, read in place, never repeated. A query that sees no unpadded key outputs zeros.
    """
    s = checked_shape(SPEC, q, k, v, causal, bias=bias)
    if key_padding_mask is not None:
        check_key_padding(SPEC, key_padding_mask, q, k)
    b = offsets(s.Nq, s.Nk, causal, bias, q, key_padding_mask)[:, None, :, None]  # (1 or B, 1, Nq, 1)
    out = q.new_empty(q.shape)
    grouped_q, grouped_out = (t.view(s.B, s.key_heads, s.group, s.Nq, s.D) for t in (q.contiguous(), out))
    for start, stop, keys in _chunks(s.Nq, chunk_rows(s.bk, s.Nq, s.Nk, s.device), causal, s.Nk):
        for member in range(s.group):  # the query heads sharing a key/value head, one at a time: views, no copy
            w = _chunk_weights(grouped_q[:, :, member, start:stop], k[:, :, :keys], b[..., start:stop, :],
                               start if causal else None, key_padding_mask)
            grouped_out[:, :, member, start:stop] = _weighted(w, v[:, :, :keys])
            del w  # before the next one is made
    return out


def _weighted(w: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
    """w @ v; half inputs in float32 products (more exact, and no hidden workspace: the CPU's oneDNN half-precision
    product packs its operands in scratch that no allocator record outlives, and copies a batch-strided v first)."""
    if w.dtype in HALF:
        return w.float() @ v.float()
    return w @ v


def _chunk_weights(q: torch.Tensor, k: torch.Tensor, b: torch.Tensor, first: int | None,
                   key_padding_mask: torch.Tensor | None) -> torch.Tensor:
    """σ(q kᵀ/√D + b) for one chunk of query rows q (B, Hk, rows, D) against keys k (B, Hk, keys, D), written in
    place into one (B, Hk, rows, keys) tensor; 0 for padded keys and, when the rows start at `first` (causal), for
    the chunk's own cells above the diagonal."""
    w = (q @ k.transpose(-2, -1)).mul_(scale(q.shape[-1])).add_(b)
    rows = q.shape[-2]
    if first is not None and rows > 1:
        above = torch.ones(rows, rows, dtype=torch.bool, device=q.device).triu_(1)
        w[..., first:first + rows].masked_fill_(above, float("-inf"))
    if key_padding_mask is not None:
        w.masked_fill_(key_padding_mask[:, None, None, :k.shape[-2]], float("-inf"))
    return w.sigmoid_()


def sigmoid_weights(q: torch.Tensor, k: torch.Tensor, causal: bool, bias: float) -> torch.Tensor:
    """σ(Q Kᵀ/√D + b_i) for q (…, Nq, D), k (…, Nk, D) with one leading shape, 0 where j > i when causal: the
    weights themselves, (…, Nq, Nk), rows not summing to 1. Materialized: O(Nq·Nk)."""
    nq, nk = q.shape[-2], k.shape[-2]
    w = torch.sigmoid((q * scale(q.shape[-1])) @ k.transpose(-2, -1) + offsets(nq, nk, causal, bias, q)[0, :, None])
    return w.tril() if causal else w


def _effective(q, k, v, causal: bool, state: dict, bias: float = 0.0) -> tuple[torch.Tensor, torch.Tensor]:
    """The sigmoid weights (B, H, Nq, Nk), causal: j ≤ i, applied to v (shared heads repeated)."""
    k, v = repeated(q, k, v)
    return sigmoid_weights(q, k, causal, bias), v


def _flops(s: Shape, bias: float = 0.0) -> float:
    cells = s.Nq * (s.Nq + 1) / 2 if s.causal else s.Nq * s.Nk  # causal keeps j ≤ i
    return 4.0 * s.bh * cells * s.D  # Q Kᵀ and W V, 2·D each per kept cell


def _chunk_cells(s: Shape) -> tuple[float, int]:
    """(cells the chunks score in all, the most one chunk scores): causal chunks of `rows` rows ending at row r
    score r keys each (their own cells above the diagonal included, then masked)."""
    rows = chunk_rows(s.bk, s.Nq, s.Nk, s.device)
    if not s.causal:
        return s.Nq * s.Nk, rows * s.Nk
    full, rest = divmod(s.Nq, rows)
    total = rows * rows * full * (full + 1) / 2 + rest * s.Nq  # Σ_t rows·(t·rows) over whole chunks, then the last
    return total, max(rows * rows * full, rest * s.Nq)


def _executed_flops(s: Shape, bias: float = 0.0) -> float:
    """Q Kᵀ and W V over every cell the chunks score, for each query head."""
    return 4.0 * s.bh * _chunk_cells(s)[0] * s.D


def _memory(s: Shape, bias: float = 0.0) -> float:
    """The output, the offsets b_i (Nq), and one chunk's weights (B·Hk of them: one query head of each group), at the
    chunk where the peak is largest, with the most that is held beside them: their product with V, or, causal,
    while the scores are masked, the chunk's own cells above the diagonal as a bool (rows, rows) (at n = 700, B = 2,
    Hk = 1: 490 kB, where the product is 224 kB). Half inputs: the weights and the chunk's keys of V also in float32,
    and the product in float32 (`_weighted`)."""
    rows = chunk_rows(s.bk, s.Nq, s.Nk, s.device)
    fixed = s.elem * (s.bh * s.Nq * s.D + s.Nq)
    full, rest = divmod(s.Nq, rows)
    chunks = [(rows, full * rows if s.causal else s.Nk)] if full else []  # (rows, keys) of the largest whole chunk
    if rest:
        chunks.append((rest, s.Nq if s.causal else s.Nk))

    def beside_the_weights(r: int, k: int) -> float:
        if s.dtype in ("float16", "bfloat16"):  # (the float32 copies outweigh the mask: k ≥ r)
            return s.bk * (4 * r * k + 4 * k * s.D + 4 * r * s.D)
        return max(s.elem * s.bk * r * s.D, r * r if s.causal and r > 1 else 0)

    return float(fixed + max(s.elem * s.bk * r * k + beside_the_weights(r, k) for r, k in chunks))


def _remember(k, v, *, max_len: int | None = None, bias: float = 0.0) -> KVCache:
    """Key-value cache of every token, as softmax's: a step reads all of it, O(n·d) time and memory at context n."""
    return KVCache({"bias": bias}, k, v, max_len=max_len)


def _step(q, k, v, cache: KVCache) -> tuple[torch.Tensor, KVCache]:
    """The new token's query against the L cached keys, b = bias − ln L (the keys it sees, as in the causal
    forward): O(L·D). The query heads sharing a key/value head are rows of one query (`fold`)."""
    keys, values = cache.append(k, v)
    weights = sigmoid_weights(fold(q, keys.shape[1]), keys, False, cache.params["bias"])
    return unfold(weights @ values, q.shape[1]), cache


def _cache_bytes(s: Shape, bias: float = 0.0) -> float:
    """K and V of every token so far."""
    return kv_bytes(s, s.Nk)


SPEC = MechanismSpec(
    label="Sigmoid",
    fn=sigmoid_attention,
    description="Each (query, key) weight is σ(q·k/√d + b) on its own, b = −ln n: no softmax, no normalisation over "
                "the keys. Its own model, not an approximation of softmax.",
    paper="Ramapuram et al. 2024, 'Theory, Analysis, and Best Practices for Sigmoid Self-Attention', arXiv 2409.04431",
    params=(Param("bias", 0.0, -20.0, 20.0, "Shift of the bias b = −ln(keys seen) + bias; 0: the paper's b = −ln n.",
                  kind=float),),
    exact=False,
    cost=Cost(flops=_flops, executed_flops=_executed_flops, memory_bytes=_memory, time_big_o="O(n²·d)",
              memory_big_o="O(n·d)"),
    supports=Supports(
        causal=True,
        cross=True,
        padding=True,
        shared_kv=True,
        generation=Generation(remember=_remember, step=_step, cache_bytes=_cache_bytes, step_big_o="O(n·d)",
                              cache_big_o="O(n·d)"),
    ),
    insight=Insight(
        pattern=lambda causal, bias=0.0: masks.causal if causal else masks.full,  # every pair scored
        effective=_effective,
        regime=("gentle", "peaky", "Sigmoid attention is its own model, not an approximation of softmax: each weight "
                "is σ(q·k/√d − ln n) on its own and rows do not sum to 1. Where scores are small (gentle inputs) "
                "every weight is near 1/(n + 1) and the output is near softmax's average; where q·k singles out a "
                "few keys (peaky inputs) their sigmoids saturate at 1 and nothing divides them down."),
        accuracy_note="Sigmoid attention is not an approximation of softmax: these errors are the distance between "
                      "two models, σ(q·k/√d − ln n) weights that no sum normalises and softmax's, not an "
                      "approximation error.",
    ),
)
