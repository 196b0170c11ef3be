"""Softmax over the keys each query selected, for the mechanisms that select (top-k, NSA's selection branch).

A selection is `idx` (B, S, r, kk): for each batch element, each of S selections (1: one for every head, as
DeepSeek's indexer picks per token; Hk: one per key/value head, as NSA picks per group) and each of r queries, the
positions of kk keys, with `usable` (B, S, r, kk) False where a selected key must not count (masked or padded).
`selected_softmax` runs it by a sampled product and a bag sum that read the keys and values in place;
`gathered_softmax` is the plain form kept beside it (and run where torch has neither).
"""
from __future__ import annotations

import warnings

import torch

from .. import native
from ..spec import Shape
from ._common import fold, scale, sink_weight, unfold

NEG = float("-inf")


def work_dtype(dtype: torch.dtype) -> torch.dtype:
    """float32 for half inputs: the sampled product takes no half types (and bfloat16 scores tie too often)."""
    return dtype if dtype in (torch.float32, torch.float64) else torch.float32


def _heads(H: int, S: int, Hk: int, s: int) -> range:
    """The query heads that read selection s: all of them for one selection, else the group of key/value head s."""
    return range(H) if S == 1 else range(s * (H // Hk), (s + 1) * (H // Hk))


def _rows(x: torch.Tensor, pos: torch.Tensor) -> torch.Tensor:
    """x[b, h, pos[b, h, i]] for pos (B, Hk, …) → (B, Hk, R, D), R positions a head: one index_select of whole rows
    of x's storage, read in place (a contiguous x, or a cache ring's view of one; any other x is copied first)."""
    B, Hk, _, D = x.shape
    s0, s1, s2, s3 = x.stride()
    if s3 != 1 or s2 != D or s1 % D or s0 % D:
        x = x.contiguous()
        s0, s1, s2, _ = x.stride()
    base = (torch.arange(B, device=x.device)[:, None] * (s0 // D) + torch.arange(Hk, device=x.device) * (s1 // D))
    rows = x.as_strided(((B - 1) * (s0 // D) + (Hk - 1) * (s1 // D) + x.shape[2], D), (D, 1))
    return rows.index_select(0, (pos.flatten(2) + base[..., None]).flatten()).view(B, Hk, -1, D)


def gathered_softmax(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, idx: torch.Tensor,
                     usable: torch.Tensor, sinks: torch.Tensor | None = None) -> torch.Tensor:
    """The plain form: each query's selected keys and values copied out (B, Hk, r·kk, D), then softmax over them by
    batched products, the H/Hk query heads of a key/value head reading its copy together. q (B, H, r, D), k and v
    (B, Hk, m, D) → (B, H, r, D); a row with no usable key outputs zeros. Moves r·kk·D numbers a key/value head: on
    a CPU the copies, not the products, take the time. `sinks` (H,): each row scaled by σ(ℓ − a_h), ℓ the
    log-sum-exp of its usable scores (`_common.sink_weight`): head h's sink as one more, zero-valued column."""
    B, H, r, D = q.shape
    Hk, kk = k.shape[1], idx.shape[-1]
    idx, usable = idx.expand(B, Hk, r, kk), usable.expand(B, Hk, r, kk)
    k_sel, v_sel = _rows(k, idx), _rows(v, idx)
    qs = fold(q, Hk).view(B, Hk, H // Hk, r, D).transpose(2, 3).mul(scale(D))  # (B, Hk, r, g, D)
    scores = qs @ k_sel.view(B, Hk, r, kk, D).transpose(-2, -1)  # (B, Hk, r, g, kk)
    keep = usable[:, :, :, None, :]
    dead = ~usable.any(-1)[:, :, :, None, None]
    scores = scores.masked_fill(~keep, NEG).masked_fill(dead, 0.0)
    p = torch.softmax(scores, dim=-1).masked_fill(dead, 0.0)
    out = p @ v_sel.view(B, Hk, r, kk, D)  # (B, Hk, r, g, D)
    if sinks is not None:  # a group's heads are the g axis: head h = group·g + j
        out = out * sink_weight(torch.logsumexp(scores, -1), sinks.view(Hk, -1))  # (Hk, 1, g) against (B, Hk, r, g)
    return unfold(out.transpose(2, 3).reshape(B, Hk, (H // Hk) * r, D), H)


def sort_selection(idx: torch.Tensor, usable: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """The selection with each row's indices in increasing order, `usable` following them (CSR's order)."""
    idx, order = idx.sort(-1)
    return idx, usable.gather(-1, order)


def _csr(crow: torch.Tensor, col: torch.Tensor, values: torch.Tensor, shape: tuple[int, int]) -> torch.Tensor:
    if values.device.type not in _NOTED:  # the first CSR tensor on a device: torch's warn-once notes taken
        return _quietly(crow, col, values, shape)
    return torch.sparse_csr_tensor(crow, col, values, shape, check_invariants=False)


_NOTED: set[str] = set()  # devices whose first CSR tensor was built under the filters
# torch's once-a-process notes at a CSR tensor: that the layout is beta, and, on CUDA, that invariant checks are off
# ("Memory errors (e.g. SEGFAULT) will occur" on a tensor that breaks them; seen on an H200, torch 2.11). This module
# builds its indices itself, sorted and in range, and the two products are tested.
NOTES = ("Sparse CSR tensor support is in beta", "Sparse invariant checks are implicitly")


def _quietly(crow: torch.Tensor, col: torch.Tensor, values: torch.Tensor, shape: tuple[int, int]) -> torch.Tensor:
    """A CSR tensor built under a filter for each of NOTES, so that a warn-once is taken here, and no CSR build on
    the hot path needs a filter."""
    _NOTED.add(values.device.type)
    with warnings.catch_warnings():
        for note in NOTES:
            warnings.filterwarnings("ignore", message=note, category=UserWarning)
        return torch.sparse_csr_tensor(crow, col, values, shape, check_invariants=False)


def _take_beta_note() -> None:
    """The beta note taken at import (`_quietly`), so that the process's filters stay untouched: pytest restores
    them after collecting, and would show the note."""
    _csr(torch.zeros(1, dtype=torch.long), torch.zeros(0, dtype=torch.long), torch.zeros(0), (0, 0))


_take_beta_note()


def selected_softmax(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, idx: torch.Tensor,
                     usable: torch.Tensor, sinks: torch.Tensor | None = None) -> torch.Tensor:
    """softmax_s∈sel(t) (q_t·k_s/√D) v_s, reading the keys and values in place, a query head at a time: the scores at
    the selected (t, s) only (`torch.sparse.sampled_addmm` over the selection as a CSR pattern of kk entries a row),
    softmax over each row's kk, then each row's probability-weighted sum of its selected values as one bag
    (`embedding_bag`, mode 'sum', the probabilities its per-sample weights). The bag sum ran 2.5× faster than the
    CSR product it replaced (MKL's), and neither step reorders the scores: both keep each row's kk entries together.
    On the CPU without gradients, `native.selected_softmax` instead: the same in one pass a query row, its scores
    never leaving the core's cache (a block of top-k at n = 16384, top_k = 2048: 17 ms against these three steps'
    29 ms).

    q (B, H, r, D), k and v (B, Hk, m, D), idx and usable (B, S, r, kk) with S = 1 or Hk, idx sorted in each row
    (`sort_selection`: CSR's order, and each row reads its keys forward) → (B, H, r, D); a row with no usable key
    outputs zeros. 4·r·kk·D FLOPs a head; never an r × m or r·kk × D tensor. Float32 or float64 (`work_dtype`);
    differentiable in q, k and v. Devices without these ops, and rows of more entries than keys (repeated ones,
    which CSR cannot hold), take `gathered_softmax`.
    `sinks` (H,): head h's logit a_h joins each row's denominator with no value (gpt-oss, arXiv 2508.10925). In the
    torch forms, each row scaled by σ(ℓ − a_h), ℓ the log-sum-exp of the scores it holds anyway; in the C++ kernel,
    e^(a_h − M) joins each row's sum of weights in the same pass."""
    work = work_dtype(q.dtype)
    if native.softmax_runs(q, k, v):  # the CPU without gradients: one fused pass a query row
        return native.selected_softmax(q.to(work), k.to(work), v.to(work), idx, usable, sinks).to(q.dtype)
    if q.device.type not in ("cpu", "cuda") or idx.shape[-1] > k.shape[2]:  # more entries a row than keys: repeats
        return gathered_softmax(q, k, v, idx, usable, sinks)
    B, H, r, D = q.shape
    Hk, m = k.shape[1], k.shape[2]
    S, kk = idx.shape[1], idx.shape[-1]
    qs = q.to(work) * scale(D)
    ks, vs = k.to(work), v.to(work)
    g = H // Hk
    crow = torch.arange(0, r * kk + 1, kk, device=q.device)
    # on the CPU and without gradients the products write each head's scores into its rows here (out=); the kernel
    # adds beta · the old value even at beta = 0, so the buffer starts at zero, never as uninitialised memory. CUDA
    # keeps the form its tests checked, a product's values copied in from a pattern of zeros
    in_place = q.device.type == "cpu" and not (torch.is_grad_enabled() and (qs.requires_grad or ks.requires_grad))
    scores = qs.new_zeros(B, H, r * kk) if in_place else qs.new_empty(B, H, r * kk)
    zeros = None if in_place else qs.new_zeros(r * kk)
    _sampled_scores(scores, qs, ks, idx, crow, zeros, m, in_place)
    del qs, zeros
    scores = scores.view(B, S, H // S, r, kk)  # the heads of each selection together: its flags broadcast, not copied
    if bool(usable.all()):  # every selected key counts (no mask, no padding): three passes over the scores fewer
        p = torch.softmax(scores, dim=-1).view(B, H, r, kk)
    else:
        keep = usable[:, :, None]
        dead = ~keep.any(-1, keepdim=True)
        p = torch.softmax(scores.masked_fill_(~keep, NEG).masked_fill_(dead, 0.0), dim=-1)
        p = (p.masked_fill(dead, 0.0) if p.requires_grad else p.masked_fill_(dead, 0.0)).view(B, H, r, kk)
    weight = None if sinks is None else sink_weight(torch.logsumexp(scores, -1).view(B, H, r), sinks)
    del scores
    out = q.new_empty(B, H, r, D, dtype=work)
    for b in range(B):
        for s in range(S):
            for h in _heads(H, S, Hk, s):
                out[b, h] = torch.nn.functional.embedding_bag(idx[b, s], vs[b, h // g], mode="sum",
                                                              per_sample_weights=p[b, h])
    del p
    return (out if weight is None else out * weight).to(q.dtype)


def block_softmax(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, blocks: torch.Tensor, block: int, first: int,
                  sinks: torch.Tensor | None = None) -> torch.Tensor:
    """Softmax over the keys of each query's selected blocks (NSA's selection branch): query row t, at position
    first + t, reads of each listed block j the keys j·block … j·block + block − 1 at or before it and before m.
    q (B, H, r, D), k and v (B, Hk, m, D), blocks (B, S, r, nb) int64 with S = 1 or Hk → (B, H, r, D); a row with
    no key outputs zeros. On the CPU without gradients, `native.block_softmax`: each block's keys read once for all
    the rows that chose it, no position or flag a key. Elsewhere, each row's blocks in order spelled out as positions
    (int64) and flags (position ≤ t) for `selected_softmax`, where every block a row can reach, those before
    ⌈(first + r)/block⌉ (all NSA's ranking gives), lies within the keys, else for `gathered_softmax`, positions past
    the keys read the last one, masked (a decoding step inside a block). `sinks` (H,): as `selected_softmax`."""
    if native.softmax_runs(q, k, v):
        work = work_dtype(q.dtype)
        return native.block_softmax(q.to(work), k.to(work), v.to(work), blocks, block, first, sinks).to(q.dtype)
    r, m = q.shape[2], k.shape[2]
    idx = blocks.sort(-1).values  # blocks in order: positions increase along each row, as CSR takes them
    pos = (idx[..., None] * block + torch.arange(block, device=q.device)).flatten(-2)  # (B, S, r, nb·block)
    usable = pos <= torch.arange(first, first + r, device=q.device)[:, None]  # not past the query
    del idx
    if -(-(first + r) // block) * block <= m:  # every position a row can reach is a key: sparse products
        return selected_softmax(q, k, v, pos, usable, sinks)
    return gathered_softmax(q, k, v, pos.clamp_(max=m - 1), usable, sinks)


def block_softmax_bytes(s: Shape, r: int, nb: int, m: int, block: int, S: int, copied: bool = False) -> float:
    """Peak bytes of `native.block_softmax` on r queries of nb blocks each over m keys (the forward on the CPU
    without gradients), above its inputs: float32 copies of half queries beside the output and its scratch
    (`native.block_scratch_bytes`), `copied`: with the blocks made contiguous (int64); then, those gone, the output
    beside its copy in a half dtype."""
    e, w = s.elem, max(s.elem, 4)
    out = s.bh * r * s.D * w
    half = s.bh * r * s.D * e if e < w else 0
    scratch = native.block_scratch_bytes(s.B, s.bh // s.B, r, s.bk // s.B, nb, m, block, w)
    return out + max((out if half else 0) + scratch + (s.B * S * r * nb * 8 if copied else 0), half)


def _sampled_scores(scores: torch.Tensor, qs: torch.Tensor, ks: torch.Tensor, idx: torch.Tensor, crow: torch.Tensor,
                    zeros: torch.Tensor | None, m: int, in_place: bool) -> None:
    """scores (B, H, r·kk) ← each head's scaled queries qs (B, H, r, D) times its keys ks (B, Hk, m, D) at the
    selected (t, s) of idx (B, S, r, kk), CSR's values in row order (`crow`: kk entries a row): `in_place` written
    by the product itself (`_sampled_into`), else a product over a pattern of `zeros` copied in."""
    B, H, r, _ = qs.shape
    Hk, S = ks.shape[1], idx.shape[1]
    g = H // Hk
    for b in range(B):
        for s in range(S):
            col = idx[b, s].reshape(-1)
            for h in _heads(H, S, Hk, s):
                if in_place:
                    _sampled_into(scores[b, h], crow, col, qs[b, h], ks[b, h // g], m)
                else:
                    scores[b, h] = torch.sparse.sampled_addmm(_csr(crow, col, zeros, (r, m)), qs[b, h],
                                                              ks[b, h // g].t(), beta=0.0).values()


def selected_softmax_bytes(s: Shape, r: int, kk: int, m: int | None = None, S: int = 1, sinks: bool = False) -> float:
    """Peak bytes of `selected_softmax` on r queries of kk selected keys each, above its inputs (k and v already in
    the work dtype, the selection the caller's): the CSR row offsets (int64, r + 1) throughout; the scaled queries
    (float32 copies of half ones first) beside the scores; softmax beside the scores; the probabilities beside the
    output and one head's bag sums, with, in float64, whose bag sums take torch's general path, each entry's bag and
    their running sum (int64); the output beside its copy in a half dtype. Nothing is sized by the keys: they are
    read in place. On the CPU (`native.selected_softmax`, over m keys, S selections; the forward without gradients,
    which the engine's peaks are): float32 copies of half queries beside the output and its scratch
    (`native.softmax_scratch_bytes`), then, the copies gone, the output beside its copy in a half dtype; `sinks`
    there add nothing (one more term in each row's sum). The torch forms with `sinks`: the log-sum-exp's
    exponentials beside the scores and the probabilities, three r·kk a head at once (the bag sums come after
    them)."""
    e, w = s.elem, max(s.elem, 4)
    probs, block = s.bh * r * kk * w, s.bh * r * s.D * w
    general = 16 * (r * kk + 1) if w == 8 else 0
    half = s.bh * r * s.D * e if e < w else 0
    if s.device == "cpu" and native.expected():
        scratch = native.softmax_scratch_bytes(s.B, S, r, s.Nk if m is None else m, s.D, kk, w)
        return block + max((block if half else 0) + scratch, half)
    lse = 3 * probs if sinks else 0  # the log-sum-exp's exponentials, beside the scores and the probabilities
    return 8 * (r + 1) + max(2 * block if half else 0, block + probs, 2 * probs, lse,
                             probs + block + r * s.D * w + general, block + half)


def _sampled_into(into: torch.Tensor, crow: torch.Tensor, col: torch.Tensor, q: torch.Tensor, k: torch.Tensor,
                  m: int) -> None:
    """into[e] = q[row(e)] · k[col[e]] for the CSR pattern (crow, col) of (r, m), written in place (into's old values
    times beta = 0 are added: zeros, or the products are lost). The pattern, which holds a view of into, dies here."""
    pattern = _csr(crow, col, into, (q.shape[0], m))
    torch.sparse.sampled_addmm(pattern, q, k.t(), beta=0.0, out=pattern)
