"""Generation.flops of a key-value cache under grouped-query attention: one decoded token's q·k and p·v run once per
query head, whatever the number of key/value heads, counted here by hand and against PyTorch's own counter
(torch.utils.flop_counter) on the step the kernel runs."""
from __future__ import annotations

import pytest
import torch
from torch.utils.flop_counter import FlopCounterMode

import attn_core as ac
from attn_core.spec import Shape


def by_hand(B: int, H: int, tokens: int, D: int) -> int:
    """A new token against `tokens` cached ones: each of the B·H query heads takes a dot product of D with each
    cached key (D multiply-adds, 2·D FLOPs) and adds each cached value weighted by its probability (2·D more):
    4·B·H·tokens·D, the key/value heads not in it."""
    return 4 * B * H * tokens * D


@pytest.mark.parametrize("Hk", [8, 4, 2, 1])  # multi-head, grouped-query (2 and 4 query heads a key/value head), MQA
@pytest.mark.parametrize("key", ["softmax", "sdpa", "sliding_window"])
def test_a_step_counts_every_query_head_whatever_the_key_value_heads(key, Hk):
    spec = ac.MECHANISMS[key]
    B, H, L, D = 2, 8, 300, 16
    seen = 257 if key == "sliding_window" else L  # its default window, |i − j| ≤ 256, sees 257 of the 300
    assert spec.supports.generation.flops(Shape(B, H, 1, L, D, Hk=Hk, causal=True), **spec.defaults) == \
        by_hand(B, H, seen, D)
    if key == "sliding_window":
        assert spec.supports.generation.flops(Shape(B, H, 1, 300, D, Hk=Hk, causal=True), window=16) == \
            by_hand(B, H, 17, D)  # |i − j| ≤ 16: 17 cached tokens seen


@pytest.mark.parametrize("key", ["softmax", "sliding_window"])
def test_the_count_is_what_the_step_executes(key):
    spec, gen = ac.MECHANISMS[key], ac.MECHANISMS[key].supports.generation
    B, H, Hk, L, D = 2, 8, 2, 40, 16
    g = torch.Generator().manual_seed(0)
    k, v = (torch.randn(B, Hk, L, D, generator=g, dtype=torch.float64) for _ in range(2))
    cache = gen.remember(k, v, **spec.defaults)
    q = torch.randn(B, H, 1, D, generator=g, dtype=torch.float64)
    k1, v1 = (torch.randn(B, Hk, 1, D, generator=g, dtype=torch.float64) for _ in range(2))
    with FlopCounterMode(display=False) as counter:
        gen.step(q, k1, v1, cache)
    # the step reads the L prompt tokens and its own: 4 · 2 · 8 · 41 · 16 = 41,984
    assert counter.get_total_flops() == by_hand(B, H, L + 1, D) == 41984
    assert gen.flops(Shape(B, H, 1, L + 1, D, Hk=Hk, causal=True), **spec.defaults) == 41984
