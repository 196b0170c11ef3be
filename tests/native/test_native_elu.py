"""The C++ pass of linear attention's feature map (attn_core/native/elu_plus_one.cpp) against elu + 1 written here in
float64: lengths on and off the vector width and across several tasks, every element written, in place, on 1, 2 and
3 threads; NaN and the infinities as the torch form gives them; the linear attention call using it; refusals."""
from __future__ import annotations

import math

import pytest
import torch

from attn_core import native
from attn_core.mechanisms import _linear_core as core
from attn_core.native import ops
from tests.baselines import elu_plus_one
from tests.native.test_native import built  # noqa: F401  (the fixture)

TINY = torch.finfo(torch.float32).tiny  # below e^−87.3 the kernel writes 0 where float32 holds a subnormal


@pytest.fixture
def vector_form(built):  # noqa: F811
    """The kernel, or a skip where the library has no vector form (torch's five passes run there)."""
    if not native.elu_expected():
        pytest.skip(f"the C++ feature map needs AVX-512 or AVX2 with FMA ({native.describe()})")


@pytest.mark.usefixtures("vector_form")
@pytest.mark.parametrize("n", [1, 7, 8, 17, ops.ELU_PIECE - 3, 3 * ops.ELU_PIECE + 5],
                         ids=lambda n: f"n={n}")
@pytest.mark.parametrize("threads", [1, 2, 3])
def test_the_feature_map_is_elu_plus_one(n, threads, monkeypatch):
    """Random values over [−100, 30] (e^x from 1 down to below float32's normal numbers) into an output filled with
    NaN first: each element is written, to float32's rounding of elu + 1."""
    monkeypatch.setattr(torch, "get_num_threads", lambda: threads)
    g = torch.Generator().manual_seed(n)
    x = torch.rand(n, generator=g) * 130 - 100
    x[::5] = torch.randn(len(x[::5]), generator=g)  # many near 0, where the two branches meet
    out = torch.full_like(x, math.nan)
    assert native.elu_plus_one(x, out) is out
    torch.testing.assert_close(out.double(), elu_plus_one(x), rtol=3e-7, atol=TINY)


@pytest.mark.usefixtures("vector_form")
def test_non_finite_inputs_stay_visible_and_in_place_works():
    """NaN → NaN and −inf → NaN (−inf − (−inf)), +inf → +inf: the sums over keys then show the bad input. 0 → 1,
    −0 → 1, the largest float32 to itself + 1. Written over its own input (out is x) it gives the same."""
    special = torch.tensor([math.nan, -math.inf, math.inf, 0.0, -0.0, 3.4e38, -87.3, -87.4, 1e-30, -1e-30])
    x = torch.cat([special, torch.linspace(-5, 5, 37)])  # the specials in vector lanes and in the tail
    want = elu_plus_one(x)
    want[1] = math.nan
    got = native.elu_plus_one(x, torch.empty_like(x))
    torch.testing.assert_close(got.double(), want, rtol=3e-7, atol=TINY, equal_nan=True)
    assert native.elu_plus_one(x, x) is x
    torch.testing.assert_close(x, got, rtol=0, atol=0, equal_nan=True)


@pytest.mark.usefixtures("vector_form")
@pytest.mark.parametrize("causal", [False, True])
def test_linear_attention_maps_its_features_in_the_kernel(causal, monkeypatch):
    """elu_attention (float32, contiguous) maps φ(K) and φ(Q) with the C++ pass (causal: the whole blocks', here all
    256 rows; a last partial block is a strided slice, mapped by torch), and gives the float64 formula."""
    calls = []
    real = native.elu_plus_one
    monkeypatch.setattr(native, "elu_plus_one", lambda x, out: calls.append(x.numel()) or real(x, out))
    g = torch.Generator().manual_seed(1)
    q, k, v = (torch.randn(1, 2, 256, 16, generator=g) for _ in range(3))
    out = core.elu_attention(q, k, v, causal)
    assert sum(calls) >= q.numel() + k.numel()
    fq, fk = elu_plus_one(q), elu_plus_one(k)
    scores = fq @ fk.transpose(-2, -1)
    if causal:
        scores = scores.tril()
    torch.testing.assert_close(out.double(), (scores / scores.sum(-1, keepdim=True)) @ v.double(), rtol=1e-5,
                               atol=1e-6)


@pytest.mark.usefixtures("vector_form")
@pytest.mark.parametrize("x,out,what", [
    (torch.randn(8, dtype=torch.float64), torch.empty(8, dtype=torch.float64), "float64"),
    (torch.randn(8, 2).t(), torch.empty(2, 8), "not contiguous"),
    (torch.randn(8), torch.empty(9), "sizes differ"),
    (torch.randn(8, requires_grad=True), torch.empty(8), "wants a gradient"),
], ids=lambda p: p if isinstance(p, str) else "")
def test_what_the_kernel_would_misread_is_refused_with_a_sentence(x, out, what):
    assert not native.elu_runs(x, out)
    with pytest.raises(ValueError, match="elu_plus_one needs .* contiguous float32"):
        native.elu_plus_one(x, out)
