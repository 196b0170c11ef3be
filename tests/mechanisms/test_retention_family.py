"""RetNet, simple GLA and lightning attention (retention.py, presets of Mamba-2's kernel) against the gated linear
recurrence h_t = g_t·h_{t−1} + k_t v_tᵀ, y_t = q_tᵀ h_t written plainly here in float64, token by token; their
decays against the papers' numbers worked by hand; generation through mamba2's cache; the refusals."""
from __future__ import annotations

import pytest
import torch

from attn_core.mechanisms import mamba2, retention
from attn_core.nn import generation as gen
from attn_core.spec import Shape


def gated_recurrence(q, k, v, log_gate) -> torch.Tensor:
    """float64 loop: log_gate (B, H, n) one gate a query head and token; query head i reads key/value head
    ⌊i·Hk/H⌋."""
    B, H, n, D = q.shape
    heads = [i * k.shape[1] // H for i in range(H)]
    q, k, v, g = q.double(), k.double()[:, heads], v.double()[:, heads], log_gate.double().exp()
    h = torch.zeros(B, H, D, v.shape[-1], dtype=torch.float64)
    ys = []
    for t in range(n):
        h = g[:, :, t, None, None] * h + k[:, :, t, :, None] * v[:, :, t, None, :]
        ys.append((q[:, :, t, :, None] * h).sum(-2))
    return torch.stack(ys, dim=2)


def qkv(n: int, *, B: int = 2, H: int = 4, Hk: int | None = None, D: int = 8, seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    q = torch.randn(B, H, n, D, generator=g, dtype=torch.float64)
    k, v = (torch.randn(B, Hk or H, n, D, generator=g, dtype=torch.float64) for _ in "kv")
    return q, k, v


def fixed(log_decay: torch.Tensor, B: int, n: int) -> torch.Tensor:
    return log_decay.double()[None, :, None].expand(B, -1, n)


def test_the_decays_are_the_papers():
    # RetNet (arXiv 2307.08621 §2.2): γ = 1 − 2^(−5−h): 1 − 1/32 = 0.96875, …, 1 − 1/256 = 0.99609375
    assert retention.retnet_decays(4).exp().tolist() == pytest.approx([0.96875, 0.984375, 0.9921875, 0.99609375])
    # lightning (arXiv 2501.08313, MiniMax-Text-01's slopes): s_h = 2^(−8(h+1)/H); H = 8: 1/2, 1/4, …, 1/256,
    # times 1 + 1e-5 in a one-layer stack; the last of L layers keeps 1e-5 of it
    slopes = [2.0 ** -(h + 1) for h in range(8)]
    assert (-retention.lightning_decays(8)).tolist() == pytest.approx([s * (1 + 1e-5) for s in slopes], rel=1e-12)
    assert (-retention.lightning_decays(8, 3, 4)).tolist() == pytest.approx([s * 1e-5 for s in slopes], rel=1e-9)
    # layer 1 of 3: 1 − 1/2 + 1e-5
    assert float(-retention.lightning_decays(8, 1, 3)[0]) == pytest.approx(0.5 * (0.5 + 1e-5), rel=1e-12)
    # GLA's gate σ(z)^(1/16), z in ±2: σ(−2)^(1/16) = 0.99214…, σ(2)^(1/16) = 0.99921…
    g = retention.gla_gates(2, 3, 50, dtype=torch.float64).exp()
    assert g.min() >= 0.11920292202211755 ** (1 / 16) and g.max() <= 0.8807970779778823 ** (1 / 16)


@pytest.mark.parametrize("n,chunk", [(1, 8), (37, 8), (70, 64), (33, 1)])
@pytest.mark.parametrize("kv_heads", [4, 2, 1])
def test_retnet_and_lightning_equal_the_recurrence_at_their_fixed_decays(n, chunk, kv_heads):
    q, k, v = qkv(n, Hk=kv_heads)
    out = retention.retnet_attention(q, k, v, chunk=chunk)
    torch.testing.assert_close(out, gated_recurrence(q, k, v, fixed(retention.retnet_decays(4), 2, n)),
                               atol=1e-11, rtol=1e-10)
    out = retention.lightning_attention(q, k, v, chunk=chunk, layer=1, layers=4)
    torch.testing.assert_close(out, gated_recurrence(q, k, v, fixed(retention.lightning_decays(4, 1, 4), 2, n)),
                               atol=1e-11, rtol=1e-10)


def test_retnet_is_mamba2_at_its_retention_state():
    q, k, v = qkv(40)
    state = mamba2.retention_state(Shape(2, 4, 40, 40, 8), dtype=torch.float64)
    torch.testing.assert_close(retention.retnet_attention(q, k, v, chunk=16),
                               mamba2.mamba2_attention(q, k, v, causal=True, chunk=16, **state), atol=1e-13, rtol=0)


@pytest.mark.parametrize("n,chunk", [(1, 4), (37, 8), (65, 16)])
@pytest.mark.parametrize("kv_heads", [4, 2, 1])
def test_simple_gla_equals_the_recurrence_at_data_dependent_gates(n, chunk, kv_heads):
    q, k, v = qkv(n, Hk=kv_heads)
    log_gate = retention.gla_gates(2, kv_heads, n, seed=3, dtype=torch.float64) * 20  # g down to 0.85: fast decay
    out = retention.simple_gla_attention(q, k, v, chunk=chunk, log_gate=log_gate)
    per_query_head = log_gate.repeat_interleave(4 // kv_heads, dim=1)
    torch.testing.assert_close(out, gated_recurrence(q, k, v, per_query_head), atol=1e-11, rtol=1e-10)


def test_simple_gla_draws_its_gates_from_the_seed_and_skips_padding():
    q, k, v = qkv(30, Hk=2)
    drawn = retention.gla_gates(2, 2, 30, seed=5, dtype=torch.float64)
    torch.testing.assert_close(retention.simple_gla_attention(q, k, v, seed=5),
                               gated_recurrence(q, k, v, drawn.repeat_interleave(2, dim=1)), atol=1e-11, rtol=1e-10)
    pad = torch.zeros(2, 30, dtype=torch.bool)
    pad[0, 10:14] = pad[1, :3] = True
    out = retention.simple_gla_attention(q, k, v, log_gate=drawn, key_padding_mask=pad)
    for b in range(2):  # the reference leaves the padded tokens out; their queries read the state as it stands
        keep = (~pad[b]).nonzero()[:, 0]
        ref = gated_recurrence(q[b:b + 1, :, keep], k[b:b + 1, :, keep], v[b:b + 1, :, keep],
                               drawn[b:b + 1, :, keep].repeat_interleave(2, dim=1))
        torch.testing.assert_close(out[b:b + 1, :, keep], ref, atol=1e-11, rtol=1e-10)


def test_simple_gla_gradients_reach_the_gates_as_the_recurrences_do():
    q, k, v = qkv(12, H=2)
    log_gate = (retention.gla_gates(2, 2, 12, dtype=torch.float64) * 10).requires_grad_()
    weights = torch.randn(2, 2, 12, 8, dtype=torch.float64, generator=torch.Generator().manual_seed(1))
    (retention.simple_gla_attention(q, k, v, chunk=4, log_gate=log_gate) * weights).sum().backward()
    ours = log_gate.grad.clone()
    log_gate.grad = None
    (gated_recurrence(q, k, v, log_gate) * weights).sum().backward()
    torch.testing.assert_close(ours, log_gate.grad, atol=1e-10, rtol=1e-9)


def test_a_fixed_decay_generates_token_by_token_through_mamba2s_cache():
    q, k, v = qkv(24)
    log_decay = retention.lightning_decays(4)
    state = retention.fixed_state(Shape(2, 4, 24, 24, 8), log_decay, dtype=torch.float64)
    cache = gen.remember("mamba2", k[:, :, :16], v[:, :, :16], **state)
    expected = gated_recurrence(q, k, v, fixed(log_decay, 2, 24))
    for t in range(16, 24):
        out, cache = gen.step("mamba2", q[:, :, t:t + 1], k[:, :, t:t + 1], v[:, :, t:t + 1], cache)
        torch.testing.assert_close(out, expected[:, :, t:t + 1], atol=1e-11, rtol=1e-10)


def test_half_inputs_run_in_float32_and_stay_close():
    q, k, v = qkv(40)
    for fn in retention.PRESETS.values():
        exact = fn(q, k, v)
        half = fn(q.bfloat16(), k.bfloat16(), v.bfloat16())
        assert half.dtype == torch.bfloat16
        assert float((half.double() - exact).norm() / exact.norm()) < 3e-2


@pytest.mark.parametrize("call,words", [
    (lambda q, k, v: retention.retnet_attention(q, k, v, causal=False), "causal"),
    (lambda q, k, v: retention.simple_gla_attention(q, k, v, log_gate=torch.zeros(2, 4, 9)), "negative"),
    (lambda q, k, v: retention.simple_gla_attention(q, k, v, log_gate=-torch.ones(2, 4, 8)), "shape"),
    (lambda q, k, v: retention.lightning_attention(q, k, v, layer=4, layers=4), "layers − 1"),
    (lambda q, k, v: retention.fixed_state(Shape(2, 4, 9, 9, 8), torch.zeros(4)), "negative log-decay"),
])
def test_bad_arguments_are_refused_with_a_sentence(call, words):
    q, k, v = (t.float() for t in qkv(9))
    with pytest.raises(ValueError, match=words):
        call(q, k, v)


def test_each_preset_names_its_paper():
    assert set(retention.PAPERS) == set(retention.PRESETS)
    assert [p.split("arXiv ")[1][:10] for p in retention.PAPERS.values()] == ["2307.08621", "2312.06635",
                                                                              "2501.08313"]


# ---- the spec'd forms a catalogue can load (ATTN_CORE_MECHANISMS="attn_core.mechanisms.retention:SPECS") ----

def test_the_specs_load_into_a_catalogue_and_run_mamba2s_kernel_at_their_gates():
    from attn_core.mechanisms import load

    loaded = load(["attn_core.mechanisms.retention:SPECS"])
    assert {k: s.key for k, s in loaded.items()} == {"retnet": "retnet", "simple_gla": "simple_gla",
                                                     "lightning": "lightning"}
    assert loaded["retnet"].fn is loaded["lightning"].fn is mamba2.mamba2_attention
    q, k, v = qkv(33, Hk=2)
    shape = Shape(2, 4, 33, 33, 8, causal=True, Hk=2)
    for key, log_gate in (("retnet", fixed(retention.retnet_decays(4), 2, 33)),
                          ("lightning", fixed(retention.lightning_decays(4), 2, 33)), ("simple_gla", None)):
        state = loaded[key].state.init(shape, dtype=torch.float64, seed=2)
        if log_gate is None:
            log_gate = state["log_gate"].repeat_interleave(2, dim=1)
        out = loaded[key].fn(q, k, v, causal=True, chunk=8, **state)
        torch.testing.assert_close(out, gated_recurrence(q, k, v, log_gate), atol=1e-11, rtol=1e-10)
        assert "not an approximation of softmax" in loaded[key].insight.accuracy_note


@pytest.mark.parametrize("dtype,kv_heads", [("float32", 3), ("bfloat16", 1)])
def test_simple_gla_s_memory_model_matches_the_allocator(dtype, kv_heads):
    """Its peak: mamba2's over the float32 copies it hands the kernel, plus those copies, within 2%."""
    from tests.baselines import trace_peak_bytes

    shape = Shape(2, 3, 600, 600, 40, dtype=dtype, causal=True, Hk=kv_heads)
    g = torch.Generator().manual_seed(0)
    q = torch.randn(2, 3, 600, 40, generator=g).to(getattr(torch, dtype))
    k, v = (torch.randn(2, kv_heads, 600, 40, generator=g).to(q.dtype) for _ in "kv")
    state = retention.gla_state(shape, dtype=q.dtype)
    with torch.inference_mode():
        call = lambda: retention.simple_gla_attention(q, k, v, **state)  # noqa: E731
        call()
        measured = trace_peak_bytes(call)
    assert retention.SIMPLE_GLA.cost.memory_bytes(shape) == pytest.approx(measured, rel=0.02)


def test_simple_gla_generates_token_by_token_a_state_a_key_value_head():
    q, k, v = qkv(20, Hk=2)
    gates = retention.gla_gates(2, 2, 20, seed=4, dtype=torch.float64) * 10
    form = retention.SIMPLE_GLA.supports.generation
    cache = form.remember(k[:, :, :12], v[:, :, :12], log_gate=gates)  # the gates of the tokens to come too
    expected = gated_recurrence(q, k, v, gates.repeat_interleave(2, dim=1))
    for t in range(12, 20):
        out, cache = form.step(q[:, :, t:t + 1], k[:, :, t:t + 1], v[:, :, t:t + 1], cache)
        torch.testing.assert_close(out, expected[:, :, t:t + 1], atol=1e-11, rtol=1e-10)
    # two key/value heads of 8 × 8 float64... in float32 for the cost model: 2 · 2 · 8 · 8 · 4 bytes
    assert form.cache_bytes(Shape(2, 4, 20, 20, 8, Hk=2)) == 2 * 2 * 8 * 8 * 4 == cache.h.numel() * 4


@pytest.mark.parametrize("mode", ["forward", "generate"])
def test_the_engine_measures_the_loaded_specs(mode):
    from attn_core.engine import measure
    from attn_core.engine.problem import Problem, Settings

    registry = measure.resolve_mechanisms(("attn_core.mechanisms.retention:SPECS",))
    quick = Settings(warmup=1, min_repeats=1, min_time_s=0.0, measure_memory=False)
    for key in retention.SPECS:
        problem = Problem(mechanism=key, n=64, heads=2, d_model=32, causal=True, mode=mode)
        assert problem.problems(registry[key]) == []
        row = measure.measure(registry[key], problem, quick)[0].to_row()
        assert row["status"] == "ok", row["reason"]
