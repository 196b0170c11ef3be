"""Additive (Bahdanau) attention: a small network scores each (query, key) pair (Bahdanau, Cho and Bengio 2015,
arXiv 1409.0473)."""
from __future__ import annotations

import math

import torch
from torch.autograd.function import once_differentiable

from .. import masks
from ..spec import Cost, Insight, MechanismSpec, Param, Shape, State, Supports
from ._common import check_key_padding, checked_shape, grouped_matmul, repeated, softmax_or_zeros, workspace

# The workspace held at once, in elements over all batch·heads: one chunk of query rows against every key.
CHUNK_ELEMS = 1 << 20


def chunk_rows(heads: int, nq: int, nk: int, attn_dim: int, device: str = "cpu") -> int:
    """Query rows per chunk: as many as keep the workspace heads·rows·Nk·attn_dim within CHUNK_ELEMS (on a GPU,
    `workspace`'s multiple of it), at least one row. On a CPU a workspace that stays in cache matters more than
    fewer chunks: at n = 2048 (B=1, H=8, attn_dim = 64, one thread) one row a chunk (4 MiB) took 0.77 ns a (pair,
    hidden unit), 2 to 8 rows (8–32 MiB) 0.94–0.98."""
    return max(1, min(nq, workspace(CHUNK_ELEMS, device) // (heads * nk * attn_dim)))


def init_state(shape: Shape, device=None, dtype=torch.float32, *, seed: int = 0, attn_dim: int = 64) -> dict:
    """Seeded weights of the scoring network, shared by batch and heads: {'W_q': (D, attn_dim), 'W_k': (D, attn_dim)}
    with N(0, 1/D) entries (W_qᵀq has unit-variance entries for unit-variance q) and {'w': (attn_dim,)} with
    N(0, 1/attn_dim) entries. The paper learns them; these are a layer at initialisation."""
    SPEC.check_params({"attn_dim": attn_dim}, shape)
    g = torch.Generator().manual_seed(seed)
    w_q, w_k = (torch.randn(shape.D, attn_dim, generator=g) / math.sqrt(shape.D) for _ in range(2))
    w = torch.randn(attn_dim, generator=g) / math.sqrt(attn_dim)
    return {name: t.to(device=device, dtype=dtype) for name, t in (("W_q", w_q), ("W_k", w_k), ("w", w))}


def _chunks(nq: int, step: int, causal: bool, nk: int):
    """(start, stop, keys) of each chunk of query rows: keys is Nk, or `stop` when causal (later keys are masked)."""
    for start in range(0, nq, step):
        stop = min(nq, start + step)
        yield start, stop, stop if causal else nk


def _sigmoid_chunk(pq: torch.Tensor, pk: torch.Tensor, buf: torch.Tensor) -> torch.Tensor:
    """σ(pq_ai + pk_aj) for a chunk, pq (B, H, a, rows), pk (B, Hk, a, keys) → (B, H, a, rows, keys), written into
    the front of the flat workspace `buf` (reused by every chunk: no allocation, and no page faults on the CPU).
    Hidden units lead and keys run along the last axis, so each elementwise pass is over long contiguous rows. Query
    head i adds key/value head ⌊i·Hk/H⌋'s pk by broadcasting, never a repeated copy."""
    B, H, a, rows = pq.shape
    key_heads, keys = pk.shape[1], pk.shape[-1]
    t = buf[: B * H * a * rows * keys].view(B, H, a, rows, keys)
    grouped = (B, key_heads, H // key_heads, a, rows, keys)  # the query heads sharing pk as one axis
    torch.add(pq.unflatten(1, grouped[1:3]).unsqueeze(-1), pk.unsqueeze(2).unsqueeze(-2), out=t.view(grouped))
    return t.sigmoid_()


class _AdditiveScores(torch.autograd.Function):
    """e_ij + Σw = 2·wᵀσ(2x_i + 2y_j), (B, H, Nq, Nk), −inf where j > i when causal: the additive scores
    e_ij = wᵀ tanh(x_i + y_j) up to the constant Σw, which softmax ignores (and so do its gradients).

    Takes pq = 2x (B, H, a, Nq) and pk = 2y (B, Hk, a, Nk), x = W_qᵀq and y = W_kᵀk. tanh(z) = 2σ(2z) − 1 is an
    identity; it is used because the elementwise σ is the whole cost of the kernel and PyTorch's float32 tanh ran
    10 to 50 times slower than its sigmoid on the CPU this was written on (4.6–22 against 0.42–0.46 ns an element,
    one AVX-512 core, torch 2.13). Query rows in chunks of `chunk_rows`: one chunk's (B, H, a, rows, keys) tensor
    exists at a time, in the forward and again, recomputed, in the backward, so neither keeps the (Nq, Nk, a)
    tensor (autograd would save every chunk's)."""

    @staticmethod
    def forward(ctx, pq, pk, w, causal: bool):
        ctx.save_for_backward(pq, pk, w)
        ctx.causal = causal
        B, H, a, nq = pq.shape
        nk = pk.shape[-1]
        scores = pq.new_full((B, H, nq, nk), float("-inf")) if causal else pq.new_empty(B, H, nq, nk)
        step = chunk_rows(B * H, nq, nk, a, pq.device.type)
        buf = pq.new_empty(B * H * step * nk * a)
        for start, stop, keys in _chunks(nq, step, causal, nk):
            sig = _sigmoid_chunk(pq[..., start:stop], pk[..., :keys], buf).view(B, H, a, -1)
            block = (2 * w @ sig).view(B, H, stop - start, keys)
            if causal and stop - start > 1:  # the chunk's own cells above the diagonal
                i = torch.arange(start, stop, device=pq.device)
                block[..., start:stop].masked_fill_(i[:, None] < i[None, :], float("-inf"))
            scores[:, :, start:stop, :keys] = block
            del block  # before the next chunk's is made
        return scores

    @staticmethod
    @once_differentiable
    def backward(ctx, grad):
        """With s = σ(pq_i + pk_j): ∂/∂w = Σ_ij g_ij · 2s; ∂/∂pq_i = Σ_j g_ij · 2w ⊙ s(1 − s); ∂/∂pk_j = Σ_i
        the same, and over the query heads sharing pk_j. Masked cells have g = 0 (softmax passes none to −inf
        scores)."""
        pq, pk, w = ctx.saved_tensors
        B, H, a, nq = pq.shape
        key_heads = pk.shape[1]
        nk = pk.shape[-1]
        d_pq, d_pk, d_w = torch.zeros_like(pq), torch.zeros_like(pk), torch.zeros_like(w)
        step = chunk_rows(B * H, nq, nk, a, pq.device.type)
        buf = pq.new_empty(B * H * step * nk * a)
        for start, stop, keys in _chunks(nq, step, ctx.causal, nk):
            g = grad[:, :, start:stop, :keys].unsqueeze(2)  # (B, H, 1, rows, keys)
            s = _sigmoid_chunk(pq[..., start:stop], pk[..., :keys], buf)
            d_w += 2 * (s.flatten(-2) @ g.flatten(-2).transpose(-2, -1)).sum((0, 1)).squeeze(-1)
            s = s.addcmul_(s, s, value=-1).mul_(g).mul_(2 * w[:, None, None])  # g_ij · 2w ⊙ s(1 − s)
            d_pq[..., start:stop] = s.sum(-1)
            d_pk[..., :keys] += s.unflatten(1, (key_heads, -1)).sum((2, -2))  # over a group's heads and rows
        return d_pq, d_pk, d_w, None


def _projections(q, k, W_q, W_k) -> tuple[torch.Tensor, torch.Tensor]:
    """2·W_qᵀq (B, H, a, Nq) and 2·W_kᵀk (B, Hk, a, Nk), hidden units first (the layout `_AdditiveScores` takes)."""
    return (2 * W_q).T @ q.transpose(-2, -1), (2 * W_k).T @ k.transpose(-2, -1)


def additive_attention(q, k, v, *, causal: bool = False, attn_dim: int = 64, W_q=None, W_k=None, w=None,
                       seed: int = 0, key_padding_mask: torch.Tensor | None = None):
    """softmax_j(wᵀ tanh(W_qᵀ q_i + W_kᵀ k_j)) V: Bahdanau's alignment model (arXiv 1409.0473, eq. 6 and appendix
    A.1.2) with q_i in place of the decoder state and k_j of the annotation; no 1/√D scaling (tanh bounds the score
    by ‖w‖₁).

    q (B, H, Nq, D), k, v (B, Hk, Nk, D) → (B, H, Nq, D); W_q, W_k (D, attn_dim) and w (attn_dim) from
    `init_state`, shared by batch and heads, drawn here from `seed` when absent. Hk < H (grouped-query attention):
    W_kᵀk is made once per key/value head and added to the H/Hk query heads sharing it by broadcasting, and the
    weights of a group meet its values as rows of one product (`grouped_matmul`): no key or value repeated, and
    less work than multi-head attention. Causal: query i sees key j iff j ≤ i.
    Materialized like textbook softmax: the (Nq, Nk) scores and their softmax exist; the (Nq, Nk, attn_dim) tensor
    of hidden units does not: it is built in chunks of query rows (`chunk_rows`), at most
    max(CHUNK_ELEMS, B·H·Nk·attn_dim) elements at a time, in the backward too. O(Nq·Nk·(attn_dim + D)) time,
    O(Nq·Nk) memory. `key_padding_mask` (B, Nk) boolean, True where the key is padding: those scores are −∞, and a
    query that sees no unpadded key outputs zeros.
    """
    shape = checked_shape(SPEC, q, k, v, causal, attn_dim=attn_dim)
    if W_q is None or W_k is None or w is None:
        state = init_state(shape, q.device, q.dtype, seed=seed, attn_dim=attn_dim)
        W_q, W_k, w = (state[name] if t is None else t for name, t in (("W_q", W_q), ("W_k", W_k), ("w", w)))
    for name, t, want in (("W_q", W_q, (shape.D, attn_dim)), ("W_k", W_k, (shape.D, attn_dim)), ("w", w, (attn_dim,))):
        if t.shape != want:
            raise ValueError(f"{name} must have shape {want}, got {tuple(t.shape)}")
    scores = _AdditiveScores.apply(*_projections(q, k, W_q, W_k), w, causal)
    if key_padding_mask is not None:
        check_key_padding(SPEC, key_padding_mask, q, k)
        return softmax_or_zeros(scores.masked_fill(key_padding_mask[:, None, None, :], float("-inf")), v)
    weights = torch.softmax(scores, dim=-1)
    del scores
    return grouped_matmul(weights, v)


def _effective(q, k, v, causal: bool, state: dict, attn_dim: int = 64) -> tuple[torch.Tensor, torch.Tensor]:
    """softmax of the additive scores (B, H, Nq, Nk), causal: j ≤ i, applied to v (shared heads repeated)."""
    k, v = repeated(q, k, v)
    scores = _AdditiveScores.apply(*_projections(q, k, state["W_q"], state["W_k"]), state["w"], causal)
    return torch.softmax(scores, dim=-1), v


def _chunk_cells(s: Shape, rows: int) -> tuple[float, int]:
    """(pairs the chunks score in all, the most one chunk scores): causal chunks of `rows` rows ending at row r
    score r keys each (their own upper triangle included, then masked)."""
    if not s.causal:
        return s.Nq * s.Nk, min(rows, s.Nq) * s.Nk
    full, rest = divmod(s.Nq, rows)
    total = rows * rows * full * (full + 1) / 2 + rest * s.Nq  # Σ_t rows·(t·rows) over whole chunks, then the last
    return total, max(rows * rows * full, rest * s.Nq)


def _work(s: Shape, attn_dim: int, scored: float) -> float:
    """The projections W_qᵀq per query head and W_kᵀk per key/value head (2·D·attn_dim per token); per scored pair
    attn_dim additions, attn_dim tanh (one op each; the kernel evaluates it as a sigmoid) and the dot product with w
    (2·attn_dim). P·V is added by the callers."""
    return 2.0 * (s.bh * s.Nq + s.bk * s.Nk) * s.D * attn_dim + s.bh * 4.0 * attn_dim * scored


def _flops(s: Shape, attn_dim: int = 64) -> float:
    """Useful work: the pairs the pattern keeps (all, or j ≤ i), P·V on those alone. Softmax not counted."""
    kept = s.Nq * (s.Nq + 1) / 2 if s.causal else s.Nq * s.Nk
    return _work(s, attn_dim, kept) + s.bh * 2.0 * s.D * kept


def _executed_flops(s: Shape, attn_dim: int = 64) -> float:
    """Causal: each chunk also scores its own cells above the diagonal, and P·V multiplies every (Nq, Nk) cell."""
    scored, _ = _chunk_cells(s, chunk_rows(s.bh, s.Nq, s.Nk, attn_dim, s.device))
    return _work(s, attn_dim, scored) + s.bh * 2.0 * s.D * s.Nq * s.Nk


def _elementwise_flops(s: Shape, attn_dim: int = 64) -> float:
    """The elementwise part of the executed FLOPs: per scored pair, attn_dim additions and attn_dim tanh (2·attn_dim;
    the dot product with w is a matmul)."""
    return s.bh * 2.0 * attn_dim * _chunk_cells(s, chunk_rows(s.bh, s.Nq, s.Nk, attn_dim, s.device))[0]


def _memory(s: Shape, attn_dim: int = 64) -> float:
    """Scoring: the scores, W_qᵀq (per query head) and W_kᵀk (per key/value head), the hidden-unit workspace
    (rows·Nk·attn_dim, rows = `chunk_rows`) and one chunk's scores; then the scores and their softmax, the textbook
    peak; then the softmax and the output."""
    a = attn_dim
    rows = chunk_rows(s.bh, s.Nq, s.Nk, a, s.device)
    scoring = s.bh * (s.Nq * s.Nk + s.Nq * a + rows * s.Nk * a + _chunk_cells(s, rows)[1]) + s.bk * s.Nk * a
    return s.elem * max(scoring, s.bh * max(2 * s.Nq * s.Nk, s.Nq * s.Nk + s.Nq * s.D))


SPEC = MechanismSpec(
    label="Additive (Bahdanau)",
    fn=additive_attention,
    description="Scores each (query, key) pair with a small network, wᵀ tanh(W_q q + W_k k), instead of q·k: "
                "its own mechanism, not an approximation of softmax; n² pairs, each attn_dim tanh.",
    paper="Bahdanau, Cho and Bengio 2015, 'Neural Machine Translation by Jointly Learning to Align and Translate', "
          "arXiv 1409.0473",
    params=(Param("attn_dim", 64, 1, 1024, "Width of the scoring network's hidden layer (tanh units per pair).",
                  log=True, small=lambda n: 16),),
    exact=False,
    state=State(init=init_state, keys=("W_q", "W_k", "w")),
    cost=Cost(flops=_flops, executed_flops=_executed_flops, elementwise_flops=_elementwise_flops, memory_bytes=_memory,
              time_big_o="O(n²·(a + d))",
              memory_big_o="O(n²)"),
    supports=Supports(
        no_rope_relative="Its score w·tanh(W q + U k) is no dot product: the rotations of q and k do not cancel.",
        causal=True,
        cross=True,
        padding=True,
        shared_kv=True,
        no_generation="It could keep a cache of W_k k for every key, as softmax keeps its keys, but this library has "
                      "no such cache for it yet.",
    ),
    insight=Insight(
        pattern=lambda causal, attn_dim=64, **weights: masks.causal if causal else masks.full,  # every pair scored
        effective=_effective,
        regime=("gentle", "peaky", "Additive attention is its own scoring function, not an approximation of softmax: "
                "with random, untrained W_q, W_k and w its scores do not follow q·k. Where softmax spreads its weight "
                "evenly (gentle inputs) both average the values alike; where q·k singles out a few keys (peaky inputs) "
                "the additive scores cannot know which."),
        accuracy_note="Additive attention is not an approximation of softmax: these errors are the distance between "
                      "two scoring functions, wᵀ tanh(W_q q + W_k k) with random, untrained weights (the paper learns "
                      "them) and q·k/√d, not an approximation error.",
    ),
)
