"""Attention sinks (gpt-oss, arXiv 2508.10925) on the sparse mechanisms: Longformer, BigBird, top-k and NSA against
softmax with one more, zero-valued column a row whose score is the head's sink logit, written here in float64 apart
from the library: forward (the fused paths), backward (the chunked and torch paths), padding, shared key/value heads
and generation. Patterns and selections come from tests/baselines.py (cell by cell, brute force)."""
from __future__ import annotations

import numpy as np
import pytest
import torch

import attn_core as ac
from attn_core import native
from attn_core.mechanisms import bigbird, nsa, topk
from attn_core.nn import generation as gen
from attn_core.spec import Shape
from tests.baselines import allowed, topk_cells, trace_peak_bytes
from tests.native.test_native import with_kernels  # noqa: F401  (the fixture: a forward call never builds)

pytestmark = pytest.mark.usefixtures("with_kernels")  # top-k's and NSA's C++ softmax where it builds

LONGFORMER = {"window": 5, "global_tokens": 2}
BIGBIRD = {"block": 4, "window_blocks": 3, "global_blocks": 1, "random_blocks": 2}
NSA = {"block": 4, "stride": 2, "select_block": 4, "select_blocks": 2, "window": 4}


def with_sink(q, k, v, sinks, keep) -> torch.Tensor:
    """Σ_j e^(s_j) v_j / (Σ_j e^(s_j) + e^(a_h)) in float64: the row's scores s_j = q·k_j/√D over the keys `keep`
    allows ((B or 1, H or 1, nq, nk) boolean), then the sink logit a_h as one more column whose value is zero.
    k, v of Hk heads repeated for their H/Hk query heads. Keeps the graph (gradients to q, k, v and the sinks)."""
    B, H, nq, D = q.shape
    k64, v64 = (t.double().repeat_interleave(H // k.shape[1], dim=1) for t in (k, v))
    s = torch.einsum("bhid,bhjd->bhij", q.double(), k64) / D ** 0.5
    s = s.masked_fill(~torch.as_tensor(keep).expand(s.shape), float("-inf"))
    col = sinks.double().view(1, H, 1, 1).expand(B, H, nq, 1)
    every = torch.cat([s, col], -1)
    e = torch.exp(every - every.amax(-1, keepdim=True))
    w = e / e.sum(-1, keepdim=True)
    zero = torch.zeros(B, H, 1, D, dtype=torch.float64)
    return torch.einsum("bhij,bhjd->bhid", w, torch.cat([v64, zero], -2))


def inputs(n: int, *, H: int = 4, Hk: int = 4, seed: int = 0, grad: bool = False):
    g = torch.Generator().manual_seed(seed)
    q = torch.randn(2, H, n, 16, generator=g)
    k, v = (torch.randn(2, Hk, n, 16, generator=g) for _ in range(2))
    sinks = torch.randn(H, generator=g) * 2  # either sign, some above the rows' own log-sum-exp
    return [t.requires_grad_(grad) for t in (q, k, v, sinks)]


def padded(n: int) -> torch.Tensor:
    pad = torch.zeros(2, n, dtype=torch.bool)
    pad[0, :6] = True  # causal: element 0's first six queries see no key
    pad[1, n - 7:] = True
    return pad


def banded_case(key: str, q, k, causal: bool, seed: int = 1):
    """(params and state, the (n, n) pattern from baselines.allowed) of Longformer or BigBird."""
    n = q.shape[2]
    if key == "longformer":
        return dict(LONGFORMER), allowed("longformer", n, n, causal, **LONGFORMER)
    table = bigbird.init_state(Shape.of(q, k, causal), seed=seed, **BIGBIRD)["random_table"]
    return {**BIGBIRD, "random_table": table}, allowed("bigbird", n, n, causal, random_table=table, **BIGBIRD)


def test_the_sparse_mechanisms_take_sinks():
    for key in ("longformer", "bigbird", "topk", "nsa"):
        assert ac.get(key).supports.sinks, key


@pytest.mark.parametrize("key", ["longformer", "bigbird"])
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("Hk", [4, 2, 1])
@pytest.mark.parametrize("n", [37, 64])
def test_banded_forward_equals_the_zero_column_reference(key, causal, Hk, n):
    q, k, v, sinks = inputs(n, Hk=Hk)
    params, mask = banded_case(key, q, k, causal)
    with torch.no_grad():  # the fused paths: each row's log-sum-exp from the CPU's flash kernel
        out = ac.attention(key, q, k, v, causal=causal, sinks=sinks, **params)
    torch.testing.assert_close(out.double(), with_sink(q, k, v, sinks, mask), atol=2e-6, rtol=1e-5)


@pytest.mark.parametrize("causal", [False, True])
def test_longformer_with_given_global_positions(causal):
    q, k, v, sinks = inputs(50, Hk=2)
    at = torch.tensor([30, 2, 31])
    params = {"window": 3, "global_tokens": 3}
    with torch.no_grad():
        out = ac.attention("longformer", q, k, v, causal=causal, sinks=sinks, global_positions=at, **params)
    mask = allowed("longformer", 50, 50, causal, global_positions=at, **params)
    torch.testing.assert_close(out.double(), with_sink(q, k, v, sinks, mask), atol=2e-6, rtol=1e-5)


@pytest.mark.parametrize("key", ["longformer", "bigbird"])
@pytest.mark.parametrize("causal", [False, True])
def test_banded_gradients_with_padding_equal_the_reference(key, causal):
    n = 37
    q, k, v, sinks = inputs(n, Hk=2, grad=True)
    params, mask = banded_case(key, q, k, causal)
    pad = padded(n)
    out = ac.attention(key, q, k, v, causal=causal, sinks=sinks, key_padding_mask=pad, **params)
    expected = with_sink(q, k, v, sinks, mask & ~pad[:, None, None, :].numpy())
    torch.testing.assert_close(out.double(), expected, atol=2e-6, rtol=1e-5)
    g = torch.randn(out.shape, generator=torch.Generator().manual_seed(9))
    got = torch.autograd.grad((out * g).sum(), (q, k, v, sinks))
    want = torch.autograd.grad((expected * g.double()).sum(), (q, k, v, sinks))
    for a, b in zip(got, want):
        torch.testing.assert_close(a.double(), b.double(), atol=1e-5, rtol=1e-5)
    if causal:  # rows that see only the sink: weight 1 on a zero value
        assert not out[0, :, :6].any()


@pytest.mark.parametrize("key", ["longformer", "bigbird"])
def test_banded_padding_without_gradients(key):
    n = 40
    q, k, v, sinks = inputs(n, Hk=1)
    params, mask = banded_case(key, q, k, True)
    pad = padded(n)
    with torch.no_grad():
        out = ac.attention(key, q, k, v, causal=True, sinks=sinks, key_padding_mask=pad, **params)
    expected = with_sink(q, k, v, sinks, mask & ~pad[:, None, None, :].numpy())
    torch.testing.assert_close(out.double(), expected, atol=2e-6, rtol=1e-5)


# ---- top-k: the selection is baselines.topk_cells', the softmax over it gains the sink ----

def topk_keep(q, k, causal: bool, state: dict, top_k: int) -> np.ndarray:
    """(B, 1, n, m): each batch element's kept keys, brute force (one selection for every head)."""
    return np.stack([topk_cells(q[b:b + 1], k[b:b + 1], causal, top_k, state["index_q"], state["index_k"],
                                state["index_w"]) for b in range(q.shape[0])])[:, None]


@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("Hk", [4, 1])
@pytest.mark.parametrize("top_k", [5, 64])
@pytest.mark.parametrize("grad", [False, True])
def test_topk_equals_the_zero_column_reference_over_its_selection(causal, Hk, top_k, grad):
    """Without gradients the C++ softmax runs and the sink is applied to its output afterwards (the log-sum-exp
    correction); with them, the torch form holds the scores. top_k = 64 ≥ n: softmax with the sink column."""
    n = 29
    q, k, v, sinks = inputs(n, Hk=Hk, grad=grad)
    state = topk.init_state(Shape.of(q, k, causal), seed=2, top_k=top_k, index_heads=2, index_dim=8)
    params = {"top_k": top_k, "index_heads": 2, "index_dim": 8, **state}
    with torch.set_grad_enabled(grad):
        out = ac.attention("topk", q, k, v, causal=causal, sinks=sinks, **params)
    expected = with_sink(q, k, v, sinks, topk_keep(q.detach(), k.detach(), causal, state, top_k))
    torch.testing.assert_close(out.double(), expected, atol=2e-6, rtol=1e-5)
    if grad:
        got = torch.autograd.grad(out.sum(), (q, v, sinks))
        want = torch.autograd.grad(expected.sum(), (q, v, sinks))
        for a, b in zip(got, want):
            torch.testing.assert_close(a.double(), b.double(), atol=1e-5, rtol=1e-5)


def test_topk_padding_with_sinks():
    n = 30
    q, k, v, sinks = inputs(n, Hk=2)
    pad = padded(n)
    with torch.no_grad():
        out = ac.attention("topk", q, k, v, causal=True, sinks=sinks, key_padding_mask=pad, top_k=64)
    mask = allowed("full", n, n, True) & ~pad[:, None, None, :].numpy()
    torch.testing.assert_close(out.double(), with_sink(q, k, v, sinks, mask), atol=2e-6, rtol=1e-5)
    assert not out[0, :, :6].any()


# ---- NSA: the sink in each branch's softmax ----

def nsa_with_sinks(q, k, v, sinks, gates, *, block, stride, select_block, select_blocks, window) -> torch.Tensor:
    """NSA query by query in float64 (arXiv 2502.11089), each branch a softmax with the head's sink as one more
    zero-valued column: compression over the means of `block` tokens every `stride` ending by t, selection over the
    tokens ≤ t of the first, own and best-ranked blocks (ranked by the group's compressed probabilities without the
    sink, spread over the tokens they pool; ties to the earlier block), the window t − window < j ≤ t; gated sum."""
    B, H, n, D = q.shape
    Hk = k.shape[1]
    q, k, v = (t.double() for t in (q, k, v))
    out = torch.zeros(B, H, n, D, dtype=torch.float64)
    starts = list(range(0, n - block + 1, stride))

    def attend(qt, keys, values, a):  # the sink: one more logit, with nothing in the numerator
        s = keys @ qt / D ** 0.5
        top = torch.maximum(s.max(), a) if len(s) else a
        e = torch.exp(s - top)
        return (e @ values) / (e.sum() + torch.exp(a - top))

    for b in range(B):
        for kh in range(Hk):
            heads = [h for h in range(H) if h * Hk // H == kh]
            kc = torch.stack([k[b, kh, a:a + block].mean(0) for a in starts]) if starts else k.new_zeros(0, D)
            vc = torch.stack([v[b, kh, a:a + block].mean(0) for a in starts]) if starts else v.new_zeros(0, D)
            for t in range(n):
                seen = [i for i, a in enumerate(starts) if a + block - 1 <= t]
                density = torch.zeros(n, dtype=torch.float64)
                for h in heads:
                    if seen:
                        p = torch.softmax(kc[seen].detach() @ q[b, h, t].detach() / D ** 0.5, 0)
                        for j, i in enumerate(seen):
                            density[starts[i]:starts[i] + block] += p[j] / block
                past = list(range(t // select_block + 1))
                score = {j: float(density[j * select_block:(j + 1) * select_block].sum()) for j in past}
                forced = [0] + ([t // select_block] if t // select_block else [])
                rest = sorted((j for j in past if j not in forced), key=lambda j: (-score[j], j))
                chosen = (forced + rest)[:select_blocks]
                tokens = sorted(i for j in chosen for i in range(j * select_block, (j + 1) * select_block) if i <= t)
                win = list(range(max(0, t - window + 1), t + 1))
                for h in heads:
                    a = sinks[h].double()
                    cmp = attend(q[b, h, t], kc[seen], vc[seen], a)
                    slc = attend(q[b, h, t], k[b, kh, tokens], v[b, kh, tokens], a)
                    sw = attend(q[b, h, t], k[b, kh, win], v[b, kh, win], a)
                    out[b, h, t] = (gates["g_cmp"][b, h, t] * cmp + gates["g_slc"][b, h, t] * slc
                                    + gates["g_win"][b, h, t] * sw)
    return out


@pytest.mark.parametrize("Hk", [4, 2])
@pytest.mark.parametrize("grad", [False, True])
def test_nsa_each_branch_takes_the_sink(Hk, grad):
    n = 23
    q, k, v, sinks = inputs(n, Hk=Hk, grad=grad)
    gates = nsa.draw_gates(2, 4, n, seed=5)
    with torch.set_grad_enabled(grad):
        out = ac.attention("nsa", q, k, v, causal=True, sinks=sinks, **NSA, **gates)
    expected = nsa_with_sinks(q, k, v, sinks, gates, **NSA)
    torch.testing.assert_close(out.double(), expected, atol=2e-6, rtol=1e-5)
    if grad:
        got = torch.autograd.grad(out.sum(), (q, k, v, sinks))
        want = torch.autograd.grad(expected.sum(), (q, k, v, sinks))
        for a, b in zip(got, want):
            torch.testing.assert_close(a.double(), b.double(), atol=1e-5, rtol=1e-5)


# ---- generation: prefill, then one token at a time ----

def generated(key: str, q, k, v, n0: int, **params) -> torch.Tensor:
    out, cache = gen.prefill(key, q[:, :, :n0], k[:, :, :n0], v[:, :, :n0], **params)
    steps = [gen.step(key, q[:, :, t:t + 1], k[:, :, t:t + 1], v[:, :, t:t + 1], cache)[0]
             for t in range(n0, q.shape[2])]
    return torch.cat([out, *steps], dim=2)


@pytest.mark.parametrize("n0", [1, 9])
def test_longformer_generation_with_sinks(n0):
    n = 26
    q, k, v, sinks = inputs(n, Hk=2, seed=3)
    got = generated("longformer", q, k, v, n0, sinks=sinks, **LONGFORMER)
    mask = allowed("longformer", n, n, True, **LONGFORMER)
    torch.testing.assert_close(got.double(), with_sink(q, k, v, sinks, mask), atol=2e-6, rtol=1e-5)


@pytest.mark.parametrize("top_k", [4, 64])
def test_topk_generation_with_sinks(top_k):
    n, n0 = 24, 7
    q, k, v, sinks = inputs(n, Hk=2, seed=4)
    state = topk.init_state(Shape.of(q, k, True), seed=2, top_k=top_k, index_heads=2, index_dim=8)
    params = {"top_k": top_k, "index_heads": 2, "index_dim": 8, **state}
    got = generated("topk", q, k, v, n0, sinks=sinks, **params)
    expected = with_sink(q, k, v, sinks, topk_keep(q, k, True, state, top_k))
    torch.testing.assert_close(got.double(), expected, atol=2e-6, rtol=1e-5)


def test_nsa_generation_with_sinks():
    """The steps inside a selection block read it by the gathered form, the others by the sparse products."""
    n, n0 = 21, 6
    q, k, v, sinks = inputs(n, Hk=1, seed=6)  # one key/value head for two batch elements: no axis mistaken
    gates = nsa.draw_gates(2, 4, n, seed=7)
    got = generated("nsa", q, k, v, n0, sinks=sinks, **NSA, **gates)
    torch.testing.assert_close(got.double(), nsa_with_sinks(q, k, v, sinks, gates, **NSA), atol=2e-6, rtol=1e-5)


def test_a_very_low_sink_is_the_mechanism_without_one():
    q, k, v, _ = inputs(33, Hk=2)
    low = torch.full((4,), -1e4)
    for key, params in (("longformer", LONGFORMER), ("topk", {"top_k": 6}), ("nsa", NSA)):
        causal = key == "nsa"
        with torch.no_grad():
            torch.testing.assert_close(ac.attention(key, q, k, v, causal=causal, sinks=low, **params),
                                       ac.attention(key, q, k, v, causal=causal, **params))


@pytest.mark.parametrize("form", ["as built", "torch forms"])
@pytest.mark.parametrize("key,causal", [("longformer", False), ("bigbird", True), ("topk", False), ("topk", True),
                                        ("nsa", True)])
def test_spec_memory_with_sinks_matches_the_allocator(key, causal, form, monkeypatch):
    """cost.sinks_memory against the allocator's records within 2%, defaults, B = 2, H = 3, n = 1200, D = 40 (top-k:
    four blocks of 292 rows; its sink's log-sum-exp found beside the C++ softmax, the scores twice); with the C++
    kernels where the session built them, and with the torch forms a machine without a compiler runs (their
    log-sum-exp's exponentials beside the scores and probabilities: top-k's and NSA's peaks were 4% and 15% low)."""
    if form == "torch forms":
        monkeypatch.setenv(native.SWITCH, "0")
    shape = Shape(2, 3, 1200, 1200, 40, causal=causal)
    g = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(2, 3, 1200, 40, generator=g) for _ in range(3))
    sinks = torch.randn(3, generator=g)
    spec = ac.get(key)
    state = ac.make_state(key, shape) if spec.state.init else {}
    with torch.inference_mode():
        call = lambda: spec.fn(q, k, v, causal=causal, sinks=sinks, **state)  # noqa: E731
        call()
        measured = trace_peak_bytes(call)
    assert spec.cost.sinks_memory(shape) == pytest.approx(measured, rel=0.02)
