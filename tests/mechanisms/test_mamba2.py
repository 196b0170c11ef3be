"""Mamba-2's chunked SSD against its recurrence written plainly here in float64, token by token; its generation step,
padding, shared heads, gradients, refusals, and retention as the same kernel at a fixed decay."""
from __future__ import annotations

import math

import pytest
import torch

import attn_core as ac
from attn_core.nn import generation as gen
from attn_core.mechanisms import mamba2
from attn_core.spec import Shape
from tests.contract.test_mechanisms import profiled_peak


def recurrence(q, k, v, dt, A) -> torch.Tensor:
    """h_t = exp(dt_t·A)·h_{t−1} + dt_t·k_t v_tᵀ, y_t = h_tᵀ q_t in float64, one token at a time; query head i
    reads key/value head ⌊i·Hk/H⌋."""
    B, H, n, D = q.shape
    heads = [i * k.shape[1] // H for i in range(H)]
    k, v = k.double()[:, heads], v.double()[:, heads]
    h = torch.zeros(B, H, D, v.shape[-1], dtype=torch.float64)
    ys = []
    for t in range(n):
        step = dt.double()[:, :, t, None, None]
        h = torch.exp(step * A.double()[:, None, None]) * h + step * k[:, :, t, :, None] * v[:, :, t, None, :]
        ys.append((h * q.double()[:, :, t, :, None]).sum(-2))
    return torch.stack(ys, dim=2)


def inputs(n: int, *, B: int = 2, H: int = 4, Hk: int | None = None, D: int = 8, seed: int = 0,
           dtype=torch.float64, fast: bool = False):
    """q, k, v and the seeded dt, A; `fast`: step sizes × 10, so the decay across a few chunks is large."""
    g = torch.Generator().manual_seed(seed)
    q = torch.randn(B, H, n, D, generator=g, dtype=torch.float64).to(dtype)
    k, v = (torch.randn(B, Hk or H, n, D, generator=g, dtype=torch.float64).to(dtype) for _ in "kv")
    state = mamba2.init_state(Shape(B, H, n, n, D), dtype=dtype, seed=seed)
    if fast:
        state["dt"] = state["dt"] * 10
    return q, k, v, state


@pytest.mark.parametrize("chunk", [1, 3, 8, 16, 64])
@pytest.mark.parametrize("n", [1, 37, 100, 130])
@pytest.mark.parametrize("kv_heads", [4, 2, 1])
def test_chunked_equals_the_recurrence(chunk, n, kv_heads):
    q, k, v, state = inputs(n, Hk=kv_heads, fast=True)
    out = ac.attention("mamba2", q, k, v, causal=True, chunk=chunk, **state)
    torch.testing.assert_close(out, recurrence(q, k, v, **state), atol=1e-12, rtol=1e-10)


@pytest.mark.parametrize("chunk", [4, 16])
def test_segments_carry_the_state_between_them(monkeypatch, chunk):
    """Segments of two chunks (n = 101: whole segments, then whole chunks, then a short one): the state crosses."""
    monkeypatch.setattr(mamba2, "SEGMENT_BYTES", 2 * 4 * 2 * 4 * chunk * chunk)
    assert mamba2.segment_rows(8, 101, chunk) == 2 * chunk
    q, k, v, state = inputs(101, fast=True)
    out = ac.attention("mamba2", q, k, v, causal=True, chunk=chunk, **state)
    torch.testing.assert_close(out, recurrence(q, k, v, **state), atol=1e-12, rtol=1e-10)


def test_float32_with_the_default_chunk_stays_near_float64():
    q, k, v, state = inputs(1000, B=1, H=2, D=16, dtype=torch.float32)
    out = ac.attention("mamba2", q, k, v, causal=True, **state)
    want = recurrence(q, k, v, **state)
    assert out.dtype == torch.float32
    assert ((out.double() - want).norm() / want.norm()).item() < 1e-5


@pytest.mark.parametrize("chunk", [5, 64])
def test_gradients_equal_the_recurrences(chunk):
    q, k, v, state = inputs(23, Hk=2, fast=True)
    tensors = [t.requires_grad_(True) for t in (q, k, v, state["dt"], state["A"])]
    w = torch.randn(2, 4, 23, 8, generator=torch.Generator().manual_seed(1), dtype=torch.float64)
    got = torch.autograd.grad((ac.attention("mamba2", *tensors[:3], causal=True, chunk=chunk, dt=tensors[3],
                                            A=tensors[4]) * w).sum(), tensors)
    want = torch.autograd.grad((recurrence(*tensors) * w).sum(), tensors)
    for a, b in zip(got, want):
        torch.testing.assert_close(a, b, atol=1e-10, rtol=1e-8)


def test_shared_heads_equal_the_heads_repeated_by_hand():
    q, k, v, state = inputs(45, H=6, Hk=2)
    out = ac.attention("mamba2", q, k, v, causal=True, chunk=8, **state)
    kr, vr = (t.repeat_interleave(3, dim=1) for t in (k, v))
    torch.testing.assert_close(out, ac.attention("mamba2", q, kr, vr, causal=True, chunk=8, **state))


def test_a_padded_token_is_skipped_as_if_it_were_not_there():
    """Outputs at the real positions equal the run on the real tokens alone (each batch element its own), whatever
    the padded keys and values hold; before any real token the output is zero."""
    q, k, v, state = inputs(30, fast=True)
    pad = torch.rand(2, 30, generator=torch.Generator().manual_seed(2)) < 0.4
    pad[1, :5] = True
    out = ac.attention("mamba2", q, k, v, causal=True, chunk=4, key_padding_mask=pad, **state)
    noise = 50 * torch.randn(k.shape, dtype=k.dtype) * pad[:, None, :, None]
    same = ac.attention("mamba2", q, k + noise, v + noise, causal=True, chunk=4, key_padding_mask=pad, **state)
    torch.testing.assert_close(out, same)
    assert out[1, :, :5].abs().max() == 0
    for b in range(2):
        real = ~pad[b]
        short = recurrence(*(t[b:b + 1, :, real] for t in (q, k, v, state["dt"])), state["A"])
        torch.testing.assert_close(out[b:b + 1, :, real], short, atol=1e-12, rtol=1e-10)


@pytest.mark.parametrize("call,words", [
    (lambda q, k, v, s: ac.attention("mamba2", q, k, v, **s), ["causal only", "causal by construction",
                                                                "causal=True"]),
    (lambda q, k, v, s: ac.attention("mamba2", q, k[:, :, :9], v[:, :, :9], causal=True),
     ["self-attention only"]),
    (lambda q, k, v, s: ac.attention("mamba2", q, k, v, causal=True, dt=-s["dt"], A=s["A"]), ["dt ≥ 0"]),
    (lambda q, k, v, s: ac.attention("mamba2", q, k, v, causal=True, dt=s["dt"], A=-s["A"]), ["A must be negative"]),
    (lambda q, k, v, s: ac.attention("mamba2", q, k, v, causal=True, dt=s["dt"][:, :2], A=s["A"]),
     ["dt must be a floating tensor of shape (2, 4, 12)"]),
    (lambda q, k, v, s: ac.attention("mamba2", q, k, v, causal=True, chunk=0), ["chunk = 0", "between 1"]),
])
def test_what_cannot_run_is_refused_with_a_sentence(call, words):
    q, k, v, state = inputs(12)
    with pytest.raises(ValueError) as e:
        call(q, k, v, state)
    assert all(w in str(e.value) for w in words), str(e.value)


@pytest.mark.parametrize("chunk", [1, 4, 64])
@pytest.mark.parametrize("prompt", [1, 10, 16])
def test_prefill_then_steps_equal_the_forward_pass(chunk, prompt):
    """The prompt's dt runs on over the tokens to generate (B, H, 25); each step reads its own."""
    q, k, v, state = inputs(25, Hk=2, fast=True)
    full = ac.attention("mamba2", q, k, v, causal=True, chunk=chunk, **state)
    out, cache = gen.prefill("mamba2", q[:, :, :prompt], k[:, :, :prompt], v[:, :, :prompt], chunk=chunk, **state)
    outs = [out]
    for t in range(prompt, 25):
        o, cache = gen.step("mamba2", q[:, :, t:t + 1], k[:, :, t:t + 1], v[:, :, t:t + 1], cache)
        outs.append(o)
    torch.testing.assert_close(torch.cat(outs, dim=2), full, atol=1e-12, rtol=1e-10)
    assert cache.nbytes == 2 * 4 * 8 * 8 * 8 == gen.cache_bytes("mamba2", Shape(2, 4, 25, 25, 8, dtype="float64",
                                                                                Hk=2, causal=True))


def test_remember_holds_the_state_prefill_leaves():
    q, k, v, state = inputs(40, Hk=2, fast=True)
    _, cache = gen.prefill("mamba2", q, k, v, chunk=8, **state)
    torch.testing.assert_close(gen.remember("mamba2", k, v, chunk=8, **state).h, cache.h, atol=1e-12, rtol=1e-10)


def test_a_step_past_the_given_step_sizes_reuses_the_last_and_rewinding_moves_the_position():
    q, k, v, state = inputs(9)
    cache = gen.remember("mamba2", k[:, :, :8], v[:, :, :8], dt=state["dt"][..., :8], A=state["A"])
    last = state["dt"][..., 7:8]
    want = recurrence(q, k, v, torch.cat([state["dt"][..., :8], last], -1), state["A"])[:, :, 8:]
    mark = cache.mark()
    out, _ = gen.step("mamba2", q[:, :, 8:], k[:, :, 8:], v[:, :, 8:], cache)
    torch.testing.assert_close(out, want, atol=1e-12, rtol=1e-10)
    cache.rewind(mark)
    assert cache.mark() == mark == (8,)


@pytest.mark.parametrize("max_len", [None, 20])
def test_seeded_generation_reads_the_step_sizes_a_forward_pass_draws_at_each_position(max_len):
    """Only a seed: the prompt of 5 draws its 5 step sizes; each step the one the seed gives its position over 20
    tokens (run on past the prompt), not the prompt's last one; the decays are the same whatever the length."""
    q, k, v, state = inputs(20, B=2, H=3, Hk=3, seed=4)
    short = mamba2.init_state(Shape(2, 3, 8, 8, 8), dtype=torch.float64, seed=9)
    long = mamba2.init_state(Shape(2, 3, 20, 20, 8), dtype=torch.float64, seed=9)
    assert torch.equal(short["dt"], long["dt"][..., :8]) and torch.equal(short["A"], long["A"])
    out, cache = gen.prefill("mamba2", q[:, :, :5], k[:, :, :5], v[:, :, :5], chunk=4, seed=9, max_len=max_len)
    outs = [out]
    for t in range(5, 20):
        o, cache = gen.step("mamba2", q[:, :, t:t + 1], k[:, :, t:t + 1], v[:, :, t:t + 1], cache)
        outs.append(o)
    want = recurrence(q, k, v, **long)
    torch.testing.assert_close(torch.cat(outs, dim=2), want, atol=1e-12, rtol=1e-10)
    torch.testing.assert_close(ac.attention("mamba2", q, k, v, causal=True, chunk=4, seed=9), want, atol=1e-12,
                               rtol=1e-10)


def test_a_step_with_other_heads_than_the_state_is_refused():
    q, k, v, state = inputs(9)
    cache = gen.remember("mamba2", k, v, **state)
    with pytest.raises(ValueError, match="built for 4"):
        mamba2._step(q[:, :2, :1], k[:, :, :1], v[:, :, :1], cache)


def retention(q, k, v, gamma) -> torch.Tensor:
    """RetNet's recurrent retention (Sun et al. 2023, arXiv 2307.08621, eq. 1): S_n = γ·S_{n−1} + k_nᵀ v_n,
    o_n = q_n S_n, per head with its own γ."""
    S = torch.zeros(q.shape[0], q.shape[1], q.shape[-1], v.shape[-1], dtype=torch.float64)
    outs = []
    for t in range(q.shape[2]):
        S = gamma[:, None, None] * S + k[:, :, t, :, None] * v[:, :, t, None, :]
        outs.append(torch.einsum("bhd,bhde->bhe", q[:, :, t], S))
    return torch.stack(outs, dim=2)


def test_retention_is_the_kernel_at_a_fixed_decay():
    q, k, v, _ = inputs(70, H=4)
    state = mamba2.retention_state(Shape(2, 4, 70, 70, 8), dtype=torch.float64)
    gamma = 1 - 2.0 ** (-5 - torch.arange(4, dtype=torch.float64))  # 1 − 2^(−5−h): 0.96875, 0.984375, …
    out = ac.attention("mamba2", q, k, v, causal=True, chunk=16, **state)
    torch.testing.assert_close(out, retention(q, k, v, gamma), atol=1e-11, rtol=1e-10)
    # and its parallel form: (Q Kᵀ ⊙ D) V with D_nm = γ^(n−m) for n ≥ m
    gap = torch.arange(70)[:, None] - torch.arange(70)[None, :]
    decay = torch.where(gap >= 0, gamma[:, None, None] ** gap.clamp(min=0), 0.0)
    torch.testing.assert_close(out, ((q @ k.transpose(-2, -1)) * decay) @ v, atol=1e-11, rtol=1e-10)


def test_the_default_state_follows_mamba2s_initialisation():
    state = mamba2.init_state(Shape(2, 8, 5000, 5000, 8), seed=3)
    dt, A = state["dt"], state["A"]
    assert dt.shape == (2, 8, 5000) and A.shape == (8,)
    assert 0.001 <= dt.min() < 0.0011 and 0.09 < dt.max() <= 0.1  # log-uniform in [0.001, 0.1]
    assert abs(dt.log().mean().item() - (math.log(0.001) + math.log(0.1)) / 2) < 0.05
    assert (-16 <= A).all() and (A <= -1).all()
    torch.testing.assert_close(mamba2.init_state(Shape(2, 8, 5000, 5000, 8), seed=3)["A"], A)
    assert not torch.equal(mamba2.init_state(Shape(2, 8, 5000, 5000, 8), seed=4)["A"], A)


def test_no_quadratic_tensor_at_32768_tokens():
    """B = H = 1, D = 32: an (n, n) float32 tensor is 4 GiB; the peak stays within a few outputs (4 MiB each)."""
    n, d = 32768, 32
    q, k, v, state = inputs(n, B=1, H=1, D=d, dtype=torch.float32)
    with torch.inference_mode():
        peak = profiled_peak(lambda: ac.attention("mamba2", q, k, v, causal=True, **state))
    assert n * d * 4 <= peak < 8 * n * d * 4, peak
    assert peak == pytest.approx(ac.get("mamba2").cost.memory_bytes(Shape(1, 1, n, n, d, causal=True)), rel=0.02)


@pytest.mark.parametrize("n,chunk,bh", [(1, 64, 1), (100, 64, 2), (3000, 64, 6), (5000, 7, 8), (64, 64, 8)])
def test_the_cost_models_segments_are_the_kernels(n, chunk, bh):
    from attn_core.mechanisms._linear_core import causal_chunks
    from tests.baselines import chunk_pieces

    rows = mamba2.segment_rows(bh, n, chunk)
    ran = sorted(chunk_pieces(n, rows, chunk))  # the plain walk, written apart from the kernel's
    assert sorted((e - a, c) for a, e, c in causal_chunks(n, rows, chunk)) == ran  # what `ssd` loops over
    modelled = sorted((rows, c) for m, rows, c in mamba2._segments(Shape(1, bh, n, n, 8), chunk) for _ in range(m))
    assert ran == modelled


def test_costs_by_hand():
    """n = 100, chunk 64: chunks of 64 and 36. Executed: per head 4·D·(64·64 + 36·36) + 4·n·D²; useful counts only
    the pairs s ≤ t of each chunk (64·65/2 + 36·37/2)."""
    spec, s = ac.get("mamba2"), Shape(1, 2, 100, 100, 8, causal=True)
    assert spec.cost.executed(s) == 2 * (4 * 8 * (64 * 64 + 36 * 36) + 4 * 100 * 64)
    assert spec.cost.flops(s) == 2 * (4 * 8 * (64 * 65 / 2 + 36 * 37 / 2) + 4 * 100 * 64)
    assert spec.supports.generation.flops(s) == 2 * (5 * 64 + 8)
