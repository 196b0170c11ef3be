"""Every mechanism under torch.autocast on the CPU: the call runs as autocast means it, on q, k and v in autocast's
dtype with autocast off inside (`_common.own_precision`), so it gives exactly the call on bfloat16 inputs, in
bfloat16, where before autocast re-cast its operations one by one and six mechanisms raised a dtype mismatch
(Longformer, BigBird, Reformer, Performer, gated DeltaNet, KDA; linear's torch form too); float64 inputs, which
autocast leaves alone, stay float64; the layer runs under autocast too."""
from __future__ import annotations

import pytest
import torch

import attn_core as ac
from attn_core import MultiHeadAttention
from tests.baselines import runs


def qkv(dtype=torch.float32):
    g = torch.Generator().manual_seed(0)
    return tuple(torch.randn(1, 2, 300, 32, generator=g, dtype=dtype) for _ in range(3))


@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("key", list(ac.MECHANISMS))
def test_under_autocast_a_call_is_the_call_on_inputs_in_its_dtype(key, causal):
    if not runs(ac.get(key), causal):
        pytest.skip(f"{key} does not run with causal={causal}")
    q, k, v = qkv()
    with torch.autocast("cpu", dtype=torch.bfloat16):
        out = ac.attention(key, q, k, v, causal=causal, seed=0) if ac.get(key).state.init else \
            ac.attention(key, q, k, v, causal=causal)
    half = [t.bfloat16() for t in (q, k, v)]
    want = ac.attention(key, *half, causal=causal, seed=0) if ac.get(key).state.init else \
        ac.attention(key, *half, causal=causal)
    assert out.dtype == torch.bfloat16 and torch.equal(out, want)


def test_autocast_leaves_float64_and_turns_itself_back_on_after_the_call():
    q, k, v = qkv(torch.float64)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        assert ac.attention("longformer", q, k, v).dtype == torch.float64
        assert torch.is_autocast_enabled("cpu")
    assert not torch.is_autocast_enabled("cpu")


@pytest.mark.parametrize("key", ["longformer", "reformer", "performer", "linear"])
def test_the_layer_runs_under_autocast(key):
    layer = MultiHeadAttention(64, 2, key)
    x = torch.randn(1, 96, 64, generator=torch.Generator().manual_seed(1))
    with torch.autocast("cpu", dtype=torch.bfloat16):
        out = layer(x)
    assert out.dtype == torch.bfloat16 and out.shape == x.shape and torch.isfinite(out.float()).all()
