"""Kimi Delta Attention (arXiv 2510.26692): the chunked form, both ways of forming its products, the step and the
effective matrix against a token-by-token recurrence in float64 written here; Gated DeltaNet as its special case
of one decay for all channels; gradients; shared heads; padding; the seeded gates; its cost model against the
allocator and torch's FLOP counter; refusals with a sentence."""
from __future__ import annotations

import math

import pytest
import torch
from torch.utils.flop_counter import FlopCounterMode

import attn_core as ac
from attn_core.nn import generation as gen
from attn_core.insight import effective as ef
from attn_core.mechanisms import kda
from attn_core.mechanisms._linear_core import causal_chunks
from attn_core.spec import Shape
from tests.baselines import chunk_pieces, kda_reference
from tests.contract.test_mechanisms import profiled_peak

KEY = "kda"




def inputs(n: int, *, B: int = 2, H: int = 4, Hk: int = 4, D: int = 8, seed: int = 0, dtype=torch.float64,
           grad: bool = False):
    g = torch.Generator().manual_seed(seed)
    q = torch.randn(B, H, n, D, generator=g, dtype=torch.float64)
    k, v = (torch.randn(B, Hk, n, D, generator=g, dtype=torch.float64) for _ in "kv")
    state = kda.draw_gates(B, Hk, n, D, seed=seed + 1, dtype=dtype)
    return [t.to(dtype).requires_grad_(grad) for t in (q, k, v)], state


def strong_gates(B: int, Hk: int, n: int, D: int, seed: int = 0, dtype=torch.float64) -> dict:
    """Decays from 0.0006 to 0.7 a token, per channel: a chunk of 32 spans far more than SPAN[float32] nats."""
    g = torch.Generator().manual_seed(seed)
    alpha = torch.exp(-torch.exp(torch.empty(B, Hk, n, D, dtype=torch.float64).uniform_(-1.0, 2.0, generator=g)))
    beta = torch.rand(B, Hk, n, generator=g, dtype=torch.float64)
    return {"alpha": alpha.to(dtype), "beta": beta.to(dtype)}


@pytest.mark.parametrize("chunk", [1, 3, 8, 32, 100])
@pytest.mark.parametrize("n", [1, 37, 100])  # odd, a multiple of none of the chunks, shorter than the chunk
def test_chunked_form_equals_the_recurrence(n, chunk):
    (q, k, v), state = inputs(n, Hk=2, seed=n)
    out = ac.attention(KEY, q, k, v, causal=True, chunk=chunk, **state)
    torch.testing.assert_close(out, kda_reference(q, k, v, **state), atol=1e-10, rtol=1e-10)


@pytest.mark.parametrize("chunk", [16, 32, 64])
def test_float32_stays_within_1e_4_of_the_float64_recurrence(chunk):
    (q, k, v), state = inputs(150, Hk=2, D=16, dtype=torch.float32)
    out = ac.attention(KEY, q, k, v, causal=True, chunk=chunk, **state)
    torch.testing.assert_close(out.double(), kda_reference(q, k, v, **state), atol=1e-4, rtol=1e-4)


@pytest.mark.parametrize("dtype,atol", [(torch.float64, 1e-10), (torch.float32, 1e-4)])
def test_strong_decays_take_the_pairwise_products_and_equal_the_recurrence(dtype, atol):
    """Decays down to 0.0006 a token: a chunk of 32 spans up to 200 nats, past float32's SPAN, so the products take
    e^(γ_r − γ_i) pair by pair (float64's SPAN is wider: it stays scaled). Either way the recurrence's output."""
    (q, k, v), _ = inputs(70, Hk=2, dtype=dtype)
    state = strong_gates(2, 2, 70, 8, dtype=dtype)
    span = float(state["alpha"].double().log().neg()[:, :, :32].sum(2).max())
    assert span > kda.SPAN[torch.float32]
    out = ac.attention(KEY, q, k, v, causal=True, chunk=32, **state)
    assert torch.isfinite(out).all()
    torch.testing.assert_close(out.double(), kda_reference(q, k, v, **state), atol=atol, rtol=atol)


@pytest.mark.parametrize("chunk", [1, 5, 16])
def test_pairwise_products_forced_equal_the_scaled_ones(monkeypatch, chunk):
    (q, k, v), state = inputs(41, Hk=2, seed=3)
    scaled = ac.attention(KEY, q, k, v, causal=True, chunk=chunk, **state)
    monkeypatch.setitem(kda.SPAN, torch.float64, -1.0)  # every chunk takes the pairwise form
    pairwise = ac.attention(KEY, q, k, v, causal=True, chunk=chunk, **state)
    torch.testing.assert_close(pairwise, scaled, atol=1e-12, rtol=1e-10)
    torch.testing.assert_close(pairwise, kda_reference(q, k, v, **state), atol=1e-10, rtol=1e-10)


def test_segments_of_many_chunks_and_a_remainder_equal_the_recurrence(monkeypatch):
    """Segments cut to their least, 8 chunks: n = 300 with chunk 4 runs segments of 32 tokens, the last shorter;
    n = 301 adds a chunk of one token of its own."""
    monkeypatch.setattr(kda, "SEGMENT_BYTES", 4096)
    assert kda.segment_rows(2, 8, 4) == 32
    for n in (300, 301):
        (q, k, v), state = inputs(n, B=1, H=2, Hk=2, seed=n)
        out = ac.attention(KEY, q, k, v, causal=True, chunk=4, **state)
        torch.testing.assert_close(out, kda_reference(q, k, v, **state), atol=1e-10, rtol=1e-10)


def test_the_modules_own_recurrence_is_the_reference():
    (q, k, v), state = inputs(23, Hk=2)
    torch.testing.assert_close(kda.recurrence(q, k, v, state["alpha"], state["beta"]),
                               kda_reference(q, k, v, **state), atol=1e-12, rtol=1e-10)


@pytest.mark.parametrize("chunk", [4, 32])
def test_one_decay_for_every_channel_is_gated_deltanet(chunk):
    """α_t the same in all d_k channels: Diag(α_t) = α_t I, and KDA is Gated DeltaNet with that α (same q, k, v, β)."""
    (q, k, v), state = inputs(53, Hk=2)
    alpha = state["alpha"][..., 0]  # (B, Hk, n)
    ours = ac.attention(KEY, q, k, v, causal=True, chunk=chunk, alpha=alpha[..., None].expand_as(state["alpha"]),
                        beta=state["beta"])
    theirs = ac.attention("gated_deltanet", q, k, v, causal=True, chunk=chunk, alpha=alpha.contiguous(),
                          beta=state["beta"])
    torch.testing.assert_close(ours, theirs, atol=1e-12, rtol=1e-10)


def test_a_channel_decays_at_its_own_rate():
    """β = 1 then 0, one key along channel 0 and one along channel 1 written at once (k̂ = (e₀ + e₁)/√2), channel 0
    kept (α = 1), channel 1 halved each token: a query along e₀ reads the value's e₀ share undecayed, one along e₁
    reads it halved t times."""
    d, n = 4, 5
    k = torch.zeros(1, 1, n, d, dtype=torch.float64)
    k[..., 0] = k[..., 1] = 1.0
    v = torch.randn(1, 1, n, d, generator=torch.Generator().manual_seed(3), dtype=torch.float64)
    alpha = torch.ones(1, 1, n, d, dtype=torch.float64)
    alpha[..., 1] = 0.5
    beta = torch.zeros(1, 1, n, dtype=torch.float64)
    beta[..., 0] = 1.0
    for axis, rate in ((0, 1.0), (1, 0.5)):
        q = torch.zeros(1, 1, n, d, dtype=torch.float64)
        q[..., axis] = 1.0
        out = ac.attention(KEY, q, k, v, causal=True, alpha=alpha, beta=beta, chunk=2)
        want = torch.stack([v[0, 0, 0] * rate ** t / math.sqrt(2 * d) for t in range(n)])
        torch.testing.assert_close(out[0, 0], want)


@pytest.mark.parametrize("kv_heads", [1, 2])
def test_shared_heads_read_one_state_written_by_their_gates(kv_heads):
    (q, k, v), state = inputs(29, Hk=kv_heads)
    out = ac.attention(KEY, q, k, v, causal=True, chunk=8, **state)
    group = 4 // kv_heads
    repeated = {name: t.repeat_interleave(group, dim=1) for name, t in state.items()}
    torch.testing.assert_close(out, kda_reference(q, *(t.repeat_interleave(group, 1) for t in (k, v)), **repeated),
                               atol=1e-10, rtol=1e-10)
    torch.testing.assert_close(out, kda_reference(q, k, v, **state), atol=1e-10, rtol=1e-10)


@pytest.mark.parametrize("chunk,pairwise", [(4, False), (16, False), (8, True)])
def test_gradients_equal_the_recurrences(monkeypatch, chunk, pairwise):
    if pairwise:
        monkeypatch.setitem(kda.SPAN, torch.float64, -1.0)
    (q, k, v), state = inputs(21, B=1, H=2, Hk=1, grad=True)
    alpha, beta = (t.requires_grad_(True) for t in state.values())
    w = torch.randn(1, 2, 21, 8, generator=torch.Generator().manual_seed(9), dtype=torch.float64)
    got = torch.autograd.grad((ac.attention(KEY, q, k, v, causal=True, chunk=chunk, alpha=alpha, beta=beta) * w)
                              .sum(), (q, k, v, alpha, beta))
    want = torch.autograd.grad((kda_reference(q, k, v, alpha, beta) * w).sum(), (q, k, v, alpha, beta))
    for a, b in zip(got, want):
        torch.testing.assert_close(a, b, atol=1e-10, rtol=1e-8)


def test_gradcheck_of_a_small_case():
    (q, k, v), state = inputs(7, B=1, H=2, Hk=1, D=4, grad=True)
    alpha = state["alpha"].requires_grad_(True)
    assert torch.autograd.gradcheck(lambda q, k, v, a: ac.attention(KEY, q, k, v, causal=True, chunk=3, alpha=a,
                                                                    beta=state["beta"]), (q, k, v, alpha))


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
    torch.testing.assert_close(out, kda_reference(q, k, v, **state, pad=pad), atol=1e-10, rtol=1e-10)
    if pad_at == "start":  # queries before the first real key see nothing: zeros
        assert out[1, :, :11].abs().max() == 0 and out[1, :, 11:].abs().min() > 0


def test_default_gates_are_seeded_within_their_ranges_and_the_same_for_a_prefix():
    long, short = kda.draw_gates(2, 3, 500, 8, seed=7), kda.draw_gates(2, 3, 40, 8, seed=7)
    assert long["alpha"].shape == (2, 3, 500, 8) and long["beta"].shape == (2, 3, 500)
    for name in ("alpha", "beta"):
        assert long[name].dtype == torch.float32
        torch.testing.assert_close(long[name][:, :, :40], short[name], atol=0, rtol=0)
    assert math.exp(-0.1) <= long["alpha"].min() and long["alpha"].max() <= math.exp(-0.001)
    assert 1 / (1 + math.e ** 2) <= long["beta"].min() and long["beta"].max() <= 1 / (1 + math.e ** -2)
    assert long["alpha"].std(-1).min() > 0  # each channel its own decay
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
    torch.testing.assert_close(torch.cat(outs, 2).double(), kda_reference(q, k, v, **state), atol=2e-6, rtol=1e-5)
    assert cache.length == 30 and cache.nbytes == 2 * 2 * 8 * 8 * 4  # one 8×8 float32 state per key/value head


def test_steps_token_by_token_equal_the_chunked_forward():
    """From an empty prompt of one token, float64: every step's output is the chunked forward's at its position."""
    (q, k, v), state = inputs(45, Hk=1)
    _, cache = gen.prefill(KEY, q[:, :, :1], k[:, :, :1], v[:, :, :1], **state)
    outs = [gen.step(KEY, q[:, :, t:t + 1], k[:, :, t:t + 1], v[:, :, t:t + 1], cache)[0] for t in range(1, 45)]
    full = ac.attention(KEY, q, k, v, causal=True, chunk=16, **state)
    torch.testing.assert_close(torch.cat(outs, 2), full[:, :, 1:], atol=1e-12, rtol=1e-10)


def test_steps_past_the_gates_held_draw_the_seeded_defaults_of_their_positions():
    (q, k, v), _ = inputs(43, Hk=1, dtype=torch.float32)
    _, cache = gen.prefill(KEY, q[:, :, :3], k[:, :, :3], v[:, :, :3], seed=5)
    outs = [gen.step(KEY, q[:, :, t:t + 1], k[:, :, t:t + 1], v[:, :, t:t + 1], cache)[0] for t in range(3, 43)]
    full = ac.attention(KEY, q, k, v, causal=True, seed=5)
    torch.testing.assert_close(torch.cat(outs, 2), full[:, :, 3:], atol=2e-6, rtol=1e-5)


def test_gates_given_past_the_prompt_for_one_and_drawn_for_the_other():
    (q, k, v), state = inputs(26, Hk=2, dtype=torch.float32)
    _, cache = gen.prefill(KEY, q[:, :, :4], k[:, :, :4], v[:, :, :4], alpha=state["alpha"], seed=2)
    outs = [gen.step(KEY, q[:, :, t:t + 1], k[:, :, t:t + 1], v[:, :, t:t + 1], cache)[0] for t in range(4, 26)]
    full = ac.attention(KEY, q, k, v, causal=True, alpha=state["alpha"], seed=2)
    torch.testing.assert_close(torch.cat(outs, 2), full[:, :, 4:], atol=2e-6, rtol=1e-5)


def test_remember_keeps_the_state_the_forward_ends_with():
    (q, k, v), state = inputs(50, Hk=2, dtype=torch.float32)
    remembered = gen.remember(KEY, k, v, chunk=8, **state)
    _, prefilled = gen.prefill(KEY, q, k, v, chunk=8, **state)
    torch.testing.assert_close(remembered.state, prefilled.state, atol=0, rtol=0)
    sizes = {gen.remember(KEY, k[:, :, :n], v[:, :, :n], **state).nbytes for n in (1, 17, 50)}
    assert sizes == {2 * 2 * 8 * 8 * 4} == {gen.cache_bytes(KEY, Shape(2, 4, 50, 50, 8, Hk=2))}


def test_the_effective_matrix_is_the_recurrences_mixing():
    (q, k, v), state = inputs(19, Hk=2)
    eff = ef.effective_attention(KEY, q, k, v, causal=True, state=state)
    torch.testing.assert_close(eff.output(), kda_reference(q, k, v, **state), atol=1e-10, rtol=1e-10)
    assert eff.weights.shape == (2, 4, 19, 19) and eff.weights.triu(1).abs().max() == 0


@pytest.mark.parametrize("n,H,Hk,d,dtype", [(32768, 1, 1, 32, torch.float32), (4000, 4, 2, 16, torch.float32),
                                            (5000, 2, 2, 64, torch.float16), (777, 2, 1, 24, torch.float64)])
def test_peak_memory_is_the_cost_models(n, H, Hk, d, dtype):
    """The allocator's peak above the inputs against `memory_bytes`, within 2%; n = 32768, D = 32: a few outputs."""
    (q, k, v), state = inputs(n, B=1, H=H, Hk=Hk, D=d, dtype=dtype)
    with torch.inference_mode():
        ac.attention(KEY, q, k, v, causal=True, **state)  # first-call workspaces (LAPACK's) are not the mechanism's
        peak = profiled_peak(lambda: ac.attention(KEY, q, k, v, causal=True, **state))
    s = Shape(1, H, n, n, d, dtype=str(dtype).removeprefix("torch."), causal=True, Hk=Hk)
    assert peak == pytest.approx(ac.get(KEY).cost.memory_bytes(s), rel=0.02)
    if n == 32768:
        assert n * d * 4 <= peak < 4 * n * d * 4, peak


def counted_flops(fn) -> int:
    """torch's FLOP counter over fn(), given the triangular solve's count (a multiply-add per cell below the unit
    diagonal and right-hand column) and the in-place baddbmm_'s (as baddbmm's)."""
    aten = torch.ops.aten

    def solve(a_shape, b_shape, *args, out_shape=None, **kwargs):
        *batch, c, _ = a_shape
        return math.prod(batch) * c * (c - 1) * b_shape[-1]

    def baddbmm(self_shape, a_shape, b_shape, *args, out_shape=None, **kwargs):
        return 2 * a_shape[0] * a_shape[1] * a_shape[2] * b_shape[-1]

    counter = FlopCounterMode(display=False, custom_mapping={aten.linalg_solve_triangular: solve,
                                                             aten.baddbmm_: baddbmm, aten.baddbmm: baddbmm})
    with counter:
        fn()
    return counter.get_total_flops()


@pytest.mark.parametrize("n,H,Hk,chunk", [(700, 4, 2, 32), (129, 2, 2, 16), (64, 3, 1, 7)])
def test_executed_flops_are_torchs_count_of_the_chunked_form(n, H, Hk, chunk):
    (q, k, v), state = inputs(n, B=2, H=H, Hk=Hk, D=24, dtype=torch.float32)
    with torch.inference_mode():
        counted = counted_flops(lambda: ac.attention(KEY, q, k, v, causal=True, chunk=chunk, **state))
    s = Shape(2, H, n, n, 24, causal=True, Hk=Hk)
    assert counted == pytest.approx(ac.get(KEY).cost.executed(s, chunk=chunk), rel=1e-9)
    assert ac.get(KEY).cost.flops(s, chunk=chunk) < counted


def test_spec_costs_count_the_chunk_forms_work():
    """Per chunk C, per key/value head with one query head: 2·C²·d (β K̂ K̂ᵀ, decayed) + C·(C − 1)·2d (the solve)
    + 4·C·d² (U and the state) + 4·C²·d (Q̂ K̂ᵀ, its product with U) + 2·C·d² (the read), by hand at n = 64,
    C = 32, d = 8; the useful count leaves out the cells above the diagonals. A step: 7·d²."""
    spec, s = ac.get(KEY), Shape(1, 1, 64, 64, 8, causal=True)
    c, d = 32, 8
    per_chunk = 2 * c * c * d + c * (c - 1) * 2 * d + 4 * c * d * d + 4 * c * c * d + 2 * c * d * d
    assert spec.cost.executed(s, chunk=c) == 2 * per_chunk
    useful = per_chunk - 2 * d * (c * c - c * (c - 1) / 2) - 4 * d * (c * c - c * (c + 1) / 2)
    assert spec.cost.flops(s, chunk=c) == 2 * useful
    assert spec.supports.generation.flops(s) == 7 * d * d


def looped_segments(s: Shape, chunk: int) -> list[tuple[int, int, int]]:
    """The plain reference: every chunk the kernel runs, walked token range by token range (tests.baselines)."""
    return [(1, tokens, c) for tokens, c in chunk_pieces(s.Nk, kda.segment_rows(s.bk, s.D, chunk), chunk)]


@pytest.mark.parametrize("n", [1, 5, 31, 32, 33, 255, 256, 257, 1000, 4097, 65_536 + 77])
@pytest.mark.parametrize("B,H,Hk,d,chunk,dtype", [(1, 8, 8, 64, 32, "float32"), (2, 4, 1, 16, 7, "float16"),
                                                   (3, 2, 2, 8, 1, "float64")])
def test_the_cost_models_segments_are_the_kernels_chunks(monkeypatch, n, B, H, Hk, d, chunk, dtype):
    s = Shape(B, H, n, n, d, dtype=dtype, causal=True, Hk=Hk)
    looped = looped_segments(s, chunk)
    kernels = causal_chunks(n, kda.segment_rows(s.bk, s.D, chunk), chunk)  # what `chunked` loops over
    assert [(1, e - a, c) for a, e, c in kernels] == looped
    assert sorted((r, c) for m, r, c in kda._segments(s, chunk) for _ in range(m)) == sorted(k[1:] for k in looped)
    closed = kda._memory(s, chunk), kda._flops(s, chunk), kda._executed_flops(s, chunk)
    monkeypatch.setattr(kda, "_segments", looped_segments)
    assert closed == (kda._memory(s, chunk), kda._flops(s, chunk), kda._executed_flops(s, chunk))


@pytest.mark.parametrize("call,words", [
    (lambda q, k, v, s: ac.attention(KEY, q, k, v, causal=False, **s), ["causal only", "causal by construction",
                                                                          "causal=True"]),
    (lambda q, k, v, s: ac.attention(KEY, q, k[:, :, :5], v[:, :, :5], causal=True), ["self-attention only"]),
    (lambda q, k, v, s: ac.attention(KEY, q, k, v, causal=True, alpha=s["alpha"][..., 0], beta=s["beta"]),
     ["alpha", "(2, 2, 12, 8)", "key channel", "init_state"]),
    (lambda q, k, v, s: ac.attention(KEY, q, k, v, causal=True, alpha=s["alpha"], beta=s["beta"][..., None]),
     ["beta", "(2, 2, 12)", "init_state"]),
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
