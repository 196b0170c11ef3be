"""Llama 4's chunked attention: the pattern, written out independently, and measured by `local` as every pattern is
(our banded kernel, a dense mask through SDPA); its generation cache holds at most one chunk."""
from __future__ import annotations

import pytest
import torch

import attn_core as ac
from attn_core import masks
from attn_core.nn import generation
from attn_core.spec import Shape
from tests.baselines import masked_softmax


def chunk_mask(n: int, chunk: int) -> torch.Tensor:
    """Written cell by cell: query i sees key j iff they share a chunk of `chunk` tokens and j ≤ i."""
    return torch.tensor([[i // chunk == j // chunk and j <= i for j in range(n)] for i in range(n)])


@pytest.mark.parametrize("n,chunk", [(1, 1), (17, 4), (32, 8), (33, 8), (10, 64)])
def test_the_pattern_is_the_same_chunk_and_causal(n, chunk):
    assert torch.equal(masks.dense_mask(masks.chunked(chunk), n, n), chunk_mask(n, chunk))


@pytest.mark.parametrize("bad", [0, -8, 2.5, True, "8192", None])
def test_a_chunk_that_is_not_a_whole_number_of_tokens_is_refused(bad):
    with pytest.raises(ValueError, match="chunk must be a whole number of tokens"):
        masks.chunked(bad)


@pytest.mark.parametrize("n,chunk", [(37, 8), (64, 16)])
def test_local_with_no_neighbouring_blocks_computes_chunked_attention(n, chunk):
    g = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(2, 3, n, 16, generator=g, dtype=torch.float64) for _ in range(3))
    got = ac.attention("local", q, k, v, causal=True, block=chunk, lookback=0, lookahead=0)
    torch.testing.assert_close(got, masked_softmax(q, k, v, chunk_mask(n, chunk)), atol=1e-10, rtol=1e-10)


def test_its_generation_cache_holds_at_most_one_chunk():
    chunk = 64
    for n in (10, 64, 65, 4096):
        held = generation.cache_bytes("local", Shape(1, 8, n, n, 128, dtype="bfloat16", causal=True), block=chunk,
                                      lookback=0, lookahead=0)
        assert held == 2 * 8 * min(n, chunk) * 128 * 2  # keys and values, 8 heads of 128, bf16
