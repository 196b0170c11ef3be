"""Hardening of the library: wrong values refused with a sentence, and no silent NaN, overflow or loss of precision
(issue items 10 and 11)."""
from __future__ import annotations

import numpy as np
import pytest
import torch

import attn_core as ac
from attn_core.mechanisms import linformer, performer
from attn_core.mechanisms._common import validated
from attn_core.spec import Shape
from tests.baselines import elu_plus_one, kernel_attention, plain_causal, positive_random_features, runs
from tests.copies import with_copies

# settings that fit n = 32 (a copy of a mechanism, tests/copies.py, takes its original's)
SMALL = with_copies({"linformer": {"rank": 16}, "performer": {"features": 16}, "nystrom": {"landmarks": 8}})


def qkv(n: int = 32, *, B: int = 1, H: int = 2, D: int = 16, dtype=torch.float32, seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    return [torch.randn(B, H, n, D, generator=g, dtype=torch.float64).to(dtype) for _ in range(3)]


def message(call) -> str:
    with pytest.raises(ValueError) as err:
        call()
    return str(err.value)


# --- causal must be a bool ----------------------------------------------------------------------------------------

@pytest.mark.parametrize("causal", ["false", "True", 0, 1, None, 1.0, torch.tensor(False)])
@pytest.mark.parametrize("key", list(ac.MECHANISMS))
def test_causal_that_is_not_a_bool_is_refused_by_every_mechanism(key, causal):
    """The string 'false' is truthy: before, it silently computed causal attention."""
    q, k, v = qkv()
    params = SMALL.get(key, {})
    for call in (lambda: ac.attention(key, q, k, v, causal=causal, **params),
                 lambda: ac.get(key).fn(q, k, v, causal=causal, **params)):
        text = message(call)
        assert "causal must be True or False" in text and repr(causal) in text, text


def test_causal_refused_by_the_layer():
    text = message(lambda: ac.MultiHeadAttention(16, 2, "softmax", causal="false"))
    assert "causal must be True or False" in text and "'false'" in text


@pytest.mark.parametrize("key", ["softmax", "sliding_window", "linear"])
def test_numpy_bool_is_a_bool(key):
    q, k, v = qkv()
    for flag in (False, True):
        torch.testing.assert_close(ac.attention(key, q, k, v, causal=np.bool_(flag)),
                                   ac.attention(key, q, k, v, causal=flag), atol=0, rtol=0)
    layer = ac.MultiHeadAttention(16, 2, "softmax", causal=np.bool_(True))
    assert layer.causal is True


# --- the layer's input ----------------------------------------------------------------------------------------------

LAYER = ac.MultiHeadAttention(16, 2)


@pytest.mark.parametrize("call,words", [
    (lambda: LAYER(torch.ones(1, 4, 16, dtype=torch.int64)), ["x has dtype torch.int64", "torch.float32",
                                                               "x.to(torch.float32)"]),
    (lambda: LAYER(torch.ones(1, 4, 16, dtype=torch.float64)), ["x has dtype torch.float64", "x.to(torch.float32)",
                                                                 "layer.to(torch.float64)"]),
    (lambda: LAYER(np.ones((1, 4, 16), dtype=np.float32)), ["x must be a torch tensor", "ndarray",
                                                             "torch.as_tensor(x, dtype=torch.float32)"]),
    (lambda: LAYER([[0.0] * 16]), ["x must be a torch tensor", "list"]),
    (lambda: LAYER(torch.ones(1, 4, 16), torch.ones(1, 4, 16, dtype=torch.float16)),
     ["context has dtype torch.float16", "context.to(torch.float32)"]),
    (lambda: ac.MultiHeadAttention(16, 2).double()(torch.ones(1, 4, 16)),
     ["x has dtype torch.float32", "torch.float64", "x.to(torch.float64)"]),
])
def test_layer_input_of_the_wrong_kind_is_refused(call, words):
    text = message(call)
    assert all(w in text for w in words), text


META = torch.ones(1, 2, 4, 8, device="meta")
NO_TOKENS = ["holds no tokens", "pass at least one sequence of at least one token"]
ON_META = ["on the meta device", "holds shapes but no values", ".to('cpu')"]


@pytest.mark.parametrize("call,words", [
    (lambda: LAYER(torch.ones(0, 4, 16)), ["x has shape (0, 4, 16)", *NO_TOKENS]),
    (lambda: LAYER(torch.ones(2, 0, 16)), ["x has shape (2, 0, 16)", *NO_TOKENS]),
    (lambda: LAYER(torch.ones(2, 3, 16), torch.ones(2, 0, 16)), ["context has shape (2, 0, 16)", *NO_TOKENS]),
    (lambda: LAYER(torch.ones(2, 3, 16, device="meta")), ["x is on the meta device", *ON_META]),
    (lambda: LAYER(torch.ones(2, 3, 16), torch.ones(2, 3, 16, device="meta")), ["context is on the meta", *ON_META]),
    (lambda: ac.MultiHeadAttention(16, 2).to("meta")(torch.ones(2, 3, 16, device="meta")),
     ["this layer's weights are on the meta device", "layer.to_empty(device='cpu')"]),
    (lambda: ac.attention("softmax", META, META, META), ["q is on the meta device", *ON_META]),
    (lambda: ac.attention("linear", META, META, META, causal=True), ["q is on the meta device", *ON_META]),
    (lambda: ac.attention("softmax", *[torch.ones(0, 2, 4, 8)] * 3), ["empty input", "at least 1", NO_TOKENS[1]]),
    (lambda: ac.attention("softmax", *[torch.ones(1, 2, 0, 8)] * 3), ["empty input", "at least 1", NO_TOKENS[1]]),
    (lambda: ac.generation.prefill("softmax", META, META, META), ["q is on the meta device", *ON_META]),
])
def test_empty_and_meta_inputs_are_refused_first_with_a_sentence(call, words):
    """Before: torch's aminmax error on an empty dimension, or .item() on a meta tensor."""
    text = message(call)
    assert all(w in text for w in words), text


# --- make_state and init_state check their parameters before allocating ---------------------------------------------

SHAPE = Shape(1, 2, 64, 64, 16)


@pytest.mark.parametrize("call,words", [
    (lambda: ac.make_state("performer", SHAPE, features=0), ["features = 0", "between 1 and 16384"]),
    (lambda: ac.make_state("performer", SHAPE, features=10**12), ["features = 1000000000000", "between 1"]),
    (lambda: ac.make_state("performer", SHAPE, features=2.5), ["features = 2.5", "an integer"]),
    (lambda: ac.make_state("linformer", SHAPE, rank=10**12), ["rank = 1000000000000", "between 1 and 65536"]),
    (lambda: ac.make_state("linformer", SHAPE, rank=65), ["rank = 65", "sequence length 64", "rank ≤ 64"]),
    (lambda: ac.make_state("linformer", SHAPE), ["rank = 256", "sequence length 64"]),  # the default must fit too
    (lambda: ac.make_state("linformer", SHAPE, rnak=8), ["no parameter rnak", "rank"]),
    (lambda: performer.init_state(SHAPE, features=0), ["features = 0"]),
    (lambda: linformer.init_state(SHAPE, rank=10**12), ["rank = 1000000000000"]),
    (lambda: linformer.init_state(SHAPE, rank=100), ["rank = 100", "rank ≤ 64"]),
])
def test_state_parameters_are_checked_before_anything_is_allocated(call, words):
    text = message(call)
    assert all(w in text for w in words), text


def test_state_within_range_is_still_drawn():
    assert ac.make_state("linformer", SHAPE, rank=64)["E"].shape == (64, 64)
    assert ac.make_state("performer", SHAPE, features=8)["projection"].shape == (8, 16)


# --- NaN and inf in the input ---------------------------------------------------------------------------------------

def spoiled(name: str, value: float, count: int):
    q, k, v = qkv()
    t = {"q": q, "k": k, "v": v}[name]
    t.view(-1)[:count] = value
    return q, k, v


@pytest.mark.parametrize("call,words", [
    (lambda: ac.attention("softmax", *spoiled("k", float("nan"), 3)), ["k holds 3 NaN and 0 infinite",
                                                                        "clean the input"]),
    (lambda: ac.attention("sliding_window", *spoiled("q", float("inf"), 2), window=4), ["q holds 0 NaN and 2 inf"]),
    (lambda: ac.attention("performer", *spoiled("v", float("-inf"), 1), features=8), ["v holds 0 NaN and 1 inf"]),
    (lambda: ac.attention("linear", *spoiled("q", float("nan"), 5), causal=True), ["q holds 5 NaN"]),
    (lambda: LAYER(torch.full((1, 4, 16), float("nan"))), ["x holds 64 NaN", "clean the input"]),
    (lambda: LAYER(torch.ones(1, 4, 16), torch.full((1, 3, 16), float("inf"))), ["context holds 0 NaN and 48 inf"]),
])
def test_nan_or_inf_in_the_input_is_refused_naming_the_tensor(call, words):
    text = message(call)
    assert all(w in text for w in words), text


def test_inf_and_minus_inf_together_are_refused_and_huge_finite_values_are_not():
    """The check sums each tensor: +inf and −inf in one tensor sum to NaN, still refused with both counted; finite
    values whose sum overflows float32 (2 × 3·10³⁸) are finite, and the call goes on."""
    q, k, v = qkv()
    k.view(-1)[:2] = torch.tensor([float("inf"), float("-inf")])
    assert "k holds 0 NaN and 2 infinite" in message(lambda: ac.attention("softmax", q, k, v))
    q, k, v = qkv()
    v.view(-1)[:2] = 3e38
    assert torch.isinf(v.sum()) and torch.isfinite(ac.attention("softmax", q, k, v)).all()


@pytest.mark.parametrize("key", list(ac.MECHANISMS))
def test_the_finite_check_runs_at_the_entry_point_not_in_the_timed_function(key):
    """attn_core.engine.measure times spec.fn inside validated(); the check (5.3 ms of a sliding-window call of
    51–70 ms at n = 16384 on the CPU, and a host sync on a GPU) stays out of it, so there spec.fn passes NaN
    through. A mechanism whose spec says it checks its own inputs (`checks_finite`) refuses NaN outside validated()
    too."""
    name = "q" if ac.get(key).supports.shared_qk else "k"  # a mechanism whose keys are its queries never reads k
    q, k, v = spoiled(name, float("nan"), 1)
    params = {**SMALL.get(key, {}), "causal": plain_causal(ac.get(key))}
    assert f"{name} holds 1 NaN" in message(lambda: ac.attention(key, q, k, v, **params))
    with validated():
        assert torch.isnan(ac.get(key).fn(q, k, v, **params)).any()
    if ac.get(key).supports.checks_finite:
        assert f"{name} holds 1 NaN" in message(lambda: ac.get(key).fn(q, k, v, **params))
    else:
        assert torch.isnan(ac.get(key).fn(q, k, v, **params)).any()


@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("name", ["q", "k", "v"])
@pytest.mark.parametrize("value", [float("nan"), float("inf"), float("-inf")])
@pytest.mark.parametrize("n,heads,group_bytes", [(64, (4, 4), None), (4096, (8, 8), 1 << 16), (300, (8, 2), 1 << 14)])
def test_linear_notices_every_non_finite_value_in_its_sums(causal, name, value, n, heads, group_bytes, monkeypatch):
    """Linear attention checks its own inputs (its whole form from its sums and normalizers, not a reading of q,
    k and v): one NaN, +inf or −inf anywhere in one tensor is refused with the count, in one group of heads and, with
    GROUP_BYTES (and NATIVE_GROUP_BYTES) lowered, in a group a key/value head (φ a head at a time too), with shared
    heads, causal or not; huge finite inputs whose sums overflow are not refused."""
    from attn_core.mechanisms import _linear_core

    if group_bytes is not None:
        monkeypatch.setattr(_linear_core, "GROUP_BYTES", group_bytes)
        monkeypatch.setattr(_linear_core, "NATIVE_GROUP_BYTES", group_bytes)
    H, Hk = heads
    g = torch.Generator().manual_seed(n)
    q, k, v = (torch.randn(1, h, n, 16, generator=g) for h in (H, Hk, Hk))
    t = {"q": q, "k": k, "v": v}[name]
    t.view(-1)[int(torch.randint(t.numel(), (1,), generator=g))] = value
    kind = "1 NaN" if value != value else "0 NaN and 1 infinite"
    assert f"{name} holds {kind}" in message(lambda: ac.attention("linear", q, k, v, causal=causal))
    t.nan_to_num_(0.0, 0.0, 0.0).mul_(1e37)
    ac.attention("linear", q, k, v, causal=causal)  # overflows inside, but the input is finite: no refusal


# --- half precision of the kernelized mechanisms --------------------------------------------------------------------

def kernel_reference(key: str, q, k, v, causal: bool, projection=None) -> torch.Tensor:
    if key == "performer":
        return kernel_attention(positive_random_features(q, projection), positive_random_features(k, projection), v,
                                causal)
    return kernel_attention(elu_plus_one(q), elu_plus_one(k), v, causal)


@pytest.mark.parametrize("key", ["performer", "linear"])
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("dtype,bound", [(torch.float16, 0.005), (torch.bfloat16, 0.02)])
def test_half_precision_kernel_attention_stays_near_float64(key, causal, dtype, bound):
    """Max abs error against the float64 explicit kernel form on the same rounded inputs and features; seeded
    unit-variance q, k, v, B = 1, H = 4, n = 1024, D = 64, m = 256. Measured over seeds 0–3: Performer float16
    ≤ 0.001 and bfloat16 ≤ 0.008, linear float16 ≤ 0.0007 and bfloat16 ≤ 0.0053. Before the float32 sums: causal
    Performer float16 2.4–3.1 (its first rows), non-causal up to 0.12, bfloat16 0.05–0.08; linear float16 0.1–0.19."""
    q, k, v = qkv(1024, H=4, D=64, dtype=dtype)
    state = ac.make_state(key, Shape(1, 4, 1024, 1024, 64), dtype=dtype) if key == "performer" else {}
    out = ac.attention(key, q, k, v, causal=causal, **state)
    want = kernel_reference(key, q, k, v, causal, state.get("projection"))
    assert out.dtype == dtype
    assert (out.double() - want).abs().max().item() <= bound


# --- large finite inputs --------------------------------------------------------------------------------------------

@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("sq,sk", [(1e30, 1.0), (1.0, 1e30), (1e30, 1e30)])
def test_performer_of_huge_finite_inputs_is_finite(sq, sk, causal):
    """|x'|² = 10⁶⁰ overflows float32; before, every output was NaN."""
    q, k, v = qkv(64)
    out = ac.attention("performer", q * sq, k * sk, v, causal=causal, features=32)
    assert torch.isfinite(out).all()


def test_performer_of_huge_queries_tends_to_its_limit():
    """q × 10³⁰: each φ(q_i) becomes one-hot at its largest w·q_i, so out_i = Σ_j φ_m*(k_j) v_j / Σ_j φ_m*(k_j)."""
    q, k, v = qkv(64)
    w = ac.make_state("performer", Shape(1, 2, 64, 64, 16), features=32)["projection"]
    best = (q.double() @ w.double().T).argmax(-1)  # (B, H, n)
    phi_k = positive_random_features(k, w)  # (B, H, n, m)
    weights = torch.gather(phi_k.transpose(-2, -1), 2, best.unsqueeze(-1).expand(-1, -1, -1, 64))  # (B, H, n, n)
    want = (weights / weights.sum(-1, keepdim=True)) @ v.double()
    out = ac.attention("performer", q * 1e30, k, v, features=32, projection=w)
    torch.testing.assert_close(out.double(), want, atol=1e-5, rtol=1e-5)


def test_performer_of_huge_keys_returns_the_value_of_the_shortest_key():
    """k × 10³⁰, not causal: the −|k'|²/2 term leaves only the key of the smallest norm."""
    q, k, v = qkv(64)
    out = ac.attention("performer", q, k * 1e30, v, features=32)
    shortest = k.norm(dim=-1).argmin(-1)  # (B, H)
    want = torch.stack([v[0, h, shortest[0, h]] for h in range(2)])[None, :, None, :].expand_as(out)
    torch.testing.assert_close(out, want, atol=1e-6, rtol=1e-6)


@pytest.mark.parametrize("causal", [False, True])
def test_stabilised_performer_equals_the_textbook_features_on_ordinary_inputs(causal):
    """The stabiliser cancels: float32 output within 1e-5 of the unstabilised float64 form."""
    q, k, v = qkv(200, D=32)
    w = ac.make_state("performer", Shape(1, 2, 200, 200, 32), features=64)["projection"]
    out = ac.attention("performer", q, k, v, causal=causal, features=64, projection=w)
    torch.testing.assert_close(out.double(), kernel_reference("performer", q, k, v, causal, w), atol=1e-5, rtol=0)


@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("dtype,bound", [(torch.float16, 0.005), (torch.bfloat16, 0.02)])
def test_linear_attention_of_inputs_times_30_in_half_precision_is_finite_and_right(causal, dtype, bound):
    """Max abs error against the float64 explicit form of the same rounded inputs; measured float16 ≤ 0.0009,
    bfloat16 ≤ 0.0051. Before, float16 gave NaN here (φ(q)·Σφ(k) passed 65504)."""
    q, k, v = qkv(512, H=4, D=64)
    q, k, v = (q * 30).to(dtype), (k * 30).to(dtype), v.to(dtype)
    out = ac.attention("linear", q, k, v, causal=causal)
    assert torch.isfinite(out).all()
    assert (out.double() - kernel_reference("linear", q, k, v, causal)).abs().max().item() <= bound


def test_a_mask_given_to_a_mechanism_without_one_is_a_sentence_not_a_type_error():
    q = k = v = torch.randn(1, 1, 8, 4)
    with pytest.raises(ValueError, match="Linear \\(elu\\+1\\) has no parameter mask"):
        ac.attention("linear", q, k, v, mask=torch.ones(8, 8, dtype=torch.bool))
    assert ac.attention("softmax", q, k, v, mask=torch.ones(8, 8, dtype=torch.bool)).shape == (1, 1, 8, 4)


# --- any strided input --------------------------------------------------------------------------------------------

B_, H_, N_, D_ = 2, 3, 37, 16
LAYOUTS = {  # (B, H, N, D) tensors as other code hands them over: views, never copies
    "heads split from (B, N, H·D)": lambda r: r(B_, N_, H_, D_).transpose(1, 2),
    "last two transposed": lambda r: r(B_, H_, D_, N_).transpose(-1, -2),
    "every other column": lambda r: r(B_, H_, N_, 2 * D_)[..., ::2],
    "expanded batch (stride 0)": lambda r: r(1, H_, N_, D_).expand(B_, H_, N_, D_),
    "expanded heads (stride 0)": lambda r: r(B_, 1, N_, D_).expand(B_, H_, N_, D_),
    "expanded sequence (stride 0)": lambda r: r(B_, H_, 1, D_).expand(B_, H_, N_, D_),
}
SMALL_PARAMS = with_copies({"linformer": {"rank": 8}, "performer": {"features": 32}, "nystrom": {"landmarks": 8},
                            "reformer": {"bucket_size": 8, "n_hashes": 2}, "additive": {"attn_dim": 8},
                            "bigbird": {"block": 8, "window_blocks": 3, "global_blocks": 1, "random_blocks": 1}})


def strided(layout: str, seed: int = 0) -> list[torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    return [LAYOUTS[layout](lambda *s: torch.randn(*s, generator=g)) for _ in range(3)]


@pytest.mark.parametrize("layout", list(LAYOUTS))
@pytest.mark.parametrize("key", list(ac.MECHANISMS))
def test_every_mechanism_takes_strided_and_expanded_inputs(key, layout):
    """The same output as for contiguous copies of the same values, to 1e-6."""
    spec, params = ac.get(key), SMALL_PARAMS.get(key, {})
    params = {**params, **ac.make_state(key, Shape(B_, H_, N_, N_, D_), seed=1, **params)}
    q, k, v = strided(layout)
    assert not all(t.is_contiguous() for t in (q, k, v))
    for causal in (c for c in (False, True) if runs(spec, c)):
        out = ac.attention(key, q, k, v, causal=causal, **params)
        same = ac.attention(key, q.contiguous(), k.contiguous(), v.contiguous(), causal=causal, **params)
        torch.testing.assert_close(out, same, atol=1e-6, rtol=1e-6)


@pytest.mark.parametrize("layout", ["heads split from (B, N, H·D)", "expanded batch (stride 0)"])
@pytest.mark.parametrize("key", [k for k in ac.MECHANISMS if ac.generation.can_generate(k)[0]])
def test_generation_takes_strided_and_expanded_inputs(key, layout):
    """A prompt and then new tokens, each a strided view, as contiguous copies would give."""
    params = SMALL_PARAMS.get(key, {})
    params = {**params, **ac.make_state(key, Shape(B_, H_, N_ + 3, N_ + 3, D_, causal=True), seed=1, **params)}
    q, k, v = strided(layout)
    tokens = [[t[:, :, i:i + 1] for t in strided(layout, seed=i + 1)] for i in range(3)]  # (B, H, 1, D) views
    out, cache = ac.generation.prefill(key, q, k, v, max_len=N_ + 3, **params)
    same, plain = ac.generation.prefill(key, q.contiguous(), k.contiguous(), v.contiguous(), max_len=N_ + 3, **params)
    torch.testing.assert_close(out, same, atol=1e-6, rtol=1e-6)
    for token in tokens:
        out, cache = ac.generation.step(key, *token, cache)
        same, plain = ac.generation.step(key, *(t.contiguous() for t in token), plain)
        torch.testing.assert_close(out, same, atol=1e-6, rtol=1e-6)
