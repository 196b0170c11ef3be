"""Reformer's LSH attention: shared query-key vectors hashed by random rotations, attention within sorted chunks
(Kitaev, Kaiser, Levskaya 2020, 'Reformer: The Efficient Transformer', arXiv 2001.04451)."""
from __future__ import annotations

import math

import torch

from ..spec import Cost, Insight, MechanismSpec, Param, Shape, State, Supports
from ._common import checked_shape
from ._linear_core import work_dtype

FACTOR = 64  # largest number of buckets one rotation hashes into; more buckets are a product of such factors
SELF = -1e5  # a token's score with itself: the paper's m = 10⁵, so it counts only when nothing else is allowed


def n_buckets(n: int, bucket_size: int) -> int:
    """Buckets per round: n / bucket_size rounded to a power of two (so it factors into `bucket_factors`), ≥ 2.
    A bucket then holds between bucket_size/√2 and bucket_size·√2 tokens on average."""
    return 1 << max(1, round(math.log2(n / bucket_size)))


def bucket_factors(buckets: int) -> tuple[int, ...]:
    """`buckets` as a product of factors of at most FACTOR, largest first: 64 → (64,), 512 → (64, 8).

    One rotation R (D, b/2) hashing into b buckets costs n·D·b/2 per round, quadratic in n when b ∝ n; a product
    of hashes into 64, 64, … buckets costs n·D·(32 + 32 + …), with log n factors. The paper's authors factorise
    the same way in Trax (their published 'google/reformer-crime-and-punishment' has num_buckets = [64, 128])."""
    e = buckets.bit_length() - 1
    return (FACTOR,) * (e // 6) + ((1 << e % 6,) if e % 6 else ())


def rotation_columns(n: int, bucket_size: int) -> int:
    """Columns of one round's rotation: Σ factor/2 over the bucket factors."""
    return sum(f // 2 for f in bucket_factors(n_buckets(n, bucket_size)))


def init_state(shape: Shape, device=None, dtype=torch.float32, *, seed: int = 0, bucket_size: int = 64,
               n_hashes: int = 4) -> dict:
    """Random rotations of one layer: {'rotations': (D, n_hashes, Σ f/2)} with N(0, 1) entries, one independent
    set per hashing round; their number of columns follows from Nk and bucket_size (`rotation_columns`)."""
    SPEC.check_params({"bucket_size": bucket_size, "n_hashes": n_hashes}, shape)
    g = torch.Generator().manual_seed(seed)
    r = torch.randn(shape.D, n_hashes, rotation_columns(shape.Nk, bucket_size), generator=g)
    return {"rotations": r.to(device=device, dtype=dtype)}


def lsh_buckets(x: torch.Tensor, rotations: torch.Tensor, factors: tuple[int, ...]) -> torch.Tensor:
    """Angular LSH: per factor f, argmax over [xR; −xR] of its f/2 columns of R; the bucket is the mixed-radix
    number of those digits (first factor lowest). x (G, n, D), rotations (D, n_hashes, Σ f/2) → (G, n_hashes, n).
    [R; −R] is laid out once, so one matmul gives every [xR; −xR] and each digit is one argmax over a slice."""
    D, rounds, _ = rotations.shape
    signed, first = [], 0
    for f in factors:
        part = rotations[:, :, first:first + f // 2]
        signed += [part, -part]
        first += f // 2
    both = torch.cat(signed, dim=-1)  # (D, n_hashes, Σ f)
    del signed
    rot = (x @ both.view(D, -1)).view(*x.shape[:2], rounds, -1)  # (G, n, n_hashes, Σ f)
    buckets = rot[..., :factors[0]].argmax(-1)  # (G, n, n_hashes)
    first, radix = factors[0], factors[0]
    for f in factors[1:]:
        buckets.add_(rot[..., first:first + f].argmax(-1), alpha=radix)
        first, radix = first + f, radix * f
    return buckets.transpose(1, 2)


def sorted_slots(x: torch.Tensor, rotations: torch.Tensor, bucket_size: int, c: int) -> torch.Tensor:
    """Every round's tokens sorted by (bucket, position), as flat indices into x's (B·H·n) rows: (c + G·L,) with
    G = B·H·n_hashes rounds of L = c·⌈n/c⌉ slots, each round padded to whole chunks of c with copies of its last
    token, behind a lead chunk (a copy of the first) that stands before the first round's first chunk."""
    BH, n, _ = x.shape
    buckets = lsh_buckets(x, rotations, bucket_factors(n_buckets(n, bucket_size)))
    perm = torch.sort(buckets, dim=-1, stable=True).indices  # (BH, n_hashes, n): positions, sorted
    rounds, L = perm.shape[1], -(-n // c) * c
    flat = perm.new_empty(c + BH * rounds * L)
    rows = flat[c:].view(BH, rounds, L)
    rows[..., :n] = perm
    rows[..., :n] += (torch.arange(BH, device=x.device) * n).view(BH, 1, 1)
    rows[..., n:] = rows[..., n - 1:n]
    flat[:c] = flat[c:2 * c]
    return flat


def reformer_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, *, causal: bool = False,
                       bucket_size: int = 64, n_hashes: int = 4, rotations: torch.Tensor | None = None,
                       seed: int = 0) -> torch.Tensor:
    """LSH attention (Reformer, arXiv 2001.04451, §2–3) with shared query-key vectors: k is not used.

    Keys are the queries' own vectors normalised, k_j = q_j/|q_j|; scores q_i·k_j/√D. Each of n_hashes rounds hashes
    every q into n_buckets ≈ n/bucket_size buckets by a random rotation (argmax over [qR; −qR]), sorts the tokens by
    (bucket, position), cuts the sorted order into chunks of c = bucket_size, and lets each chunk attend to itself
    and the chunk before it (the first chunk to itself). A token's score with itself is −10⁵: it attends to itself
    only when it has no other key. Causal: j ≤ i in original positions. The rounds combine weighted by their
    normalisers, out_i = Σ_r exp(lse_r(i) − logsumexp_r lse_r(i))·out_r(i): a softmax over the union of the
    rounds' keys, a key found in several rounds counted once per round (reformer-pytorch's default; counting it
    once, its allow_duplicate_attention=False, costs a comparison of every scored pair across rounds).

    q, v (B, H, n, D) → (B, H, n, D); any n (each round's sorted order is padded to whole chunks, the padding
    masked). `rotations` (D, n_hashes, Σ f/2) come from `init_state`; absent, they are drawn here from `seed`.
    Time: one batched sort O(n_hashes·n·log n), hashing O(n_hashes·n·D·log n), attention O(n_hashes·n·c·D);
    memory O(n_hashes·n·(c + D)). float16/bfloat16 run in float32, cast back at the end.
    """
    shape = checked_shape(SPEC, q, k, v, causal, bucket_size=bucket_size, n_hashes=n_hashes)
    work = work_dtype(q.dtype)
    if rotations is None:  # drawn in the precision hashing runs in: rounded to half, they would move buckets
        rotations = init_state(shape, q.device, work, seed=seed, bucket_size=bucket_size,
                               n_hashes=n_hashes)["rotations"]
    want = (shape.D, n_hashes, rotation_columns(shape.Nk, bucket_size))
    if tuple(rotations.shape) != want:
        raise ValueError(f"rotations must have shape (D, n_hashes, Σ factor/2) = {want} for n = {shape.Nk} and "
                         f"bucket_size = {bucket_size}, got {tuple(rotations.shape)}; build them with init_state")
    B, H, n, D = q.shape
    x = q.reshape(B * H, n, D).to(work).contiguous()  # rows viewed flat below: a copy only of a strided layout
    c = min(bucket_size, n)
    flat = sorted_slots(x, rotations.to(work), bucket_size, c)
    out = _chunked_attention(x, v.reshape(B * H, n, D).to(work), flat, n_hashes, c, causal)
    return out.view(B, H, n, D).to(q.dtype)


def _chunked_attention(x: torch.Tensor, v: torch.Tensor, flat: torch.Tensor, n_hashes: int, c: int,
                       causal: bool) -> torch.Tensor:
    """Each sorted chunk against (previous chunk, own chunk), every round in one batched matmul, the rounds combined
    by their log-sum-exp. x, v (BH, n, D), flat from `sorted_slots` → (BH·n, D)."""
    BH, n, D = x.shape
    G = BH * n_hashes
    L = (flat.numel() - c) // G
    slots = flat[c:]
    p = _window_scores(x, flat, G, c, causal)  # (G·nc, c, 2c)
    top = p.detach().amax(-1, keepdim=True)  # (G·nc, c, 1); a constant shift, as in any softmax
    p = p.sub_(top).exp_()
    vs = v.reshape(-1, D).index_select(0, flat)
    num = p @ vs.unfold(0, 2 * c, c).transpose(1, 2)  # (G·nc, c, D): Σ_j exp(s_ij − top_i)·v_j
    del vs
    lse = p.sum(-1, keepdim=True).log().add_(top).view(G, L)
    del p
    coef = _round_weights(lse, top.view(G, L), slots.view(G, L), n, n_hashes)
    num.view(G, L, D).mul_(coef.unsqueeze(-1))
    out = torch.zeros(BH * n, D, dtype=x.dtype, device=x.device)
    return out.index_add_(0, slots, num.view(G * L, D))


def _window_scores(x: torch.Tensor, flat: torch.Tensor, G: int, c: int, causal: bool) -> torch.Tensor:
    """q_i·k_j/√D of every sorted chunk's queries against (previous chunk, own chunk): (G·nc, c, 2c), with the
    lowest finite value where j may not be attended and −10⁵ where j = i.

    Windows of 2c slots at stride c over `flat` are the (previous, own) chunk pairs: an unfold, no copy. A round's
    first window starts in the round before it (or the lead chunk), its last chunk may end in padding: both masked;
    flat holds bh·n + position, so within a round j > i by position is a comparison of slots."""
    BH, n, D = x.shape
    L = (flat.numel() - c) // G
    nc, slots = L // c, flat[c:]
    norm = torch.linalg.vector_norm(x, dim=-1, keepdim=True).clamp_min(torch.finfo(x.dtype).tiny)
    keys = x / (norm * math.sqrt(D))  # k_j/√D
    del norm
    ks = keys.view(-1, D).index_select(0, flat)
    del keys
    qs = x.view(-1, D).index_select(0, slots)
    s = qs.view(G * nc, c, D) @ ks.unfold(0, 2 * c, c)
    del qs, ks
    floor = torch.finfo(s.dtype).min
    chunks = s.view(G, nc, c, 2 * c)
    chunks[:, 0, :, :c] = floor  # the first chunk has no chunk before it
    if L > n:
        chunks[:, -1, :, 2 * c - (L - n):] = floor  # padding
    if causal:
        s.masked_fill_(flat.unfold(0, 2 * c, c)[:, None, :] > slots.view(G * nc, c, 1), floor)
    s[:, :, c:].diagonal(dim1=1, dim2=2).fill_(SELF)
    return s


def _round_weights(lse: torch.Tensor, top: torch.Tensor, rows: torch.Tensor, n: int, n_hashes: int) -> torch.Tensor:
    """exp(top_r(i) − logsumexp_r lse_r(i)) per slot, 0 on padding: what turns each round's unnormalised sum into
    its share of the combined output. lse, top, rows (G, L) → (G, L). The log-sum-exp over rounds is kept as its
    maximum M and the log of the rest, and top − M is taken first: a token with no key but itself has
    top = lse = −10⁵ in every round, and M + log n_hashes rounded in float32 (ulp 0.008 at 10⁵) would miss
    1/n_hashes by up to 0.4%."""
    G, L = lse.shape
    per_round = lse.new_empty(G // n_hashes * n, n_hashes)  # (B·H·n, n_hashes), each cell written once
    per_round[rows[:, :n], (torch.arange(G, device=lse.device) % n_hashes)[:, None]] = lse[:, :n]
    big = per_round.detach().amax(1, keepdim=True)
    rest = (per_round - big).exp().sum(1).log()  # (B·H·n,)
    coef = (top - big.view(-1)[rows] - rest[rows]).exp()
    return torch.where(torch.arange(L, device=lse.device) < n, coef, 0.0)


def _effective(q, k, v, causal: bool, state: dict, bucket_size: int = 64,
               n_hashes: int = 4) -> tuple[torch.Tensor, torch.Tensor]:
    """The weights the rounds apply together, (B, H, n, n): count_ij·exp(s_ij) normalised per row, count_ij the
    number of rounds in which i may attend to j (chunk of j is i's or the one before; j ≤ i when causal), s the
    shared-QK scores with −10⁵ on the diagonal. Applied to v."""
    B, H, n, D = q.shape
    x = q.reshape(B * H, n, D)
    buckets = lsh_buckets(x, state["rotations"].to(x.dtype), bucket_factors(n_buckets(n, bucket_size)))
    perm = torch.sort(buckets, dim=-1, stable=True).indices
    rank = torch.empty_like(perm).scatter_(-1, perm, torch.arange(n, device=q.device).expand_as(perm))
    chunk = torch.div(rank, min(bucket_size, n), rounding_mode="floor")  # (B·H, n_hashes, n)
    gap = chunk[..., :, None] - chunk[..., None, :]  # chunk of i − chunk of j
    allowed = (gap == 0) | (gap == 1)
    if causal:
        allowed &= torch.ones(n, n, dtype=torch.bool, device=q.device).tril_()
    keys = x / torch.linalg.vector_norm(x, dim=-1, keepdim=True).clamp_min(torch.finfo(x.dtype).tiny)
    scores = (x @ keys.transpose(1, 2)) / math.sqrt(D)
    scores.diagonal(dim1=1, dim2=2).fill_(SELF)
    weights = torch.softmax(scores + allowed.sum(1).to(x.dtype).log(), dim=-1)  # log 0 = −inf: never allowed
    return weights.view(B, H, n, n), v


def _sizes(s: Shape, bucket_size: int, n_hashes: int) -> tuple[int, int, int]:
    """(c, G, L) as the kernel computes: chunk length, rounds over all heads, slots per round."""
    c = min(bucket_size, s.Nq)
    return c, s.bh * n_hashes, -(-s.Nq // c) * c


def _flops(s: Shape, bucket_size: int = 64, n_hashes: int = 4) -> float:
    """Per round: hashing (x·[R; −R], 2·D a column), the sort (n·log₂ n comparisons) and the attention the real
    queries pay, Q Kᵀ and P V (2·D each) over their own chunk and the one before (causal: about half of them)."""
    n, D = s.Nq, s.D
    c = min(bucket_size, n)
    last = n - (-(-n // c) - 1) * c  # tokens in the last chunk
    cells = (n - last) * c + last * last + (n - c) * c  # own chunk, then the chunk before (none for the first)
    hashing = 4.0 * n * D * rotation_columns(n, bucket_size)
    return s.bh * n_hashes * (hashing + n * math.log2(max(n, 2)) + 4.0 * D * cells * (0.5 if s.causal else 1.0))


def _executed_flops(s: Shape, bucket_size: int = 64, n_hashes: int = 4) -> float:
    """The matmuls as run: every slot of every round, padding included, against a full window of 2c keys."""
    c, G, L = _sizes(s, bucket_size, n_hashes)
    return G * (4.0 * s.Nq * s.D * rotation_columns(s.Nq, bucket_size) + s.Nq * math.log2(max(s.Nq, 2))
                + 8.0 * L * c * s.D)


def _memory(s: Shape, bucket_size: int = 64, n_hashes: int = 4) -> float:
    """Peak bytes above the inputs, from the order the kernel allocates in (w: bytes of the work dtype, float32
    for half precision, whose float32 copies of q and v count too). Hashing: the rotated vectors (Σ f a token and
    round) beside two digit tensors; the sort: its int64 keys, values and indices. Attention, the larger: the
    scores (2c a slot), their row maxima, the gathered values and the unnormalised output (D a slot each), beside
    the int64 slots; causal also holds a boolean mask as large as the scores before the maxima exist."""
    n, D = s.Nq, s.D
    c, G, L = _sizes(s, bucket_size, n_hashes)
    w = max(s.elem, 4)
    slots = (c + G * L) * 8
    factors = bucket_factors(n_buckets(n, bucket_size))
    digits, signed = G * n * 8, s.D * n_hashes * sum(factors) * w  # int64 buckets; [R; −R]
    rotations = s.D * n_hashes * sum(factors) // 2 * w if s.elem < 4 else 0  # their float32 copy
    hashing = rotations + max(1.5 * signed, signed + G * n * sum(factors) * w + min(len(factors), 2) * digits,
                              3 * digits, 2 * digits + slots)
    scores = G * L * 2 * c * w
    attention = slots + scores + (G * L * (1 + D) + (c + G * L) * D) * w
    if s.causal:
        attention = max(attention, slots + scores + G * L * 2 * c)
    if s.elem < 4:  # float32 copies of q (from the start) and of v (for the attention)
        return max(hashing + s.bh * n * D * w, attention + 2 * s.bh * n * D * w)
    return max(hashing, attention)


SPEC = MechanismSpec(
    label="Reformer (LSH)",
    fn=reformer_attention,
    description="Hashes shared query-key vectors into buckets by random rotations, sorts them and attends within "
                "chunks of the sorted order: each query sees the keys nearest in angle that the hashes find.",
    paper="Kitaev, Kaiser, Levskaya 2020, 'Reformer: The Efficient Transformer', arXiv 2001.04451",
    params=(Param("bucket_size", 64, 1, 1 << 16, "Chunk length c of each sorted round; about n/c buckets.", log=True,
                  small=lambda n: max(2, n // 8), tokens=True),
            Param("n_hashes", 4, 1, 32, "Hashing rounds r: each finds more neighbours and costs as much again.",
                  log=True, small=lambda n: 2)),
    exact=False,
    state=State(init=init_state, keys=("rotations",)),
    cost=Cost(flops=_flops, executed_flops=_executed_flops, memory_bytes=_memory, time_big_o="O(n·log n)",
              memory_big_o="O(n·r·(c + d))"),
    supports=Supports(
        no_rope_relative=("Its hashes project q on fixed random rotations: the buckets, and so which keys a query "
                          "sees, change when every position shifts."),
        causal=True,
        cross=False,
        no_padding="its padding tokens are hashed and sorted with the real ones and take places in the chunks, so even "
                   "with them masked inside the chunks the real tokens see fewer keys than on the unpadded sequence, "
                   "and which ones depends on how much padding there is",
        no_generation="Its chunks are cut from the whole sequence sorted by bucket, so one new token shifts the chunk "
                      "of every token sorted after it: there is no cache a step can extend without sorting again.",
        shared_qk=True,
        no_shared_kv="Its keys are its queries themselves, normalised (it never reads k), so it has one key head per "
                     "query head and nothing for a group of query heads to share.",
    ),
    insight=Insight(
        effective=_effective,
        regime=("gentle", "gaussian", "Reformer uses the normalised queries as keys and never reads k: with "
                "independent unit-variance q and k, softmax's weights follow q·k, which it cannot see, and its error "
                "stays near 80% even when one chunk holds every key; with gentle inputs every score is near 0 either "
                "way and what is left is the keys the hashes miss, fewer as rounds and buckets grow."),
        accuracy_note="Reformer shares queries and keys (k is ignored; the keys are the queries normalised, a trained "
                      "Reformer learns one projection for both) and masks each token's own key: its errors against "
                      "softmax with the given k include that substitution, not only the keys its hashes miss.",
    ),
)
