"""Differential attention against its formula materialized in float64 (tests/baselines.py), in every form it runs:
causal and not, cross, padded, shared key/value heads, token by token, and its gradients."""
from __future__ import annotations

import pytest
import torch
from torch.utils.flop_counter import FlopCounterMode

import attn_core as ac
from attn_core.nn import generation as gen
from attn_core.mechanisms.differential import signed_weights
from attn_core.spec import Shape
from tests.baselines import differential_reference, masked_softmax
from tests.contract.test_mechanisms import profiled_peak


def qkv(nq: int, nk: int | None = None, *, B: int = 2, H: int = 4, Hk: int | None = None, D: int = 16,
        dtype=torch.float32, seed: int = 0, grad: bool = False):
    g = torch.Generator().manual_seed(seed)
    shapes = [(B, H, nq, D), (B, Hk or H, nk or nq, D), (B, Hk or H, nk or nq, D)]
    return [torch.randn(s, generator=g, dtype=torch.float64).to(dtype).requires_grad_(grad) for s in shapes]


def by_hand(t: torch.Tensor, heads: int) -> torch.Tensor:
    """(B, Hk, n, D) → (B, H, n, D): query head i reads key/value head ⌊i·Hk/H⌋, as a loop over heads."""
    return torch.stack([t[:, i * t.shape[1] // heads] for i in range(heads)], dim=1)


@pytest.mark.parametrize("n", [1, 2, 37, 64, 100, 701])  # 701: the kernel's query tiles (64 rows) end part full
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("lam", [0.0, 0.3, 0.8, 1.0])
def test_equals_the_materialized_formula(n, causal, lam):
    q, k, v = qkv(n, B=1 if n > 100 else 2)
    out = ac.attention("differential", q, k, v, causal=causal, lam=lam)
    assert out.shape == q.shape and out.dtype == q.dtype
    torch.testing.assert_close(out.double(), differential_reference(q, k, v, causal, lam), atol=2e-5, rtol=1e-5)


def test_float64_to_rounding():
    q, k, v = qkv(45, D=10, dtype=torch.float64)
    for causal in (False, True):
        torch.testing.assert_close(ac.attention("differential", q, k, v, causal=causal),
                                   differential_reference(q, k, v, causal, 0.8), atol=1e-12, rtol=1e-10)


def test_lam_zero_is_softmax_over_the_first_halves_and_equal_halves_cancel_to_one_minus_lam():
    q, k, v = qkv(29, D=12, dtype=torch.float64)
    torch.testing.assert_close(ac.attention("differential", q, k, v, lam=0.0),
                               masked_softmax(q[..., :6], k[..., :6], v), atol=1e-12, rtol=1e-10)
    twin_q, twin_k = torch.cat([q[..., :6]] * 2, -1), torch.cat([k[..., :6]] * 2, -1)  # Q₁ = Q₂, K₁ = K₂
    torch.testing.assert_close(ac.attention("differential", twin_q, twin_k, v, causal=True, lam=0.8),
                               0.2 * masked_softmax(q[..., :6], k[..., :6], v, torch.ones(29, 29).tril().bool()),
                               atol=1e-12, rtol=1e-10)


def test_cross_attention():
    q, k, v = qkv(20, 33)
    torch.testing.assert_close(ac.attention("differential", q, k, v).double(),
                               differential_reference(q, k, v, False, 0.8), atol=2e-5, rtol=1e-5)


def pads(n: int) -> dict[str, torch.Tensor]:
    lengths = torch.arange(n)[None, :] >= torch.tensor([n, n // 3])[:, None]
    scattered = torch.rand(2, n, generator=torch.Generator().manual_seed(3)) < 0.4
    scattered[:, n // 2] = False
    all_padding = torch.arange(n)[None, :] >= torch.tensor([n, 0])[:, None]
    return {"lengths": lengths, "left": lengths.flip(-1), "scattered": scattered, "all padding": all_padding}


@pytest.mark.parametrize("which", ["lengths", "left", "scattered", "all padding"])
@pytest.mark.parametrize("causal", [False, True])
def test_padding_and_queries_that_see_no_key(which, causal):
    q, k, v = qkv(37, dtype=torch.float64)
    pad = pads(37)[which]
    out = ac.attention("differential", q, k, v, causal=causal, key_padding_mask=pad)
    torch.testing.assert_close(out, differential_reference(q, k, v, causal, 0.8, pad), atol=1e-12, rtol=1e-10)
    if which == "all padding":
        assert out[1].abs().max() == 0


def test_padding_in_cross_attention_and_padded_keys_change_nothing():
    q, k, v = qkv(20, 33, dtype=torch.float64)
    pad = pads(33)["scattered"]
    out = ac.attention("differential", q, k, v, key_padding_mask=pad)
    torch.testing.assert_close(out, differential_reference(q, k, v, False, 0.8, pad), atol=1e-12, rtol=1e-10)
    noise = 50 * torch.randn(k.shape, dtype=torch.float64) * pad[:, None, :, None]
    torch.testing.assert_close(ac.attention("differential", q, k + noise, v + noise, key_padding_mask=pad), out)


@pytest.mark.parametrize("kv_heads", [1, 2])
@pytest.mark.parametrize("causal", [False, True])
def test_shared_heads_equal_the_keys_repeated_by_hand(kv_heads, causal):
    q, k, v = qkv(31, H=4, Hk=kv_heads, dtype=torch.float64)
    pad = pads(31)["lengths"]
    for mask in (None, pad):
        out = ac.attention("differential", q, k, v, causal=causal, key_padding_mask=mask)
        kr, vr = by_hand(k, 4), by_hand(v, 4)
        torch.testing.assert_close(out, differential_reference(q, kr, vr, causal, 0.8, mask), atol=1e-12, rtol=1e-10)


@pytest.mark.parametrize("kv_heads", [4, 2])
@pytest.mark.parametrize("causal", [False, True])
def test_gradients_equal_the_reference(kv_heads, causal):
    q, k, v = qkv(33, H=4, Hk=kv_heads, D=8, dtype=torch.float64, grad=True)
    pad = pads(33)["left"]
    w = torch.randn(2, 4, 33, 8, generator=torch.Generator().manual_seed(1), dtype=torch.float64)
    for mask in (None, pad):
        got = torch.autograd.grad((ac.attention("differential", q, k, v, causal=causal, lam=0.6,
                                                key_padding_mask=mask) * w).sum(), (q, k, v))
        ref = differential_reference(q, by_hand(k, 4), by_hand(v, 4), causal, 0.6, mask)
        want = torch.autograd.grad((ref * w).sum(), (q, k, v))
        for a, b in zip(got, want):
            assert torch.isfinite(a).all()
            torch.testing.assert_close(a, b, atol=1e-10, rtol=1e-8)


def generated(key: str, q, k, v, n0: int, max_len: int | None, **params) -> torch.Tensor:
    """Prefill the first n0 tokens, step through the rest: the outputs (B, H, n, D); the cache's bytes checked."""
    out, cache = gen.prefill(key, q[:, :, :n0], k[:, :, :n0], v[:, :, :n0], max_len=max_len, **params)
    outs = [out]
    for t in range(n0, q.shape[-2]):
        o, cache = gen.step(key, q[:, :, t:t + 1], k[:, :, t:t + 1], v[:, :, t:t + 1], cache)
        outs.append(o)
    assert cache.used_bytes == gen.cache_bytes(key, Shape.of(q, k, True), **params)
    return torch.cat(outs, 2)


@pytest.mark.parametrize("kv_heads", [4, 2])
@pytest.mark.parametrize("n0,max_len", [(1, None), (9, None), (9, 26)])
def test_generation_step_by_step_equals_the_causal_forward(kv_heads, n0, max_len):
    q, k, v = qkv(26, H=4, Hk=kv_heads, D=8)
    full = ac.attention("differential", q, k, v, causal=True, lam=0.7)
    torch.testing.assert_close(generated("differential", q, k, v, n0, max_len, lam=0.7), full, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(full.double(), differential_reference(q, by_hand(k, 4), by_hand(v, 4), True, 0.7),
                               atol=2e-5, rtol=1e-5)


def test_a_step_costs_what_its_spec_says():
    q, k, v = qkv(40, H=4, Hk=2, D=8)
    cache = gen.remember("differential", k[:, :, :39], v[:, :, :39])
    with torch.no_grad(), FlopCounterMode(display=False) as counter:
        gen.step("differential", q[:, :, 39:], k[:, :, 39:], v[:, :, 39:], cache)
    spec = ac.get("differential").supports.generation
    assert spec.flops(Shape(2, 4, 1, 40, 8, Hk=2)) == counter.get_total_flops() == 4 * 2 * 4 * 40 * 8


def test_effective_weights_are_signed_rows_summing_to_one_minus_lam():
    q, k, v = qkv(13, dtype=torch.float64)
    from attn_core.insight import effective as ef

    for causal in (False, True):
        eff = ef.effective_attention("differential", q, k, v, causal=causal, lam=0.8)
        torch.testing.assert_close(eff.weights.sum(-1), torch.full((2, 4, 13), 0.2, dtype=torch.float64))
        torch.testing.assert_close(eff.output(), differential_reference(q, k, v, causal, 0.8))
        assert (eff.weights < 0).any()
        if causal:
            assert eff.weights.triu(1).abs().max() == 0


def test_no_quadratic_tensor():
    """n = 8192, B = H = 1, D = 32: an (n, n) fp32 map is 256 MiB; the peak stays near the output (1 MiB)."""
    n, d = 8192, 32
    q, k, v = qkv(n, B=1, H=1, D=d)
    for causal in (False, True):
        with torch.inference_mode():
            peak = profiled_peak(lambda: ac.attention("differential", q, k, v, causal=causal))
        assert n * d * 4 <= peak < 8 * n * d * 4, peak


def test_spec_costs():
    spec = ac.get("differential")
    s = Shape(2, 4, 300, 300, 16)
    assert spec.cost.flops(s) == 6 * 8 * 300 * 300 * 16  # two half-width maps, two products with the whole V
    assert spec.cost.executed(s) == 8 * 8 * 300 * 300 * 16  # each map computed twice, once per half of V
    assert spec.cost.flops(Shape(2, 4, 300, 300, 16, causal=True)) == 6 * 8 * 300 * 301 / 2 * 16
    big = Shape(1, 8, 32768, 32768, 64)  # the four halves (twice the output) and the kernel's scratch: no n × n
    assert 2 * big.output_bytes <= spec.cost.memory_bytes(big) < 2.1 * big.output_bytes


@pytest.mark.parametrize("d", [1, 7, 15])
def test_an_odd_head_dim_is_refused_with_a_sentence(d):
    q, k, v = qkv(8, D=d)
    with pytest.raises(ValueError, match=f"head_dim = {d}: choose an even head_dim"):
        ac.attention("differential", q, k, v)
    with pytest.raises(ValueError, match="must be even"):
        gen.remember("differential", k, v)
    with pytest.raises(ValueError, match="must be even"):
        signed_weights(q, k, False, 0.8)


@pytest.mark.parametrize("lam", [-0.1, 1.5, float("nan"), "0.8"])
def test_a_lam_outside_its_range_is_refused(lam):
    q, k, v = qkv(8)
    with pytest.raises(ValueError, match="lam = .* is not allowed; choose a finite number between 0.0 and 1.0"):
        ac.attention("differential", q, k, v, lam=lam)
