"""The C++ selected softmax with attention sinks (selected_softmax.cpp's `sinks`): each head's logit joins every
row's denominator with no value, against a float64 softmax over the selected scores with that extra column written
here; a row with nothing usable stays zero, a sink of −inf changes nothing, a huge one drives the row to zero."""
import math

import pytest
import torch

from attn_core import native

pytestmark = pytest.mark.skipif(native.library() is None, reason="the C++ kernels could not be built here")


def _reference(q, k, v, idx, usable, sinks):
    """out[b, h, t] = Σ_j e^(s_j) v_j / (Σ_j e^(s_j) + e^(a_h)) over t's usable selected keys, s_j = q·k/√D."""
    B, H, r, D = q.shape
    Hk, S = k.shape[1], idx.shape[1]
    out = torch.zeros(B, H, r, D, dtype=torch.float64)
    for b in range(B):
        for h in range(H):
            kv, s = h // (H // Hk), (0 if S == 1 else h // (H // Hk))
            for t in range(r):
                keys = [int(j) for j, ok in zip(idx[b, s, t], usable[b, s, t]) if ok]
                if not keys:
                    continue
                scores = [float(q[b, h, t].double() @ k[b, kv, j].double()) / math.sqrt(D) for j in keys]
                top = max(scores + [float(sinks[h])])
                weights = [math.exp(x - top) for x in scores]
                total = sum(weights) + math.exp(float(sinks[h]) - top)
                out[b, h, t] = sum(w * v[b, kv, j].double() for w, j in zip(weights, keys)) / total
    return out


@pytest.mark.parametrize("dtype,D", [(torch.float32, 64), (torch.float32, 24), (torch.float64, 16)])
def test_sinks_join_each_rows_denominator(dtype, D):
    g = torch.Generator().manual_seed(3)
    B, H, Hk, r, m, kk = 2, 4, 2, 5, 40, 7
    q = torch.randn(B, H, r, D, generator=g, dtype=dtype)
    k, v = (torch.randn(B, Hk, m, D, generator=g, dtype=dtype) for _ in range(2))
    idx = torch.stack([torch.randperm(m, generator=g)[:kk].sort().values for _ in range(B * Hk * r)]).view(B, Hk, r, kk)
    usable = torch.rand(B, Hk, r, kk, generator=g) > 0.3
    usable[0, 0, 0] = False  # a row with nothing usable: zeros, sink or not
    sinks = torch.tensor([0.5, -1.0, 3.0, float("-inf")], dtype=dtype)  # the last head: no sink at all
    got = native.selected_softmax(q, k, v, idx, usable, sinks)
    want = _reference(q, k, v, idx, usable, sinks)
    tol = 1e-5 if dtype == torch.float32 else 1e-12
    torch.testing.assert_close(got.double(), want, atol=tol, rtol=tol)
    assert got[0, 0, 0].abs().max() == 0 and got[0, 1, 0].abs().max() == 0
    plain = native.selected_softmax(q, k, v, idx, usable)
    torch.testing.assert_close(got[:, 3], plain[:, 3], atol=0, rtol=0)  # a sink of −inf adds e^(−inf) = 0


def test_a_huge_sink_takes_all_the_weight():
    g = torch.Generator().manual_seed(4)
    q, k, v = (torch.randn(1, 1, 3, 32, generator=g) for _ in range(3))
    idx = torch.tensor([[[[0, 1, 2]] * 3]])
    out = native.selected_softmax(q, k, v, idx, torch.ones_like(idx, dtype=torch.bool), torch.tensor([1e4]))
    assert torch.isfinite(out).all() and out.abs().max() < 1e-30


def test_sinks_of_the_wrong_shape_are_refused_with_a_sentence():
    q, k, v = (torch.randn(1, 2, 3, 16) for _ in range(3))
    idx = torch.zeros(1, 1, 3, 2, dtype=torch.long)
    with pytest.raises(ValueError, match="selected_softmax needs"):
        native.selected_softmax(q, k, v, idx, torch.ones_like(idx, dtype=torch.bool), torch.zeros(3))
