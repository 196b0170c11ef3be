"""Positions in a measured call: RoPE turning q and k inside the timed call (Su et al. 2021, arXiv 2104.09864), or
ALiBi's score bias passed to it (Press et al. 2021, arXiv 2108.12409); what each refuses, and what each adds to the
spec's FLOPs and memory. Both are built once outside the timed call, as a model builds them once a forward pass and
shares them across its layers: RoPE's cos and sin tables, ALiBi's (H, Nq, Nk) bias."""
from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Callable

import torch

import attn_core.positional as positional  # encodings and RoPE scaling under the package's one name
from attn_core.positions import rope, scaling
from ..mechanisms import MEASURED
from ..spec import MechanismSpec, Shape

POSITIONS = ("none", "rope", "alibi")
NAMES = {"none": "no positions", "rope": "RoPE", "alibi": "ALiBi"}
METHOD = ("RoPE: the cos and sin tables are built once outside the timed call; q and k are turned inside it, the "
          "new token's at position n when generating (the cache holds the n keys turned at 0 … n − 1). ALiBi: the "
          "(heads, n, n) bias is built once outside the timed call and passed to it as score_bias, where the "
          "mechanism adds it to its scores.")


def field_problem(value: Any) -> str | None:
    """Why `value` cannot be a problem's positions (a sentence), or None."""
    if value in POSITIONS:
        return None
    return f"positions {value!r} is unknown; choose none, rope (rotary) or alibi (linear biases)"


def biased() -> list[str]:
    """The labels of the measured mechanisms whose spec takes an additive score bias (ALiBi's)."""
    return [spec.label for spec in MEASURED.values() if spec.supports.score_bias]


def spec_problem(spec: MechanismSpec, positions: str, *, head_dim: int, generating: bool) -> str | None:
    """Why mechanism `spec` cannot be measured with `positions` (a sentence saying what to change), or None."""
    if positions == "none":
        return None
    name = NAMES[positions]
    if spec.operands is not None:
        return (f"{spec.label} attends over its own operands, not q and k, and carries its own rotary key; set "
                "positions to none for it")
    if positions == "rope" and head_dim % 2:
        return (f"RoPE turns features in pairs, so the head dimension must be even; it is {head_dim} "
                "(d_model / heads): choose an even one, or positions none or alibi")
    if positions == "alibi" and not spec.supports.score_bias:
        why = f" {spec.supports.no_score_bias}" if spec.supports.no_score_bias else ""
        return (f"{spec.label} takes no additive score bias, so {name} cannot be added to it.{why} ALiBi needs a "
                f"mechanism whose spec takes one ({', '.join(biased())}); or choose RoPE or no positions")
    if positions == "alibi" and generating:
        return ("a generating step here takes no score bias: measure ALiBi in the forward modes, or choose RoPE or "
                "no positions")
    return None


def scaling_problem(positions: str, rope_scaling: Any, *, head_dim: int) -> str | None:
    """Why a measured call cannot take `rope_scaling` (a config's dict, or None) with `positions` at `head_dim` (a
    sentence saying what to change: an unknown rope_type, a missing or bad field, a rotary share that turns no whole
    pairs), or None."""
    if rope_scaling is None:
        return None
    if positions != "rope":
        return (f"rope_scaling scales RoPE's frequencies, so it needs positions rope, not {positions}; set rope or "
                "drop rope_scaling")
    if why := scaling.rope_scaling_problem(rope_scaling):
        return why
    try:
        scaling.rotary_dim(head_dim, rope_scaling)
    except ValueError as e:
        return str(e)
    return None


def note(spec: MechanismSpec, positions: str) -> str:
    """The sentence a page shows beside `spec` with `positions`: where RoPE loses its relative property; '' else."""
    if positions != "rope" or not spec.supports.no_rope_relative:
        return ""
    return (f"{spec.label} runs on RoPE-turned q and k, but loses RoPE's relative property (scores that depend on "
            f"i − j only): {spec.supports.no_rope_relative}")


def method_note(frame: Any) -> str:
    """What a results frame's positions were, for the page's "How this was measured": METHOD and the RoPE notes of
    its mechanisms; '' when it has none."""
    used = [p for p in POSITIONS[1:] if "positions" in frame and (frame["positions"] == p).any()]
    if not used:
        return ""
    notes = [note(MEASURED[key], "rope") for key in dict.fromkeys(frame["mechanism"]) if key in MEASURED]
    return " ".join([f"Positions: {', '.join(NAMES[p] for p in used)}. {METHOD}",
                     *(filter(None, notes) if "rope" in used else ())])


# -- the work, outside and inside the timed call --
def _work_dtype(dtype: torch.dtype) -> torch.dtype:
    return torch.float64 if dtype == torch.float64 else torch.float32


def turner(n_q: int, n_k: int, head_dim: int, *, device: str, dtype: torch.dtype, first: int | None = None,
           rope_scaling: Mapping[str, Any] | None = None,
           base: float = 10000.0) -> Callable[..., tuple[torch.Tensor, ...]]:
    """turn(q, k, *rest) → (RoPE of q, RoPE of k, *rest), its tables built here, once: keys at positions 0 … n_k − 1,
    queries at the last n_q of them (n_k − n_q …, as alibi_bias places them); `first`: q and k both from there (a
    generating step: one token at position n). `rope_scaling`: a config's dict (`scaling_problem` says what it
    refuses, as a ValueError here), the tables from positional.rope_inv_freq's θ and attention factor, the channels
    past partial_rotary_factor's share passed through; dynamic's θ are those for the whole sequence (n_k tokens, or
    first + 1). O(n·d) each call."""
    if why := scaling_problem("rope", rope_scaling, head_dim=head_dim):
        raise ValueError(why)
    total = n_k if first is None else first + 1

    def tables(start: int, count: int) -> tuple[torch.Tensor, torch.Tensor]:
        at = torch.arange(start, start + count, device=device)
        if rope_scaling is None:
            return rope.angles(at, head_dim, base, dtype=_work_dtype(dtype))
        return positional.scaled_angles(at, head_dim, base, rope_scaling, seq_len=total, dtype=_work_dtype(dtype))
    cq, sq = tables(n_k - n_q if first is None else first, n_q)
    ck, sk = (cq, sq) if first is not None or n_q == n_k else tables(0, n_k)
    rotate = rope.apply if rope_scaling is None else positional.apply_partial

    def turn(q: torch.Tensor, k: torch.Tensor, *rest: torch.Tensor) -> tuple[torch.Tensor, ...]:
        return (rotate(q, cq, sq), rotate(k, ck, sk), *rest)
    return turn


def alibi(heads: int, n_q: int, n_k: int, *, device: str, dtype: torch.dtype) -> torch.Tensor:
    """ALiBi's (heads, n_q, n_k) bias in `dtype` on `device` (positional.alibi_bias)."""
    return positional.alibi_bias(heads, n_q, n_k, dtype=dtype).to(device)


# -- what they cost, beside the spec's figures --
def added_flops(shape: Shape, positions: str) -> float:
    """FLOPs the positions add to a call of `shape`: RoPE 6 a feature pair (4 products, 2 sums) of q and k, 3 a
    number: 3·(B·H·Nq + B·Hk·Nk)·D; ALiBi one addition a score, B·H·Nq·Nk; none 0. Elementwise work, counted because
    it is what the positions cost."""
    if positions == "rope":
        return 3.0 * (shape.bh * shape.Nq + shape.bk * shape.Nk) * shape.D
    if positions == "alibi":
        return float(shape.bh * shape.Nq * shape.Nk)
    return 0.0


def step_flops(shape: Shape, positions: str) -> float:
    """FLOPs the positions add to one generating step: RoPE of the new token's q and k, 3·(B·H + B·Hk)·D."""
    return 3.0 * (shape.bh + shape.bk) * shape.D if positions == "rope" else 0.0


def input_bytes(shape: Shape, positions: str) -> float:
    """Bytes built outside the call that it reads: ALiBi's (H, Nq, Nk) bias in the inputs' dtype (RoPE's tables,
    O(n·d), are left out as the mechanisms' small state is)."""
    return float(shape.H * shape.Nq * shape.Nk * shape.elem) if positions == "alibi" else 0.0


def peak_bytes(spec: MechanismSpec, shape: Shape, positions: str, **params: Any) -> float:
    """The call's predicted peak above its inputs with `positions`. ALiBi: the spec's `biased_memory_bytes` (its
    path with a bias), else its `memory_bytes`. RoPE: the largest of turning q (float32 or float64 work: the two
    products and the sum of each half, 2 work numbers a feature, plus an upcast copy for half inputs), turning k
    with q's result held, and the mechanism's peak with both results held."""
    cost = spec.cost
    if positions == "alibi":
        return float((cost.biased_memory_bytes or cost.memory_bytes)(shape, **params))
    peak = float(cost.memory_bytes(shape, **params))
    if positions != "rope":
        return peak
    e, w = shape.elem, (8 if shape.dtype == "float64" else 4)
    xq, xk = shape.bh * shape.Nq * shape.D, shape.bk * shape.Nk * shape.D

    def turning(x: int) -> float:
        return x * (2 * w + (w if e < w else 0))
    return float(max(turning(xq), xq * e + turning(xk), (xq + xk) * e + peak))
