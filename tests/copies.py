"""Every mechanism file of the catalogue copied under a new key, "copy_of_<key>": the same source loaded as the module
attn_core.mechanisms.copy_of_<key> (so its relative imports resolve), registered through the plugin door,
ATTN_CORE_MECHANISMS="tests.copies:COPIES". A mechanism is one file: each copy must pass the registry-wide tests as
its original does (tests/contract/test_copies.py)."""
from __future__ import annotations

import functools
import importlib.util
import sys
from pathlib import Path
from typing import Any

PREFIX = "copy_of_"
REF = "tests.copies:COPIES"


def original(key: str) -> str:
    """The catalogue key a copy's key was made from; any other key as it is."""
    return key.removeprefix(PREFIX)


def with_copies(table: dict[str, Any]) -> dict[str, Any]:
    """A test's table keyed by mechanism (its small settings, its reference) with, for each copy in the registry, the
    entry of the mechanism it copies: a copy is tested as its original is."""
    from attn_core import MECHANISMS

    return {**table, **{key: table[original(key)] for key in MECHANISMS
                        if key.startswith(PREFIX) and original(key) in table}}


def _copy(name: str):
    """The SPEC of mechanism file `name`.py executed afresh as the module attn_core.mechanisms.copy_of_<name>."""
    from attn_core import mechanisms

    module_name = f"{mechanisms.__name__}.{PREFIX}{name}"
    found = importlib.util.spec_from_file_location(module_name, Path(mechanisms.__file__).with_name(f"{name}.py"))
    module = importlib.util.module_from_spec(found)
    sys.modules[module_name] = module  # before it runs: its dataclasses and a worker's unpickling look it up there
    found.loader.exec_module(module)
    return module.SPEC


@functools.cache
def _copies() -> dict:
    from attn_core.mechanisms import ORDER

    return {PREFIX + name: _copy(name) for name in ORDER}


def __getattr__(name: str):
    """COPIES, built when first asked for (by the catalogue, reading ATTN_CORE_MECHANISMS), not on import: a test
    module imports `with_copies` from here without loading thirteen modules."""
    if name == "COPIES":
        return _copies()
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
