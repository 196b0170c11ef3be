"""Linformer: keys and values projected along the sequence to a fixed rank (Wang et al. 2020, arXiv 2006.04768)."""
from __future__ import annotations

import math

import torch

from ..spec import Cost, Insight, MechanismSpec, Param, Shape, State, Supports
from ._common import check_key_padding, checked_shape, fold, repeated, scale, unfold


def init_state(shape: Shape, device=None, dtype=torch.float32, *, seed: int = 0, rank: int = 256) -> dict:
    """Seeded projections {'E': (rank, Nk), 'F': (rank, Nk)} with N(0, 1/rank) entries (Johnson–Lindenstrauss).
    `rank` is checked against the spec first: within its range and ≤ Nk, before anything is allocated."""
    SPEC.check_params({"rank": rank}, shape)
    g = torch.Generator().manual_seed(seed)
    e, f = (torch.randn(rank, shape.Nk, generator=g) / math.sqrt(rank) for _ in range(2))
    return {"E": e.to(device=device, dtype=dtype), "F": f.to(device=device, dtype=dtype)}


def linformer_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, *, causal: bool = False, rank: int = 256,
                        E: torch.Tensor | None = None, F: torch.Tensor | None = None, seed: int = 0,
                        key_padding_mask: torch.Tensor | None = None) -> torch.Tensor:
    """softmax(Q (E K)ᵀ/√D) (F V): attention over `rank` projected keys instead of Nk.

    q (B, H, Nq, D), k, v (B, Hk, Nk, D), E and F (rank, Nk), shared by batch and heads → (B, H, Nq, D). Hk < H
    (grouped-query attention): each key/value head is projected once, and the H/Hk query heads sharing it attend to
    its rank projected keys as rows of one product (`fold`): less work than multi-head attention, no key repeated.
    Projections absent are drawn here from `seed` (pass them from `init_state` to time the kernel alone).
    Not causal: E mixes every position into every projected key. O(n·rank·d) time, O(n·rank) memory.
    `key_padding_mask` (B, Nk) boolean, True where the key is padding: the padded rows of K and V are zeroed before
    E and F project them, so padding adds nothing to any projected key or value and the result is Linformer on the
    unpadded keys with the columns of E and F for their positions. Masking inside the softmax cannot work here, as
    each projected key mixes all positions; zeroing first is the usual practice. A batch element with every key
    padded projects to zero keys and values and outputs zeros.
    """
    shape = checked_shape(SPEC, q, k, v, causal, rank=rank)
    if E is None or F is None:
        state = init_state(shape, q.device, q.dtype, seed=seed, rank=rank)
        E, F = state["E"] if E is None else E, state["F"] if F is None else F
    for name, p in (("E", E), ("F", F)):
        if p.shape != (rank, shape.Nk):
            raise ValueError(f"{name} must have shape (rank, Nk) = ({rank}, {shape.Nk}), got {tuple(p.shape)}")
    if key_padding_mask is not None:
        check_key_padding(SPEC, key_padding_mask, q, k)
        keep = ~key_padding_mask[:, None, :, None]
        k, v = k * keep, v * keep
    kp, vp = E @ k, F @ v  # (B, Hk, rank, D)
    # a group's queries as the rows of one problem, (B, Hk, (H/Hk)·Nq, D); each temporary freed once used
    weights = torch.softmax(fold(q * (1.0 / math.sqrt(shape.D)), shape.key_heads) @ kp.transpose(-2, -1), dim=-1)
    return unfold(weights @ vp, shape.H)


def _effective(q, k, v, causal: bool, state: dict, rank: int = 256) -> tuple[torch.Tensor, torch.Tensor]:
    """softmax(Q(EK)ᵀ/√D), (B, H, Nq, rank), applied to the projected values F·v (shared heads repeated: a dense
    picture)."""
    k, v = repeated(q, k, v)
    scores = (q * scale(q.shape[-1])) @ (state["E"] @ k).transpose(-2, -1)
    return torch.softmax(scores, dim=-1), state["F"] @ v


def _pull_back(weights: torch.Tensor, state: dict) -> torch.Tensor:
    """(Nq, rank) weights mapped onto the n keys: W·F, so that out = (W·F)·v. Rows sum to Σ_r W_ir·(Σ_j F_rj), not
    1, and entries may be negative: F mixes every position into each projected value."""
    return weights @ state["F"]


def _flops(s: Shape, rank: int = 256) -> float:
    """E·K and F·V per key/value head (2·rank·Nk·D each), scores and their product with F·V per query head."""
    return s.bk * 4.0 * rank * s.Nk * s.D + s.bh * 4.0 * s.Nq * rank * s.D


def _memory(s: Shape, rank: int = 256) -> float:
    # Projected K and V (rank, D) per key/value head held throughout, beside two of: scaled queries, scores,
    # probabilities, output (per query head).
    return (s.bk * 2 * rank * s.D + s.bh * (s.Nq * rank + s.Nq * max(s.D, rank))) * s.elem


SPEC = MechanismSpec(
    label="Linformer",
    fn=linformer_attention,
    description="Projects the n keys and values down to rank k rows, so attention is n×k instead of n×n.",
    paper="Wang et al. 2020, 'Linformer: Self-Attention with Linear Complexity', arXiv 2006.04768",
    params=(Param("rank", 256, 1, 1 << 16, "Projected length k of keys and values (≤ n).", log=True, at_most="Nk",
                  small=lambda n: max(1, n // 4), tokens=True),),
    exact=False,
    state=State(init=init_state, keys=("E", "F")),
    cost=Cost(flops=_flops, memory_bytes=_memory, time_big_o="O(n·k·d)", memory_big_o="O(n·k)"),
    supports=Supports(
        causal=False,
        cross=True,
        padding=True,
        shared_kv=True,
        no_generation="Its projections E and F mix every position of the sequence, later ones included, into each "
                      "projected key and value, so it has no causal form: no token's output can be computed before the "
                      "whole sequence is known, and generating one token at a time is impossible.",
    ),
    insight=Insight(
        effective=_effective,
        projected="rank",
        pull_back=_pull_back,
        accuracy_note="Linformer's projections E and F are random here, as at initialisation; the paper learns them. "
                      "These are the errors of an untrained Linformer.",
    ),
)
