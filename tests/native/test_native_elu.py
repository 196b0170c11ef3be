"""The C++ pass of linear attention's feature map (attn_core/native/elu_plus_one.cpp) against elu + 1 written here in
float64: lengths on and off the vector width and across several tasks, every element written, in place, on 1, 2 and
3 threads; a slice of positions read and written where it lies; NaN and the infinities as the torch form gives them;
the linear attention call using it; refusals."""
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
@pytest.mark.parametrize("into", ["contiguous", "a slice", "in place"])
def test_a_slice_of_positions_is_read_and_written_where_it_lies(into):
    """Positions 10 … 49 of every head of (B, H, n, D), B·H rows of 40·D numbers n·D apart, mapped into a new
    tensor, into the same slice of another tensor, or over themselves; the positions around it untouched."""
    g = torch.Generator().manual_seed(4)
    x = torch.randn(2, 3, 100, 8, generator=g) * 4
    part = x[:, :, 10:50]
    assert ops.rows_of_numbers(part) == (6, 800, 320)
    want = elu_plus_one(part)
    around = torch.full_like(x, 7.0)
    target = {"contiguous": torch.empty(part.shape), "a slice": around[:, :, 10:50], "in place": part}[into]
    before = (around if into == "a slice" else x).clone()
    native.elu_plus_one(part, target)
    torch.testing.assert_close(target.double(), want, rtol=3e-7, atol=TINY)
    if into != "contiguous":
        base = around if into == "a slice" else x
        assert torch.equal(base[:, :, :10], before[:, :, :10]) and torch.equal(base[:, :, 50:], before[:, :, 50:])


@pytest.mark.usefixtures("vector_form")
@pytest.mark.parametrize("causal", [False, True])
def test_linear_attention_maps_its_features_in_the_kernel(causal, monkeypatch):
    """elu_attention (float32, contiguous) maps φ(K) and φ(Q) with the C++ pass (causal: the whole blocks', here all
    256 rows), and gives the float64 formula; with fewer numbers than NATIVE_MIN (the op's dispatch costs more
    than the pass saves there) torch's passes map them."""
    monkeypatch.setattr(core, "NATIVE_MIN", 1)
    monkeypatch.setattr(native, "linear_runs", lambda *a, **kw: False)  # the torch form, as on AVX2 (AVX-512: one
    # fused kernel, tests/native/test_native_linear.py)
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
    monkeypatch.setattr(core, "NATIVE_MIN", q.numel() + 1)
    calls.clear()
    torch.testing.assert_close(core.elu_attention(q, k, v, causal), out, rtol=1e-6, atol=1e-6)
    assert calls == []


@pytest.mark.usefixtures("vector_form")
@pytest.mark.parametrize("x,out,what", [
    (torch.randn(8, dtype=torch.float64), torch.empty(8, dtype=torch.float64), "float64"),
    (torch.randn(8, 2).t(), torch.empty(2, 8), "not rows of contiguous numbers"),
    (torch.randn(2, 5, 3, 4).transpose(1, 2), torch.empty(2, 3, 5, 4), "heads split from the model dimension"),
    (torch.randn(8), torch.empty(9), "sizes differ"),
    (torch.randn(8, requires_grad=True), torch.empty(8), "wants a gradient"),
], ids=lambda p: p if isinstance(p, str) else "")
def test_what_the_kernel_would_misread_is_refused_with_a_sentence(x, out, what):
    assert not native.elu_runs(x, out)
    with pytest.raises(ValueError, match="elu_plus_one needs .* float32 CPU tensors x and out of one shape"):
        native.elu_plus_one(x, out)


@pytest.mark.usefixtures("vector_form")
@pytest.mark.parametrize("n", [200, 3000], ids=["below NATIVE_MIN: torch's passes", "above: the C++ pass"])
def test_the_memory_model_follows_the_form_that_maps(n):
    """Non-causal linear attention, float32, B = 2, H = 4, D = 40: 64,000 numbers of queries map with torch's passes
    through a scratch as large as a group, 960,000 with the C++ pass and no scratch; the spec's peak is the
    allocator's either way."""
    import attn_core as ac
    from tests.baselines import trace_peak_bytes

    q, k, v = (torch.randn(2, 4, n, 40) for _ in range(3))
    assert core.phi_native(q) == (n == 3000)
    with torch.inference_mode():
        call = lambda: ac.get("linear").fn(q, k, v, causal=False)  # noqa: E731
        call()
        measured = trace_peak_bytes(call)
    assert ac.get("linear").cost.memory_bytes(ac.Shape(2, 4, n, n, 40)) == pytest.approx(measured, rel=0.01)
