"""Exact attention for banded patterns, block by block, without any n×n tensor (shared by local, sliding window and
Longformer), and the dense rows of global tokens (Longformer, BigBird). What they cost: _banded_memory.py."""
from __future__ import annotations

import functools
import math
from typing import NamedTuple

import torch
import torch.nn.functional as F

from .. import native
from ..masks import Pattern
from ._common import fold, group_sinks, sink_weight, unfold
from .sdpa import shared_sdpa, sink_sdpa

# Scores held at once per chunk of query blocks, in elements (over all batch·heads): bounds the workspace.
CHUNK_ELEMS = 1 << 21


class Extra(NamedTuple):
    """Keys every query block may see besides its band (Longformer's global tokens): keys and values (B, Hk, g, D)
    at sequence positions (g,), kept for query i where `pattern` allows and the band's pattern does not (so a key
    inside the band is counted once)."""

    k: torch.Tensor
    v: torch.Tensor
    positions: torch.Tensor
    pattern: Pattern


def chunk_blocks(heads: int, block: int, span: int) -> int:
    """How many query blocks one chunk processes: as many as keep heads·c·block·span ≤ CHUNK_ELEMS."""
    return max(1, CHUNK_ELEMS // (heads * block * span))


def _key_slab(x: torch.Tensor, start: int, stop: int) -> torch.Tensor:
    """x[:, :, start:stop] along the sequence, zero rows where [start, stop) leaves [0, n)."""
    n = x.shape[-2]
    inside = x[:, :, max(start, 0):min(stop, n)]
    if start >= 0 and stop <= n:
        return inside
    return F.pad(inside, (0, 0, max(0, -start), max(0, stop - n)))


def padding_bias(key_padding_mask: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """(B, 1, Nk, 1) additive key bias: 0, or a quarter of the lowest finite value where the key is padding. With
    the pattern's floor of half the lowest value the sum stays finite (no −inf, so no NaN); a row whose best score
    lies below `dead_below` saw no unpadded key."""
    bias = torch.zeros(key_padding_mask.shape, dtype=dtype, device=key_padding_mask.device)
    return bias.masked_fill_(key_padding_mask, torch.finfo(dtype).min / 4)[:, None, :, None]


def dead_below(dtype: torch.dtype) -> float:
    """Scores (with their biases) below this are masked or padded keys: finite scores are far above it."""
    return torch.finfo(dtype).min / 8


def softmax_seen(scores: torch.Tensor, values: torch.Tensor, sinks: torch.Tensor | None = None) -> torch.Tensor:
    """softmax(scores) @ values, its biases already in the scores; a row whose best score lies below `dead_below`
    (it sees no unpadded key) outputs zeros. `sinks`: each row's sink logit, broadcastable to scores[..., 0]; the
    rows scaled by σ(ℓ − a), ℓ their log-sum-exp (one more scores-sized temporary while it is summed)."""
    dead = scores.amax(-1, keepdim=True) < dead_below(scores.dtype)
    out = (torch.softmax(scores, dim=-1) @ values).masked_fill_(dead, 0.0)
    if sinks is None:
        return out
    return out * torch.sigmoid(torch.logsumexp(scores, -1) - sinks.to(scores.dtype))[..., None]


# -- query blocks of a group of heads sharing a key/value head (grouped-query attention, arXiv 2305.13245)
def query_blocks(q: torch.Tensor, key_heads: int, qs: int, c: int, block: int) -> torch.Tensor:
    """The scaled queries (q/√D) of the c blocks from row qs, the r = H/Hk query heads of a group stacked as each
    block's rows: q (B, H, n, D) → (B, Hk, c, r·block, D), row ρ of a block is head ρ // block of the group at
    position qs + block·β + ρ mod block; zero rows past n. One copy, whatever r."""
    B, H, n, D = q.shape
    r, full = H // key_heads, min(c, (n - qs) // block)  # whole blocks; the last of all may be partial
    qc = (q.new_empty if full == c else q.new_zeros)(B, key_heads, c, r, block, D)
    heads = q.unflatten(1, (key_heads, r))  # (B, Hk, r, n, D), a view
    if full:
        qc[:, :, :full] = heads[:, :, :, qs:qs + full * block].unflatten(3, (full, block)).transpose(2, 3)
    if full < c:
        qc[:, :, full, :, :n - qs - full * block] = heads[:, :, :, qs + full * block:]
    return qc.mul_(1.0 / math.sqrt(D)).view(B, key_heads, c, r * block, D)


def write_blocks(out: torch.Tensor, rows: torch.Tensor, qs: int, block: int) -> None:
    """Inverse of `query_blocks`: out (B, H, n, D) rows from qs ← rows (B, Hk, c, r·block, D), cut at n."""
    B, H, n, D = out.shape
    Hk, c = rows.shape[1], rows.shape[2]
    r, full = H // Hk, min(c, (n - qs) // block)
    src = rows.unflatten(3, (r, block)).transpose(2, 3)  # (B, Hk, r, c, block, D), a view whatever rows' strides
    heads = out.view(B, Hk, r, n, D)
    if full:
        heads[:, :, :, qs:qs + full * block].unflatten(3, (full, block)).copy_(src[:, :, :, :full])
    if full < c:
        heads[:, :, :, qs + full * block:] = src[:, :, :, full, :n - qs - full * block]


def banded_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, *, pattern: Pattern, block: int,
                     left: int, right: int, extra: Extra | None = None,
                     key_padding_mask: torch.Tensor | None = None,
                     sinks: torch.Tensor | None = None) -> torch.Tensor:
    """softmax(Q Kᵀ/√D masked by `pattern`) V for self-attention, q (B, H, n, D), k and v (B, Hk, n, D)
    → (B, H, n, D), Hk dividing H (query head i reads key/value head ⌊i·Hk/H⌋).

    Query block β (rows [β·block, (β+1)·block)) may only see keys in [β·block − left, (β+1)·block + right): a
    window of S = left + block + right keys taken as a strided view. Within it the allowed cells are the same for
    every block (the pattern is invariant under shifts by `block`), so one (block, S) bias serves all
    (`window_bias`); the rows at each end see their keys cut at [0, n), and the chunked form below masks the
    zero-padded ones instead. The r = H/Hk query heads sharing a key/value head are one block of r·block
    rows (`query_blocks`): each window is cut once per key/value head and read in place by its group. The blocks
    whose window lies inside [0, n) go to PyTorch's fused kernel in one call (`_fused`), the rows at each end in one
    call of it against the keys they may see (`_edge`): few operations, which a busy core delays least. On a CPU with
    AVX-512 (float32, no gradients, extra keys, padding or sinks), every block, the ends too, goes to our band kernel in
    one call instead (`uses_band`). O(n·S·D) time, O(n·D) memory. `extra` adds g keys every row is scored against too,
    in the same softmax: joined to the band's rows afterwards through each row's log-sum-exp (`_join_extra`, on a CPU
    without gradients: `joins`), else beside each block's window in chunks (`_merged`). O(n·(S + g)·D) time.
    `key_padding_mask` (B, n) boolean, True where the key is padding: a per-key bias (`padding_bias`), cut into
    windows as the keys are (and taken at the extra keys' positions), is added to each block's scores, which are
    then held per chunk (the fused kernel takes no per-batch bias here); a query that sees no unpadded key outputs
    zeros. No n×n tensor either way.
    `sinks` (H,): head h's logit a_h joins every row's denominator with no value (gpt-oss, arXiv 2508.10925). On a
    CPU without gradients and padding, the fused calls hand back each row's log-sum-exp ℓ and the rows are scaled by
    σ(ℓ − a_h) at the end (`sink_weight`, O(n·H)); otherwise in the chunks, whose scores are held anyway.
    """
    B, H, n, D = q.shape
    span = left + block + right
    n_blocks = math.ceil(n / block)
    inner_bias, whole = window_bias(pattern, block, left, span, q.dtype, q.device)
    out = q.new_empty(B, H, n, D)
    step = chunk_blocks(B * H, block, span + (0 if extra is None else len(extra.positions)))
    pad = None if key_padding_mask is None else padding_bias(key_padding_mask, q.dtype)
    if pad is None and (extra is None and sinks is None or joins(q, k, v)):
        lse = None
        if extra is not None or sinks is not None:  # the log-sum-exp kernel reads rows of unit stride only
            q, k, v = (t if t.stride(-1) == 1 else t.contiguous() for t in (q, k, v))
        if extra is not None:  # kept for the join; sinks alone weigh each call's rows as they are written
            lse = q.new_empty(B, H, n, dtype=lse_dtype(q.dtype))
        inline = sinks if extra is None else None
        if lse is None and inline is None and uses_band(q, k, v, left, right):  # every block, the ends too
            native.band(q, k, v, band_bias(pattern, block, left, span, q.device), out, block, left)
            return out
        lo, hi = interior(n, block, left, right)
        if hi > lo:  # no bias where the band keeps every key of its window (block-local, not causal): none is added
            _fused(q, k, v, out, lo, hi - lo, block, left, span, None if whole else inner_bias, lse, inline,
                   causal_square(pattern, block, left, span, q.dtype, q.device))
        ends = edges(n, block, left, right)
        if lse is not None or not _ends_together(q, k, v, out, ends, block, left, right, inner_bias, whole, inline):
            for qa, qe in ends:
                _edge(q, k, v, out, qa, qe, block, left, right, inner_bias, whole, lse, inline)
        if extra is not None:
            _join_extra(q, out, lse, extra, pattern, sinks is not None)  # sums: the joint log-sum-exp kept
        if extra is not None and sinks is not None:
            out.mul_(sink_weight(lse, sinks).to(out.dtype))
        return out
    for first in range(0, n_blocks, step):  # extra keys or padding: every block in chunks, its scores held
        c, qs = min(step, n_blocks - first), first * block
        qc = query_blocks(q, k.shape[1], qs, c, block)
        write_blocks(out, _chunk(qc, k, v, qs, block, left, inner_bias, pattern, extra, pad, sinks), qs, block)
    return out


def keeps_threads(key_padding_mask: torch.Tensor | None = None, **_) -> bool:
    """`Cost.keeps_threads` of the band alone (sliding window, block-local): True where the call takes the fused
    path, a few long parallel regions (our band kernel's one call on AVX-512; else the interior blocks in one call of
    the flash kernel, both ends in one more, a copy), so that where other programs hold every core it keeps torch's
    threads; not with padding (the chunked form's many operations). Measured on a 2-core Intel Xeon (AVX-512),
    interleaved with SDPA, one thread against two: the sliding window (256, causal, n = 16384) 285 against 189 ms beside
    two spinning programs (9 rounds), 607 against 409 beside six; block-local (n = 8192) 173 against 110 and 384 against
    257. Longformer and BigBird, whose global rows and joins add many operations, took 668 and 1162 ms on two threads
    beside six, against 556 and 1010 on one: they stay fitted."""
    return key_padding_mask is None


@functools.lru_cache(maxsize=64)
def window_bias(pattern: Pattern, block: int, left: int, span: int, dtype: torch.dtype,
                device: torch.device) -> tuple[torch.Tensor, bool]:
    """The (block, S) additive bias every block's window shares (the pattern is invariant under shifts by `block`):
    0 where the pattern keeps a cell, a finite floor elsewhere (not −inf: a padded query row that sees no key must not
    turn into NaN, nor its gradients), and whether it keeps every cell. Made once for a pattern, size, dtype and
    device, outside autograd and inference mode, and never written to: each of its few small operations is a
    parallel region, and a busy core stretches each to a time slice (block-local at n = 4096 spent 25 ms of a call
    building it with one core busy, 0.1 ms quiet)."""
    with torch.inference_mode(False), torch.no_grad():
        base = block * math.ceil(left / block)  # a block-aligned query position with every window key at ≥ 0
        r = torch.arange(block, device=device)[:, None]
        t = torch.arange(span, device=device)[None, :]
        keep = pattern(base + r, base - left + t)
        bias = torch.zeros(block, span, dtype=dtype, device=device).masked_fill_(~keep, floor(dtype))
        return bias, bool(keep.all())


def uses_band(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, left: int, right: int) -> bool:
    """Whether every block goes to our band kernel in one call (native.band: float32 on a CPU with AVX-512, no
    gradients, D a multiple of 16, a window reaching past the block's own keys; at the ends of the sequence the keys
    inside [0, n)) rather than the flash kernel, the interior in one call and the ends in one or two more, whose
    matrix products are called per tile of 32 rows and small at these windows. On a 2-core Intel Xeon (AVX-512), the
    sliding window (256, causal) at n = 16384, B = 1, H = 8, D = 64, the public call: 50.9 ms against 60.9 through
    the flash kernel (9 rounds interleaved with SDPA's 1077 ms: 21.6× against 17.9×). The rows go straight into the
    output, so the call holds only the kernel's scratch where the flash kernel's output and buffers were. AVX2
    machines keep the flash kernel (band.cpp says why)."""
    return bool(left or right) and native.band_runs(q, k, v)


@functools.lru_cache(maxsize=64)
def band_bias(pattern: Pattern, block: int, left: int, span: int, device: torch.device) -> torch.Tensor:
    """`window_bias` (float32) transposed, (S, native.band_rows(block)), zero past the block's rows: the band
    kernel's layout. Made once for a pattern, size and device, outside autograd and inference mode, never written."""
    bias, _ = window_bias(pattern, block, left, span, torch.float32, device)
    with torch.inference_mode(False), torch.no_grad():
        wide = torch.zeros(span, native.band_rows(block), dtype=torch.float32, device=device)
        wide[:, :block] = bias.t()
        return wide


@functools.lru_cache(maxsize=64)
def causal_square(pattern: Pattern, block: int, left: int, span: int, dtype: torch.dtype,
                  device: torch.device) -> bool:
    """Whether each block's window is its own block (left 0, S = block) and the pattern keeps exactly j ≤ i in it:
    Llama 4's chunked attention (masks.chunked; local with block = chunk, no blocks back or ahead, causal). `_fused`
    then asks the fused kernel for is_causal instead of adding the bias, and its causal kernels skip the tiles
    above the diagonal: half the work of the square. Once a pattern, size, dtype and device."""
    if left or span != block:
        return False
    bias, _ = window_bias(pattern, block, left, span, dtype, device)
    row, col = torch.arange(block, device=device)[:, None], torch.arange(block, device=device)[None, :]
    return bool(torch.equal(bias == 0, col <= row))


def interior(n: int, block: int, left: int, right: int) -> tuple[int, int]:
    """Query blocks [lo, hi) whose whole window [β·block − left, (β+1)·block + right) lies inside [0, n): the blocks
    `_fused` takes in one call (hi ≤ lo: none)."""
    return -(-left // block), (n - right) // block


FLASH_CPU = getattr(torch.ops.aten, "_scaled_dot_product_flash_attention_for_cpu", None)  # (out, log-sum-exp)


def joins(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> bool:
    """Whether extra keys can join the band afterwards (`_join_extra`): on a CPU whose torch has the flash kernel
    that returns each row's log-sum-exp, and with no gradient asked for (that log-sum-exp carries none)."""
    grad = torch.is_grad_enabled() and any(t.requires_grad for t in (q, k, v))
    return FLASH_CPU is not None and q.device.type == "cpu" and not grad


def lse_dtype(dtype: torch.dtype) -> torch.dtype:
    """The flash kernel's log-sum-exp dtype: float64 for float64 inputs, float32 otherwise."""
    return torch.float64 if dtype == torch.float64 else torch.float32


def _join_extra(q: torch.Tensor, out: torch.Tensor, lse: torch.Tensor, extra: Extra, pattern: Pattern,
                sums: bool = False) -> None:
    """The g extra keys joined to the band's softmax afterwards, in place: with the band's output o_b and
    log-sum-exp ℓ_b of each row and the extra keys' scores s (the band's keys left out, `_extra_bias`),
    m = max(ℓ_b, max s), the row's total Z = e^(ℓ_b − m) + Σ e^(s − m), and
    o = o_b · e^(ℓ_b − m)/Z + Σ_p (e^(s_p − m)/Z) v_p: a scaling and a product of k = g over out, the query heads of
    a group as rows of one problem (`fold`). O(n·g·D) a head; the (n, g) scores and weights are the only new
    tensors. `sums`: the joint log-sum-exp m + log Z left in `lse` (for sinks), else lse is spent."""
    B, H, n, D = q.shape
    Hk, g = extra.k.shape[1], extra.k.shape[2]
    work = lse.dtype
    bias = _extra_bias(0, n, pattern, extra, work)  # (n, g)
    s = (fold(q, Hk) @ extra.k.transpose(-2, -1)).to(work).mul_(1.0 / math.sqrt(D))  # (B, Hk, r·n, g)
    s = s.view(B, H, n, g).add_(bias)
    m = torch.maximum(s.amax(-1), lse)
    band = lse.sub_(m).exp_()  # e^(ℓ_b − m), in lse's place
    weights = s.sub_(m[..., None]).exp_()  # e^(s − m)
    total = weights.sum(-1).add_(band)
    out.mul_(band.div_(total)[..., None].to(out.dtype))
    weights = weights.div_(total[..., None]).to(out.dtype)
    folded = fold(out, Hk)  # a view of out
    folded.view(B * Hk, -1, D).baddbmm_(weights.view(B * Hk, -1, g), extra.v.reshape(B * Hk, g, D))
    if sums:
        torch.add(m, total.log_(), out=lse)


def edges(n: int, block: int, left: int, right: int) -> list[tuple[int, int]]:
    """The query rows [a, e) outside the interior blocks (`interior`), as `_edge` takes them: the rows before the
    first interior block and those after the last, or all n rows when no block is interior."""
    lo, hi = interior(n, block, left, right)
    if hi <= lo:
        return [(0, n)]
    return [(a, e) for a, e in ((0, lo * block), (hi * block, n)) if e > a]


def edge_keys(n: int, a: int, e: int, left: int, right: int) -> tuple[int, int]:
    """The keys [ka, ke) that query rows [a, e) may see: from a − left to e + right, cut at the ends."""
    return max(0, a - left), min(n, e + right)


def _edge(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, out: torch.Tensor, a: int, e: int, block: int,
          left: int, right: int, inner_bias: torch.Tensor, whole: bool, lse: torch.Tensor | None = None,
          sinks: torch.Tensor | None = None) -> None:
    """Query rows [a, e) of an end of the sequence in one call of PyTorch's fused kernel against the keys they may
    see (`edge_keys`, cut at the end, so no key is padded or masked for lying outside [0, n)), rows written into
    `out`, with `edge_bias` (None where it would add nothing). A block's window reaches at most left + right keys
    past its rows: the region costs about what its blocks' windows would. `lse` (B, H, n): the rows' log-sum-exp
    written there too (by a kernel without shared heads: one call for each query head of a group); `sinks` (H,):
    the rows written scaled by their sink weights (`_write`), by the same calls."""
    ka, ke = edge_keys(k.shape[-2], a, e, left, right)
    bias = edge_bias(inner_bias, whole, a, e, ka, ke, block, left)
    if lse is None and sinks is None:
        out[:, :, a:e] = shared_sdpa(q[:, :, a:e], k[:, :, ka:ke], v[:, :, ka:ke], attn_mask=bias)
        return
    B, H, _, D = q.shape
    Hk = k.shape[1]
    r = H // Hk
    for j in range(r):  # query heads j, r + j, 2r + j, …: one of each group, as `_fused` takes them
        found, sums = FLASH_CPU(q[:, j::r, a:e], k[:, :, ka:ke], v[:, :, ka:ke], 0.0, False, attn_mask=bias)
        if lse is not None:
            lse[:, j::r, a:e] = sums.reshape(B, Hk, e - a)
        _write(out[:, j::r, a:e], found, sums.view(B, Hk, e - a), None if sinks is None else sinks[j::r].view(Hk, 1))


def same_ends(n: int, block: int, left: int, right: int) -> bool:
    """Whether the sequence has two end regions (`edges`) of one shape: as many rows, seeing as many keys."""
    ends = edges(n, block, left, right)
    if len(ends) != 2:
        return False
    (a0, e0), (a1, e1) = ends
    (k0, k1), (j0, j1) = edge_keys(n, a0, e0, left, right), edge_keys(n, a1, e1, left, right)
    return e0 - a0 == e1 - a1 and k1 - k0 == j1 - j0


def _ends_together(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, out: torch.Tensor,
                   ends: list[tuple[int, int]], block: int, left: int, right: int, inner_bias: torch.Tensor,
                   whole: bool, sinks: torch.Tensor | None = None) -> bool:
    """Both ends of the sequence in one call of the fused kernel where their regions have one shape (rows and keys
    alike: a window as wide on both sides, n a multiple of the block), as two "heads" of a strided view of q, k, v
    and out (no copy): one call and one copy where `_edge` makes two of each, which a busy core delays less (each
    waits for the descheduled thread). Their biases stacked (None where neither needs one). False, having done
    nothing, where the ends differ, heads are shared (Hk < H) or a tensor's heads are not one stride apart."""
    n = k.shape[-2]
    if k.shape[1] != q.shape[1] or not same_ends(n, block, left, right):
        return False
    (a0, e0), (a1, e1) = ends
    (k0, k1), (j0, j1) = edge_keys(n, a0, e0, left, right), edge_keys(n, a1, e1, left, right)
    rows, keys = e0 - a0, k1 - k0
    B, H, _, D = q.shape
    views = []
    for x, starts, length in ((q, (a0, a1), rows), (k, (k0, j0), keys), (v, (k0, j0), keys), (out, (a0, a1), rows)):
        s0, s1, s2, s3 = x.stride()
        if s3 != 1 or s2 != D or (B > 1 and s0 != H * s1):  # batch and heads one stride apart, rows of D
            return False
        views.append(x.as_strided((B * H, 2, length, D), (s1, (starts[1] - starts[0]) * D, D, 1),
                                  x.storage_offset() + starts[0] * D))
    biases = [edge_bias(inner_bias, whole, a, e, ka, ke, block, left)
              for (a, e), (ka, ke) in zip(ends, ((k0, k1), (j0, j1)))]
    mask = None if all(b is None for b in biases) else torch.stack(  # 4-D: a 3-D mask leaves the flash kernel
        [torch.zeros(rows, keys, dtype=q.dtype, device=q.device) if b is None else b for b in biases])[None]
    if sinks is None:
        views[3].copy_(F.scaled_dot_product_attention(*views[:3], attn_mask=mask))
        return True
    found, sums = FLASH_CPU(*views[:3], 0.0, False, attn_mask=mask)  # (B·H, 2, rows, D) and (B·H, 2, rows)
    _write(views[3], found, sums, sinks.repeat(B).view(B * H, 1, 1))
    return True


def _write(dest: torch.Tensor, rows: torch.Tensor, sums: torch.Tensor, sinks: torch.Tensor | None) -> None:
    """dest ← rows (…, D), each scaled by σ(ℓ − a) (`sink_weight`) from its log-sum-exp ℓ in `sums` (…) and its
    head's sink logit, broadcastable to sums, where `sinks` is given: one pass over the rows either way (a busy core
    stretches every parallel operation to a time slice, so the weights ride on the copy). `sums` is spent."""
    if sinks is None:
        dest.copy_(rows)
        return
    torch.mul(rows, torch.sigmoid(sums.sub_(sinks.to(sums.dtype)))[..., None].to(rows.dtype), out=dest)


def windows_cover(a: int, e: int, ka: int, ke: int, block: int, left: int, span: int) -> bool:
    """Whether the window of every block among rows [a, e) (S = span keys from the block's first row − left) holds
    all of keys [ka, ke): a band that keeps its whole window then needs no bias there (`edge_bias`)."""
    return all(b - left <= ka and b - left + span >= ke for b in range(a, e, block))


def edge_bias(inner_bias: torch.Tensor, whole: bool, a: int, e: int, ka: int, ke: int, block: int,
              left: int) -> torch.Tensor | None:
    """(e − a, ke − ka) additive bias of query rows [a, e) (a a multiple of `block`) against keys [ka, ke): block β's
    rows take the (block, S) `inner_bias` at their window's keys [β·block − left, β·block − left + S), the floor
    elsewhere. None where the band keeps its whole window (`whole`) and every window covers [ka, ke). A copy a
    block, no (rows, keys) index arithmetic."""
    span = inner_bias.shape[-1]
    if whole and windows_cover(a, e, ka, ke, block, left, span):
        return None
    bias = inner_bias.new_full((e - a, ke - ka), floor(inner_bias.dtype))
    for b in range(a, e, block):
        w0 = b - left  # the window's first key
        lo, hi = max(w0, ka), min(w0 + span, ke)
        rows = min(block, e - b)
        if hi > lo:
            bias[b - a:b - a + rows, lo - ka:hi - ka] = inner_bias[:rows, lo - w0:hi - w0]
    return bias


def _fused(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, out: torch.Tensor, lo: int, c: int, block: int,
           left: int, span: int, inner_bias: torch.Tensor | None, lse: torch.Tensor | None = None,
           sinks: torch.Tensor | None = None, causal: bool = False) -> None:
    """Query blocks lo … lo + c − 1 (all inside, `interior`) in one call of PyTorch's fused kernel
    (`F.scaled_dot_product_attention`: no scores held, one parallel operation for all of them) per query head of a
    group: each block's window of S keys a strided view of k and v (overlapping windows, no copy), its (block, S)
    bias the same for every block (None: every key of the window counts, and the kernel adds nothing), B·Hk
    problems of c "heads" of block rows; the j-th query heads of all groups are a strided view of q too, and each
    result is copied into `out`. Every parallel operation of a call costs a synchronisation of the threads, which a
    busy core stretches to a time slice: H/Hk calls instead of chunks of about eight operations each hold up under
    load. `lse` (B, H, n): each row's log-sum-exp written there too. `sinks` (H,): the rows written scaled by their
    sink weights (`_write`). `causal` (`causal_square`): the kernel's is_causal in place of the bias."""
    B, H, n, D = q.shape
    Hk = k.shape[1]
    r, qs = H // Hk, lo * block
    ks = qs - left
    keys, values = (x[:, :, ks:ks + (c - 1) * block + span].unfold(2, span, block).transpose(-1, -2)
                    .reshape(B * Hk, c, span, D) for x in (k, v))  # (B·Hk, c, S, D), views of k and v
    for j in range(r):  # query heads j, r + j, 2r + j, …: one of each group
        queries = q[:, j::r, qs:qs + c * block].reshape(B * Hk, c, block, D)  # a view unless q's heads are split
        dest = out[:, j::r, qs:qs + c * block].unflatten(2, (c, block))  # (B, Hk, c, block, D), any strides
        if lse is None and sinks is None:
            rows = F.scaled_dot_product_attention(queries, keys, values, attn_mask=None if causal else inner_bias,
                                                  is_causal=causal)
            dest.copy_(rows.unflatten(0, (B, Hk)))
            del rows
            continue
        rows, sums = FLASH_CPU(queries, keys, values, 0.0, causal, attn_mask=None if causal else inner_bias)
        if lse is not None:
            lse[:, j::r, qs:qs + c * block] = sums.reshape(B, Hk, c * block)
        _write(dest, rows.unflatten(0, (B, Hk)), sums.unflatten(0, (B, Hk)),
               None if sinks is None else sinks[j::r].view(Hk, 1, 1))
        del rows, sums


def _chunk(qc: torch.Tensor, k, v, qs: int, block: int, left: int, inner_bias: torch.Tensor, pattern: Pattern,
           extra: Extra | None, pad: torch.Tensor | None = None, sinks: torch.Tensor | None = None) -> torch.Tensor:
    """The c query blocks qc (B, Hk, c, r·block, D) from row qs (`query_blocks`) against their windows of the Hk
    key/value heads → (B, Hk, c, r·block, D); its temporaries die on return. `sinks` (H,): in each row's softmax
    (`softmax_seen`), the query heads of a group as its rows."""
    B, Hk, c, rows, D = qc.shape
    n, span = k.shape[-2], inner_bias.shape[-1]
    ks = qs - left
    ke = ks + (c - 1) * block + span
    kw = _key_slab(k, ks, ke).unfold(2, span, block)  # (B, Hk, c, D, S): a view, no copy
    vw = _key_slab(v, ks, ke).unfold(2, span, block)
    bias = inner_bias
    if ks < 0 or ke > n:  # edge chunk: mask the zero-padded keys
        starts = ks + block * torch.arange(c, device=qc.device)[:, None, None, None]
        pos = starts + torch.arange(span, device=qc.device)  # (c, 1, 1, S): each block's key positions
        bias = inner_bias.masked_fill((pos < 0) | (pos >= n), floor(qc.dtype))  # (c, 1, block, S)
    if extra is not None and pad is None and sinks is None:
        return _merged(qc, kw, vw, bias, qs, block, pattern, extra)
    by_row = (B, Hk, c, rows // block, block, -1)  # a block's rows as (head of the group, row): the mask's rows
    s = (qc @ kw).view(by_row).add_(bias)
    if pad is not None:
        s.add_(_key_slab(pad, ks, ke).unfold(2, span, block)[:, :, :, None])  # (B, 1, c, 1, 1, S): each block's keys
    a = None if sinks is None else group_sinks(sinks, Hk, block)[:, None]  # (Hk, 1, r·block): each row's sink
    if extra is None:
        return softmax_seen(s.flatten(3, 4), vw.transpose(-1, -2), a)
    side = _extra_bias(qs, c * block, pattern, extra, qc.dtype).view(c, 1, block, -1)  # (c, 1, block, g)
    t = (qc.view(B, Hk, -1, D) @ extra.k.transpose(-2, -1)).view(by_row).add_(side)
    if pad is not None:
        t.add_(pad[:, :, extra.positions].view(B, 1, 1, 1, 1, -1))  # the extra keys' padding
    values = torch.cat([vw.transpose(-1, -2), extra.v[:, :, None].expand(B, Hk, c, -1, D)], dim=-2)
    return softmax_seen(torch.cat([s, t], dim=-1).flatten(3, 4), values, a)


def _extra_bias(qs: int, rows: int, pattern: Pattern, extra: Extra, dtype: torch.dtype) -> torch.Tensor:
    """(rows, g) additive bias of query rows [qs, qs + rows) against the extra keys: 0 where the extra pattern
    allows a key the band does not hold already, the floor elsewhere."""
    i = torch.arange(qs, qs + rows, device=extra.positions.device)[:, None]
    p = extra.positions[None, :]
    keep = extra.pattern(i, p) & ~pattern(i, p)
    return torch.zeros(keep.shape, dtype=dtype, device=keep.device).masked_fill_(~keep, floor(dtype))


def _merged(qc: torch.Tensor, kw: torch.Tensor, vw: torch.Tensor, bias: torch.Tensor, qs: int, block: int,
            pattern: Pattern, extra: Extra) -> torch.Tensor:
    """A chunk's c query blocks against their band of S keys and the g extra keys, one softmax over S + g: the
    extra keys joined to every block's window (a key the band holds already is masked among the extra ones), the
    softmax and product fused by PyTorch's kernel (`F.scaled_dot_product_attention`, no scores held).
    qc (B, Hk, c, r·block, D) already scaled, kw (B, Hk, c, D, S), vw likewise, bias (block or c, 1, block, S)
    → (B, Hk, c, r·block, D). The bias is written out for each of a block's r·block rows (a row's cells depend on
    its position, the fused kernel takes no mask that repeats by rows)."""
    B, Hk, c, D, S = kw.shape
    rows = qc.shape[-2]
    side = _extra_bias(qs, c * block, pattern, extra, qc.dtype).view(c, 1, block, -1)  # (c, 1, block, g)
    every = (c, rows // block, block)
    bias = torch.cat([bias.expand(*every, S), side.expand(*every, -1)], dim=-1).view(c, rows, -1)  # (c, r·b, S+g)
    keys, values = (torch.cat([w.transpose(-1, -2), x[:, :, None].expand(B, Hk, c, -1, D)], dim=-2)
                    .view(B * Hk, c, -1, D) for w, x in ((kw, extra.k), (vw, extra.v)))  # (B·Hk, c, S + g, D)
    queries = qc.view(B * Hk, c, rows, D)
    return F.scaled_dot_product_attention(queries, keys, values, attn_mask=bias[None], scale=1.0).reshape(qc.shape)


def dense_rows(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, out: torch.Tensor, positions: torch.Tensor,
               causal: bool, key_padding_mask: torch.Tensor | None = None,
               sinks: torch.Tensor | None = None) -> None:
    """Rows `positions` of `out` (B, H, n, D) replaced by softmax attention over all n keys (causal: j ≤ i): the
    global tokens' rows, through PyTorch's fused kernel (`F.scaled_dot_product_attention`, no (rows, n) scores
    held; k, v of Hk < H heads read in place, `enable_gqa`). Causal, in slabs of rows whose (rows, n) additive
    mask holds about CHUNK_ELEMS entries. `key_padding_mask` (B, n), True where the key is padding: left out by a
    per-key bias, a slab's (rows, n) scores then held, the query heads sharing a key/value head as rows of one
    product (`fold`); a row that sees no unpadded key outputs zeros. O(g·n·D) time, O(n·D) memory beyond the
    output. `sinks` (H,): each head's sink logit in its rows' denominators (`sdpa.sink_sdpa`, or, with padding, in
    `softmax_seen` on the slab's scores)."""
    B, H, n, D = q.shape
    Hk = k.shape[1]
    rows = dense_slab(n, len(positions), causal or key_padding_mask is not None)
    pad = None if key_padding_mask is None else padding_bias(key_padding_mask, q.dtype).view(B, 1, 1, 1, n)
    for first in range(0, len(positions), rows):
        p = positions[first:first + rows]
        mask = None
        if causal:  # j = i stays: no row is empty
            future = torch.arange(n, device=q.device) > p[:, None]
            mask = torch.zeros(future.shape, dtype=q.dtype, device=q.device).masked_fill_(future, floor(q.dtype))
        if pad is None and sinks is None:
            seen = shared_sdpa(q.index_select(2, p), k, v, attn_mask=None if mask is None else mask[None, None])
        elif pad is None:
            seen = sink_sdpa(q.index_select(2, p), k, v, sinks, False, None if mask is None else mask[None, None])
        else:  # (B, 1, 1, 1, n) padding beside the (rows, n) mask, on the (B, Hk, r, rows, n) view of the scores
            scores = fold(q.index_select(2, p) * (1.0 / math.sqrt(D)), Hk) @ k.transpose(-2, -1)
            scores.view(B, Hk, H // Hk, len(p), n).add_(pad if mask is None else pad + mask)
            seen = unfold(softmax_seen(scores, v, None if sinks is None else group_sinks(sinks, Hk, len(p))), H)
        out.index_copy_(2, p, seen)


def dense_slab(n: int, count: int, causal: bool) -> int:
    """Rows per slab of dense_rows: all of them, or as many as keep a causal (rows, n) mask to CHUNK_ELEMS."""
    return max(1, min(count, CHUNK_ELEMS // n)) if causal else max(1, count)


def floor(dtype: torch.dtype) -> float:
    """A finite stand-in for −∞ in additive masks: a row that sees no key gives no NaN."""
    return torch.finfo(dtype).min / 2


