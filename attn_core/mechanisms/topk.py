"""Learned top-k selection in the form of DeepSeek Sparse Attention (DeepSeek-AI 2025, DeepSeek-V3.2, arXiv
2512.02556): a lightning indexer scores every key for each query, each query keeps its top_k keys, and exact softmax
runs over those only."""
from __future__ import annotations

import torch

from .. import native
from ..spec import Cost, Generation, Insight, MechanismSpec, Param, Shape, State, Supports
from ._cache import KVCache, kv_bytes, tensor_bytes
from ._common import check_key_padding, check_sinks, checked_shape, repeated, scale, trusted, workspace
from ._sparse import selected_softmax, selected_softmax_bytes, work_dtype
from ._topk_select import NEG, _first_sampled, _forms, _sampled_bytes, select
from ._topk_select import _select_exact, _select_sampled  # noqa: F401  (read as topk._select_*: tests, docs)

SELECT_NUMBERS = 1 << 24  # numbers one query block's selected softmax holds (see `rows`)
INDEX_NUMBERS = 1 << 23  # numbers one indexer step's scores hold (see `index_rows`)
TILE_NUMBERS = 1 << 18  # numbers one indexer product holds, all its heads and rows (see `key_tile`)
SELECT_KEYS = 1 << 14  # the most keys a row counted in sizing a block (see `rows`)


def rows(s: Shape, top_k: int, index_heads: int) -> int:
    """Query rows per block of the selected softmax: its selection (indices, their sort and the scores and
    probabilities of every query head: 2·H + 8 numbers a selected key), all batch elements, fill SELECT_NUMBERS
    (16 Mi: below glibc's 32 MiB threshold, past which each block's buffers come as fresh pages) at top_k keys a
    row, counted up to SELECT_KEYS (a huge top_k still leaves blocks of tens of rows). top_k, not the fewer keys of
    a short sequence, so that the peak grows with n, as the theory's searches for the largest n that fits take it.
    At n = 16384 blocks of 341 rows ran the whole call fastest: 85, 113 and 170 rows took 1.21, 1.17 and 1.09 of its
    time, 306, 408 and 682 rows about the same. On a GPU (`workspace`: 64 times the numbers) all 16384 rows are one
    block, and the call's launches 48 times fewer: 794 → 77 ms on an H100 (fp32, not causal)."""
    return max(1, min(s.Nq, workspace(SELECT_NUMBERS, s.device) // (s.B * min(top_k, SELECT_KEYS) * (2 * s.H + 8))))


def index_rows(batch: int, index_heads: int, m: int, device: str = "cpu") -> int:
    """Query rows per indexer step within a block: (index_heads + 1)·m numbers a row, all batch elements, fill
    INDEX_NUMBERS (the step's scores and, before the products came a tile of keys at a time, every head's products;
    n = 16384: 102 rows a step, which stayed fastest: steps of 12 to 51 rows, or of a whole block, ran the whole call
    slower, the small ones' selections many small ones). The kernel passes all the keys, Nk, for every block: a
    causal block's fewer keys take no more rows, so the selection's buffers, which grow with the rows, peak in the
    last blocks, where the memory model looks. On a GPU (`device`), 64 times the rows (`workspace`)."""
    return max(1, workspace(INDEX_NUMBERS, device) // (batch * (index_heads + 1) * m))


# -- the indexer: seeded projections drawn outside the kernel --------------------------------------------------
def init_state(shape: Shape, device=None, dtype=torch.float32, *, seed: int = 0, top_k: int = 2048,
               index_heads: int = 4, index_dim: int = 32) -> dict:
    """{'index_q': (D, index_heads·index_dim), 'index_k': (D, index_dim), 'index_w': (index_heads,)}: Gaussian
    projections scaled by D^(−1/2) (unit-variance indexer queries and keys for unit-variance inputs) and weights
    uniform in [0, 1], divided by index_heads. Float32 for half dtypes (the indexer's work dtype)."""
    SPEC.check_params({"top_k": top_k, "index_heads": index_heads, "index_dim": index_dim}, shape)
    g = torch.Generator().manual_seed(seed)
    d = shape.D
    wq = torch.randn(d, index_heads * index_dim, generator=g, dtype=torch.float64) / d ** 0.5
    wk = torch.randn(d, index_dim, generator=g, dtype=torch.float64) / d ** 0.5
    w = torch.rand(index_heads, generator=g, dtype=torch.float64) / index_heads
    keep = work_dtype(dtype)
    return {name: t.to(device=device, dtype=keep) for name, t in
            (("index_q", wq), ("index_k", wk), ("index_w", w))}


def _state(q: torch.Tensor, index_q, index_k, index_w, seed: int, index_heads: int, index_dim: int):
    """The given projections (checked, except inside validated()) or the seeded defaults, in the work dtype."""
    d = q.shape[-1]
    if index_q is None or index_k is None or index_w is None:
        drawn = init_state(Shape(1, 1, 1, 1, d), q.device, q.dtype, seed=seed, top_k=1, index_heads=index_heads,
                           index_dim=index_dim)
        index_q = drawn["index_q"] if index_q is None else index_q
        index_k = drawn["index_k"] if index_k is None else index_k
        index_w = drawn["index_w"] if index_w is None else index_w
    if not trusted():
        for name, t, want in (("index_q", index_q, (d, index_heads * index_dim)), ("index_k", index_k, (d, index_dim)),
                              ("index_w", index_w, (index_heads,))):
            if not isinstance(t, torch.Tensor) or not t.is_floating_point() or tuple(t.shape) != want:
                got = tuple(t.shape) if isinstance(t, torch.Tensor) else type(t).__name__
                raise ValueError(f"{name} must be a floating tensor of shape {want} (head_dim {d}, index_heads "
                                 f"{index_heads}, index_dim {index_dim}), got {got}; init_state draws one")
            if t.device != q.device:
                raise ValueError(f"{name} is on {t.device} but q is on {q.device}; move it with "
                                 f"{name}.to({str(q.device)!r})")
    work = work_dtype(q.dtype)
    return index_q.to(work), index_k.to(work), index_w.to(work)


def index_keys(k: torch.Tensor, index_k: torch.Tensor) -> torch.Tensor:
    """k^I_s = mean over key/value heads of k_s, projected: (B, Hk, n, D) → (B, n, index_dim), the work dtype."""
    return k.mean(1, dtype=index_k.dtype) @ index_k


def index_queries(q: torch.Tensor, index_q: torch.Tensor) -> torch.Tensor:
    """q^I_{t,j} = mean over query heads of q_t, projected per indexer head: (B, H, n, D) → (B, n, IH·index_dim)."""
    return q.mean(1, dtype=index_q.dtype) @ index_q


def key_tile(batch: int, heads: int, r: int, device: str = "cpu") -> int:
    """Keys of one indexer product in `index_scores`: the products of r query rows and every indexer head with them
    fill TILE_NUMBERS (1 MiB in float32, the L2 of the CPU it was measured on), so the product's output stays in
    cache for its ReLU and weighted sum (n = 16384, steps of 102 rows: 642 keys a tile; a step's indexer 0.6 of its
    time in products of 32 rows and all keys, whose 8 MB output went out to the shared cache and back, and the slower
    when the machine's other tenants filled that cache). A measured size, not read from the CPU: on an EPYC with
    512 KiB a core, tiles of its L2 (half these) made the torch form slower (the top-k memory tests of that form
    3.5–3.6 s against 2.2–2.5 s), each tile's operations costing more than the cache saved. On a GPU (`device`),
    64 times the keys (`workspace`): a launch filled, no cache to fit."""
    return max(1, workspace(TILE_NUMBERS, device) // (batch * heads * r))


def index_scores(qi: torch.Tensor, ki: torch.Tensor, w: torch.Tensor, kt: torch.Tensor | None = None) -> torch.Tensor:
    """I_{t,s} = Σ_j w_j · ReLU(q^I_{t,j} · k^I_s) for qi (B, r, IH·dI) and ki (B, m, dI) → (B, r, m). Given the
    keys transposed (`kt`, (B, dI, m): a caller that scores many steps against the same keys makes them once), on a
    CPU with AVX-512 or AVX2, in float32: `native.index_scores`, 2.6 times faster than the tiles below at n = 16384
    with AVX-512, 1.2-1.5 times with AVX2 (docs/native.md). Else a
    tile of keys at a time (`key_tile`): the products of every indexer head and row with the tile's keys, laid out
    head-major (B, IH·r, tile), ReLU in place, then the weighted sum over heads as one product of w (1 × IH) with
    them (a stream, not many small products; a generation step's one row reads the cached keys in place)."""
    if kt is not None and native.index_runs(qi):
        return native.index_scores(qi, kt, w)
    B, r, _ = qi.shape
    heads, m = w.shape[0], ki.shape[1]
    qh = qi.reshape(B, r, heads, -1).transpose(1, 2).reshape(B, heads * r, -1)
    out = qi.new_empty(B, r, m)
    tile = key_tile(B, heads, r, qi.device.type)
    for c in range(0, m, tile):
        raw = (qh @ ki[:, c:c + tile].transpose(1, 2)).relu_()  # (B, IH·r, tile)
        out[:, :, c:c + tile] = (w[None, None] @ raw.view(B, heads, -1)).view(B, r, -1)
        del raw  # not beside the next tile's products
    return out


def topk_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, *, causal: bool = False,
                   key_padding_mask: torch.Tensor | None = None, top_k: int = 2048, index_heads: int = 4,
                   index_dim: int = 32, index_q: torch.Tensor | None = None, index_k: torch.Tensor | None = None,
                   index_w: torch.Tensor | None = None, seed: int = 0,
                   sinks: torch.Tensor | None = None) -> torch.Tensor:
    """o_t = softmax over S_t of q_t·k_s/√D, times v_s, where S_t holds the top_k keys by the indexer's score
    I_{t,s} = Σ_j w_j · ReLU(q^I_{t,j} · k^I_s) (causal: among s ≤ t; padded keys never). With top_k ≥ the keys a
    query sees, softmax attention.

    q (B, H, Nq, D), k and v (B, Hk, Nk, D) → (B, H, Nq, D). The indexer reads the mean query of the H heads and the
    mean key of the Hk heads (`index_queries`, `index_keys`: the paper projects the token's hidden state, which
    attention never sees), so one selection per token serves every head, as DeepSeek Sparse Attention selects per
    token for all heads; mean heads are invariant to repeating shared heads. `index_q` (D, IH·dI), `index_k`
    (D, dI), `index_w` (IH,): the projections and weights (`init_state` draws seeded ones; None: drawn from `seed`).
    Query blocks of `rows` queries: the indexer's scores a few rows at a time (`index_rows` × the block's keys,
    never n × n), each step's selection written into the block's, then softmax over the block's selected keys by
    sparse products that read k and v in place (`_sparse.selected_softmax`).
    O(n²·dI·IH + n·top_k·D·H) time, O(n·(D·H + IH·dI)) memory. Ties at a query's top_k-th score go to the earlier
    keys (`select`). The selection is not differentiable: gradients flow through the selected softmax only.
    `sinks` (H,): head h's logit joins the softmax over each query's selected keys with no value (gpt-oss, arXiv
    2508.10925); it changes no selection. On the CPU without gradients the C++ softmax adds e^(a_h − M) to each
    row's sum of weights in its one pass (M the row's highest score), so a sink costs one exponential a row.
    """
    s = checked_shape(SPEC, q, k, v, causal, top_k=top_k, index_heads=index_heads, index_dim=index_dim)
    if key_padding_mask is not None:
        check_key_padding(SPEC, key_padding_mask, q, k)
    if sinks is not None:
        check_sinks(SPEC, sinks, q)
    wq, wk, w = _state(q, index_q, index_k, index_w, seed, index_heads, index_dim)
    with torch.no_grad():
        qi, ki = index_queries(q, wq), index_keys(k, wk)
    r = rows(s, top_k, index_heads)
    work = work_dtype(q.dtype)
    kw, vw = k.to(work), v.to(work)  # once, not a block at a time (half inputs)
    # finite indexer inputs make scores without NaN (short of overflow past 3·10³⁸): the fast selections may run.
    # An inf or NaN carries into a sum, which, unlike isfinite, makes nothing the size of the queries (a sum that
    # overflows from finite values says no: the exact selection, still right)
    finite = all(bool(torch.isfinite(x.sum())) for x in (qi, ki, w))
    kt = ki.transpose(1, 2).contiguous() if native.index_runs(qi) else None  # the C++ indexer's keys, once
    out = q.new_empty(q.shape)
    for a in range(0, s.Nq, r):
        e = min(a + r, s.Nq)
        m = e if causal else s.Nk
        kk = min(top_k, m)
        idx = torch.empty(s.B, e - a, kk, dtype=torch.long, device=q.device)
        usable = torch.empty(s.B, e - a, kk, dtype=torch.bool, device=q.device)
        step = index_rows(s.B, index_heads, s.Nk, s.device)  # as many rows as the last blocks (causal: m is shorter)
        with torch.no_grad():
            for i in range(a, e, step):  # the indexer a few rows at a time, their scores in cache
                j = min(i + step, e)
                scores = index_scores(qi[:, i:j], ki[:, :m], w, None if kt is None else kt[:, :, :m])
                if causal:  # keys after a query: from its own position on, within the block's m
                    scores[..., i:].masked_fill_(torch.ones(j - i, m - i, dtype=torch.bool, device=q.device)
                                                 .triu_(1), NEG)
                if key_padding_mask is not None:
                    scores.masked_fill_(key_padding_mask[:, None, :m], NEG)
                idx[:, i - a:j - a], usable[:, i - a:j - a] = select(scores, kk, finite=finite)
                del scores
        out[:, :, a:e] = selected_softmax(q[:, :, a:e], kw[:, :, :m], vw[:, :, :m], idx[:, None], usable[:, None],
                                          sinks)
        del idx, usable  # not alive beside the next block's indexer
    return out


# -- generation: a key-value cache beside the indexer's keys ------------------------------------------------
class TopkCache(KVCache):
    """The tokens' keys and values (`rings['tokens']`) and their indexer keys `index` (B, capacity, dI), written in
    place and doubling with the keys; the indexer's projections and weights (`index_q`, `index_k`, `index_w`) are the
    layer's, not counted in `nbytes`; `sinks` (H,) the layer's sink logits, or None."""

    def __init__(self, params: dict, k, v, ki: torch.Tensor, state: tuple, *, max_len: int | None = None,
                 sinks: torch.Tensor | None = None):
        super().__init__(params, k, v, max_len=max_len, sinks=sinks)
        self.index = ki.new_empty(ki.shape[0], self.rings["tokens"].capacity, ki.shape[-1])
        self.index[:, :ki.shape[1]] = ki
        self.index_q, self.index_k, self.index_w = state

    def append(self, k, v):
        keys, values = super().append(k, v)
        if self.index.shape[1] < self.rings["tokens"].capacity:  # the ring doubled: so do the indexer keys
            grown = self.index.new_empty(self.index.shape[0], self.rings["tokens"].capacity, self.index.shape[-1])
            grown[:, :self.index.shape[1]] = self.index
            self.index = grown
        self.index[:, self.length - 1:self.length] = index_keys(k, self.index_k)
        return keys, values

    def tensors(self) -> tuple[torch.Tensor, ...]:
        return (*super().tensors(), self.index)

    @property
    def used_bytes(self) -> int:
        return super().used_bytes + tensor_bytes(self.index[:, :self.length])


def _remember(k, v, *, max_len: int | None = None, top_k: int = 2048, index_heads: int = 4, index_dim: int = 32,
              index_q=None, index_k=None, index_w=None, seed: int = 0,
              sinks: torch.Tensor | None = None) -> TopkCache:
    """Every token's key and value, and its indexer key k^I (B, n, dI): a step scores them all (O(n·dI·IH)) and
    attends over top_k of them (O(top_k·D)); O(n·(D·Hk + dI)) kept."""
    state = _state(k, index_q, index_k, index_w, seed, index_heads, index_dim)
    with torch.no_grad():
        ki = index_keys(k, state[1])
    params = {"top_k": top_k, "index_heads": index_heads, "index_dim": index_dim}
    return TopkCache(params, k, v, ki, state, max_len=max_len, sinks=sinks)


def _step(q, k, v, cache: TopkCache):
    """The new token's key, value and indexer key written in place, then its top_k cached keys by the indexer's
    score (all of them while fewer), and softmax over them."""
    keys, values = cache.append(k, v)
    top_k = min(cache.params["top_k"], keys.shape[2])
    with torch.no_grad():
        scores = index_scores(index_queries(q, cache.index_q), cache.index[:, :cache.length], cache.index_w)
        idx, usable = select(scores, top_k, finite=bool(torch.isfinite(scores).all()))
        del scores
    return selected_softmax(q, keys, values, idx[:, None], usable[:, None], cache.sinks), cache


def _cache_bytes(s: Shape, top_k: int = 2048, index_heads: int = 4, index_dim: int = 32) -> float:
    """Keys and values of every token, and one indexer key per token (work dtype)."""
    return kv_bytes(s, s.Nk) + s.B * s.Nk * index_dim * max(s.elem, 4)


def _step_flops(s: Shape, top_k: int = 2048, index_heads: int = 4, index_dim: int = 32) -> float:
    """The new token's indexer query and key (2·D·dI·(IH + 1)), its scores over the n cached indexer keys
    (2·n·dI·IH) and their weighted sum (2·n·IH), and softmax over min(top_k, n) keys per query head (4·top_k·D)."""
    n, kk = s.Nk, min(top_k, s.Nk)
    return s.B * (2.0 * s.D * index_dim * (index_heads + 1) + 2.0 * n * index_heads * (index_dim + 1)) + \
        4.0 * s.bh * kk * s.D


# -- what it costs ---------------------------------------------------------------------------------------------
def _blocks(s: Shape, top_k: int, index_heads: int) -> list[tuple[int, int, int]]:
    """(first row, rows, keys the indexer scores) of the blocks a peak can come from: every stage grows with a
    block's rows and keys, so the last full block and the last, partial one; causal, also the last block whose first
    rows take the exact selection (`_forms`), where its own stages may outgrow the sampled one's in the last blocks.
    O(1), not a block at a time: the theory searches ask for millions of tokens."""
    r = rows(s, top_k, index_heads)
    full, rest = divmod(s.Nq, r)
    starts = ([((full - 1) * r, r)] if full else []) + ([(full * r, rest)] if rest else [])
    if s.causal and full:  # the block holding the row before the first the sampled form can take
        starts.append((max(0, min((_first_sampled(s.Nq, min(top_k, s.Nq)) - 1) // r, full - 1)) * r, r))
    return [(a, rr, a + rr if s.causal else s.Nk) for a, rr in starts]


def _projections(s: Shape, index_heads: int, index_dim: int) -> float:
    return 2.0 * s.B * s.D * index_dim * (s.Nq * index_heads + s.Nk)


def _flops(s: Shape, top_k: int = 2048, index_heads: int = 4, index_dim: int = 32) -> float:
    """The indexer over the keys each query may see (causal: s ≤ t), then softmax over min(top_k, visible) keys per
    query head: 2·IH·(dI + 1) per scored pair, 4·D per selected pair and head, and the projections."""
    n = s.Nk
    if s.causal:
        pairs = n * (n + 1) / 2
        kk = min(top_k, s.Nq)
        selected = kk * (kk + 1) / 2 + (s.Nq - kk) * kk  # Σ_t min(top_k, t + 1)
    else:
        pairs, selected = s.Nq * n, s.Nq * min(top_k, n)
    return _projections(s, index_heads, index_dim) + 2.0 * s.B * pairs * index_heads * (index_dim + 1) + \
        4.0 * s.bh * selected * s.D


def _executed_flops(s: Shape, top_k: int = 2048, index_heads: int = 4, index_dim: int = 32) -> float:
    """The indexer over whole blocks (causal: each block against the keys up to its last query) and softmax over
    min(top_k, those keys) per query, the masked selections included: sums over the blocks in closed form."""
    r = rows(s, top_k, index_heads)
    full, rest = divmod(s.Nq, r)
    if s.causal:  # full block i ends at (i + 1)·r; the partial one at Nq
        scored = r * r * full * (full + 1) / 2 + rest * s.Nq
        few = min(full, top_k // r)  # full blocks that end within top_k keys
        selected = r * r * few * (few + 1) / 2 + (full - few) * r * top_k + rest * min(top_k, s.Nq)
    else:
        scored, selected = s.Nq * s.Nk, s.Nq * min(top_k, s.Nk)
    return _projections(s, index_heads, index_dim) + 2.0 * s.B * scored * index_heads * (index_dim + 1) + \
        4.0 * s.bh * selected * s.D


def _memory(s: Shape, top_k: int = 2048, index_heads: int = 4, index_dim: int = 32, sinks: bool = False) -> float:
    """Peak bytes above the inputs: the indexer's queries and keys (and, for the C++ indexer, the keys transposed),
    the output (and float32 copies of half k, v), and the largest stage of one query block, in the order the kernel
    makes them. Beside the block's selection (int64 indices and a flag, 9 bytes a selected key) and an indexer
    step's (`index_rows`) scores: the indexer's work (torch's tiles: its queries laid out by head beside one tile's
    products, `key_tile`, of every indexer head and their weighted sum; the C++ indexer, on a CPU with AVX-512 or
    AVX2, in float32: nothing torch's allocator holds, each thread packing a block of keys, 128 KiB, of its own), the
    step's causal mask, its selection (on the CPU the C++ form's indices and flags beside its scratch,
    `native.scratch_bytes`; elsewhere `_sampled_bytes`, or the exact form's values and int64 indices beside
    a flag per score and its sort, in the blocks that take each, `_forms`). Then the sparse products over the block
    (`_sparse.selected_softmax_bytes`; `sinks`: with the sink's log-sum-exp found beside it)."""
    e, w = s.elem, max(s.elem, 4)
    fixed = s.B * (s.Nq * index_heads * index_dim + s.Nk * index_dim) * w + s.output_bytes
    if e < w:
        fixed += 2 * s.bk * s.Nk * s.D * w
    peak = 0.0
    step = index_rows(s.B, index_heads, s.Nk, s.device)
    in_cpp = s.device == "cpu" and native.expected()  # the selection's C++ form (finite inputs)
    in_index = in_cpp and w == 4 and native.index_expected()  # the C++ indexer (float32 work), its keys transposed
    fixed += in_index * s.B * index_dim * s.Nk * w
    for a, r, m in _blocks(s, top_k, index_heads):
        kk = min(top_k, m)
        E = s.B * r * kk
        ri = min(r, step)  # an indexer step's rows
        t = min(m, key_tile(s.B, index_heads, ri, s.device))  # an indexer product's keys
        Ei, scores = s.B * ri * kk, s.B * ri * m * w
        held = 9 * E  # the block's sorted indices and usable flags
        exact, sampled = (False, False) if in_cpp else _forms(a, r, m, kk, step, s.causal)
        peak = max(peak,
                   held + scores + max((not in_index) * s.B * ri * (index_heads * index_dim + (index_heads + 1) * t)
                                        * w,  # the indexer's tiles (C++: nothing beside the scores)
                                        ri * m * s.causal,  # its causal mask
                                        exact * (s.B * ri * m + Ei * (w + 8)),  # top-k with its tie check
                                        exact * Ei * (w + 26),  # the sort: values, indices, flags, their sort
                                        sampled * _sampled_bytes(s.B * ri, m, kk, w),  # or the sampled selection
                                        in_cpp * (9 * Ei + native.scratch_bytes(m, s.B * ri, w))),  # or C++'s
                   held + selected_softmax_bytes(s, r, kk, m, sinks=sinks))
    return fixed + peak


def _keep(q, k, causal: bool, state: dict, top_k: int = 2048, index_heads: int = 4,
          index_dim: int = 32) -> torch.Tensor:
    """(B, Nq, Nk) boolean: the keys each query keeps, the kernel's selection over all rows at once (small n)."""
    wq, wk, w = _state(q, state.get("index_q"), state.get("index_k"), state.get("index_w"), 0, index_heads,
                       index_dim)
    with torch.no_grad():
        scores = index_scores(index_queries(q, wq), index_keys(k, wk), w)
        n, m = q.shape[2], k.shape[2]
        if causal:
            scores.masked_fill_(torch.ones(n, m, dtype=torch.bool, device=q.device).triu_(1), NEG)
        idx, usable = select(scores, min(top_k, m))
        return torch.zeros(scores.shape, dtype=torch.bool, device=q.device).scatter_(-1, idx, usable)


def _selected(q, k, causal: bool, state: dict, **params) -> tuple[torch.Tensor, tuple[str, ...]]:
    """The cells softmax reads: batch 0's kept keys, one selection for every head (1, Nq, Nk); no further columns."""
    return _keep(q, k, causal, state, **params)[:1], ()


def _reads(n: int, causal: bool, top_k: int = 2048, index_heads: int = 4, index_dim: int = 32) -> tuple[float, str]:
    """Σ_t min(top_k, keys t sees) cells read by softmax; the indexer scores all of those keys."""
    if causal:
        kk = min(top_k, n)
        cells, scored = kk * (kk + 1) / 2 + (n - kk) * kk, n * (n + 1) / 2
    else:
        cells, scored = n * min(top_k, n), n * n
    every = "every earlier key" if causal else "every key"
    return cells, (f"{cells / (n * n):.1%} of the n² cells read by softmax (each query's top_k keys); the indexer "
                   f"scores {every} ({scored / (n * n):.1%} of the cells), cheaply: {index_heads} heads × "
                   f"{index_dim} products a cell, once for all heads")


def _effective(q, k, v, causal: bool, state: dict, top_k: int = 2048, index_heads: int = 4,
               index_dim: int = 32) -> tuple[torch.Tensor, torch.Tensor]:
    """The dense (B, H, Nq, Nk) weights: softmax over each query's selected keys, zero elsewhere; values repeated
    for shared heads (a picture, not a kernel)."""
    keep = _keep(q, k, causal, state, top_k, index_heads, index_dim)
    k, v = repeated(q, k, v)
    logits = (q @ k.transpose(-2, -1) * scale(q.shape[-1])).masked_fill(~keep[:, None], NEG)
    return torch.softmax(logits, dim=-1), v


def _fused(**_) -> bool:
    """Whether the call runs the C++ kernels (indexer, selection, softmax: a few long parallel regions a block), so
    that where other programs hold every core it keeps torch's threads (`Cost.keeps_threads`). With two programs
    spinning on this 2-core EPYC, n = 16384 causal, 3 rounds interleaved: 7.9 s on two threads against 10.4 s on
    one (SDPA 5.3 s); NSA, whose branches are torch's many operations, was slower on two (12.9 s against 10.5)."""
    return native.expected()


SPEC = MechanismSpec(
    label="Top-k (DeepSeek sparse)",
    fn=topk_attention,
    description="A small indexer (ReLU of dot products in index_dim, weighted over index_heads) scores every key for "
                "each query; the query keeps its top_k keys and runs exact softmax over them: quadratic, but cheap "
                "quadratic.",
    paper="DeepSeek-AI 2025, 'DeepSeek-V3.2', arXiv 2512.02556 (DeepSeek Sparse Attention: lightning indexer and "
          "top-k token selection)",
    params=(Param("top_k", 2048, 1, 1 << 20, "Keys each query keeps, by the indexer's score (DeepSeek-V3.2: 2048).",
                  log=True, tokens=True, small=lambda n: max(1, n // 4)),
            Param("index_heads", 4, 1, 128, "Indexer heads, each a ReLU of dot products, weighted and summed "
                  "(DeepSeek-V3.2: 64)."),
            Param("index_dim", 32, 1, 512, "Width of the indexer's queries and keys (DeepSeek-V3.2: 128).",
                  log=True)),
    exact=False,
    state=State(init=init_state, keys=("index_q", "index_k", "index_w")),
    cost=Cost(flops=_flops, executed_flops=_executed_flops, memory_bytes=_memory,
              time_big_o="O(n²·dI·IH + n·k·d)", memory_big_o="O(n·d)",
              sinks_memory_bytes=lambda s, **p: _memory(s, **p, sinks=True), keeps_threads=_fused),
    supports=Supports(
        no_rope_relative=("Its indexer scores keys through fixed projections and a ReLU: which keys are kept changes "
                          "when every position shifts, though the softmax over them is relative."),
        causal=True,
        cross=True,
        padding=True,
        shared_kv=True,
        sinks=True,
        generation=Generation(remember=_remember, step=_step, cache_bytes=_cache_bytes, step_flops=_step_flops,
                              step_big_o="O(n·dI·IH + k·d)", cache_big_o="O(n·d)"),
    ),
    insight=Insight(
        effective=_effective,
        selected=_selected,
        reads=_reads,
        regime=("peaky", "gaussian", "Softmax over the top_k keys is exact where the weight sits on a few keys the "
                "indexer ranks high; with weight spread over many keys the dropped ones carry mass, and an untrained "
                "indexer ranks keys at random with respect to q·k."),
        accuracy_note="Top-k approximates softmax by keeping the top_k keys that an untrained (random) indexer "
                      "picks: DeepSeek-V3.2 trains its indexer to match the attention's own distribution, so these "
                      "errors are larger than a trained indexer's; with top_k ≥ n it is softmax exactly.",
    ),
)
