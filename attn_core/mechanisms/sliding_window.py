"""Sliding-window attention: each query sees the keys within a fixed distance (Longformer's local part,
Beltagy et al. 2020, arXiv 2004.05150)."""
from __future__ import annotations

import functools

import torch

from .. import masks
from ..spec import Cost, Generation, Insight, MechanismSpec, Param, Shape, Supports
from ._banded import banded_attention, keeps_threads
from ._banded_memory import banded_flops, banded_memory
from . import _streaming
from ._cache import KVCache, kv_bytes
from ._common import check_key_padding, check_sinks, checked_shape


def tile(window: int, n: int) -> int:
    """Query rows per block: 32, whatever the window. A block of b rows scores window + b (+ window) keys, so smaller
    blocks waste fewer cells, and PyTorch's CPU flash kernel, which runs every block (`_banded`), splits queries
    shorter than 192 rows into tiles of 32 anyway: at n = 16384, B = 1, H = 8, D = 64 (2 threads, this CPU), a
    window of 256 took 136–142 ms in blocks of 32 where blocks of 64, 128 and 16 took 141–149, 154–161 and 158 ms
    (causal: 79–88 against 84–92, 97–106 and 86 ms; windows of 64 and 512 alike). Our band kernel
    (`_banded.uses_band`) is fastest in blocks of 32 too: on a 2-core Xeon, causal, 55 ms against 76, 67, 60 and 63
    in blocks of 16, 48, 64 and 96; not causal 89 against 127, 106, 93 and 97 (medians of 7 interleaved calls)."""
    return max(1, min(n, 32))


def sliding_window_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, *, causal: bool = False,
                             window: int = 256, key_padding_mask: torch.Tensor | None = None,
                             sinks: torch.Tensor | None = None, keep_first: int = 0) -> torch.Tensor:
    """Exact attention where query i sees key j iff |i − j| ≤ window (causal: 0 ≤ i − j ≤ window).

    q (B, H, n, D), k and v (B, Hk, n, D) → (B, H, n, D); any n. Rows are processed in blocks of `tile(window)`
    queries, each against a strided view of window + block (+ window) keys, so no n×n tensor ever exists; the blocks
    whose window lies inside the sequence in one fused call (`banded_attention`), the rows at each end in one fused
    call against the keys they may see. O(n·w·d) time, O(n·d) memory. Hk < H: the H/Hk query heads sharing a
    key/value head are one block's rows, so each window is cut once per key/value head (`banded_attention`).
    `key_padding_mask` (B, n) boolean, True where the key is padding: those keys get no weight (a query whose
    window holds only padding outputs zeros).
    `sinks` (H,): a logit per query head joining every row's denominator with no value, as gpt-oss's 128-token
    window layers have (arXiv 2508.10925): O(n·H) more (`banded_attention`).
    `keep_first` S: the first S keys seen by every query too (causal: j ≤ i), StreamingLLM's pattern (arXiv
    2309.17453; `_streaming.streaming_window`), as its generation keeps them.
    """
    s = checked_shape(SPEC, q, k, v, causal, window=window)
    pattern = _pattern(causal, window)
    if key_padding_mask is not None:
        check_key_padding(SPEC, key_padding_mask, q, k)
    if sinks is not None:
        check_sinks(SPEC, sinks, q)
    if keep_first:
        _streaming.check_keep_first(SPEC, keep_first)
        return _streaming.streaming_window(q, k, v, band=pattern, block=tile(window, s.Nq), window=window,
                                           causal=causal, keep_first=keep_first, key_padding_mask=key_padding_mask,
                                           sinks=sinks)
    return banded_attention(q, k, v, pattern=pattern, block=tile(window, s.Nq), left=window,
                            right=0 if causal else window, key_padding_mask=key_padding_mask, sinks=sinks)


@functools.lru_cache(maxsize=64)  # one object for the same settings: `_banded.window_bias` is kept by it
def _pattern(causal: bool, window: int) -> masks.Pattern:
    return masks.sliding_window(window) & masks.causal if causal else masks.sliding_window(window)


def _visible(s: Shape, window: int) -> float:
    """Σ over queries of the keys each one sees."""
    n, w = s.Nq, min(window, s.Nq - 1)
    one_side = n * w - w * (w + 1) / 2  # pairs with 0 < i − j ≤ w
    return n + one_side * (1 if s.causal else 2)


def _flops(s: Shape, window: int = 256) -> float:
    return 4.0 * s.bh * _visible(s, window) * s.D


def _executed_flops(s: Shape, window: int = 256) -> float:
    return banded_flops(s.bh, s.Nq, s.D, block=tile(window, s.Nq), left=window, right=0 if s.causal else window)


def _memory(s: Shape, window: int = 256) -> float:
    return banded_memory(s, block=tile(window, s.Nq), left=window, right=0 if s.causal else window)


def _sinks_memory(s: Shape, window: int = 256) -> float:
    return banded_memory(s, block=tile(window, s.Nq), left=window, right=0 if s.causal else window, sinks=True)


def _remember(k, v, *, max_len: int | None = None, window: int = 256, sinks: torch.Tensor | None = None,
              keep_first: int = 0) -> KVCache:
    """A ring of the last window + 1 tokens (the window a new token sees, and the token itself, written before it
    is read): a step is O(w·d) time, the cache O(w·d) memory at any context. `keep_first` S: the first S tokens
    kept beside it (StreamingLLM, `_streaming.remember`), O((w + S)·d)."""
    if keep_first:
        return _streaming.remember(k, v, max_len=max_len, window=window, keep_first=keep_first, sinks=sinks)
    return KVCache({"window": window}, k, v, max_len=max_len, limit=window + 1, sinks=sinks)


def _cache_bytes(s: Shape, window: int = 256, keep_first: int = 0) -> float:
    """The last min(n, w + 1) tokens' keys and values, and the first min(n, S) with keep_first (StreamingLLM)."""
    return _streaming.cache_bytes(s, window, keep_first) if keep_first else kv_bytes(s, min(s.Nk, window + 1))


SPEC = MechanismSpec(
    label="Sliding window",
    fn=sliding_window_attention,
    description="Each token attends to its neighbours within ±window positions: exact inside the band, blind outside.",
    paper="Beltagy et al. 2020, 'Longformer', arXiv 2004.05150 (local sliding-window part)",
    params=(Param("window", 256, 1, 1 << 20, "Keys on each side a query sees (|i − j| ≤ window).", log=True,
                  small=lambda n: max(1, n // 8), tokens=True),),
    exact=True,
    cost=Cost(flops=_flops, executed_flops=_executed_flops, memory_bytes=_memory, time_big_o="O(n·w·d)",
              memory_big_o="O(n·d)", keeps_threads=keeps_threads, sinks_memory_bytes=_sinks_memory),
    supports=Supports(
        causal=True,
        cross=False,
        padding=True,
        shared_kv=True,
        sinks=True,
        generation=Generation(remember=_remember, step=_streaming.step, cache_bytes=_cache_bytes, step_big_o="O(w·d)",
                              cache_big_o="O(w·d)", keep_first=True),
    ),
    insight=Insight(
        pattern=_pattern,
        regime=("local", "gaussian", "With unrelated tokens softmax spreads weight over the whole sequence, and a "
                "fixed pattern drops all of it that falls outside the pattern (the dropped mass)."),
    ),
)
