"""BigBird's block-sparse attention, the ITC form: a window of blocks, global blocks and random blocks
(Zaheer et al. 2020, 'Big Bird: Transformers for Longer Sequences', arXiv 2007.14062)."""
from __future__ import annotations

from typing import NamedTuple

import numpy as np
import torch
import torch.nn.functional as F

from .. import masks
from ..spec import Cost, Insight, MechanismSpec, Param, Shape, State, Supports
from ._banded import (FLASH_CPU, chunk_blocks, dense_rows, floor, joins, padding_bias, query_blocks, softmax_seen,
                      write_blocks)
from ._banded_memory import dense_rows_memory
from ._common import check_key_padding, check_sinks, checked_shape, group_sinks, trusted
from .sdpa import SPEC as SDPA


class Layout(NamedTuple):
    """The block structure at one n: block size b (≤ n), nb blocks (the last may be partial), window blocks back
    and ahead of a query's own block, g global blocks and r random-table columns, each cut to what n allows."""

    b: int
    nb: int
    back: int
    ahead: int
    g: int
    r: int

    @property
    def keys(self) -> int:
        """Key blocks each non-global query block is scored against: window, global and random."""
        return self.back + 1 + self.ahead + self.g + self.r


def layout(n: int, causal: bool, block: int = 64, window_blocks: int = 3, global_blocks: int = 2,
           random_blocks: int = 3) -> Layout:
    """A block larger than n is one of n; windows past the ends add nothing; at most nb − g − 1 blocks are left
    for random ones (a query block's window holds its own)."""
    b = min(block, n)
    nb = -(-n // b)
    g = min(global_blocks, nb)
    back = min(window_blocks // 2, nb - 1)
    ahead = 0 if causal else min((window_blocks - 1) // 2, nb - 1)
    return Layout(b, nb, back, ahead, g, min(random_blocks, max(0, nb - g - 1)))


def init_state(shape: Shape, device=None, dtype=torch.float32, *, seed: int = 0, block: int = 64,
               window_blocks: int = 3, global_blocks: int = 2, random_blocks: int = 3) -> dict:
    """Seeded random blocks: {'random_table': (nb, r) LongTensor}, row β the key blocks query block β sees at
    random, −1 where there are fewer candidates than r; rows of global blocks are all −1 (they see everything).

    Candidates are the blocks no other part of the pattern covers: outside the global blocks and β's window
    (causal: before β's window, the past only), so no key is counted twice. Each row is a uniform draw of
    min(r, candidates) distinct blocks (Floyd's algorithm, one step per column for all rows at once), sorted.
    """
    SPEC.check_params({"block": block, "window_blocks": window_blocks, "global_blocks": global_blocks,
                       "random_blocks": random_blocks}, shape)
    L = layout(shape.Nq, shape.causal, block, window_blocks, global_blocks, random_blocks)
    beta = torch.arange(L.nb)
    lo = (beta - L.back).clamp_min(L.g)  # first non-global window block
    hi = (beta + L.ahead).clamp_max(L.nb - 1)
    if shape.causal:
        count = (beta - L.back - L.g).clamp_min(0)  # blocks g … β − back − 1
    else:
        count = L.nb - L.g - (hi - lo + 1)
    count = torch.where(beta < L.g, 0, count)
    uniform = torch.rand(L.r, L.nb, generator=torch.Generator().manual_seed(seed), dtype=torch.float64)
    rank = torch.full((L.nb, L.r), -1, dtype=torch.long)
    for t in range(L.r):  # Floyd: draw from [0, top], take top itself if that one is taken
        top = count - L.r + t
        pick = (uniform[t] * (top + 1).clamp_min(1)).long().clamp_max(top.clamp_min(0))
        pick = torch.where((rank[:, :t] == pick[:, None]).any(1), top, pick)
        rank[:, t] = torch.where(count >= L.r, pick, torch.where(t < count, t, -1))  # too few: all of them
    block_of = L.g + rank  # rank among the candidates → block; non-causal candidates skip the window
    if not shape.causal:
        block_of = torch.where(block_of >= lo[:, None], block_of + (hi - lo + 1)[:, None], block_of)
    table = torch.where(rank >= 0, block_of, L.nb).sort(dim=1).values
    return {"random_table": torch.where(table == L.nb, -1, table).to(device)}


def bigbird_attention(q, k, v, *, causal: bool = False, block: int = 64, window_blocks: int = 3,
                      global_blocks: int = 2, random_blocks: int = 3, random_table: torch.Tensor | None = None,
                      seed: int = 0, key_padding_mask: torch.Tensor | None = None, sinks: torch.Tensor | None = None):
    """Exact attention where query block ⌊i/b⌋ = β sees key block γ iff γ is in its window
    (−⌊w/2⌋ ≤ γ − β ≤ ⌊(w − 1)/2⌋), or β or γ is one of the first g (global) blocks, or γ is in row β of
    `random_table`; causal: and j ≤ i. b = block, w = window_blocks, g = global_blocks.

    q (B, H, n, D), k and v (B, Hk, n, D) → (B, H, n, D); any n (the last block partial, masked). `random_table`
    comes from `init_state`, drawn here from `seed` when absent: one row per query block, the same for every head.
    Every non-global query block gathers its key blocks (window, global, random: K blocks) whole, by index, and
    attends to them in one masked softmax, all query blocks of a chunk of bounded size in one call of PyTorch's
    fused kernel (`F.scaled_dot_product_attention`: the (b, K·b) scores are never held); Hk < H: once per
    key/value head, for the H/Hk query heads sharing it stacked as the block's rows. The global blocks' rows attend
    densely (`dense_rows`). No n×n tensor: O(n·K·b·D) time, O(n·D) memory. `key_padding_mask` (B, n) boolean, True
    where the key is padding: those keys are left out of every row (a chunk's scores then held: the fused kernel
    takes no per-batch bias there); a query that sees no unpadded key outputs zeros.
    `sinks` (H,): head h's logit joins every row's denominator with no value (gpt-oss, arXiv 2508.10925): each row
    scaled by σ(ℓ − a_h), ℓ its log-sum-exp, handed back by the CPU's fused kernel (no gradient asked for), else
    from a chunk's scores, then held (`_chunk`); the global rows through `sdpa.sink_sdpa` (`dense_rows`).
    """
    params = {"block": block, "window_blocks": window_blocks, "global_blocks": global_blocks,
              "random_blocks": random_blocks}
    s = checked_shape(SPEC, q, k, v, causal, **params)
    L = layout(s.Nq, causal, **params)
    if random_table is None:
        random_table = init_state(s, q.device, seed=seed, **params)["random_table"]
    elif not trusted() and (not isinstance(random_table, torch.Tensor) or random_table.is_floating_point()
                            or tuple(random_table.shape) != (L.nb, L.r)):
        got = tuple(random_table.shape) if isinstance(random_table, torch.Tensor) else type(random_table).__name__
        raise ValueError(f"random_table must be an integer tensor of shape ({L.nb}, {L.r}) for these settings at "
                         f"n = {s.Nq}, got {got}; draw it with attn_core.make_state(key, shape, ...)")
    if key_padding_mask is not None:
        check_key_padding(SPEC, key_padding_mask, q, k)
    if sinks is not None:
        check_sinks(SPEC, sinks, q)
    out = q.new_empty(q.shape)
    if L.g < L.nb:
        _block_rows(q, k, v, out, _key_blocks(L, random_table.to(q.device)), L, causal, key_padding_mask, sinks)
    dense_rows(q, k, v, out, torch.arange(min(L.g * L.b, s.Nq), device=q.device), causal, key_padding_mask, sinks)
    return out


def _key_blocks(L: Layout, table: torch.Tensor) -> torch.Tensor:
    """(nb − g, K) key blocks of each non-global query block: window (global or outside [0, nb): −1), the g
    global blocks, its random blocks. −1 marks a slot that holds no key."""
    beta = torch.arange(L.g, L.nb, device=table.device)[:, None]
    window = beta + torch.arange(-L.back, L.ahead + 1, device=table.device)
    window = torch.where((window >= L.g) & (window < L.nb), window, -1)
    glob = torch.arange(L.g, device=table.device).expand(len(beta), L.g)
    return torch.cat([window, glob, table[L.g:].long()], dim=1)


def _block_rows(q, k, v, out: torch.Tensor, key_blocks: torch.Tensor, L: Layout, causal: bool,
                key_padding_mask: torch.Tensor | None = None, sinks: torch.Tensor | None = None) -> None:
    """Rows of the non-global query blocks, in chunks of c blocks (c·b·K·b scores per head ≤ CHUNK_ELEMS over all
    heads): each chunk's keys and values gathered once per key/value head, (B·Hk, c, K·b, D), and attended to in
    one fused call by the H/Hk query heads sharing it, stacked as each block's rows (`query_blocks`); `sinks` (H,)
    as the rows' sink logits of such a block, (Hk, r·b)."""
    B, H, n, D = q.shape
    span = L.keys * L.b
    step = chunk_blocks(B * H, L.b, span)
    pad = L.nb * L.b - n  # keys and values as whole blocks (B, Hk, nb, b, D), zero-padded when n % b ≠ 0
    kb, vb = ((F.pad(x, (0, 0, 0, pad)) if pad else x).view(B, x.shape[1], L.nb, L.b, D) for x in (k, v))
    bias = None if key_padding_mask is None else padding_bias(F.pad(key_padding_mask, (0, pad), value=True),
                                                              q.dtype)[:, 0, :, 0]  # (B, nb·b)
    a = None if sinks is None else group_sinks(sinks, k.shape[1], L.b)
    lse = sinks is not None and bias is None and joins(q, k, v)  # the fused kernel hands back the log-sum-exp
    for first in range(L.g, L.nb, step):
        c, qs = min(step, L.nb - first), first * L.b
        qc = query_blocks(q, k.shape[1], qs, c, L.b)  # (B, Hk, c, r·b, D), scaled
        write_blocks(out, _chunk(qc, kb, vb, key_blocks[first - L.g:first - L.g + c], qs, n, causal, bias, a, lse),
                     qs, L.b)  # the chunk's rows die here, not beside the next chunk's


def _chunk(qc, kb, vb, blocks: torch.Tensor, qs: int, n: int, causal: bool, padded: torch.Tensor | None = None,
           sinks: torch.Tensor | None = None, lse: bool = False) -> torch.Tensor:
    """c query blocks from row qs of n, qc (B, Hk, c, r·b, D) scaled (`query_blocks`), against their key blocks (c, K),
    gathered whole from the blocked keys and values kb, vb (B, Hk, nb, b, D), masked where a slot holds no key, a
    key lies past n or (causal) after the query; `padded`: the keys' padding bias (B, nb·b), added to the gathered
    keys' scores, which are then held: → (B, Hk, c, r·b, D); temporaries die on return. Causal, the mask is
    written out for each of a block's r·b rows (a row's cells depend on its position). `sinks` (Hk, r·b): each
    row's sink logit, its rows scaled by σ(ℓ − a): ℓ from the CPU's fused kernel (`lse`), else from the scores,
    then held (`softmax_seen`)."""
    B, Hk, c, rows, D = qc.shape
    b = kb.shape[3]
    tokens = (blocks[:, :, None] * b + torch.arange(b, device=qc.device)).flatten(1)  # (c, K·b)
    where = torch.arange(qs, qs + c * b, device=qc.device).view(c, b, 1)  # query positions
    ok = ((blocks >= 0).repeat_interleave(b, dim=1) & (tokens < n))[:, None, :]  # (c, 1, K·b)
    if causal:
        ok = ok & (tokens[:, None, :] <= where)
    bias = torch.zeros(c, rows // b if causal else 1, ok.shape[1], ok.shape[2], dtype=qc.dtype, device=qc.device)
    bias = bias.masked_fill_(~ok[:, None], floor(qc.dtype)).view(c, -1, ok.shape[2])  # (c, r·b or 1, K·b)
    index = blocks.clamp_min(0).flatten()  # a slot without a key reads block 0, masked
    keys, values = (x.index_select(2, index).view(B * Hk, c, -1, D) for x in (kb, vb))  # (B·Hk, c, K·b, D)
    queries = qc.view(B * Hk, c, rows, D)
    if padded is None and sinks is None:
        return F.scaled_dot_product_attention(queries, keys, values, attn_mask=bias[None], scale=1.0).view(qc.shape)
    if lse:  # (B·Hk, c, r·b) log-sum-exp beside the rows: σ(ℓ − a) in place
        found, sums = FLASH_CPU(queries, keys, values, 0.0, False, attn_mask=bias[None], scale=1.0)
        weight = torch.sigmoid(sums.view(B, Hk, c, rows).sub_(sinks[:, None].to(sums.dtype)))
        return found.view(qc.shape).mul_(weight[..., None].to(found.dtype))
    scores = (queries @ keys.transpose(-2, -1)).view(B, Hk, c, rows, -1).add_(bias)
    if padded is not None:
        scores.add_(padded[:, tokens].view(B, 1, c, 1, -1))  # the gathered keys' padding
    return softmax_seen(scores, values.view(B, Hk, c, -1, D), None if sinks is None else sinks[:, None])


def _pattern(causal: bool, block: int = 64, window_blocks: int = 3, global_blocks: int = 2, random_blocks: int = 3,
             random_table: torch.Tensor | None = None) -> masks.Pattern:
    """Window blocks | global blocks | random blocks (from `random_table`, the state) [& causal]."""
    back, ahead = window_blocks // 2, 0 if causal else (window_blocks - 1) // 2
    both = masks.block_local(block, back, ahead) | masks.global_tokens(global_blocks * block)
    if random_table is not None:
        both = both | masks.random_blocks(block, random_table)
    elif random_blocks:
        raise ValueError("BigBird's pattern depends on its random blocks: pass random_table, drawn with "
                         "attn_core.make_state(key, shape, seed=...)")
    return both & masks.causal if causal else both


def _block_cells(s: Shape, L: Layout, beta: np.ndarray) -> np.ndarray:
    """Σ over the rows of each non-global query block β of the keys it sees; random blocks in expectation over
    the draw where the partial last block is a candidate (each candidate is drawn with probability r'/count)."""
    n, b = s.Nq, L.b
    rows = np.minimum(b, n - beta * b)
    G = min(L.g * b, n)
    lo = np.maximum(beta - L.back, L.g)
    if s.causal:  # full past window and random blocks, the own block a triangle
        drawn = np.minimum(L.r, np.maximum(0, beta - L.back - L.g)) * b
        return rows * (G + (beta - lo) * b + drawn) + rows * (rows + 1) / 2
    hi = np.minimum(beta + L.ahead, L.nb - 1)
    count = L.nb - L.g - (hi - lo + 1)
    drawn = np.minimum(L.r, count)
    short = np.where((hi < L.nb - 1) & (count > 0), drawn / np.maximum(count, 1) * (L.nb * b - n), 0)
    return rows * (np.minimum(n, (hi + 1) * b) - lo * b + G + drawn * b - short)


def _visible(s: Shape, L: Layout) -> float:
    """Σ over queries of the keys each sees. Blocks away from the edges (and, causal, with a full set of random
    candidates) all see the same: one of them stands for all, the rest are counted one by one (O(w + r) work)."""
    G = min(L.g * L.b, s.Nq)
    dense = G * (G + 1) / 2 if s.causal else G * s.Nq
    first = L.g + L.back + (L.r if s.causal else 0)  # interior: [first, last]
    last = L.nb - 2 - (0 if s.causal else L.ahead)
    if first > last:
        return dense + float(_block_cells(s, L, np.arange(L.g, L.nb)).sum())
    edges = np.concatenate([np.arange(L.g, first), np.arange(last + 1, L.nb)])
    inner = float(_block_cells(s, L, np.array([first]))[0]) * (last - first + 1)
    return dense + float(_block_cells(s, L, edges).sum()) + inner


def _flops(s: Shape, block: int = 64, window_blocks: int = 3, global_blocks: int = 2, random_blocks: int = 3) -> float:
    L = layout(s.Nq, s.causal, block, window_blocks, global_blocks, random_blocks)
    return 4.0 * s.bh * _visible(s, L) * s.D


def _executed_flops(s: Shape, block: int = 64, window_blocks: int = 3, global_blocks: int = 2,
                    random_blocks: int = 3) -> float:
    """Every non-global query block, padded to b rows, against its K gathered blocks (masked slots included),
    and the global rows against all n keys."""
    L = layout(s.Nq, s.causal, block, window_blocks, global_blocks, random_blocks)
    return 4.0 * s.bh * s.D * ((L.nb - L.g) * L.b * L.keys * L.b + min(L.g * L.b, s.Nq) * s.Nq)


def _memory(s: Shape, block: int = 64, window_blocks: int = 3, global_blocks: int = 2,
            random_blocks: int = 3) -> float:
    """The output beside the larger of the first chunk of query blocks (`_chunk`) and the global rows
    (`dense_rows_memory`). A chunk of c blocks, rows = c·b, S = K·b, r = H/Hk: the blocked keys and values when
    n % b ≠ 0 (zero-padded copies, Hk heads), the key-block table, the chunk's token positions, mask ((rows, S)
    causal, else (c, S)) and bias (causal, one row for each of the r·rows folded query rows), its queries (a scaled
    copy), its gathered keys and values (c·S·D each, Hk heads) and what the fused kernel allocates (the sdpa spec's
    prediction for that call: B·Hk problems of c blocks of r·b rows)."""
    L = layout(s.Nq, s.causal, block, window_blocks, global_blocks, random_blocks)
    out = s.bh * s.Nq * s.D * s.elem
    G = min(L.g * L.b, s.Nq)
    dense = dense_rows_memory(s, G)
    if L.g == L.nb:
        return out + dense
    span = L.keys * L.b
    c = min(chunk_blocks(s.bh, L.b, span), L.nb - L.g)
    padded = L.nb * L.b != s.Nq
    blocked = 2 * s.bk * L.nb * L.b * s.D * s.elem if padded else 0
    table = (L.nb - L.g) * L.keys * 8
    mask = (c * L.b if s.causal else c) * span
    bias = mask * (s.group if s.causal else 1) * s.elem
    positions = 8 * (c * span + c * L.b + c * L.keys)  # key tokens, query positions, block indices
    queries = s.bh * c * L.b * s.D * s.elem
    gathered = 2 * s.bk * c * span * s.D * s.elem
    fused = SDPA.cost.memory_bytes(Shape(s.bk, c, s.group * L.b, span, s.D, dtype=s.dtype))
    chunk = blocked + table + positions + mask + bias + queries + gathered + fused
    return out + max(chunk, dense)


SPEC = MechanismSpec(
    label="BigBird (block sparse)",
    fn=bigbird_attention,
    description="Blocks of tokens see a window of neighbouring blocks, a few global blocks and a few random "
                "blocks: exact on that sparse pattern, O(n) in time and memory.",
    paper="Zaheer et al. 2020, 'Big Bird: Transformers for Longer Sequences', arXiv 2007.14062 (ITC)",
    params=(Param("block", 64, 1, 1 << 16, "Tokens per block.", log=True, small=lambda n: max(2, n // 8),
                  tokens=True),
            Param("window_blocks", 3, 1, 1 << 12, "Consecutive blocks each query block sees, its own in the middle "
                  "(an even count reaches one block further back; causal: the back half only)."),
            Param("global_blocks", 2, 0, 1 << 16, "The first g blocks see every key and are seen by every query.",
                  small=lambda n: 1),
            Param("random_blocks", 3, 0, 1 << 10, "Random key blocks per query block, drawn (seeded) among those "
                  "the window and global blocks miss; causal: from the past.", small=lambda n: 1)),
    exact=True,
    state=State(init=init_state, keys=("random_table",)),
    cost=Cost(flops=_flops, executed_flops=_executed_flops, memory_bytes=_memory, time_big_o="O(n·(w + g + r)·b·d)",
              memory_big_o="O(n·d)"),
    supports=Supports(
        causal=True,
        cross=False,
        padding=True,
        shared_kv=True,
        sinks=True,
        no_generation="Its random blocks are drawn from the whole sequence's blocks, so each new block changes "
                      "the draw of every block before it: there is no cache a step can extend.",
    ),
    insight=Insight(
        pattern=_pattern,
        regime=("local", "gaussian", "With unrelated tokens softmax spreads weight over the whole sequence; a window, "
                "a few global and a few random blocks keep only part of it (the dropped mass)."),
    ),
)
