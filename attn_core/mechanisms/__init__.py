"""The catalogue. Adding a mechanism: a file in this folder ending with its `SPEC`, and its name in ORDER.

The catalogue is the single source of a mechanism's key: each file's SPEC is stamped with the name it is registered
under (a file names itself nowhere), so a copy of a file registered under another name is that other mechanism.

Mechanisms of your own join it without a file here: `ATTN_CORE_MECHANISMS="mypkg.attn:SPECS"` (comma-separated
'module:attribute' references to a MechanismSpec, or a dict or list of them) adds them in every process, the
dashboard's measuring worker included; `python -m attn_core sweep --extra-mechanisms` adds them to one sweep. A dict's
keys are the registry keys; a bare spec or a list keeps each spec's own `key`."""
from __future__ import annotations

import dataclasses
import importlib
import os
from collections.abc import Iterable, Iterator, Mapping

from ..spec import MechanismSpec

ORDER = ("softmax", "sdpa", "local", "sparse", "sliding_window", "longformer", "bigbird", "linformer",
         "performer", "linear", "reformer", "nystrom", "additive", "differential", "sigmoid", "mamba2",
         "gated_deltanet", "kda", "topk", "nsa")  # pages' order
ENV = "ATTN_CORE_MECHANISMS"


def load(refs: Iterable[str]) -> dict[str, MechanismSpec]:
    """Specs named by importable 'module:attribute' references (their functions must live at module level, so the
    worker can import them too); ValueError with a sentence for a reference that does not resolve."""
    found: dict[str, MechanismSpec] = {}
    for ref in refs:
        module, _, attribute = ref.partition(":")
        try:
            value = getattr(importlib.import_module(module), attribute)
        except (ImportError, AttributeError, ValueError) as e:
            raise ValueError(f"extra mechanism {ref!r} cannot be imported ({e}); give it as module:attribute") from None
        found.update({key: registered(spec, key) for key, spec in _named(ref, value)})
    return found


def _named(ref: str, value: object) -> list[tuple[str, MechanismSpec]]:
    """(registry key, spec) pairs of what `ref` names: a dict's keys, or each spec's own key."""
    if isinstance(value, dict):
        named = list(value.items())
    elif isinstance(value, MechanismSpec):
        named = [(value.key, value)]
    else:
        named = [(getattr(s, "key", None), s) for s in value] if isinstance(value, Iterable) else [(None, value)]
    if not all(isinstance(s, MechanismSpec) for _, s in named):
        raise ValueError(f"extra mechanism {ref!r} is not a MechanismSpec (nor a dict or list of them)")
    for key, spec in named:
        if not isinstance(key, str) or not key:
            raise ValueError(f"extra mechanism {ref!r} holds a spec without a key ({spec.label}); give it key=..., "
                             f"or name it in a dict {{key: spec}}")
    return named


def registered(spec: MechanismSpec, key: str) -> MechanismSpec:
    """`spec` under the registry key `key`: the one place a mechanism's key is written."""
    return spec if spec.key == key else dataclasses.replace(spec, key=key)


def refs(text: str) -> tuple[str, ...]:
    return tuple(r.strip() for r in text.split(",") if r.strip())


MECHANISMS: dict[str, MechanismSpec] = {
    name: registered(importlib.import_module(f".{name}", __name__).SPEC, name) for name in ORDER}
MECHANISMS.update(load(refs(os.environ.get(ENV, ""))))

# Multi-head latent attention's two computations (mla.py). They attend over cached latents, not over q, k and v
# (spec.operands), so `attention` and the pages that draw q, k and v leave them out; the engine, its pages and the
# CLI measure them beside the mechanisms.
LATENT = {"mla": "SPEC", "mla_naive": "NAIVE"}
_LATENT_SPECS = {key: registered(getattr(importlib.import_module(".mla", __name__), name), key)
                 for key, name in LATENT.items()}


class _Measured(Mapping[str, MechanismSpec]):
    """MECHANISMS, then multi-head latent attention's cores: a live view, so a mechanism added to the catalogue
    later (a test's, a plugin's) is measured too."""

    def __getitem__(self, key: str) -> MechanismSpec:
        return MECHANISMS[key] if key in MECHANISMS else _LATENT_SPECS[key]

    def __iter__(self) -> Iterator[str]:
        yield from MECHANISMS
        yield from (key for key in _LATENT_SPECS if key not in MECHANISMS)

    def __len__(self) -> int:
        return len(MECHANISMS) + sum(key not in MECHANISMS for key in _LATENT_SPECS)


MEASURED: Mapping[str, MechanismSpec] = _Measured()
