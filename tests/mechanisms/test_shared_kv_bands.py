"""The banded and block-sparse mechanisms with key/value heads shared by groups of query heads, where the folded
query blocks (a group's heads stacked as a block's rows) cross chunk boundaries, touch both edges and end in a
partial block; Longformer's given global positions and BigBird's random blocks, which belong to query positions,
not heads; and the memory model where P V copies the value windows."""
from __future__ import annotations

import pytest
import torch

import attn_core as ac
from attn_core.mechanisms import _banded
from attn_core.spec import Shape
from tests.baselines import allowed, masked_softmax, trace_peak_bytes

B, H, KV, N, D = 2, 6, 2, 101, 8  # n = 101: no multiple of any block below, so the last block is partial
CASES = {"sliding_window": {"window": 7}, "local": {"block": 8, "lookback": 1, "lookahead": 1},
         "sparse": {"stride": 10}, "longformer": {"window": 5, "global_tokens": 3},
         "bigbird": {"block": 8, "window_blocks": 3, "global_blocks": 1, "random_blocks": 2}}


def inputs(n: int = N, kv_heads: int = KV, *, grad: bool = False):
    g = torch.Generator().manual_seed(5)
    q = torch.randn(B, H, n, D, generator=g, dtype=torch.float64)
    k, v = (torch.randn(B, kv_heads, n, D, generator=g, dtype=torch.float64) for _ in "kv")
    return [t.requires_grad_(grad) for t in (q, k, v)]


def each(t: torch.Tensor) -> torch.Tensor:
    """(B, Hk, n, D) → (B, H, n, D), query head i given key/value head ⌊i·Hk/H⌋, one head at a time."""
    return torch.stack([t[:, i * t.shape[1] // H] for i in range(H)], dim=1)


def state(key: str, causal: bool, params: dict) -> dict:
    if key == "longformer":  # given positions, out of order, one inside a block's band, one at the very end
        return {"global_positions": torch.tensor([60, 3, N - 1])}
    return ac.make_state(key, Shape(B, H, N, N, D, causal=causal, Hk=KV), seed=2, **params)


@pytest.mark.parametrize("chunk", [1, 5000, 40000])  # one block a chunk, a few, most of the sequence
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("key", list(CASES))
def test_folded_blocks_across_chunks_equal_the_pattern_and_its_gradients(key, causal, chunk, monkeypatch):
    monkeypatch.setattr(_banded, "CHUNK_ELEMS", chunk)
    params, (q, k, v) = CASES[key], inputs(grad=True)
    s = state(key, causal, params)
    out = ac.attention(key, q, k, v, causal=causal, **params, **s)
    mask = allowed(key, N, N, causal, **{**ac.get(key).defaults, **params}, **s)
    torch.testing.assert_close(out, masked_softmax(q, each(k), each(v), mask), atol=1e-10, rtol=1e-9)
    w = torch.randn(out.shape, generator=torch.Generator().manual_seed(1), dtype=torch.float64)
    got = torch.autograd.grad((out * w).sum(), (q, k, v))
    want = torch.autograd.grad((masked_softmax(q, each(k), each(v), mask) * w).sum(), (q, k, v))
    for a, b in zip(got, want):
        torch.testing.assert_close(a, b, atol=1e-9, rtol=1e-8)


@pytest.mark.parametrize("chunk", [1, 40000])
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("key", list(CASES))
def test_folded_blocks_with_padding_equal_the_repeated_heads(key, causal, chunk, monkeypatch):
    """Right padding in one element, left padding in the other (causal: its first queries see no real key and
    output zeros), across chunks."""
    monkeypatch.setattr(_banded, "CHUNK_ELEMS", chunk)
    params, (q, k, v) = CASES[key], inputs()
    pad = torch.stack([torch.arange(N) >= 70, torch.arange(N) < 25])
    s = state(key, causal, params)
    out = ac.attention(key, q, k, v, causal=causal, key_padding_mask=pad, **params, **s)
    want = ac.attention(key, q, each(k), each(v), causal=causal, key_padding_mask=pad, **params, **s)
    torch.testing.assert_close(out, want, atol=1e-10, rtol=1e-9)
    if causal:
        assert out[1, :, :25].abs().max() == 0


@pytest.mark.parametrize("kv_heads", [1, 3, 6])
def test_bigbird_and_longformer_state_belongs_to_positions_not_heads(kv_heads):
    """One random table (one row per query block) and one list of global positions serve every head: each query
    head given its key/value head alone is the same attention as the call with all heads."""
    q, k, v = inputs(kv_heads=kv_heads)
    for key in ("bigbird", "longformer"):
        params, s = CASES[key], state(key, False, CASES[key])
        out = ac.attention(key, q, k, v, **params, **s)
        for i in (0, H - 1):
            j = i * kv_heads // H
            alone = ac.attention(key, q[:, i:i + 1], k[:, j:j + 1], v[:, j:j + 1], **params, **s)
            torch.testing.assert_close(out[:, i:i + 1], alone, atol=1e-10, rtol=1e-9)


@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("heads,kv_heads,n,d", [(3, 3, 3000, 40), (8, 2, 2048, 64), (4, 1, 3000, 40)])
def test_memory_where_the_values_windows_are_copied(heads, kv_heads, n, d, causal):
    """A small window (blocks of 32 rows) where P V's copy of the value windows, not the scores beside their
    probabilities, sets the peak (MHA: D > block), and with shared heads, where it copies Hk heads' windows: the
    spec within 2% of the allocator's records."""
    spec, params = ac.get("sliding_window"), {"window": 20}
    shape = Shape(2, heads, n, n, d, causal=causal, Hk=kv_heads)
    g = torch.Generator().manual_seed(0)
    q = torch.randn(2, heads, n, d, generator=g)
    k, v = (torch.randn(2, kv_heads, n, d, generator=g) for _ in "kv")
    with torch.inference_mode():
        call = lambda: spec.fn(q, k, v, causal=causal, **params)  # noqa: E731
        call()
        measured = trace_peak_bytes(call)
    assert spec.cost.memory_bytes(shape, **params) == pytest.approx(measured, rel=0.02)
