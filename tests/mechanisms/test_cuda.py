"""Every mechanism on a CUDA device against the same call on the CPU, whose path the rest of the suite checks against
independent references: forward in float64 (to rounding) and float32, causal and not, padded, with shared key/value
heads; gradients; generation step by step against the causal forward pass on the device; FlexAttention compiled for
the device, forward and backward, against our kernels; the engine's measurement of every mechanism there (CUDA
events, the allocator's peak). Skipped, with the reason, where torch sees no CUDA device."""
from __future__ import annotations

import math

import pytest
import torch

import attn_core as ac
from attn_core.mechanisms import flex
from attn_core.nn import generation as gen
from attn_core.engine.measure import measure, resolve_mechanisms
from attn_core.engine.problem import MODES
from attn_core.spec import Shape

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(),
                                reason="no CUDA device: torch.cuda.is_available() is False on this machine")

CUDA = "cuda"
B, H, HK, D = 2, 4, 2, 16
LENGTHS = (67, 300)  # prime-ish and longer than every small block, window and chunk
KEYS = list(ac.MECHANISMS)


def causal_cases() -> list:
    return [pytest.param(key, causal, id=f"{key}-{'causal' if causal else 'full'}")
            for key, spec in ac.MECHANISMS.items() for causal in (False, True)
            if (causal and spec.supports.causal) or (not causal and not spec.supports.causal_only)]


def small(key: str, n: int) -> dict:
    return {p.name: p.small_value(n) for p in ac.get(key).params}


def inputs(n: int, *, hk: int = H) -> list[torch.Tensor]:
    """q (B, H, n, D), k and v (B, hk, n, D) in float64, drawn on the CPU, so both devices see the same numbers."""
    g = torch.Generator().manual_seed(0)
    return [torch.randn(B, heads, n, D, generator=g, dtype=torch.float64) for heads in (H, hk, hk)]


def state_on(key: str, shape: Shape, params: dict, device: str, dtype=torch.float64) -> dict:
    """The mechanism's seeded state drawn on the CPU and moved: the same projections and gates on both devices."""
    return {name: t.to(device) for name, t in ac.make_state(key, shape, dtype=dtype, seed=1, **params).items()}


def both(key: str, q, k, v, *, causal: bool, params: dict, padding: torch.Tensor | None = None):
    """(the CPU's output, the CUDA device's output) of one call on the same inputs and state."""
    state = ac.make_state(key, Shape.of(q, k, causal), dtype=q.dtype, seed=1, **params)
    outs = []
    for device in ("cpu", CUDA):
        extra = {} if padding is None else {"key_padding_mask": padding.to(device)}
        outs.append(ac.attention(key, q.to(device), k.to(device), v.to(device), causal=causal, **params,
                                 **{name: t.to(device) for name, t in state.items()}, **extra))
    assert outs[1].device.type == CUDA and outs[1].dtype == q.dtype and outs[1].shape == q.shape
    return outs[0], outs[1].cpu()


@pytest.mark.parametrize("key,causal", causal_cases())
@pytest.mark.parametrize("n", LENGTHS)
def test_every_mechanism_on_cuda_equals_the_cpu(key, causal, n):
    """float64 on both to rounding; float32 on the device near the CPU's float64 (a fused kernel of another layout,
    TF32 left on, a workspace sized for the device all show here)."""
    q, k, v = inputs(n)
    cpu, cuda = both(key, q, k, v, causal=causal, params=small(key, n))
    torch.testing.assert_close(cuda, cpu, atol=1e-9, rtol=1e-7)
    _, single = both(key, q.float(), k.float(), v.float(), causal=causal, params=small(key, n))
    error = ((single.double() - cpu).norm() / cpu.norm()).item()
    assert error < 1e-4, f"relative error {error:.2e} in float32 on the device"


def variants() -> list:
    """(key, "padded") for the mechanisms that take a key padding mask, (key, "shared") for those that take fewer
    key/value heads than query heads."""
    return [pytest.param(key, variant, id=f"{key}-{variant}") for key, spec in ac.MECHANISMS.items()
            for variant, takes in (("padded", spec.supports.padding), ("shared", spec.supports.shared_kv)) if takes]


@pytest.mark.parametrize("key,variant", variants())
def test_padded_keys_and_shared_heads_on_cuda_equal_the_cpu(key, variant):
    n = 300
    padding = torch.arange(n) >= torch.tensor([n, n - 120])[:, None] if variant == "padded" else None
    causal = bool(ac.get(key).supports.causal_only)
    cpu, cuda = both(key, *inputs(n, hk=HK if variant == "shared" else H), causal=causal, params=small(key, n),
                     padding=padding)
    torch.testing.assert_close(cuda, cpu, atol=1e-9, rtol=1e-7)


@pytest.mark.parametrize("key,causal", causal_cases())
def test_gradients_on_cuda_equal_the_cpu(key, causal):
    n = 67
    params = small(key, n)
    q, k, v = inputs(n)
    state = ac.make_state(key, Shape.of(q, k, causal), dtype=q.dtype, seed=1, **params)
    grads = []
    for device in ("cpu", CUDA):
        leaves = [t.to(device).requires_grad_(True) for t in (q, k, v)]
        out = ac.attention(key, *leaves, causal=causal, **params,
                           **{name: t.to(device) for name, t in state.items()})
        weights = torch.linspace(-1, 1, out.numel(), dtype=out.dtype, device=device).view_as(out)
        found = torch.autograd.grad((out * weights).sum(), leaves, materialize_grads=True)  # Reformer reads no k
        grads.append([g.cpu() for g in found])
    for cpu, cuda in zip(*grads):
        torch.testing.assert_close(cuda, cpu, atol=1e-8, rtol=1e-6)


@pytest.mark.parametrize("key", [k for k in KEYS if ac.get(k).supports.generation is not None])
def test_generation_on_cuda_equals_the_causal_forward_pass(key):
    n, n0 = 67, 5
    params = small(key, n)
    q, k, v = (t.to(CUDA) for t in inputs(n))
    state = state_on(key, Shape(B, H, n, n, D, causal=True), params, CUDA)
    expected = ac.attention(key, q, k, v, causal=True, **params, **state)
    out, cache = gen.prefill(key, q[:, :, :n0], k[:, :, :n0], v[:, :, :n0], **params, **state)
    outs = [out]
    for i in range(n0, n):
        o, cache = gen.step(key, q[:, :, i:i + 1], k[:, :, i:i + 1], v[:, :, i:i + 1], cache)
        assert o.device.type == CUDA
        outs.append(o)
    torch.testing.assert_close(torch.cat(outs, dim=2), expected, atol=1e-9, rtol=1e-7)


@pytest.mark.parametrize("key", flex.MASKED)
@pytest.mark.parametrize("causal", [False, True])
def test_compiled_flex_on_cuda_equals_our_kernel_forward_and_backward(key, causal):
    n = 300
    params = small(key, n)
    q, k, v = ([t.float().to(CUDA).requires_grad_(True) for t in inputs(n)])
    state = state_on(key, Shape(B, H, n, n, D, causal=causal), params, CUDA, torch.float32)
    ours = flex.masked_attention(q, k, v, key, causal=causal, state=state, **params)
    flexed = flex.masked_attention(q, k, v, key, implementation="flex", causal=causal, state=state, **params)
    torch.testing.assert_close(flexed, ours, atol=2e-4, rtol=2e-4)
    weights = torch.linspace(-1, 1, ours.numel(), device=CUDA).view_as(ours)
    for mine, theirs in zip(torch.autograd.grad((ours * weights).sum(), (q, k, v)),
                            torch.autograd.grad((flexed * weights).sum(), (q, k, v))):
        torch.testing.assert_close(theirs, mine, atol=1e-3, rtol=1e-3)


@pytest.mark.parametrize("key", list(resolve_mechanisms()))
@pytest.mark.parametrize("mode", MODES)
def test_the_engine_measures_every_mechanism_on_cuda(key, mode):
    spec = resolve_mechanisms()[key]
    problem = ac.Problem(mechanism=key, n=1024, heads=8, d_model=512, device=CUDA, mode=mode,
                         causal=bool(spec.supports.causal_only) or mode == "generate")
    point, _ = measure(spec, problem, ac.Settings(warmup=1, min_repeats=3, min_time_s=0.0))
    if mode == "generate" and spec.supports.generation is None:
        assert point.status == "skipped"
        return
    assert point.status == "ok", point.reason
    assert all(s > 0 and math.isfinite(s) for s in point.samples)
    if mode != "generate":
        assert point.memory_method == "cuda max_memory_allocated"
        assert point.peak_bytes > 0
