"""A new mechanism is one file: a copy of each file of the catalogue, registered under a new key through the plugin
door (tests/copies.py), passes the registry-wide tests as its original does, generation included. So no mechanism
writes its own key where the registry's belongs."""
from __future__ import annotations

import os
import subprocess
import sys
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest

from attn_core import mechanisms
from tests import copies

ROOT = Path(__file__).parents[2]
# The test modules parametrized over the registry (ac.MECHANISMS), each case's id naming its mechanism.
REGISTRY_WIDE = ("contract/test_mechanisms.py", "nn/test_generation.py", "contract/test_padding.py", "insight/test_effective.py", "nn/test_layers.py",
                 "engine/test_hardening_library.py", "nn/test_generate_mode.py")
# Left out for the copies: test_spec_memory_matches_an_independent_allocator_reading, which reads the allocator's
# peak of each forward call (minutes over thirteen copies, most of it additive's profile) against the same cost
# functions the originals' run checks; a copy's costs are still checked (test_spec_costs_are_positive_and_grow...).
SELECT = f"{copies.PREFIX} and not allocator_reading"


def test_the_catalogue_stamps_each_spec_with_its_registry_key():
    assert {key: spec.key for key, spec in mechanisms.MECHANISMS.items()} == {k: k for k in mechanisms.MECHANISMS}
    loaded = mechanisms.load([copies.REF])
    assert set(loaded) == {copies.PREFIX + name for name in mechanisms.ORDER}
    for key, spec in loaded.items():
        assert spec.key == key and spec.fn.__module__ == f"attn_core.mechanisms.{key}"  # its own module
        assert copies.COPIES[key].key == ""  # the file names itself nowhere


def test_a_bare_spec_without_a_key_is_refused_with_a_sentence():
    with pytest.raises(ValueError, match="holds a spec without a key .*name it in a dict"):
        mechanisms.load(["attn_core.mechanisms.softmax:SPEC"])


def test_a_copy_of_every_mechanism_file_under_a_new_key_passes_the_registry_wide_tests(tmp_path):
    report = tmp_path / "copies.xml"
    env = {**os.environ, mechanisms.ENV: copies.REF, "PYTHONPATH": str(ROOT)}
    run = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-k", SELECT,
                          f"--junitxml={report}", *(f"tests/{name}" for name in REGISTRY_WIDE)],
                         cwd=ROOT, env=env, capture_output=True, text=True, timeout=900)
    assert run.returncode == 0, run.stdout[-6000:] + run.stderr[-2000:]
    cases = [case.get("name") for case in ET.parse(report).iter("testcase")]
    for name in mechanisms.ORDER:  # each copy ran: the selection did not come up empty
        assert sum(f"{copies.PREFIX}{name}" in case for case in cases) >= 5, name
    generated = [case for case in cases if case.startswith("test_prefill_then_steps_equal_the_causal_forward_pass")]
    assert any(f"{copies.PREFIX}performer" in case for case in generated)
