"""The model planner: a model as a stack of attention layer kinds with a count each, and what its attention costs at
a context length: what it remembers (keys and values or latents, which grow with the context; recurrent states,
which do not) per kind and in all, the prefill attention FLOPs, and the bytes a decoded token reads. Every figure
comes from the layer's mechanism spec, the single source of its costs; the built-in models (builtin.py, most read
from their config.json) carry the source of their configuration. Predictions, not measurements: the attention's
cache and FLOPs here; weights.py counts the weights and roofline.py adds them to a decode step and a prefill.

    plan(MODELS["llama-3-8b"], 131072).kv_cache_bytes   # 2 · 32 layers · 8 heads · 128 · 2 bytes · 131,072 = 16 GiB
"""
from __future__ import annotations

import dataclasses
import json
import numbers
from dataclasses import dataclass
from typing import Any, Sequence

import pandas as pd

from attn_core.mechanisms import MEASURED
from attn_core.spec import DTYPE_BYTES, Shape
from attn_core.engine.untrusted import clipped, printable, quoted

MAX_CONTEXT = 1 << 20  # 1,048,576 tokens: the longest context a plan is made for
MAX_SIZE = 1 << 20  # heads, head sizes, windows, ranks and counts above this are typos, not models
MAX_NAME = 80  # characters of a model's or a layer's name (a hybrid's name is made to fit: hybrid_name)
MAX_SOURCE = 600  # characters of a model's source kept from a file
DTYPE_ALIASES = {"bf16": "bfloat16", "fp16": "float16", "fp32": "float32", "fp64": "float64"}
_LAYER_FIELDS = ("name", "mechanism", "count", "heads", "head_dim", "kv_heads", "window", "kv_rank", "rope_dim",
                 "state_dim", "prefill_mechanism")
# Mechanisms whose state per head is (key width) × head_dim, so a layer may set the key width (`state_dim`): the spec's
# bytes, for a head_dim × head_dim state, scale exactly by state_dim / head_dim (linear attention's normaliser is
# key-wide too). Performer's state is as wide as its features instead: its own parameter sets it.
STATE_DIM_KINDS = ("mamba2", "gated_deltanet", "kda", "linear")


@dataclass(frozen=True, kw_only=True)
class Layer:
    """`count` attention layers of one kind: `mechanism` (a key of attn_core.MEASURED) over `heads` query heads of
    `head_dim`, sharing `kv_heads` key/value heads (None: one each). `window`: the tokens a query sees, itself
    included, as model cards give it (Mistral's 4096): the sliding_window mechanism's `window` is one less (|i − j| ≤
    window). `kv_rank`, `rope_dim`: the latent and shared rotary widths of multi-head latent attention.
    `state_dim`: the key side of a recurrent state a head (Mamba-2's d_state), for the kinds of STATE_DIM_KINDS, whose
    state is then state_dim × head_dim a head; None: head_dim, the square state the mechanisms here keep.
    `prefill_mechanism`: where the prompt runs another form of the same layer than decoding does (multi-head latent
    attention: the naive form costs fewer FLOPs over a whole prompt, the absorbed one reads less per new token)."""

    name: str
    mechanism: str
    count: int
    heads: int
    head_dim: int
    kv_heads: int | None = None
    window: int | None = None
    kv_rank: int | None = None
    rope_dim: int | None = None
    state_dim: int | None = None
    prefill_mechanism: str | None = None

    @property
    def params(self) -> dict[str, int]:
        """The mechanism's parameters this layer sets."""
        given = {"window": None if self.window is None else self.window - 1, "kv_rank": self.kv_rank,
                 "rope_dim": self.rope_dim}
        return {k: v for k, v in given.items() if v is not None}

    @property
    def state_width(self) -> int:
        """The key side of the layer's recurrent state a head: `state_dim`, or head_dim."""
        return self.state_dim or self.head_dim

    def shape(self, queries: int, keys: int, batch: int, dtype: str) -> Shape:
        return Shape(batch, self.heads, queries, keys, self.head_dim, dtype=dtype, causal=True, Hk=self.kv_heads)

    def problems(self, where: str = "") -> list[str]:
        """Every reason this layer cannot be planned, each a sentence naming the field; [] when it can."""
        at = f"{where}: " if where else ""
        found = [f"{at}{name} must be a whole number from 1 to {MAX_SIZE:,}, got {quoted(getattr(self, name))}"
                 for name in ("count", "heads", "head_dim", "kv_heads", "window", "kv_rank", "rope_dim", "state_dim")
                 if (getattr(self, name) is not None or name in ("count", "heads", "head_dim"))
                 and not _size(getattr(self, name))]
        if not _name_fits(self.name):
            found.append(f"{at}name must be a text of 1 to {MAX_NAME} characters")
        spec = MEASURED.get(self.mechanism) if isinstance(self.mechanism, str) else None
        for name in ("mechanism", "prefill_mechanism"):
            key = getattr(self, name)
            if (key is not None or name == "mechanism") and not (isinstance(key, str) and key in MEASURED):
                found.append(f"{at}{name} {quoted(str(key))} is not one this build knows; choose one of "
                             f"{', '.join(MEASURED)}")
        if found:
            return found
        if self.kv_heads is not None and self.heads % self.kv_heads:
            found.append(f"{at}kv_heads {self.kv_heads} does not divide the {self.heads} heads; choose a divisor")
        if self.window is not None and "window" not in spec.defaults:
            found.append(f"{at}window is set, but {spec.label} takes no window; remove it or choose sliding_window")
        for name in ("kv_rank", "rope_dim"):
            if getattr(self, name) is not None and name not in spec.defaults:
                found.append(f"{at}{name} is set, but {spec.label} has no latent; remove it or choose mla")
        if self.state_dim is not None and self.mechanism not in STATE_DIM_KINDS:
            found.append(f"{at}state_dim is set, but {spec.label} keeps no state of a width to set; remove it or "
                         f"choose {', '.join(STATE_DIM_KINDS)}")
        if spec.supports.generation is None:
            found.append(f"{at}{spec.label} cannot generate token by token, so no cache can be planned for it")
        if not found:
            try:
                spec.check(self.shape(1, 1, 1, "float32"), self.params)
            except ValueError as e:
                found.append(f"{at}{e}")
        return found


@dataclass(frozen=True, kw_only=True)
class Model:
    """A model's attention: its `layers` (kinds with counts), the `dtype` its cache is held in, the longest context
    it was trained for (`max_context`), and where its configuration comes from (`source`)."""

    name: str
    layers: tuple[Layer, ...]
    dtype: str = "bfloat16"
    max_context: int = 131072
    source: str = ""

    @property
    def layer_count(self) -> int:
        return sum(layer.count for layer in self.layers)

    def problems(self) -> list[str]:
        """Every reason this model cannot be planned, each a sentence naming the field; [] when it can."""
        found = []
        if not _name_fits(self.name):
            found.append(f"name must be a text of 1 to {MAX_NAME} characters")
        if _dtype(self.dtype) is None:
            found.append(f"dtype {quoted(str(self.dtype), 20)} is unknown; choose {', '.join(DTYPE_BYTES)}")
        if not _size(self.max_context, MAX_CONTEXT * 16):
            found.append(f"max_context must be a whole number of tokens from 1 to {MAX_CONTEXT * 16:,}, got "
                         f"{quoted(self.max_context)}")
        if not isinstance(self.layers, tuple) or not self.layers:
            return found + ["layers must list at least one kind of layer"]
        for i, layer in enumerate(self.layers):
            found += layer.problems(f"layers[{i}] ({clipped(printable(layer.name), 40)})")
            if _size(self.max_context, MAX_CONTEXT * 16) and _size(layer.window) and layer.window > self.max_context:
                found.append(f"layers[{i}]: window {layer.window:,} is longer than the model's context "
                             f"{self.max_context:,}; a window cannot exceed the context")
        return found

    def to_json(self) -> str:
        """The model as a small JSON file (`from_json` reads it back)."""
        layers = [{k: v for k, v in dataclasses.asdict(layer).items() if v is not None} for layer in self.layers]
        return json.dumps({"name": self.name, "source": self.source, "dtype": self.dtype,
                           "max_context": self.max_context, "layers": layers}, indent=2)

    @classmethod
    def from_json(cls, text: str) -> "Model":
        """A model from its JSON text; ValueError with every sentence naming a field that cannot be used."""
        try:
            data = json.loads(text)
        except (ValueError, RecursionError) as e:
            raise ValueError(f"this is not a model file: it is not JSON ({clipped(printable(e), 80)})") from None
        if not isinstance(data, dict) or not isinstance(data.get("layers"), list):
            raise ValueError("a model file is a JSON object with a list of 'layers'; see Model.to_json")
        unknown = set(data) - {"name", "source", "dtype", "max_context", "layers"}
        rows = data["layers"][:64]
        bad = [f"layers[{i}] must be an object" for i, row in enumerate(rows) if not isinstance(row, dict)]
        bad += [f"layers[{i}] has no field {quoted(k, 30)}; its fields are {', '.join(_LAYER_FIELDS)}"
                for i, row in enumerate(rows) if isinstance(row, dict) for k in row if k not in _LAYER_FIELDS]
        bad += [f"layers[{i}] lacks {k}" for i, row in enumerate(rows) if isinstance(row, dict)
                for k in ("name", "mechanism", "count", "heads", "head_dim") if k not in row]
        if unknown:
            bad.append(f"the model has no field {', '.join(sorted(quoted(k, 30) for k in unknown))}")
        if len(data["layers"]) > 64:
            bad.append("a model lists at most 64 kinds of layer")
        if bad:
            raise ValueError("; ".join(bad))
        model = cls(name=_text(data.get("name", "my model")), source=clipped(printable(data.get("source", "")),
                                                                                MAX_SOURCE),
                    dtype=data.get("dtype", "bfloat16"), max_context=data.get("max_context", 131072),
                    layers=tuple(Layer(**{**row, "name": _text(row["name"])}) for row in rows))
        if found := model.problems():
            raise ValueError("; ".join(found))
        return model


@dataclass(frozen=True)
class LayerPlan:
    """One kind's figures at the plan's context: what one of its layers holds (`kind`: 'kv' for keys and values or
    latents, which grow with the context; 'state' for a fixed-size recurrent state), those of all `count`, the
    prefill attention FLOPs of all (causal, the useful work of the spec), and the bytes a new token reads."""

    layer: Layer
    kind: str
    bytes_per_layer: float
    cache_bytes: float
    prefill_flops: float
    decode_bytes: float


@dataclass(frozen=True)
class Plan:
    """A model at `context` tokens of `batch` sequences, its cache in `dtype`: per kind and in all."""

    model: Model
    context: int
    batch: int
    dtype: str
    kinds: tuple[LayerPlan, ...]
    notes: tuple[str, ...] = ()

    @property
    def kv_cache_bytes(self) -> float:
        """Keys and values, or latents, of every layer that keeps them per token."""
        return sum(k.cache_bytes for k in self.kinds if k.kind == "kv")

    @property
    def state_bytes(self) -> float:
        """The recurrent states of every layer that keeps a fixed-size one."""
        return sum(k.cache_bytes for k in self.kinds if k.kind == "state")

    @property
    def total_bytes(self) -> float:
        return self.kv_cache_bytes + self.state_bytes

    @property
    def prefill_flops(self) -> float:
        return sum(k.prefill_flops for k in self.kinds)

    @property
    def decode_bytes(self) -> float:
        """Bytes the attention of one new token reads: every cache and state, whole."""
        return sum(k.decode_bytes for k in self.kinds)

    def fits(self, memory_bytes: float) -> bool:
        return self.total_bytes <= memory_bytes

    def as_dict(self) -> dict[str, Any]:
        """The plan as plain data (the CLI's --json): the inputs, the totals, and each kind."""
        return {"model": self.model.name, "source": self.model.source, "context": self.context, "batch": self.batch,
                "dtype": self.dtype, "layer_count": self.model.layer_count, "kv_cache_bytes": self.kv_cache_bytes,
                "state_bytes": self.state_bytes, "total_bytes": self.total_bytes,
                "prefill_attention_flops": self.prefill_flops, "decode_bytes_per_token": self.decode_bytes,
                "layers": [{**{k: v for k, v in dataclasses.asdict(p.layer).items() if v is not None},
                            "kind": p.kind, "bytes_per_layer": p.bytes_per_layer, "cache_bytes": p.cache_bytes,
                            "prefill_attention_flops": p.prefill_flops, "decode_bytes_per_token": p.decode_bytes}
                           for p in self.kinds],
                "notes": list(self.notes)}


def plan(model: Model, context: int, *, batch: int = 1, dtype: str | None = None) -> Plan:
    """`model` at `context` tokens (1 … MAX_CONTEXT) for `batch` sequences, the cache in `dtype` (None: the model's;
    bf16, fp16 and fp32 are understood). ValueError with a sentence per field that cannot be used."""
    found = model.problems()
    if not _size(context, MAX_CONTEXT):
        found.append(f"context must be a whole number of tokens from 1 to {MAX_CONTEXT:,}, got {quoted(context)}")
    if not _size(batch, 1 << 16):
        found.append(f"batch must be a whole number from 1 to {1 << 16:,}, got {quoted(batch)}")
    name = _dtype(model.dtype if dtype is None else dtype)
    if name is None:
        found.append(f"dtype {quoted(str(dtype), 20)} is unknown; choose "
                     f"{', '.join([*DTYPE_BYTES, *DTYPE_ALIASES])}")
    if found:
        raise ValueError("; ".join(found))
    kinds = tuple(_kind(layer, context, batch, name) for layer in model.layers)
    notes = []
    if context > model.max_context:
        notes.append(f"{context:,} tokens is past the {model.max_context:,} the model was trained for: the figures "
                     "are what its attention would hold, not a promise that it works there")
    notes += [f"{layer.name}: its {layer.head_dim} × {layer.state_width} state a head is counted in the bytes; its "
              f"prefill FLOPs are the {layer.mechanism} kernel's, which keeps a {layer.head_dim} × {layer.head_dim} "
              "one" for layer in model.layers if layer.state_width != layer.head_dim]
    notes.append("predicted from the specs' cost models, not measured: the cache and the attention's FLOPs; the "
                 "weights and MLPs are counted apart (the weights line of a config.json, and --gpu's roofline)")
    return Plan(model, context, batch, name, kinds, tuple(notes))


def _kind(layer: Layer, context: int, batch: int, dtype: str) -> LayerPlan:
    spec = MEASURED[layer.mechanism]
    gen, params = spec.supports.generation, spec.resolved(layer.params)
    held = float(gen.cache_bytes(layer.shape(1, context, batch, dtype), **params))
    one, two = (gen.cache_bytes(layer.shape(1, n, batch, dtype), **params) for n in (1, 2))
    kind = "kv" if two > one else "state"  # a cache that grows by a token's entries, or a fixed-size state
    held *= layer.state_width / layer.head_dim  # the spec's state is head_dim wide on the key side too
    prefill = MEASURED[layer.prefill_mechanism or layer.mechanism]
    flops = float(prefill.cost.flops(layer.shape(context, context, batch, dtype), **prefill.resolved(layer.params)))
    return LayerPlan(layer, kind, held, held * layer.count, flops * layer.count, held * layer.count)


def curves(models: Sequence[Model], contexts: Sequence[int], *, batch: int = 1,
           dtype: str | None = None) -> pd.DataFrame:
    """Each model's totals at each context, for a chart: DataFrame[mechanism (the model's key), label, n,
    cache_bytes (keys and values, or latents, plus states), kv_cache_bytes, state_bytes, prefill_flops, status]."""
    rows = []
    for model in models:
        for n in contexts:
            made = plan(model, n, batch=batch, dtype=dtype)
            rows.append({"mechanism": model.name.lower(), "label": model.name, "n": n, "cache_bytes": made.total_bytes,
                         "kv_cache_bytes": made.kv_cache_bytes, "state_bytes": made.state_bytes,
                         "prefill_flops": made.prefill_flops, "status": "ok"})
    return pd.DataFrame(rows)


def kinds_table(made: Plan) -> pd.DataFrame:
    """One row per layer kind of a plan, for a table."""
    return pd.DataFrame([{"layers": p.layer.name, "mechanism": p.layer.mechanism, "count": p.layer.count,
                          "holds": "keys and values" if p.kind == "kv" else "recurrent state",
                          "bytes a layer": p.bytes_per_layer, "bytes in all": p.cache_bytes,
                          "prefill FLOPs": p.prefill_flops} for p in made.kinds])


def hybrid(model: Model, share: float, mechanism: str = "gated_deltanet") -> Model:
    """`model` with `share` (0 … 1) of its layers of the first kind turned into `mechanism` layers of the same heads
    and head dim (a linear-attention hybrid: Qwen3-Next keeps 1 full layer in 4, so share 0.75), rounded to whole
    layers. The first kind stays first; the new kind is listed after it. Named by `hybrid_name`."""
    if isinstance(share, bool) or not isinstance(share, (int, float)) or not 0 <= share <= 1:
        raise ValueError(f"share must be a fraction from 0 to 1 of the layers, got {quoted(share)}")
    if not isinstance(mechanism, str) or mechanism not in MEASURED:
        raise ValueError(f"mechanism {quoted(mechanism)} is not one this build knows; choose one of "
                         f"{', '.join(MEASURED)}")
    first, *rest = model.layers
    turned = round(first.count * share)
    kinds = [dataclasses.replace(first, count=first.count - turned)] if turned < first.count else []
    if turned:
        kinds.append(Layer(name=MEASURED[mechanism].label, mechanism=mechanism, count=turned, heads=first.heads,
                           head_dim=first.head_dim, kv_heads=first.kv_heads))
    made = dataclasses.replace(model, name=hybrid_name(model.name, first, turned, mechanism),
                               layers=tuple(kinds + rest))
    if found := made.problems():
        raise ValueError("; ".join(found))
    return made


def hybrid_name(name: str, first: Layer, turned: int, mechanism: str) -> str:
    """'Llama-3-8B (24 of 32 full attention → gated_deltanet)', within MAX_NAME characters whatever the names: past
    it, the first kind's name is cut to 20 characters, then the model's to what is left (each ending "…"), so every
    model that can be planned has a hybrid that can."""
    def said(layer: str) -> str:
        return f" ({turned} of {first.count} {layer} → {mechanism})"

    layer = first.name if len(name) + len(said(first.name)) <= MAX_NAME else clipped(first.name, 20)
    return clipped(name, MAX_NAME - len(said(layer))) + said(layer)


def crossover(a: Model, b: Model, *, batch: int = 1, dtype: str | None = None) -> int | None:
    """The shortest context from which `a` holds no more than `b` (caches and states together), or None when `a`
    holds more at MAX_CONTEXT. Checked at every power of two, then bisected after the last one where `a` held more
    (between powers the totals are straight lines or flat, past a window)."""
    def smaller(n: int) -> bool:
        return plan(a, n, batch=batch, dtype=dtype).total_bytes <= plan(b, n, batch=batch, dtype=dtype).total_bytes

    powers = [1 << k for k in range(MAX_CONTEXT.bit_length())]
    if not smaller(MAX_CONTEXT):
        return None
    larger = [n for n in powers if not smaller(n)]
    if not larger:
        return 1
    low, high = larger[-1], 2 * larger[-1]  # smaller(high) holds, smaller(low) does not
    while high - low > 1:
        mid = (low + high) // 2
        low, high = (low, mid) if smaller(mid) else (mid, high)
    return high


_WHOLE_FIELDS = ("count", "heads", "head_dim", "kv_heads", "window", "kv_rank", "rope_dim", "state_dim")


def layers_frame(model: Model) -> pd.DataFrame:
    """The model's layer kinds as a table to edit: a row per kind, a column per Layer field, blank where unset (the
    size columns nullable whole numbers). `from_rows` reads it back."""
    frame = pd.DataFrame([{f: getattr(layer, f) for f in _LAYER_FIELDS} for layer in model.layers],
                         columns=list(_LAYER_FIELDS))
    return frame.astype({f: "Int64" for f in _WHOLE_FIELDS})


def from_rows(rows: Sequence[dict[str, Any]], *, name: str, dtype: str = "bfloat16", max_context: int = 131072,
              source: str = "") -> Model:
    """A model from table rows (layers_frame's columns, as an editor gives them back): a blank cell is an unset
    field, a whole float a whole number, other keys ignored. ValueError with every sentence of Model.problems (each
    naming the field) when the model cannot be planned."""
    bad = ["a model lists at most 64 kinds of layer"] if len(rows) > 64 else []
    layers = tuple(Layer(**{f: _cell(row.get(f)) for f in _LAYER_FIELDS}) for row in rows[:64])
    model = Model(name=_cell(name), layers=layers, dtype=_cell(dtype), max_context=_cell(max_context), source=source)
    if found := bad + model.problems():
        raise ValueError("; ".join(found))
    return model


def _cell(value: Any) -> Any:
    """A table cell as a field's value: None for a blank (None, NaN, pandas' NA, empty text), int for a whole number
    of any numeric type; anything else as it is, for Model.problems to name."""
    if isinstance(value, str):
        return value.strip() or None
    try:
        if pd.isna(value):
            return None
    except (TypeError, ValueError):  # a list or another value without one truth
        return value
    if isinstance(value, numbers.Integral) and not isinstance(value, bool):
        return int(value)
    if isinstance(value, numbers.Real) and not isinstance(value, bool) and float(value).is_integer():
        return int(value)
    return value


def find(name: str) -> Model:
    """A built-in model by name, case-insensitive ('Llama-3-8B', 'llama-3-8b'); ValueError listing them otherwise."""
    from attn_core.studies.planner.builtin import MODELS

    key = str(name).strip().lower()
    if key not in MODELS:
        raise ValueError(f"no built-in model {quoted(str(name))}; choose one of {', '.join(MODELS)}, or a model file")
    return MODELS[key]


def __getattr__(name: str) -> Any:
    """`MODELS`, the built-in models, from builtin.py: most are read from their config.json by hf_config, which
    stands on this module, so they are imported when first asked for (PEP 562)."""
    if name == "MODELS":
        from attn_core.studies.planner.builtin import MODELS

        return MODELS
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def _name_fits(name: Any) -> bool:
    return isinstance(name, str) and bool(name.strip()) and len(name) <= MAX_NAME


def _text(value: Any) -> Any:
    """A name from a file with its control characters written as escapes (`printable`): shown on a terminal, in a
    chart or a table, it is text. A name that fits MAX_NAME still does (the escapes cut to it); a longer one, and
    anything but text, is left for `problems` to name."""
    if not isinstance(value, str):
        return value
    return clipped(printable(value), MAX_NAME) if len(value) <= MAX_NAME else printable(value)


def _size(value: Any, high: int = MAX_SIZE) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and 1 <= value <= high


def _dtype(name: Any) -> str | None:
    if not isinstance(name, str):
        return None
    name = DTYPE_ALIASES.get(name.lower(), name.lower())
    return name if name in DTYPE_BYTES else None


NEW_MODEL = Model(name="My model", max_context=8192,
                  layers=(Layer(name="attention", mechanism="sdpa", count=1, heads=8, head_dim=64),))  # a start

