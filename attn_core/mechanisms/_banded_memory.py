"""What banded attention costs (_banded.py): the peak bytes of `banded_attention` and `dense_rows` above their inputs,
phase by phase in the order they allocate, and the FLOPs banded attention executes."""
from __future__ import annotations

import math

from .. import native
from ..spec import Shape
from ._banded import chunk_blocks, dense_slab, edge_keys, edges, interior, same_ends, windows_cover
from .sdpa import SPEC as SDPA


def banded_memory(s: Shape, *, block: int, left: int, right: int, extra: int = 0, joined: bool = True,
                  sinks: bool = False, whole: bool = False) -> float:
    """Predicted peak bytes of banded_attention above its inputs (s.Nq = n; r = H/Hk query heads a key/value head):
    the output held throughout (the (block, S) bias is `window_bias`'s, made by the first call and kept), then the
    largest of the phases: our band kernel's threads' scratch where it takes every block (`takes_band`, the rows written
    in place, the ends too: nothing else); else the interior blocks (`_fused`: what the fused kernel allocates, the sdpa
    spec's prediction for B·Hk problems of c blocks of block rows against S keys), then the ends (`_ends_bytes` where
    both go in one call, else `_edge_bytes` for each). With `extra` keys joined afterwards (`joined`, as on a CPU
    without gradients): their keys and values and each row's log-sum-exp held throughout, and the join (`_join_bytes`);
    not joined (`_merged`): the first chunk's, as `_chunk_bytes` says. `sinks` (on a CPU without gradients, no padding):
    the same calls, each handing back its rows' log-sum-exp, which become their weights as the rows are written
    (`_write`): nothing more at the peak, the ends called per query head of a group where they are not one call.
    `whole`: the band keeps every key of each block's window (block-local, not causal), so an end whose blocks' windows
    cover its keys writes no bias (`_banded.edge_bias`)."""
    span, elem, d = left + block + right, s.elem, s.D
    n_blocks = -(-s.Nq // block)
    base = s.bh * s.Nq * d * elem
    if extra and not joined:  # every block in chunks: the first holds most, and passes an end when it starts
        # before 0 or reaches past n
        rows = min(chunk_blocks(s.bh, block, span + extra), n_blocks) * block
        return base + _chunk_bytes(s, n_blocks, block, left, right, extra, left > 0 or rows + right > s.Nq)
    if takes_band(s, left, right, extra, sinks):  # our kernel writes every block's rows in place, the ends too
        return float(base + native.band_scratch_bytes(d, span, block, s.bh * n_blocks))
    lo, hi = interior(s.Nq, block, left, right)
    peak = SDPA.cost.memory_bytes(Shape(s.bk, hi - lo, block, span, d, dtype=s.dtype)) if hi > lo else 0.0
    ends = edges(s.Nq, block, left, right)
    if not extra and s.group == 1 and same_ends(s.Nq, block, left, right):  # both ends in one call
        bare = whole and all(covers(s.Nq, a, e, block, left, right) for a, e in ends)
        peak = max(peak, _ends_bytes(s, *ends[0], left, right, bare))
    else:
        for a, e in ends:
            bare = whole and covers(s.Nq, a, e, block, left, right)
            peak = max(peak, _edge_bytes(s, a, e, left, right, bool(extra) or sinks, bare))
    if extra and sinks:  # the joint log-sum-exp's weights after the join
        peak = max(peak, _sink_bytes(s))
    if extra:  # the extra keys and values (B, Hk, g, D) and each row's log-sum-exp held throughout
        peak = max(peak, _join_bytes(s, extra)) + s.bh * s.Nq * _lse_bytes(s) + 2 * s.bk * extra * d * elem
    return base + peak


def takes_band(s: Shape, left: int, right: int, extra: int, sinks: bool) -> bool:
    """Whether every block goes to our band kernel (`_banded.uses_band`): float32 on a CPU whose library has it, D a
    multiple of its lanes (`native.BAND_LANES`), a window past the block's own keys, no extra keys joined and no
    sinks (gradients not asked for, as the memory models assume)."""
    return (s.device == "cpu" and s.dtype == "float32" and s.D % native.BAND_LANES == 0 and bool(left or right)
            and not extra and not sinks and native.band_expected())


def _lse_bytes(s: Shape) -> int:
    return 8 if s.dtype == "float64" else 4


def _sink_bytes(s: Shape) -> float:
    """The sink weights σ(ℓ − a) beside the log-sum-exp (`sink_weight`): ℓ − a and its sigmoid, (B, H, n) each in
    the log-sum-exp's dtype, and a copy in the inputs' dtype where that differs."""
    w = _lse_bytes(s)
    return s.bh * s.Nq * (2 * w + (s.elem if s.elem != w else 0))


def _join_bytes(s: Shape, g: int) -> float:
    """Peak bytes of `_join_extra` beside the output and the log-sum-exp: the (n, g) pattern's index arithmetic
    (two int64 tables and a few flags) beside its bias, then the bias beside the scores (B·H·n·g, in the inputs'
    dtype, then the log-sum-exp's) and two (B, H, n) rows: the maxima, then m, then the totals."""
    n, w = s.Nq, _lse_bytes(s)
    copy = s.elem if s.elem != w else 0
    return max(n * g * (16 + 3 + w), n * g * w + s.bh * n * g * (w + copy) + 2 * s.bh * n * w)


def covers(n: int, a: int, e: int, block: int, left: int, right: int) -> bool:
    """Whether every block's window among rows [a, e) covers the keys those rows may see (`edge_keys`): with a band
    that keeps its whole window, `edge_bias` then writes no bias (`_banded.windows_cover`)."""
    return windows_cover(a, e, *edge_keys(n, a, e, left, right), block, left, left + block + right)


def _edge_bytes(s: Shape, a: int, e: int, left: int, right: int, joined: bool = False, bare: bool = False) -> float:
    """Peak bytes of `_edge` on rows [a, e): its (rows, keys) bias beside what the fused kernel allocates (the sdpa
    spec's prediction, its output included); `bare`: no bias written (`covers`, a band keeping its whole window).
    `joined`: a call for each query head of a group, Hk problems each, its log-sum-exp copied out."""
    ka, ke = edge_keys(s.Nq, a, e, left, right)
    heads = s.key_heads if joined else s.H  # joined: a call for each query head of a group
    sums = s.B * heads * (e - a) * _lse_bytes(s) if joined else 0  # its log-sum-exp copied out
    return (0 if bare else (e - a) * (ke - ka) * s.elem) + sums + SDPA.cost.memory_bytes(
        Shape(s.B, heads, e - a, ke - ka, s.D, dtype=s.dtype, Hk=None if joined else s.Hk))


def _ends_bytes(s: Shape, a: int, e: int, left: int, right: int, bare: bool = False) -> float:
    """Peak bytes of `_ends_together`, whose two regions are shaped as rows [a, e): both ends' biases and their
    stack beside what the fused kernel allocates for B·H problems of two regions (the sdpa spec's prediction, its
    output included); `bare`: neither end writes a bias (`covers`), and no stack is made."""
    ka, ke = edge_keys(s.Nq, a, e, left, right)
    rows, keys = e - a, ke - ka
    fused = SDPA.cost.memory_bytes(Shape(s.bh, 2, rows, keys, s.D, dtype=s.dtype))
    return (0 if bare else 4 * rows * keys * s.elem) + fused


def _chunk_bytes(s: Shape, blocks: int, block: int, left: int, right: int, extra: int, padded: bool) -> float:
    """Peak bytes of the first of `blocks` query blocks' chunks with `extra` keys (`_merged`) beside the output and
    mask: its scaled queries, zero-padded key and value slabs of the Hk heads and its edge mask when it passes an end
    (`padded`), the extra keys' copies and masks, the chunk's bias with a row for each of its r·rows folded query
    rows, its joined keys and values (Hk heads) and what the fused kernel allocates (the sdpa spec's prediction for
    that call: B·Hk problems of c blocks of r·block rows)."""
    span, elem, d = left + block + right, s.elem, s.D
    rows = min(chunk_blocks(s.bh, block, span + extra), blocks) * block
    slabs = 2 * s.bk * (rows + left + right) * d * elem + rows * span * elem if padded else 0
    held = s.bh * rows * d * elem + slabs
    c, keys = rows // block, span + extra
    masks = rows * (8 + extra * (elem + 1)) + s.group * rows * keys * elem  # positions, extra mask, folded bias
    fused = SDPA.cost.memory_bytes(Shape(s.bk, c, s.group * block, keys, d, dtype=s.dtype))
    return held + 2 * s.bk * extra * d * elem + masks + 2 * s.bk * c * keys * d * elem + fused


def banded_flops(heads: int, n: int, d: int, *, block: int, left: int, right: int, chunked: bool = False) -> float:
    """FLOPs banded_attention executes, Q Kᵀ and P V over every cell it scores, masked ones included: each interior
    block (`interior`) against its window of S = left + block + right keys, and each end's rows against the keys they
    may see (`edges`, `edge_keys`). `chunked` (extra keys, Longformer's): every block, the last zero-padded to
    `block` rows, against a whole window, zero keys past the ends included."""
    if chunked:
        return 4.0 * heads * math.ceil(n / block) * block * (left + block + right) * d
    lo, hi = interior(n, block, left, right)
    cells = max(0, hi - lo) * block * (left + block + right)
    for a, e in edges(n, block, left, right):
        ka, ke = edge_keys(n, a, e, left, right)
        cells += (e - a) * (ke - ka)
    return 4.0 * heads * cells * d


def dense_rows_memory(s: Shape, count: int) -> float:
    """Peak bytes of dense_rows for `count` rows of s (n = s.Nq) beside the output it writes into: one slab's
    queries, what the fused kernel allocates for them (the sdpa spec's prediction, Hk key/value heads), and, causal,
    the slab's (rows, n) mask and its bias."""
    if not count:
        return 0.0
    rows = dense_slab(s.Nq, count, s.causal)
    slab = Shape(s.B, s.H, rows, s.Nq, s.D, dtype=s.dtype, Hk=s.key_heads)
    mask = rows * s.Nq * (1 + s.elem) if s.causal else 0
    return 8 * count + s.bh * rows * s.D * s.elem + SDPA.cost.memory_bytes(slab) + mask
