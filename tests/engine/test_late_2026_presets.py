"""The presets of issue 46 (Kimi Linear vs Gated DeltaNet vs softmax; the retention family): each names mechanisms
and parameters of the catalogue, validates, and runs when made tiny; the story it tells holds in the specs."""
from __future__ import annotations

import pytest
import torch

from attn_core.engine import measure, presets
from attn_core.engine.config import plan
from attn_core.engine.problem import Settings
from attn_core.mechanisms import MEASURED, retention
from attn_core.nn import generation
from attn_core.spec import Shape

NEW = {"Kimi Linear vs Gated DeltaNet vs softmax": ("generate", ["softmax", "gated_deltanet", "kda"]),
       "The retention family": ("forward", ["linear", "mamba2"])}
TINY = Settings(warmup=1, min_repeats=1, min_time_s=0.0, point_budget_s=10.0, measure_memory=False)


@pytest.mark.parametrize("name", list(NEW))
def test_each_new_preset_names_the_catalogue_and_validates(name):
    mode, keys = NEW[name]
    for config in presets.PRESETS[name].for_device("cpu"):
        assert [key for key, _ in config.mechanisms] == keys and config.problem.mode == mode
        for key, params in config.mechanisms:
            assert key in MEASURED and set(params) <= {p.name for p in MEASURED[key].params}
        assert config.problems() == []


@pytest.mark.parametrize("name", list(NEW))
def test_each_new_preset_runs_when_made_tiny(name):
    for config in presets.PRESETS[name].configs:
        tiny = config.replaced(ns=(64,), d_model=32, heads=2)
        for problem in plan(tiny):
            point, _ = measure.measure(MEASURED[problem.mechanism], problem, TINY)
            row = point.to_row()
            assert row["status"] == "ok", row["reason"]


def test_the_generation_preset_s_states_stay_one_size_while_softmax_s_cache_grows():
    (config,) = presets.PRESETS["Kimi Linear vs Gated DeltaNet vs softmax"].configs
    heads, head_dim = config.problem.heads, config.problem.head_dim
    small, large = (Shape(1, heads, n, n, head_dim) for n in (config.ns[0], config.ns[-1]))
    for key in ("gated_deltanet", "kda"):  # d × d a head, float32: 8 heads of 64 → 8·64·64·4 bytes
        assert generation.cache_bytes(key, small) == generation.cache_bytes(key, large) == 8 * 64 * 64 * 4
    assert generation.cache_bytes("softmax", large) == 16 * generation.cache_bytes("softmax", small)  # 16384 / 1024


def test_the_retention_family_costs_what_mamba2_costs():
    """RetNet and lightning run mamba2's very call: the same output as mamba2 given their gates as its state."""
    g = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(1, 2, 64, 16, generator=g) for _ in range(3))
    state = retention.fixed_state(Shape(1, 2, 64, 64, 16), retention.lightning_decays(2))
    torch.testing.assert_close(retention.lightning_attention(q, k, v),
                               MEASURED["mamba2"].fn(q, k, v, causal=True, **state), atol=0, rtol=0)
