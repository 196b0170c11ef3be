"""Softmax over selected keys (attn_core/mechanisms/_sparse.py): the sparse-product form and the gathered form
against a dense masked softmax written here in float64, one selection for every head or one per key/value head,
rows with unusable and with no usable keys, gradients, half inputs, a score buffer from poisoned memory."""
from __future__ import annotations

import warnings

import pytest
import torch

from attn_core.mechanisms import _sparse as sp


def case(B=2, H=4, Hk=2, r=9, m=37, kk=6, D=8, S=1, seed=0, dtype=torch.float64):
    g = torch.Generator().manual_seed(seed)
    q = torch.randn(B, H, r, D, generator=g, dtype=torch.float64).to(dtype)
    k, v = (torch.randn(B, Hk, m, D, generator=g, dtype=torch.float64).to(dtype) for _ in "kv")
    idx = torch.rand(B, S, r, m, generator=g).argsort(-1)[..., :kk]  # distinct keys, in no order
    usable = torch.rand(B, S, r, kk, generator=g) > 0.3
    usable[0, :, 1] = False  # a row that sees no key
    return (q, k, v, *sp.sort_selection(idx, usable))


def dense(q, k, v, idx, usable):
    """Masked softmax over the whole (r, m) score matrix, the allowed cells scattered from the selection."""
    B, H, r, D = q.shape
    Hk, m, S = k.shape[1], k.shape[2], idx.shape[1]
    allowed = torch.zeros(B, S, r, m, dtype=torch.bool).scatter_(-1, idx, usable)
    heads = torch.arange(H) if S == 1 else torch.arange(H) // (H // Hk)
    allowed = allowed[:, torch.zeros(H, dtype=torch.long) if S == 1 else heads]  # (B, H, r, m)
    kh, vh = k[:, torch.arange(H) // (H // Hk)].double(), v[:, torch.arange(H) // (H // Hk)].double()
    s = (q.double() @ kh.transpose(-2, -1)) / D ** 0.5
    s = s.masked_fill(~allowed, float("-inf"))
    p = torch.softmax(s, -1).nan_to_num(0.0)
    return p @ vh


@pytest.mark.parametrize("S", [1, 2])
@pytest.mark.parametrize("kk", [1, 6, 37])
def test_both_forms_equal_the_dense_masked_softmax(S, kk):
    q, k, v, idx, usable = case(S=S, kk=kk)
    want = dense(q, k, v, idx, usable)
    torch.testing.assert_close(sp.selected_softmax(q, k, v, idx, usable), want, atol=1e-12, rtol=1e-10)
    torch.testing.assert_close(sp.gathered_softmax(q, k, v, idx, usable), want, atol=1e-12, rtol=1e-10)
    assert want[0, :, 1].abs().max() == 0 and want.abs().max() > 0.1


@pytest.mark.parametrize("S", [1, 2])
def test_gradients_equal_the_dense_forms(S):
    q, k, v, idx, usable = case(S=S, r=5, m=19, kk=4)
    q, k, v = (t.requires_grad_() for t in (q, k, v))
    w = torch.randn(q.shape, dtype=torch.float64)
    got = torch.autograd.grad((sp.selected_softmax(q, k, v, idx, usable) * w).sum(), (q, k, v))
    want = torch.autograd.grad((dense(q, k, v, idx, usable) * w).sum(), (q, k, v))
    for a, b in zip(got, want):
        torch.testing.assert_close(a, b, atol=1e-12, rtol=1e-10)
    assert all(t.abs().max() > 0 for t in got)


def test_scores_written_over_poisoned_memory_are_the_products_alone():
    """The sampled product adds beta · the buffer's old value even at beta = 0: freed memory full of NaN, which the
    allocator hands back for the scores' buffer of the same size, must not reach the output."""
    q, k, v, idx, usable = case(B=1, H=4, r=64, m=300, kk=120, dtype=torch.float32)
    usable[:] = True
    want = dense(q, k, v, idx, usable).float()
    for _ in range(3):
        poison = torch.full((1, 4, 64 * 120), float("nan"))
        del poison
        out = sp.selected_softmax(q, k, v, idx, usable)
        assert torch.isfinite(out).all()
        torch.testing.assert_close(out, want, atol=1e-5, rtol=1e-5)


def test_half_inputs_run_in_float32_and_come_back_in_their_dtype():
    q, k, v, idx, usable = case(dtype=torch.bfloat16)
    out = sp.selected_softmax(q, k, v, idx, usable)
    assert out.dtype == torch.bfloat16
    torch.testing.assert_close(out.double(), dense(q, k, v, idx, usable), atol=2e-2, rtol=2e-2)



def test_the_first_csr_tensor_on_a_device_takes_torchs_warn_once_note_and_later_ones_are_left_alone(monkeypatch):
    """CUDA's once-a-process note that invariant checks are off is taken under a filter at a device's first CSR
    tensor (here the CPU, its note simulated); a warning on any later build is not hidden."""
    real = torch.sparse_csr_tensor

    def noting(*args, **kwargs):
        warnings.warn("Sparse invariant checks are implicitly disabled. Memory errors (e.g. SEGFAULT) will occur",
                      UserWarning)
        return real(*args, **kwargs)

    monkeypatch.setattr(torch, "sparse_csr_tensor", noting)
    monkeypatch.setattr(sp, "_NOTED", set())
    crow, col, values = torch.tensor([0, 1]), torch.tensor([0]), torch.ones(1)
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        first = sp._csr(crow, col, values, (1, 1))
    assert not seen and first.to_dense().item() == 1.0
    with pytest.warns(UserWarning, match="implicitly disabled"):
        sp._csr(crow, col, values, (1, 1))
