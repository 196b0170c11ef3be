"""The banded kernels' fused interior (`_banded._fused`: one fused call per query head of a group over strided
windows) against their chunk-by-chunk form, the same code with no interior (every block in chunks)."""
from __future__ import annotations

import pytest
import torch

import attn_core as ac
from attn_core.mechanisms import _banded

CASES = [("sliding_window", {"window": 37}), ("local", {}), ("longformer", {"window": 37, "global_tokens": 0})]


def qkv(heads: int, kv_heads: int, n: int = 700, d: int = 24, split: bool = False):
    g = torch.Generator().manual_seed(1)
    if split:  # heads split from (B, N, H·D), as MultiHeadAttention makes them: strided views
        return [torch.randn(2, n, h, d, generator=g, dtype=torch.float64).transpose(1, 2)
                for h in (heads, kv_heads, kv_heads)]
    return [torch.randn(2, h, n, d, generator=g, dtype=torch.float64) for h in (heads, kv_heads, kv_heads)]


@pytest.mark.parametrize("key,params", CASES)
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("kv_heads,split", [(4, False), (2, False), (1, True)])
def test_fused_interior_equals_the_chunks(monkeypatch, key, params, causal, kv_heads, split):
    q, k, v = qkv(4, kv_heads, split=split)
    calls = []
    real = _banded._fused
    monkeypatch.setattr(_banded, "_fused", lambda *a: calls.append(a[5]) or real(*a))
    fused = ac.attention(key, q, k, v, causal=causal, **params)
    assert calls and calls[0] > 1  # the interior ran fused, over several blocks
    monkeypatch.setattr(_banded, "interior", lambda n, block, left, right: (0, 0))
    chunked = ac.attention(key, q, k, v, causal=causal, **params)
    torch.testing.assert_close(fused, chunked, atol=1e-12, rtol=1e-10)


def test_interior_blocks_keep_their_whole_window_inside():
    """Blocks of 128 with 256 keys each side at n = 1000: block 2 is the first whose window starts at ≥ 0, block 5
    the first whose window (ending at 6·128 + 256 = 1024) passes n."""
    assert _banded.interior(1000, 128, 256, 256) == (2, 5)
    assert _banded.interior(1000, 128, 256, 0) == (2, 7)  # causal: no keys to the right; block 7 is partial
    lo, hi = _banded.interior(300, 128, 256, 256)
    assert hi <= lo  # no interior block: all in chunks
