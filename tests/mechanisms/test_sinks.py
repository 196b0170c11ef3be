"""Attention sinks (gpt-oss, arXiv 2508.10925): a learned logit per head in each row's softmax denominator, with no
value. Every mechanism whose spec has `supports.sinks` against tests.baselines.sink_softmax, a materialized softmax
with that extra column: forward, backward, padding, shared key/value heads, generation, and its memory."""
from __future__ import annotations

import pytest
import torch

import attn_core as ac
from attn_core.nn import generation as gen
from attn_core.spec import Shape
from tests.baselines import allowed, sink_softmax, trace_peak_bytes
from tests.contract.test_mechanisms import MEMORY_N

SINKS = [key for key, spec in ac.MECHANISMS.items() if spec.supports.sinks]
SPARSE = {"longformer", "bigbird", "topk", "nsa"}  # their patterns, selections and branches: test_sinks_sparse.py
DENSE = [key for key in SINKS if key not in SPARSE]
SMALL = {"softmax": ("full", {}), "sdpa": ("full", {}), "sliding_window": ("sliding_window", {"window": 5}),
         "local": ("local", {"block": 8, "lookback": 1, "lookahead": 2})}


def inputs(n: int = 37, *, H: int = 4, Hk: int = 4, seed: int = 0, grad: bool = False):
    g = torch.Generator().manual_seed(seed)
    q = torch.randn(2, H, n, 16, generator=g)
    k, v = (torch.randn(2, Hk, n, 16, generator=g) for _ in range(2))
    sinks = torch.randn(H, generator=g) * 2  # logits of either sign, some above the rows' own
    return [t.requires_grad_(grad) for t in (q, k, v, sinks)]


def pattern(key: str, n: int, causal: bool):
    kind, params = SMALL[key]
    return allowed(kind, n, n, causal, **params), params


def test_the_mechanisms_that_take_sinks_are_all_tested_here():
    assert {"softmax", "sdpa", "sliding_window", "local"} <= set(DENSE) <= set(SMALL)


@pytest.mark.parametrize("key", DENSE)
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("Hk", [4, 2, 1])
@pytest.mark.parametrize("n", [37, 64])
def test_sinks_equal_softmax_with_a_zero_valued_sink_column(key, causal, Hk, n):
    q, k, v, sinks = inputs(n, Hk=Hk)
    mask, params = pattern(key, n, causal)
    with torch.no_grad():  # the fast paths: each row's log-sum-exp from the fused kernel, where it has one
        out = ac.attention(key, q, k, v, causal=causal, sinks=sinks, **params)
    torch.testing.assert_close(out.double(), sink_softmax(q, k, v, sinks, mask), atol=2e-6, rtol=1e-5)


@pytest.mark.parametrize("key", DENSE)
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("Hk", [4, 2])
def test_gradients_to_q_k_v_and_the_sinks_equal_the_reference(key, causal, Hk):
    n = 37
    q, k, v, sinks = inputs(n, Hk=Hk, grad=True)
    mask, params = pattern(key, n, causal)
    pad = torch.zeros(2, n, dtype=torch.bool)
    pad[1, 30:] = True
    out = ac.attention(key, q, k, v, causal=causal, sinks=sinks, key_padding_mask=pad, **params)
    g = torch.randn(out.shape, generator=torch.Generator().manual_seed(9))
    got = torch.autograd.grad((out * g).sum(), (q, k, v, sinks))
    expected = torch.autograd.grad((sink_softmax(q, k, v, sinks, mask, pad) * g.double()).sum(), (q, k, v, sinks))
    torch.testing.assert_close(out.double(), sink_softmax(q, k, v, sinks, mask, pad), atol=2e-6, rtol=1e-5)
    for a, b in zip(got, expected):
        torch.testing.assert_close(a.double(), b.double(), atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("key", DENSE)
@pytest.mark.parametrize("causal", [False, True])
def test_padding_with_sinks_and_a_row_that_sees_no_key_outputs_zeros(key, causal):
    n = 37
    q, k, v, sinks = inputs(n, Hk=2)
    mask, params = pattern(key, n, causal)
    pad = torch.zeros(2, n, dtype=torch.bool)
    pad[0, :6] = True  # causal: the first six queries of element 0 see nothing
    pad[1] = True  # all padding
    with torch.no_grad():
        out = ac.attention(key, q, k, v, causal=causal, sinks=sinks, key_padding_mask=pad, **params)
    expected = sink_softmax(q, k, v, sinks, mask, pad)  # a row with only the sink: weight 1 on a zero value
    torch.testing.assert_close(out.double(), expected, atol=2e-6, rtol=1e-5)
    assert not out[1].any()


@pytest.mark.parametrize("key", DENSE)
def test_generation_with_sinks_equals_the_reference(key):
    n, n0 = 29, 9
    q, k, v, sinks = inputs(n, H=4, Hk=2, seed=3)
    mask, params = pattern(key, n, True)
    out, cache = gen.prefill(key, q[:, :, :n0], k[:, :, :n0], v[:, :, :n0], sinks=sinks, **params)
    steps = [gen.step(key, q[:, :, t:t + 1], k[:, :, t:t + 1], v[:, :, t:t + 1], cache)[0] for t in range(n0, n)]
    got = torch.cat([out, *steps], dim=2)
    torch.testing.assert_close(got.double(), sink_softmax(q, k, v, sinks, mask), atol=2e-6, rtol=1e-5)


def test_a_very_low_sink_changes_nothing_and_a_high_one_takes_the_mass():
    q, k, v, _ = inputs(16)
    plain = ac.attention("sdpa", q, k, v)
    torch.testing.assert_close(ac.attention("sdpa", q, k, v, sinks=torch.full((4,), -1e4)), plain)
    assert ac.attention("sdpa", q, k, v, sinks=torch.full((4,), 1e4)).abs().max() < 1e-30


@pytest.mark.parametrize("sinks,words", [
    (torch.zeros(3), r"shape \(heads,\) = \(4,\)"),
    (torch.zeros(1, 4), r"shape \(heads,\) = \(4,\)"),
    (torch.zeros(4, dtype=torch.long), "floating-point tensor"),
    ([0.0] * 4, "floating-point tensor"),
    (torch.tensor([0.0, float("nan"), 0.0, 0.0]), "NaN or infinite"),
    (torch.tensor([0.0, float("-inf"), 0.0, 0.0]), "sinks=None"),
    (torch.zeros(4, device="meta"), "sinks are on meta"),
])
def test_bad_sinks_are_refused_with_a_sentence(sinks, words):
    q, k, v, _ = inputs(8)
    with pytest.raises(ValueError, match=words):
        ac.attention("softmax", q, k, v, sinks=sinks)


def test_a_mechanism_without_sinks_refuses_them_naming_those_that_take_them():
    q, k, v, sinks = inputs(8)
    with pytest.raises(ValueError, match="cannot take attention sinks.*sdpa"):
        ac.attention("linear", q, k, v, sinks=sinks)
    with pytest.raises(ValueError, match="cannot take attention sinks"):
        gen.prefill("linear", q, k, v, sinks=sinks)


@pytest.mark.parametrize("key", SINKS)
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
@pytest.mark.parametrize("n, d", [(None, 40), (1024, 128)], ids=["its-n-40", "1024-128"])
def test_spec_memory_with_sinks_matches_the_allocator(key, causal, dtype, n, d):
    """sinks_memory against the allocator's records within 2%, at the shape of
    test_spec_memory_matches_an_independent_allocator_reading (B=2, H=3, D=40, n = 3000 or its MEMORY_N),
    defaults, and at a short sequence of wide heads (n = 1024, D = 128), where a (B, H, n, D) tensor more or less is
    6% of softmax's peak."""
    if ac.get(key).supports.causal_only and not causal:
        pytest.skip(f"{key} runs causal only")
    if key == "nsa" and dtype == "bfloat16" and n and getattr(torch.cpu, "_is_amx_tile_supported", bool)():
        pytest.skip("on a CPU with AMX, oneDNN's bfloat16 products (NSA's branches in torch) allocate packing "
                    "scratch that depends on their shapes and threads, which the model does not hold: it is 5.8% "
                    "under the allocator at n = 1024, D = 128 on a 2-core Xeon, with or without sinks")
    n = n or MEMORY_N.get(key, 3000)
    shape = Shape(2, 3, n, n, d, dtype=dtype, causal=causal)
    g = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(2, 3, n, d, generator=g).to(getattr(torch, dtype)) for _ in range(3))
    sinks = torch.randn(3, generator=g)
    fn = ac.get(key).fn
    with torch.inference_mode():
        call = lambda: fn(q, k, v, causal=causal, sinks=sinks)  # noqa: E731
        call()
        measured = trace_peak_bytes(call)
    assert ac.get(key).cost.sinks_memory(shape) == pytest.approx(measured, rel=0.02)


def test_sdpa_memory_with_sinks_and_shared_heads_matches_the_allocator():
    shape = Shape(2, 4, 3000, 3000, 40, Hk=2)
    q, k, v, _ = inputs(3000, Hk=2)
    q, k, v = (torch.randn(t.shape[:-1] + (40,)) for t in (q, k, v))
    with torch.inference_mode():
        call = lambda: ac.get("sdpa").fn(q, k, v, sinks=torch.zeros(4))  # noqa: E731
        call()
        measured = trace_peak_bytes(call)
    assert ac.get("sdpa").cost.sinks_memory(shape) == pytest.approx(measured, rel=0.02)


def test_the_flops_sinks_add_are_one_rescaled_row_a_head():
    s = Shape(2, 8, 4096, 4096, 64)
    assert ac.get("sdpa").cost.sink_flops(s) == 2 * 8 * 4096 * (64 + 4)
    assert ac.get("sdpa").cost.sink_flops(s) < 1e-3 * ac.get("sdpa").cost.flops(s)
