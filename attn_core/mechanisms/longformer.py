"""Longformer attention: a sliding window plus global tokens that see, and are seen by, every position
(Beltagy, Peters and Cohan 2020, 'Longformer: The Long-Document Transformer', arXiv 2004.05150)."""
from __future__ import annotations

import bisect

import torch

from .. import masks
from ..spec import Cost, Generation, Insight, MechanismSpec, Param, Shape, State, Supports
from ._banded import Extra, banded_attention, dense_rows, joins
from ._banded_memory import banded_flops, banded_memory, dense_rows_memory
from ._cache import KVCache, Ring, attend, kv_bytes
from ._common import check_key_padding, check_sinks, checked_shape, trusted
from .sliding_window import _pattern as _band, tile as band_tile  # the band is the sliding window's


def tile(window: int, n: int, *, joined: bool = True) -> int:
    """Query rows per block. `joined` (the global keys joined to the band afterwards, `_banded.joins`): the sliding
    window's, whose band runs the same way. Otherwise (padding, gradients, not a CPU) window/2 within [32, 128]: the
    blocks run in chunks that copy each block's window of keys beside the global ones (`_banded._merged`), window +
    block (+ window) keys for every block of rows, so larger blocks copy fewer keys per row."""
    if joined:
        return band_tile(window, n)
    return max(1, min(n, 128, max(32, window // 2)))


def longformer_attention(q, k, v, *, causal: bool = False, window: int = 256, global_tokens: int = 2,
                         global_positions: torch.Tensor | None = None, key_padding_mask: torch.Tensor | None = None,
                         sinks: torch.Tensor | None = None):
    """Exact attention where query i sees key j iff |i − j| ≤ window, or i or j is a global position (causal:
    and j ≤ i, so a global token sees only the past and a query sees a global key only at j ≤ i).

    The global positions are the first `global_tokens` (g) unless `global_positions` lists min(g, n) distinct
    ones (positions, the same for every head). q (B, H, n, D), k and v (B, Hk, n, D) → (B, H, n, D); any n. Every
    row attends to its band of keys (as in `sliding_window`, PyTorch's fused kernel keeping each row's log-sum-exp)
    and the g global keys are joined to that softmax afterwards, a global key inside the band counted once
    (`_banded._join_extra`); with padding or gradients (the log-sum-exp carries none) or off the CPU, each block's
    band and the global keys go in one masked softmax, in chunks (`_banded._merged`). Then the g global rows attend
    densely to all n keys, written over theirs (`dense_rows`). No n×n tensor: O(n·(w + g)·D) time, O(n·D) memory
    (the global rows in slabs).
    `key_padding_mask` (B, n) boolean, True where the key is padding: those keys are left out of every row, band
    and global alike (scores then held per chunk); a query that sees no unpadded key outputs zeros.
    `sinks` (H,): head h's logit joins every row's denominator with no value (gpt-oss, arXiv 2508.10925): the band
    and global keys' joint log-sum-exp ℓ scales each row by σ(ℓ − a_h) (`banded_attention`), the global rows
    through `sdpa.sink_sdpa` (`dense_rows`). O(n·H) more.
    """
    s = checked_shape(SPEC, q, k, v, causal, window=window, global_tokens=global_tokens)
    if key_padding_mask is not None:
        check_key_padding(SPEC, key_padding_mask, q, k)
    if sinks is not None:
        check_sinks(SPEC, sinks, q)
    n = s.Nq
    positions = _positions(n, global_tokens, global_positions, q.device)
    pattern = _pattern(causal, window, global_tokens, positions)
    # every token global: dense attention alone
    out = (q.new_empty(q.shape) if len(positions) == n else
           _band_rows(q, k, v, causal, window, positions, pattern, key_padding_mask, sinks))
    dense_rows(q, k, v, out, positions, causal, key_padding_mask, sinks)
    return out


def _band_rows(q, k, v, causal: bool, window: int, positions: torch.Tensor, pattern: masks.Pattern,
               key_padding_mask: torch.Tensor | None, sinks: torch.Tensor | None = None) -> torch.Tensor:
    """Every row against its band and the global keys (the global rows too, replaced afterwards); the global keys'
    copies die on return, before the global rows are made."""
    extra = (Extra(k.index_select(2, positions), v.index_select(2, positions), positions, pattern)
             if len(positions) else None)
    joined = key_padding_mask is None and joins(q, k, v)
    return banded_attention(q, k, v, pattern=_band(causal, window), block=tile(window, q.shape[-2], joined=joined),
                            left=window, right=0 if causal else window, extra=extra, key_padding_mask=key_padding_mask,
                            sinks=sinks)


def _positions(n: int, global_tokens: int, given: torch.Tensor | None, device) -> torch.Tensor:
    """The global positions as a LongTensor on `device`: the first min(g, n), or `given`, checked (outside the
    engine's timed region) to hold min(g, n) distinct positions in [0, n)."""
    g = min(global_tokens, n)
    if given is None:
        return torch.arange(g, device=device)
    if not trusted():
        if not isinstance(given, torch.Tensor) or given.dim() != 1 or given.is_floating_point() or given.is_complex():
            raise ValueError("global_positions must be a 1-D integer tensor of sequence positions, e.g. "
                             "torch.tensor([0, 100])")
        if len(given) != g:
            raise ValueError(f"global_positions lists {len(given)} positions but global_tokens = {global_tokens} "
                             f"at n = {n} asks for {g}; set global_tokens={len(given)}")
        if len(given) and (int(given.min()) < 0 or int(given.max()) >= n or len(torch.unique(given)) != len(given)):
            raise ValueError(f"global_positions must be distinct positions in [0, {n}), got {given.tolist()}")
    return given.to(device=device, dtype=torch.long)


def _pattern(causal: bool, window: int = 256, global_tokens: int = 2,
             global_positions: torch.Tensor | None = None) -> masks.Pattern:
    """|i − j| ≤ window, or i or j global (the first `global_tokens`, or `global_positions`); causal: and j ≤ i."""
    glob = masks.global_tokens(global_tokens if global_positions is None else global_positions)
    both = masks.sliding_window(window) | glob
    return both & masks.causal if causal else both


def _capped_sum(m: int, cap: int) -> int:
    """Σ_{u=0}^{m−1} min(u, cap); 0 for m ≤ 0."""
    if m <= 0:
        return 0
    if m <= cap + 1:
        return m * (m - 1) // 2
    return cap * (cap + 1) // 2 + (m - cap - 1) * cap


def _visible(s: Shape, window: int, global_tokens: int) -> int:
    """Σ over queries of the keys each sees, the first g positions global. A row i ≥ G (G = min(g, n)) sees
    min(i, w) + 1 window keys back and itself (+ min(n − 1 − i, w) ahead unless causal) and the globals p with
    p < i − w, outside its window: clip(i − w, 0, G). A global row sees all n keys (causal: p + 1)."""
    n, w, G = s.Nq, window, min(global_tokens, s.Nq)
    rows = n - G
    band = _capped_sum(n, w) - _capped_sum(G, w) + rows + (0 if s.causal else _capped_sum(rows, w))
    beyond = _capped_sum(n - w, G) - _capped_sum(G - w, G)
    return (G * (G + 1) // 2 if s.causal else G * n) + band + beyond


def _flops(s: Shape, window: int = 256, global_tokens: int = 2) -> float:
    return 4.0 * s.bh * _visible(s, window, global_tokens) * s.D


def _executed_flops(s: Shape, window: int = 256, global_tokens: int = 2) -> float:
    """The band (as sliding_window's), every row against the G global keys (their scores, then their share of the
    output), and the G global rows against all n keys (causal too: the future is masked after)."""
    n, G = s.Nq, min(global_tokens, s.Nq)
    rows = 4.0 * s.bh * G * n * s.D
    if G == n:
        return rows
    band = banded_flops(s.bh, n, s.D, block=tile(window, n), left=window, right=0 if s.causal else window)
    return band + 4.0 * s.bh * n * G * s.D + rows


def _memory(s: Shape, window: int = 256, global_tokens: int = 2) -> float:
    """The larger of the band's peak (`banded_memory` with G extra keys) and the global rows' beside the output
    (`dense_rows_memory`)."""
    n, G = s.Nq, min(global_tokens, s.Nq)
    band = 0 if G == n else banded_memory(s, block=tile(window, n), left=window, right=0 if s.causal else window,
                                         extra=G)  # joined: as it runs on a CPU, without gradients
    return max(band, s.bh * n * s.D * s.elem + dense_rows_memory(s, G))


def _remember(k, v, *, max_len: int | None = None, window: int = 256, global_tokens: int = 2,
              global_positions: torch.Tensor | None = None, sinks: torch.Tensor | None = None) -> KVCache:
    """Two rings: the last window + 1 tokens (`tokens`, as sliding_window's) and the global tokens' keys and values
    (`globals`, in position order). The first g positions by default: those the prompt holds now, the rest joining
    as they are generated; given `global_positions` must all lie in the prompt, since a global token's step would
    need every key before it. O((w + g)·d) memory at any context."""
    n, g = k.shape[2], global_tokens
    cache = KVCache({"window": window, "global_tokens": g}, k, v, max_len=max_len, limit=window + 1, sinks=sinks)
    if global_positions is None:
        held = torch.arange(min(g, n), device=k.device)
    else:
        held = _positions(n, g, global_positions, k.device)
        if g > n:
            raise ValueError(f"global_positions are given for a prompt of {n} tokens but global_tokens = {g}: the "
                             f"global tokens past the prompt would each need every key before them, which this "
                             f"cache does not keep; prefill a prompt that holds all {g} global positions")
        held = held.sort().values
        cache.params["global_positions"] = tuple(held.tolist())
    cache.rings["globals"] = Ring(k.index_select(2, held), v.index_select(2, held), limit=max(g, 1),
                                  reserve=min(g, max_len or 0))
    return cache


def _step(q, k, v, cache: KVCache):
    """The new token at position p (causal). Not global: its window, the last w + 1 tokens with itself, and the
    global keys before p − w (those inside the window counted once): O((w + g)·d). Global (p among the first g):
    every key before it, all of them global. One joint softmax."""
    w, g, p = cache.params["window"], cache.params["global_tokens"], cache.length
    keys, values = cache.append(k, v)
    glob = cache.rings["globals"]
    given = cache.params.get("global_positions")  # sorted; None: the first g
    if given is None and p < g:  # a global token: it sees every position up to its own
        glob.append(k, v)
        return attend(q, glob.view(), sinks=cache.sinks), cache
    before = min(g, max(p - w, 0)) if given is None else bisect.bisect_left(given, p - w)
    gk, gv = glob.view()
    pairs = ((keys, values),) + (((gk[:, :, :before], gv[:, :, :before]),) if before else ())
    return attend(q, *pairs, sinks=cache.sinks), cache


def _cache_bytes(s: Shape, window: int = 256, global_tokens: int = 2) -> float:
    return kv_bytes(s, min(s.Nk, window + 1) + min(s.Nk, global_tokens))


SPEC = MechanismSpec(
    label="Longformer (window + global)",
    fn=longformer_attention,
    description="A sliding window of ±w neighbours plus g global tokens that attend to, and are attended by, "
                "every position: exact, O(n·(w + g)).",
    paper="Beltagy, Peters and Cohan 2020, 'Longformer: The Long-Document Transformer', arXiv 2004.05150",
    params=(Param("window", 256, 0, 1 << 20, "Keys on each side a query sees (|i − j| ≤ window).", log=True,
                  small=lambda n: max(1, n // 8), tokens=True),
            Param("global_tokens", 2, 0, 1 << 20, "Global tokens g: the first g positions (or those given as "
                  "global_positions) see every key and are seen by every query.", log=True,
                  small=lambda n: 1 if n < 16 else 2, tokens=True)),
    exact=True,
    state=State(keys=("global_positions",)),
    cost=Cost(flops=_flops, executed_flops=_executed_flops, memory_bytes=_memory, time_big_o="O(n·(w + g)·d)",
              memory_big_o="O(n·d)"),
    supports=Supports(
        causal=True,
        cross=False,
        padding=True,
        shared_kv=True,
        sinks=True,
        generation=Generation(remember=_remember, step=_step, cache_bytes=_cache_bytes, step_big_o="O((w + g)·d)",
                              cache_big_o="O((w + g)·d)"),
    ),
    insight=Insight(
        pattern=_pattern,
        regime=("local", "gaussian", "With unrelated tokens softmax spreads weight over the whole sequence; the window "
                "and a few global tokens keep only a sliver of it (the dropped mass)."),
    ),
)
