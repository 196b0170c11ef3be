"""Softmax over the keys each query selected, for the mechanisms that select (top-k, NSA's selection branch).

A selection is `idx` (B, S, r, kk): for each batch element, each of S selections (1: one for every head, as
DeepSeek's indexer picks per token; Hk: one per key/value head, as NSA picks per group) and each of r queries, the
positions of kk keys, with `usable` (B, S, r, kk) False where a selected key must not count (masked or padded).
`selected_softmax` runs it by sparse products that read the keys in place; `gathered_softmax` is the plain form
kept beside it (and run where torch has no sparse products).
"""
from __future__ import annotations

import warnings

import torch

from ._common import fold, scale, unfold

KEY_CHUNK_BYTES = 1 << 19  # a head's keys (or values) the sparse products read at random at once: half an L2
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
                     usable: torch.Tensor) -> torch.Tensor:
    """The plain form: each query's selected keys and values copied out (B, Hk, r·kk, D), then softmax over them by
    batched products, the H/Hk query heads of a key/value head reading its copy together. q (B, H, r, D), k and v
    (B, Hk, m, D) → (B, H, r, D); a row with no usable key outputs zeros. Moves r·kk·D numbers a key/value head: on
    a CPU the copies, not the products, take the time."""
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
    return unfold(out.transpose(2, 3).reshape(B, Hk, (H // Hk) * r, D), H)


def key_chunks(idx: torch.Tensor, m: int, width: int) -> tuple[list[tuple[int, torch.Tensor, torch.Tensor]],
                                                                 torch.Tensor | None]:
    """A selection idx (r, kk), each row sorted, split by chunks of `width` keys [c0, c0 + width) of the m: each
    chunk's CSR pattern over the r rows as (c0, crow (r + 1,), col − c0), chunks with no entry left out, and `order`
    (r·kk,): the row-major positions of every chunk's entries, chunk after chunk (values listed chunk by chunk are
    the row-major ones at `order`; None when one chunk holds them all, in their own order). O(r·kk), from each
    chunk's bounds in each row (`searchsorted`)."""
    r, kk = idx.shape
    if width >= m:  # one chunk: the entries in their own order
        return [(0, torch.arange(0, r * kk + 1, kk, device=idx.device), idx.reshape(-1))], None
    edges = torch.arange(0, m + width, width, device=idx.device).clamp_(max=m)
    bounds = torch.searchsorted(idx, edges.expand(r, -1).contiguous())  # (r, chunks + 1)
    lengths = bounds[:, 1:] - bounds[:, :-1]  # (r, chunks)
    starts = (torch.arange(r, device=idx.device)[:, None] * kk + bounds[:, :-1]).t().reshape(-1)
    flat = lengths.t().reshape(-1)  # chunk-major (chunk, row)
    before = flat.cumsum(0) - flat
    order = torch.repeat_interleave(starts - before, flat, output_size=r * kk) + torch.arange(r * kk, device=idx.device)
    col = idx.reshape(-1)[order]
    crows = torch.nn.functional.pad(lengths.cumsum(0), (0, 0, 1, 0))  # (r + 1, chunks)
    chunks, at = [], 0
    for c, nnz in enumerate(lengths.sum(0).tolist()):
        if nnz:
            c0 = int(edges[c])
            chunks.append((c0, crows[:, c].contiguous(), col[at:at + nnz] - c0))
        at += nnz
    return chunks, order


def _put_back(listed: torch.Tensor, order: torch.Tensor, into: torch.Tensor) -> None:
    """into[:, order[i]] = listed[:, i] for every i, as one gather by the inverse of `order` (an index_copy_ a head
    and chunk took a tenth of top-k's time at n = 16384)."""
    inverse = torch.empty_like(order)
    inverse[order] = torch.arange(order.shape[0], device=order.device)
    back = inverse.expand(listed.shape[0], -1)
    if listed.requires_grad:  # out= takes no autograd
        into.copy_(listed.gather(1, back))
    else:
        torch.gather(listed, 1, back, out=into)


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
                     usable: torch.Tensor, *, scattered: bool = True) -> torch.Tensor:
    """softmax_s∈sel(t) (q_t·k_s/√D) v_s by sparse products that read the keys and values in place: per query head,
    the scores at the selected (t, s) only (`torch.sparse.sampled_addmm` over the selection as a CSR pattern, its
    indices sorted in each row), softmax over each row's kk, and those probabilities as a CSR matrix times v. The
    products run over chunks of keys (`key_chunks`, KEY_CHUNK_BYTES of a head's keys or values each), so the rows
    they read at random stay in the core's cache; `scattered=False` (keys selected in runs, as NSA's blocks, which
    the cache serves as they are) takes all keys as one chunk, a product a head.

    q (B, H, r, D), k and v (B, Hk, m, D), idx and usable (B, S, r, kk) with S = 1 or Hk, idx sorted in each row
    (`sort_selection`) → (B, H, r, D); a row with no usable key outputs zeros. 4·r·kk·D FLOPs a head; never an r × m or
    r·kk × D tensor. Products in float32 or float64 (`work_dtype`); differentiable in q, k and v. Devices without sparse
    products, and rows of more entries than keys (repeated ones, which CSR cannot hold), take `gathered_softmax`."""
    if q.device.type not in ("cpu", "cuda") or idx.shape[-1] > k.shape[2]:  # more entries a row than keys: repeats
        return gathered_softmax(q, k, v, idx, usable)
    B, H, r, D = q.shape
    Hk, m = k.shape[1], k.shape[2]
    S, kk = idx.shape[1], idx.shape[-1]
    work = work_dtype(q.dtype)
    width = max(1, KEY_CHUNK_BYTES // (D * torch.finfo(work).bits // 8)) if scattered else m
    qs = q.to(work) * scale(D)
    ks, vs = k.to(work), v.to(work)
    g = H // Hk
    parts = [[key_chunks(idx[b, s], m, width) for s in range(S)] for b in range(B)]

    def shape(c0: int) -> tuple[int, int]:
        return r, min(width, m - c0)

    scores = qs.new_empty(B, H, r * kk)  # row-major: the chunks' sampled products, listed chunk by chunk, put back
    for b in range(B):
        for s, (chunks, order) in enumerate(parts[b]):
            heads = _heads(H, S, Hk, s)
            listed = scores[b, heads.start:heads.stop] if order is None else qs.new_empty(len(heads), r * kk)
            at = 0
            for c0, crow, col in chunks:
                nnz = col.shape[0]
                pattern = _csr(crow, col, qs.new_zeros(nnz), shape(c0))
                for i, h in enumerate(heads):
                    listed[i, at:at + nnz] = torch.sparse.sampled_addmm(pattern, qs[b, h], ks[b, h // g,
                                                                        c0:c0 + width].t(), beta=0.0).values()
                at += nnz
                del pattern
            if order is not None:  # one gather of every head's rows by the inverse order
                _put_back(listed, order, scores[b, heads.start:heads.stop])
            del listed
    del qs
    scores = scores.view(B, S, H // S, r, kk)  # the heads of each selection together: its flags broadcast, not copied
    if bool(usable.all()):  # every selected key counts (no mask, no padding): three passes over the scores fewer
        p = torch.softmax(scores, dim=-1).view(B, H, r, kk)
    else:
        keep = usable[:, :, None]
        dead = ~keep.any(-1, keepdim=True)
        p = torch.softmax(scores.masked_fill_(~keep, NEG).masked_fill_(dead, 0.0), dim=-1)
        p = (p.masked_fill(dead, 0.0) if p.requires_grad else p.masked_fill_(dead, 0.0)).view(B, H, r, kk)
    del scores
    out = q.new_zeros(B, H, r, D, dtype=work)
    for b in range(B):
        for s, (chunks, order) in enumerate(parts[b]):
            heads = _heads(H, S, Hk, s)
            listed = p[b, heads.start:heads.stop].reshape(len(heads), r * kk)
            if order is not None:  # a gather of the heads' rows ran 1.7× faster than index_select along them
                listed = listed.gather(1, order.expand(len(heads), -1))
            at = 0
            for c0, crow, col in chunks:
                nnz = col.shape[0]
                for i, h in enumerate(heads):
                    out[b, h].addmm_(_csr(crow, col, listed[i, at:at + nnz], shape(c0)), vs[b, h // g, c0:c0 + width])
                at += nnz
    return out.to(q.dtype)
