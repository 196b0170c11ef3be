"""What each mechanism computes: the (query, key) cells it scores and the attention matrix it effectively applies.

Small n only: every matrix here is dense, O(Nq·Nk) memory. Counting cells (`cells_computed`) works for any n.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import pandas as pd
import torch

from .. import masks
from ..api import get, make_state
from ..spec import Shape

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
    pull_back: Any = None  # for projected columns: the spec's map of the weights onto the n keys

    def output(self) -> torch.Tensor:
        return self.weights @ self.values


def pattern_of(key: str, nq: int, nk: int, causal: bool = False, *, state: dict[str, torch.Tensor] | None = None,
               seed: int = 0, **params: Any) -> masks.Pattern:
    """The pattern of an exact mechanism at these settings. A pattern that depends on the mechanism's state
    (BigBird's random blocks, Longformer's given global positions) gets it: `state`, or the state drawn from
    `seed` for an (nq, nk) problem exactly as `attn_core.make_state` draws it."""
    spec = get(key)
    resolved = spec.resolved(params)
    if state is None:
        state = make_state(key, Shape(1, 1, nq, nk, 1, causal=causal), seed=seed, **resolved)
    return spec.insight.pattern(causal, **resolved,
                                **{name: t for name, t in state.items() if name in spec.state.keys})


def selected_cells(key: str, q: torch.Tensor, k: torch.Tensor, causal: bool = False, *,
                   state: dict[str, torch.Tensor] | None = None, seed: int = 0,
                   **params: Any) -> tuple[torch.Tensor, tuple[str, ...]]:
    """For a mechanism that selects its cells from q (B, H, Nq, D) and k (B, Hk, Nk, D) (spec.insight.selected):
    the cells batch element 0 reads, (Nq, C) when one selection serves every head, else (H, Nq, C), C = Nk + the
    extra columns it also reads, and those columns' names. State from `state`, or drawn from `seed`."""
    spec = get(key)
    if spec.insight.selected is None:
        raise ValueError(f"{spec.label} does not select its cells from its inputs; use computed_cells")
    resolved = spec.resolved(params)
    if state is None:
        state = make_state(key, Shape.of(q, k, causal), q.device, q.dtype, seed=seed, **resolved)
    cells, extra = spec.insight.selected(q, k, causal, state, **resolved)
    return (cells[0] if cells.shape[0] == 1 else cells), extra


def computed_cells(key: str, nq: int, nk: int, causal: bool = False, *, state: dict[str, torch.Tensor] | None = None,
                   seed: int = 0, q: torch.Tensor | None = None, k: torch.Tensor | None = None,
                   **params: Any) -> torch.Tensor:
    """(Nq, C) boolean: the cells the mechanism scores. Exact mechanisms: their pattern (with its state: `state`, or
    drawn from `seed`); a mechanism over projected keys (spec.insight.projected): all Nq × C cells; one that selects
    its cells from q and k (spec.insight.selected, which then needs them): the cells it reads (`selected_cells`);
    one scoring through features or landmarks: every allowed (i, j), implicitly."""
    spec = get(key)
    resolved = spec.resolved(params)
    if spec.insight.selected is not None:
        if q is None or k is None:
            raise ValueError(f"{spec.label} selects the cells it reads from q and k; pass q= and k=")
        return selected_cells(key, q, k, causal, state=state, seed=seed, **resolved)[0]
    if spec.insight.pattern is not None:
        return masks.dense_mask(pattern_of(key, nq, nk, causal, state=state, seed=seed, **resolved), nq, nk)
    if spec.insight.projected is not None:
        return torch.ones(nq, resolved[spec.insight.projected], dtype=torch.bool)
    return masks.dense_mask(masks.causal if causal else masks.full, nq, nk)


def cells_computed(key: str, n: int, causal: bool = False, *, seed: int = 0, **params: Any) -> dict[str, Any]:
    """How many of the n² (query, key) cells a mechanism scores, counted cell by cell in row slabs (never a dense
    n×n matrix, but O(n²) time: about a second at n = 8192). A pattern with random state is counted for the state
    drawn from `seed`.

    A mechanism that selects its cells from its inputs counts them itself (spec.insight.reads), without inputs.

    Returns {'cells', 'total' (= n²), 'fraction', 'implicit' (True when scored only through features or landmarks,
    never stored), 'sentence'}, e.g. "Sliding window, window=64, n=1024: 12.6% of the n² cells".
    """
    spec = get(key)
    resolved = spec.resolved(params)
    spec.check(Shape(1, 1, n, n, 1, causal=causal), resolved)
    settings = ", ".join(f"{k}={v}" for k, v in resolved.items())
    head = f"{spec.label}{', ' + settings if settings else ''}, n={n}"
    if spec.insight.reads is not None:
        cells, words = spec.insight.reads(n, causal, **resolved)
        return {"cells": round(cells), "total": n * n, "fraction": cells / (n * n), "implicit": False,
                "sentence": f"{head}: {words}"}
    if spec.insight.pattern is not None:
        fraction = masks.density(pattern_of(key, n, n, causal, seed=seed, **resolved), n, n)
    elif spec.insight.projected is not None:
        fraction = resolved[spec.insight.projected] / n
    else:
        fraction = masks.density(masks.causal, n, n) if causal else 1.0
    if spec.insight.projected is not None:
        columns = resolved[spec.insight.projected]
        tail = f"{fraction:.1%} of the n² cells ({n}×{columns} scores against projected keys)"
    elif spec.insight.pattern is None:
        tail = f"{fraction:.1%} of the n² cells, implicitly through features or landmarks (none stored)"
    else:
        tail = f"{fraction:.1%} of the n² cells"
    return {"cells": round(fraction * n * n), "total": n * n, "fraction": fraction,
            "implicit": spec.insight.pattern is None and spec.insight.projected is None,
            "sentence": f"{head}: {tail}"}


def effective_attention(key: str, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, *, causal: bool = False,
                        state: dict[str, torch.Tensor] | None = None, seed: int = 0, **params: Any) -> Effective:
    """The weights mechanism `key` applies to q (B, H, Nq, D), k, v (B, H, Nk, D), written out densely.

    Exact mechanisms: softmax(QKᵀ/√D) masked by their pattern (cells outside it are exactly 0). The others: their
    spec's `effective` form (linear attention and Performer: φ(Q)φ(K)ᵀ row-normalized; Linformer:
    softmax(Q(EK)ᵀ/√D), (Nq, rank), applied to F·v). Causal: j ≤ i. Random state comes from `state`, or is drawn
    from `seed` exactly as `attn_core.make_state` draws it, so the result matches the mechanism called with that
    state. O(Nq·Nk·D) time and O(Nq·Nk) memory.
    """
    spec = get(key)
    resolved = spec.resolved(params)
    shape = Shape.of(q, k, causal)
    spec.check(shape, resolved)
    if state is None:
        state = make_state(key, shape, q.device, q.dtype, seed=seed, **resolved)
    if spec.insight.pattern is not None and spec.insight.effective is None:
        scores = (q * (1.0 / math.sqrt(shape.D))) @ k.transpose(-2, -1)
        allowed = masks.dense_mask(pattern_of(key, shape.Nq, shape.Nk, causal, state=state, **resolved), shape.Nq,
                                   shape.Nk, q.device)
        return Effective(torch.softmax(scores.masked_fill(~allowed, float("-inf")), dim=-1), v, KEYS)
    if spec.insight.effective is None:
        raise ValueError(f"{spec.label} has neither a pattern nor an effective form in its spec; give it one")
    weights, values = spec.insight.effective(q, k, v, causal, state, **resolved)
    if spec.insight.projected is not None:
        return Effective(weights, values, PROJECTED, spec.insight.pull_back)
    return Effective(weights, values, KEYS)


def pulled_back(eff: Effective, state: dict[str, torch.Tensor]) -> torch.Tensor:
    """Weights over projected keys mapped onto the n keys by their spec's pull_back (Linformer: W·F, (B, H, Nq, Nk),
    so that out = (W·F)·v); weights over the keys themselves as they are."""
    if eff.columns != PROJECTED:
        return eff.weights
    return eff.pull_back(eff.weights, state)


def small_defaults(key: str, n: int) -> dict[str, int | float]:
    """Parameters that show a mechanism's structure on a short sequence of n tokens: each Param's `small` value
    (the specs' defaults are sized for thousands of tokens, where a window of 256 covers a whole sentence)."""
    return {p.name: p.small_value(n) for p in get(key).params}


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
    """Heatmap frames of one mechanism on one sequence (batch 0): {'cells': matrix_frame of computed_cells (one panel
    per head where each head selects its own), 'weights': matrix_frame of the effective weights, one panel per head,
    'columns': what the weights' columns index, 'cells_columns': what the cells' columns index}.

    Linformer's columns are its projected keys ("p0", "p1", …), or the n keys with `pull_back` (W·F: a linear
    map of v, entries may be negative). A mechanism that selects its cells (spec.insight.selected) shows the cells
    it reads from these q and k, and after the keys any further columns it reads (NSA's compressed blocks).
    """
    n = q.shape[-2]
    spec = get(key)
    state = make_state(key, Shape.of(q, k, causal), q.device, q.dtype, seed=seed, **spec.resolved(params))
    eff = effective_attention(key, q, k, v, causal=causal, state=state, **params)
    projected = [f"p{r}" for r in range(eff.weights.shape[-1])] if eff.columns == PROJECTED else tokens
    if spec.insight.selected is not None:
        cells, extra = selected_cells(key, q, k, causal, state=state, **params)
        cell_columns = tokens + list(extra)
        cells_title = f"{KEYS}, then {spec.insight.extra_columns}" if extra else KEYS
    else:
        cells = computed_cells(key, n, k.shape[-2], causal, state=state, **params)
        cell_columns, cells_title = projected, PROJECTED if spec.insight.projected else KEYS
    shown = tokens if pull_back else projected
    weights = pulled_back(eff, state) if pull_back else eff.weights
    return {"cells": matrix_frame(cells, tokens, cell_columns, value="computed"),
            "weights": matrix_frame(weights[0], tokens, shown),
            "columns": KEYS if shown is tokens else PROJECTED, "cells_columns": cells_title}
