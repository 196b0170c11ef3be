"""Compare designs: one model's attention rebuilt as its GQA, MQA, MLA, sliding-window-hybrid and linear-hybrid
variants, and what each holds, reads a decode step and runs at on a device by the one roofline (roofline.py). Every
variant keeps the model's weights as read (the attention projections' change is left out, a note says so).

    compare(MODELS["llama-3-8b"], "H100 SXM", 8192)   # cache a token: 128 KiB as is, 16 KiB as MQA
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Sequence

import pandas as pd

from attn_core.engine.untrusted import clipped, quoted
from attn_core.mechanisms import MEASURED
from attn_core.nn.latent import deepseek_proportions
from attn_core.studies.planner.devices import Device, find_device
from attn_core.studies.planner.model import MAX_NAME, Layer, Model, hybrid, hybrid_name, plan
from attn_core.studies.planner.roofline import WeightsRead, crossover_context, roofline, weights_read
from attn_core.studies.planner.weights import Weights

LATENT_KINDS = ("mla", "mla_naive")
COLUMNS = ["design", "model", "cache_bytes", "cache_per_token", "read_bytes", "decode_tokens_per_s", "decode_bound",
           "prefill_seconds", "prefill_bound"]


@dataclass(frozen=True, kw_only=True)
class Designs:
    """The variants to build: `kv_groups` key/value heads for GQA; hybrids turn `share` (0 … 1) of the first kind of
    layer into sliding-window layers of `window` tokens, and into `into` (any kind that can generate)."""

    kv_groups: int = 8
    share: float = 0.75
    window: int = 4096
    into: str = "gated_deltanet"


def cached_per_token(model: Model) -> list[int]:
    """Indices of the layer kinds whose cache grows a token at a time and has key/value heads to share: keys and
    values (not latents, not recurrent states). O(kinds)."""
    made = plan(model, 2)
    return [i for i, k in enumerate(made.kinds) if k.kind == "kv" and k.layer.mechanism not in LATENT_KINDS]


def shared_kv(model: Model, kv_heads: int, tag: str) -> Model:
    """`model` with every key/value layer (cached_per_token) sharing `kv_heads` key/value heads among its query heads:
    GQA (1 < kv_heads < heads) or MQA (kv_heads = 1); a kind whose heads it does not divide is refused by name.
    Cache a token a layer: 2 · kv_heads · head_dim · bytes."""
    grown = cached_per_token(model)
    layers = [dataclasses.replace(layer, kv_heads=min(kv_heads, layer.heads)) if i in grown else layer
              for i, layer in enumerate(model.layers)]
    return _named(model, layers, tag)


def latent(model: Model) -> Model:
    """`model` with every key/value layer turned into multi-head latent attention of the same heads at DeepSeek's
    proportions (nn.latent.deepseek_proportions: kv_rank = 4 · head_dim, rope_dim = head_dim / 2), absorbed when
    decoding, naive for the prompt; a window is dropped. Cache a token a layer: (kv_rank + rope_dim) · bytes."""
    grown = cached_per_token(model)
    layers = []
    for i, layer in enumerate(model.layers):
        if i in grown:
            sizes = deepseek_proportions(layer.heads, layer.head_dim)
            layer = dataclasses.replace(layer, name="multi-head latent attention", mechanism="mla", kv_heads=None,
                                        window=None, kv_rank=sizes["kv_rank"], rope_dim=sizes["rope_dim"],
                                        prefill_mechanism="mla_naive")
        layers.append(layer)
    return _named(model, layers, "MLA")


def target(model: Model) -> int:
    """The kind a hybrid turns: the first full key/value kind (no window), else the first key/value kind, else the
    first kind."""
    grown = cached_per_token(model)
    full = [i for i in grown if model.layers[i].window is None]
    return (full or grown or [0])[0]


def turned(model: Model, share: float, into: str, *, window: int = 4096) -> Model:
    """`model` with `share` of its `target` kind's layers (rounded to whole layers) turned into `into`, any kind that
    can generate, of the same heads and head dim: a state kind through model.hybrid; a windowed kind with `window`
    (capped at the model's context); MLA at DeepSeek's proportions. Named by hybrid_name; the kind turned is listed
    first (the order of kinds changes no figure). ValueError naming the field."""
    at = target(model)
    model = dataclasses.replace(model, layers=(model.layers[at], *model.layers[:at], *model.layers[at + 1:]))
    spec = MEASURED.get(into) if isinstance(into, str) else None
    if spec is None or spec.supports.generation is None:
        raise ValueError(f"turned into {quoted(into)} is not a kind that can generate here; choose one of "
                         f"{', '.join(k for k, s in MEASURED.items() if s.supports.generation is not None)}")
    if "window" not in spec.defaults and into not in LATENT_KINDS:
        return hybrid(model, share, into)  # the model's own helper: heads, head dim and key/value heads copied
    hybrid(model, share, "sdpa")  # the share checked, and named, as the model's own helper does
    first = model.layers[0]
    count = round(first.count * share)  # as hybrid rounds it
    if count == 0:
        return model
    if into in LATENT_KINDS:
        sizes = deepseek_proportions(first.heads, first.head_dim)
        extra = dict(kv_heads=None, kv_rank=sizes["kv_rank"], rope_dim=sizes["rope_dim"], prefill_mechanism="mla_naive")
    else:
        extra = dict(kv_heads=first.kv_heads, window=min(window, model.max_context))
    new = Layer(name=spec.label, mechanism=into, count=count, heads=first.heads, head_dim=first.head_dim, **extra)
    kept = [dataclasses.replace(first, count=first.count - count)] if count < first.count else []
    made = dataclasses.replace(model, name=hybrid_name(model.name, first, count, into),
                               layers=tuple([*kept, new, *model.layers[1:]]))
    if found := made.problems():
        raise ValueError("; ".join(found))
    return made


def variants(model: Model, designs: Designs = Designs()) -> tuple[list[tuple[str, Model]], list[str]]:
    """The designs of `model`, each (design, model): as is, MHA, GQA (designs.kv_groups), MQA, MLA, the
    sliding-window hybrid and the hybrid into designs.into; and a sentence for each one that cannot be built."""
    heads = {model.layers[i].heads for i in cached_per_token(model)}
    builders = [("as is", lambda: model),
                ("MHA", lambda: shared_kv(model, max(heads), "MHA") if len(heads) == 1 else _refuse(heads)),
                (f"GQA ({designs.kv_groups} kv heads)", lambda: shared_kv(model, designs.kv_groups, "GQA")),
                ("MQA", lambda: shared_kv(model, 1, "MQA")),
                ("MLA", lambda: latent(model)),
                (f"hybrid: window {designs.window:,} ({designs.share:.0%})",
                 lambda: turned(model, designs.share, "sliding_window", window=designs.window)),
                (f"hybrid: {designs.into} ({designs.share:.0%})",
                 lambda: turned(model, designs.share, designs.into, window=designs.window))]
    made, notes = [], []
    for design, build in builders:
        if design != "as is" and not heads and design.split(" ")[0] in ("MHA", "GQA", "MQA", "MLA"):
            notes.append(f"{design}: the model has no key/value layers to change")
            continue
        try:
            made.append((design, build()))
        except ValueError as e:
            notes.append(f"{design}: {e}")
    return made, notes


def compare(model: Model, device: Device | str, context: int, *, designs: Designs = Designs(), batch: int = 1,
            weights: Weights | WeightsRead | tuple[float, float] | None = None,
            cache_dtype: str = "bfloat16") -> tuple[pd.DataFrame, list[str]]:
    """One row per design of `model` (variants) on `device` at `context` tokens for `batch` sequences, every design
    reading `model`'s weights: DataFrame[COLUMNS] with cache_bytes (the batch's cache, token by token), cache_per_token
    (cache_bytes ÷ (batch · context), the average a token of context holds), read_bytes (what a decode step reads:
    active weights + the caches), decode tokens/s and prefill seconds with their bound; and the notes."""
    chip, read = find_device(device), weights_read(model, weights)
    built, notes = variants(model, designs)
    rows = []
    for design, variant in built:
        line = roofline(variant, chip, context, batch=batch, weights=read, cache_dtype=cache_dtype)
        rows.append({"design": design, "model": variant.name, "cache_bytes": line.cache_bytes,
                     "cache_per_token": line.cache_bytes / (batch * context), "read_bytes": line.decode_bytes,
                     "decode_tokens_per_s": line.decode_tokens_per_s, "decode_bound": line.decode_bound,
                     "prefill_seconds": line.prefill_seconds, "prefill_bound": line.prefill_bound})
    notes.append(f"every design reads {model.name}'s weights ({read.source}): the attention projections a design "
                 "adds or removes are left out")
    return pd.DataFrame(rows, columns=COLUMNS), notes


def speed_curves(models: Sequence[Model], device: Device | str, contexts: Sequence[int], *, batch: int = 1,
                 weights: dict[str, Weights | WeightsRead | tuple[float, float]] | None = None,
                 cache_dtype: str = "bfloat16") -> pd.DataFrame:
    """Each model's roofline at each context and at its crossover (crossover_context: where the cache read passes the
    weights read), for a chart: DataFrame[model, context, decode_tokens_per_s, prefill_seconds, bound, crossover
    (True on the crossover's own row)], sorted by model and context. O(models · contexts) rooflines."""
    chip, given, rows = find_device(device), weights or {}, []
    for model in models:
        read = weights_read(model, given.get(model.name))
        cross = crossover_context(model, read, batch=batch, cache_dtype=cache_dtype)
        at = sorted(set(contexts) | ({cross} if cross else set()))
        for n in at:
            line = roofline(model, chip, n, batch=batch, weights=read, cache_dtype=cache_dtype)
            rows.append({"model": model.name, "context": n, "decode_tokens_per_s": line.decode_tokens_per_s,
                         "prefill_seconds": line.prefill_seconds, "bound": line.decode_bound,
                         "crossover": n == cross})
    return pd.DataFrame(rows, columns=["model", "context", "decode_tokens_per_s", "prefill_seconds", "bound",
                                       "crossover"])


def _named(model: Model, layers: list[Layer], tag: str) -> Model:
    made = dataclasses.replace(model, name=clipped(model.name, MAX_NAME - len(tag) - 3) + f" ({tag})",
                               layers=tuple(layers))
    if found := made.problems():
        raise ValueError("; ".join(found))
    return made


def _refuse(heads: set[int]) -> Model:
    raise ValueError(f"its key/value layers have {len(heads)} head counts ({', '.join(map(str, sorted(heads)))}), so "
                     "MHA is no one design; compare the kinds apart")
