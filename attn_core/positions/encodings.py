"""Positional encodings: how attention, which by itself ignores word order, is told where each token stands.

Added to the embeddings: sinusoidal (Vaswani et al. 2017, arXiv 1706.03762) and learned. In the scores: relative
(Shaw et al. 2018, arXiv 1803.02155) and ALiBi (Press et al. 2021, arXiv 2108.12409), both additive score biases for a
mechanism whose spec has `supports.score_bias`. On q and k before any mechanism: RoPE (Su et al. 2021, arXiv
2104.09864; attn_core.positions.rope). A kernel-feature mechanism (linear, Performer) still runs on rotated q and k, but its
score φ(q)·φ(k) is no longer a function of the rotation's difference: RoPE's relative property is lost there.
"""
from __future__ import annotations

import math

import torch

from attn_core.positions import rope as _rope


def _sizes(**values: int) -> None:
    """ValueError naming the first of `values` that is not a positive integer (seed and max_distance may be 0)."""
    for name, value in values.items():
        low = 0 if name in ("seed", "max_distance") else 1
        if isinstance(value, bool) or not isinstance(value, int) or value < low:
            raise ValueError(f"{name} must be an integer ≥ {low}, got {value!r}")


def sinusoidal(n: int, d: int, *, base: float = 10000.0, dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """(n, d) table PE[p, 2i] = sin(p / base^(2i/d)), PE[p, 2i+1] = cos(p / base^(2i/d)), d even (Vaswani et al.
    2017, §3.5). Bounded in [−1, 1]; each row distinct; PE[p + k] is a fixed linear map of PE[p] (a rotation of each
    (sin, cos) pair by k / base^(2i/d)). Added to the embeddings. O(n·d) time and memory."""
    _sizes(n=n, d=d)
    if d % 2:
        raise ValueError(f"the sinusoidal code pairs a sine with a cosine, so d must be a positive even integer; "
                         f"got {d}")
    if isinstance(base, bool) or not isinstance(base, (int, float)) or not math.isfinite(base) or base <= 1:
        raise ValueError(f"base must be a finite number above 1 (the paper uses 10000), got {base!r}")
    pos = torch.arange(n, dtype=torch.float64)[:, None]
    freq = base ** (-torch.arange(0, d, 2, dtype=torch.float64) / d)  # (d/2,)
    table = torch.stack((torch.sin(pos * freq), torch.cos(pos * freq)), dim=-1)  # (n, d/2, 2)
    return table.flatten(-2).to(dtype)


def learned(n: int, d: int, seed: int = 0, *, dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """(n, d) table of one vector per position, N(0, 1) entries seeded by `seed`: what training starts from (GPT-2,
    BERT learn theirs). It fits whatever order the data shows, but a position ≥ n has no row: no extrapolation past
    the trained length. O(n·d)."""
    _sizes(n=n, d=d, seed=seed)
    return torch.randn(n, d, generator=torch.Generator().manual_seed(seed), dtype=torch.float64).to(dtype)


def relative_bias(n_q: int, n_k: int, max_distance: int = 4, *, heads: int = 1, seed: int = 0,
                  table: torch.Tensor | None = None, dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """(heads, n_q, n_k) score bias b[h, i, j] = r_h[clip(j − i, −K, K)], K = max_distance: one learned number per
    head and clipped offset, added to q_i·k_j / √d. Shaw et al. 2018 (arXiv 1803.02155) learn a vector a_{j−i} per
    clipped offset and add q_i·a_{j−i}; this is its scalar form (T5 likewise learns one scalar per head and, bucketed,
    offset: Raffel et al. 2020, arXiv 1910.10683). `table` (heads, 2K + 1), column K + o for offset o; None:
    seeded N(0, 1) entries. Offsets past K share one value, so the encoding extends to any length.
    O(heads·n_q·n_k)."""
    _sizes(n_q=n_q, n_k=n_k, max_distance=max_distance, heads=heads)
    width = 2 * max_distance + 1
    if table is None:
        _sizes(seed=seed)
        table = torch.randn(heads, width, generator=torch.Generator().manual_seed(seed), dtype=torch.float64)
    elif not isinstance(table, torch.Tensor) or tuple(table.shape) != (heads, width):
        got = tuple(table.shape) if isinstance(table, torch.Tensor) else type(table).__name__
        raise ValueError(f"table must be a tensor (heads, 2·max_distance + 1) = ({heads}, {width}), got {got}")
    offset = torch.arange(n_k)[None, :] - torch.arange(n_q)[:, None]  # (n_q, n_k): j − i
    return table[:, offset.clamp(-max_distance, max_distance) + max_distance].to(dtype)


def rope(x: torch.Tensor, positions: torch.Tensor, base: float = 10000.0) -> torch.Tensor:
    """RoPE on x (..., n, d), d even: feature pair (2i, 2i+1) of the token at position p turned by p·base^(−2i/d);
    ⟨rope(q, i), rope(k, j)⟩ depends on i − j only, and norms are kept. Apply to q and k before any mechanism.
    attn_core.positions.rope.rotate, the implementation multi-head latent attention uses. O(n·d)."""
    return _rope.rotate(x, positions, base=base)


def _power_of_two_slopes(heads: int) -> list[float]:
    return [2.0 ** (-8.0 * (h + 1) / heads) for h in range(heads)]


def alibi_slopes(heads: int) -> torch.Tensor:
    """(heads,) float64 slopes m_h = 2^(−8(h+1)/H), h = 0 … H−1 (Press et al. 2021, arXiv 2108.12409, §3): 1/2 …
    1/256 for H = 8. H not a power of two, as the paper's code does: the slopes of P, the largest power of two
    below H, then for the H − P heads left the slopes 2^(−8(2k+1)/(2P)), k = 0, 1, … of 2P heads, which fall
    between P's."""
    _sizes(heads=heads)
    low = 2 ** int(math.floor(math.log2(heads)))
    slopes = _power_of_two_slopes(low)
    if low < heads:
        slopes += _power_of_two_slopes(2 * low)[0::2][:heads - low]
    return torch.tensor(slopes, dtype=torch.float64)


def alibi_bias(heads: int, n_q: int, n_k: int, *, dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """(heads, n_q, n_k) score bias −m_h·|i − j| (slopes from `alibi_slopes`): a per-head linear penalty on distance,
    no parameters, added to q·k / √d; no position is added to the embeddings. Query i stands at position
    i + n_k − n_q (the queries are the last n_q positions of the keys', as when decoding; i itself when n_q = n_k).
    Causal models see only j ≤ i, where this is the paper's −m·(i − j). O(heads·n_q·n_k)."""
    _sizes(heads=heads, n_q=n_q, n_k=n_k)
    distance = (torch.arange(n_q)[:, None] + (n_k - n_q) - torch.arange(n_k)[None, :]).abs()
    return (-alibi_slopes(heads)[:, None, None] * distance).to(dtype)
