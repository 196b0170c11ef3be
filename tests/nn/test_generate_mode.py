"""Measuring generation: the engine's "generate" mode times one step against the cache of n tokens and reads the
cache's bytes from its tensors; the sweep, the CLI, the charts and the presets carry the mode through."""
from __future__ import annotations

import dataclasses
import json

import pandas as pd
import pytest
import torch

import attn_core as ac
from attn_core.nn import generation as gen
from attn_core.charts import scaling
from attn_core.engine import analysis, presets
from attn_core.engine.config import SweepConfig
from attn_core.engine import measure
from attn_core.engine.measurement import Summary, theory_of, unmeasured
from attn_core.engine.problem import Problem, Settings
from attn_core.spec import Shape
from tests.cli.test_cli import TINY, run_main
from tests.fake_mechanisms import private_sweep_lock  # noqa: F401 (an autouse fixture)

QUICK = Settings(warmup=1, min_repeats=3, min_time_s=0.0, point_budget_s=30.0)
GENERATES = [key for key, spec in ac.MECHANISMS.items() if spec.supports.generation is not None]


def generate_case(key: str, n: int, params: tuple = (), **problem) -> Problem:
    return Problem(mechanism=key, params=params, n=n, batch=1, heads=2, d_model=32, mode="generate", **problem)


def measure_case(spec, problem, settings):
    point, elapsed = measure.measure(spec, problem, settings)
    return point.to_row(), elapsed


@pytest.mark.parametrize("key", GENERATES)
def test_a_generate_point_times_a_step_and_reads_the_cache_bytes(key):
    case = generate_case(key, 300)
    row, _ = measure_case(ac.MECHANISMS[key], case, QUICK)
    assert row["status"] == "ok", row["reason"]
    assert row["mode"] == "generate" and row["causal"] is True
    assert row["repeats"] >= 3 and row["time_median_s"] > 0
    shape = Shape(1, 2, 300, 300, 16, causal=True)
    assert row["peak_bytes"] == row["predicted_bytes"] == gen.cache_bytes(key, shape)
    assert row["memory_method"] == "cache tensors held (exact)"
    assert row["theory_flops"] == ac.MECHANISMS[key].supports.generation.flops(shape, **ac.MECHANISMS[key].defaults)


def test_a_key_value_cache_doubles_with_the_context_and_a_fixed_state_does_not():
    def cache(key, n):
        return measure_case(ac.MECHANISMS[key], generate_case(key, n), QUICK)[0]["peak_bytes"]
    assert cache("softmax", 512) == 2 * cache("softmax", 256) == 2 * 2 * 2 * 256 * 16 * 4  # K and V, 2 heads
    assert cache("linear", 512) == cache("linear", 256)
    assert cache("sliding_window", 4096) == cache("sliding_window", 2048)


def test_a_step_costs_two_flops_per_cached_number_unless_its_spec_says_otherwise():
    shape = Shape(1, 8, 1, 4096, 64, causal=True)
    assert gen_flops("softmax", shape) == 4 * 8 * 4096 * 64  # q·k and p·v over 4096 cached tokens
    assert gen_flops("linear", shape) == 8 * (4 * 64 * 64 + 3 * 64)  # whatever the context
    assert gen_flops("linear", Shape(1, 8, 1, 65536, 64, causal=True)) == gen_flops("linear", shape)


def gen_flops(key, shape):
    return ac.MECHANISMS[key].supports.generation.flops(shape, **ac.MECHANISMS[key].defaults)


def test_rewinding_puts_every_step_at_the_same_context():
    g = torch.Generator().manual_seed(1)
    k, v = (torch.randn(1, 2, 40, 8, generator=g) for _ in range(2))
    token = [torch.randn(1, 2, 1, 8, generator=g) for _ in range(3)]
    fresh = gen.remember("softmax", k, v, max_len=41)
    once, _ = gen.step("softmax", *token, fresh)
    cache = gen.remember("softmax", k, v, max_len=41)
    mark = cache.mark()
    for _ in range(5):
        gen.step("softmax", *token, cache)
        cache.rewind(mark)
        assert cache.mark() == mark == (40, 40)
    again, _ = gen.step("softmax", *token, cache)
    assert torch.equal(again, once) and cache.length == 41  # it wrote the same slot, read the same 41 tokens
    sparse = gen.remember("sparse", k, v, max_len=41, stride=8)
    mark = sparse.mark()
    assert mark == (40, 40, 5)
    gen.step("sparse", *token, sparse)
    sparse.rewind(mark)
    assert sparse.mark() == mark


def test_a_mechanism_that_cannot_generate_is_refused_before_anything_runs():
    config = SweepConfig(mechanisms=(("softmax", {}), ("linformer", {})), ns=(64,),
                         problem=Problem(heads=2, d_model=16, mode="generate"))
    problems = config.problems()
    assert len(problems) == 1 and problems[0].startswith("Linformer cannot generate token by token.")
    assert problems[0].endswith("Leave it out, or choose the forward mode.")
    row, _ = measure_case(ac.MECHANISMS["reformer"], generate_case("reformer", 64), QUICK)
    assert row["status"] == "skipped" and "cannot generate" in row["reason"]
    t = theory_of(ac.MECHANISMS["reformer"], generate_case("reformer", 64))
    assert all(v != v for v in (t.flops, t.executed_flops, t.predicted_bytes))  # NaN


def test_the_cli_measures_generation_and_says_a_token_and_cache(tmp_path):
    out = tmp_path / "gen.json"
    code, stdout, err = run_main("sweep", "--mode", "generate", "--mechanisms", "softmax,linear", "--n", "64,128",
                                 *TINY[:-1], "--out", str(out))
    assert code == 0, err
    assert "softmax n=128:" in err and "ms a token" in err and "cache 16.0 KiB" in err
    assert "memory: cache tensors held (exact)" in stdout and "Generating: each point times one new token" in stdout
    saved = json.loads(out.read_text())
    assert saved["config"]["mode"] == "generate" and {r["causal"] for r in saved["rows"]} == {True}
    code, _, err = run_main("sweep", "--mode", "generate", "--mechanisms", "nystrom", "--n", "64", *TINY)
    assert code == 2 and "Nyströmformer cannot generate token by token" in err


def frame(rows: list[tuple[str, int, float, float]]) -> pd.DataFrame:
    """A generate-mode results frame of (mechanism, n, seconds, cache bytes) rows."""
    out = []
    for key, n, t, nbytes in rows:
        point = unmeasured(ac.MECHANISMS[key], generate_case(key, n), "ok")
        out.append(dataclasses.replace(point, samples=(t,), summary=Summary(t, 0.0, 1), peak_bytes=nbytes,
                                       memory_method="cache tensors held (exact)").to_row())
    return pd.DataFrame(out)


def test_charts_of_generation_name_tokens_context_and_cache_and_fit_the_step_cost():
    ns = [1024, 2048, 4096, 8192]
    df = frame([("softmax", n, 1e-7 * n, 256.0 * n) for n in ns] + [("linear", n, 2e-4, 133120.0) for n in ns])
    assert scaling.default_title(df, "time_median_s") == "Time per generated token vs context length"
    assert scaling.default_title(df, "peak_bytes") == "Cache memory vs context length"
    spec = scaling.figure(df, "peak_bytes").to_dict()
    text = json.dumps(spec)
    assert "Context length n (tokens)" in text and "Cache memory (MiB)" in text
    curves = analysis.theory_curves(df, "time_median_s")
    own = curves[curves["kind"] == "spec"]
    assert set(own["curve"]) == {"O(n·d) fit", "O(d²) fit"}
    linear = own[own["mechanism"] == "linear"]["value"]
    assert linear.max() == pytest.approx(linear.min())  # a fixed state: the same step at every context
    soft = own[own["mechanism"] == "softmax"].set_index("n")["value"]
    assert soft[8192] / soft[1024] == pytest.approx(8.0)
    cross = analysis.crossovers(df, "time_median_s")
    assert cross.loc[cross["mechanism"] == "linear", "n_star"].iloc[0] == pytest.approx(2000, rel=0.01)


def test_forward_charts_keep_their_names():
    df = frame([("softmax", 64, 1e-4, 1.0)]).assign(mode="forward")
    assert scaling.default_title(df, "time_median_s") == "Time per forward call vs sequence length"


@pytest.mark.parametrize("name", ["Why the KV cache hurts", "Constant-memory generation"])
def test_the_generation_presets_run_generate_sweeps_that_validate(name):
    preset = presets.PRESETS[name]
    for config in preset.for_device("cpu"):
        assert config.problem.mode == "generate" and config.problems() == []
        assert all(ac.MECHANISMS[k].supports.generation is not None for k, _ in config.mechanisms)
        assert config.ns[-1] >= 32768


def test_the_memory_guard_skips_a_cache_that_would_not_fit():
    tight = Settings(warmup=1, min_repeats=3, min_time_s=0.0, memory_limit_bytes=1 << 20)
    row, _ = measure_case(ac.MECHANISMS["softmax"], generate_case("softmax", 8192), tight)
    assert row["status"] == "skipped" and "under the memory limit set for this sweep" in row["reason"]
    row, _ = measure_case(ac.MECHANISMS["linear"], generate_case("linear", 1024), tight)
    assert row["status"] == "ok"  # the prompt of 1024 tokens (q, k, v: 384 KiB) and a 2 KiB state fit in 1 MiB


@pytest.mark.parametrize("key,params", [("softmax", {}), ("sparse", {"stride": 8}), ("linear", {})])
def test_rewind_refuses_a_mark_that_is_not_behind_it_with_a_sentence(key, params):
    """Before: any mark was taken, and a cache of −4 tokens followed."""
    g = torch.Generator().manual_seed(2)
    k, v = (torch.randn(1, 2, 40, 8, generator=g) for _ in range(2))
    cache = gen.remember(key, k, v, max_len=44, **params)
    now = cache.mark()
    bad = [tuple(-4 for _ in now), tuple(m + 1 for m in now), (40,) * (len(now) + 1), [40] * len(now),
           (40.0,) * len(now), (True,) * len(now), None]
    for mark in bad:
        with pytest.raises(ValueError, match="rewind") as err:
            cache.rewind(mark)
        assert str(now) in str(err.value) and cache.mark() == now
    cache.rewind(tuple(m - 1 for m in now))  # back is fine
    assert cache.mark() == tuple(m - 1 for m in now)
