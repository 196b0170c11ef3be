"""A Hugging Face config's fields read with a check each (Fields), and what the readers make of them: each layer's
token mixer (Mixer) and the config read once (Reading)."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from attn_core.studies.planner.model import MAX_SIZE
from attn_core.engine.untrusted import quoted

MAX_LAYERS = 16384  # no published model has more than a few hundred layers
MAX_VOCAB = 1 << 24
SHOWN = 40  # characters of a value quoted back in a message
_MISSING = object()


class Fields:
    """The fields of one config object (`where`: its path, e.g. "text_config."), read with a check each: a wrong type,
    a size out of range or a missing field raises ValueError naming the field; a default used is noted."""

    def __init__(self, data: dict, where: str, family: str, notes: list[str]):
        self.data, self.where, self.family, self.notes = data, where, family, notes

    def has(self, name: str) -> bool:
        return self.data.get(name) is not None

    def _get(self, name: str, default: Any) -> Any:
        if self.has(name):
            return self.data[name]
        if default is _MISSING:
            raise ValueError(f"{self.where}{name} is missing; a {self.family} config needs it")
        if default is not None:
            self.notes.append(f"{self.where}{name} is not given: {default!r} used, as transformers does")
        return default

    def whole(self, name: str, default: Any = _MISSING, *, low: int = 1, high: int = MAX_SIZE) -> int:
        value = self._get(name, default)
        if not (isinstance(value, int) and not isinstance(value, bool) and low <= value <= high):
            raise ValueError(f"{self.where}{name} must be a whole number from {low:,} to {high:,}, got "
                             f"{quoted(value, SHOWN)}")
        return value

    def maybe(self, name: str, *, low: int = 1, high: int = MAX_SIZE) -> int | None:
        """A size that may be absent or null (a window, a rank): None then."""
        return self.whole(name, low=low, high=high) if self.has(name) else None

    def flag(self, name: str, default: bool) -> bool:
        value = self.data[name] if self.has(name) else default
        if not isinstance(value, bool):
            raise ValueError(f"{self.where}{name} must be true or false, got {quoted(value, SHOWN)}")
        return value

    def text(self, name: str, default: Any = _MISSING) -> str:
        value = self._get(name, default)
        if not isinstance(value, str) or not 0 < len(value) <= 4096:
            raise ValueError(f"{self.where}{name} must be a text, got {quoted(value, SHOWN)}")
        return value

    def kinds(self, name: str, length: int, allowed: tuple[str, ...]) -> list[str]:
        """A list of `length` texts, each one of `allowed` (layer_types)."""
        value = self.data[name]
        if not isinstance(value, list) or len(value) != length:
            raise ValueError(f"{self.where}{name} must list one kind for each of the {length} layers, got "
                             f"{_length(value)}")
        for i, kind in enumerate(value):
            if kind not in allowed:
                raise ValueError(f"{self.where}{name}[{i}] is {quoted(kind, SHOWN)}, not a kind this reader knows; "
                                 f"a {self.family} layer is one of {', '.join(allowed)}")
        return value

    def indices(self, name: str, low: int, high: int, default: Any = _MISSING) -> list[int]:
        """A list of distinct whole numbers from low to high (layer indices)."""
        value = self._get(name, default)
        if not isinstance(value, list) or len(value) > MAX_LAYERS:
            raise ValueError(f"{self.where}{name} must be a list of layer numbers, got {quoted(value, SHOWN)}")
        for i, item in enumerate(value):
            if not (isinstance(item, int) and not isinstance(item, bool) and low <= item <= high):
                raise ValueError(f"{self.where}{name}[{i}] must be a layer number from {low} to {high}, got "
                                 f"{quoted(item, SHOWN)}")
        if len(set(value)) != len(value):
            raise ValueError(f"{self.where}{name} lists a layer twice")
        return value

    def sub(self, name: str, default: Any = _MISSING) -> "Fields":
        value = self._get(name, default)
        if not isinstance(value, dict):
            raise ValueError(f"{self.where}{name} must be a JSON object, got {quoted(value, SHOWN)}")
        return Fields(value, f"{self.where}{name}.", self.family, self.notes)

    def attention_heads(self) -> tuple[int, int, int]:
        """(query heads, key/value heads, head_dim), the first dividing by the second."""
        heads = self.whole("num_attention_heads")
        kv = self.whole("num_key_value_heads", heads)
        if heads % kv:
            raise ValueError(f"{self.where}num_key_value_heads {kv} does not divide num_attention_heads {heads}")
        if self.has("head_dim"):
            return heads, kv, self.whole("head_dim")
        hidden = self.whole("hidden_size")
        if hidden % heads:
            raise ValueError(f"{self.where}head_dim is missing and hidden_size {hidden} does not divide by "
                             f"num_attention_heads {heads}")
        return heads, kv, hidden // heads


def _length(value: Any) -> str:
    return f"{len(value)} entries" if isinstance(value, list) else quoted(value, SHOWN)


@dataclass(frozen=True)
class Mixer:
    """One layer's token mixer as the config gives it. `kind`: 'attention' (softmax over every cached token, or the
    last `window`, or its own chunk of `chunk`), 'mla', 'gated_deltanet', 'kda', 'mamba2', 'mamba' (Mamba-1) or
    'lightning'. Recurrent kinds: `heads` value heads of `head_dim`, `key_heads` of `key_dim` (a state is
    key_dim × head_dim a head); `conv` the short convolution's kernel over `conv_channels`. MLA: the ranks and widths
    of DeepSeek-V2's names; `index_heads`, `index_dim`: DeepSeek-V3.2's lightning indexer."""

    kind: str
    heads: int
    head_dim: int
    kv_heads: int | None = None
    window: int | None = None
    chunk: int | None = None
    gated: bool = False  # Qwen3-Next's attention: q_proj also makes an output gate
    sinks: bool = False  # gpt-oss: a learned logit a head in each softmax
    qk_norm: bool = False
    bias: bool = False
    key_heads: int | None = None
    key_dim: int | None = None
    groups: int | None = None
    dt_rank: int | None = None
    conv: int | None = None
    conv_channels: int | None = None
    q_rank: int | None = None
    kv_rank: int | None = None
    rope_dim: int | None = None
    nope_dim: int | None = None
    v_dim: int | None = None
    index_heads: int | None = None
    index_dim: int | None = None


@dataclass(frozen=True)
class Reading:
    """A config read once: its family (model_type), the fields (the text model's), each layer's mixers in order
    (Falcon-H1's layers have two), and what was noted on the way."""

    family: str
    fields: Fields
    layers: tuple[tuple[Mixer, ...], ...]
    pattern: str | None  # Nemotron-H's hybrid_override_pattern (it also says which layers have an MLP)
    max_context: int  # max_position_embeddings
    notes: tuple[str, ...]

