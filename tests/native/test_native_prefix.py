"""The C++ exclusive prefix sums (attn_core/native/prefix.cpp) against the sums of the steps before each one, added
here one by one in float64: dimensions first, middle and last, lengths across several tasks, one step, threads;
float32 summed in double; causal linear attention using it; refusals."""
from __future__ import annotations

import pytest
import torch

from attn_core import native
from attn_core.mechanisms import _linear_core as core
from attn_core.native import ops
from tests.native.test_native import built, needs_library  # noqa: F401  (built: the fixture)


def spelled_out(x: torch.Tensor, dim: int) -> torch.Tensor:
    """out.select(dim, s) = x.select(dim, 0) + … + x.select(dim, s − 1), in float64; 0 at s = 0."""
    x = x.double().movedim(dim, 0)
    out = torch.zeros_like(x)
    for s in range(1, x.shape[0]):
        out[s] = out[s - 1] + x[s - 1]
    return out.movedim(0, dim)


@needs_library
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64], ids=["float32", "float64"])
@pytest.mark.parametrize("shape,dim", [((9,), 0), ((3, 1, 5), 1), ((2, 7, 3 * ops.PREFIX_SPAN + 1), 1),
                                       ((4, 130, 65), 1), ((6, 5, 4), 0), ((2, 3, 40), -1), ((2, 3, 4, 5), 2)])
@pytest.mark.parametrize("threads", [1, 2, 3])
def test_prefix_sums_are_the_steps_before(shape, dim, dtype, threads, monkeypatch):
    monkeypatch.setattr(torch, "get_num_threads", lambda: threads)
    g = torch.Generator().manual_seed(len(shape) * 100 + shape[-1])
    x = torch.randn(shape, generator=g, dtype=dtype)
    out = native.prefix_sums(x, dim)
    assert out.shape == x.shape and out.dtype == dtype and out.is_contiguous()
    torch.testing.assert_close(out.double(), spelled_out(x, dim), rtol=1e-6 if dtype == torch.float32 else 1e-12,
                               atol=1e-5 if dtype == torch.float32 else 1e-12)


@needs_library
def test_float32_is_summed_in_double():
    """10⁸ then 1 a step, 200 steps: in float32 arithmetic every 1 is lost against 10⁸ (its spacing there is 8);
    summed in double and rounded once a step, the last sum is 10⁸ + 198, to float32's rounding."""
    x = torch.ones(1, 200, 3)
    x[:, 0] = 1e8
    out = native.prefix_sums(x, 1)
    assert out[0, -1, 0].item() == torch.tensor(1e8 + 198, dtype=torch.float64).float().item() != 1e8


@needs_library
def test_causal_linear_attention_sums_its_block_states_in_the_kernel(monkeypatch):
    """With NATIVE_MIN at 1 here (by default below 256 Ki numbers torch's cumsum runs: the op's dispatch costs more);
    at the default these 2 heads' 4 states of 16·17 numbers take torch's, to the same sums."""
    monkeypatch.setattr(core, "NATIVE_MIN", 1)
    torch_form = lambda *a, **kw: False  # noqa: E731  (as on AVX2; AVX-512 runs one fused kernel: test_native_linear)
    monkeypatch.setattr(native, "linear_runs", torch_form)
    calls = []
    real = native.prefix_sums
    monkeypatch.setattr(native, "prefix_sums", lambda x, dim: calls.append(tuple(x.shape)) or real(x, dim))
    g = torch.Generator().manual_seed(3)
    q, k, v = (torch.randn(1, 2, 300, 16, generator=g) for _ in range(3))
    out = core.elu_attention(q, k, v, True)
    c = core.causal_block(16, 16)
    assert calls == [(2, 300 // c, 16, 17)]
    fq, fk = (torch.nn.functional.elu(x.double()) + 1 for x in (q, k))
    scores = (fq @ fk.transpose(-2, -1)).tril()
    torch.testing.assert_close(out.double(), (scores / scores.sum(-1, keepdim=True)) @ v.double(), rtol=1e-5,
                               atol=1e-6)
    monkeypatch.undo()
    monkeypatch.setattr(native, "linear_runs", torch_form)
    monkeypatch.setattr(native, "prefix_sums", lambda x, dim: calls.append(tuple(x.shape)) or real(x, dim))
    calls.clear()
    torch.testing.assert_close(core.elu_attention(q, k, v, True), out, rtol=1e-6, atol=1e-6)
    assert calls == []


@needs_library
@pytest.mark.parametrize("x,dim,what", [
    (torch.randn(4, 3).t(), 0, "not contiguous"),
    (torch.randn(4, 3, dtype=torch.float16), 0, "float16"),
    (torch.randn(4, 3, requires_grad=True), 0, "wants a gradient"),
    (torch.randn(4, 3), 2, "no such dimension"),
], ids=lambda p: p if isinstance(p, str) else "")
def test_what_the_kernel_would_misread_is_refused_with_a_sentence(x, dim, what):
    with pytest.raises(ValueError, match="prefix_sums needs a library, a contiguous float32 or float64 CPU tensor"):
        native.prefix_sums(x, dim)
