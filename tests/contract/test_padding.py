"""Key-padding masks against independently written references: masked softmax with the pattern and the padding
combined cell by cell, kernel attention with the padded keys' weights removed, Linformer on the unpadded keys."""
from __future__ import annotations

import re
import sys

import numpy as np
import pytest
import torch

import attn_core as ac
from attn_core import MultiHeadAttention
from attn_core.mechanisms import _banded
from attn_core.mechanisms._common import validated
from attn_core.mechanisms.performer import base2, key_features
from tests.baselines import (additive_reference, allowed, differential_reference, elu_plus_one,
                             gated_delta_reference, kda_reference, masked_softmax, nystrom_reference, plain_causal,
                             positive_random_features, runs, sigmoid_reference, ssd_recurrence,
                             topk_reference)
from tests.copies import original, with_copies
from tests.contract.test_mechanisms import REF_KIND, SMALL, qkv

PADDED = [k for k, s in ac.MECHANISMS.items() if s.supports.padding]
EXACT = [k for k in PADDED if ac.MECHANISMS[k].exact]
KERNEL = with_copies({"linear": lambda x, state: elu_plus_one(x),
                      "performer": lambda x, state: positive_random_features(x, state["projection"])})
REFUSING = [k for k, s in ac.MECHANISMS.items() if not s.supports.padding]
# Mechanisms of their own scores, at their default parameters: (q, k, v, pad, causal) → the float64 reference.
OWN = with_copies({"differential": lambda q, k, v, pad, causal: differential_reference(q, k, v, causal, 0.8, pad),
                   "sigmoid": lambda q, k, v, pad, causal: sigmoid_reference(q, k, v, causal, 0.0, pad)})


def lengths_mask(lengths, nk: int) -> torch.Tensor:
    return torch.arange(nk)[None, :] >= torch.tensor(lengths)[:, None]


def scattered_mask(B: int, nk: int, seed: int = 3) -> torch.Tensor:
    """Padding anywhere (not only at the end), every batch element keeping some keys."""
    m = torch.rand(B, nk, generator=torch.Generator().manual_seed(seed)) < 0.4
    m[:, nk // 2] = False
    return m


MASKS = {"lengths 37, 20": lambda: lengths_mask([37, 20], 37), "scattered": lambda: scattered_mask(2, 37),
         "left-padded": lambda: lengths_mask([30, 12], 37).flip(-1)}


def padded_softmax(q, k, v, pattern: np.ndarray, pad: torch.Tensor) -> torch.Tensor:
    """masked_softmax under pattern AND not-padding; a query with no key left outputs zeros (the library's rule)."""
    keep = pattern[None, None] & ~pad.numpy()[:, None, None, :]  # (B, 1, Nq, Nk)
    out = masked_softmax(q, k, v, keep)
    return torch.where(torch.as_tensor(keep.any(-1))[..., None], out, torch.zeros((), dtype=out.dtype))


def exact_params(key: str, causal: bool = False, n: int = 37) -> dict:
    """The small parameters and, for a pattern drawn at random (BigBird's blocks), its seeded state."""
    params = SMALL.get(key, {})
    if ac.MECHANISMS[key].state.init is None:
        return params
    return {**params, **ac.make_state(key, ac.Shape(2, 3, n, n, 16, causal=causal), seed=4, **params)}


def test_every_padding_mechanism_is_tested_here():
    assert set(PADDED) == set(EXACT) | set(KERNEL) | set(OWN) | {"linformer", "additive", "nystrom", "mamba2",
                                                                 "gated_deltanet", "kda", "topk"}, \
        "add its reference here"
    assert not (set(PADDED) & set(REFUSING))


@pytest.mark.parametrize("key", EXACT)
@pytest.mark.parametrize("mask", list(MASKS))
@pytest.mark.parametrize("causal", [False, True])
def test_exact_mechanisms_equal_masked_softmax_with_padding(key, mask, causal):
    q, k, v = qkv(37)
    pad = MASKS[mask]()
    params = exact_params(key, causal)
    expected = padded_softmax(q, k, v, allowed(REF_KIND[key], 37, 37, causal, **params), pad)
    out = ac.attention(key, q, k, v, causal=causal, key_padding_mask=pad, **params)
    assert out.shape == q.shape and out.dtype == q.dtype
    torch.testing.assert_close(out.double(), expected, atol=2e-5, rtol=1e-5)


@pytest.mark.parametrize("key", [k for k in EXACT if ac.MECHANISMS[k].supports.cross])
def test_exact_cross_attention_with_padding(key):
    q, k, v = qkv(20, 33)
    pad = lengths_mask([33, 9], 33)
    expected = padded_softmax(q, k, v, np.ones((20, 33), dtype=bool), pad)
    torch.testing.assert_close(ac.attention(key, q, k, v, key_padding_mask=pad).double(), expected,
                               atol=2e-5, rtol=1e-5)


@pytest.mark.parametrize("key", EXACT)
def test_padded_keys_change_nothing(key):
    """Whatever the padded keys and values hold, the output is the same."""
    q, k, v = qkv(37)
    pad = MASKS["scattered"]()
    params = exact_params(key)
    noise = torch.randn(k.shape, generator=torch.Generator().manual_seed(9)) * 50 * pad[:, None, :, None]
    a = ac.attention(key, q, k, v, key_padding_mask=pad, **params)
    b = ac.attention(key, q, k + noise, v + noise, key_padding_mask=pad, **params)
    torch.testing.assert_close(a, b, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("key", EXACT)
def test_gradients_finite_where_a_query_sees_no_key(key):
    """Causal with left padding: the first queries see only padding; their output is zero, every gradient finite."""
    q, k, v = qkv(37, B=2, H=2, D=8, dtype=torch.float64, grad=True)
    pad = MASKS["left-padded"]()
    params = exact_params(key, True)
    out = ac.attention(key, q, k, v, causal=True, key_padding_mask=pad, **params)
    first = int((~pad[1]).int().argmax())
    assert first > 0 and out[1, :, :first].abs().max() == 0
    grads = torch.autograd.grad(out.square().sum(), (q, k, v))
    expected = padded_softmax(q.detach(), k.detach(), v.detach(), allowed(REF_KIND[key], 37, 37, True, **params), pad)
    torch.testing.assert_close(out.detach(), expected, atol=1e-9, rtol=1e-7)
    assert all(bool(torch.isfinite(g).all()) for g in grads)


@pytest.mark.parametrize("key", sorted(KERNEL))
@pytest.mark.parametrize("mask", list(MASKS))
@pytest.mark.parametrize("causal,nq", [(False, 37), (True, 37), (False, 20)])  # causal is self-attention only
def test_kernelized_equal_kernel_attention_without_padded_keys(key, mask, causal, nq):
    q, k, v = qkv(nq, 37)
    pad = MASKS[mask]()
    params = SMALL.get(key, {})
    state = ac.make_state(key, ac.Shape(2, 3, nq, 37, 16), seed=1, **params)
    out = ac.attention(key, q, k, v, causal=causal, key_padding_mask=pad, **params, **state)
    # φ(Q)φ(K)ᵀ in float64 from the paper's feature map, the padded keys' columns removed, rows normalised
    a = torch.einsum("bhim,bhjm->bhij", KERNEL[key](q, state), KERNEL[key](k, state))
    a = a * (~pad)[:, None, None, :]
    if causal:
        a = a.tril()
    den = a.sum(-1, keepdim=True)
    expected = torch.where(den > 0, a / den, 0.0) @ v.double()
    torch.testing.assert_close(out.double(), expected, atol=2e-5, rtol=1e-4)


@pytest.mark.parametrize("mask", list(MASKS))
@pytest.mark.parametrize("causal,nq", [(False, 37), (True, 37), (False, 20)])
def test_additive_equals_the_loop_reference_without_the_padded_keys(mask, causal, nq):
    q, k, v = qkv(nq, 37, H=2, D=8)
    pad = MASKS[mask]()
    state = ac.make_state("additive", ac.Shape(2, 2, nq, 37, 8), seed=1, attn_dim=8)
    out = ac.attention("additive", q, k, v, causal=causal, key_padding_mask=pad, attn_dim=8, **state)
    expected = additive_reference(q, k, v, **state, causal=causal, padding=pad)
    torch.testing.assert_close(out.double(), expected, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("mask", list(MASKS))
@pytest.mark.parametrize("nq", [37, 20])  # self-attention: the queries' landmarks skip the padded positions too
def test_nystrom_equals_nystrom_on_the_real_keys_alone(mask, nq):
    q, k, v = qkv(nq, 37, dtype=torch.float64)
    pad = MASKS[mask]()
    out = ac.attention("nystrom", q, k, v, key_padding_mask=pad, landmarks=8)
    for b in range(2):
        real = ~pad[b]
        rows = real if nq == 37 else slice(None)
        expected = nystrom_reference(q[b:b + 1, :, rows], k[b:b + 1, :, real], v[b:b + 1, :, real], 8)
        torch.testing.assert_close(out[b:b + 1, :, rows], expected, atol=1e-9, rtol=1e-7)


@pytest.mark.parametrize("length", [12, 5, 1])
@pytest.mark.parametrize("nq", [37, 20])
def test_nystrom_of_a_sequence_shorter_than_its_landmarks_leaves_the_empty_ones_out(length, nq):
    """L < m real tokens: L landmarks of one token each and m − L of none; without those, Nyström with L landmarks
    (in self-attention also L query landmarks; across, all m query landmarks are real)."""
    q, k, v = qkv(nq, 37, dtype=torch.float64)
    pad = lengths_mask([37, length], 37)
    out = ac.attention("nystrom", q, k, v, key_padding_mask=pad, landmarks=16)
    assert bool(torch.isfinite(out).all())
    if nq == 37:
        expected = nystrom_reference(q[1:, :, :length], k[1:, :, :length], v[1:, :, :length], length)
        torch.testing.assert_close(out[1:, :, :length], expected, atol=1e-9, rtol=1e-7)
    torch.testing.assert_close(out[:1], nystrom_reference(q[:1], k[:1], v[:1], 16), atol=1e-9, rtol=1e-7)


def test_performer_stabilizer_is_taken_over_the_unpadded_keys():
    """The shared stabilizer c of φ(K) is the largest exponent of the real keys only (the padded keys' rows are zero),
    so padding, however large, cannot push the real keys' features towards underflow."""
    q, k, v = qkv(37)
    w = ac.make_state("performer", ac.Shape(2, 3, 37, 37, 16), seed=1, features=32)["projection"]
    k[1, :, 25] = 2.0 * w[w.norm(dim=-1).argmax()]  # a padded key with x' = the longest w: exponent |w|²/2, the most
    phi, c = key_features(k, base2(w), key_padding_mask=lengths_mask([37, 20], 37))
    _, c_short = key_features(k[1:, :, :20], base2(w))
    _, c_all = key_features(k[1:], base2(w))
    assert not torch.equal(c_all, c_short)  # the padded key would have set it
    torch.testing.assert_close(c[1:], c_short)
    assert phi[1, :, 20:].abs().max() == 0 and phi[1, :, :20].min() > 0


@pytest.mark.parametrize("mask", list(MASKS))
def test_linformer_equals_linformer_on_the_unpadded_keys(mask):
    q, k, v = qkv(20, 37)
    pad = MASKS[mask]()
    state = ac.make_state("linformer", ac.Shape(2, 3, 20, 37, 16), seed=2, rank=8)
    out = ac.attention("linformer", q, k, v, key_padding_mask=pad, rank=8, **state)
    for b in range(2):
        real = ~pad[b]
        e, f = state["E"][:, real].double(), state["F"][:, real].double()
        kp, vp = e @ k[b, :, real].double(), f @ v[b, :, real].double()
        w = torch.exp(q[b].double() @ kp.transpose(-1, -2) / 4.0)
        torch.testing.assert_close(out[b].double(), (w / w.sum(-1, keepdim=True)) @ vp, atol=2e-5, rtol=1e-5)


@pytest.mark.parametrize("key", PADDED)
def test_a_batch_element_all_padding_outputs_zeros(key):
    q, k, v = qkv(37)
    params = SMALL.get(key, {"rank": 8} if key == "linformer" else {})
    pad = lengths_mask([37, 0], 37)
    out = ac.attention(key, q, k, v, causal=plain_causal(ac.get(key)), key_padding_mask=pad, **params)
    assert out[1].abs().max() == 0 and bool(torch.isfinite(out).all()) and out[0].abs().max() > 0


@pytest.mark.parametrize("key", REFUSING)
def test_mechanisms_without_padding_refuse_with_a_sentence(key):
    spec = ac.MECHANISMS[key]
    q, k, v = qkv(37)
    with pytest.raises(ValueError, match=re.escape(spec.label) + " cannot take a key-padding mask: .+; choose one of"):
        ac.attention(key, q, k, v, causal=plain_causal(spec), key_padding_mask=lengths_mask([37, 20], 37),
                     **SMALL.get(key, {}))
    layer = MultiHeadAttention(16, 2, key, plain_causal(spec), **SMALL.get(key, {}))
    with pytest.raises(ValueError, match="cannot take a key-padding mask"):
        layer(torch.randn(2, 37, 16), key_padding_mask=lengths_mask([37, 20], 37))


@pytest.mark.parametrize("key", PADDED)
@pytest.mark.parametrize("bad,says", [
    (lambda: lengths_mask([37, 20], 36), "must have shape"),
    (lambda: lengths_mask([37, 20], 37)[None], "must have shape"),
    (lambda: lengths_mask([37, 20], 37).to(torch.uint8), "must be boolean"),
    (lambda: lengths_mask([37, 20], 37).float(), "must be boolean"),
    (lambda: [[False] * 37] * 2, "must be a boolean tensor"),
    (lambda: torch.zeros(2, 37, dtype=torch.bool, device="meta"), "is on meta but the keys are on cpu")])
def test_bad_masks_are_refused_with_a_sentence(key, bad, says):
    q, k, v = qkv(37)
    params = SMALL.get(key, {"rank": 8} if key == "linformer" else {})
    causal = plain_causal(ac.get(key))
    with pytest.raises(ValueError, match=says):
        ac.attention(key, q, k, v, causal=causal, key_padding_mask=bad(), **params)
    with pytest.raises(ValueError, match=says):  # the kernel called directly checks too
        ac.MECHANISMS[key].fn(q, k, v, causal=causal, key_padding_mask=bad(), **params)


def test_layer_with_padding_equals_the_layer_on_the_short_sequence():
    for key in ("softmax", "sliding_window", "linear", "sparse", "longformer", "bigbird", "nystrom", "additive"):
        torch.manual_seed(0)
        layer = MultiHeadAttention(16, 2, key, **SMALL.get(key, {}))
        x = torch.randn(2, 37, 16)
        out = layer(x, key_padding_mask=lengths_mask([37, 20], 37))
        short = layer(x[1:, :20])
        torch.testing.assert_close(out[1:, :20], short, atol=2e-5, rtol=1e-5)
        torch.testing.assert_close(out[:1], layer(x[:1]), atol=2e-5, rtol=1e-5)


def test_no_mask_costs_nothing(monkeypatch):
    """With key_padding_mask None nothing of the padding path runs: no check, no bias, no extra keyword."""
    def boom(*a, **kw):
        raise AssertionError("padding code ran without a mask")

    modules = {sys.modules[s.fn.__module__] for s in ac.MECHANISMS.values()} | {sys.modules["attn_core.api"],
                                                                               sys.modules["attn_core.nn.layers"]}
    for module in modules:
        if hasattr(module, "check_key_padding"):
            monkeypatch.setattr(module, "check_key_padding", boom)
    monkeypatch.setattr(_banded, "padding_bias", boom)
    q, k, v = qkv(37)
    seen = []
    for key, spec in ac.MECHANISMS.items():
        params = SMALL.get(key, {"rank": 8} if key == "linformer" else {})
        causal = plain_causal(spec)
        ac.attention(key, q, k, v, causal=causal, **params)
        MultiHeadAttention(16, 2, key, causal=causal, **params)(torch.randn(2, 37, 16))
        seen.append(key)
    assert set(seen) == set(ac.MECHANISMS)
    # the engine's timed calls (inside validated()) pass no mask and get the same result as before
    with validated():
        torch.testing.assert_close(ac.MECHANISMS["softmax"].fn(q, k, v), ac.attention("softmax", q, k, v))


# Gradients where a query sees no real key (causal attention before the first real key, a batch element all
# padding): against each family's reference with those rows zeroed outside the division, so the reference's own
# gradients are finite (a 0/0 row would make them NaN).
GRAD_CASES = {"causal, left-padded": (True, lambda n: lengths_mask([n, n // 3], n).flip(-1)),
              "causal, an element all padding": (True, lambda n: lengths_mask([n, 0], n)),
              "an element all padding": (False, lambda n: lengths_mask([n, 0], n)),
              "short, scattered": (False, lambda n: scattered_mask(2, n) | lengths_mask([n, 3], n))}


def seen_softmax(q, k, v, pattern: np.ndarray, pad: torch.Tensor) -> torch.Tensor:
    """masked_softmax under pattern AND not-padding, a query with no key left computed over every key and then
    zeroed (its output 0, its gradients 0)."""
    keep = pattern[None, None] & ~pad.numpy()[:, None, None, :]
    seen = keep.any(-1, keepdims=True)
    return masked_softmax(q, k, v, keep | ~seen) * torch.as_tensor(seen)


def kernel_reference(key: str, q, k, v, pad: torch.Tensor, causal: bool, state: dict) -> torch.Tensor:
    """φ(Q)φ(K)ᵀ in float64 from the paper's feature map, padded keys' columns removed, rows normalised; a row with
    nothing left is 0, divided by 1 and then zeroed."""
    a = torch.einsum("bhim,bhjm->bhij", KERNEL[key](q, state), KERNEL[key](k, state)) * (~pad)[:, None, None, :]
    a = a.tril() if causal else a
    den = a.sum(-1, keepdim=True)
    return torch.where(den > 0, a / torch.where(den > 0, den, 1.0), 0.0) @ v.double()


def linformer_reference(q, k, v, pad: torch.Tensor, state: dict) -> torch.Tensor:
    """Per element, softmax(Q (E K)ᵀ/√D) F V over its real keys alone (E, F their columns)."""
    outs = []
    for b in range(q.shape[0]):
        real = ~pad[b]
        kp = state["E"][:, real].double() @ k[b, :, real].double()
        vp = state["F"][:, real].double() @ v[b, :, real].double()
        w = torch.softmax(q[b].double() @ kp.transpose(-1, -2) / q.shape[-1] ** 0.5, -1)
        outs.append(w @ vp)
    return torch.stack(outs)


def numeric_grads(f, tensors, w: torch.Tensor, eps: float = 1e-6) -> list[torch.Tensor]:
    """Central differences of Σ f(*tensors)·w by every entry of each tensor: the gradients of a numpy reference."""
    grads = []
    for which, t in enumerate(tensors):
        g = torch.zeros_like(t)
        for i in range(t.numel()):
            steps = []
            for sign in (1, -1):
                moved = [x.clone() for x in tensors]
                moved[which].view(-1)[i] += sign * eps
                steps.append(float((f(*moved) * w).sum()))
            g.view(-1)[i] = (steps[0] - steps[1]) / (2 * eps)
        grads.append(g)
    return grads


def nystrom_real(q, k, v, pad: torch.Tensor, landmarks: int) -> torch.Tensor:
    """Per element, nystrom_reference over its real tokens (self-attention: real query rows only, the others 0),
    min(landmarks, L) landmarks; 0 for an element with none."""
    out = torch.zeros(q.shape, dtype=torch.float64)
    for b in range(q.shape[0]):
        real = ~pad[b]
        if real.any():
            out[b:b + 1, :, real] = nystrom_reference(q[b:b + 1, :, real], k[b:b + 1, :, real], v[b:b + 1, :, real],
                                                      min(landmarks, int(real.sum())))
    return out


@pytest.mark.parametrize("key", PADDED)
@pytest.mark.parametrize("case", list(GRAD_CASES))
def test_gradients_equal_the_masked_reference(key, case):
    """Finite, and equal to the reference's, in q, k and v, real tokens included, where some queries see no key."""
    causal, make_pad = GRAD_CASES[case]
    if not runs(ac.MECHANISMS[key], causal):
        pytest.skip(f"{key} does not run with causal={causal}")
    kind = original(key)  # a registered copy is tested as the mechanism it copies
    small = kind in ("nystrom", "additive")  # numpy references, differentiated numerically
    n, H, D = (13, 1, 4) if small else (37, 2, 8)
    q, k, v = qkv(n, B=2, H=H, D=D, dtype=torch.float64, grad=True)
    pad = make_pad(n)
    w = torch.randn(2, H, n, D, generator=torch.Generator().manual_seed(5), dtype=torch.float64)
    params = {"nystrom": {"landmarks": 4}, "additive": {"attn_dim": 4}, "linformer": {"rank": 8}}.get(
        kind, exact_params(key, causal) if key in EXACT else SMALL.get(key, {}))
    state = {} if key in EXACT else ac.make_state(key, ac.Shape(2, H, n, n, D, causal=causal), dtype=torch.float64,
                                                  seed=1, **params)
    out = ac.attention(key, q, k, v, causal=causal, key_padding_mask=pad, **params, **state)
    if kind == "nystrom":  # self-attention: the padded positions' rows are outside Nyström on the real tokens
        w = w * (~pad)[:, None, :, None]
    got = torch.autograd.grad((out * w).sum(), (q, k, v))
    assert all(bool(torch.isfinite(g).all()) for g in got)
    if kind == "nystrom":
        want = numeric_grads(lambda *t: nystrom_real(*t, pad, 4), [t.detach() for t in (q, k, v)], w)
    elif kind == "additive":
        want = numeric_grads(lambda *t: additive_reference(*t, **state, causal=causal, padding=pad),
                             [t.detach() for t in (q, k, v)], w)
    else:
        if key in EXACT:
            expected = seen_softmax(q, k, v, allowed(REF_KIND[key], n, n, causal, **params), pad)
        elif kind == "linformer":
            expected = linformer_reference(q, k, v, pad, state)
        elif key in OWN:
            expected = OWN[key](q, k, v, pad, causal)
        elif kind == "mamba2":
            expected = ssd_recurrence(q, k, v, state["dt"], state["A"], pad)
        elif kind == "gated_deltanet":  # the recurrence skipping the padded tokens
            expected = gated_delta_reference(q, k, v, state["alpha"], state["beta"], pad)
        elif kind == "kda":  # the per-channel recurrence skipping the padded tokens
            expected = kda_reference(q, k, v, state["alpha"], state["beta"], pad)
        elif kind == "topk":  # 5 of the keys by the indexer, some queries with fewer to choose from
            out = ac.attention(key, q, k, v, causal=causal, key_padding_mask=pad, top_k=5, **state)
            got = torch.autograd.grad((out * w).sum(), (q, k, v))
            expected = topk_reference(q, k, v, causal, 5, state["index_q"], state["index_k"], state["index_w"], pad)
        else:
            expected = kernel_reference(key, q, k, v, pad, causal, state)
        torch.testing.assert_close(out.detach(), expected.detach(), atol=1e-9, rtol=1e-7)
        want = torch.autograd.grad((expected * w).sum(), (q, k, v))
    for a, b in zip(got, want):
        torch.testing.assert_close(a, b, atol=1e-6 if small else 1e-9, rtol=1e-5 if small else 1e-7)
