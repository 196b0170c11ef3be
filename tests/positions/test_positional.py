"""Positional encodings against their formulas written out here, their defining properties, and the additive score
bias that carries ALiBi and relative positions into softmax and SDPA."""
from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from attn_core import MECHANISMS, attention
from attn_core.positions import encodings as positional


def test_sinusoidal_values_are_the_formula():
    n, d = 7, 10
    table = positional.sinusoidal(n, d, dtype=torch.float64).numpy()
    for pos in range(n):
        for i in range(d // 2):
            angle = pos / 10000 ** (2 * i / d)
            assert table[pos, 2 * i] == pytest.approx(math.sin(angle), abs=1e-12)
            assert table[pos, 2 * i + 1] == pytest.approx(math.cos(angle), abs=1e-12)
    assert np.abs(table).max() <= 1 and len({tuple(np.round(r, 9)) for r in table}) == n  # bounded and unique


@pytest.mark.parametrize("k", [1, 3, 11])
def test_a_shift_is_a_linear_map_of_the_sinusoidal_code(k):
    """PE(pos + k) = T_k PE(pos), T_k block-diagonal: per pair (sin a, cos a) → (sin(a + b), cos(a + b)) with
    b = k·ω_i, the rotation [[cos b, sin b], [−sin b, cos b]]; the same T_k for every pos."""
    n, d = 40, 12
    pe = positional.sinusoidal(n + k, d, dtype=torch.float64).numpy()
    t = np.zeros((d, d))
    for i in range(d // 2):
        b = k / 10000 ** (2 * i / d)
        t[2 * i:2 * i + 2, 2 * i:2 * i + 2] = [[math.cos(b), math.sin(b)], [-math.sin(b), math.cos(b)]]
    assert np.allclose(pe[:n] @ t.T, pe[k:], atol=1e-12)
    assert not np.allclose(pe[:n], pe[k:], atol=1e-3)  # the shift does move the code


def test_rope_scores_depend_on_the_offset_only_and_keep_norms():
    g = torch.Generator().manual_seed(0)
    q, k = torch.randn(2, 5, 16, generator=g, dtype=torch.float64)
    pos_q, pos_k = torch.tensor([0, 3, 7, 2, 9]), torch.tensor([1, 1, 4, 8, 0])
    scores = (positional.rope(q, pos_q) * positional.rope(k, pos_k)).sum(-1)
    for shift in (1, 17, 1000):
        shifted = (positional.rope(q, pos_q + shift) * positional.rope(k, pos_k + shift)).sum(-1)
        assert torch.allclose(shifted, scores, atol=1e-5, rtol=0)
    assert not torch.allclose(scores, (q * k).sum(-1), atol=1e-3)  # the offsets do change the score
    x = torch.randn(3, 9, 8, generator=g)
    turned = positional.rope(x, torch.arange(9) * 5)
    assert torch.allclose(turned.norm(dim=-1), x.norm(dim=-1), rtol=1e-5)


def test_alibi_slopes_are_the_papers():
    assert positional.alibi_slopes(8).tolist() == [1 / 2, 1 / 4, 1 / 8, 1 / 16, 1 / 32, 1 / 64, 1 / 128, 1 / 256]
    assert positional.alibi_slopes(1).tolist() == [1 / 256]
    # 6 heads: the 4 slopes of 4 heads, then the 1st and 3rd of 8 heads' (1/2, 1/8), between them
    assert positional.alibi_slopes(6).tolist() == [1 / 4, 1 / 16, 1 / 64, 1 / 256, 1 / 2, 1 / 8]


def test_alibi_bias_is_minus_slope_times_distance():
    heads, n_q, n_k = 4, 3, 5
    bias = positional.alibi_bias(heads, n_q, n_k, dtype=torch.float64)
    assert bias.shape == (heads, n_q, n_k)
    for h in range(heads):
        m = 2 ** (-8 * (h + 1) / heads)
        for i in range(n_q):
            for j in range(n_k):
                assert float(bias[h, i, j]) == pytest.approx(-m * abs(i + n_k - n_q - j))


def test_relative_bias_reads_the_clipped_offset():
    table = torch.arange(2 * 7, dtype=torch.float64).view(2, 7)  # heads 2, max_distance 3
    bias = positional.relative_bias(4, 9, 3, heads=2, table=table, dtype=torch.float64)
    for h in range(2):
        for i in range(4):
            for j in range(9):
                assert bias[h, i, j] == table[h, min(max(j - i, -3), 3) + 3]


@pytest.mark.parametrize("call, words", [
    (lambda: positional.sinusoidal(4, 5), "positive even integer"),
    (lambda: positional.learned(0, 4), "n must be"),
    (lambda: positional.alibi_bias(0, 3, 3), "heads must be"),
    (lambda: positional.relative_bias(3, 3, 2, heads=2, table=torch.zeros(2, 4)), r"\(2, 5\)"),
    (lambda: positional.rope(torch.zeros(3, 5), torch.arange(3)), "even number of features")])
def test_bad_sizes_are_refused_with_a_sentence(call, words):
    with pytest.raises(ValueError, match=words):
        call()


def test_learned_is_seeded():
    assert torch.equal(positional.learned(5, 4, 3), positional.learned(5, 4, 3))
    assert not torch.equal(positional.learned(5, 4, 3), positional.learned(5, 4, 4))


# ---- permutation equivariance, and each encoding breaking it ----

N, D = 6, 8
G = torch.Generator().manual_seed(11)
W_Q, W_K, W_V = (torch.randn(D, D, generator=G, dtype=torch.float64) / math.sqrt(D) for _ in range(3))


def layer(x: torch.Tensor, encoding: str) -> torch.Tensor:
    """One softmax attention head over x (N, D) with `encoding` at positions 0 … N − 1."""
    if encoding == "sinusoidal":
        x = x + positional.sinusoidal(N, D, dtype=x.dtype)
    elif encoding == "learned":
        x = x + positional.learned(N, D, seed=2, dtype=x.dtype)
    q, k, v = x @ W_Q, x @ W_K, x @ W_V
    if encoding == "rope":
        q, k = positional.rope(q, torch.arange(N)), positional.rope(k, torch.arange(N))
    bias = {"relative": positional.relative_bias(N, N, 2, seed=1, dtype=x.dtype),
            "alibi": positional.alibi_bias(1, N, N, dtype=x.dtype) * 16}.get(encoding)
    return attention("softmax", q[None, None], k[None, None], v[None, None], score_bias=bias)[0, 0]


@pytest.mark.parametrize("encoding", ["none", "sinusoidal", "learned", "relative", "rope", "alibi"])
def test_attention_is_permutation_equivariant_until_positions_are_added(encoding):
    x = torch.randn(N, D, generator=torch.Generator().manual_seed(5), dtype=torch.float64)
    perm = torch.tensor([3, 0, 5, 1, 4, 2])
    permuted_then_attended, attended_then_permuted = layer(x[perm], encoding), layer(x, encoding)[perm]
    gap = float((permuted_then_attended - attended_then_permuted).abs().max())
    if encoding == "none":
        assert gap < 1e-12
    else:
        assert gap > 1e-3, encoding


# ---- the additive score bias in the mechanisms ----

def biased_by_hand(q, k, v, bias, causal=False, padded=None):
    """softmax(q kᵀ/√d + bias) v in float64, masked cells −∞, k and v repeated for shared heads."""
    group = q.shape[1] // k.shape[1]
    k, v = k.repeat_interleave(group, 1).double(), v.repeat_interleave(group, 1).double()
    s = q.double() @ k.transpose(-2, -1) / math.sqrt(q.shape[-1]) + bias.double()
    if causal:
        s = s.masked_fill(torch.ones(s.shape[-2:], dtype=torch.bool).triu(1), float("-inf"))
    if padded is not None:
        s = s.masked_fill(padded[:, None, None, :], float("-inf"))
    return torch.softmax(s, -1) @ v


@pytest.mark.parametrize("key", ["softmax", "sdpa"])
@pytest.mark.parametrize("causal, padded, kv_heads, bias_shape", [
    (False, False, 4, (4, 5, 5)), (True, False, 4, (4, 5, 5)), (False, True, 2, (2, 4, 5, 5)),
    (True, True, 1, (1, 1, 5, 5)), (False, False, 4, (5,))])
def test_softmax_and_sdpa_add_the_bias_to_the_scores(key, causal, padded, kv_heads, bias_shape):
    g = torch.Generator().manual_seed(3)
    q = torch.randn(2, 4, 5, 8, generator=g)
    k, v = torch.randn(2, 2, kv_heads, 5, 8, generator=g)
    bias = torch.randn(*bias_shape, generator=g) * 2
    pad = torch.tensor([[False] * 5, [False, False, False, True, True]]) if padded else None
    out = attention(key, q, k, v, causal=causal, key_padding_mask=pad, score_bias=bias)
    expected = biased_by_hand(q, k, v, bias, causal, pad)
    assert torch.allclose(out.double(), expected, atol=1e-5)
    assert not torch.allclose(attention(key, q, k, v, causal=causal, key_padding_mask=pad).double(), expected,
                              atol=1e-3)  # the bias does move the output


def test_only_mechanisms_whose_spec_says_so_take_a_bias():
    takers = sorted(key for key, spec in MECHANISMS.items() if spec.supports.score_bias)
    assert takers == ["sdpa", "softmax"]
    q = k = v = torch.randn(1, 2, 6, 8)
    with pytest.raises(ValueError, match="cannot take an additive score bias.*choose one of softmax, sdpa|"
                                         "cannot take an additive score bias.*choose one of sdpa, softmax"):
        attention("linear", q, k, v, score_bias=positional.alibi_bias(2, 6, 6))
    # sigmoid's own `bias` parameter (a number) is not the score bias (a tensor): it still reaches sigmoid
    assert attention("sigmoid", q, k, v, bias=1.5).shape == q.shape
    with pytest.raises(ValueError, match="Sigmoid.*cannot take an additive score bias"):
        attention("sigmoid", q, k, v, score_bias=positional.alibi_bias(2, 6, 6))


@pytest.mark.parametrize("bias, words", [
    (torch.zeros(3, 6, 6), r"does not broadcast to \(batch, heads, queries, keys\) = \(1, 2, 6, 6\)"),
    (torch.zeros(2, 6, 6, dtype=torch.bool), "floating-point tensor"),
    (torch.full((2, 6, 6), float("nan")), "score_bias holds 72 NaN")])
def test_a_bad_bias_is_refused_with_a_sentence(bias, words):
    q = k = v = torch.randn(1, 2, 6, 8)
    with pytest.raises(ValueError, match=words):
        attention("softmax", q, k, v, score_bias=bias)
