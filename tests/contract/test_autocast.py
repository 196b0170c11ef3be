"""Every mechanism under torch.autocast on the CPU: the call runs as autocast means it, on q, k and v in autocast's
dtype with autocast off inside (`_common.own_precision`), so it gives exactly the call on bfloat16 inputs, in
bfloat16, where before autocast re-cast its operations one by one and six mechanisms raised a dtype mismatch
(Longformer, BigBird, Reformer, Performer, gated DeltaNet, KDA; linear's torch form too); float64 inputs, which
autocast leaves alone, stay float64; the layer, a prompt and a generated step run under autocast too."""
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


@pytest.mark.parametrize("key", [key for key, spec in ac.MECHANISMS.items() if spec.supports.generation is not None])
def test_a_prompt_and_a_step_under_autocast_are_those_on_inputs_in_its_dtype(key):
    """prefill then one step under autocast: the cache in bfloat16, each output exactly the one of the same calls on
    bfloat16 inputs (before, Longformer, gated DeltaNet and KDA raised a dtype mismatch there)."""
    from attn_core.nn import generation

    q, k, v = qkv()
    new = [t[:, :, :1] for t in qkv()]
    seeded = {"seed": 0} if ac.get(key).state.init else {}
    with torch.autocast("cpu", dtype=torch.bfloat16):
        out, cache = generation.prefill(key, q, k, v, max_len=310, **seeded)
        token, _ = generation.step(key, *new, cache)
    want, plain = generation.prefill(key, *(t.bfloat16() for t in (q, k, v)), max_len=310, **seeded)
    next_want, _ = generation.step(key, *(t.bfloat16() for t in new), plain)
    assert out.dtype == token.dtype == torch.bfloat16
    assert torch.equal(out, want) and torch.equal(token, next_want)
