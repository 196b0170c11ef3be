"""Sigmoid attention against its formula materialized in float64 (tests/baselines.py), at several chunk sizes, in
every form it runs: causal and not, cross, padded, shared key/value heads, token by token, and its gradients."""
from __future__ import annotations

import math

import pytest
import torch
from torch.utils.flop_counter import FlopCounterMode

import attn_core as ac
from attn_core.mechanisms import sigmoid as sig
from attn_core.spec import Shape
from tests.baselines import sigmoid_reference
from tests.mechanisms.test_differential import by_hand, generated, pads, qkv
from tests.contract.test_mechanisms import profiled_peak

# CHUNK_ELEMS for B·Hk = 2·4 = 8 key sequences of n keys: one row a chunk, 5 rows (n = 37: the last chunk holds 2),
# and the default (every row in one chunk at these sizes).
CHUNKS = {"1 row": 1, "5 rows": 8 * 37 * 5, "default": sig.CHUNK_ELEMS}


@pytest.mark.parametrize("chunk", list(CHUNKS))
@pytest.mark.parametrize("n", [1, 2, 37, 64])
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("bias", [0.0, -3.0, 2.5])
def test_equals_the_materialized_formula(chunk, n, causal, bias, monkeypatch):
    monkeypatch.setattr(sig, "CHUNK_ELEMS", CHUNKS[chunk])
    q, k, v = qkv(n)
    out = ac.attention("sigmoid", q, k, v, causal=causal, bias=bias)
    assert out.shape == q.shape and out.dtype == q.dtype
    torch.testing.assert_close(out.double(), sigmoid_reference(q, k, v, causal, bias), atol=2e-5, rtol=1e-5)


def test_the_default_bias_is_the_papers_minus_ln_n():
    """Non-causal on n keys, the weights are σ(q·k/√D − ln n), written here with the literal ln n."""
    q, k, v = qkv(50, D=12, dtype=torch.float64)
    w = torch.sigmoid(q @ k.transpose(-2, -1) / math.sqrt(12) - math.log(50))
    torch.testing.assert_close(ac.attention("sigmoid", q, k, v), w @ v, atol=1e-12, rtol=1e-10)
    torch.testing.assert_close(ac.attention("sigmoid", q, k, v, bias=1.5), torch.sigmoid(
        q @ k.transpose(-2, -1) / math.sqrt(12) - math.log(50) + 1.5) @ v, atol=1e-12, rtol=1e-10)


def test_an_odd_head_dim_and_cross_attention():
    q, k, v = qkv(20, 33, D=7, dtype=torch.float64)
    torch.testing.assert_close(ac.attention("sigmoid", q, k, v, bias=-1.0),
                               sigmoid_reference(q, k, v, False, -1.0), atol=1e-12, rtol=1e-10)


@pytest.mark.parametrize("chunk", ["1 row", "5 rows", "default"])
@pytest.mark.parametrize("which", ["lengths", "left", "scattered", "all padding"])
@pytest.mark.parametrize("causal", [False, True])
def test_padding_and_queries_that_see_no_key(chunk, which, causal, monkeypatch):
    monkeypatch.setattr(sig, "CHUNK_ELEMS", CHUNKS[chunk])
    q, k, v = qkv(37, dtype=torch.float64)
    pad = pads(37)[which]
    out = ac.attention("sigmoid", q, k, v, causal=causal, key_padding_mask=pad)
    torch.testing.assert_close(out, sigmoid_reference(q, k, v, causal, 0.0, pad), atol=1e-12, rtol=1e-10)
    if which == "all padding":
        assert out[1].abs().max() == 0


def test_a_padded_sequence_equals_the_short_one_and_padded_keys_change_nothing():
    """The bias counts the real keys, so right padding is as if the sequence ended before it."""
    q, k, v = qkv(30, dtype=torch.float64)
    pad = torch.arange(30)[None, :] >= torch.tensor([30, 19])[:, None]
    out = ac.attention("sigmoid", q, k, v, key_padding_mask=pad)
    short = ac.attention("sigmoid", q[1:, :, :19], k[1:, :, :19], v[1:, :, :19])
    torch.testing.assert_close(out[1:, :, :19], short, atol=1e-12, rtol=1e-10)
    noise = 50 * torch.randn(k.shape, dtype=torch.float64) * pad[:, None, :, None]
    torch.testing.assert_close(ac.attention("sigmoid", q, k + noise, v + noise, key_padding_mask=pad), out)
    cross_q = qkv(11, 30, dtype=torch.float64, seed=4)[0]
    torch.testing.assert_close(ac.attention("sigmoid", cross_q, k, v, key_padding_mask=pad),
                               sigmoid_reference(cross_q, k, v, False, 0.0, pad), atol=1e-12, rtol=1e-10)


@pytest.mark.parametrize("chunk", ["1 row", "default"])
@pytest.mark.parametrize("kv_heads", [1, 2])
@pytest.mark.parametrize("causal", [False, True])
def test_shared_heads_equal_the_keys_repeated_by_hand(chunk, kv_heads, causal, monkeypatch):
    monkeypatch.setattr(sig, "CHUNK_ELEMS", CHUNKS[chunk])
    q, k, v = qkv(31, H=4, Hk=kv_heads, D=6, dtype=torch.float64)
    for mask in (None, pads(31)["lengths"]):
        out = ac.attention("sigmoid", q, k, v, causal=causal, key_padding_mask=mask)
        want = sigmoid_reference(q, by_hand(k, 4), by_hand(v, 4), causal, 0.0, mask)
        torch.testing.assert_close(out, want, atol=1e-12, rtol=1e-10)


@pytest.mark.parametrize("chunk", ["5 rows", "default"])
@pytest.mark.parametrize("kv_heads", [4, 2])
@pytest.mark.parametrize("causal", [False, True])
def test_gradients_equal_the_reference(chunk, kv_heads, causal, monkeypatch):
    monkeypatch.setattr(sig, "CHUNK_ELEMS", CHUNKS[chunk])
    q, k, v = qkv(37, H=4, Hk=kv_heads, D=8, dtype=torch.float64, grad=True)
    w = torch.randn(2, 4, 37, 8, generator=torch.Generator().manual_seed(1), dtype=torch.float64)
    for mask in (None, pads(37)["left"]):
        got = torch.autograd.grad((ac.attention("sigmoid", q, k, v, causal=causal, bias=-0.5,
                                                key_padding_mask=mask) * w).sum(), (q, k, v))
        ref = sigmoid_reference(q, by_hand(k, 4), by_hand(v, 4), causal, -0.5, mask)
        want = torch.autograd.grad((ref * w).sum(), (q, k, v))
        for a, b in zip(got, want):
            assert torch.isfinite(a).all()
            torch.testing.assert_close(a, b, atol=1e-10, rtol=1e-8)


@pytest.mark.parametrize("kv_heads", [4, 2])
@pytest.mark.parametrize("n0,max_len", [(1, None), (9, None), (9, 26)])
def test_generation_step_by_step_equals_the_causal_forward(kv_heads, n0, max_len, monkeypatch):
    monkeypatch.setattr(sig, "CHUNK_ELEMS", CHUNKS["5 rows"])
    q, k, v = qkv(26, H=4, Hk=kv_heads, D=8)
    full = ac.attention("sigmoid", q, k, v, causal=True, bias=0.7)
    torch.testing.assert_close(generated("sigmoid", q, k, v, n0, max_len, bias=0.7), full, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(full.double(), sigmoid_reference(q, by_hand(k, 4), by_hand(v, 4), True, 0.7),
                               atol=2e-5, rtol=1e-5)


def test_effective_weights_are_the_sigmoids_themselves():
    from attn_core.insight import effective as ef

    q, k, v = qkv(13, dtype=torch.float64)
    for causal in (False, True):
        eff = ef.effective_attention("sigmoid", q, k, v, causal=causal, bias=0.0)
        torch.testing.assert_close(eff.output(), sigmoid_reference(q, k, v, causal, 0.0))
        assert (eff.weights >= 0).all() and (eff.weights <= 1).all()
        assert (eff.weights.sum(-1) - 1).abs().max() > 0.05  # nothing normalises the rows
        if causal:
            assert eff.weights.triu(1).abs().max() == 0


@pytest.mark.parametrize("causal", [False, True])
def test_executed_flops_count_each_chunks_cells(causal, monkeypatch):
    monkeypatch.setattr(sig, "CHUNK_ELEMS", CHUNKS["5 rows"])
    q, k, v = qkv(37, H=4, Hk=2, D=8)
    shape = Shape.of(q, k, causal)
    with torch.no_grad(), FlopCounterMode(display=False) as counter:
        ac.get("sigmoid").fn(q, k, v, causal=causal)
    rows = sig.chunk_rows(shape.bk, 37, 37)
    cells = 37 * 37 if not causal else sum(min(37, s + rows) * (min(37, s + rows) - s) for s in range(0, 37, rows))
    assert counter.get_total_flops() == ac.get("sigmoid").cost.executed(shape) == 4 * 8 * cells * 8
    assert ac.get("sigmoid").cost.flops(shape) == 4 * 8 * (37 * 38 / 2 if causal else 37 * 37) * 8


def test_no_quadratic_tensor():
    """n = 8192, B = H = 1, D = 32: an (n, n) fp32 matrix is 256 MiB; the peak is the output (1 MiB) and one chunk
    of weights (CHUNK_ELEMS, 4 MiB)."""
    n, d = 8192, 32
    q, k, v = qkv(n, B=1, H=1, D=d)
    for causal in (False, True):
        with torch.inference_mode():
            peak = profiled_peak(lambda: ac.attention("sigmoid", q, k, v, causal=causal))
        assert peak == pytest.approx(ac.get("sigmoid").cost.memory_bytes(Shape(1, 1, n, n, d, causal=causal)),
                                     rel=0.02)
        assert peak < 6 * n * d * 4


@pytest.mark.parametrize("bias", [-21.0, 20.5, float("inf"), None])
def test_a_bias_outside_its_range_is_refused(bias):
    q, k, v = qkv(8)
    with pytest.raises(ValueError, match="bias = .* is not allowed; choose a finite number between -20.0 and 20.0"):
        ac.attention("sigmoid", q, k, v, bias=bias)
