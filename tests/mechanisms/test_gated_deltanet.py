"""Gated DeltaNet (arXiv 2412.06464): the chunked form, the step and the effective matrix against the token-by-token
recurrence in float64 (tests/baselines.py), at chunk sizes that do and do not divide n; gradients; shared heads;
padding; the seeded gates; refusals with a sentence."""
from __future__ import annotations

import math

import pytest
import torch

import attn_core as ac
from attn_core.nn import generation as gen
from attn_core.insight import effective as ef
from attn_core.mechanisms import gated_deltanet as gdn
from attn_core.mechanisms._linear_core import causal_chunks
from attn_core.spec import Shape
from tests.baselines import chunk_pieces, gated_delta_reference
from tests.contract.test_mechanisms import profiled_peak

KEY = "gated_deltanet"


def inputs(n: int, *, B: int = 2, H: int = 4, Hk: int = 4, D: int = 8, seed: int = 0, dtype=torch.float64,
           grad: bool = False):
    g = torch.Generator().manual_seed(seed)
    q = torch.randn(B, H, n, D, generator=g, dtype=torch.float64)
    k, v = (torch.randn(B, Hk, n, D, generator=g, dtype=torch.float64) for _ in "kv")
    state = gdn.draw_gates(B, Hk, n, seed=seed + 1, dtype=dtype)  # in the work dtype: the kernel reads them in place
    return [t.to(dtype).requires_grad_(grad) for t in (q, k, v)], state


@pytest.mark.parametrize("chunk", [1, 3, 8, 32, 100])
@pytest.mark.parametrize("n", [1, 37, 64])  # odd, a multiple of 8 and 32, shorter than the chunk
def test_chunked_form_equals_the_recurrence(n, chunk):
    (q, k, v), state = inputs(n)
    out = ac.attention(KEY, q, k, v, causal=True, chunk=chunk, **state)
    torch.testing.assert_close(out, gated_delta_reference(q, k, v, **state), atol=1e-12, rtol=1e-10)


def test_segments_of_many_chunks_and_a_remainder_equal_the_recurrence(monkeypatch):
    """Segments cut to their least, 8 chunks: n = 300 with chunk 4 runs 10 segments of 32 tokens, the last shorter;
    n = 301 adds a chunk of one token of its own."""
    monkeypatch.setattr(gdn, "SEGMENT_BYTES", 4096)
    assert gdn.segment_rows(2, 8, 4) == 32
    for n in (300, 301):
        (q, k, v), state = inputs(n, B=1, H=2, Hk=2, seed=n)
        out = ac.attention(KEY, q, k, v, causal=True, chunk=4, **state)
        torch.testing.assert_close(out, gated_delta_reference(q, k, v, **state), atol=1e-12, rtol=1e-10)


def test_the_modules_own_recurrence_is_the_reference():
    (q, k, v), state = inputs(23, Hk=2)
    torch.testing.assert_close(gdn.recurrence(q, k, v, state["alpha"], state["beta"]),
                               gated_delta_reference(q, k, v, **state), atol=1e-12, rtol=1e-10)


@pytest.mark.parametrize("kv_heads", [1, 2])
def test_shared_heads_read_one_state_written_by_their_gates(kv_heads):
    """Gates per key/value head: a group's query heads read the one state that head's keys, values and gates write,
    the same as each query head given its own copy of them."""
    (q, k, v), state = inputs(29, Hk=kv_heads)
    out = ac.attention(KEY, q, k, v, causal=True, chunk=8, **state)
    group = 4 // kv_heads
    repeated = {name: t.repeat_interleave(group, dim=1) for name, t in state.items()}
    torch.testing.assert_close(out, gated_delta_reference(q, *(t.repeat_interleave(group, 1) for t in (k, v)),
                                                          **repeated), atol=1e-12, rtol=1e-10)


@pytest.mark.parametrize("chunk", [4, 16])
def test_gradients_equal_the_recurrences(chunk):
    (q, k, v), state = inputs(21, B=1, H=2, Hk=1, grad=True)
    alpha, beta = (t.requires_grad_(True) for t in state.values())
    w = torch.randn(1, 2, 21, 8, generator=torch.Generator().manual_seed(9), dtype=torch.float64)
    got = torch.autograd.grad((ac.attention(KEY, q, k, v, causal=True, chunk=chunk, alpha=alpha, beta=beta) * w)
                              .sum(), (q, k, v, alpha, beta))
    want = torch.autograd.grad((gated_delta_reference(q, k, v, alpha, beta) * w).sum(), (q, k, v, alpha, beta))
    for a, b in zip(got, want):
        torch.testing.assert_close(a, b, atol=1e-10, rtol=1e-8)


def test_a_gradient_in_q_alone_equals_the_recurrences():
    """Only q needs a gradient: the state's recurrence runs in place, the output's products out of place."""
    (q, k, v), state = inputs(19, B=1, H=2, Hk=1)
    q.requires_grad_(True)
    got = torch.autograd.grad(ac.attention(KEY, q, k, v, causal=True, chunk=4, **state).pow(2).sum(), q)[0]
    want = torch.autograd.grad(gated_delta_reference(q, k, v, **state).pow(2).sum(), q)[0]
    torch.testing.assert_close(got, want, atol=1e-10, rtol=1e-8)


def test_the_delta_rule_replaces_what_a_key_holds():
    """α = β = 1: writing v₁ then v₂ under one key leaves v₂ under it (S k̂ = v₂), where linear attention would hold
    their sum; a query along that key reads v₂/√d."""
    d = 8
    k = torch.zeros(1, 1, 2, d, dtype=torch.float64)
    k[..., 0] = torch.tensor([3.0, 0.5])  # one direction, two norms
    v = torch.randn(1, 1, 2, d, generator=torch.Generator().manual_seed(2), dtype=torch.float64)
    ones = torch.ones(1, 1, 2, dtype=torch.float64)
    out = ac.attention(KEY, k, k, v, causal=True, alpha=ones, beta=ones)
    torch.testing.assert_close(out[0, 0, 1], v[0, 0, 1] / math.sqrt(d))


def test_a_decay_of_one_half_halves_the_memory_each_token():
    """β = 1 then 0 (nothing written after the first token), α = 1/2: the first value read back at 2⁻ᵗ/√d, across
    chunks of 2."""
    d, n = 4, 5
    k = torch.zeros(1, 1, n, d, dtype=torch.float64)
    k[..., 0] = 1.0
    v = torch.randn(1, 1, n, d, generator=torch.Generator().manual_seed(3), dtype=torch.float64)
    beta = torch.zeros(1, 1, n, dtype=torch.float64)
    beta[..., 0] = 1.0
    out = ac.attention(KEY, k, k, v, causal=True, alpha=torch.full((1, 1, n), 0.5, dtype=torch.float64), beta=beta,
                       chunk=2)
    want = torch.stack([v[0, 0, 0] * 0.5 ** t / math.sqrt(d) for t in range(n)])  # α₀ decays S₀ = 0: t = 0 reads 1
    torch.testing.assert_close(out[0, 0], want)


@pytest.mark.parametrize("pad_at", ["end", "start", "scattered"])
def test_padded_tokens_leave_the_state_as_it_was(pad_at):
    (q, k, v), state = inputs(33, Hk=2)
    pad = torch.zeros(2, 33, dtype=torch.bool)
    if pad_at == "end":
        pad[1, 20:] = True
    elif pad_at == "start":
        pad[1, :11] = True
    else:
        pad[:, ::4] = True
    out = ac.attention(KEY, q, k, v, causal=True, key_padding_mask=pad, chunk=8, **state)
    torch.testing.assert_close(out, gated_delta_reference(q, k, v, **state, pad=pad), atol=1e-12, rtol=1e-10)
    if pad_at == "start":  # queries before the first real key see nothing: zeros
        assert out[1, :, :11].abs().max() == 0 and out[1, :, 11:].abs().min() > 0


def test_default_gates_are_seeded_within_their_ranges_and_the_same_for_a_prefix():
    long, short = gdn.draw_gates(2, 3, 500, seed=7), gdn.draw_gates(2, 3, 40, seed=7)
    for name in ("alpha", "beta"):
        assert long[name].dtype == torch.float32 and long[name].shape == (2, 3, 500)
        torch.testing.assert_close(long[name][..., :40], short[name], atol=0, rtol=0)
    assert math.exp(-0.1) <= long["alpha"].min() and long["alpha"].max() <= math.exp(-0.001)
    assert 1 / (1 + math.e ** 2) <= long["beta"].min() and long["beta"].max() <= 1 / (1 + math.e ** -2)
    assert not torch.equal(long["alpha"], gdn.draw_gates(2, 3, 500, seed=8)["alpha"])
    drawn = ac.make_state(KEY, Shape(2, 6, 40, 40, 8, Hk=3), seed=7)
    assert drawn.keys() == {"alpha", "beta"} and torch.equal(drawn["alpha"], short["alpha"])
    (q, k, v), _ = inputs(40, H=6, Hk=3, dtype=torch.float32)
    torch.testing.assert_close(ac.attention(KEY, q, k, v, causal=True, seed=7),
                               ac.attention(KEY, q, k, v, causal=True, **drawn))  # None: drawn from `seed`


@pytest.mark.parametrize("n0,max_len", [(1, None), (9, None), (9, 30), (30, None)])
def test_prefill_then_steps_equal_the_recurrence(n0, max_len):
    """Gates given for all 30 tokens: the prompt takes the first n0, the steps the rest."""
    (q, k, v), state = inputs(30, Hk=2, dtype=torch.float32)
    out, cache = gen.prefill(KEY, q[:, :, :n0], k[:, :, :n0], v[:, :, :n0], max_len=max_len, chunk=4, **state)
    outs = [out]
    for t in range(n0, 30):
        o, cache = gen.step(KEY, q[:, :, t:t + 1], k[:, :, t:t + 1], v[:, :, t:t + 1], cache)
        outs.append(o)
    torch.testing.assert_close(torch.cat(outs, 2).double(), gated_delta_reference(q, k, v, **state), atol=2e-6,
                               rtol=1e-5)
    assert cache.length == 30 and cache.nbytes == 2 * 2 * 8 * 8 * 4  # one 8×8 float32 state per key/value head


def test_steps_past_the_gates_held_draw_the_seeded_defaults_of_their_positions():
    """Default gates, a prompt of 3 and 40 steps: the cache's stream of gates grows past its first draw, and the
    outputs are those of the forward pass over all 43 tokens with the same seed."""
    (q, k, v), _ = inputs(43, Hk=1, dtype=torch.float32)
    _, cache = gen.prefill(KEY, q[:, :, :3], k[:, :, :3], v[:, :, :3], seed=5)
    outs = []
    for t in range(3, 43):
        o, cache = gen.step(KEY, q[:, :, t:t + 1], k[:, :, t:t + 1], v[:, :, t:t + 1], cache)
        outs.append(o)
    full = ac.attention(KEY, q, k, v, causal=True, seed=5)
    torch.testing.assert_close(torch.cat(outs, 2), full[:, :, 3:], atol=2e-6, rtol=1e-5)


def test_gates_given_past_the_prompt_for_one_and_drawn_for_the_other():
    """alpha given for all 26 tokens, beta drawn from the seed: the steps take alpha's tokens to come and beta's
    seeded defaults, as the forward pass over all 26 does."""
    (q, k, v), state = inputs(26, Hk=2, dtype=torch.float32)
    _, cache = gen.prefill(KEY, q[:, :, :4], k[:, :, :4], v[:, :, :4], alpha=state["alpha"], seed=2)
    outs = [gen.step(KEY, q[:, :, t:t + 1], k[:, :, t:t + 1], v[:, :, t:t + 1], cache)[0] for t in range(4, 26)]
    full = ac.attention(KEY, q, k, v, causal=True, alpha=state["alpha"], seed=2)
    torch.testing.assert_close(torch.cat(outs, 2), full[:, :, 4:], atol=2e-6, rtol=1e-5)


def test_the_state_is_the_same_size_at_every_context():
    sizes = set()
    for n in (1, 50, 700):
        (q, k, v), state = inputs(n, B=1, H=2, Hk=1, D=16, dtype=torch.float32)
        cache = gen.remember(KEY, k, v, **state)
        sizes.add((cache.nbytes, gen.cache_bytes(KEY, Shape(1, 2, n, n, 16, Hk=1))))
    assert sizes == {(16 * 16 * 4, 16 * 16 * 4)}


def test_the_effective_matrix_is_the_recurrences_mixing():
    (q, k, v), state = inputs(19, Hk=2)
    eff = ef.effective_attention(KEY, q, k, v, causal=True, state=state)
    torch.testing.assert_close(eff.output(), gated_delta_reference(q, k, v, **state), atol=1e-12, rtol=1e-10)
    assert eff.weights.shape == (2, 4, 19, 19) and eff.weights.triu(1).abs().max() == 0  # causal, lower triangle


def test_no_sequence_long_tensor_of_chunk_by_chunk_or_n_by_n():
    """n = 32768, B = H = 1, D = 32: the peak stays within a few outputs (4 MiB each)."""
    n, d = 32768, 32
    (q, k, v), state = inputs(n, B=1, H=1, Hk=1, D=d, dtype=torch.float32)
    with torch.inference_mode():
        ac.attention(KEY, q, k, v, causal=True, **state)  # first-call workspaces (LAPACK's) are not the mechanism's
        peak = profiled_peak(lambda: ac.attention(KEY, q, k, v, causal=True, **state))
    assert n * d * 4 <= peak < 4 * n * d * 4, peak
    assert peak == pytest.approx(ac.get(KEY).cost.memory_bytes(Shape(1, 1, n, n, d, causal=True)), rel=0.02)


@pytest.mark.parametrize("call,words", [
    (lambda q, k, v, s: ac.attention(KEY, q, k, v, causal=False, **s), ["causal only", "causal by construction",
                                                                          "causal=True"]),
    (lambda q, k, v, s: ac.attention(KEY, q, k[:, :, :5], v[:, :, :5], causal=True), ["self-attention only"]),
    (lambda q, k, v, s: ac.attention(KEY, q, k, v, causal=True, alpha=s["alpha"][:, :1], beta=s["beta"]),
     ["alpha", "(2, 2, 12)", "init_state"]),
    (lambda q, k, v, s: ac.attention(KEY, q, k, v, causal=True, alpha=s["alpha"], beta=s["beta"] + 1),
     ["beta must lie in [0, 1]"]),
    (lambda q, k, v, s: ac.attention(KEY, q, k, v, causal=True, alpha=s["alpha"] * 0, beta=s["beta"]),
     ["alpha must lie in (0, 1]"]),
    (lambda q, k, v, s: ac.attention(KEY, q, k, v, causal=True, chunk=0), ["chunk = 0", "between 1 and 1024"]),
])
def test_what_it_cannot_take_is_refused_with_a_sentence(call, words):
    (q, k, v), state = inputs(12, Hk=2)
    with pytest.raises(ValueError) as err:
        call(q, k, v, state)
    assert all(w in str(err.value) for w in words), str(err.value)


def test_spec_costs_count_the_chunk_forms_work():
    """The flops of chunk C, per token per key/value head with one query head each: 2·C·d (β K̂ K̂ᵀ) + 2·(C − 1)·d
    (the solve) + 4·d² (U and the state) + 4·C·d (Q̂ K̂ᵀ, its product with U) + 2·d² (the read), counted by hand at
    n = 64, C = 32, d = 8; the useful count leaves out the cells above the diagonals."""
    spec, s = ac.get(KEY), Shape(1, 1, 64, 64, 8, causal=True)
    c, d = 32, 8
    per_chunk = 2 * c * c * d + c * (c - 1) * 2 * d + 4 * c * d * d + 4 * c * c * d + 2 * c * d * d
    assert spec.cost.executed(s, chunk=c) == 2 * per_chunk
    useful = per_chunk - 2 * d * (c * c - c * (c - 1) / 2) - 4 * d * (c * c - c * (c + 1) / 2)
    assert spec.cost.flops(s, chunk=c) == 2 * useful
    assert spec.supports.generation.flops(s) == 7 * d * d  # 5·d² to update the state, 2·d² to read it


def looped_segments(s: Shape, chunk: int) -> list[tuple[int, int, int]]:
    """The plain reference: every chunk the kernel runs, walked token range by token range (tests.baselines)."""
    return [(1, tokens, c) for tokens, c in chunk_pieces(s.Nk, gdn.segment_rows(s.bk, s.D, chunk), chunk)]


# n: a few tokens, a chunk either side, a segment either side (256 tokens at B·Hk = 8, d = 64, C = 32), segments
# and a remainder; B·Hk and d change the segment's length, C the chunk's; half inputs and shared heads the terms.
@pytest.mark.parametrize("n", [1, 5, 31, 32, 33, 255, 256, 257, 1000, 4097, 65_536 + 77])
@pytest.mark.parametrize("B,H,Hk,d,chunk,dtype", [(1, 8, 8, 64, 32, "float32"), (2, 4, 1, 16, 7, "float16"),
                                                   (1, 32, 8, 128, 64, "bfloat16"), (3, 2, 2, 8, 1, "float64")])
def test_the_cost_models_segments_are_the_kernels_chunks(monkeypatch, n, B, H, Hk, d, chunk, dtype):
    s = Shape(B, H, n, n, d, dtype=dtype, causal=True, Hk=Hk)
    looped = looped_segments(s, chunk)
    kernels = causal_chunks(n, gdn.segment_rows(s.bk, s.D, chunk), chunk)  # what `chunked` loops over
    assert [(1, e - a, c) for a, e, c in kernels] == looped
    assert sorted((r, c) for m, r, c in gdn._segments(s, chunk) for _ in range(m)) == sorted(k[1:] for k in looped)
    closed = gdn._memory(s, chunk), gdn._flops(s, chunk), gdn._executed_flops(s, chunk)
    monkeypatch.setattr(gdn, "_segments", looped_segments)
    assert closed == (gdn._memory(s, chunk), gdn._flops(s, chunk), gdn._executed_flops(s, chunk))


def test_the_preset_linear_attention_grew_gates_is_causal_and_validates():
    from attn_core.engine import presets

    (config,) = presets.PRESETS["Linear attention grew gates"].for_device("cpu")
    assert [key for key, _ in config.mechanisms] == ["softmax", "linear", "mamba2", "gated_deltanet"]
    assert config.problem.causal and config.problems() == []
    assert config.replaced(causal=False).problems()  # the recurrences refuse to run without the mask, saying why
