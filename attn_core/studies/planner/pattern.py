"""A model's layer pattern: which layer is which kind, in order (read from its config.json where there is one, else
spread evenly), and the mask each kind attends under at a small n, from attn_core.masks (full causal, sliding window,
chunked, window with sink tokens) or, for a kind that selects its keys from the data (top-k, NSA), the cells it
selects for seeded random inputs.

    pattern_frame(MODELS["gemma-3-27b"], n=16)   # 62 layers in order (5 local to 1 global), and each kind's mask
"""
from __future__ import annotations

import dataclasses

import pandas as pd
import torch

from attn_core import masks
from attn_core.insight import effective
from attn_core.mechanisms import MEASURED
from attn_core.studies.planner import hf_config
from attn_core.studies.planner.model import Layer, Model, plan

AUXILIARY = (" convolution state", "DSA indexer keys")  # rows hf_config adds beside a layer's own kind
MAX_N = 64  # the largest mask drawn: n² cells


def is_auxiliary(layer: Layer) -> bool:
    """A row that is a cache beside a layer's own kind (a convolution's inputs, an indexer's keys), not a layer."""
    return any(layer.name.endswith(end) for end in AUXILIARY)


def layer_order(model: Model, config: dict | None = None) -> tuple[list[str], bool]:
    """Each layer's kind name, first layer first, and whether that order is read (True) or assumed (False). Read from
    `config` (its per-layer mixers, hf_config.read) where its kinds are the model's; otherwise the kinds are spread
    evenly, the rarest first: c layers of N at the free slots ⌊(k+1)·free/c⌋ − 1 (Gemma 3's 10 global of 62 land
    every 6th, as its config places them). O(N · kinds). Read through hf_config.layer_kinds."""
    names = {layer.name for layer in model.layers}
    if config is not None:
        try:
            order = hf_config.layer_kinds(config)
        except ValueError:  # a config the reader refuses: the order is spread, as without one
            order = []
        if order and set(order) <= names:
            return order, True
    kinds = sorted((layer for layer in model.layers if not is_auxiliary(layer)), key=lambda layer: layer.count)
    total = sum(layer.count for layer in kinds)
    slots: list[str | None] = [None] * total
    for layer in kinds:
        free = [i for i, s in enumerate(slots) if s is None]
        step = len(free) / layer.count
        for k in range(layer.count):
            slots[free[int((k + 1) * step) - 1]] = layer.name
    return [s or "" for s in slots], False


def kind_mask(layer: Layer, n: int, context: int) -> tuple[torch.Tensor, str]:
    """(n, n) boolean: query i sees key j, for one layer kind drawn at `n` tokens, and the words for it. A window or
    chunk longer than n is drawn in proportion to `context` (at least 2, below n), and says so."""
    spec = MEASURED[layer.mechanism]
    if layer.window is not None:
        size = layer.window if layer.window < n else max(2, min(n - 1, round(n * layer.window / context)))
        drawn = "" if size == layer.window else f", drawn as {size} of {n}"
        if layer.name.startswith("chunked"):
            return masks.dense_mask(masks.chunked(size), n, n), f"chunks of {layer.window:,}{drawn}"
        pattern = masks.sliding_window(size - 1) & masks.causal  # a window of w tokens, itself included
        return masks.dense_mask(pattern, n, n), f"sliding window of {layer.window:,}{drawn}"
    if spec.insight.selected is not None or (spec.insight.pattern is not None and spec.defaults):
        params = effective.small_defaults(layer.mechanism, n)
        gen = torch.Generator().manual_seed(0)
        q, k = (torch.randn(1, 1, n, 8, generator=gen) for _ in range(2))
        cells = effective.computed_cells(layer.mechanism, n, n, True, q=q, k=k, **params)[:, :n]
        how = "selected from seeded random inputs (the data chooses)" if spec.insight.selected else "its pattern"
        return cells.bool(), f"{how} at {', '.join(f'{p} {v}' for p, v in params.items())}"
    return masks.dense_mask(masks.causal, n, n), "full causal: every earlier token"


def pattern_frame(model: Model, n: int = 16, config: dict | None = None) -> pd.DataFrame:
    """The model's pattern as one tidy frame for a chart: rows part='order' (layer 1 … N, kind, read: the order
    read from a config or assumed) and part='mask' (kind, i, j, seen: query i sees key j at `n`, how: the words).
    O(N + kinds · n²)."""
    if not isinstance(n, int) or isinstance(n, bool) or not 2 <= n <= MAX_N:
        raise ValueError(f"n must be a whole number of tokens from 2 to {MAX_N}, got {n!r}")
    order, read = layer_order(model, config)
    rows = [{"part": "order", "layer": i + 1, "kind": kind, "read": read} for i, kind in enumerate(order)]
    for layer in model.layers:
        mask, how = kind_mask(layer, n, model.max_context)
        if layer.window is None and _holds_state(layer):
            how = "every earlier token, through a fixed-size state"
        rows += [{"part": "mask", "kind": layer.name, "i": i, "j": j, "seen": bool(mask[i, j]), "how": how}
                 for i in range(n) for j in range(n)]
    return pd.DataFrame(rows, columns=["part", "layer", "kind", "read", "i", "j", "seen", "how"])


def _holds_state(layer: Layer) -> bool:
    """Whether the kind keeps a fixed-size state (its cache does not grow from one token to two)."""
    one = Model(name="one", layers=(dataclasses.replace(layer, count=1),))
    return plan(one, 2).kinds[0].kind == "state"
