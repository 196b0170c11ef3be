"""Llama 4's chunked attention measured as every pattern is: our banded kernel (local with block = chunk, no blocks
back or ahead, causal: each chunk one causal square for the fused kernel's is_causal), SDPA with the dense mask and
Flex's mask_mod, against a float64 softmax over a mask written cell by cell here; with sinks, padding and shared
key/value heads; generated token by token from a cache that never holds more than one chunk."""
from __future__ import annotations

import math

import pytest
import torch

from attn_core import masks
from attn_core.mechanisms import _banded, flex
from attn_core.mechanisms.local import _pattern
from attn_core.nn import generation

CHUNK = 16


def chunk_cells(n: int, chunk: int) -> torch.Tensor:
    """(n, n) bool, written cell by cell: query i sees key j iff ⌊i/chunk⌋ = ⌊j/chunk⌋ and j ≤ i."""
    return torch.tensor([[i // chunk == j // chunk and j <= i for j in range(n)] for i in range(n)])


def reference(q, k, v, keep, sinks=None):
    """float64 softmax(q kᵀ/√d) v over kept cells (keep broadcasting to (B, H, n, n)), k and v repeated to q's heads;
    `sinks` (H,): exp(a_h) joins each row's denominator with no value; a row that keeps nothing gives 0."""
    r = q.shape[1] // k.shape[1]
    k, v = (t.double().repeat_interleave(r, dim=1) for t in (k, v))
    s = q.double() @ k.transpose(-1, -2) / math.sqrt(q.shape[-1])
    top = s.masked_fill(~keep, -math.inf).amax(-1, keepdim=True).clamp_min(-1e300)
    if sinks is not None:
        top = torch.maximum(top, sinks.double().view(1, -1, 1, 1))
    w = torch.where(keep, torch.exp(s - top), 0.0)
    total = w.sum(-1, keepdim=True) + (0 if sinks is None else torch.exp(sinks.double().view(1, -1, 1, 1) - top))
    return torch.where(total > 0, w / total, 0.0) @ v


def qkv(n: int, heads: int = 4, key_heads: int = 4, d: int = 8, seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    return (torch.randn(2, h, n, d, generator=g) for h in (heads, key_heads, key_heads))


PARAMS = {"block": CHUNK, "lookback": 0, "lookahead": 0}


@pytest.mark.parametrize("n", [16, 64, 71])  # one chunk, whole chunks, a partial last chunk
def test_ours_and_the_dense_mask_compute_chunked_attention_and_flex_keeps_its_cells(n):
    from torch.nn.attention.flex_attention import create_mask
    q, k, v = qkv(n)
    want = reference(q, k, v, chunk_cells(n, CHUNK))
    for implementation in ("ours", "dense-mask"):
        got = flex.masked_attention(q, k, v, "local", implementation=implementation, causal=True, **PARAMS)
        torch.testing.assert_close(got.double(), want, atol=2e-6, rtol=0, msg=implementation)
    masking = flex.masking_of("local", True, PARAMS)
    assert torch.equal(create_mask(masking.mask_mod(), 1, 1, n, n, device="cpu")[0, 0], chunk_cells(n, CHUNK))
    assert torch.equal(masks.dense_mask(masking.pattern, n, n), masks.dense_mask(masks.chunked(CHUNK), n, n))


def test_each_chunk_goes_to_the_fused_kernel_as_a_causal_square_and_other_bands_do_not():
    cpu = torch.device("cpu")
    assert _banded.causal_square(_pattern(True, CHUNK, 0, 0), CHUNK, 0, CHUNK, torch.float32, cpu)
    assert not _banded.causal_square(_pattern(False, CHUNK, 0, 0), CHUNK, 0, CHUNK, torch.float32, cpu)
    assert not _banded.causal_square(_pattern(True, CHUNK, 1, 0), CHUNK, CHUNK, 2 * CHUNK, torch.float32, cpu)


@pytest.mark.parametrize("grad", [False, True])
def test_sinks_shared_heads_and_gradients_through_the_causal_squares(grad):
    n = 64
    q, k, v = qkv(n, heads=4, key_heads=2, seed=1)
    sinks = torch.tensor([0.5, -1.0, 2.0, 0.0])
    keep = chunk_cells(n, CHUNK)
    if grad:
        q.requires_grad_(True)
    with torch.inference_mode(not grad):
        got = flex.masked_attention(q, k, v, "local", causal=True, sinks=sinks, **PARAMS)
    torch.testing.assert_close(got.double(), reference(q.detach(), k, v, keep, sinks), atol=2e-6, rtol=0)
    if grad:
        got.square().sum().backward()
        q64 = q.detach().double().requires_grad_(True)
        reference(q64, k, v, keep, sinks).square().sum().backward()
        torch.testing.assert_close(q.grad.double(), q64.grad, atol=1e-5, rtol=0)


def test_padding_keeps_each_chunk_to_its_unpadded_keys():
    n = 48
    q, k, v = qkv(n, seed=2)
    pad = torch.arange(n)[None, :] >= torch.tensor([40, 20])[:, None]  # (2, n) True on padding
    got = flex.masked_attention(q, k, v, "local", causal=True, key_padding_mask=pad, **PARAMS)
    keep = chunk_cells(n, CHUNK)[None, None] & ~pad[:, None, None, :]
    torch.testing.assert_close(got.double(), reference(q, k, v, keep), atol=2e-6, rtol=0)


def test_generation_matches_the_mask_and_its_cache_never_holds_more_than_one_chunk():
    n, prompt = 53, 5
    q, k, v = qkv(n, seed=3)
    want = reference(q, k, v, chunk_cells(n, CHUNK))
    out, cache = generation.prefill("local", q[:, :, :prompt], k[:, :, :prompt], v[:, :, :prompt], **PARAMS)
    steps = [out]
    for t in range(prompt, n):
        y, cache = generation.step("local", q[:, :, t:t + 1], k[:, :, t:t + 1], v[:, :, t:t + 1], cache)
        steps.append(y)
        assert all(x.shape[-2] <= CHUNK for x in cache.tensors() if x.dim() == 4)  # keys, values: one chunk at most
    torch.testing.assert_close(torch.cat(steps, dim=2).double(), want, atol=2e-6, rtol=0)
