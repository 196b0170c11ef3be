"""Multi-head latent attention measured by the engine like every mechanism: its two cores in the measured catalogue
(spec.operands: it attends over latents, not q, k and v), their results against a reference that builds each head's
keys and values by hand, a generation step against the full causal forward, costs against the counter and the
measured peak, the cache's exact bytes, the refusals, and the "One cache, four sizes" preset."""
from __future__ import annotations

import dataclasses
import math

import pytest
import torch
from torch.utils.flop_counter import FlopCounterMode

import attn_core as ac
from attn_core.engine import measure, presets
from attn_core.engine.problem import Problem, Settings
from tests.contract.test_flop_counter import baddbmm_flops

KEYS = ("mla", "mla_naive")
WIDTHS = (("kv_rank", 24), ("rope_dim", 6))
QUICK = Settings(warmup=1, min_repeats=1, min_time_s=0.0)


def problem(key: str, **fields) -> Problem:
    return Problem(**{"mechanism": key, "params": WIDTHS, "heads": 4, "d_model": 32, "n": 37, **fields})


def reference(q_c, q_r, c_kv, k_r, w_uk, w_uv, causal: bool) -> torch.Tensor:
    """float64, head by head: K_h = c_KV W_UK,hᵀ and V_h = c_KV W_UV,hᵀ built out, then masked softmax written out
    over [q_C ; q_R]·[K_h ; k_R] / √(D + ρ)."""
    q_c, q_r, c_kv, k_r, w_uk, w_uv = (t.double() for t in (q_c, q_r, c_kv, k_r, w_uk, w_uv))
    H, D = w_uk.shape[:2]
    N = c_kv.shape[1]
    outs = []
    for h in range(H):
        keys, values = c_kv @ w_uk[h].T, c_kv @ w_uv[h].T  # (B, N, D)
        s = (q_c[:, h] @ keys.transpose(1, 2) + q_r[:, h] @ k_r.transpose(1, 2)) / math.sqrt(D + q_r.shape[-1])
        if causal:
            s = s.masked_fill(~torch.ones(N, N, dtype=torch.bool).tril(), float("-inf"))
        outs.append(torch.softmax(s, -1) @ values)
    return torch.stack(outs, 1)


@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("key", KEYS)
def test_both_cores_as_the_engine_calls_them_match_the_reference(key, causal):
    spec, p = ac.MEASURED[key], problem(key, causal=causal)
    tensors, state = measure.operands(spec, p), measure.make_state(spec, p)
    assert [tuple(t.shape) for t in tensors] == [(1, 4, 37, 8), (1, 4, 37, 6), (1, 37, 24), (1, 37, 6)]
    out = spec.fn(*tensors, causal=causal, **p.kwargs, **state)
    want = reference(*tensors, state["w_uk"], state["w_uv"], causal)
    torch.testing.assert_close(out.double(), want, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("key", KEYS)
def test_the_engine_measures_both_forms_forward_backward_and_generating(key):
    for mode in ("forward", "forward+backward", "generate"):
        point, _ = measure.measure(ac.MEASURED[key], problem(key, mode=mode, causal=True), QUICK)
        assert point.status == "ok", point.reason
        assert point.summary.median_s > 0 and point.theory.flops > 0


@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("key", KEYS)
def test_the_measured_forward_peak_is_the_predicted_one(key, causal):
    """The spec's memory model against the CPU allocator's peak, the defaults' widths and small ones."""
    for params in (WIDTHS, ()):
        p = problem(key, causal=causal, params=params, n=300)
        point, _ = measure.measure(ac.MEASURED[key], p, QUICK)
        assert point.status == "ok", point.reason
        assert point.peak_bytes == pytest.approx(point.theory.predicted_bytes, rel=0.01)


@pytest.mark.parametrize("key", KEYS)
def test_a_generation_step_is_the_last_row_of_the_full_causal_forward(key):
    """The engine's timed step (remember n tokens' latents, step the n + 1-th) against the forward over all n + 1
    tokens, the step's token in the last row."""
    spec, p = ac.MEASURED[key], problem(key, mode="generate")
    state = measure.make_state(spec, p)
    thunk, cache = measure.step_call(spec, p, state)
    assert cache.length == p.n and cache.used_bytes == p.n * (24 + 6) * 4
    out = thunk()
    assert cache.length == p.n  # rewound: every timed step sees the same context
    prompt = measure.operands(spec, p)
    token = measure.operands(spec, dataclasses.replace(p, n=1, seed=p.seed + 1))
    whole = [torch.cat([a, b], dim=-2) for a, b in zip(prompt[:2], token[:2])]
    whole += [torch.cat([a, b], dim=-2) for a, b in zip(prompt[2:], token[2:])]
    full = reference(*whole, state["w_uk"], state["w_uv"], causal=True)
    torch.testing.assert_close(out.double(), full[:, :, -1:], atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("key", KEYS)
def test_executed_flops_are_what_the_counter_sees(key, causal):
    spec, p = ac.MEASURED[key], problem(key, causal=causal, batch=2, n=70)
    tensors, state = measure.operands(spec, p), measure.make_state(spec, p)
    with torch.no_grad(), FlopCounterMode(display=False, custom_mapping={torch.ops.aten.baddbmm_: baddbmm_flops}) as c:
        spec.fn(*tensors, causal=causal, **p.kwargs, **state)
    assert spec.cost.executed(p.shape, **spec.resolved(p.kwargs)) == c.get_total_flops()
    if causal:  # the useful work keeps the lower triangle of the score products, not the projections
        assert spec.cost.flops(p.shape, **spec.resolved(p.kwargs)) < c.get_total_flops()


@pytest.mark.parametrize("key", KEYS)
def test_a_step_s_flops_are_what_the_counter_sees(key):
    spec, p = ac.MEASURED[key], problem(key, mode="generate")
    thunk, _ = measure.step_call(spec, p, measure.make_state(spec, p))
    with torch.no_grad(), FlopCounterMode(display=False, custom_mapping={torch.ops.aten.baddbmm_: baddbmm_flops}) as c:
        thunk()
    assert measure.theory_of(spec, p).flops == c.get_total_flops()


def test_the_cache_is_kv_rank_plus_rope_dim_values_a_token_whatever_the_heads():
    """DeepSeek's 512 + 64 at Llama 3 8B's width (32 heads of 128): 576 values a token and layer, where multi-head
    attention caches 2·32·128 = 8192, grouped-query with 8 heads 2048 and multi-query 256."""
    sizes = {}
    for key, kv in (("mla", None), ("sdpa", None), ("sdpa", 8), ("sdpa", 1)):
        p = Problem(mechanism=key, heads=32, kv_heads=kv, d_model=4096, n=64, mode="generate")
        point, _ = measure.measure(ac.MEASURED[key], p, QUICK)
        assert point.status == "ok" and point.peak_bytes == point.theory.predicted_bytes
        sizes[key, kv] = point.peak_bytes / (64 * 4)
    assert sizes == {("mla", None): 576, ("sdpa", None): 8192, ("sdpa", 8): 2048, ("sdpa", 1): 256}


@pytest.mark.parametrize("fields, match", [
    ({"kv_heads": 2}, "already share one cached latent per token"),
    ({"padding": 3}, "cannot take padding"),
    ({"n_kv": 20}, "self-attention only"),
])
def test_what_mla_cannot_do_is_refused_with_a_sentence(fields, match):
    for key in KEYS:
        found = problem(key, **fields).problems(ac.MEASURED[key])
        assert len(found) == 1 and match in found[0] and found[0].startswith("MLA")
        point, _ = measure.measure(ac.MEASURED[key], problem(key, **fields), QUICK)
        assert point.status == "failed" and match in point.reason


def test_widths_that_do_not_match_the_latents_are_refused():
    spec, p = ac.MEASURED["mla"], problem("mla")
    tensors, state = measure.operands(spec, p), measure.make_state(spec, p)
    with pytest.raises(ValueError, match="kv_rank = 512 and rope_dim = 64 do not match the latents given, of widths "
                                         "24 and 6"):
        spec.fn(*tensors, **state)


@pytest.mark.parametrize("key", KEYS)
def test_attention_points_to_the_layer_for_mla(key):
    q = torch.randn(1, 2, 4, 8)
    with pytest.raises(ValueError, match="MultiLatentAttention"):
        ac.attention(key, q, q, q)
    assert key not in ac.MECHANISMS and key in ac.MEASURED


def test_the_preset_one_cache_four_sizes_validates_with_every_cache():
    (config,) = presets.PRESETS["One cache, four sizes"].for_device("cpu")
    assert config.problem.mode == "generate" and config.problems() == []
    assert (config.problem.heads, config.problem.d_model) == (32, 4096)
    assert [(key, params.get("kv_heads")) for key, params in config.mechanisms] == [
        ("sdpa", None), ("sdpa", 8), ("sdpa", 1), ("mla", None), ("mla_naive", None)]


def test_the_absorbed_step_does_less_work_than_the_naive_one_at_every_context():
    """The step FLOPs of the preset's width: naive rebuilds H·D·2 values from each cached latent, absorbed reads it."""
    for n in (1, 16, 512, 16384):
        p = Problem(mechanism="mla", heads=32, d_model=4096, n=n, mode="generate")
        absorbed = measure.theory_of(ac.MEASURED["mla"], p).flops
        naive = measure.theory_of(ac.MEASURED["mla_naive"], dataclasses.replace(p, mechanism="mla_naive")).flops
        assert absorbed < naive


def test_a_sweep_in_the_worker_names_the_series_and_compares_each_with_the_naive_form():
    config = presets.PRESETS["One cache, four sizes"].configs[0].replaced(
        mechanisms=(("sdpa", {}), ("mla", dict(WIDTHS)), ("mla_naive", dict(WIDTHS))), heads=4, d_model=32,
        ns=(16, 64), min_repeats=1, min_time_s=0.0)
    df = ac.run_sweep(config)
    assert list(df["status"]) == ["ok"] * 6
    assert set(ac.engine.analysis.row_series_name(row) for _, row in df.iterrows()) == {
        "Softmax (fused SDPA)", "MLA absorbed (kv_rank=24, rope_dim=6)", "MLA naive (kv_rank=24, rope_dim=6)"}
    # The preset's own metric, the cache a generated token keeps, has no contention in it: fp32, per token, SDPA's
    # keys and values 2·H·D = 2·4·8 numbers, either MLA its latent and rotary key, kv_rank + rope_dim = 24 + 6.
    cache = {key: [n * per_token * 4 for n in (16, 64)] for key, per_token in
             (("sdpa", 2 * 4 * 8), ("mla", 24 + 6), ("mla_naive", 24 + 6))}
    assert {key: list(df[df["mechanism"] == key]["peak_bytes"]) for key in cache} == cache
    memory = ac.crossovers(df, "peak_bytes", baseline="mla_naive").set_index("mechanism")["note"].to_dict()
    assert memory == {key: "not within the measured range: not smaller than mla_naive up to n = 64"
                      for key in ("sdpa", "mla")}  # SDPA's cache is larger, the absorbed form's the same
    # Times: a point timed while other programs took the CPU is left out, as on the page, so the series compared
    # are those with a clean point, whatever else the machine did.
    clean = df[(df["status"] == "ok") & ~df["disturbed"].astype(bool)]
    cross = ac.crossovers(df, "time_median_s", baseline="mla_naive")
    assert set(cross["mechanism"]) == set(clean["mechanism"]) - {"mla_naive"}
