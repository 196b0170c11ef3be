"""The catalogue. Adding a mechanism: a file in this folder ending with its `SPEC`, and its name in ORDER.

Mechanisms of your own join it without a file here: `ATTN_CORE_MECHANISMS="mypkg.attn:SPECS"` (comma-separated
'module:attribute' references to a MechanismSpec, or a dict or list of them) adds them in every process, the
dashboard's measuring worker included; `python -m attn_core sweep --extra-mechanisms` adds them to one sweep."""
from __future__ import annotations

import importlib
import os
from typing import Iterable

from ..spec import MechanismSpec

ORDER = ("softmax", "sdpa", "local", "sparse", "sliding_window", "longformer", "bigbird", "linformer",
         "performer", "linear", "reformer", "nystrom", "additive")  # pages' order
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
        specs = value.values() if isinstance(value, dict) else [value] if isinstance(value, MechanismSpec) else value
        if not isinstance(specs, Iterable) or not all(isinstance(s, MechanismSpec) for s in specs):
            raise ValueError(f"extra mechanism {ref!r} is not a MechanismSpec (nor a dict or list of them)")
        found.update({s.key: s for s in specs})
    return found


def refs(text: str) -> tuple[str, ...]:
    return tuple(r.strip() for r in text.split(",") if r.strip())


MECHANISMS: dict[str, MechanismSpec] = {
    spec.key: spec for spec in (importlib.import_module(f".{name}", __name__).SPEC for name in ORDER)}
MECHANISMS.update(load(refs(os.environ.get(ENV, ""))))
