"""StreamingLLM (Xiao et al. 2023, arXiv 2309.17453): sliding window's generation with `keep_first=S`, the first S
tokens kept beside the window, against a dense masked softmax written here in float64 (query i sees key j iff
0 ≤ i − j ≤ w, or j < S and j ≤ i), with and without gpt-oss's sinks (an extra zero-valued column); its forward (the
prompt's outputs), its cache bytes and its refusals."""
from __future__ import annotations

import pytest
import torch

import attn_core as ac
from attn_core.nn import generation as gen
from attn_core.spec import Shape

KEY = "sliding_window"


def streaming_mask(n: int, window: int, first: int, causal: bool = True) -> torch.Tensor:
    """(n, n) cell by cell: the window (causal: 0 ≤ i − j ≤ w; else |i − j| ≤ w) or one of the first S keys."""
    m = torch.zeros(n, n, dtype=torch.bool)
    for i in range(n):
        for j in range(n):
            near = 0 <= i - j <= window if causal else abs(i - j) <= window
            m[i, j] = (near or j < first) and (j <= i or not causal)
    return m


def reference(q, k, v, keep, sinks=None) -> torch.Tensor:
    """softmax over the kept keys in float64, explicit exp and sum; `sinks` (H,): one more column a row scoring the
    head's logit, with a zero value. keep broadcastable to (B, H, n, n); k, v repeated for shared heads."""
    B, H, n, D = q.shape
    k64, v64 = (t.double().repeat_interleave(H // k.shape[1], dim=1) for t in (k, v))
    s = (q.double() @ k64.transpose(-2, -1) / D ** 0.5).masked_fill(~keep, float("-inf"))
    values = v64
    if sinks is not None:
        s = torch.cat([s, sinks.double().view(1, H, 1, 1).expand(B, H, n, 1)], -1)
        values = torch.cat([v64, torch.zeros(B, H, 1, D, dtype=torch.float64)], -2)
    e = torch.exp(s - s.amax(-1, keepdim=True))
    e = torch.nan_to_num(e / e.sum(-1, keepdim=True))  # a row with no key (padding): zeros
    return e @ values


def inputs(n: int, *, H: int = 4, Hk: int = 2, seed: int = 0, grad: bool = False):
    g = torch.Generator().manual_seed(seed)
    q = torch.randn(2, H, n, 8, generator=g)
    k, v = (torch.randn(2, Hk, n, 8, generator=g) for _ in range(2))
    sinks = torch.randn(H, generator=g)
    return [t.requires_grad_(grad) for t in (q, k, v, sinks)]


def generate(q, k, v, n0: int, **params) -> tuple[torch.Tensor, object]:
    out, cache = gen.prefill(KEY, q[:, :, :n0], k[:, :, :n0], v[:, :, :n0], **params)
    steps = [gen.step(KEY, q[:, :, t:t + 1], k[:, :, t:t + 1], v[:, :, t:t + 1], cache)[0]
             for t in range(n0, q.shape[2])]
    return torch.cat([out, *steps], dim=2), cache


@pytest.mark.parametrize("first", [1, 4])
@pytest.mark.parametrize("n0", [1, 3, 14])  # the prompt shorter than S, inside the first window, past both
@pytest.mark.parametrize("Hk", [4, 2, 1])
@pytest.mark.parametrize("sinks", [False, True])
def test_generation_keeps_the_first_tokens_and_the_window(first, n0, Hk, sinks):
    n, w = 30, 5
    q, k, v, a = inputs(n, Hk=Hk, seed=first + n0)
    given = {"sinks": a} if sinks else {}
    got, _ = generate(q, k, v, n0, window=w, keep_first=first, **given)
    expected = reference(q, k, v, streaming_mask(n, w, first), a if sinks else None)
    torch.testing.assert_close(got.double(), expected, atol=2e-6, rtol=1e-5)


def test_the_first_tokens_change_what_a_late_token_sees():
    """Past the window, a plain sliding window has dropped the first tokens, StreamingLLM has not."""
    q, k, v, _ = inputs(20)
    streaming, _ = generate(q, k, v, 2, window=3, keep_first=2)
    plain, _ = generate(q, k, v, 2, window=3)
    # token i sees i − 3 … i: token 0 is in the window up to i = 3, outside it from i = 4 on
    torch.testing.assert_close(streaming[:, :, :4], plain[:, :, :4])
    assert ((streaming[:, :, 4:] - plain[:, :, 4:]).abs().amax(-1) > 1e-3).all()
    torch.testing.assert_close(plain.double(), reference(q, k, v, streaming_mask(20, 3, 0)), atol=2e-6, rtol=1e-5)


@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("n", [7, 70])  # fewer tokens than a block of rows; several blocks, an edge cut
def test_the_forward_sees_the_first_tokens_too(causal, n):
    q, k, v, a = inputs(n, Hk=1)
    with torch.no_grad():
        out = ac.get(KEY).fn(q, k, v, causal=causal, window=4, keep_first=3, sinks=a)
    torch.testing.assert_close(out.double(), reference(q, k, v, streaming_mask(n, 4, 3, causal), a),
                               atol=2e-6, rtol=1e-5)


def test_the_forward_with_padding_and_gradients():
    n = 40
    q, k, v, a = inputs(n, grad=True)
    pad = torch.zeros(2, n, dtype=torch.bool)
    pad[1, :2] = True  # element 1's first two keys are padding: its kept first tokens are fewer
    out = ac.get(KEY).fn(q, k, v, causal=True, window=4, keep_first=3, sinks=a, key_padding_mask=pad)
    expected = reference(q, k, v, streaming_mask(n, 4, 3) & ~pad[:, None, None, :], a)
    torch.testing.assert_close(out.double(), expected, atol=2e-6, rtol=1e-5)
    got = torch.autograd.grad(out.sum(), (q, k, v, a))
    want = torch.autograd.grad(expected.sum(), (q, k, v, a))
    for x, y in zip(got, want):
        torch.testing.assert_close(x.double(), y.double(), atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("n", [2, 5, 9, 40])
def test_cache_bytes_are_the_window_and_the_first_tokens(n):
    """B = 2, Hk = 2, D = 8, float32: 2 (k and v) · 2 · 2 · 8 · 4 = 256 bytes a token. Window 5 (6 tokens with the
    new one) and S = 3: n = 2 holds 2 + 2 tokens, n = 5 holds 5 + 3, n = 9 and 40 hold 6 + 3."""
    q, k, v, _ = inputs(n)
    _, cache = gen.prefill(KEY, q, k, v, window=5, keep_first=3)
    tokens = {2: 4, 5: 8, 9: 9, 40: 9}[n]
    shape = Shape(2, 4, n, n, 8, Hk=2, causal=True)
    assert gen.cache_bytes(KEY, shape, window=5, keep_first=3) == cache.used_bytes == 256 * tokens


def test_the_cache_stays_bounded_as_tokens_come():
    q, k, v, _ = inputs(60)
    _, cache = generate(q, k, v, 1, window=5, keep_first=3)
    assert cache.nbytes == cache.used_bytes == 256 * 9  # 60 tokens seen, 6 + 3 held
    assert gen.cache_bytes(KEY, Shape(2, 4, 60, 60, 8, Hk=2), window=5) == 256 * 6  # without: the window alone


def test_keep_first_zero_is_the_plain_window():
    q, k, v, _ = inputs(25)
    torch.testing.assert_close(generate(q, k, v, 4, window=3, keep_first=0)[0], generate(q, k, v, 4, window=3)[0])


def test_rewind_times_a_step_at_a_fixed_context():
    q, k, v, _ = inputs(20)
    _, cache = gen.prefill(KEY, q[:, :, :12], k[:, :, :12], v[:, :, :12], window=4, keep_first=2)
    mark = cache.mark()
    first = gen.step(KEY, q[:, :, 12:13], k[:, :, 12:13], v[:, :, 12:13], cache)[0]
    cache.rewind(mark)
    again = gen.step(KEY, q[:, :, 12:13], k[:, :, 12:13], v[:, :, 12:13], cache)[0]
    torch.testing.assert_close(again, first)
    assert cache.mark() == (13, 13, 2)


@pytest.mark.parametrize("key,value,words", [
    ("softmax", 4, "cannot keep the first tokens.*sliding_window"),
    (KEY, -1, "whole number of tokens ≥ 0"),
    (KEY, 2.5, "whole number of tokens ≥ 0"),
    (KEY, True, "whole number of tokens ≥ 0"),
])
def test_bad_keep_first_is_refused_with_a_sentence(key, value, words):
    q, k, v, _ = inputs(8)
    with pytest.raises(ValueError, match=words):
        gen.prefill(key, q, k, v, keep_first=value)
    with pytest.raises(ValueError, match=words):
        gen.cache_bytes(key, Shape(2, 4, 8, 8, 8, Hk=2), keep_first=value)
