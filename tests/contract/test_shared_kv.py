"""Heads that share keys (grouped-query and multi-query attention) through every mechanism that takes them: each
against the keys and values repeated by hand for every query head, then the mechanism's own reference; the cache,
the layer and the cost model following the number of key/value heads."""
from __future__ import annotations

import json
import re

import pytest
import torch

import attn_core as ac
from attn_core.nn import generation as gen
from attn_core.spec import Shape
from tests.baselines import allowed, masked_softmax, runs, trace_peak_bytes
from tests.copies import original, with_copies
from tests.contract.test_mechanisms import MEMORY_N, MEMORY_PARAMS, REF_KIND, SMALL

SHARING = [k for k, s in ac.MECHANISMS.items() if s.supports.shared_kv]
REFUSING = [k for k, s in ac.MECHANISMS.items() if not s.supports.shared_kv]
B, H, D = 2, 6, 8
# States kept per query head, not per key/value head: each query head decays at its own rate (Mamba-2's dt and A)
PER_QUERY_HEAD = with_copies({"mamba2": True})


def inputs(n: int, kv_heads: int, *, dtype=torch.float64, seed: int = 0, grad: bool = False):
    g = torch.Generator().manual_seed(seed)
    q = torch.randn(B, H, n, D, generator=g, dtype=torch.float64).to(dtype)
    k, v = (torch.randn(B, kv_heads, n, D, generator=g, dtype=torch.float64).to(dtype) for _ in "kv")
    return [t.requires_grad_(grad) for t in (q, k, v)]


def by_hand(t: torch.Tensor) -> torch.Tensor:
    """(B, Hk, n, D) → (B, H, n, D): query head i reads key/value head ⌊i·Hk/H⌋, written as a loop over heads."""
    return torch.stack([t[:, i * t.shape[1] // H] for i in range(H)], dim=1)


def state_for(key: str, q, k, causal: bool, params: dict) -> dict:
    return ac.make_state(key, Shape.of(q, k, causal), dtype=q.dtype, seed=3, **params)


# State laid out per key/value head, (B, Hk, …): Gated DeltaNet's gates, which write the state that a key/value head's
# query heads read. Repeating k and v by hand repeats these with them.
PER_KV_HEAD = with_copies({"gated_deltanet": ("alpha", "beta"), "kda": ("alpha", "beta")})


def by_hand_state(key: str, state: dict) -> dict:
    """The state for keys and values repeated `by_hand`: its per-key/value-head tensors repeated alike."""
    return {name: by_hand(t) if name in PER_KV_HEAD.get(key, ()) else t for name, t in state.items()}


@pytest.mark.parametrize("kv_heads", [1, 2, 3])
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("key", SHARING)
def test_shared_heads_equal_each_query_head_given_its_keys(key, causal, kv_heads):
    spec = ac.get(key)
    if not runs(spec, causal):
        pytest.skip(f"{key} does not run with causal={causal}")
    params = with_copies(SMALL).get(key, {})
    q, k, v = inputs(40, kv_heads)
    state = state_for(key, q, k, causal, params)
    out = ac.attention(key, q, k, v, causal=causal, **params, **state)
    repeated = ac.attention(key, q, by_hand(k), by_hand(v), causal=causal, **params, **by_hand_state(key, state))
    assert out.shape == q.shape
    torch.testing.assert_close(out, repeated, atol=1e-10, rtol=1e-9)
    if original(key) in REF_KIND:  # exact: masked softmax over the repeated keys
        mask = allowed(REF_KIND[key], 40, 40, causal, **{**spec.defaults, **params}, **state)
        torch.testing.assert_close(out, masked_softmax(q, by_hand(k), by_hand(v), mask), atol=1e-10, rtol=1e-9)


@pytest.mark.parametrize("key", SHARING)
def test_shared_heads_gather_the_gradients_of_their_query_heads(key):
    spec = ac.get(key)
    causal = spec.supports.causal
    params = with_copies(SMALL).get(key, {})
    q, k, v = inputs(33, 2, grad=True)
    state = state_for(key, q, k, causal, params)
    w = torch.randn(B, H, 33, D, generator=torch.Generator().manual_seed(1), dtype=torch.float64)
    got = torch.autograd.grad((ac.attention(key, q, k, v, causal=causal, **params, **state) * w).sum(), (q, k, v))
    kr, vr = (by_hand(t.detach()).requires_grad_(True) for t in (k, v))
    qr = q.detach().requires_grad_(True)
    want = torch.autograd.grad((ac.attention(key, qr, kr, vr, causal=causal, **params, **by_hand_state(key, state))
                                * w).sum(), (qr, kr, vr))
    torch.testing.assert_close(got[0], want[0], atol=1e-9, rtol=1e-8)
    for shared, each in zip(got[1:], want[1:]):  # a shared head's gradient: the sum over the query heads reading it
        torch.testing.assert_close(shared, each.view(B, 2, H // 2, 33, D).sum(2), atol=1e-9, rtol=1e-8)


@pytest.mark.parametrize("key", [k for k in SHARING if ac.MECHANISMS[k].supports.padding])
def test_shared_heads_with_padding(key):
    spec = ac.get(key)
    params = with_copies(SMALL).get(key, {})
    q, k, v = inputs(36, 1)
    mask = torch.arange(36) >= torch.tensor([29, 36])[:, None]
    for causal in (c for c in (False, True) if runs(spec, c)):
        state = state_for(key, q, k, causal, params)
        out = ac.attention(key, q, k, v, causal=causal, key_padding_mask=mask, **params, **state)
        want = ac.attention(key, q, by_hand(k), by_hand(v), causal=causal, key_padding_mask=mask, **params,
                            **by_hand_state(key, state))
        torch.testing.assert_close(out, want, atol=1e-10, rtol=1e-9)


@pytest.mark.parametrize("key", [k for k in SHARING if ac.MECHANISMS[k].supports.generation is not None])
def test_generating_with_shared_heads_matches_the_repeated_cache_token_by_token(key):
    params = with_copies(SMALL).get(key, {})
    q, k, v = inputs(24, 2)
    state = state_for(key, q, k, True, params)
    out, cache = gen.prefill(key, q[:, :, :16], k[:, :, :16], v[:, :, :16], **params, **state)
    want, full = gen.prefill(key, q[:, :, :16], by_hand(k[:, :, :16]), by_hand(v[:, :, :16]), **params,
                             **by_hand_state(key, state))
    torch.testing.assert_close(out, want, atol=1e-10, rtol=1e-9)
    for t in range(16, 24):
        got, cache = gen.step(key, q[:, :, t:t + 1], k[:, :, t:t + 1], v[:, :, t:t + 1], cache)
        each, full = gen.step(key, q[:, :, t:t + 1], by_hand(k[:, :, t:t + 1]), by_hand(v[:, :, t:t + 1]), full)
        torch.testing.assert_close(got, each, atol=1e-10, rtol=1e-9)
    # the cache holds the shared heads once: Hk/H of the repeated one's, as the spec says
    shape = Shape(B, H, 24, 24, D, dtype="float64", causal=True, Hk=2)
    assert cache.used_bytes == gen.cache_bytes(key, shape, **params)
    shares = 1 if PER_QUERY_HEAD.get(key) else 3  # a state per query head is as large as multi-head's
    per_token = B * 24 * 8 * params.get("index_dim", 32) if original(key) == "topk" else 0  # topk's indexer keys
    assert shares * (gen.cache_bytes(key, shape, **params) - per_token) == gen.cache_bytes(
        key, Shape(B, H, 24, 24, D, dtype="float64", causal=True), **params) - per_token


@pytest.mark.parametrize("key", REFUSING)
def test_a_mechanism_that_cannot_share_heads_says_why(key):
    spec = ac.get(key)
    assert spec.supports.no_shared_kv, f"{key} refuses shared heads without saying why"
    q, k, v = inputs(16, 2)
    with pytest.raises(ValueError, match=rf"^{re.escape(spec.label)}.*cannot share key/value heads"):
        ac.attention(key, q, k, v, **with_copies(SMALL).get(key, {}))
    with pytest.raises(ValueError, match="cannot share key/value heads"):
        ac.MultiHeadAttention(48, 6, key, kv_heads=2)


def test_key_value_heads_that_do_not_divide_the_query_heads_are_refused():
    q, _, _ = inputs(8, 1)
    k = v = torch.randn(B, 4, 8, D, dtype=torch.float64)
    with pytest.raises(ValueError, match=r"k and v have 4 heads, which does not divide q's 6.*1, 2, 3 or 6 heads"):
        ac.attention("softmax", q, k, v)


@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("key", SHARING)
def test_spec_memory_with_shared_heads_matches_the_allocator(key, causal):
    """The spec's peak with one key/value head for four query heads within 2% of the allocator's records: a
    mechanism that repeats the shared heads must say so in its memory model (spec.supports.repeats_kv)."""
    spec = ac.get(key)
    if not runs(spec, causal):
        pytest.skip(f"{key} does not run with causal={causal}")
    n = MEMORY_N.get(original(key), 3000)  # the allocator reading's length
    shape = Shape(2, 4, n, n, 40, causal=causal, Hk=1)
    params = MEMORY_PARAMS.get(original(key), {})
    g = torch.Generator().manual_seed(0)
    q = torch.randn(2, 4, n, 40, generator=g)
    k, v = (torch.randn(2, 1, n, 40, generator=g) for _ in "kv")
    state = ac.make_state(key, shape, **params)
    with torch.inference_mode():
        call = lambda: spec.fn(q, k, v, causal=causal, **params, **state)  # noqa: E731
        call()
        measured = trace_peak_bytes(call)
    assert spec.cost.memory_bytes(shape, **params) == pytest.approx(measured, rel=0.02)


@pytest.mark.parametrize("key", SHARING)
def test_spec_costs_follow_the_key_value_heads(key):
    spec = ac.get(key)
    params = spec.resolved(with_copies(SMALL).get(key, {}))
    mha, gqa = Shape(1, 8, 512, 512, 64), Shape(1, 8, 512, 512, 64, Hk=2)
    assert gqa.input_bytes == (8 * 512 + 2 * 2 * 512) * 64 * 4 < mha.input_bytes
    assert 0 < spec.cost.flops(gqa, **params) <= spec.cost.flops(mha, **params)
    if not spec.supports.repeats_kv:
        assert spec.cost.memory_bytes(gqa, **params) <= spec.cost.memory_bytes(mha, **params)


def test_the_layer_shares_its_key_and_value_projections():
    torch.manual_seed(0)
    layer = ac.MultiHeadAttention(48, 6, "sdpa", kv_heads=2).double()
    assert layer.k_proj.weight.shape == layer.v_proj.weight.shape == (16, 48)
    # the same layer written as multi-head attention: each query head's key and value rows copied from its group's
    mha = ac.MultiHeadAttention(48, 6, "softmax").double()
    mha.q_proj.load_state_dict(layer.q_proj.state_dict())
    mha.out_proj.load_state_dict(layer.out_proj.state_dict())
    for shared, full in ((layer.k_proj, mha.k_proj), (layer.v_proj, mha.v_proj)):
        w, b = shared.weight.detach().view(2, 8, 48), shared.bias.detach().view(2, 8)
        full.weight.data = torch.cat([w[i // 3] for i in range(6)])
        full.bias.data = torch.cat([b[i // 3] for i in range(6)])
    x = torch.randn(3, 11, 48, dtype=torch.float64)
    torch.testing.assert_close(layer(x), mha(x), atol=1e-10, rtol=1e-9)
    with pytest.raises(ValueError, match="kv_heads = 4 does not divide the 6 query heads; choose 1, 2, 3 or 6"):
        ac.MultiHeadAttention(48, 6, "sdpa", kv_heads=4)


def test_a_problem_with_shared_heads_draws_and_costs_them():
    problem = ac.Problem(mechanism="sdpa", batch=1, heads=8, kv_heads=2, n=64, d_model=128)
    q, k, v = problem.inputs()
    assert q.shape == (1, 8, 64, 16) and k.shape == v.shape == (1, 2, 64, 16)
    assert problem.shape.Hk == 2 and problem.problems(ac.get("sdpa")) == []
    assert ac.Problem(heads=8, kv_heads=8).shape == ac.Problem(heads=8).shape  # MHA has one spelling


# -- through the engine: a series' own key/value heads, the row, the chart's name, the summary, the CLI --
from attn_core import cli  # noqa: E402
from attn_core.engine import analysis, measure, presets  # noqa: E402
from attn_core.engine.config import SweepConfig, plan  # noqa: E402
from attn_core.engine.measurement import Measurement  # noqa: E402
from attn_core.engine.results import frame_from_rows  # noqa: E402
from tests.fake_mechanisms import private_sweep_lock  # noqa: E402, F401 (an autouse fixture)

SERIES = (("sdpa", {}), ("sdpa", {"kv_heads": 2}), ("sdpa", {"kv_heads": 1}))


def test_a_series_sets_its_own_key_value_heads_and_a_bad_count_is_refused():
    config = SweepConfig(mechanisms=SERIES, ns=(32,), problem=ac.Problem(heads=4, d_model=32, device="cpu"))
    assert config.problems() == []
    points = plan(config)
    assert [(p.params, p.key_heads) for p in points] == [((), 4), ((), 2), ((), 1)]
    bad = SweepConfig(mechanisms=(("sdpa", {"kv_heads": 3}),), ns=(32,), problem=config.problem)
    assert bad.problems() == ["key/value heads must divide the 4 query heads, got 3; choose 1, 2 or 4"]
    refused = SweepConfig(mechanisms=(("reformer", {"kv_heads": 2}),), ns=(32,), problem=config.problem)
    (why,) = refused.problems()
    assert why.startswith("Reformer (LSH) cannot share key/value heads") and "Set key/value heads equal to heads" in why


@pytest.mark.parametrize("mode", ["forward", "generate"])
def test_a_measured_point_with_shared_heads_keeps_them_in_its_row(mode):
    settings = ac.Settings(warmup=1, min_repeats=2, min_time_s=0.0)
    rows = []
    for kv in (None, 2, 1):
        problem = ac.Problem(mechanism="sdpa", batch=1, heads=4, kv_heads=kv, n=64, d_model=64, mode=mode)
        point, _ = measure.measure(ac.get("sdpa"), problem, settings)
        assert point.status == "ok", point.reason
        row = point.to_row()
        back = Measurement.from_row(frame_from_rows([row]).iloc[0]).problem
        assert row["kv_heads"] == (kv or 4) and back.kv_heads == kv and back.shape == problem.shape
        rows.append(row)
    if mode == "generate":  # the cache's bytes, read from its tensors: 4, 2 and 1 heads' keys and values
        assert [r["peak_bytes"] for r in rows] == [2 * kv * 64 * 16 * 4 for kv in (4, 2, 1)]
        assert [r["predicted_bytes"] for r in rows] == [r["peak_bytes"] for r in rows]


def test_series_that_share_heads_are_named_and_compared_with_the_baselines_first_series():
    def row(kv, n, t):
        return {"mechanism": "sdpa", "label": "Softmax (fused SDPA)", "exact": True, "params": "{}", "n": n,
                "batch": 1, "heads": 8, "kv_heads": kv, "d_model": 512, "head_dim": 64, "dtype": "float32",
                "device": "cpu", "mode": "generate", "causal": True, "status": "ok", "reason": "",
                "time_median_s": t, "time_iqr_s": 0.0, "time_samples": [t], "repeats": 1, "peak_bytes": kv * n,
                "memory_method": "m", "predicted_bytes": 1.0, "theory_flops": 1.0, "executed_flops": 1.0,
                "gflops": 1.0, "device_gflops": 1.0, "pct_of_device": 1.0, "sdpa_backend": "", "threads": 2.0,
                "foreign_cpu": 0.0, "load_average": 0.1, "disturbed": False, "retaken": 0}
    df = frame_from_rows([row(kv, n, kv * n * 1e-6) for kv in (8, 2, 1) for n in (1024, 2048, 4096)])
    table = analysis.summary(df).set_index("series")
    assert list(table.index) == ["Softmax (fused SDPA)", "Softmax (fused SDPA) · GQA-2", "Softmax (fused SDPA) · MQA"]
    assert table["speedup_vs_sdpa"].tolist() == pytest.approx([1.0, 4.0, 8.0])
    assert table["memory_saving_vs_sdpa"].tolist() == pytest.approx([1.0, 4.0, 8.0])
    assert table["time_exponent"].tolist() == pytest.approx([1.0, 1.0, 1.0])
    config, left = presets.config_of(df)
    assert config.mechanisms == (("sdpa", {"kv_heads": 8}), ("sdpa", {"kv_heads": 2}), ("sdpa", {"kv_heads": 1}))
    assert left == []


def test_the_cli_takes_key_value_heads_for_the_sweep_and_for_one_series():
    args = cli.build_parser().parse_args(["sweep", "--mechanisms", "sdpa,softmax:kv_heads=1", "--kv-heads", "2",
                                          "--heads", "4", "--padding", "3"])
    config = cli.config_from_args(args)
    assert config.problem.kv_heads == 2 and config.problem.padding == 3
    assert [(p.mechanism, p.key_heads, p.padding) for p in plan(config)[:2]] == [("sdpa", 2, 3), ("softmax", 1, 3)]


# -- on the Benchmark page: the selector, its link, a sweep with shared heads --
from tests.dashboard.test_app import benchmark, routed, run_to_end, widget  # noqa: E402, F401 (routed: an autouse fixture)
from tests.apptest_helpers import chart_specs  # noqa: E402
from tests.dashboard.test_hardening_web import linked  # noqa: E402


def test_the_benchmark_page_measures_shared_heads_chosen_in_its_selector():
    at = benchmark(bench_exact=["sdpa"], bench_approx=[], bench_n=(64, 128), bench_steps=2, bench_d_model=64,
                   bench_heads=4, bench_kv_heads=1)
    assert widget(at, "bench_kv_heads").options == ["all (MHA)", "2 (GQA-2)", "1 (MQA)"]
    at.button(key="bench_run").click().run()
    at = run_to_end(at)
    frame = at.session_state["bench"].job.frame()
    assert set(frame["kv_heads"]) == {1} and set(frame["status"]) == {"ok"}, list(frame["reason"])
    assert "Softmax (fused SDPA) · MQA" in json.dumps(chart_specs(at), default=str, ensure_ascii=False)
    widget(at, "bench_heads").set_value(6)
    at.run()  # 1 still divides 6
    assert widget(at, "bench_kv_heads").value == 1
    widget(at, "bench_kv_heads").set_value(3)
    widget(at, "bench_heads").set_value(4)
    at.run()  # 3 does not divide 4: back to MHA, with a sentence
    assert widget(at, "bench_kv_heads").value == 0
    assert any("3 key/value heads do not divide 4 heads" in t.value for t in at.toast)


def test_a_link_sets_the_key_value_heads_and_a_count_no_heads_have_is_refused():
    at = linked("bench_kv_heads", "2 (GQA-2)")
    assert not at.exception and widget(at, "bench_kv_heads").value == 2
    assert not any("was ignored" in w.value for w in at.warning)
    at = linked("bench_kv_heads", "two")
    assert any("`bench_kv_heads` was ignored" in w.value for w in at.warning)
    assert widget(at, "bench_kv_heads").value == 0  # all (MHA)
