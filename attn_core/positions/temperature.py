"""Llama 4's query temperature for long contexts ("attn_temperature_tuning"): on its NoPE layers (global attention
with no rotary embedding) each query is scaled up with its position, so that attention over very many keys stays
sharp. The rule as Hugging Face's Llama 4 applies it, with the published settings of meta-llama/Llama-4-Scout-17B-16E
and Llama-4-Maverick-17B-128E-Instruct (config.json, text_config: attn_temperature_tuning true, floor_scale 8192,
attn_scale 0.1, no_rope_layers marking every fourth layer NoPE); the code is written here."""
from __future__ import annotations

import math
from typing import Any

import torch

FLOOR_SCALE, ATTN_SCALE = 8192, 0.1  # Llama 4's published text_config


def _problem(floor_scale: Any, attn_scale: Any) -> str | None:
    if isinstance(floor_scale, bool) or not isinstance(floor_scale, int) or floor_scale < 1:
        return f"floor_scale must be a whole number of tokens ≥ 1 (Llama 4 uses {FLOOR_SCALE}), got {floor_scale!r}"
    if isinstance(attn_scale, bool) or not isinstance(attn_scale, (int, float)) or not math.isfinite(attn_scale) \
            or attn_scale < 0:
        return f"attn_scale must be a finite number ≥ 0 (Llama 4 uses {ATTN_SCALE}), got {attn_scale!r}"
    return None


def query_scale(positions: torch.Tensor, *, floor_scale: int = FLOOR_SCALE,
                attn_scale: float = ATTN_SCALE) -> torch.Tensor:
    """s(p) = ln(⌊(p + 1)/floor_scale⌋ + 1)·attn_scale + 1 for each token position p in `positions` (..., N), in
    float32 (float64 for float64 positions): 1 for the first floor_scale − 1 positions, then a step every floor_scale
    tokens, growing as ln p (s = 1 + 0.1·ln 2 ≈ 1.069 from p = 8191, ≈ 1.208 from p = 65535 = 8·8192 − 1). O(N)."""
    if problem := _problem(floor_scale, attn_scale):
        raise ValueError(problem)
    if not isinstance(positions, torch.Tensor) or positions.dtype == torch.bool or positions.is_complex():
        got = positions.dtype if isinstance(positions, torch.Tensor) else type(positions).__name__
        raise ValueError(f"positions must be a tensor of token positions, e.g. torch.arange(n); got {got}")
    if positions.numel() and bool((positions < 0).any()):
        raise ValueError("positions must be ≥ 0 (a token's index in its sequence)")
    dtype = torch.float64 if positions.dtype == torch.float64 else torch.float32
    return torch.floor((positions.to(dtype) + 1.0) / floor_scale).add(1.0).log().mul(attn_scale).add(1.0)


def temper_queries(q: torch.Tensor, positions: torch.Tensor, *, floor_scale: int = FLOOR_SCALE,
                   attn_scale: float = ATTN_SCALE) -> torch.Tensor:
    """q (..., N, D) with each row multiplied by query_scale(positions) (positions (N,) or broadcasting to q's
    leading dimensions and its N), computed in float32 (float64 for float64 q), returned in q's dtype: Llama 4's
    temperature, applied before the scores on its NoPE layers only (its RoPE layers attend within chunks of 8192
    tokens). The scores q·k/√D of a row are multiplied by s: a softmax at temperature 1/s. O(N·D)."""
    if not isinstance(q, torch.Tensor) or not q.is_floating_point() or q.dim() < 2:
        got = f"{q.dtype} {tuple(q.shape)}" if isinstance(q, torch.Tensor) else type(q).__name__
        raise ValueError(f"q must be a floating-point tensor (..., tokens, channels), got {got}")
    if q.dtype == torch.float64 and isinstance(positions, torch.Tensor) and positions.dtype != torch.bool \
            and not positions.is_complex():
        positions = positions.to(torch.float64)  # float64 queries: the scale in float64 too (the rest refused below)
    scale = query_scale(positions.to(q.device) if isinstance(positions, torch.Tensor) else positions,
                        floor_scale=floor_scale, attn_scale=attn_scale)
    if scale.shape[-1] != q.shape[-2]:
        raise ValueError(f"positions give {scale.shape[-1]} tokens, q has {q.shape[-2]}: give one position a query")
    return (q.to(scale.dtype) * scale[..., None]).to(q.dtype)
