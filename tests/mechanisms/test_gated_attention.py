"""Options of the softmax family against a plain materialized reference: an output gate, out ⊙ σ(g) (Qiu et al.
2025, arXiv 2505.06708; Qwen3-Next's full-attention layers), and QK-norm, q and k RMS-normalised per head before the
scores (Llama 4, Qwen3, Gemma 3)."""
from __future__ import annotations

import pytest
import torch

import attn_core as ac
from attn_core.mechanisms._common import output_gate_logits
from attn_core.spec import Shape
from tests.baselines import allowed, masked_softmax

FAMILY = [key for key, spec in ac.MECHANISMS.items() if spec.supports.output_gate or spec.supports.qk_norm]


def inputs(n: int = 23, *, H: int = 4, Hk: int = 4, D: int = 16, seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    q = torch.randn(2, H, n, D, generator=g) * 3  # large enough that the norm changes the scores
    k, v = (torch.randn(2, Hk, n, D, generator=g) * 3 for _ in range(2))
    return q, k, v


def rms(x: torch.Tensor, w: torch.Tensor | None = None) -> torch.Tensor:
    """x / sqrt(mean(x^2) + 1e-6), written out in float64."""
    x = x.double()
    out = x / torch.sqrt((x * x).sum(-1, keepdim=True) / x.shape[-1] + 1e-6)
    return out if w is None else out * w.double()


def reference(q, k, v, causal, gate=None, weight=None, norm=False):
    r = q.shape[1] // k.shape[1]
    k, v = (t.repeat_interleave(r, dim=1) for t in (k, v))
    if norm:
        q, k = rms(q, weight), rms(k, weight)
    out = masked_softmax(q, k, v, allowed("full", q.shape[2], k.shape[2], causal))
    return out if gate is None else out / (1 + torch.exp(-gate.double()))


def test_the_softmax_family_takes_both_options():
    assert {"softmax", "sdpa"} <= set(FAMILY)
    assert all(ac.get(key).supports.output_gate and ac.get(key).supports.qk_norm for key in FAMILY)


@pytest.mark.parametrize("key", FAMILY)
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("Hk", [4, 2])
def test_output_gate_equals_the_gated_reference(key, causal, Hk):
    q, k, v = inputs(Hk=Hk)
    gate = output_gate_logits(Shape.of(q, k), seed=3)
    out = ac.attention(key, q, k, v, causal=causal, output_gate=gate)
    torch.testing.assert_close(out.double(), reference(q, k, v, causal, gate), atol=1e-5, rtol=1e-4)


@pytest.mark.parametrize("key", FAMILY)
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("weighted", [False, True])
def test_qk_norm_equals_the_normalised_reference(key, causal, weighted):
    q, k, v = inputs(Hk=2)
    weight = torch.rand(16, generator=torch.Generator().manual_seed(5)) + 0.5 if weighted else None
    out = ac.attention(key, q, k, v, causal=causal, qk_norm=True if weight is None else weight)
    torch.testing.assert_close(out.double(), reference(q, k, v, causal, weight=weight, norm=True), atol=1e-5,
                               rtol=1e-4)


@pytest.mark.parametrize("key", FAMILY)
def test_gate_and_weighted_qk_norm_together_with_gradients(key):
    q, k, v = (t.requires_grad_() for t in inputs(Hk=2))
    gate = output_gate_logits(Shape.of(q, k), seed=1).requires_grad_()
    weight = torch.ones(16, requires_grad=True)
    out = ac.attention(key, q, k, v, causal=True, output_gate=gate, qk_norm=weight)
    expected = reference(q, k, v, True, gate, weight, norm=True)
    got = torch.autograd.grad(out.sum(), (q, k, v, gate, weight))
    want = torch.autograd.grad(expected.sum(), (q, k, v, gate, weight))
    for a, b in zip(got, want):
        torch.testing.assert_close(a.double(), b.double(), atol=1e-5, rtol=1e-5)


def test_the_gate_logits_are_seeded():
    s = Shape(1, 2, 5, 5, 4)
    assert torch.equal(output_gate_logits(s, seed=7), output_gate_logits(s, seed=7))
    assert not torch.equal(output_gate_logits(s, seed=7), output_gate_logits(s, seed=8))


@pytest.mark.parametrize("kwargs,words", [
    ({"output_gate": torch.zeros(2, 4, 23, 8)}, "output_gate must be gate logits of q's shape"),
    ({"output_gate": torch.zeros(2, 4, 23, 16, dtype=torch.float64)}, "convert it with output_gate.to"),
    ({"qk_norm": torch.ones(8)}, r"shape \(head_dim,\) = \(16,\)"),
    ({"qk_norm": "yes"}, "qk_norm must be True, False"),
])
def test_bad_options_are_refused_with_a_sentence(kwargs, words):
    q, k, v = inputs()
    with pytest.raises(ValueError, match=words):
        ac.attention("softmax", q, k, v, **kwargs)


def test_a_mechanism_outside_the_family_refuses_them():
    q, k, v = inputs()
    with pytest.raises(ValueError, match="cannot take an output gate"):
        ac.attention("linear", q, k, v, output_gate=torch.zeros(q.shape))
    with pytest.raises(ValueError, match="cannot take QK-norm"):
        ac.attention("linear", q, k, v, qk_norm=True)


def test_their_cost_is_in_the_spec():
    s = Shape(1, 8, 4096, 4096, 64, Hk=2)
    cost = ac.get("sdpa").cost
    assert cost.gate_flops(s) == 5 * 8 * 4096 * 64
    assert cost.qk_norm_flops(s) == (8 + 2) * 4096 * (3 * 64 + 2)
    assert cost.qk_norm_flops(s, weighted=True) > cost.qk_norm_flops(s)
    base = cost.memory_bytes(s)
    assert cost.options_memory(s, qk_norm=True) == base + (8 + 2) * 4096 * 64 * 4
    assert cost.options_memory(s, output_gate=True) >= 3 * s.output_bytes


@pytest.mark.parametrize("key", FAMILY)
def test_options_memory_matches_the_allocator(key):
    from tests.baselines import trace_peak_bytes
    shape = Shape(2, 3, 3000, 3000, 40)
    g = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(2, 3, 3000, 40, generator=g) for _ in range(3))
    gate = output_gate_logits(shape, seed=0)
    fn = ac.get(key).fn
    with torch.inference_mode():
        for opts in ({"output_gate": gate}, {"qk_norm": True}):
            call = lambda: fn(q, k, v, **opts)  # noqa: E731
            call()
            measured = trace_peak_bytes(call)
            predicted = ac.get(key).cost.options_memory(shape, output_gate="output_gate" in opts,
                                                        qk_norm="qk_norm" in opts)
            assert predicted == pytest.approx(measured, rel=0.02), opts
