"""Block-local attention: queries attend within their block and a few neighbouring blocks (Image Transformer,
Parmar et al. 2018, arXiv 1802.05751; the blockwise local attention of Qiu et al. 2019, arXiv 1911.02972)."""
from __future__ import annotations

from .. import masks
from ..spec import MechanismSpec, Param, Shape
from ._banded import banded_attention, chunk_blocks
from ._common import checked_shape


def local_attention(q, k, v, *, causal: bool = False, block: int = 128, lookback: int = 1, lookahead: int = 1):
    """Exact attention where query i sees key j iff −lookback ≤ ⌊j/block⌋ − ⌊i/block⌋ ≤ lookahead
    (causal: lookahead is 0 and j ≤ i).

    q, k, v (B, H, n, D) → (B, H, n, D); any n (the last block may be partial). Computed block by block against a
    strided view of (lookback + 1 + lookahead)·block keys. O(n·block·d) time, O(n·d) memory.
    """
    s = checked_shape(SPEC, q, k, v, causal, block=block, lookback=lookback, lookahead=lookahead)
    b = min(block, s.Nq)  # one block holding everything is the same pattern as any larger block
    most = -(-s.Nq // b) - 1  # looking further than the last block adds nothing
    back, ahead = min(lookback, most), 0 if causal else min(lookahead, most)
    return banded_attention(q, k, v, pattern=_pattern(causal, b, back, ahead), block=b, left=back * b,
                            right=ahead * b)


def _pattern(causal: bool, block: int = 128, lookback: int = 1, lookahead: int = 1) -> masks.Pattern:
    if causal:
        return masks.block_local(block, lookback, 0) & masks.causal
    return masks.block_local(block, lookback, lookahead)


def _blocks_seen(s: Shape, block: int, lookback: int, lookahead: int) -> int:
    most = -(-s.Nq // min(block, s.Nq)) - 1
    return min(lookback, most) + 1 + (0 if s.causal else min(lookahead, most))


def _flops(s: Shape, block: int = 128, lookback: int = 1, lookahead: int = 1) -> float:
    keys = _blocks_seen(s, block, lookback, lookahead) * min(block, s.Nq)
    if s.causal:
        keys -= (min(block, s.Nq) - 1) / 2  # the own block is a triangle
    return 4.0 * s.heads * s.Nq * min(keys, s.Nk) * s.D


def _memory(s: Shape, block: int = 128, lookback: int = 1, lookahead: int = 1) -> float:
    b = min(block, s.Nq)
    span = _blocks_seen(s, block, lookback, lookahead) * b
    rows = min(chunk_blocks(s.heads, b, span), -(-s.Nq // b)) * b
    return s.output_bytes + s.heads * rows * (2 * span + s.D) * s.elem


SPEC = MechanismSpec(
    key="local",
    label="Block-local",
    fn=local_attention,
    description="The sequence is cut into blocks; each query attends to its own block and a few neighbouring ones.",
    paper="Parmar et al. 2018, 'Image Transformer', arXiv 1802.05751; Qiu et al. 2019, arXiv 1911.02972",
    params=(
        Param("block", 128, 1, 1 << 16, "Tokens per block.", log=True),
        Param("lookback", 1, 0, 64, "Previous blocks each query also sees."),
        Param("lookahead", 1, 0, 64, "Next blocks each query also sees (0 when causal)."),
    ),
    exact=True,
    supports_causal=True,
    supports_cross=False,
    time_big_o="O(n·b·d)",
    memory_big_o="O(n·d)",
    flops=_flops,
    memory_bytes=_memory,
    pattern=_pattern,
)
