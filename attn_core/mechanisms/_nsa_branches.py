"""Native Sparse Attention's three branches over one block of queries (nsa.py): compression, selection and the
sliding window, and the block's peak bytes, stage by stage (Yuan et al. 2025, arXiv 2502.11089)."""
from __future__ import annotations

import math

import torch

from .. import native
from ..spec import Shape
from ._common import scale
from ._sparse import block_softmax, block_softmax_bytes, selected_softmax_bytes


def compressed(x: torch.Tensor, block: int, stride: int) -> torch.Tensor:
    """Mean of each block of `block` tokens starting every `stride`: x (B, Hk, n, D) → (B, Hk, m, D),
    m = ⌊(n − block)/stride⌋ + 1 (0 when n < block). The paper compresses with a learned MLP (with an intra-block
    position encoding); the mean is its parameter-free stand-in."""
    n = x.shape[2]
    if n < block:
        return x.new_empty(*x.shape[:2], 0, x.shape[-1])
    return x.unfold(2, block, stride).mean(-1)


def visible_blocks(t: int, block: int, stride: int) -> int:
    """Compressed blocks a query at position t sees: those ending at or before it, i·stride + block − 1 ≤ t."""
    return 0 if t + 1 < block else (t + 1 - block) // stride + 1


def _block_scores(p: torch.Tensor, s: int, e: int, block: int, stride: int, select_block: int) -> torch.Tensor:
    """Selection-block importance from compressed attention p (B, Hk, r, c), summed over a group's query heads: each
    compressed block's probability spread evenly over the tokens it pooled, then summed over each selection block of
    `select_block` tokens (the paper's Eq. 9 weighs the overlapping blocks by their spatial relationship; this is that
    overlap in tokens). Works in units of g = gcd(block, stride, select_block) tokens, sums of non-negative terms only,
    so a block no compressed block covers scores exactly 0. → (B, Hk, r, ⌈e/select_block⌉)."""
    g = math.gcd(block, stride, select_block)
    nsel = -(-e // select_block)
    units, per_sel = nsel * select_block // g, select_block // g
    start = p.new_zeros(*p.shape[:-1], units)
    c = p.shape[-1]
    start[..., 0:c * (stride // g):stride // g] = p * (g / block)
    mass = start.clone()
    for o in range(1, block // g):  # a compressed block covers block/g units from its start
        mass[..., o:] += start[..., :-o]
    return mass.view(*p.shape[:-1], nsel, per_sel).sum(-1)


def _selected(score: torch.Tensor, s: int, e: int, select_block: int, select_blocks: int) -> torch.Tensor:
    """Indices (B, Hk, r, S') of the blocks each query reads, S' = min(select_blocks, blocks so far), in no set
    order: the first block and the query's own block always, then the highest scores, ties to the earlier block;
    blocks past the query are ranked last and masked by the caller. Scores are sums of probabilities (≥ 0, or ±∞),
    whose float bits order as the numbers do: in float32 and half types each is made one int64 key, its bits above
    and the block's place from the end below, so that a top-k of the keys is exact and ties go to the earlier
    block (a stable sort of each row, 5.6× slower at 256 blocks, in float64, whose bits fill the key)."""
    t = torch.arange(s, e, device=score.device)
    j = torch.arange(score.shape[-1], device=score.device)
    score = score.masked_fill(j * select_block > t[:, None], float("-inf"))
    score[..., 0] = float("inf")
    score.scatter_(-1, (t // select_block)[:, None].expand(*score.shape[:-1], 1), float("inf"))
    kept = min(select_blocks, score.shape[-1])
    if score.dtype == torch.float64:
        return torch.sort(score, dim=-1, descending=True, stable=True).indices[..., :kept]
    bits = {4: torch.int32, 2: torch.int16}[score.element_size()]
    key = score.view(bits).to(torch.int64)
    del score
    key.bitwise_left_shift_(32).bitwise_or_(j.flip(0))  # ties: the earlier block's key is the larger
    return key.topk(kept, dim=-1, sorted=False).indices


def _softmax_rows(scores: torch.Tensor, dead_ok: bool) -> torch.Tensor:
    """softmax over the last axis; `dead_ok`: a row whose scores are all −∞ gives zeros, not NaN."""
    if not dead_ok:
        return torch.softmax(scores, dim=-1)
    dead = scores.amax(-1, keepdim=True) == float("-inf")
    return torch.softmax(scores.masked_fill(dead, 0.0), dim=-1).masked_fill(dead, 0.0)


def rows(q, k, v, kc, vc, s: int, gates, *, block: int, stride: int, select_block: int, select_blocks: int,
         window: int, selectable: tuple | None = None, sinks: torch.Tensor | None = None) -> torch.Tensor:
    """The outputs of queries at positions s … e−1 (q (B, H, r, D), e = s + r) over keys and values k, v
    (B, Hk, ≥ e, D) in token order and their compressed kc, vc (B, Hk, ≥ visible, D); gates (B, H, r) each;
    `selectable`: k and v padded to whole selection blocks (`nsa_attention`), else k and v.
    Per key/value head, its H/Hk query heads stacked as rows: compression (softmax over the visible compressed
    blocks), selection (softmax over the gathered tokens of the chosen blocks, ≤ t) and the window
    (t − window < j ≤ t).
    `sinks` (H,): head h's logit joins each branch's softmax with no value (gpt-oss, arXiv 2508.10925), each
    branch's rows scaled by σ(ℓ − a_h) (`_branch_sink`); the blocks are ranked as without them."""
    if sinks is not None:
        sinks = sinks.view(k.shape[1], -1, 1)  # (Hk, G, 1): a group's heads, as the branches stack them
    B, H, r, D = q.shape
    Hk, e = k.shape[1], s + q.shape[2]
    G = H // Hk
    t = torch.arange(s, e, device=q.device)
    qs = (q * scale(D)).view(B, Hk, G * r, D)

    # compression: the blocks visible to the last query; earlier queries mask those ending after them
    c = visible_blocks(e - 1, block, stride)
    out_cmp = None
    if c:
        sc = (qs @ kc[:, :, :c].transpose(-2, -1)).view(B, Hk, G, r, c)
        ends = torch.arange(c, device=q.device) * stride + block - 1
        sc.masked_fill_(ends > t[:, None], float("-inf"))
        top = None if sinks is None else sc.amax(-1)  # each row's largest score, for its log-sum-exp
        p = _softmax_rows(sc, dead_ok=s < block - 1)
        out_cmp = (p.view(B, Hk, G * r, c) @ vc[:, :, :c]).view(B, H, r, D)
        if sinks is not None:
            out_cmp = out_cmp * _branch_sink(top, p, sinks).view(B, H, r, 1)
        score = _block_scores(p.sum(2), s, e, block, stride, select_block)
        del sc, p
    else:
        score = q.new_zeros(B, Hk, r, -(-e // select_block))

    # selection: one set of blocks per key/value head and query, each block's keys read in place (no copy of k, v)
    idx = _selected(score, s, e, select_block, select_blocks)  # (B, Hk, r, S')
    ks, vs = (k, v) if selectable is None else selectable
    out_slc = block_softmax(q, ks, vs, idx, select_block, s, None if sinks is None else sinks.flatten())
    del idx

    # sliding window: keys lo … e−1
    lo = max(0, s - window + 1)
    sw = (qs @ k[:, :, lo:e].transpose(-2, -1)).view(B, Hk, G, r, e - lo)
    j = torch.arange(lo, e, device=q.device)
    sw.masked_fill_((j > t[:, None]) | (j <= t[:, None] - window), float("-inf"))
    top = None if sinks is None else sw.amax(-1)  # every row sees itself: finite
    sw = torch.softmax(sw, dim=-1)  # the scores' buffer freed before the product (a half product's scratch beside)
    win_weight = None if sinks is None else _branch_sink(top, sw, sinks)
    out_win = (sw.view(B, Hk, G * r, e - lo) @ v[:, :, lo:e]).view(B, H, r, D)
    del sw
    if win_weight is not None:
        out_win = out_win * win_weight.view(B, H, r, 1)

    g_cmp, g_slc, g_win = (x[..., None] for x in gates)
    out = out_slc * g_slc + out_win * g_win
    return out if out_cmp is None else out + out_cmp * g_cmp


def _branch_sink(top: torch.Tensor, p: torch.Tensor, sinks: torch.Tensor) -> torch.Tensor:
    """σ(ℓ − a) (B, Hk, G, r, 1) of a branch whose scores (B, Hk, G, r, L), −∞ where a key is hidden, have row
    maxima `top` (B, Hk, G, r) and softmax `p`, and the sinks (Hk, G, 1) of a group's heads: the share of its mass a
    row's keys keep once the sink joins its denominator (`_common.sink_weight`). ℓ is read off the softmax instead
    of a second pass of exponentials (a log-sum-exp: 6–9% of NSA's call at 16k): a row's largest probability is
    e^(m − ℓ), at its largest score m, so ℓ = m − log max p; two passes of maxima, O(r·L) comparisons. A row with no
    key (m = −∞) gets 0, so a branch a row sees nothing of outputs zeros.
    The blocks stay ranked by the compressed probabilities without the sink: σ(ℓ − a_h) is one factor a row and head,
    which would only reweigh a group's heads against each other, so sinks change what the branches output, not which
    tokens they read."""
    lse = torch.where(top == float("-inf"), top, top - torch.log(p.amax(-1)))
    return torch.sigmoid(lse - sinks.to(top.dtype))[..., None]


def _block_bytes(s: Shape, a: int, end: int, *, block: int, stride: int, select_block: int, select_blocks: int,
                 window: int, sinks: bool = False) -> float:
    """Peak bytes of `rows` over queries a … end − 1, stage by stage in the order it makes them, each beside the
    scaled queries: the compressed scores beside the mask of blocks ending after a query; their softmax (into two
    copies where a row sees no block yet); the compressed output, the group's summed probabilities and the block
    scores' units, start and running mass, beside both (`_block_scores`); then, beside the compressed output and the
    block scores, the ranking (`_selected`: a masked copy made int64 keys, then their top-k's values and indices;
    in float64 the copy sorted, values and int64 order); on the CPU with the kernels, their products
    (`block_softmax_bytes`), else the kept blocks' sort, the positions (int64, from the blocks' own) and their
    flags, and the sparse products (`selected_softmax_bytes`); the window's scores beside their three masks and its
    keys' positions, then softmax, then the output beside the probabilities; the gated sum. The queries' positions
    and the blocks' ends (int64) from the compression on."""
    e = s.elem
    r, c = end - a, visible_blocks(end - 1, block, stride)
    nsel = -(-end // select_block)
    kept_blocks = min(select_blocks, nsel)
    L = kept_blocks * select_block
    E, out = s.bk * r * L, s.bh * r * s.D * e  # selected positions; one output of the block's rows (bytes)
    chosen = s.bk * r * nsel * e  # the block scores
    if c:
        sc, summed = s.bh * r * c * e, s.bk * r * c * e
        units = s.bk * r * (nsel * select_block // math.gcd(block, stride, select_block)) * e
        compression = out + max(sc + r * c, (3 if a < block - 1 else 2) * sc,
                                2 * sc + out + summed + max(units + summed, 2 * units + chosen))
    else:
        compression = out + chosen
    kept = 2 * out + chosen if c else out + chosen  # the scaled queries, the compressed output, the block scores
    kept += 8 * (r + c)  # the queries' positions and the compressed blocks' ends (int64)
    order, ranked = s.bk * r * kept_blocks * 8, s.bk * r * nsel * 8  # the kept blocks; every block ranked (int64)
    m = s.Nk + -s.Nk % select_block  # the keys, padded to whole selection blocks
    if e == 8:  # float64: a stable sort (values and order), whose kept view holds the whole order
        rank, held = chosen * 2 + ranked, ranked
    else:  # the masked copy beside the int64 keys, then the keys beside the top-k's values and indices
        rank, held = max(chosen + ranked, ranked + 2 * order), order
    if s.device == "cpu" and native.expected():  # native.block_softmax reads the kept blocks as they are
        ranking = kept + rank
        products = kept + held + block_softmax_bytes(s, r, kept_blocks, m, select_block, s.bk // s.B,
                                                     copied=e == 8 and kept_blocks < nsel)
        positions = 0
    else:  # the kept blocks sorted, spelled out as positions and flags for selected_softmax
        ranking = kept + max(rank, held + 2 * order)
        positions = kept + held + order + 8 * E + max(order, E)
        products = kept + held + 9 * E + selected_softmax_bytes(s, r, L, m, s.bk // s.B, sinks)
    wn = end - max(0, a - window + 1)
    sw = s.bh * r * wn * e
    windowed = kept + out + 8 * wn + max(sw + 3 * r * wn, 2 * sw, sw + out)
    gated = kept + 5 * out
    return max(compression, ranking, positions, products, windowed, gated)
