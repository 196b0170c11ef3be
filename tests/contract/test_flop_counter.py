"""Each spec's executed FLOPs against PyTorch's own counter (torch.utils.flop_counter.FlopCounterMode), for every
mechanism in the registry, where the counter can see the work: the matmuls the kernel runs, counted op by op as it
runs them. The counter has no formula for some ops the kernels use on the CPU, so it is given the textbook ones
here: CSR products (2 a stored entry and column), a weighted bag sum (embedding_bag in mode 'sum' with per-sample
weights: 2 an entry and column), an in-place batched multiply-add (baddbmm_, 2·b·m·n·k, as for baddbmm),
PyTorch's CPU flash kernel called without its causal flag (4·b·h·Nq·Nk·D: every cell of Q Kᵀ and P V) and a
triangular solve with r right-hand columns (forward substitution: one multiply-add per cell below the diagonal
and column, b·c·(c − 1)·r for a unit diagonal, and c·r divisions more without one). With the causal flag that
kernel skips key tiles by its own tiling, which no formula of the shapes alone can count: those calls are not
checked here (the spec models them from the kernel's source, tests/contract/test_mechanisms.py checks the pattern).
The CPU kernels of our own (attn_core.native: top-k's selection, the fused softmax over selected keys) run no torch
op the counter can see; they do the torch forms' products entry by entry, so the torch forms run here
(ATTN_LAB_NATIVE=0), and tests/native/test_native.py checks the two forms give the same output.
Elementwise work a spec counts as its own (`Cost.elementwise_flops`, additive attention's additions and tanh) is
not a matmul: it is left out of the comparison."""
from __future__ import annotations

import math

import pytest
import torch
from torch.utils.flop_counter import FlopCounterMode

import attn_core as ac
from attn_core import native
from attn_core.spec import Shape
from tests.baselines import runs

aten = torch.ops.aten
B, H, N, D = 2, 4, 700, 24  # no power of two: blocks and chunks end partly filled


def baddbmm_flops(self_shape, a_shape, b_shape, *args, out_shape=None, **kwargs) -> int:
    batch, m, k = a_shape
    return 2 * batch * m * k * b_shape[-1]


def _solve_triangular(a_shape, b_shape, *args, unitriangular=False, out_shape=None, **kwargs) -> int:
    *batch, c, _ = a_shape
    cells = c * (c - 1) + (0 if unitriangular else c)  # 2 FLOPs per cell below the diagonal, 1 per division
    return math.prod(batch) * cells * b_shape[-1]


def _raw(formula):
    formula._get_raw = True  # FlopCounterMode hands a raw formula the tensors themselves, not their shapes
    return formula


def _entries(a: torch.Tensor) -> int:
    """A matrix's multiply-adds a column: its stored entries if it is CSR, else all of it."""
    return a._nnz() if a.layout == torch.sparse_csr else a.shape[-2] * a.shape[-1]


@_raw
def _mm(a, b, *args, out_val=None, **kwargs) -> int:
    return 2 * _entries(a) * b.shape[-1]


@_raw
def _addmm(bias, a, b, *args, out_val=None, **kwargs) -> int:
    return 2 * _entries(a) * b.shape[-1]


@_raw
def _sampled_addmm(pattern, a, b, *args, out_val=None, **kwargs) -> int:
    """Top-k's and NSA's scores at a CSR pattern's entries only: 2·d each."""
    return 2 * pattern._nnz() * a.shape[-1]


@_raw
def _bag_sum(weight, indices, *args, out_val=None, **kwargs) -> int:
    """Top-k's and NSA's probabilities times the selected values: a multiply-add an entry and column of v."""
    return 2 * indices.numel() * weight.shape[-1]


class Seen:
    """The counter's extra formulas, and whether a call into the CPU flash kernel asked for its causal tiling."""

    def __init__(self):
        self.causal_flash = False

    def flash(self, q_shape, k_shape, v_shape, dropout_p=0.0, is_causal=False, *args, out_shape=None, **kwargs):
        self.causal_flash |= bool(is_causal)
        b, h, nq, d = q_shape
        return 4 * b * h * nq * k_shape[-2] * d

    def mapping(self) -> dict:
        return {aten.baddbmm_: baddbmm_flops, aten._scaled_dot_product_flash_attention_for_cpu: self.flash,
                aten.linalg_solve_triangular: _solve_triangular, aten.mm: _mm, aten.addmm: _addmm, aten.addmm_: _addmm,
                aten.sparse_sampled_addmm: _sampled_addmm, aten._embedding_bag_forward_only: _bag_sum,
                aten._embedding_bag: _bag_sum}


@pytest.mark.parametrize("kv_heads", [H, 2])
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("key", list(ac.MECHANISMS))
def test_executed_flops_are_what_the_counter_sees(key, causal, kv_heads, monkeypatch):
    monkeypatch.setenv(native.SWITCH, "0")
    spec = ac.get(key)
    if not runs(spec, causal):
        pytest.skip(f"{spec.label} does not run with causal={causal}")
    if kv_heads != H and not spec.supports.shared_kv:
        pytest.skip(f"{spec.label} takes no shared key/value heads")
    g = torch.Generator().manual_seed(0)
    q = torch.randn(B, H, N, D, generator=g)
    k, v = (torch.randn(B, kv_heads, N, D, generator=g) for _ in "kv")
    shape = Shape.of(q, k, causal)
    state = ac.make_state(key, shape)
    seen = Seen()
    # no_grad, not inference_mode: under inference mode the counter misses the matmuls inside an autograd Function
    with torch.no_grad(), FlopCounterMode(display=False, custom_mapping=seen.mapping()) as counter:
        spec.fn(q, k, v, causal=causal, **state)
    if seen.causal_flash:
        pytest.skip("the CPU flash kernel's causal tiles are not what the counter's formula counts")
    elementwise = spec.cost.elementwise_flops(shape) if spec.cost.elementwise_flops else 0.0
    counted = counter.get_total_flops()
    assert counted > 0 and math.isfinite(spec.cost.executed(shape))
    assert spec.cost.executed(shape) - elementwise == pytest.approx(counted, rel=0.005)
