"""MultiHeadAttention: projections around any mechanism, self- and cross-attention."""
from __future__ import annotations

import io
import pickle

import pytest
import torch

import attn_core as ac
from tests.baselines import allowed, masked_softmax
from tests.copies import with_copies


def layer_reference(layer: ac.MultiHeadAttention, x: torch.Tensor, ctx: torch.Tensor, mask=None) -> torch.Tensor:
    """The layer written out with einsum on its own weights and the float64 reference attention."""
    H, D = layer.heads, layer.d_model // layer.heads

    def heads(t, lin):
        return (t.double() @ lin.weight.double().T + lin.bias.double()).view(t.shape[0], t.shape[1], H, D).transpose(1, 2)

    o = masked_softmax(heads(x, layer.q_proj), heads(ctx, layer.k_proj), heads(ctx, layer.v_proj), mask)
    o = o.transpose(1, 2).reshape(x.shape[0], x.shape[1], H * D)
    return o @ layer.out_proj.weight.double().T + layer.out_proj.bias.double()


def test_softmax_layer_matches_the_written_out_reference():
    torch.manual_seed(0)
    layer = ac.MultiHeadAttention(48, 6)
    x = torch.randn(2, 19, 48)
    torch.testing.assert_close(layer(x).double(), layer_reference(layer, x, x), atol=1e-5, rtol=1e-5)


def test_cross_attention_with_a_context_of_another_length():
    torch.manual_seed(1)
    layer = ac.MultiHeadAttention(32, 4, "sdpa")
    x, ctx = torch.randn(2, 7, 32), torch.randn(2, 23, 32)
    out = layer(x, ctx)
    assert out.shape == (2, 7, 32)
    torch.testing.assert_close(out.double(), layer_reference(layer, x, ctx), atol=1e-5, rtol=1e-5)


def test_causal_sliding_window_layer_matches_reference():
    torch.manual_seed(2)
    layer = ac.MultiHeadAttention(32, 2, "sliding_window", causal=True, window=3)
    x = torch.randn(1, 25, 32)
    mask = allowed("sliding_window", 25, 25, True, window=3)
    torch.testing.assert_close(layer(x).double(), layer_reference(layer, x, x, mask), atol=1e-5, rtol=1e-5)


LAYER_PARAMS = with_copies({"linformer": {"rank": 8}, "performer": {"features": 16}, "sliding_window": {"window": 4},
                            "local": {"block": 8}, "sparse": {"stride": 5}, "reformer": {"bucket_size": 8},
                            "nystrom": {"landmarks": 8}, "additive": {"attn_dim": 16}})


@pytest.mark.parametrize("key", list(ac.MECHANISMS))
def test_every_mechanism_trains_inside_the_layer(key):
    torch.manual_seed(3)
    layer = ac.MultiHeadAttention(32, 4, key, causal=bool(ac.get(key).supports.causal_only),
                                  **LAYER_PARAMS.get(key, {}))
    out = layer(torch.randn(2, 30, 32))
    out.square().mean().backward()
    assert out.shape == (2, 30, 32)
    assert all(p.grad is not None and torch.isfinite(p.grad).all() for p in layer.parameters())


@pytest.mark.parametrize("key", list(ac.MECHANISMS))
def test_every_layer_saves_and_loads_like_any_module(key):
    """torch.save / torch.load and pickle give a layer with the same output (its random state drawn again from the
    same seed)."""
    torch.manual_seed(4)
    layer = ac.MultiHeadAttention(32, 4, key, causal=ac.MECHANISMS[key].supports.causal, seed=7,
                                  **LAYER_PARAMS.get(key, {}))
    x = torch.randn(2, 30, 32)
    expected = layer(x)
    buffer = io.BytesIO()
    torch.save(layer, buffer)
    buffer.seek(0)
    for copy in (torch.load(buffer, weights_only=False), pickle.loads(pickle.dumps(layer))):
        assert isinstance(copy, ac.MultiHeadAttention) and copy.spec is ac.MECHANISMS[key]
        torch.testing.assert_close(copy(x), expected, atol=0, rtol=0)


def test_random_state_is_seeded_and_redrawable():
    x = torch.randn(1, 40, 32)
    torch.manual_seed(4)
    a = ac.MultiHeadAttention(32, 4, "performer", features=8, seed=5)
    b = ac.MultiHeadAttention(32, 4, "performer", features=8, seed=5)
    b.load_state_dict(a.state_dict())
    torch.testing.assert_close(a(x), b(x))
    before = a(x)
    a.redraw(6)
    assert not torch.allclose(before, a(x))


@pytest.mark.parametrize("key", ["gated_deltanet", "mamba2"])
def test_gates_drawn_per_batch_row_follow_the_batch(key):
    layer = ac.MultiHeadAttention(16, 2, key, causal=True)
    assert layer(torch.randn(2, 10, 16)).shape == (2, 10, 16)
    assert layer(torch.randn(3, 10, 16)).shape == (3, 10, 16)


def test_linformer_layer_follows_the_context_length():
    layer = ac.MultiHeadAttention(16, 2, "linformer", rank=4)
    assert layer(torch.randn(1, 10, 16)).shape == (1, 10, 16)
    assert layer(torch.randn(1, 12, 16)).shape == (1, 12, 16)


@pytest.mark.parametrize("kwargs,words", [
    ({"d_model": 500, "heads": 6}, ["500", "6 heads"]),
    ({"d_model": 64, "heads": 0}, ["heads"]),
    ({"d_model": 64, "heads": 4, "mechanism": "linformer", "causal": True}, ["Linformer", "causal"]),
    ({"d_model": 64, "heads": 4, "mechanism": "performer", "features": 0}, ["features", "0"]),
    ({"d_model": 64, "heads": 4, "mechanism": "softmax", "window": 3}, ["no parameter", "window"]),
    ({"d_model": 64, "heads": 4, "mechanism": "flash3"}, ["unknown mechanism"]),
])
def test_bad_layer_settings_are_refused_with_a_sentence(kwargs, words):
    with pytest.raises(ValueError) as err:
        ac.MultiHeadAttention(**kwargs)
    assert all(w in str(err.value) for w in words), str(err.value)


def test_cross_attention_refused_for_self_attention_only_mechanisms():
    layer = ac.MultiHeadAttention(16, 2, "local", block=4)
    with pytest.raises(ValueError, match="self-attention only"):
        layer(torch.randn(1, 8, 16), torch.randn(1, 12, 16))


def test_wrong_input_width_is_refused():
    with pytest.raises(ValueError, match="16"):
        ac.MultiHeadAttention(16, 2)(torch.randn(1, 8, 12))
