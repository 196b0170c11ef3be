"""Kernelized attention φ(Q)·(φ(K)ᵀV), cache-blocked: φ applied chunk by chunk to rows that stay in cache, the sums
over keys taken with a ones column appended to V (numerator and normalizer in one product), causal by a chunked
prefix (shared by linear and Performer; Katharopoulos et al. 2020, arXiv 2006.16236, eq. 4–6)."""
from __future__ import annotations

import math
from typing import Callable, Optional

import torch
import torch.nn.functional as F

from .. import native
from ..spec import Shape
from ._common import HALF, check_finite, trusted, workspace
from ._cpu import caches

LOG2E = 1 / math.log(2)  # exp(x) = 2^(x·log₂e): torch's exp2 runs 2.5× faster than its exp on the CPU
CHUNK_BYTES = caches().own  # one chunk's rows of φ and V, all heads, float32: the cores' own L2 (see chunk_rows)
MIN_ROWS = 64  # fewer rows per chunk and the per-op overhead (a few µs a call) outweighs what the cache saves

QueryMap = Callable[[torch.Tensor], torch.Tensor]
KeyMap = Callable[[torch.Tensor, Optional[torch.Tensor]], "tuple[torch.Tensor, Optional[torch.Tensor]]"]


def work_dtype(dtype: torch.dtype) -> torch.dtype:
    """float32 for float16/bfloat16, else `dtype`: the precision the feature maps and sums over keys run in."""
    return torch.float32 if dtype in HALF else dtype


def causal_block(m: int, d: int) -> int:
    """Positions per block of the causal form: √(m·d) as a power of two in [32, 64]. Per position the masked
    in-block products cost 2·C·(m + D + 1), the block states m·(D + 1)/C numbers; past 64 the products cost more
    than the states save (Performer, m = 256, D = 64: C = 128 ran 7% slower than 64 at n = 8192)."""
    return 1 << max(5, min(6, round(math.log2(math.sqrt(m * d)))))


def chunk_rows(bh: int, n: int, m: int, d: int, causal: bool, device: str = "cpu") -> int:
    """Rows per chunk: the B·H heads' rows of φ (m wide) and of V or the output (D wide), float32, fill CHUNK_BYTES
    (on a GPU, `workspace`'s multiple of it), rounded down to a power of two, at least MIN_ROWS and one causal block,
    at most n (causal: rounded up to whole blocks). B·H = 8, D = 64, CPU: linear 512 rows, Performer's m = 256
    128. CHUNK_BYTES is the level-2 cache of the cores the threads run on, together (`_cpu.Caches.own`: each thread
    maps its share of the heads into its own core's cache): 2 MiB on the AMD EPYC it was measured on (1 MiB a core,
    two cores), where the time at n = 8192 is flat within 5–10% from a quarter to four times that. The causal chunk
    holds as much again in block states and C×C products; half the rows for it ran no faster on one thread and
    5–10% slower on two (twice the ops)."""
    unit = causal_block(m, d) if causal else 1
    rows = max(workspace(CHUNK_BYTES, device) // (4 * bh * (m + d)), MIN_ROWS, unit)
    return min(1 << (rows.bit_length() - 1), -(-n // unit) * unit)


def linear_attention_core(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, causal: bool, phi_q: QueryMap,
                          phi_k: KeyMap, m: int) -> torch.Tensor:
    """out_i = φ(q_i)ᵀ Σ_j φ(k_j) v_jᵀ / φ(q_i)ᵀ Σ_j φ(k_j), over all j (causal: j ≤ i).

    q (B, H, Nq, D), k, v (B, Hk, Nk, D), Hk dividing H → (B, H, Nq, D) in v's dtype. φ of width m is applied here,
    to chunks of `chunk_rows` rows: `phi_q(x)` maps query rows (…, D) → (…, m); `phi_k(x, floor)` maps key rows and
    returns the exponent (log₂, one per key/value head) their features are stabilised by, at least `floor`, or None:
    as that running maximum grows, what was summed before is rescaled by 2^(old − new), so all keys end relative to
    one maximum, as if taken over all keys at once. The key side (φ(K), the sums over keys) is computed once per
    key/value head, and the H/Hk query heads sharing one read its sums as rows of one product (grouped-query
    attention: less work than multi-head, never a repeated key). Non-causal (`_non_causal`): two passes, O(n·m·D)
    time, O(m·D) state. Causal (`_causal`): chunk by chunk, blocks of C positions inside (`causal_block`); never an
    (n, m, D) tensor. Memory: the output and one chunk's tensors. float16/bfloat16 rows are mapped and summed in
    float32 (`work_dtype`), written back in their dtype: in half precision φ(q)·Σφ(k) overflows (float16 passes
    65504 once n·D nears 6·10⁴) and the causal sums lose the early rows (float16 Performer: max error 3.3 against
    float64, 4·10⁻⁶ in float32).
    """
    B, H, nq, d = *q.shape[:3], v.shape[-1]  # q may come mapped already (`mapped`): D from v
    out = torch.empty(B, H, nq, d, dtype=v.dtype, device=v.device)
    rows = chunk_rows(B * H, max(nq, k.shape[2]), m, d, causal, v.device.type)
    if causal:
        _causal(q, k, v, out, phi_q, phi_k, rows, causal_block(m, d))
    else:
        _non_causal(q, k, v, out.view(B * H, nq, d), phi_q, phi_k, rows)
    return out


def _rows(x: torch.Tensor, start: int, stop: int) -> torch.Tensor:
    """Rows start:stop of x (B, H, N, D) as (B·H, rows, D) in the work dtype: a view of contiguous float32/64 input;
    a copy of the chunk for half precision (float32) or for a layout that cannot merge B and H (e.g. heads split
    from (B, N, H·D)), never of the whole input."""
    return x[:, :, start:stop].to(work_dtype(x.dtype)).reshape(x.shape[0] * x.shape[1], -1, x.shape[-1])


def _grouped_rows(x: torch.Tensor, start: int, stop: int, key_heads: int, block: int) -> torch.Tensor:
    """Rows start:stop of queries x (B, H, N, D) in blocks of `block` positions, the H/Hk query heads that share a
    key/value head stacked block by block: (B·Hk, blocks, (H/Hk)·block, D) in the work dtype, so each block's rows of
    a group meet that group's keys in one product (row ρ of a block is position ρ mod block). One copy of the chunk
    when heads are shared; `_rows`, viewed, when each query head has its own key/value head."""
    B, H, _, D = x.shape
    if key_heads == H:
        return _rows(x, start, stop).view(B * H, -1, block, D)
    blocks = x[:, :, start:stop].unflatten(1, (key_heads, H // key_heads)).unflatten(3, (-1, block)).transpose(2, 3)
    grouped = torch.empty(blocks.shape, dtype=work_dtype(x.dtype), device=x.device)  # (B, Hk, nb, H/Hk, C, D)
    return grouped.copy_(blocks).view(B * key_heads, blocks.shape[2], -1, D)


def _rescaled(state: torch.Tensor, top: torch.Tensor | None, new: torch.Tensor | None) -> torch.Tensor:
    """state · 2^(top − new), in place: sums over earlier keys re-expressed against the grown maximum `new`
    (B·Hk, 1, 1), one per key/value head; unchanged without a stabiliser."""
    if top is None or new is None:
        return state
    return state.mul_((top - new).exp2().to(state.dtype).view(-1, *([1] * (state.dim() - 1))))


def _write(out: torch.Tensor, num: torch.Tensor, den: torch.Tensor) -> None:
    """out = num / den, and 0 where the normalizer is below the smallest normal number (a query that sees no key,
    or features that underflow). The division runs on a safe normalizer (1 there) and the quotient is then
    replaced: a clamped normalizer's gradient is 0/0 there, NaN in q, k and v. Straight into `out` (cast to its
    dtype) unless autograd records: out= has no gradient."""
    unseen = den < torch.finfo(den.dtype).tiny  # (…, rows, 1); NaN is not below it, so NaN stays NaN
    safe = torch.where(unseen, torch.ones((), dtype=den.dtype, device=den.device), den)
    if torch.is_grad_enabled() and (num.requires_grad or den.requires_grad):
        out.copy_(torch.where(unseen, torch.zeros((), dtype=num.dtype, device=num.device), num / safe))
    else:
        torch.div(num, safe, out=out).masked_fill_(unseen, 0.0)


def _non_causal(q, k, v, out, phi_q: QueryMap, phi_k: KeyMap, rows: int) -> None:
    """Pass 1, key chunks: state = Σ_j [v_j, 1] φ(k_j)ᵀ (B·Hk, D + 1, m), its last row the normalizer Σ_j φ(k_j)ᵀ.
    Pass 2, query chunks: out = φ(Q_c)·state[:D]ᵀ / (state[D]·φ(Q_c)ᵀ)ᵀ, a chunk's H/Hk query heads of a group
    stacked as the rows of one product with its state. The state is kept transposed and the normalizer taken as a
    row: MKL's sgemm runs D + 1 = 65 output rows at the cost of 64 but 65 output columns 20% slower, and the
    normalizer of a chunk as the column φ(Q_c)·Σφ(k) costs 7× the row's time."""
    state = top = None
    for s in range(0, k.shape[2], rows):
        fk, new = phi_k(_rows(k, s, s + rows), top)
        v1 = F.pad(_rows(v, s, s + rows), (0, 1), value=1.0)  # [V, 1]
        if state is None:
            state = fk.new_zeros(fk.shape[0], v1.shape[-1], fk.shape[-1])
        state, top = _rescaled(state, top, new).baddbmm_(v1.transpose(-2, -1), fk), new
        del fk, v1  # one chunk alive at a time, not this one beside the next
    d = out.shape[-1]
    kv, z = state[:, :d].transpose(-2, -1), state[:, d:]  # (B·Hk, m, D), (B·Hk, 1, m)
    for s in range(0, q.shape[2], rows):
        fq = phi_q(_rows(q, s, s + rows))  # (B·H, rows, m)
        group = fq.reshape(kv.shape[0], -1, fq.shape[-1])  # (B·Hk, (H/Hk)·rows, m), a view of freshly mapped rows
        den = (z @ group.transpose(-2, -1)).view(fq.shape[0], 1, -1).transpose(-2, -1)  # (B·H, rows, 1)
        _write(out[:, s:s + rows], (group @ kv).view(*fq.shape[:2], d), den)
        del fq, group, den


def _causal(q, k, v, out, phi_q: QueryMap, phi_k: KeyMap, rows: int, c: int) -> None:
    """Chunk by chunk (`causal_chunks`), blocks of C positions inside: block b's rows get φ(Q_b)·(carried state +
    Σ_{b' < b} block states) + tril(φ(Q_b)φ(K_b)ᵀ)·[V_b, 1], the last column of each product the normalizer (the
    ones column appended to V spares a second prefix sum and its products); the chunk's total is carried on. Block
    states and their sums per key/value head (B·Hk), the query heads of a group as rows of a block (`_grouped_rows`);
    out (B, H, Nq, D)."""
    B, H, n, d = out.shape
    key_heads = k.shape[1]
    bk = B * key_heads
    below = torch.ones(rows // c, rows // c, dtype=work_dtype(q.dtype), device=q.device).tril_(-1)
    state = top = None
    for s, e, size in causal_chunks(n, rows, c):
        nb = (e - s) // size
        fk, new = phi_k(_rows(k, s, e), top)
        fk = fk.view(bk, nb, size, -1)
        fq = phi_q(_grouped_rows(q, s, e, key_heads, size))  # (B·Hk, nb, (H/Hk)·C, m)
        v1 = F.pad(_rows(v, s, e), (0, 1), value=1.0).view(bk, nb, size, -1)  # [V, 1]
        kv = (fk.transpose(-2, -1) @ v1).view(bk, nb, -1)  # (B·Hk, nb, m·(D + 1)): each block's own state
        if state is None:
            state = kv.new_zeros(bk, 1, kv.shape[-1])
        before = torch.baddbmm(_rescaled(state, top, new), below[:nb, :nb].expand(bk, nb, nb), kv)
        state, top = before[:, -1:] + kv[:, -1:], new
        del kv
        intra = fq @ fk.transpose(-2, -1)  # (B·Hk, nb, (H/Hk)·C, C)
        intra.view(bk, nb, -1, size, size).tril_()  # j ≤ i inside the block, for each query head
        num = intra @ v1
        del intra, fk, v1
        num = num.add_(fq @ before.view(bk, nb, fq.shape[-1], -1)).view(B, key_heads, nb, H // key_heads, size, -1)
        del fq, before
        # out's rows of this chunk seen in the grouped order: (B, Hk, nb, H/Hk, C, D)
        target = out[:, :, s:e].unflatten(1, (key_heads, -1)).unflatten(3, (nb, size)).transpose(2, 3)
        _write(target, num[..., :d], num[..., d:])
        del num


def causal_chunks(n: int, rows: int, c: int) -> list[tuple[int, int, int]]:
    """(start, stop, block) of the causal form's chunks: `rows` positions in blocks of c, the last chunk's whole
    blocks, then its remainder as one block of its own (no padding)."""
    chunks = []
    for s in range(0, n, rows):
        e = min(s + rows, n)
        whole = s + (e - s) // c * c
        chunks += [(s, whole, c)] if whole > s else []
        chunks += [(whole, e, e - whole)] if e > whole else []
    return chunks


def chunk_kinds(n: int, rows: int, c: int) -> dict[tuple[int, int], int]:
    """{(positions, block): how many} of causal_chunks(n, rows, c)'s chunks, counted without listing them: O(1), so
    that the cost models stay instant at any n (the planner and Theory search n up to 2**40)."""
    kinds: dict[tuple[int, int], int] = {}
    full, last = divmod(n, rows)
    for length, count in ((rows, full), (last, 1)):
        whole = length // c * c
        for piece in ((whole, c), (length - whole, length - whole)):
            if count and piece[0] > 0:
                kinds[piece] = kinds.get(piece, 0) + count
    return kinds


def linear_core_flops(s: Shape, m: int, *, executed: bool = False) -> float:
    """Matmul FLOPs of linear_attention_core with φ of width m on shape s. Useful work, both forms: per key/value
    head (B·Hk) the state φ(K)ᵀV (2·Nk·m·D); per query head (B·H) its product with φ(Q) (2·Nq·m·D) and the
    normalizer φ(Q)·Σφ(K) (2·Nq·m); causal adds, per query head, the in-block products φ(Q_c)φ(K_c)ᵀ and their
    product with V_c, 2·(m + D) for each pair j ≤ i of a block. `executed`: the state's products with [V, 1]
    (D + 1 columns: the ones column puts Σφ(K) into them); causal also the products with the state before each
    block over D + 1 columns, every block's full C×C products and each chunk's nb×nb sum of its block states (per
    key/value head)."""
    nq, nk, d = s.Nq, s.Nk, s.D
    if not s.causal:
        return 2.0 * (s.bk * nk * m * (d + int(executed)) + s.bh * nq * m * (d + 1))
    c = causal_block(m, d)
    if executed:
        return sum(count * (2.0 * r * (s.bk * m * (d + 1) + s.bh * (m * (d + 1) + b * (m + d + 1)))
                            + 2.0 * s.bk * (r // b) ** 2 * m * (d + 1))
                   for (r, b), count in chunk_kinds(nq, chunk_rows(s.bh, nq, m, d, True, s.device), c).items())
    full, rest = divmod(nq, c)
    cells = full * c * (c + 1) / 2 + rest * (rest + 1) / 2  # in-block pairs with j ≤ i
    return s.bk * 2.0 * nq * m * d + s.bh * (nq * (2.0 * m * d + 2.0 * m) + 2.0 * cells * (m + d))


def linear_core_memory(s: Shape, m: int, query_map: float, key_map: float) -> float:
    """Predicted peak bytes of linear_attention_core on shape s above its inputs: the output plus the largest set of
    one chunk's tensors alive at once, in the order the kernel makes them, key-side ones per key/value head (B·Hk),
    query-side ones per query head (B·H). `query_map`, `key_map`: numbers per row and head held at the peak of
    mapping a chunk of query or key rows, the features included (elu + 1: 2·m). Half precision maps a float32 copy
    of each chunk of q and k, multiplies one of v (D per row) and casts each quotient into the output; causal with
    shared heads maps a copy of each chunk of q in the grouped order (`_grouped_rows`). Causal: the state
    (m·(D + 1)) is counted from the first chunk on and the nb×nb lower-triangular ones once."""
    nq, nk, d, kh, qh = s.Nq, s.Nk, s.D, s.bk, s.bh
    w = max(s.elem, 4)  # bytes of the work dtype
    cp = d if s.elem < w else 0  # a chunk's float32 copy of q, k or v
    out = qh * nq * d * s.elem
    if not s.causal:
        rows = chunk_rows(qh, max(nq, nk), m, d, False, s.device)
        rk, rq, sums = min(rows, nk), min(rows, nq), m * (d + 1)
        second = min(rows, nk - rows)  # rows of the second chunk of keys, the first made beside the sums
        keys = kh * max(rk * (key_map + cp), second * (key_map + cp) + sums,  # mapping keys
                        rk * (m + cp + d + 1), second * (m + cp + d + 1) + sums,  # [V, 1] (from v's copy)
                        rk * (m + d + 1) + sums)  # their product into the sums
        queries = kh * sums + qh * max(rq * (query_map + cp),  # mapping queries
                                       rq * (m + d + 2),  # features, numerator, the normalizer row and its clamp
                                       rq * (m + d + 1 + cp))  # half: the quotient in float32 before its cast
        return out + max(keys, queries) * w
    rows, c = chunk_rows(qh, nq, m, d, True, s.device), causal_block(m, d)
    cq = d if s.group > 1 else cp  # the chunk of q copied (grouped, or in float32)
    sc = m * (d + 1)  # the carried state
    alive = 0.0
    for r, b in chunk_kinds(nq, rows, c):
        blocks = (r // b) * sc
        features = r * (kh + qh) * m  # φ(K) and φ(Q) of the chunk
        alive = max(alive, kh * sc + max(
            kh * r * (key_map + cp),  # mapping keys
            kh * r * m + qh * r * (query_map + cq),  # mapping queries beside the keys' features
            features + kh * r * (cp + d + 1),  # [V, 1] from v's copy
            features + kh * (r * (d + 1) + 2 * blocks + sc),  # block states, their prefix sums, the state carried on
            features + kh * (r * (d + 1) + blocks) + qh * r * (d + 1 + b),  # in-block products, their product
            # with [V, 1]
            qh * r * (m + 2 * (d + 1)) + kh * blocks,  # the products with the state before each block
            qh * r * (d + 2 + cp)))  # numerator, clamped normalizer (half: and the float32 quotient)
    return out + (alive + (rows // c) ** 2) * w


def mapped(phi_q: torch.Tensor, phi_k: torch.Tensor, v: torch.Tensor, causal: bool) -> torch.Tensor:
    """The core for features already computed, φ(Q) (B, H, Nq, m) and φ(K) (B, Hk, Nk, m): what a key-padding mask
    (zeroed rows of φ(K)) and a prompt's prefill (φ(K) kept for its state) need. Chunked as above, without the
    cache saving of mapping each chunk where it is used."""
    return linear_attention_core(phi_q, phi_k, v, causal, _same, _same_keys, phi_q.shape[-1])


def _same(x: torch.Tensor) -> torch.Tensor:
    return x


def _same_keys(x: torch.Tensor, floor: torch.Tensor | None) -> tuple[torch.Tensor, None]:
    return x, None  # already stabilised


# -- elu + 1 in whole-tensor operations (linear attention's float32/float64 forward)
WHOLE_BYTES = caches().shared // 2  # a causal segment's (B·H, positions, D) query rows in the whole-tensor form: half
# the last-level cache, its φ and scratch as large again (see `whole_fits`, `segment_rows`)


def whole_fits(bh: int, n: int, d: int, causal: bool, device: str = "cpu") -> bool:
    """Whether `elu_attention` takes B·H heads of n positions, D wide. On a CPU: always. Not causal, its groups of
    heads (`_non_causal_groups`) hold one group's φ beside the output; causal, it runs in segments of positions
    (`segment_rows`: all n where their query rows fill WHOLE_BYTES, else quarters of it), each segment's tensors in the
    shared cache between its operations, the state of the segments before carried into the next. With φ in one C++
    pass both beat the cache-blocked chunks past the cache (B = 1, H = 8, D = 64, float32, the benchmark's 2-core
    EPYC, interleaved, 9 rounds: not causal 0.59× their time at n = 16384 and 32768; causal in quarters 0.78–0.91×
    and 0.77–0.82×). On a GPU (not measured against the chunks there) only where the query rows fill at most
    WHOLE_BYTES."""
    return device == "cpu" or bh * n * d * 4 <= WHOLE_BYTES


def whole_ready(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, causal: bool) -> bool:
    """True when `elu_attention` runs the call: float32/float64 input that `whole_fits`, and no autograd record (its
    maps write into fresh contiguous buffers, which autograd cannot follow)."""
    recording = torch.is_grad_enabled() and (q.requires_grad or k.requires_grad or v.requires_grad)
    bh, n = q.shape[0] * q.shape[1], max(q.shape[2], k.shape[2])
    return v.dtype not in HALF and not recording and whole_fits(bh, n, q.shape[-1], causal, q.device.type)


def _divide(num: torch.Tensor, den: torch.Tensor, out: torch.Tensor | None = None) -> bool:
    """out (default: num, in place) = num / den, 0 where den is below the smallest normal number (the query saw no
    key, or its features underflow). The normalizers (one per row, 1/D of the numerators) are scanned first, so the
    rows are masked only when one is: one pass over the output fewer in the usual case. Returns whether a
    normalizer is NaN or infinite (a non-finite input, or sums that overflow)."""
    low, high = torch.stack(torch.aminmax(den)).tolist()
    result = torch.div(num, den, out=num if out is None else out)
    if low < torch.finfo(den.dtype).tiny:  # NaN is not below it, so NaN stays NaN
        result.masked_fill_(den < torch.finfo(den.dtype).tiny, 0.0)
    return not math.isfinite(low + high)


GROUP_BYTES = caches().shared // 8  # one group's query rows in the non-causal whole form where φ is torch's five
# passes: with its φ, scratch, keys and output about half the last-level cache (4 MiB on the benchmark's EPYC; see
# `_non_causal_groups`); also the slices of `phi_sliced`
NATIVE_GROUP_BYTES = 4 * caches().own  # the same where φ is the C++ pass (no scratch): 16 MiB on the Xeon, where
# fewer, larger operations won up to there (B = 1, H = 8, D = 64, the public call, 9 interleaved rounds: 4, 8, 16
# and 64 MiB took 4.2, 3.9, 3.8, 3.7 ms at n = 4096; 25.4, 20.3, 19.6, 21.7 at 16384; 44.4, 43.7, 38.6, 44.8 at
# 32768); 8 MiB on the 1 MiB-a-core EPYC, not measured there


NATIVE_MIN = 1 << 18  # numbers: below it a C++ op's dispatch (about 0.1 ms a call, a custom op's) costs more than
# its pass saves (φ and the prefix sums: equal between 128 and 256 Ki numbers on the benchmark's EPYC; at 4 Mi φ took
# 1.5 ms against 5.8, the prefix sums 3.2 against 4.6)


def phi_native(x: torch.Tensor, out: torch.Tensor | None = None) -> bool:
    """Whether φ of x (into out, or a tensor of x's shape) takes the C++ pass: at least NATIVE_MIN numbers that
    it takes (`native.elu_runs`: float32 on a CPU with AVX2 or AVX-512, rows of contiguous numbers, no gradient)."""
    return x.numel() >= NATIVE_MIN and native.elu_runs(x, x if out is None else out)


def phi_into(x: torch.Tensor, out: torch.Tensor, scratch: torch.Tensor | None) -> torch.Tensor:
    """φ(x) = elu(x) + 1 = exp(min(x, 0)) + (x − min(x, 0)), written into `out`: x + 1 for x > 0, eˣ otherwise. Any
    NaN or ±inf in x gives NaN or inf (−inf − (−inf) is NaN), so the sums over keys and the normalizers show a
    non-finite input without reading it again. Without `scratch` (None, where the caller found `phi_native`): one
    pass in C++ (`native.elu_plus_one`; 4 Mi numbers 1.5 ms against 5.8 ms on the benchmark's CPU). Else five passes
    of cheap torch operations through `scratch` (as large as x, overwritten), eˣ as 2^(x·log₂e): on rows that stay in
    cache, 40% less time than torch's elu (its expm1 is slow)."""
    if scratch is None:
        return native.elu_plus_one(x, out)
    torch.clamp(x, max=0, out=out)
    torch.sub(x, out, out=scratch)
    return out.mul_(LOG2E).exp2_().add_(scratch)


def phi_sliced(x: torch.Tensor, out: torch.Tensor) -> torch.Tensor:
    """`phi_into` over slices of x's first two dimensions (batch, heads), each at most GROUP_BYTES, through one
    scratch of that size: its five passes then read and write the shared cache, not memory (16 MiB of φ 2.3 ms at
    once, 1.1 ms in 4 MiB slices, on the benchmark's CPU). x and out of one shape, any strides; where the C++ pass
    takes them (`phi_native`), that pass alone, with no scratch."""
    if phi_native(x, out):
        return native.elu_plus_one(x, out)
    B, H = x.shape[:2]
    per = x[0, 0].numel()
    step = max(1, min(H, GROUP_BYTES // (per * x.element_size())))
    scratch = x.new_empty(step * per)
    for b in range(B):
        for h in range(0, H, step):
            part = x[b, h:h + step]
            phi_into(part, out[b, h:h + step], scratch[:part.numel()].view(part.shape))
    return out


def _head_groups(q, k, v, out, heads: int) -> list[tuple[torch.Tensor, ...]]:
    """(q, k, v, out) slices of up to `heads` key/value heads with their H/Hk query heads: over B·Hk merged when
    every tensor's strides allow, else within each batch element (heads split from (B, N, H·D))."""
    B, Hk = k.shape[:2]
    r = q.shape[1] // Hk
    try:
        flat = [x.view(B * Hk, -1, x.shape[-1]) for x in (q, k, v, out)]
    except RuntimeError:
        return [(q[b, a * r:(a + heads) * r], k[b, a:a + heads], v[b, a:a + heads], out[b, a * r:(a + heads) * r])
                for b in range(B) for a in range(0, Hk, heads)]
    return [tuple(x[a:a + heads] for x in flat) for a in range(0, B * Hk, heads)]


def group_heads(bk: int, rows: int, d: int, elem: int, in_cpp: bool) -> int:
    """Key/value heads a group of `_non_causal_groups` takes: as many as keep its query rows (`rows` a key/value
    head: H/Hk · Nq) within NATIVE_GROUP_BYTES where φ is the C++ pass (`in_cpp`), else GROUP_BYTES, at least one,
    at most the B·Hk there are."""
    return max(1, min(bk, (NATIVE_GROUP_BYTES if in_cpp else GROUP_BYTES) // (rows * d * elem)))


def _non_causal_groups(q, k, v, out) -> None:
    """Non-causal elu + 1 attention, a group of key/value heads at a time (their query rows fill `group_heads`'s
    bytes, so a group's φ, state and output stay in the shared cache between its operations): per group φ(K)
    (`phi_into`), the state φ(K)ᵀV and Σφ(K), then φ(Q) into the same buffer, out = φ(Q)·state / (Σφ(K)·φ(Q)ᵀ)ᵀ,
    the normalizer as a row (as a column it costs 7× its time) and the H/Hk query heads of a group as rows of one
    product.
    NaN or ±inf in q, k or v reaches the state or the normalizers (`phi_into`), which one small reduction a group
    reads: then, outside `validated()`, `check_finite` names the tensor (finite inputs whose sums overflow pass it).
    A row whose normalizer is below the smallest normal number (no key weighs, or its features underflow) is 0.
    Where `native.linear_runs` (float32, AVX-512 or AVX2), all of this in one C++ call instead (linear.cpp:
    q, k and v read once, the output written once; past the last-level cache each of the seven operations above is a
    trip to memory)."""
    if native.linear_runs(q, k, v):  # one C++ pass: q, k and v read once, the output written once
        if native.linear(q, k, v, out) and not trusted():
            check_finite(q=q, k=k, v=v)
        return
    B, H, nq, d = q.shape
    Hk, nk = k.shape[1], k.shape[2]
    r = H // Hk
    in_cpp = phi_native(q) and native.elu_runs(k, k)  # the call's φ in C++, every group's (`phi_into`): no scratch
    groups = _head_groups(q, k, v, out, group_heads(B * Hk, r * nq, d, q.element_size(), in_cpp))
    heads = max(ks.shape[0] for _, ks, _, _ in groups)
    buf = q.new_empty(heads * max(r * nq, nk) * d)
    scratch = None if in_cpp else torch.empty_like(buf)
    suspect = False
    for qs, ks, vs, os in groups:
        g = ks.shape[0]
        fk = phi_into(ks, buf[:ks.numel()].view(ks.shape), _part(scratch, ks))
        state = torch.bmm(fk.transpose(-2, -1), vs)  # (g, D, D)
        z = fk.sum(-2, keepdim=True)  # (g, 1, D)
        fq = phi_into(qs, buf[:qs.numel()].view(qs.shape), _part(scratch, qs)).view(g, -1, d)
        rows = os.view(g, -1, d)
        torch.bmm(fq, state, out=rows)
        den = torch.bmm(z, fq.transpose(-2, -1))  # (g, 1, H/Hk·Nq)
        suspect |= _divide(rows, den.transpose(-2, -1)) or not math.isfinite(state.sum().item())
    if suspect and not trusted():
        check_finite(q=q, k=k, v=v)


def _part(scratch: torch.Tensor | None, x: torch.Tensor) -> torch.Tensor | None:
    """The first x.numel() numbers of `scratch`, viewed as x; None without one."""
    return None if scratch is None else scratch[:x.numel()].view(x.shape)


def _before(kv: torch.Tensor) -> torch.Tensor:
    """Σ_{b' < b} kv[:, b'] for each block b of kv (B·Hk, nb, …), 0 for the first: in C++ where `native.prefix_runs`
    and kv holds NATIVE_MIN numbers or more (one vectorised add a block: 1.2 ms for 8 heads' 128 states at n = 8192,
    D = 64), else torch's cumsum written one block on (3.6 ms; a subtraction of each block's own cost 1 ms more). A
    new tensor of kv's shape."""
    if kv.numel() >= NATIVE_MIN and native.prefix_runs(kv):
        return native.prefix_sums(kv, 1)
    before = torch.empty_like(kv)
    before[:, 0].zero_()
    torch.cumsum(kv[:, :-1], 1, out=before[:, 1:])
    return before


def elu_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, causal: bool) -> torch.Tensor:
    """linear_attention_core's result for φ = elu + 1 in few, large operations (no loop over chunks of rows; a
    few groups of heads or slices of φ at most): each parallel operation of a call costs a synchronisation of the
    threads, which a busy core stretches to a time slice, so fewer and larger operations hold up under load. Same
    formula, same shapes; `whole_ready` says when.

    Non-causal: a group of heads at a time (`_non_causal_groups`, which also notices NaN and inf in the input).
    Causal: segments of positions (`segment_rows`; `_causal_segment`), in each blocks of C = `causal_block`
    positions; each block's state φ(K_b)ᵀ[V_b, 1], their exclusive prefix sums (`_before`) with the state carried
    from the segments before, then per block tril(φ(Q_b)φ(K_b)ᵀ)[V_b, 1] + φ(Q_b)·prefix; the last n mod C rows as
    one block after them. The H/Hk query heads of a group are rows of one product (a grouped copy of φ(Q) when
    Hk < H). Memory O(n·D): the output, and a segment's φ(K), [V, 1], block states and their sums, φ(Q) and in-block
    products. φ is `phi_into` or `phi_sliced` (one C++ pass where `phi_native`), so NaN or inf in q or k reaches the
    normalizers, and in v the sum of the block states, which the division and one small reduction read: then, outside
    `validated()`, `check_finite` names the tensor."""
    B, H, nq, d = q.shape
    Hk, nk = k.shape[1], k.shape[2]
    out = torch.empty(B, H, nq, d, dtype=v.dtype, device=v.device)
    if not causal:
        _non_causal_groups(q, k, v, out)
        return out
    if native.linear_runs(q, k, v, causal=True):  # one C++ call, a key/value head a task (linear.cpp)
        if native.linear(q, k, v, out, causal=True) and not trusted():
            check_finite(q=q, k=k, v=v)
        return out
    c = causal_block(d, d)
    step = segment_rows(B * H, nk, d, q.device.type)
    carried, suspect = None, False
    for s in range(0, nk, step):
        carried, bad = _causal_segment(q, k, v, out, s, min(s + step, nk), c, carried)
        suspect |= bad
    if suspect and not trusted():
        check_finite(q=q, k=k, v=v)
    return out


def segment_rows(bh: int, n: int, d: int, device: str = "cpu") -> int:
    """Positions of one segment of the causal whole-tensor form: all n where B·H heads' query rows fill at most
    WHOLE_BYTES in float32 (n = 8192 at B·H = 8, D = 64), else as many whole blocks (`causal_block`) as fill a
    quarter of it, at least one block (2,048 positions there). Longer segments ran faster (16 MiB: 0.71× the
    chunks' time at 16k and 32k, against 0.78–0.82× in quarters) but hold their tensors beside the output: 97 MiB
    at that shape, against 25 in quarters. On a GPU (the form runs only where all n fit) all n."""
    c = causal_block(d, d)
    if device != "cpu" or bh * n * d * 4 <= WHOLE_BYTES:
        return max(n, 1)
    return max(c, WHOLE_BYTES // 4 // (bh * d * 4) // c * c)


def _causal_segment(q, k, v, out, s: int, e: int, c: int, carried: torch.Tensor | None):
    """Positions s … e − 1 of the causal form (`elu_attention`), after the state `carried` (B·Hk, D, D + 1) of all
    before s (None at 0): their blocks of C (one more of the last e − s mod C positions) written into out. Returns
    the state of all positions before e and whether a sum or normalizer is NaN or infinite."""
    B, H, _, d = out.shape
    Hk = k.shape[1]
    nb, r = (e - s) // c, H // Hk
    w = s + nb * c  # positions in whole blocks end here; the rest (< C) is one block after them
    total, suspect = carried, False
    if nb:  # whole blocks: φ(K) and [V, 1] of their positions, (B·Hk, blocks) merged
        fk = phi_sliced(k[:, :, s:w], k.new_empty(B, Hk, w - s, d)).view(B * Hk, nb, c, d)
        v1 = F.pad(v[:, :, s:w], (0, 1), value=1.0).view(B * Hk, nb, c, d + 1)  # [V, 1]
        kv = fk.transpose(-2, -1) @ v1  # (B·Hk, nb, D, D + 1): each block's own state
        before = _before(kv)  # the sums of the blocks before each one
        if carried is not None:
            before.add_(carried.unsqueeze(1))
        total = before[:, -1] + kv[:, -1]
        del kv
        grouped = torch.empty(B, Hk, nb, r, c, d, dtype=v.dtype, device=v.device)  # block by block, heads as rows
        phi_sliced(q[:, :, s:w].unflatten(1, (Hk, r)).unflatten(3, (nb, c)), grouped.transpose(2, 3))
        fq = grouped.view(B * Hk, nb, r * c, d)
        intra = fq @ fk.transpose(-2, -1)  # (B·Hk, nb, r·C, C)
        intra.view(B * Hk, nb, r, c, c).tril_()
        num = intra @ v1
        del intra, fk, v1
        num.view(B * Hk * nb, r * c, d + 1).baddbmm_(fq.view(-1, r * c, d), before.view(-1, d, d + 1))
        del fq, before
        target = out[:, :, s:w].unflatten(1, (Hk, r)).unflatten(3, (nb, c)).transpose(2, 3)  # (B, Hk, nb, r, C, D)
        num = num.view(B, Hk, nb, r, c, d + 1)
        suspect = _divide(num[..., :d], num[..., d:], out=target) or not math.isfinite(total.sum().item())
        del num
    if w < e:  # the last n mod C positions: one block, the state of all before it
        rest = e - w
        fk = phi_into(k[:, :, w:e], k.new_empty(B, Hk, rest, d), k.new_empty(B, Hk, rest, d)).view(B * Hk, rest, d)
        v1 = F.pad(v[:, :, w:e], (0, 1), value=1.0).view(B * Hk, rest, d + 1)
        fq = phi_into(q[:, :, w:e], q.new_empty(B, H, rest, d), q.new_empty(B, H, rest, d)).view(B * Hk, r * rest, d)
        intra = fq @ fk.transpose(-2, -1)
        intra.view(B * Hk, r, rest, rest).tril_()
        num = intra @ v1
        if total is not None:
            num.baddbmm_(fq, total)
        num = num.view(B, H, rest, d + 1)
        suspect |= _divide(num[..., :d], num[..., d:], out=out[:, :, w:e]) or not math.isfinite(v1.sum().item())
    return total, suspect


def elu_memory(bh: int, bk: int, nq: int, nk: int, d: int, causal: bool, elem: int = 4,
               scratch: bool = True, device: str = "cpu") -> float:
    """Predicted peak numbers held by `elu_attention` above its inputs (multiply by the element size `elem`), B·H
    query and B·Hk key/value heads: the output (B·H·Nq·D) plus, non-causal, a group's (`group_heads`) buffer for φ
    and its scratch (each the larger of its query and key rows, D wide; no scratch where `scratch` is False: the C++
    φ, `phi_native`), its states, Σφ(K) and normalizers; causal, the largest of its segments (`segment_rows`), each
    beside the state carried from the segments before it: with C = `causal_block` and nb whole blocks of w = nb·C
    positions, the larger of: φ(K) and [V, 1] of the blocks with the block states beside their prefix sums and the
    state carried on; the same with the prefix sums only, then φ(Q) grouped, the in-block products (C per row) and
    their numerators (D + 1 per row); and the last e − s mod C positions' own tensors beside the states."""
    if not causal:
        r = bh // bk
        g = group_heads(bk, r * nq, d, elem, not scratch)
        return bh * nq * d + (1 + scratch) * g * max(r * nq, nk) * d + g * (d * d + d + r * nq)
    step = segment_rows(bh, nk, d, device)
    full, last = divmod(nk, step)
    kinds = [(step, False)] * (full >= 1) + [(step, True)] * (full >= 2) + [(last, full >= 1)] * (last > 0)
    return bh * nq * d + max(_segment_memory(bh, bk, length, d, carried) for length, carried in kinds)


def _segment_memory(bh: int, bk: int, length: int, d: int, carried: bool) -> float:
    """Peak numbers of one segment of `length` positions of the causal form (`_causal_segment`), the state carried
    into it (held by the caller throughout) counted where `carried`."""
    c = causal_block(d, d)
    nb = length // c
    w, rest = nb * c, length - nb * c
    state = bk * d * (d + 1)
    states, total, before = bk * nb * d * (d + 1), state if nb else 0, state if carried else 0
    blocks = 0.0
    if nb:
        held = bk * w * (2 * d + 1) + states + total + before
        blocks = held + max(states, bh * w * (2 * d + c + 1))
    tail = total + before + bk * rest * (2 * d + 1) + bh * rest * (2 * d + rest + 1) if rest else 0.0
    return max(blocks, tail)


def elu_flops(bh: int, bk: int, nq: int, nk: int, d: int, causal: bool) -> float:
    """Matmul FLOPs `elu_attention` executes. Non-causal: elu(K)ᵀV per key/value head (2·Nk·D²), elu(Q) times the
    state and times Σφ(K) per query head (2·Nq·D·(D + 1)). Causal: per key/value head each block's state over
    [V, 1] (2·C·D·(D + 1) a block), per query head the full C×C in-block products over D and D + 1 columns and the
    product with the state before (2·D·(D + 1) a row); the last n mod C rows the same as one block."""
    if not causal:
        return 2.0 * (bk * nk * d * d + bh * nq * d * (d + 1))
    c = causal_block(d, d)
    w = nk // c * c
    rest = nk - w
    blocks = 2.0 * (bk * w * d * (d + 1) + bh * w * (c * (2 * d + 1) + d * (d + 1)))
    return blocks + 2.0 * bh * rest * (rest * (2 * d + 1) + (d * (d + 1) if w else 0))
