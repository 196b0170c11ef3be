"""Rotary position embedding: a position turns each pair of features by its own angle (Su et al. 2021,
'RoFormer', arXiv 2104.09864)."""
from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

import torch


def angles(positions: torch.Tensor, d: int, base: float = 10000.0, *,
           dtype: torch.dtype = torch.float32) -> tuple[torch.Tensor, torch.Tensor]:
    """cos and sin of p·θ_i for each position p and pair i = 0 … d/2 − 1, θ_i = base^(−2i/d): two (..., N, d/2)
    tables in `dtype` for positions (..., N). Build them once and pass them to `apply` for every tensor rotated at
    those positions (a layer's queries and keys). O(N·d) time and memory."""
    if isinstance(d, bool) or not isinstance(d, int) or d < 2 or d % 2:
        raise ValueError(f"rotary embedding turns features in pairs, so the feature width must be a positive even "
                         f"integer; got {d!r}")
    if isinstance(base, bool) or not isinstance(base, (int, float)) or not math.isfinite(base) or base <= 1:
        raise ValueError(f"base must be a finite number above 1 (RoFormer uses 10000), got {base!r}")
    if not isinstance(positions, torch.Tensor) or positions.dtype == torch.bool or positions.is_complex():
        got = positions.dtype if isinstance(positions, torch.Tensor) else type(positions).__name__
        raise ValueError(f"positions must be a tensor of token positions, e.g. torch.arange(n); got {got}")
    theta = base ** (-torch.arange(0, d, 2, dtype=dtype, device=positions.device) / d)  # (d/2,)
    turn = positions.to(dtype)[..., None] * theta  # (..., N, d/2)
    return turn.cos(), turn.sin()


def apply(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Rotate each feature pair of x (..., N, d) by tables from `angles` (broadcasting to (..., N, d/2)):
    (x_2i, x_2i+1) → (x_2i·cos − x_2i+1·sin, x_2i·sin + x_2i+1·cos), in the tables' dtype, returned in x's.
    O(N·d) time."""
    pairs_shape = x.shape[:-1] + (x.shape[-1] // 2,)
    try:
        fits = torch.broadcast_shapes(cos.shape, pairs_shape) == pairs_shape
    except RuntimeError:
        fits = False
    if not fits or x.shape[-1] % 2:
        raise ValueError(f"angle tables {tuple(cos.shape)} do not fit x {tuple(x.shape)}: they must broadcast to x's "
                         f"leading dimensions and its {x.shape[-2]} positions, one column per feature pair")
    pairs = x.to(cos.dtype).unflatten(-1, (-1, 2))  # (..., N, d/2, 2)
    even, odd = pairs[..., 0], pairs[..., 1]
    turned = torch.stack((even * cos - odd * sin, even * sin + odd * cos), dim=-1)
    return turned.flatten(-2).to(x.dtype)


def rotate(x: torch.Tensor, positions: torch.Tensor, *, base: float = 10000.0,
           rope_scaling: Mapping[str, Any] | None = None, max_position_embeddings: int | None = None) -> torch.Tensor:
    """RoPE: x (..., N, d), d even, with its feature pair (2i, 2i+1) turned by the angle p·θ_i, θ_i = base^(−2i/d),
    for the position p of its token; positions (N,), or (..., N) broadcasting to x's leading dimensions.
    `rope_scaling`: a config's dict (rope_type linear, dynamic, yarn or llama3; partial_rotary_factor), its θ and
    attention factor from scaling.rope_inv_freq, the channels past the rotary share passed through; a rope_type this
    library does not compute is refused with a sentence (ValueError). `max_position_embeddings`: the config's, for
    dynamic and yarn without original_max_position_embeddings.

    The defining property: a rotation is orthogonal and rotations compose, so
    ⟨rotate(q, i), rotate(k, j)⟩ = ⟨q, R(j − i) k⟩ depends on the positions only through i − j, and position 0
    leaves x unchanged. Angles in float32 (float64 for float64 x), result in x's dtype. O(N·d) time and memory.
    """
    if not isinstance(x, torch.Tensor) or not x.is_floating_point() or x.dim() < 2:
        got = f"{x.dtype} {tuple(x.shape)}" if isinstance(x, torch.Tensor) else type(x).__name__
        raise ValueError(f"x must be a floating-point tensor (..., tokens, features), got {got}")
    if x.shape[-1] % 2:
        raise ValueError(f"rotary embedding turns features in pairs, so x needs an even number of features; it has "
                         f"{x.shape[-1]}: drop or pad one feature")
    dtype = torch.float64 if x.dtype == torch.float64 else torch.float32
    if rope_scaling is not None:
        from attn_core.positions import scaling  # imported here: scaling builds on this module
        tables = scaling.scaled_angles(positions, x.shape[-1], base, rope_scaling, dtype=dtype,
                                       max_position_embeddings=max_position_embeddings)
        return scaling.apply_partial(x, *tables)
    cos, sin = angles(positions, x.shape[-1], base, dtype=dtype)
    return apply(x, cos, sin)
