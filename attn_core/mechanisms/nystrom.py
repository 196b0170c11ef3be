"""Nyströmformer: softmax attention rebuilt from m landmark rows and columns (Xiong et al. 2021, arXiv 2102.03902)."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

from ..spec import Cost, Insight, MechanismSpec, Param, Shape, Supports
from ._banded import floor, padding_bias
from ._common import HALF, check_key_padding, checked_shape, fold, repeated, scale, unfold
# Scores held at once per chunk of keys or of query rows, in elements over all batch·heads (4 MiB in float32: a
# chunk stays in cache; whole (n, m) scores at n = 32768 ran at half the speed per element).
CHUNK_ELEMS = 1 << 20


def segment_means(x: torch.Tensor, m: int) -> torch.Tensor:
    """The m landmarks of x (B, H, N, D) → (B, H, m, D): means of m consecutive segments that cover the sequence.

    N = m·L + r: the first r segments hold L + 1 tokens, the other m − r hold L (NumPy's array_split), so every
    landmark is the mean of real tokens and none of padding. Two reshaped views and a sum each; no copy of x. In
    float16 a segment whose sum passes 65504 overflows (inputs near 100 in segments of 1000 tokens): more landmarks.
    """
    L, r = divmod(x.shape[-2], m)
    cut = r * (L + 1)
    # sum, then divide: mean() of a half-precision view copies it to float32 first (n·D·4 bytes)
    head = x[:, :, :cut].unflatten(2, (r, L + 1)).sum(-2).div_(L + 1)  # (B, H, r, D)
    tail = x[:, :, cut:].unflatten(2, (m - r, L)).sum(-2).div_(L)  # (B, H, m − r, D)
    return torch.cat([head, tail], dim=2)


def real_segment_means(x: torch.Tensor, keep: torch.Tensor, m: int) -> torch.Tensor:
    """The m landmarks of each batch element's real tokens: x (B, H, N, D), keep (B, N) True where a token is real
    → (B, H, m, D), the means of m consecutive segments of the real tokens in order, split as `segment_means` splits
    a whole sequence (the first L mod m segments one token longer), as if the padding were not there; with L < m
    the last m − L segments hold none (their means 0). Each token summed into its segment (index_add_): O(N·D), one
    (B, H, m + 1, D) sum."""
    L = keep.sum(-1, keepdim=True)  # (B, 1)
    size, rem = L // m, L % m
    rank = keep.cumsum(-1) - 1  # each real token's place among its element's real tokens
    big = rem * (size + 1)  # tokens in the longer segments
    seg = torch.where(rank < big, rank // (size + 1), rem + (rank - big) // size.clamp_min(1))
    seg = torch.where(keep, seg, m)  # padding: a segment of its own, dropped
    sums = x.new_zeros(x.shape[0], x.shape[1], m + 1, x.shape[-1])
    for b in range(x.shape[0]):
        sums[b].index_add_(1, seg[b], x[b])
    counts = torch.where(torch.arange(m, device=x.device) < rem, size + 1, size)  # (B, m)
    return sums[:, :, :m].div_(counts[:, None, :, None].clamp_min(1).to(x.dtype))


def iterative_pinv(a: torch.Tensor, iterations: int) -> torch.Tensor:
    """Moore–Penrose pseudo-inverse of each (m, m) matrix in a (…, m, m), by the iteration of Razavi et al. 2014
    that Nyströmformer uses (Xiong et al. 2021, section 3): Z ← ¼ Z (13I − AZ (15I − AZ (7I − AZ))), from
    Z₀ = Aᵀ / (‖A‖₁ ‖A‖∞), the norms per matrix (‖A‖₁: largest column sum of |A|, ‖A‖∞: largest row sum; the
    peer nystrom-attention takes both maxima over all heads at once). O(iterations · m³) time; five (…, m, m)
    tensors at once (A, Z, AZ and two factors), each cI − X·Y one fused product. On a (numerically) singular A,
    steps past convergence multiply the rounding in its null space by 13/4 each: more is not better.
    """
    shape, m = a.shape, a.shape[-1]
    a = a.reshape(-1, m, m)
    norms = a.abs().sum(-2).amax(-1) * a.abs().sum(-1).amax(-1)  # (batch,)
    z = a.transpose(-2, -1) / norms[:, None, None]
    i7, i15, i13 = (c * torch.eye(m, dtype=a.dtype, device=a.device) for c in (7, 15, 13))
    for _ in range(iterations):
        az = torch.bmm(a, z)
        t = torch.baddbmm(i15, az, i7 - az, alpha=-1)  # 15I − AZ(7I − AZ)
        t = torch.baddbmm(i13, az, t, alpha=-1)
        z = torch.baddbmm(z, z, t, beta=0, alpha=0.25)  # ¼ Z t (z as the ignored input: beta = 0)
        del az, t  # before the next step makes its own
    return z.view(shape)


def _landmarks(q, k, landmarks: int, keep: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """The landmarks scaled by 1/√D, Q̃/√D (B, H, m, D) and K̃/√D (B, Hk, m, D: once per key/value head), so that
    every score below is one product.
    `keep` (B, Nk), True where a key is real: K̃ of the real keys (`real_segment_means`), and Q̃ of the real
    positions too when the queries are those same tokens (Nq = Nk, self-attention)."""
    s = scale(q.shape[-1])
    if keep is None:
        return segment_means(q, landmarks).mul_(s), segment_means(k, landmarks).mul_(s)
    q_l = (real_segment_means(q, keep, landmarks) if q.shape[-2] == k.shape[-2] else
           segment_means(q, landmarks))
    return q_l.mul_(s), real_segment_means(k, keep, landmarks).mul_(s)


def _landmark_pinv(q_l, k_l, pinv_iterations: int, hollow: torch.Tensor | None = None,
                   hollow_q: torch.Tensor | None = None) -> torch.Tensor:
    """pinv(softmax(Q̃K̃ᵀ/√D)) (B, H, m, m) from the scaled landmarks, Q̃ (B, H, m, D) and K̃ (B, Hk, m, D) (a group's
    query landmarks as rows of one product, `fold`); in float32 for half-precision inputs.
    `hollow`, `hollow_q` (B, m): key and query landmarks that average no token (a sequence shorter than m): their
    columns and rows of the kernel are 0, so the pseudo-inverse's rows and columns for them are 0 too, and the
    result is Nyström with the landmarks that exist."""
    work = torch.float32 if q_l.dtype in HALF else q_l.dtype
    B, H, m, D = q_l.shape
    s = (fold(q_l.to(work), k_l.shape[1]) @ k_l.to(work).transpose(-2, -1)).view(B, H, m, m).mul_(1 / scale(D))
    if hollow is None:
        return iterative_pinv(torch.softmax(s, dim=-1), pinv_iterations)
    a = torch.softmax(s.masked_fill_(hollow[:, None, None, :], floor(work)), dim=-1)
    a = a.masked_fill(hollow[:, None, None, :], 0.0)  # not in place: softmax's backward reads its output
    if hollow_q is not None:
        a = a.masked_fill_(hollow_q[:, None, :, None], 0.0)
    return iterative_pinv(a, pinv_iterations)


def _chunk(heads: int, landmarks: int) -> int:
    """Tokens per chunk: as many as keep a chunk's scores, heads·chunk·landmarks, within CHUNK_ELEMS."""
    return max(1, CHUNK_ELEMS // (heads * landmarks))


def _landmark_values(q_l, k, v, pad: torch.Tensor | None = None) -> torch.Tensor:
    """softmax(Q̃ Kᵀ/√D) V (B, H, m, D) from the scaled landmarks Q̃ (B, H, m, D) and k, v (B, Hk, Nk, D), over chunks
    of keys with a running maximum (the online softmax: earlier chunks' sums rescaled by exp(old max − new max)), so
    only a chunk's (m, chunk) scores exist; the query landmarks of a group are rows of one problem (`fold`), each
    key/value head read in place. Sums in float32 for half inputs. `pad` (B, 1, 1, Nk): a key bias, far below any
    score where the key is padding (finite: a chunk of padding alone gives exp(bias − max) = 0, never NaN)."""
    B, H, m, _ = q_l.shape
    n, step = k.shape[-2], _chunk(B * H, m)
    work = torch.float32 if v.dtype in HALF else v.dtype
    q_l = fold(q_l, k.shape[1])  # (B, Hk, (H/Hk)·m, D)
    for start in range(0, n, step):
        s = q_l @ k[:, :, start:start + step].transpose(-2, -1)  # (B, Hk, (H/Hk)·m, chunk)
        if pad is not None:
            s = s.add_(pad[..., start:start + step])
        top = s.detach().amax(-1, keepdim=True)  # a shift: the result does not depend on it, nor its gradient
        if start == 0:
            high = top
            acc, total = (torch.zeros(*q_l.shape[:3], size, dtype=work, device=v.device) for size in (v.shape[-1], 1))
        else:  # rescale what the earlier chunks summed to the new maximum
            new = torch.maximum(high, top)
            fix = (high - new).exp_()
            high = new
            acc, total = acc.mul_(fix), total.mul_(fix)
        e = (s - high).exp_()  # s itself is left alone for autograd
        del s
        total += e.sum(-1, keepdim=True)  # summed in e's dtype: a float32 sum of half e copies it to float32 first
        acc += e @ v[:, :, start:start + step]
        del e
    return unfold(acc.div_(total), H)


def _query_rows(q, k_l, w, hollow: torch.Tensor | None = None) -> torch.Tensor:
    """softmax(Q K̃ᵀ/√D) W (B, H, Nq, D) over chunks of query rows, so only a chunk's (chunk, m) scores exist; K̃ and W
    (B, H, m, D), one per query head; `hollow` (B, 1, 1, m): a bias that gives key landmarks averaging no token no
    weight."""
    B, H, nq, _ = q.shape
    out = q.new_empty(B, H, nq, w.shape[-1])
    step = _chunk(B * H, k_l.shape[-2])
    for start in range(0, nq, step):
        s = q[:, :, start:start + step] @ k_l.transpose(-2, -1)  # (B, H, chunk, m)
        p = torch.softmax(s if hollow is None else s.add_(hollow), dim=-1)
        del s
        out[:, :, start:start + step] = p @ w
        del p
    return out


def nystrom_attention(q, k, v, *, causal: bool = False, landmarks: int = 64, pinv_iterations: int = 6,
                      key_padding_mask: torch.Tensor | None = None):
    """softmax(Q K̃ᵀ/√D) · pinv(softmax(Q̃ K̃ᵀ/√D)) · (softmax(Q̃ Kᵀ/√D) · V), Q̃ and K̃ the m = `landmarks` segment
    means of q and k (`segment_means`), pinv by `pinv_iterations` steps of `iterative_pinv`.

    q (B, H, Nq, D), k, v (B, Hk, Nk, D) → (B, H, Nq, D); m ≤ Nq and m ≤ Nk. Hk < H (grouped-query attention): K̃
    is taken once per key/value head and k, v are read in place (the query landmarks of a group as rows of one
    product); the products with Q̃ and Q stay per query head, as does W, so K̃ (m·D) is repeated for the last stage:
    the work of multi-head attention, less memory. Evaluated right to left, the (m, Nk) and (Nq, m) softmaxes in
    chunks of keys and of query rows (`_landmark_values`, `_query_rows`), each chunk's scores at most CHUNK_ELEMS:
    O(n·m·D + m³) time, O(n·D + m² + CHUNK_ELEMS) memory, no n×n (nor n×m) tensor. With m = n the landmarks are the
    tokens and the result is softmax attention, up to the pseudo-inverse's accuracy. Not causal: each landmark
    averages a whole segment, future tokens included. Half-precision inputs: the (m, m) kernel, its pseudo-inverse,
    the sums over keys and W in float32, the products over n in the input dtype. `key_padding_mask` (B, Nk) boolean,
    True where the key is padding: Nyström over each element's real keys, as if the padding were not there: K̃ the
    segment means of its real keys (and Q̃ of its real positions in self-attention, Nq = Nk), padded keys left out
    of softmax(Q̃ Kᵀ); a sequence of L < m real tokens has m − L landmarks that average none, left out (Nyström with
    L landmarks: softmax over its tokens); one with none outputs zeros.
    """
    checked_shape(SPEC, q, k, v, causal, landmarks=landmarks, pinv_iterations=pinv_iterations)
    keep = pad = empty = hollow = hollow_q = None
    if key_padding_mask is not None:
        check_key_padding(SPEC, key_padding_mask, q, k)
        keep = ~key_padding_mask
        empty = ~keep.any(-1)  # no real key: computed as unpadded, then zeroed
        keep = keep | empty[:, None]
        pad = padding_bias(~keep, q.dtype).transpose(-2, -1)  # (B, 1, 1, Nk)
        if bool((keep.sum(-1) < landmarks).any()):  # a sequence of L < m real tokens: m − L landmarks hold none
            hollow = torch.arange(landmarks, device=q.device) >= keep.sum(-1, keepdim=True)  # (B, m)
            hollow_q = hollow if q.shape[-2] == k.shape[-2] else None
    q_l, k_l = _landmarks(q, k, landmarks, keep)
    kv = _landmark_values(q_l, k, v, pad)  # (B, H, m, D)
    z = _landmark_pinv(q_l, k_l, pinv_iterations, hollow, hollow_q)  # (B, H, m, m)
    del q_l
    w = (z @ kv.to(z.dtype)).to(q.dtype)  # (B, H, m, D)
    del z, kv
    (k_l,) = repeated(q, k_l)  # (B, H, m, D), for the query heads' own W: m·D a head, never n
    out = _query_rows(q, k_l, w, None if hollow is None else padding_bias(hollow, q.dtype).transpose(-2, -1))
    return out if empty is None else out.masked_fill_(empty[:, None, None, None], 0.0)


def _effective(q, k, v, causal: bool, state: dict, landmarks: int = 64, pinv_iterations: int = 6):
    """softmax(Q K̃ᵀ/√D) · pinv(…) · softmax(Q̃ Kᵀ/√D), (B, H, Nq, Nk), applied to v. Not a distribution: rows sum to 1
    only as far as the pseudo-inverse is exact, and entries can be negative. Shared heads repeated: a dense picture."""
    k, v = repeated(q, k, v)
    q_l, k_l = _landmarks(q, k, landmarks)
    z = _landmark_pinv(q_l, k_l, pinv_iterations)
    left = torch.softmax(q @ k_l.transpose(-2, -1), dim=-1)
    right = torch.softmax(q_l @ k.transpose(-2, -1), dim=-1)
    return left @ z.to(q.dtype) @ right, v


@dataclass(frozen=True)
class _Landmarks(Param):
    """The landmark count: at most the keys (Param's `at_most`) and at most the queries too (cross-attention)."""

    def check(self, value: Any, shape: Shape | None = None) -> None:
        super().check(value, shape)
        if shape is not None and value > shape.Nq:
            raise ValueError(f"{self.name} = {value} is more than the {shape.Nq} queries; choose {self.name} ≤ "
                             f"{shape.Nq} (each landmark averages a segment of queries and one of keys)")


def _flops(s: Shape, landmarks: int = 64, pinv_iterations: int = 6) -> float:
    """Every product involves Q̃ or Q, so all are per query head: shared key/value heads save none of them."""
    m = landmarks
    big = 4.0 * s.Nk * m * s.D + 4.0 * s.Nq * m * s.D  # softmax(Q̃Kᵀ)·V and softmax(QK̃ᵀ)·W, 2·D per cell each
    small = 2.0 * m * m * s.D * 2 + 8.0 * pinv_iterations * m ** 3  # Q̃K̃ᵀ, pinv·(…V); 4 products per step
    return s.bh * (big + small)


def _memory(s: Shape, landmarks: int = 64, pinv_iterations: int = 6) -> float:
    """Peak bytes above the inputs: the largest of the stages, in the order the kernel runs them (elements per query
    head, B·H; Q̃ per query head and K̃ per key/value head alive in the first three, K̃ repeated and W in the last;
    c₁ keys and c₂ query rows a chunk)."""
    m, e, nq, nk, d, heads = landmarks, s.elem, s.Nq, s.Nk, s.D, s.bh
    w = 4 if e < 4 else e  # sums over keys, the landmark kernel and its pseudo-inverse in float32 for half inputs
    c1, c2 = (min(_chunk(heads, m), n) for n in (nk, nq))
    landmarks_held = (heads + s.bk) * m * d  # Q̃ and K̃, in elements
    copies = landmarks_held * w if e < 4 else 0  # Q̃ and K̃ in float32
    stages = (heads * (m * d * w + 4 * m * w + max(2 * m * c1 * e, m * c1 * e + m * d * e)),  # a chunk of keys:
              # scores, their exponentials, then their product with V, beside the running sum, maximum and rescaling
              heads * (m * d * w + 2 * m * m * w) + copies,  # softmax(Q̃Kᵀ)·V; the landmark scores and their softmax
              heads * (m * d * w + 5 * m * m * w) + 3 * m * m * w)  # A, Z, AZ and two factors of one step of the
    # pseudo-inverse, and 7I, 15I, 13I (one each, not per head)
    last = heads * (nq * d * e + max(2 * c2 * m * e, c2 * m * e + c2 * d * e))  # the output; a chunk of rows:
    # scores, softmax, then its product with W (K̃'s repeat for W comes before, at most 3·m·D a head: less)
    return max(landmarks_held * e + max(stages), 2 * heads * m * d * e + last)


SPEC = MechanismSpec(
    label="Nyströmformer",
    fn=nystrom_attention,
    description="Rebuilds the n×n softmax matrix from m landmark (segment-mean) queries and keys and the "
                "pseudo-inverse of their m×m kernel: linear in n, approximate.",
    paper="Xiong et al. 2021, 'Nyströmformer: A Nyström-Based Algorithm for Approximating Self-Attention', "
          "arXiv 2102.03902",
    params=(_Landmarks("landmarks", 64, 1, 1 << 16, "Landmarks m: segment means of queries and keys (≤ n); more is "
                       "closer to softmax and slower.", log=True, at_most="Nk", small=lambda n: max(1, n // 4),
                       tokens=True),
            Param("pinv_iterations", 6, 1, 100, "Steps of the iterative pseudo-inverse of the m×m landmark kernel (the "
                  "paper uses 6); past convergence, a nearly singular kernel makes more steps worse.")),
    exact=False,
    cost=Cost(flops=_flops, memory_bytes=_memory, time_big_o="O(n·m·d)", memory_big_o="O(n·d + m²)"),
    supports=Supports(
        causal=False,
        cross=True,
        padding=True,
        shared_kv=True,
        no_generation="Its landmarks are means over segments of the whole sequence, later tokens included, so it has "
                      "no causal form, and a new token would move every landmark.",
    ),
    insight=Insight(
        effective=_effective,
        regime=("local", "gaussian", "A landmark is the mean of a segment of tokens: where nearby tokens are alike "
                "(slowly varying inputs) it stands for them and F·A⁺·B rebuilds softmax closely, the error falling as "
                "m grows; the means of unrelated tokens shrink towards zero and keep nothing of what sets each token "
                "apart, so m landmarks cannot rebuild a softmax that differs from token to token: the Nyström method "
                "presumes a softmax matrix close to rank m (Xiong et al. 2021, arXiv 2102.03902)."),
        accuracy_note="Nyströmformer's effective weights F·A⁺·B are not a distribution: the pseudo-inverse has "
                      "negative entries, and rows sum to 1 only as far as the iteration has converged. Its KL is "
                      "undefined (NaN) where a weight is negative; the output errors compare it with softmax.",
    ),
)
