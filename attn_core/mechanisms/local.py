"""Block-local attention: queries attend within their block and a few neighbouring blocks (Image Transformer,
Parmar et al. 2018, arXiv 1802.05751; the blockwise local attention of Qiu et al. 2019, arXiv 1911.02972)."""
from __future__ import annotations

import functools

import torch

from .. import masks
from ..spec import Cost, Generation, Insight, MechanismSpec, Param, Shape, Supports
from ._banded import banded_attention, keeps_threads
from ._banded_memory import banded_flops, banded_memory
from ._cache import KVCache, attend, kv_bytes
from ._common import check_key_padding, check_sinks, checked_shape


def local_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, *, causal: bool = False, block: int = 128,
                    lookback: int = 1, lookahead: int = 1,
                    key_padding_mask: torch.Tensor | None = None, sinks: torch.Tensor | None = None) -> torch.Tensor:
    """Exact attention where query i sees key j iff −lookback ≤ ⌊j/block⌋ − ⌊i/block⌋ ≤ lookahead
    (causal: lookahead is 0 and j ≤ i).

    q (B, H, n, D), k and v (B, Hk, n, D) → (B, H, n, D); any n (the last block may be partial). Computed block by
    block against a strided view of (lookback + 1 + lookahead)·block keys, the H/Hk query heads sharing a key/value
    head as one block's rows (`banded_attention`). O(n·block·d) time, O(n·d) memory.
    `key_padding_mask` (B, n) boolean, True where the key is padding: those keys get no weight (a query whose
    blocks hold only padding outputs zeros).
    `sinks` (H,): a logit per query head joining every row's denominator with no value (gpt-oss, arXiv 2508.10925):
    O(n·H) more (`banded_attention`).
    """
    s = checked_shape(SPEC, q, k, v, causal, block=block, lookback=lookback, lookahead=lookahead)
    b, back, ahead = _reach(s, block, lookback, lookahead)
    if key_padding_mask is not None:
        check_key_padding(SPEC, key_padding_mask, q, k)
    if sinks is not None:
        check_sinks(SPEC, sinks, q)
    return banded_attention(q, k, v, pattern=_pattern(causal, b, back, ahead), block=b, left=back * b,
                            right=ahead * b, key_padding_mask=key_padding_mask, sinks=sinks)


@functools.lru_cache(maxsize=64)  # one object for the same settings: `_banded.window_bias` is kept by it
def _pattern(causal: bool, block: int = 128, lookback: int = 1, lookahead: int = 1) -> masks.Pattern:
    if causal:
        return masks.block_local(block, lookback, 0) & masks.causal
    return masks.block_local(block, lookback, lookahead)


def _reach(s: Shape, block: int, lookback: int, lookahead: int) -> tuple[int, int, int]:
    """(block, blocks back, blocks ahead) as computed: a block larger than n is the same pattern as one of n, and
    looking past the first or last block adds nothing."""
    b = min(block, s.Nq)
    most = -(-s.Nq // b) - 1
    return b, min(lookback, most), 0 if s.causal else min(lookahead, most)


def _flops(s: Shape, block: int = 128, lookback: int = 1, lookahead: int = 1) -> float:
    b, back, ahead = _reach(s, block, lookback, lookahead)
    keys = (back + 1 + ahead) * b - ((b - 1) / 2 if s.causal else 0)  # causal: the own block is a triangle
    return 4.0 * s.bh * s.Nq * min(keys, s.Nk) * s.D


def _executed_flops(s: Shape, block: int = 128, lookback: int = 1, lookahead: int = 1) -> float:
    b, back, ahead = _reach(s, block, lookback, lookahead)
    return banded_flops(s.bh, s.Nq, s.D, block=b, left=back * b, right=ahead * b)


def _memory(s: Shape, block: int = 128, lookback: int = 1, lookahead: int = 1) -> float:
    b, back, ahead = _reach(s, block, lookback, lookahead)
    return banded_memory(s, block=b, left=back * b, right=ahead * b, whole=not s.causal)


def _sinks_memory(s: Shape, block: int = 128, lookback: int = 1, lookahead: int = 1) -> float:
    b, back, ahead = _reach(s, block, lookback, lookahead)
    return banded_memory(s, block=b, left=back * b, right=ahead * b, sinks=True, whole=not s.causal)


def _remember(k, v, *, max_len: int | None = None, block: int = 128, lookback: int = 1,
              lookahead: int = 1, sinks: torch.Tensor | None = None) -> KVCache:
    """A ring of (lookback + 1)·block tokens: the current block and the `lookback` before it. Slots follow
    positions modulo a whole number of blocks, so each block fills its own run of `block` slots."""
    return KVCache({"block": block, "lookback": lookback, "lookahead": lookahead}, k, v, max_len=max_len,
                   limit=(lookback + 1) * block, sinks=sinks)


def _step(q, k, v, cache: KVCache):
    """The new token (causal) against its own block so far and the `lookback` blocks before it:
    O((lookback + 1)·block·d). Once the ring has wrapped, the slots of its own block after its own still hold the
    block `lookback` + 1 back, which it must not see: they are left out of the softmax."""
    keys, values = cache.append(k, v)
    ring, hide = cache.rings["tokens"], None
    if cache.length > ring.capacity:
        slot, b = (cache.length - 1) % ring.capacity, cache.params["block"]
        hide = slice(slot + 1, (slot // b + 1) * b)
    return attend(q, (keys, values), hide=hide, sinks=cache.sinks), cache


def _cache_bytes(s: Shape, block: int = 128, lookback: int = 1, lookahead: int = 1) -> float:
    return kv_bytes(s, min(s.Nk, (lookback + 1) * block))


SPEC = MechanismSpec(
    label="Block-local",
    fn=local_attention,
    description="The sequence is cut into blocks; each query attends to its own block and a few neighbouring ones.",
    paper="Parmar et al. 2018, 'Image Transformer', arXiv 1802.05751; Qiu et al. 2019, arXiv 1911.02972",
    params=(
        Param("block", 128, 1, 1 << 16, "Tokens per block.", log=True, small=lambda n: max(1, n // 4), tokens=True),
        Param("lookback", 1, 0, 64, "Previous blocks each query also sees."),
        Param("lookahead", 1, 0, 64, "Next blocks each query also sees (0 when causal)."),
    ),
    exact=True,
    cost=Cost(flops=_flops, executed_flops=_executed_flops, memory_bytes=_memory, time_big_o="O(n·b·d)",
              memory_big_o="O(n·d)", keeps_threads=keeps_threads, sinks_memory_bytes=_sinks_memory),
    supports=Supports(
        causal=True,
        cross=False,
        padding=True,
        shared_kv=True,
        sinks=True,
        generation=Generation(remember=_remember, step=_step, cache_bytes=_cache_bytes, step_big_o="O(b·d)",
                              cache_big_o="O(b·d)"),
    ),
    insight=Insight(
        pattern=_pattern,
        regime=("local", "gaussian", "With unrelated tokens softmax spreads weight over the whole sequence, and a "
                "fixed pattern drops all of it that falls outside the pattern (the dropped mass)."),
    ),
)
