"""Nyströmformer: softmax attention rebuilt from m landmark rows and columns (Xiong et al. 2021, arXiv 2102.03902)."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

from ..spec import MechanismSpec, Param, Shape
from ._common import checked_shape, scale

HALF = (torch.float16, torch.bfloat16)


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


def iterative_pinv(a: torch.Tensor, iterations: int) -> torch.Tensor:
    """Moore–Penrose pseudo-inverse of each (m, m) matrix in a (…, m, m), by the iteration of Razavi et al. 2014
    that Nyströmformer uses (Xiong et al. 2021, section 3): Z ← ¼ Z (13I − AZ (15I − AZ (7I − AZ))), from
    Z₀ = Aᵀ / (‖A‖₁ ‖A‖∞), the norms per matrix (‖A‖₁: largest column sum of |A|, ‖A‖∞: largest row sum; the
    peer nystrom-attention takes both maxima over all heads at once). O(iterations · m³) time;
    five (…, m, m) tensors at once (A, Z, AZ and two factors), the cI − X steps in place. On a (numerically)
    singular A, steps past convergence multiply the rounding in its null space by 13/4 each: more is not better.
    """
    norms = a.abs().sum(-2).amax(-1) * a.abs().sum(-1).amax(-1)  # (…)
    z = a.transpose(-2, -1) / norms[..., None, None]
    for _ in range(iterations):
        az = a @ z
        t = _identity_minus(az.clone(), 7)
        t = _identity_minus(az @ t, 15)
        t = _identity_minus(az @ t, 13)
        z = (z @ t).mul_(0.25)
    return z


def _identity_minus(x: torch.Tensor, c: float) -> torch.Tensor:
    """c·I − x, overwriting x (…, m, m)."""
    x.neg_().diagonal(dim1=-2, dim2=-1).add_(c)
    return x


def _landmarks(q, k, landmarks: int) -> tuple[torch.Tensor, torch.Tensor]:
    """The landmarks scaled by 1/√D, Q̃/√D and K̃/√D (B, H, m, D), so that every score below is one product."""
    s = scale(q.shape[-1])
    return segment_means(q, landmarks).mul_(s), segment_means(k, landmarks).mul_(s)


def _landmark_pinv(q_l, k_l, pinv_iterations: int) -> torch.Tensor:
    """pinv(softmax(Q̃K̃ᵀ/√D)) (B, H, m, m) from the scaled landmarks; in float32 for half-precision inputs."""
    work = torch.float32 if q_l.dtype in HALF else q_l.dtype
    a = torch.softmax((q_l.to(work) @ k_l.to(work).transpose(-2, -1)).mul_(1 / scale(q_l.shape[-1])), dim=-1)
    return iterative_pinv(a, pinv_iterations)


def nystrom_attention(q, k, v, *, causal: bool = False, landmarks: int = 64, pinv_iterations: int = 6):
    """softmax(Q K̃ᵀ/√D) · pinv(softmax(Q̃ K̃ᵀ/√D)) · (softmax(Q̃ Kᵀ/√D) · V), Q̃ and K̃ the m = `landmarks` segment
    means of q and k (`segment_means`), pinv by `pinv_iterations` steps of `iterative_pinv`.

    q (B, H, Nq, D), k, v (B, H, Nk, D) → (B, H, Nq, D); m ≤ Nq and m ≤ Nk. Evaluated right to left, so the largest
    tensors are (m, Nk) and (Nq, m): O(n·m·D + m³) time, O(n·m) memory, no n×n tensor. With m = n the landmarks are
    the tokens and the result is softmax attention, up to the pseudo-inverse's accuracy. Not causal: each landmark
    averages a whole segment, future tokens included. Half-precision inputs: the (m, m) kernel, its pseudo-inverse
    and their product with softmax(Q̃ Kᵀ/√D)·V in float32, the (n, m) products in the input dtype.
    """
    checked_shape(SPEC, q, k, v, causal, landmarks=landmarks, pinv_iterations=pinv_iterations)
    q_l, k_l = _landmarks(q, k, landmarks)
    kernel = torch.softmax(q_l @ k.transpose(-2, -1), dim=-1)  # (B, H, m, Nk)
    kv = kernel @ v  # (B, H, m, D)
    del kernel
    z = _landmark_pinv(q_l, k_l, pinv_iterations)  # (B, H, m, m)
    del q_l
    w = (z @ kv.to(z.dtype)).to(q.dtype)  # (B, H, m, D)
    del z, kv
    kernel = torch.softmax(q @ k_l.transpose(-2, -1), dim=-1)  # (B, H, Nq, m)
    del k_l
    return kernel @ w


def _effective(q, k, v, causal: bool, state: dict, landmarks: int = 64, pinv_iterations: int = 6):
    """softmax(Q K̃ᵀ/√D) · pinv(…) · softmax(Q̃ Kᵀ/√D), (B, H, Nq, Nk), applied to v. Not a distribution: rows sum to 1
    only as far as the pseudo-inverse is exact, and entries can be negative."""
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
    m = landmarks
    big = 4.0 * s.Nk * m * s.D + 4.0 * s.Nq * m * s.D  # softmax(Q̃Kᵀ)·V and softmax(QK̃ᵀ)·W, 2·D per cell each
    small = 2.0 * m * m * s.D * 2 + 8.0 * pinv_iterations * m ** 3  # Q̃K̃ᵀ, pinv·(…V); 4 products per step
    return s.bh * (big + small)


def _memory(s: Shape, landmarks: int = 64, pinv_iterations: int = 6) -> float:
    """Peak bytes above the inputs: the largest of the stages, in the order the kernel runs them (elements per head;
    Q̃ and K̃, or later K̃ and W, are alive throughout)."""
    m, e, nq, nk, d = landmarks, s.elem, s.Nq, s.Nk, s.D
    w = 4 if e < 4 else e  # the landmark kernel and its pseudo-inverse run in float32 for half inputs
    copies = 2 * m * d * w if e < 4 else 0  # Q̃ and K̃ in float32
    stages = (2 * m * nk * e,  # scores Q̃Kᵀ and their softmax
              m * d * e + copies + 2 * m * m * w,  # softmax(Q̃Kᵀ)·V; the landmark scores and their softmax A
              m * d * e + 5 * m * m * w,  # A, Z, AZ and two factors of one step of the pseudo-inverse
              2 * m * nq * e,  # scores QK̃ᵀ and their softmax
              m * nq * e + nq * d * e - m * d * e)  # that softmax and the output (K̃ freed)
    return s.bh * (2 * m * d * e + max(stages))


SPEC = MechanismSpec(
    key="nystrom",
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
    supports_causal=False,
    supports_cross=True,
    time_big_o="O(n·m·d)",
    memory_big_o="O(n·m)",
    flops=_flops,
    memory_bytes=_memory,
    effective=_effective,
    regime=("local", "gaussian", "A landmark is the mean of a segment of tokens: where nearby tokens are alike (slowly "
            "varying inputs) it stands for them and F·A⁺·B rebuilds softmax closely, the error falling as m grows; "
            "the means of unrelated tokens shrink towards zero and keep nothing of what sets each token apart, so "
            "m landmarks cannot rebuild a softmax that differs from token to token: the Nyström method presumes a "
            "softmax matrix close to rank m (Xiong et al. 2021, arXiv 2102.03902)."),
    accuracy_note="Nyströmformer's effective weights F·A⁺·B are not a distribution: the pseudo-inverse has negative "
                  "entries, and rows sum to 1 only as far as the iteration has converged. Its KL is undefined (NaN) "
                  "where a weight is negative; the output errors compare it with softmax.",
    no_generation="Its landmarks are means over segments of the whole sequence, later tokens included, so it has "
                  "no causal form, and a new token would move every landmark.",
    no_padding="its landmarks are segment means over the whole sequence; a padded key would need segments of the "
               "real keys alone, which this kernel does not build yet",
)
