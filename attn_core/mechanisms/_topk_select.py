"""Top-k's selection (topk.py): the kk highest indexer scores of each query row, by the C++ kernel, a sampled
threshold or a top-k over whole rows; which of them a block of rows takes, and the sampled form's peak bytes."""
from __future__ import annotations

import math

import torch

from .. import native
from ._sparse import sort_selection

NEG = float("-inf")
SAMPLE_STRIDE = 8  # every 8th score of a row estimates where its top kk begin (see `_select_sampled`)


def sample_pick(m: int, kk: int) -> int:
    """Sampled scores a row keeps in `_select_sampled`: its share of kk among the ⌈m / SAMPLE_STRIDE⌉ sampled and
    four standard deviations of that count more, so that the row's scores at or above the least kept number at
    least kk (SAMPLE_STRIDE times this on average)."""
    sampled = -(-m // SAMPLE_STRIDE)
    share = -(-kk * sampled // m)
    return min(share + 4 * math.isqrt(share) + 12, sampled)


def select(scores: torch.Tensor, kk: int, *, finite: bool = False) -> tuple[torch.Tensor, torch.Tensor]:
    """The kk highest scores of each row (B, r, m), as (indices (B, r, kk), increasing in each row as CSR takes them,
    usable (B, r, kk): the key's score was finite, so it is neither masked nor padded). Ties at the threshold go to
    the earlier keys. On the CPU, `native.select` (C++, counting instead of sorting: 102 rows of 16,384 scores in
    0.78 ms against the sampled form's 5.9, a tenth of a call where that took a third); elsewhere, or where no
    library could be built, `_select_sampled` where it can answer (rows of finite scores, kk at most a quarter of m:
    the same selection, found without a top-k over whole rows), else `_select_exact`. `finite`: the caller knows no
    score is NaN (a NaN is never a candidate of the fast forms, while the exact one keeps it); without it, the exact
    form."""
    if finite and native.runs(scores):
        return native.select(scores, kk)
    if finite and 4 * kk <= scores.shape[-1]:
        found = _select_sampled(scores, kk)
        if found is not None:
            return found
    return _select_exact(scores, kk)


def _row_counts(at: torch.Tensor, rows: int, width: int) -> torch.Tensor:
    """Entries of each of `rows` rows of `width` in `at`, increasing flat positions (a row-major `nonzero`): where
    each row's begin, found by binary search, differenced. Nothing the size of `at` is made (a sum of the flags
    copies them to int64 first)."""
    return torch.searchsorted(at, torch.arange(rows + 1, device=at.device) * width).diff()


def _select_sampled(scores: torch.Tensor, kk: int) -> tuple[torch.Tensor, torch.Tensor] | None:
    """The top kk of each row without a top-k or a sort over the whole row: a top-k over every SAMPLE_STRIDE-th score
    (`sample_pick` of them, so that the row's candidates, its scores at or above that sample's least, number from kk
    to about 1.3·kk at kk = 2048), the candidates listed row by row in key order (`nonzero`) and laid in a row each,
    padded with −inf (`masked_scatter_` into each row's first slots); the kk-th highest candidate is the row's
    threshold, and the candidates above it, with the earliest of those at it (ties: float32 scores tie at a row's
    threshold in about one step of 102 rows in 40 at n = 16384; only the tied rows are settled again), still in key
    order, are its selection, read from their keys laid the same way. None where it cannot answer or would not gain:
    a row with fewer than kk candidates or more than 3·kk (many equal scores, e.g. the zeros of one ReLU indexer
    head), or a threshold that is not finite (masked or padded keys among its top kk)."""
    B, r, m = scores.shape
    sample = scores[..., ::SAMPLE_STRIDE]
    low = sample.topk(sample_pick(m, kk), dim=-1, sorted=False).values.amin(-1, keepdim=True)  # (B, r, 1)
    if not bool(torch.isfinite(low).all()) or \
            SAMPLE_STRIDE * int((sample >= low).sum(-1).max()) > 3 * kk:  # many scores equal to the sample's least
        return None
    at = (scores >= low).view(-1).nonzero().squeeze(1)  # row-major: each row's candidates in key order
    count = _row_counts(at, B * r, m)
    fewest, most = torch.stack([count.min(), count.max()]).tolist()
    if fewest < kk or most > 3 * kk:
        return None
    slots = torch.arange(most, device=at.device) < count[:, None]  # (B·r, most): each row's first `count` slots
    laid = scores.new_full((B * r, most), NEG).masked_scatter_(slots, scores.view(-1).take(at))
    tau = laid.topk(kk, dim=-1, sorted=False).values.amin(-1, keepdim=True)
    keep = laid >= tau
    kept = keep.view(-1).nonzero().squeeze(1)
    if kept.numel() != B * r * kk:  # ties at some rows' thresholds: their earlier keys there, as `_select_exact`
        tied_rows = (_row_counts(kept, B * r, most) != kk).nonzero().squeeze(1)
        some, at_tau = laid[tied_rows], tau[tied_rows]
        above, tied = some > at_tau, some == at_tau
        keep[tied_rows] = above.logical_or_(tied.logical_and_(tied.cumsum(-1) <= kk - above.sum(-1, keepdim=True)))
        del some, above, tied, kept
        kept = keep.view(-1).nonzero().squeeze(1)
    del laid, keep
    keys = at.new_empty(B * r, most).masked_scatter_(slots, at.remainder_(m))  # laid as the scores are
    del at, slots
    idx = keys.view(-1).take(kept).view(B, r, kk)
    return idx, torch.ones(idx.shape, dtype=torch.bool, device=idx.device)


def _select_exact(scores: torch.Tensor, kk: int) -> tuple[torch.Tensor, torch.Tensor]:
    """`select` by a top-k over each whole row and a sort of the indices it keeps. Ties at the threshold go to the
    earlier keys: where a row holds more keys at its kk-th score than fit, the scores are rewritten in place (+inf
    above the threshold, −inf below, and threshold − position at it) and ranked again. Fills `scores` in place."""
    vals, idx = scores.topk(kk, dim=-1, sorted=False)
    tau = vals.amin(-1, keepdim=True)
    extra = (scores == tau).scatter_(-1, idx, False)  # keys at the threshold left out (no count: that copies)
    tied = bool(extra.any(-1).logical_and_(tau[..., 0] > NEG).any())
    del extra
    if tied:
        del vals, idx
        scores.masked_fill_(scores < tau, NEG).masked_fill_(scores > tau, float("inf"))
        scores.sub_(torch.arange(scores.shape[-1], device=scores.device, dtype=scores.dtype))
        vals, idx = scores.topk(kk, dim=-1, sorted=False)
    return sort_selection(idx, vals != NEG)  # a NaN score (NaN in the input) is usable: the NaN reaches the output


def _first_sampled(m: int, kk: int) -> int:
    """The first causal query row whose step `_select_sampled` can take: its sample of every SAMPLE_STRIDE-th key up
    to itself holds `sample_pick` finite scores, and it sees kk keys (finite inputs, Gaussian-like scores)."""
    return max(SAMPLE_STRIDE * (sample_pick(m, kk) - 1), kk - 1)


def _forms(a: int, r: int, m: int, kk: int, step: int, causal: bool) -> tuple[bool, bool]:
    """(exact, sampled): the selections a block of rows a … a + r − 1 over m keys takes in its steps of `step` rows.
    The sampled one where 4·kk ≤ m and, causal, from the first step whose first row is `_first_sampled`'s on. For
    finite inputs: scores with NaN, or rows whose unpadded keys are fewer than about 1.3·kk, take the exact form
    there too, not priced (its sort holds about 10% more than the sampled form at kk = 2048)."""
    if 4 * kk > m:
        return True, False
    if not causal:
        return False, True
    first = _first_sampled(m, kk)
    return a < first, a + (r - 1) // step * step >= first


def _sampled_bytes(rows: int, m: int, kk: int, w: int) -> float:
    """Peak bytes of `_select_sampled` on `rows` rows of m scores beside them (0 where it does not run, 4·kk > m):
    the sample's flags and their int64 count (9 bytes a sampled score); a flag per score beside the candidates'
    int64 positions; then, beside the positions and a flag per slot, the laid candidates (w bytes) and the values
    gathered into them, or their top-k (w + 8 a kept key), or their flags and the kept slots (int64); the positions
    laid as keys (int64) beside the kept slots; the kept keys taken, with their flags. Candidates: SAMPLE_STRIDE ·
    `sample_pick` a row on average, the most in a row 3.2·SAMPLE_STRIDE·√pick more (four of its standard
    deviations, 0.8·SAMPLE_STRIDE·√pick for Gaussian-like scores; the most seen, among 2,048 rows, 4.5), the row
    width the candidates are laid in. Rows tied at their threshold are settled again on their own: a few rows'
    flags more, not priced."""
    if 4 * kk > m:
        return 0.0
    pick = sample_pick(m, kk)
    c, E = rows * pick * SAMPLE_STRIDE, rows * kk  # the candidates; the kept
    laid = rows * min(3 * kk, pick * SAMPLE_STRIDE + math.ceil(3.2 * SAMPLE_STRIDE * math.sqrt(pick)))
    held = 8 * c + laid  # the positions and the slots' flags
    return max(9 * rows * -(-m // SAMPLE_STRIDE), rows * m + 8 * c, held + w * (laid + c),
               held + w * laid + E * (w + 8), held + (w + 1) * laid + 8 * E, held + 8 * laid + 8 * E,
               8 * laid + 17 * E)
