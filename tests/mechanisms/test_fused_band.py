"""The banded kernels' fused interior (`_banded._fused`: one fused call per query head of a group over strided
windows) against the same code with no interior (all rows one region, `_banded._edge`); each end's bias against the
pattern at absolute positions; Longformer's global keys joined afterwards against the chunked form that scores them
beside each block's band."""
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
def test_fused_interior_equals_one_region_of_all_rows(monkeypatch, key, params, causal, kv_heads, split):
    q, k, v = qkv(4, kv_heads, split=split)
    calls = []
    real = _banded._fused
    monkeypatch.setattr(_banded, "_fused", lambda *a: calls.append(a[5]) or real(*a))
    fused = ac.attention(key, q, k, v, causal=causal, **params)
    assert calls and calls[0] > 1  # the interior ran fused, over several blocks
    monkeypatch.setattr(_banded, "interior", lambda n, block, left, right: (0, 0))
    chunked = ac.attention(key, q, k, v, causal=causal, **params)
    torch.testing.assert_close(fused, chunked, atol=1e-12, rtol=1e-10)


@pytest.mark.parametrize("key,params", CASES[:2])
def test_the_interior_takes_a_kernel_output_of_any_strides(monkeypatch, key, params):
    """CUDA's fused kernels return (B, L, H, D) memory seen as (B, H, L, D): the interior copies from any strides."""
    q, k, v = qkv(4, 2, n=300)
    expected = ac.attention(key, q, k, v, **params)
    real = _banded.F.scaled_dot_product_attention
    monkeypatch.setattr(_banded.F, "scaled_dot_product_attention",
                        lambda *a, **kw: real(*a, **kw).transpose(1, 2).contiguous().transpose(1, 2))
    torch.testing.assert_close(ac.attention(key, q, k, v, **params), expected, atol=1e-12, rtol=1e-10)


def test_interior_blocks_keep_their_whole_window_inside():
    """Blocks of 128 with 256 keys each side at n = 1000: block 2 is the first whose window starts at ≥ 0, block 5
    the first whose window (ending at 6·128 + 256 = 1024) passes n."""
    assert _banded.interior(1000, 128, 256, 256) == (2, 5)
    assert _banded.interior(1000, 128, 256, 0) == (2, 7)  # causal: no keys to the right; block 7 is partial
    lo, hi = _banded.interior(300, 128, 256, 256)
    assert hi <= lo  # no interior block: all in chunks
    assert _banded.edges(300, 128, 256, 256) == [(0, 300)]  # then one region, every row against every key
    assert _banded.edges(1000, 128, 256, 256) == [(0, 256), (640, 1000)]
    assert _banded.edge_keys(1000, 640, 1000, 256, 256) == (384, 1000)


def pattern_bias(pattern, a: int, e: int, ka: int, ke: int) -> torch.Tensor:
    """0 where the pattern keeps (i, j), the floor elsewhere, from the predicate at every absolute position."""
    keep = pattern(torch.arange(a, e)[:, None], torch.arange(ka, ke)[None, :])
    return torch.zeros(keep.shape, dtype=torch.float64).masked_fill_(~keep, _banded.floor(torch.float64))


@pytest.mark.parametrize("n", [64, 1000, 1003])
@pytest.mark.parametrize("name,pattern,block,left,right", [
    ("local", ac.masks.block_local(16, 1, 1), 16, 16, 16),
    ("local wide", ac.masks.block_local(16, 2, 3), 16, 32, 48),
    ("local causal", ac.masks.block_local(16, 2, 0) & ac.masks.causal, 16, 32, 0),
    ("window", ac.masks.sliding_window(40), 32, 40, 40),
    ("causal window", ac.masks.sliding_window(40) & ac.masks.causal, 32, 40, 0),
])
def test_each_end_s_bias_is_the_pattern_at_its_positions(name, pattern, block, left, right, n):
    """`edge_bias` lays the shift-invariant (block, S) bias at each block's window: the same cells as the predicate
    evaluated at absolute positions, and None only where that keeps every cell."""
    span = left + block + right
    base = block * -(-left // block)
    keep = pattern(base + torch.arange(block)[:, None], base - left + torch.arange(span)[None, :])
    inner = torch.zeros(block, span, dtype=torch.float64).masked_fill_(~keep, _banded.floor(torch.float64))
    for a, e in _banded.edges(n, block, left, right):
        ka, ke = _banded.edge_keys(n, a, e, left, right)
        want = pattern_bias(pattern, a, e, ka, ke)
        got = _banded.edge_bias(inner, bool(keep.all()), a, e, ka, ke, block, left)
        if got is None:
            assert bool((want == 0).all()), (name, a, e)
        else:
            torch.testing.assert_close(got, want, atol=0, rtol=0)


@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("kv_heads", [4, 2])
@pytest.mark.parametrize("params", [{"window": 37, "global_tokens": 3}, {"window": 100, "global_tokens": 2},
                                    {"window": 16, "global_tokens": 4, "global_positions": torch.tensor([5, 300, 301,
                                                                                                      699])}])
def test_longformer_joins_its_global_keys_as_the_chunks_score_them(monkeypatch, causal, kv_heads, params):
    """The band's rows with the global keys joined through its log-sum-exp (`_join_extra`, what runs on a CPU
    without gradients) equal the chunked form, each block's band and the global keys in one softmax (what runs with
    gradients); a global key inside a row's band is counted once either way."""
    q, k, v = qkv(4, kv_heads)
    joined = []
    real = _banded._join_extra
    monkeypatch.setattr(_banded, "_join_extra", lambda *a: joined.append(1) or real(*a))
    fast = ac.attention("longformer", q, k, v, causal=causal, **params)
    assert joined  # the join ran
    monkeypatch.setattr(_banded, "joins", lambda *a: False)
    monkeypatch.setattr("attn_core.mechanisms.longformer.joins", lambda *a: False)
    chunked = ac.attention("longformer", q, k, v, causal=causal, **params)
    torch.testing.assert_close(fast, chunked, atol=1e-12, rtol=1e-10)


def test_the_join_waits_for_no_gradient():
    """The log-sum-exp the join reads carries no gradient: with inputs that ask for one, the chunked form runs."""
    q, k, v = qkv(2, 2, n=64)
    assert _banded.joins(q, k, v)
    q.requires_grad_(True)
    assert not _banded.joins(q, k, v)
    with torch.no_grad():
        assert _banded.joins(q, k, v)


def test_the_shared_window_bias_is_made_once_and_serves_inference_and_training_alike():
    """`window_bias` is kept from a call under inference mode and read, as SDPA's mask, by a later call whose
    backward saves it: it is made outside inference mode, so the gradient runs, and the second call makes no new one."""
    q, k, v = qkv(2, 2, n=300)
    _banded.window_bias.cache_clear()
    with torch.inference_mode():
        first = ac.attention("local", q, k, v, causal=True, block=16)
    made = _banded.window_bias.cache_info().misses
    qg = q.clone().requires_grad_()
    out = ac.attention("local", qg, k, v, causal=True, block=16)
    out.sum().backward()
    assert _banded.window_bias.cache_info().misses == made and _banded.window_bias.cache_info().hits >= 1
    torch.testing.assert_close(out.detach(), first, atol=1e-12, rtol=1e-10)
    assert torch.isfinite(qg.grad).all() and qg.grad.abs().max() > 0


ENDS = [("local", {"block": 16}, 320), ("local", {"block": 16, "lookback": 2, "lookahead": 2}, 320),
        ("sliding_window", {"window": 40}, 640), ("sliding_window", {"window": 7}, 96)]


@pytest.mark.parametrize("key,params,n", ENDS)
@pytest.mark.parametrize("batch", [1, 2])
def test_both_ends_in_one_call_equal_one_call_each(monkeypatch, key, params, n, batch):
    """Where both ends have one shape (n a multiple of the block, a window as wide on both sides), `_ends_together`
    runs them as two "heads" of strided views, one bias stacked for each (None for block-local's whole windows): the
    same rows as `_edge` gives them one at a time."""
    g = torch.Generator().manual_seed(2)
    q, k, v = (torch.randn(batch, 3, n, 8, generator=g, dtype=torch.float64) for _ in range(3))
    ran = []
    real = _banded._ends_together
    monkeypatch.setattr(_banded, "_ends_together", lambda *a: ran.append(real(*a)) or ran[-1])
    together = ac.attention(key, q, k, v, **params)
    assert ran == [True]
    monkeypatch.setattr(_banded, "_ends_together", lambda *a: False)
    apart = ac.attention(key, q, k, v, **params)
    torch.testing.assert_close(together, apart, atol=1e-12, rtol=1e-10)


def test_both_ends_go_apart_where_they_differ_or_heads_are_shared_or_split(monkeypatch):
    """One call for both ends only where it can be a strided view: not where the ends differ in shape, where key/value
    heads are shared, or where a tensor's heads are split from (B, N, H·D)."""
    assert _banded.same_ends(320, 16, 16, 16) and not _banded.same_ends(330, 16, 16, 16)
    assert not _banded.same_ends(320, 16, 16, 0)  # causal: one end
    ran = []
    real = _banded._ends_together
    monkeypatch.setattr(_banded, "_ends_together", lambda *a: ran.append(real(*a)) or ran[-1])
    for heads, kv_heads, split in ((4, 2, False), (4, 4, True)):
        q, k, v = qkv(heads, kv_heads, n=320, split=split)
        ac.attention("local", q, k, v, block=16)
    assert ran == [False, False]
