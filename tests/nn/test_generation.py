"""Generation token by token: a prefill and then steps equal the causal forward pass, over the registry; the caches
hold what their specs predict, in place; mechanisms without a form say why; bad input is refused with a sentence."""
from __future__ import annotations

import math

import pytest
import torch

import attn_core as ac
from attn_core.nn import generation as gen
from attn_core.spec import Shape
from tests.baselines import (allowed, differential_reference, elu_plus_one, gated_delta_reference, kda_reference,
                             kernel_attention,
                             masked_softmax, nsa_reference, positive_random_features, sigmoid_reference,
                             ssd_recurrence, topk_reference, trace_peak_bytes)
from tests.copies import with_copies

GENERATES = [key for key, spec in ac.MECHANISMS.items() if spec.supports.generation is not None]
CANNOT = [key for key, spec in ac.MECHANISMS.items() if spec.supports.generation is None]
B, H, N, D = 2, 3, 23, 8  # N prime: no block, window or stride divides it


def qkv(n: int = N, *, d: int = D, seed: int = 0, dtype=torch.float32):
    g = torch.Generator().manual_seed(seed)
    return [torch.randn(B, H, n, d, generator=g, dtype=torch.float64).to(dtype) for _ in range(3)]


def variants(key: str, n: int = N) -> list[dict]:
    """Each parameter at its small value (sizes below n); then, one at a time, each at its lowest, one step up
    from its default, and, for those counting tokens, past n (a window or block larger than the sequence)."""
    spec = ac.MECHANISMS[key]
    base = {p.name: p.small_value(n) for p in spec.params}
    out = [base]
    for p in spec.params:
        values = [p.low, min(p.high, p.default + 1)] + ([min(p.high, n + 7)] if p.tokens else [])
        out += [{**base, p.name: value} for value in values if value != base[p.name]]
    return out


def cases():
    return [pytest.param(key, params, id=f"{key}-{'-'.join(f'{k}={v}' for k, v in params.items())}")
            for key in GENERATES for params in variants(key)]


def state(key: str, params: dict, n: int = N) -> dict:
    return ac.make_state(key, Shape(B, H, n, n, D), **params)


def generate(key: str, q, k, v, n0: int, *, max_len=None, **params):
    """Prefill the first n0 tokens, step through the rest: the outputs (B, H, n, D) and the cache after each call."""
    out, cache = gen.prefill(key, q[:, :, :n0], k[:, :, :n0], v[:, :, :n0], max_len=max_len, **params)
    outs, caches = [out], [(cache.used_bytes, cache.nbytes)]
    for i in range(n0, q.shape[-2]):
        o, cache = gen.step(key, q[:, :, i:i + 1], k[:, :, i:i + 1], v[:, :, i:i + 1], cache)
        assert o.shape == (B, H, 1, D) and o.dtype == q.dtype
        outs.append(o)
        caches.append((cache.used_bytes, cache.nbytes))
    return torch.cat(outs, dim=2), cache, caches


@pytest.mark.parametrize("key,params", cases())
@pytest.mark.parametrize("n0,max_len", [(1, None), (10, None), (10, N)])  # doubling from 1; a full ring; no growth
def test_prefill_then_steps_equal_the_causal_forward_pass(key, params, n0, max_len):
    q, k, v = qkv()
    params = {**params, **state(key, params)}
    expected = ac.attention(key, q, k, v, causal=True, **params)
    got, cache, _ = generate(key, q, k, v, n0, max_len=max_len, **params)
    assert cache.length == N
    torch.testing.assert_close(got, expected, atol=1e-5, rtol=1e-5)


BASELINES = with_copies({  # key → out of (q, k, v, params, state) written independently of attn_core
    "softmax": lambda q, k, v, p, s: masked_softmax(q, k, v, allowed("full", N, N, True)),
    "sdpa": lambda q, k, v, p, s: masked_softmax(q, k, v, allowed("full", N, N, True)),
    "sliding_window": lambda q, k, v, p, s: masked_softmax(q, k, v, allowed("sliding_window", N, N, True, **p)),
    "local": lambda q, k, v, p, s: masked_softmax(q, k, v, allowed("local", N, N, True, **p)),
    "sparse": lambda q, k, v, p, s: masked_softmax(q, k, v, allowed("sparse", N, N, True, **p)),
    "longformer": lambda q, k, v, p, s: masked_softmax(q, k, v, allowed("longformer", N, N, True, **p)),
    "linear": lambda q, k, v, p, s: kernel_attention(elu_plus_one(q), elu_plus_one(k), v, True),
    "performer": lambda q, k, v, p, s: kernel_attention(positive_random_features(q, s["projection"]),
                                                         positive_random_features(k, s["projection"]), v, True),
    "differential": lambda q, k, v, p, s: differential_reference(q, k, v, True, p["lam"]),
    "sigmoid": lambda q, k, v, p, s: sigmoid_reference(q, k, v, True, p["bias"]),
    "mamba2": lambda q, k, v, p, s: ssd_recurrence(q, k, v, s["dt"], s["A"]),
    "gated_deltanet": lambda q, k, v, p, s: gated_delta_reference(q, k, v, s["alpha"], s["beta"]),
    "kda": lambda q, k, v, p, s: kda_reference(q, k, v, s["alpha"], s["beta"]),
    "nsa": lambda q, k, v, p, s: nsa_reference(q, k, v, **s, **p),
    "topk": lambda q, k, v, p, s: topk_reference(q, k, v, True, p["top_k"], s["index_q"], s["index_k"], s["index_w"]),
})


@pytest.mark.parametrize("key,params", [c for c in cases() if c.values[0] in BASELINES])
def test_generation_equals_an_independent_baseline(key, params):
    q, k, v = qkv(seed=1)
    s = state(key, params)
    got, _, _ = generate(key, q, k, v, 7, **params, **s)
    torch.testing.assert_close(got.double(), BASELINES[key](q, k, v, params, s), atol=2e-5, rtol=1e-5)


def test_every_built_in_mechanism_that_can_generate_is_covered_by_a_baseline():
    assert set(GENERATES) == set(BASELINES) and {"softmax", "sdpa", "sliding_window", "local", "linear",
                                                 "performer", "longformer"} <= set(GENERATES)


@pytest.mark.parametrize("positions", [[3, 0, 9], [2, 5, 6]])  # a global token far behind the window, or inside it
def test_longformer_generates_with_global_positions_the_prompt_holds(positions):
    q, k, v = qkv(seed=2)
    params = {"window": 2, "global_tokens": 3, "global_positions": torch.tensor(positions)}
    got, cache, _ = generate("longformer", q, k, v, 10, **params)
    p = {"window": 2, "global_tokens": 3, "global_positions": positions}
    torch.testing.assert_close(got.double(), masked_softmax(q, k, v, allowed("longformer", N, N, True, **p)),
                               atol=2e-5, rtol=1e-5)
    assert cache.used_bytes == gen.cache_bytes("longformer", Shape(B, H, N, N, D), window=2, global_tokens=3)


def test_longformer_refuses_global_positions_past_the_prompt():
    q, k, v = qkv()
    with pytest.raises(ValueError, match="global tokens past the prompt would each need every key before them"):
        gen.remember("longformer", k[:, :, :2], v[:, :, :2], window=1, global_tokens=3,
                     global_positions=torch.tensor([0, 1]))


def test_a_performer_key_that_raises_the_stabilizer_by_e140_rescales_the_state():
    """A step's key aligned with a long projection row: its exponent passes every earlier key's by more than 140,
    so its features would overflow float32 (e⁸⁸) on the prompt's scale; the state is rescaled instead."""
    q, k, v = qkv()
    w = 7 * state("performer", {"features": 16})["projection"]
    k[:, :, 15] = w[0] * D ** 0.25  # x' = k/D^¼ = w₀: the exponent w·x' − |x'|²/2 at its largest, |w₀|²/2
    out, cache = gen.prefill("performer", q[:, :, :15], k[:, :, :15], v[:, :, :15], features=16, projection=w)
    before = cache.offset.clone()
    outs = [out]
    for i in range(15, N):
        o, cache = gen.step("performer", q[:, :, i:i + 1], k[:, :, i:i + 1], v[:, :, i:i + 1], cache)
        outs.append(o)
    assert (cache.offset - before).min() * math.log(2) > 140  # the stabilizer is a base-2 exponent
    expected = kernel_attention(positive_random_features(q, w), positive_random_features(k, w), v, True)
    torch.testing.assert_close(torch.cat(outs, dim=2).double(), expected, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("key,params", cases())
def test_cache_bytes_equal_the_prediction_at_every_length(key, params):
    q, k, v = qkv()
    s = state(key, params)
    for max_len in (None, N):
        _, _, sizes = generate(key, q, k, v, 3, max_len=max_len, **params, **s)
        for length, (used, held) in enumerate(sizes, start=3):
            assert used == gen.cache_bytes(key, Shape(B, H, length, length, D), **params), (length, used)
            assert used <= held <= 2 * max(used, gen.cache_bytes(key, Shape(B, H, N, N, D), **params))
        if max_len is not None:  # allocated once, for exactly the longest context
            assert {held for _, held in sizes} == {gen.cache_bytes(key, Shape(B, H, N, N, D), **params)}


@pytest.mark.parametrize("key", GENERATES)
def test_steps_write_in_place_when_the_cache_was_sized_by_max_len(key):
    q, k, v = qkv()
    params = {p.name: p.small_value(N) for p in ac.MECHANISMS[key].params}
    params.update(state(key, params))
    _, cache = gen.prefill(key, q[:, :, :5], k[:, :, :5], v[:, :, :5], max_len=N, **params)
    before = [(t.data_ptr(), t.shape) for t in cache.tensors()]
    for i in range(5, N):
        _, cache = gen.step(key, q[:, :, i:i + 1], k[:, :, i:i + 1], v[:, :, i:i + 1], cache)
    assert [(t.data_ptr(), t.shape) for t in cache.tensors()] == before


@pytest.mark.parametrize("key", GENERATES)
def test_a_step_allocates_far_less_than_its_cache(key):
    """Below half the cache's bytes at n = 2048 (no copy of the cache, nothing n×n: the scores and probabilities of
    one query are 1/8 of a key-value cache at D = 8), and the same bytes at n = 256 and 2048 for a fixed state."""
    peaks = []
    for n in (256, 2048):
        q, k, v = (t[:1, :2] for t in qkv(n + 1))
        params = {p.name: p.small_value(n) for p in ac.MECHANISMS[key].params}
        params.update(ac.make_state(key, Shape(1, 2, n, n, D), **params))
        cache = gen.remember(key, k[:, :, :n], v[:, :, :n], max_len=n + 1, **params)
        token = (q[:, :, n:], k[:, :, n:], v[:, :, n:])
        peaks.append(trace_peak_bytes(lambda: gen.step(key, *token, cache)))
        size = gen.cache_bytes(key, Shape(1, 2, n, n, D), **params)
    assert peaks[1] <= size / 2 + 8192, (peaks, size)
    if gen.cache_bytes(key, Shape(1, 2, 256, 256, D), **params) == size:
        assert peaks[0] == peaks[1]


@pytest.mark.parametrize("key", ["softmax", "sdpa"])
def test_a_key_value_cache_grows_by_one_tokens_keys_and_values_per_step(key):
    q, k, v = qkv()
    _, _, sizes = generate(key, q, k, v, 4)
    used = [u for u, _ in sizes]
    assert used[0] == 2 * B * H * 4 * D * 4  # 4 tokens' K and V in float32
    assert {b - a for a, b in zip(used, used[1:])} == {2 * B * H * D * 4}
    held = [h for _, h in sizes]
    assert all(b in (a, 2 * a) for a, b in zip(held, held[1:])) and len(set(held)) > 1  # doubles when full


def test_the_sliding_window_cache_stays_bounded():
    q, k, v = qkv()
    _, _, sizes = generate("sliding_window", q, k, v, 1, window=4)
    assert [u // (2 * B * H * D * 4) for u, _ in sizes] == [1, 2, 3, 4] + [5] * (N - 4)  # window + 1 tokens at most
    assert max(h for _, h in sizes) == 5 * 2 * B * H * D * 4


@pytest.mark.parametrize("key,params,per_head", [
    ("linear", {}, (D * D + D) * 4),  # Σ φ(k) vᵀ and Σ φ(k) in float32
    ("performer", {"features": 16}, (16 * D + 16) * 4 + 8),  # and the float64 stabilizer
])
def test_a_fixed_state_holds_the_same_bytes_at_every_context(key, params, per_head):
    for n in (1, 23, 300):
        q, k, v = qkv(n)
        s = state(key, params, n)
        _, cache = gen.prefill(key, q, k, v, **params, **s)
        sizes = {cache.nbytes}
        for _ in range(3):
            _, cache = gen.step(key, q[:, :, :1], k[:, :, :1], v[:, :, :1], cache)
            sizes.add(cache.nbytes)
        assert sizes == {B * H * per_head} == {gen.cache_bytes(key, Shape(B, H, n, n, D), **params)}


def test_the_state_of_half_precision_tokens_is_summed_in_float32():
    q, k, v = qkv(dtype=torch.float16)
    out, cache = gen.prefill("linear", q[:, :, :10], k[:, :, :10], v[:, :, :10])
    o, cache = gen.step("linear", q[:, :, 10:11], k[:, :, 10:11], v[:, :, 10:11], cache)
    assert out.dtype == o.dtype == torch.float16 and cache.kv.dtype == torch.float32
    assert cache.nbytes == gen.cache_bytes("linear", Shape(B, H, 11, 11, D, dtype="float16"))


@pytest.mark.parametrize("key", CANNOT)
def test_a_mechanism_without_a_generation_form_says_why(key):
    reason = ac.MECHANISMS[key].supports.no_generation
    assert len(reason.split()) >= 8 and reason[0].isupper() and reason.endswith("."), reason
    assert gen.can_generate(key) == (False, reason)
    q, k, v = qkv()
    with pytest.raises(ValueError, match="cannot generate token by token: " + reason[:30]):
        gen.prefill(key, q, k, v)


def test_linformer_cannot_generate():
    assert "linformer" in CANNOT and "causal" in ac.MECHANISMS["linformer"].supports.no_generation


@pytest.fixture
def softmax_cache():
    q, k, v = qkv()
    return gen.prefill("softmax", q[:, :, :5], k[:, :, :5], v[:, :, :5])[1]


@pytest.mark.parametrize("shape,match", [
    ((B, H, 2, D), r"q must have shape \(2, heads, 1, 8\), one new token"),
    ((B, H, 1, D + 1), r"head dimension 8"),
    ((B + 1, H, 1, D), r"batch 2"),
    ((H, 1, D), r"q must have shape"),
])
def test_a_step_of_the_wrong_shape_is_refused(softmax_cache, shape, match):
    k = v = torch.randn(B, H, 1, D)
    with pytest.raises(ValueError, match=match):
        gen.step("softmax", torch.randn(shape), k, v, softmax_cache)


def test_a_step_on_a_cache_of_another_mechanism_or_kind_is_refused(softmax_cache):
    t = torch.randn(B, H, 1, D)
    with pytest.raises(ValueError, match="this cache belongs to 'softmax'; step it with 'softmax'"):
        gen.step("linear", t, t, t, softmax_cache)
    with pytest.raises(ValueError, match="cache must be what prefill or remember returned, got dict"):
        gen.step("softmax", t, t, t, {})
    with pytest.raises(ValueError, match="torch.float64 on cpu but the cache holds torch.float32"):
        gen.step("softmax", t.double(), t.double(), t.double(), softmax_cache)
    with pytest.raises(ValueError, match="NaN"):
        gen.step("softmax", t, t * float("nan"), t, softmax_cache)


@pytest.mark.parametrize("kwargs,match", [
    ({"max_len": 4}, r"max_len = 4 cannot hold the prompt of 10 tokens; pass an integer ≥ 10"),
    ({"max_len": 12.0}, r"max_len = 12.0 cannot hold"),
    ({"window": 0}, r"window = 0 is not allowed"),
    ({"size": 3}, r"has no parameter size"),
])
def test_bad_prefill_settings_are_refused(kwargs, match):
    q, k, v = qkv(10)
    with pytest.raises(ValueError, match=match):
        gen.prefill("sliding_window", q, k, v, **kwargs)


def test_bad_prompts_are_refused():
    q, k, v = qkv(10)
    with pytest.raises(ValueError, match="causal attention needs Nq = Nk"):
        gen.prefill("softmax", q[:, :, :4], k, v)
    with pytest.raises(ValueError, match="must be a 4-D tensor"):
        gen.prefill("linear", q[0], k[0], v[0])
    with pytest.raises(ValueError, match=r"projection must have shape \(16, 8\)"):
        gen.prefill("performer", q, k, v, features=16, projection=torch.randn(16, 9))
    with pytest.raises(ValueError, match="unknown mechanism 'nope'"):
        gen.remember("nope", k, v)


def test_remember_holds_what_prefill_holds():
    q, k, v = qkv()
    for key in GENERATES:
        params = {p.name: p.small_value(N) for p in ac.MECHANISMS[key].params}
        params.update(state(key, params))
        _, a = gen.prefill(key, q, k, v, **params)
        b = gen.remember(key, k, v, **params)
        assert (a.key, a.length, a.nbytes) == (b.key, b.length, b.nbytes)
        assert all(torch.equal(x, y) for x, y in zip(a.tensors(), b.tensors())), key


SEEDED = [key for key in GENERATES if ac.MECHANISMS[key].state.init is not None]


@pytest.mark.parametrize("key", SEEDED)
@pytest.mark.parametrize("n0,max_len", [(1, None), (9, None), (9, N)])  # the stream run on by steps, or at once
def test_seeded_generation_equals_the_seeded_forward_pass(key, n0, max_len):
    """Only a seed, no state: the prompt draws its state, each step the state of its own position, as the forward
    pass over the whole sequence draws it from the same seed (a state that changed with n would differ here)."""
    q, k, v = qkv(seed=3)
    params = {p.name: p.small_value(N) for p in ac.MECHANISMS[key].params}
    got, cache, _ = generate(key, q, k, v, n0, max_len=max_len, seed=11, **params)
    assert cache.length == N
    torch.testing.assert_close(got, ac.attention(key, q, k, v, causal=True, seed=11, **params), atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("key", SEEDED)
def test_the_seeded_state_of_a_shorter_sequence_is_the_first_tokens_of_a_longer(key):
    """Per-token state (gates, step sizes) of n = 8 is the first 8 tokens' of n = 16; the rest is the same."""
    params = {p.name: p.small_value(8) for p in ac.MECHANISMS[key].params}
    short, long = (ac.make_state(key, Shape(B, H, n, n, D, causal=True), seed=5, **params) for n in (8, 16))
    assert short.keys() == long.keys()
    for name, t in short.items():
        grown = [i for i, (a, b) in enumerate(zip(t.shape, long[name].shape)) if a != b]  # the tokens' axis, if any
        assert len(grown) <= 1 and all(t.shape[i] == 8 for i in grown), (name, t.shape, long[name].shape)
        first = long[name].narrow(grown[0], 0, 8) if grown else long[name]
        torch.testing.assert_close(t, first, atol=0, rtol=0, msg=name)


@pytest.mark.parametrize("call", [
    lambda q, k, v: ac.attention("softmax", q, k, v, causal=True, seed=0),
    lambda q, k, v: gen.prefill("linear", q, k, v, seed=0),
    lambda q, k, v: gen.remember("sliding_window", k, v, seed=1),
    lambda q, k, v: gen.cache_bytes("softmax", Shape(B, H, N, N, D), seed=0),
])
def test_a_seed_for_a_mechanism_without_random_state_is_refused_with_a_sentence(call):
    q, k, v = qkv()
    with pytest.raises(ValueError, match="draws no random state, so it takes no seed; drop seed=, or choose a "
                                         "mechanism that does: .*performer.*mamba2"):
        call(q, k, v)


@pytest.mark.parametrize("seed", [-1, 2**64, 1.5, "0", True])
def test_a_seed_that_is_no_64_bit_whole_number_is_refused_with_a_sentence(seed):
    q, k, v = qkv()
    for call in (lambda: ac.attention("mamba2", q, k, v, causal=True, seed=seed),
                 lambda: gen.prefill("performer", q, k, v, features=8, seed=seed),
                 lambda: ac.make_state("performer", Shape(B, H, N, N, D), seed=seed, features=8)):
        with pytest.raises(ValueError, match=r"seed must be a whole number from 0 to 2\*\*63 - 1, got"):
            call()
