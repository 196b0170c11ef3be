"""Baselines written independently of attn_core: explicit loops and numpy, no shared helpers."""
from __future__ import annotations

import math

import numpy as np
import torch


def allowed(kind: str, nq: int, nk: int, causal: bool = False, **p) -> np.ndarray:
    """(nq, nk) boolean mask built cell by cell from each paper's wording."""
    m = np.zeros((nq, nk), dtype=bool)
    # the global tokens and each query block's random blocks as Python sets, read once (a tensor's items read cell
    # by cell took seconds at n = 100)
    glob, randoms = set(), []
    if kind == "longformer":
        given = p.get("global_positions")
        glob = set(range(p["global_tokens"])) if given is None else {int(x) for x in given}
    if kind == "bigbird":
        randoms = [{int(x) for x in row} for row in p["random_table"]]
    for i in range(nq):
        for j in range(nk):
            if kind == "full":
                ok = True
            elif kind == "sliding_window":
                ok = abs(i - j) <= p["window"]
            elif kind == "local":
                bi, bj = i // p["block"], j // p["block"]
                ok = bi - p["lookback"] <= bj <= bi + (0 if causal else p["lookahead"])
            elif kind == "sparse":
                s = p["stride"]
                ok = i // s == j // s or j % s == s - 1
            elif kind == "longformer":  # Beltagy et al. 2020, §3.1: a window of w each side; global tokens see
                # every token and every token sees them
                ok = abs(i - j) <= p["window"] or i in glob or j in glob
            elif kind == "bigbird":  # Zaheer et al. 2020, §2 and App. D (ITC): a query block sees its window of
                # blocks, the first g blocks, and the blocks its row of the random table lists; global blocks see all
                b, w = p["block"], p["window_blocks"]
                qb, kb = i // b, j // b
                back, ahead = w // 2, 0 if causal else (w - 1) // 2
                ok = (qb - back <= kb <= qb + ahead or qb < p["global_blocks"] or kb < p["global_blocks"]
                      or kb in randoms[qb])
            else:
                raise KeyError(kind)
            m[i, j] = ok and (j <= i or not causal)
    return m


def masked_softmax(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: np.ndarray | None = None) -> torch.Tensor:
    """Attention computed in float64 with an explicit exp and normalisation (no torch.softmax)."""
    q64, k64, v64 = (t.double() for t in (q, k, v))
    logits = torch.einsum("bhid,bhjd->bhij", q64, k64) / q.shape[-1] ** 0.5
    if mask is not None:
        logits = logits.masked_fill(~torch.as_tensor(mask), float("-inf"))
    w = torch.exp(logits - logits.amax(-1, keepdim=True))
    w = w / w.sum(-1, keepdim=True)
    return torch.einsum("bhij,bhjd->bhid", w, v64)


def kernel_attention(phi_q: torch.Tensor, phi_k: torch.Tensor, v: torch.Tensor, causal: bool) -> torch.Tensor:
    """Explicit O(n²) form of kernelized attention: A = φ(Q)φ(K)ᵀ (lower triangle if causal), rows normalised."""
    a = torch.einsum("bhim,bhjm->bhij", phi_q.double(), phi_k.double())
    if causal:
        a = a * torch.ones(a.shape[-2:], dtype=torch.float64).tril()
    return torch.einsum("bhij,bhjd->bhid", a / a.sum(-1, keepdim=True), v.double())


def trace_peak_bytes(fn) -> int:
    """Peak CPU bytes in use during fn() above its start, read from the profiler's exported Chrome trace (not the
    engine's reading of the event list): every '[memory]' record's signed Bytes, summed in timestamp order."""
    import json
    import os
    import tempfile

    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
        fn()
    fd, path = tempfile.mkstemp(suffix=".json")
    os.close(fd)
    try:
        prof.export_chrome_trace(path)
        with open(path) as f:
            events = json.load(f)["traceEvents"]
    finally:
        os.remove(path)
    records = sorted((float(e["ts"]), int(e["args"]["Bytes"])) for e in events
                     if e.get("name") == "[memory]" and e["args"].get("Device Type", 0) == 0)
    level = peak = 0
    for _, nbytes in records:  # equal stamps: an allocation (+) before a free (−) of the same instant, the safe side
        level += nbytes
        peak = max(peak, level)
    return peak


def positive_random_features(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    """FAVOR+ features as the paper writes them, in float64 and with no stabiliser:
    φ(x) = exp(w·x' − |x'|²/2)/√m, x' = x/D^¼. x (…, D), w (m, D) → (…, m)."""
    xs = x.double() / x.shape[-1] ** 0.25
    return torch.exp(xs @ w.double().T - (xs * xs).sum(-1, keepdim=True) / 2) / w.shape[0] ** 0.5


def elu_plus_one(x: torch.Tensor) -> torch.Tensor:
    """Linear attention's φ in float64: x + 1 for x > 0, exp(x) otherwise."""
    x = x.double()
    return torch.where(x > 0, x + 1, torch.exp(x))


def lsh_attention(q: torch.Tensor, v: torch.Tensor, rotations: torch.Tensor, factors: tuple[int, ...],
                  bucket_size: int, causal: bool = False) -> tuple[torch.Tensor, torch.Tensor]:
    """Reformer's LSH attention from the paper's wording, in float64 numpy, token by token and round by round.

    Keys are the queries normalised, score(i, j) = q_i·q_j / (|q_j|·√D), and −10⁵ for j = i. Round r: the bucket
    of token i is, per factor f of the bucket count, argmax over [q_i R; −q_i R] of that factor's f/2 columns of
    R = rotations[:, r], the digits read as a mixed-radix number (first factor lowest); tokens sorted by (bucket,
    position) and numbered 0, 1, … in that order; token i may attend to token j iff rank(j) // c is rank(i) // c or
    one less (and j ≤ i when causal). Each round is a softmax over its allowed keys; the rounds combine weighted by
    the exponentials of their log-normalisers. Returns the output (B, H, n, D) and the combined weights (B, H, n, n).
    """
    qn, vn, rot = q.double().numpy(), v.double().numpy(), rotations.double().numpy()
    B, H, n, D = qn.shape
    rounds = rot.shape[1]
    weights = np.zeros((B, H, n, n))
    for b in range(B):
        for h in range(H):
            x = qn[b, h]
            lse, per_round = np.zeros((rounds, n)), np.zeros((rounds, n, n))
            for r in range(rounds):
                bucket = [0] * n
                for i in range(n):
                    first, radix = 0, 1
                    for f in factors:
                        proj = [float(np.dot(x[i], rot[:, r, first + a])) for a in range(f // 2)]
                        both = proj + [-p for p in proj]
                        bucket[i] += radix * both.index(max(both))
                        first, radix = first + f // 2, radix * f
                order = sorted(range(n), key=lambda i: (bucket[i], i))
                chunk = [0] * n
                for rank, i in enumerate(order):
                    chunk[i] = rank // bucket_size
                for i in range(n):
                    keys = [j for j in range(n) if chunk[j] in (chunk[i], chunk[i] - 1) and (j <= i or not causal)]
                    scores = np.array([-1e5 if j == i else np.dot(x[i], x[j]) / (np.linalg.norm(x[j]) * D ** 0.5)
                                       for j in keys])
                    top = scores.max()
                    w = np.exp(scores - top)
                    lse[r, i] = top + np.log(w.sum())
                    per_round[r, i, keys] = w / w.sum()
            share = np.exp(lse - lse.max(0))
            share /= share.sum(0)  # (rounds, n): each round's weight per query
            weights[b, h] = (share[:, :, None] * per_round).sum(0)
    return torch.from_numpy(weights @ vn), torch.from_numpy(weights)


def nystrom_reference(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, landmarks: int,
                      iterations: int | None = 6) -> torch.Tensor:
    """Nyströmformer written from the paper (Xiong et al. 2021, arXiv 2102.03902) in numpy float64, one head at a
    time: landmarks are the means of np.array_split's segments; F = softmax(Q K̃ᵀ/√d), A = softmax(Q̃ K̃ᵀ/√d),
    B = softmax(Q̃ Kᵀ/√d); out = F · A⁺ · (B V), with A⁺ from `iterations` steps of
    Z ← ¼ Z (13I − AZ (15I − AZ (7I − AZ))), Z₀ = Aᵀ/(‖A‖₁‖A‖∞) (numpy's matrix norms), or np.linalg.pinv when
    iterations is None."""

    def softmax(x):
        e = np.exp(x - x.max(axis=1, keepdims=True))
        return e / e.sum(axis=1, keepdims=True)

    def pinv(a):
        if iterations is None:
            return np.linalg.pinv(a)
        eye = np.eye(len(a))
        z = a.T / (np.linalg.norm(a, 1) * np.linalg.norm(a, np.inf))
        for _ in range(iterations):
            az = a @ z
            z = 0.25 * z @ (13 * eye - az @ (15 * eye - az @ (7 * eye - az)))
        return z

    qn, kn, vn = (t.detach().double().numpy() for t in (q, k, v))
    out = np.zeros(qn.shape)
    root = np.sqrt(qn.shape[-1])
    for b in range(qn.shape[0]):
        for h in range(qn.shape[1]):
            Q, K, V = qn[b, h], kn[b, h], vn[b, h]
            Ql = np.stack([s.mean(axis=0) for s in np.array_split(Q, landmarks)])
            Kl = np.stack([s.mean(axis=0) for s in np.array_split(K, landmarks)])
            F, A, B = softmax(Q @ Kl.T / root), softmax(Ql @ Kl.T / root), softmax(Ql @ K.T / root)
            out[b, h] = F @ pinv(A) @ (B @ V)
    return torch.from_numpy(out)


def additive_reference(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, W_q: torch.Tensor, W_k: torch.Tensor,
                       w: torch.Tensor, causal: bool = False, padding: torch.Tensor | None = None) -> torch.Tensor:
    """Bahdanau et al. 2015 (arXiv 1409.0473) additive attention in plain loops, numpy float64:
    e_ij = w · tanh(W_qᵀ q_i + W_kᵀ k_j) for every pair (j ≤ i when causal; j not padding, `padding` (B, Nk) True
    where it is), a_ij = exp(e_ij) / Σ_j exp(e_ij), out_i = Σ_j a_ij v_j (0 with no key). Small n only."""
    qn, kn, vn = (t.detach().double().numpy() for t in (q, k, v))
    Wq, Wk, wn = (t.detach().double().numpy() for t in (W_q, W_k, w))
    pad = None if padding is None else np.asarray(padding, dtype=bool)
    B, H, nq, _ = qn.shape
    out = np.zeros(qn.shape)
    for b in range(B):
        for h in range(H):
            for i in range(nq):
                keys = [j for j in range(kn.shape[2]) if (j <= i or not causal) and (pad is None or not pad[b, j])]
                if not keys:
                    continue
                query = Wq.T @ qn[b, h, i]
                e = np.array([wn @ np.tanh(query + Wk.T @ kn[b, h, j]) for j in keys])
                a = np.exp(e - e.max())
                out[b, h, i] = (a / a.sum()) @ vn[b, h, keys]
    return torch.from_numpy(out)


def _visible(nq: int, nk: int, causal: bool, pad: torch.Tensor | None, batch: int) -> np.ndarray:
    """(B, nq, nk) boolean: key j is visible to query i (j ≤ i when causal) and not padding, cell by cell."""
    m = np.zeros((batch, nq, nk), dtype=bool)
    for b in range(batch):
        for i in range(nq):
            for j in range(nk):
                m[b, i, j] = (j <= i or not causal) and (pad is None or not bool(pad[b, j]))
    return m


def differential_reference(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, causal: bool, lam: float,
                           pad: torch.Tensor | None = None) -> torch.Tensor:
    """Ye et al. 2024 (arXiv 2410.05258) eq. 1 as written, in float64: the head dim cut in two halves of width
    d = D/2, softmax(Q₁K₁ᵀ/√d)V − λ·softmax(Q₂K₂ᵀ/√d)V; padded keys (pad True) get no weight and a query that sees
    no key outputs zeros. k and v with as many heads as q."""
    d = q.shape[-1] // 2
    vis = torch.as_tensor(_visible(q.shape[-2], k.shape[-2], causal, pad, q.shape[0]))[:, None]  # (B, 1, Nq, Nk)
    maps = []
    for lo, hi in ((0, d), (d, 2 * d)):
        logits = torch.einsum("bhid,bhjd->bhij", q[..., lo:hi].double(), k[..., lo:hi].double()) / d ** 0.5
        w = torch.exp(logits - logits.amax(-1, keepdim=True)) * vis  # masked cells add nothing to the sum
        maps.append(w / w.sum(-1, keepdim=True).clamp_min(1e-300))
    return torch.einsum("bhij,bhjd->bhid", maps[0] - lam * maps[1], v.double())


def sigmoid_reference(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, causal: bool, bias: float,
                      pad: torch.Tensor | None = None) -> torch.Tensor:
    """Ramapuram et al. 2024 (arXiv 2409.04431): Σ_j σ(q_i·k_j/√D + b_i) v_j over the visible keys, in float64,
    with b_i = bias − ln m_i, m_i the keys query i sees (attn_core's rule; the paper's −ln n when all n are seen)."""
    vis = torch.as_tensor(_visible(q.shape[-2], k.shape[-2], causal, pad, q.shape[0]))[:, None]  # (B, 1, Nq, Nk)
    m = vis.sum(-1, keepdim=True).clamp_min(1).double()
    logits = torch.einsum("bhid,bhjd->bhij", q.double(), k.double()) / q.shape[-1] ** 0.5 + bias - torch.log(m)
    w = 1.0 / (1.0 + torch.exp(-logits)) * vis
    return torch.einsum("bhij,bhjd->bhid", w, v.double())


def runs(spec, causal: bool) -> bool:
    """Whether a mechanism runs with this causal flag: causal needs spec.supports.causal; non-causal needs a
    mechanism that is not causal only (spec.supports.causal_only, a recurrence such as Mamba-2's)."""
    return bool(spec.supports.causal) if causal else not spec.supports.causal_only


def plain_causal(spec) -> bool:
    """The causal flag for a test that does not vary it: True for a mechanism that runs causal only, else False."""
    return bool(spec.supports.causal_only)


def chunk_pieces(n: int, rows: int, chunk: int) -> list[tuple[int, int]]:
    """(tokens, chunk) of each piece a chunked recurrence runs over n tokens, walked one segment at a time: segments
    of `rows` tokens (the last one the rest), each cut into chunks of `chunk`; a segment's whole chunks are one
    piece, the tokens left over (fewer than `chunk`) one piece whose chunk is their count. No padding."""
    pieces, start = [], 0
    while start < n:
        length = min(rows, n - start)
        whole, rest = length - length % chunk, length % chunk
        if whole:
            pieces.append((whole, chunk))
        if rest:
            pieces.append((rest, rest))
        start += length
    return pieces


def ssd_recurrence(q, k, v, dt, A, pad=None) -> torch.Tensor:
    """Mamba-2's recurrence token by token in float64 (Dao and Gu 2024, arXiv 2405.21060, scalar A per head):
    h_t = exp(dt_t·A)·h_{t−1} + dt_t·k_t v_tᵀ, y_t = h_tᵀ q_t, each query head reading key/value head ⌊i·Hk/H⌋;
    a padded token (pad (B, n) True) is skipped: h passes it unchanged and it adds nothing."""
    B, H, n, D = q.shape
    q, k, v, dt, A = (t.double() for t in (q, k, v, dt, A))
    h = [[torch.zeros(D, v.shape[-1], dtype=torch.float64) for _ in range(H)] for _ in range(B)]
    out = [[[] for _ in range(H)] for _ in range(B)]
    for b in range(B):
        for i in range(H):
            j = i * k.shape[1] // H
            for t in range(n):
                if pad is None or not bool(pad[b, t]):
                    new = dt[b, i, t] * torch.outer(k[b, j, t], v[b, j, t])
                    h[b][i] = torch.exp(dt[b, i, t] * A[i]) * h[b][i] + new
                out[b][i].append(h[b][i].T @ q[b, i, t])
    return torch.stack([torch.stack([torch.stack(row) for row in heads]) for heads in out])


def gated_delta_reference(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, alpha: torch.Tensor, beta: torch.Tensor,
                          pad: torch.Tensor | None = None) -> torch.Tensor:
    """Gated DeltaNet as the paper writes it (arXiv 2412.06464), in float64, one token at a time, one state per
    query head: S₀ = 0, S_t = α_t S_{t−1} (I − β_t k̂_t k̂_tᵀ) + β_t v_t k̂_tᵀ, o_t = S_t q̂_t,
    k̂ = k/max(‖k‖, 10⁻⁶), q̂ = q/(max(‖q‖, 10⁻⁶)·√D). k, v, alpha, beta with Hk heads serve query head i from head
    ⌊i·Hk/H⌋. A padded key (pad (B, n), True) is skipped: the state stays as it was."""
    B, H, n, D = q.shape
    src = [i * k.shape[1] // H for i in range(H)]
    q, k, v, alpha, beta = (t.double() for t in (q, k, v, alpha, beta))
    k, v, alpha, beta = (t[:, src] for t in (k, v, alpha, beta))
    qn = q / q.norm(dim=-1, keepdim=True).clamp_min(1e-6) / D ** 0.5
    kn = k / k.norm(dim=-1, keepdim=True).clamp_min(1e-6)
    out = torch.zeros(B, H, n, D, dtype=torch.float64)
    for b in range(B):
        for h in range(H):
            S = torch.zeros(D, D, dtype=torch.float64)
            for t in range(n):
                if pad is None or not pad[b, t]:
                    kt = kn[b, h, t][:, None]
                    S = alpha[b, h, t] * S @ (torch.eye(D, dtype=torch.float64) - beta[b, h, t] * kt @ kt.T) \
                        + beta[b, h, t] * v[b, h, t][:, None] @ kt.T
                out[b, h, t] = S @ qn[b, h, t]
    return out


def topk_reference(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, causal: bool, top_k: int, index_q: torch.Tensor,
                   index_k: torch.Tensor, index_w: torch.Tensor, pad: torch.Tensor | None = None) -> torch.Tensor:
    """DeepSeek Sparse Attention (DeepSeek-V3.2, arXiv 2512.02556) by brute force in float64: the indexer's scores
    I_ts = Σ_j w_j ReLU(q̄_t W_q,j · k̄_s W_k) for every pair (q̄, k̄: the mean query and key over heads), each row's
    visible keys sorted by score (stable, descending: ties go to the earlier key), the first top_k kept, and softmax
    of q·k/√D over them, head by head with each key/value head repeated for its query heads. No visible key: 0."""
    B, H, n, D = q.shape
    m, heads = k.shape[-2], index_w.shape[0]
    qi = torch.einsum("bd,de->be", q.double().mean(1).reshape(-1, D), index_q.double()).view(B, n, heads, -1)
    ki = torch.einsum("bd,de->be", k.double().mean(1).reshape(-1, D), index_k.double()).view(B, m, -1)
    scores = torch.einsum("bthe,bse->bths", qi, ki).clamp_min(0).mul(index_w.double()[:, None]).sum(2)
    vis = torch.as_tensor(_visible(n, m, causal, pad, B))  # (B, Nq, Nk)
    keep = torch.zeros(B, n, m, dtype=torch.bool)
    for b in range(B):
        for t in range(n):
            seen = vis[b, t].nonzero()[:, 0]
            order = torch.sort(scores[b, t, seen], descending=True, stable=True).indices
            keep[b, t, seen[order[:top_k]]] = True
    kr, vr = (x.double().repeat_interleave(H // k.shape[1], dim=1) for x in (k, v))
    logits = torch.einsum("bhid,bhjd->bhij", q.double(), kr) / D ** 0.5
    w = torch.softmax(logits.masked_fill(~keep[:, None], float("-inf")), dim=-1).nan_to_num(0.0)
    return torch.einsum("bhij,bhjd->bhid", w, vr)


def nsa_reference(q, k, v, g_cmp, g_slc, g_win, *, block: int, stride: int, select_block: int, select_blocks: int,
                  window: int) -> torch.Tensor:
    """Native Sparse Attention (Yuan et al. 2025, arXiv 2502.11089) query by query in float64, each branch on its own:
    compression over means of `block` tokens every `stride` ending at or before t; selection of `select_blocks`
    blocks of `select_block` tokens, the first and t's own forced, the rest ranked by the compressed probabilities
    spread over their tokens and summed over the query heads that share a key/value head (ties: earlier block),
    softmax over their tokens ≤ t; a window t − window < j ≤ t; mixed by the gates."""
    B, H, n, D = q.shape
    Hk = k.shape[1]
    q, k, v = (t.double() for t in (q, k, v))
    out = torch.zeros(B, H, n, D, dtype=torch.float64)

    def attend(qt, keys, values):
        w = torch.exp(keys @ qt / D ** 0.5 - (keys @ qt / D ** 0.5).max())
        return (w / w.sum()) @ values

    starts = list(range(0, n - block + 1, stride))
    for b in range(B):
        for kh in range(Hk):
            heads = [h for h in range(H) if h * Hk // H == kh]
            kc = [k[b, kh, a:a + block].mean(0) for a in starts]
            vc = [v[b, kh, a:a + block].mean(0) for a in starts]
            for t in range(n):
                seen = [i for i, a in enumerate(starts) if a + block - 1 <= t]
                density = torch.zeros(n, dtype=torch.float64)
                cmp = {}
                for h in heads:
                    if seen:
                        logits = torch.stack([kc[i] @ q[b, h, t] for i in seen]) / D ** 0.5
                        p = torch.exp(logits - logits.max())
                        p = p / p.sum()
                        cmp[h] = sum(p[j] * vc[i] for j, i in enumerate(seen))
                        for j, i in enumerate(seen):
                            density[starts[i]:starts[i] + block] += p[j] / block
                    else:
                        cmp[h] = torch.zeros(D, dtype=torch.float64)
                past = list(range(t // select_block + 1))
                score = {j: float(density[j * select_block:(j + 1) * select_block].sum().detach()) for j in past}
                forced = [0] + ([t // select_block] if t // select_block else [])
                rest = sorted((j for j in past if j not in forced), key=lambda j: (-score[j], j))
                chosen = (forced + rest)[:select_blocks]
                tokens = sorted(i for j in chosen for i in range(j * select_block, (j + 1) * select_block) if i <= t)
                win = list(range(max(0, t - window + 1), t + 1))
                for h in heads:
                    slc = attend(q[b, h, t], k[b, kh, tokens], v[b, kh, tokens])
                    sw = attend(q[b, h, t], k[b, kh, win], v[b, kh, win])
                    out[b, h, t] = g_cmp[b, h, t] * cmp[h] + g_slc[b, h, t] * slc + g_win[b, h, t] * sw
    return out


def topk_cells(q: torch.Tensor, k: torch.Tensor, causal: bool, top_k: int, index_q: torch.Tensor,
               index_k: torch.Tensor, index_w: torch.Tensor) -> np.ndarray:
    """The keys each query of batch element 0 keeps (Nq, Nk), brute force in float64: the indexer's score of every
    pair written as a sum over its heads, each query's visible keys ranked by (score descending, position), the first
    top_k kept."""
    n, m = q.shape[2], k.shape[2]
    qm, km = q[0].double().mean(0), k[0].double().mean(0)  # (n, D), (m, D): the mean query and key over heads
    heads = index_w.shape[0]
    wq = index_q.double().view(q.shape[-1], heads, -1)
    kept = np.zeros((n, m), dtype=bool)
    for t in range(n):
        seen = [s for s in range(m) if not causal or s <= t]
        score = {s: sum(float(index_w[j]) * max(0.0, float((qm[t] @ wq[:, j]) @ (km[s] @ index_k.double())))
                        for j in range(heads)) for s in seen}
        for s in sorted(seen, key=lambda s: (-score[s], s))[:top_k]:
            kept[t, s] = True
    return kept


def nsa_cells(q: torch.Tensor, k: torch.Tensor, *, block: int, stride: int, select_block: int, select_blocks: int,
              window: int) -> np.ndarray:
    """What each query head of batch element 0 reads in NSA, (H, n, n + m) brute force in float64: its group's
    selected blocks (first and own forced, the rest ranked by the compressed probabilities of the group's heads spread
    over the tokens each compressed block pools, ties to the earlier block), their tokens ≤ t, the window
    t − window < j ≤ t, then the m compressed blocks ending at or before t."""
    H, n, D = q.shape[1:]
    Hk = k.shape[1]
    starts = list(range(0, n - block + 1, stride))
    cells = np.zeros((H, n, n + len(starts)), dtype=bool)
    for kh in range(Hk):
        heads = [h for h in range(H) if h * Hk // H == kh]
        kc = [k[0, kh, a:a + block].double().mean(0) for a in starts]
        for t in range(n):
            seen = [i for i, a in enumerate(starts) if a + block - 1 <= t]
            density = [0.0] * n
            for h in heads:
                if seen:
                    p = torch.softmax(torch.stack([kc[i] @ q[0, h, t].double() for i in seen]) / D ** 0.5, 0)
                    for j, i in enumerate(seen):
                        for x in range(starts[i], starts[i] + block):
                            density[x] += float(p[j]) / block
            past = list(range(t // select_block + 1))
            score = {j: sum(density[j * select_block:(j + 1) * select_block]) for j in past}
            forced = [0] + ([t // select_block] if t // select_block else [])
            chosen = (forced + sorted((j for j in past if j not in forced), key=lambda j: (-score[j], j)))
            for h in heads:
                for j in chosen[:select_blocks]:
                    cells[h, t, j * select_block:min(t + 1, (j + 1) * select_block)] = True
                cells[h, t, max(0, t - window + 1):t + 1] = True
                for i in seen:
                    cells[h, t, n + i] = True
    return cells


def kda_reference(q, k, v, alpha, beta, pad=None) -> torch.Tensor:
    """KDA as the paper writes it, in float64, one head and one token at a time, the state as d_v × d_k:
    S_t = S_{t−1} Diag(α_t) (I − β_t k̂_t k̂_tᵀ) + β_t v_t k̂_tᵀ, o_t = S_t q̂_t, k̂ = k/max(‖k‖, 10⁻⁶),
    q̂ = q/(max(‖q‖, 10⁻⁶)·√D). Query head i reads key/value head ⌊i·Hk/H⌋ and its gates; a padded token is skipped."""
    B, H, n, D = q.shape
    q, k, v, alpha, beta = (t.double() for t in (q, k, v, alpha, beta))
    out = torch.zeros(B, H, n, D, dtype=torch.float64)
    eye = torch.eye(D, dtype=torch.float64)
    for b in range(B):
        for h in range(H):
            j = h * k.shape[1] // H
            S = torch.zeros(D, D, dtype=torch.float64)
            for t in range(n):
                if pad is None or not pad[b, t]:
                    kt = k[b, j, t] / k[b, j, t].norm().clamp_min(1e-6)
                    S = S @ torch.diag(alpha[b, j, t]) @ (eye - beta[b, j, t] * torch.outer(kt, kt)) \
                        + beta[b, j, t] * torch.outer(v[b, j, t], kt)
                out[b, h, t] = S @ (q[b, h, t] / q[b, h, t].norm().clamp_min(1e-6) / math.sqrt(D))
    return out


def sink_softmax(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, sinks: torch.Tensor, mask: np.ndarray | None = None,
                 pad: torch.Tensor | None = None) -> torch.Tensor:
    """Attention with sinks as gpt-oss describes them (arXiv 2508.10925): one more column in each row's softmax whose
    score is the head's sink logit and whose value is zero. float64, explicit exp and normalisation; k, v of Hk heads
    repeated for their H/Hk query heads; `mask` (nq, nk) True = attend, `pad` (B, nk) True = padding. Keeps the
    graph, so gradients to q, k, v and sinks flow."""
    B, H, nq, D = q.shape
    r = H // k.shape[1]
    k64, v64 = (t.double().repeat_interleave(r, dim=1) for t in (k, v))
    logits = torch.einsum("bhid,bhjd->bhij", q.double(), k64) / math.sqrt(D)
    hidden = torch.zeros(logits.shape, dtype=torch.bool)
    if mask is not None:
        hidden |= ~torch.as_tensor(mask)
    if pad is not None:
        hidden |= pad[:, None, None, :]
    logits = logits.masked_fill(hidden, float("-inf"))
    sink = sinks.double().view(1, H, 1, 1).expand(B, H, nq, 1)
    every = torch.cat([logits, sink], dim=-1)  # the sink is the last column
    w = torch.exp(every - every.amax(-1, keepdim=True))
    w = w / w.sum(-1, keepdim=True)
    values = torch.cat([v64, torch.zeros(B, H, 1, D, dtype=torch.float64)], dim=-2)  # ... with a zero value
    return torch.einsum("bhij,bhjd->bhid", w, values)
