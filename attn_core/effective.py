"""What each mechanism computes: the (query, key) cells it scores and the attention matrix it effectively applies.

Small n only: every matrix here is dense, O(Nq·Nk) memory. Counting cells (`cells_computed`) works for any n.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import pandas as pd
import torch

from . import masks
from .api import get, make_state
from .mechanisms.linear import feature_map
from .mechanisms.performer import favor_features
from .spec import Shape

# How the columns of a mechanism's weight matrix are indexed: the n keys, or Linformer's `rank` projected keys.
KEYS, PROJECTED = "keys", "projected keys"


@dataclass(frozen=True)
class Effective:
    """The attention a mechanism applies to one input: out = weights @ values.

    weights (B, H, Nq, C) with rows summing to 1; values (B, H, C, D) is v itself (C = Nk) or, for Linformer, the
    projected values F·v (C = rank). `columns` says which (KEYS or PROJECTED).
    """

    weights: torch.Tensor
    values: torch.Tensor
    columns: str

    def output(self) -> torch.Tensor:
        return self.weights @ self.values


def computed_cells(key: str, nq: int, nk: int, causal: bool = False, **params: Any) -> torch.Tensor:
    """(Nq, C) boolean: the cells the mechanism scores. Exact mechanisms: their pattern; Linformer: all Nq × rank
    cells against projected keys; linear and Performer: every allowed (i, j), implicitly through features."""
    spec = get(key)
    resolved = spec.resolved(params)
    if spec.pattern is not None:
        return masks.dense_mask(spec.pattern(causal, **resolved), nq, nk)
    if key == "linformer":
        return torch.ones(nq, resolved["rank"], dtype=torch.bool)
    return masks.dense_mask(masks.causal if causal else masks.full, nq, nk)


def cells_computed(key: str, n: int, causal: bool = False, **params: Any) -> dict[str, Any]:
    """How many of the n² (query, key) cells a mechanism scores, counted cell by cell in row slabs (never a dense
    n×n matrix, but O(n²) time: about a second at n = 8192).

    Returns {'cells', 'total' (= n²), 'fraction', 'implicit' (True when scored only through features, never
    stored), 'sentence'}, e.g. "Sliding window, window=64, n=1024: 12.6% of the n² cells".
    """
    spec = get(key)
    resolved = spec.resolved(params)
    spec.check(Shape(1, 1, n, n, 1, causal=causal), resolved)
    if spec.pattern is not None:
        fraction = masks.density(spec.pattern(causal, **resolved), n, n)
    elif key == "linformer":
        fraction = resolved["rank"] / n
    else:
        fraction = masks.density(masks.causal, n, n) if causal else 1.0
    settings = ", ".join(f"{k}={v}" for k, v in resolved.items())
    head = f"{spec.label}{', ' + settings if settings else ''}, n={n}"
    if key == "linformer":
        tail = f"{fraction:.1%} of the n² cells ({n}×{resolved['rank']} scores against projected keys)"
    elif spec.pattern is None:
        tail = f"{fraction:.1%} of the n² cells, implicitly through features (none stored)"
    else:
        tail = f"{fraction:.1%} of the n² cells"
    return {"cells": round(fraction * n * n), "total": n * n, "fraction": fraction,
            "implicit": spec.pattern is None and key != "linformer", "sentence": f"{head}: {tail}"}


def _normalized(scores: torch.Tensor, causal: bool) -> torch.Tensor:
    """Rows of non-negative similarities, causal-masked (j ≤ i), divided by their sums."""
    if causal:
        scores = scores.tril()
    return scores / scores.sum(-1, keepdim=True).clamp_min(torch.finfo(scores.dtype).tiny)


def effective_attention(key: str, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, *, causal: bool = False,
                        state: dict[str, torch.Tensor] | None = None, seed: int = 0, **params: Any) -> Effective:
    """The weights mechanism `key` applies to q (B, H, Nq, D), k, v (B, H, Nk, D), written out densely.

    Exact mechanisms: softmax(QKᵀ/√D) masked by their pattern (cells outside it are exactly 0). Linear attention:
    φ(Q)φ(K)ᵀ row-normalized, φ = elu + 1. Performer: the same with FAVOR+ features. Linformer: softmax(Q(EK)ᵀ/√D),
    (Nq, rank), applied to F·v. Causal: j ≤ i. Random state comes from `state`, or is drawn from `seed` exactly
    as `attn_core.make_state` draws it, so the result matches the mechanism called with that state.
    O(Nq·Nk·D) time and O(Nq·Nk) memory.
    """
    spec = get(key)
    resolved = spec.resolved(params)
    shape = Shape.of(q, k, causal)
    spec.check(shape, resolved)
    if state is None:
        state = make_state(key, shape, q.device, q.dtype, seed=seed, **resolved)
    if spec.pattern is not None:
        scores = (q * (1.0 / math.sqrt(shape.D))) @ k.transpose(-2, -1)
        allowed = masks.dense_mask(spec.pattern(causal, **resolved), shape.Nq, shape.Nk, q.device)
        return Effective(torch.softmax(scores.masked_fill(~allowed, float("-inf")), dim=-1), v, KEYS)
    if key == "linformer":
        scores = (q * (1.0 / math.sqrt(shape.D))) @ (state["E"] @ k).transpose(-2, -1)  # (B, H, Nq, rank)
        return Effective(torch.softmax(scores, dim=-1), state["F"] @ v, PROJECTED)
    if key == "performer":
        phi_q = favor_features(q, state["projection"], is_query=True)
        phi_k = favor_features(k, state["projection"], is_query=False)
    elif key == "linear":
        phi_q, phi_k = feature_map(q), feature_map(k)
    else:
        raise ValueError(f"no effective-attention form is known for {spec.label}")
    return Effective(_normalized(phi_q @ phi_k.transpose(-2, -1), causal), v, KEYS)


def pulled_back(eff: Effective, state: dict[str, torch.Tensor]) -> torch.Tensor:
    """Linformer's (Nq, rank) weights mapped to the n keys: W·F, (B, H, Nq, Nk), so that out = (W·F)·v.

    Rows still sum to Σ_r W_ir·(Σ_j F_rj), not 1, and entries may be negative: F mixes every position into each
    projected value, so this is a linear map of v, not a distribution over keys.
    """
    if eff.columns != PROJECTED:
        return eff.weights
    return eff.weights @ state["F"]


def small_defaults(key: str, n: int) -> dict[str, int]:
    """Parameters that show a mechanism's structure on a short sequence of n tokens (the specs' defaults are
    sized for thousands of tokens, where a window of 256 covers a whole sentence)."""
    quarter = max(1, n // 4)
    choices = {"window": max(1, n // 8), "block": quarter, "stride": max(1, round(math.sqrt(n))),
               "rank": quarter}
    spec = get(key)
    return {p.name: choices.get(p.name, p.default) for p in spec.params}


def matrix_frame(weights: torch.Tensor, rows: list[str] | None = None, columns: list[str] | None = None,
                 value: str = "weight") -> pd.DataFrame:
    """(H, R, C) or (R, C) matrix → tidy rows (head, i, j, query, key, value) for a heatmap, one per cell.

    `rows`/`columns` label the indices (e.g. "3 sat"); by default the indices themselves.
    """
    w = weights if weights.dim() == 3 else weights[None]
    heads, r, c = w.shape
    rows = rows or [str(i) for i in range(r)]
    columns = columns or [str(j) for j in range(c)]
    h, i, j = torch.meshgrid(torch.arange(heads), torch.arange(r), torch.arange(c), indexing="ij")
    return pd.DataFrame({"head": h.flatten().numpy() + 1, "i": i.flatten().numpy(), "j": j.flatten().numpy(),
                         "query": [rows[x] for x in i.flatten().tolist()],
                         "key": [columns[x] for x in j.flatten().tolist()],
                         value: w.detach().double().flatten().numpy()})


def token_labels(text: str, limit: int = 64) -> list[str]:
    """Whitespace tokens of a short sentence, numbered so repeated words stay distinct ("0 the", "4 the")."""
    words = text.split()
    if not words:
        raise ValueError("the sentence is empty; type a few words")
    if len(words) > limit:
        raise ValueError(f"the sentence has {len(words)} words; use at most {limit} for a readable heatmap")
    return [f"{i} {w}" for i, w in enumerate(words)]


def attention_maps(key: str, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, tokens: list[str], *,
                   causal: bool = False, seed: int = 0, pull_back: bool = False,
                   **params: Any) -> dict[str, Any]:
    """Heatmap frames of one mechanism on one sequence (batch 0): {'cells': matrix_frame of computed_cells,
    'weights': matrix_frame of the effective weights, one panel per head, 'columns': what the columns index}.

    Linformer's columns are its projected keys ("p0", "p1", …), or the n keys with `pull_back` (W·F: a linear
    map of v, entries may be negative).
    """
    n = q.shape[-2]
    state = make_state(key, Shape.of(q, k, causal), q.device, q.dtype, seed=seed, **get(key).resolved(params))
    eff = effective_attention(key, q, k, v, causal=causal, state=state, **params)
    cells = computed_cells(key, n, k.shape[-2], causal, **params)
    projected = [f"p{r}" for r in range(eff.weights.shape[-1])] if eff.columns == PROJECTED else tokens
    shown = tokens if pull_back else projected
    weights = pulled_back(eff, state) if pull_back else eff.weights
    return {"cells": matrix_frame(cells, tokens, projected, value="computed"),
            "weights": matrix_frame(weights[0], tokens, shown),
            "columns": KEYS if shown is tokens else PROJECTED}
