"""Nyströmformer and additive (Bahdanau) attention against references written from their papers."""
from __future__ import annotations

import numpy as np
import pytest
import torch

import attn_core as ac
from attn_core.insight import accuracy, effective
from attn_core.mechanisms import additive, nystrom
from attn_core.spec import Shape
from tests.baselines import additive_reference, masked_softmax, nystrom_reference, trace_peak_bytes
from tests.contract.test_mechanisms import qkv


def rel(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a.double() - b.double()).norm() / b.double().norm())


# ---- Nyströmformer ----

@pytest.mark.parametrize("n,m", [(64, 8), (100, 8), (37, 5), (50, 50), (9, 1)])
def test_nystrom_equals_the_numpy_reference(n, m):
    """float64 against the paper written in numpy; n = 100, 37 are not multiples of m (uneven segments)."""
    q, k, v = qkv(n, B=2, H=2, D=8, dtype=torch.float64)
    torch.testing.assert_close(ac.attention("nystrom", q, k, v, landmarks=m), nystrom_reference(q, k, v, m),
                               atol=1e-10, rtol=1e-8)


@pytest.mark.parametrize("chunk", [1, 2 * 2 * 8 * 7])
def test_nystrom_chunks_of_keys_and_rows_change_nothing(monkeypatch, chunk):
    """Chunks of one token, and of 7 (B·H·m = 2·2·8 scores a token) with a shorter last one over n = 100: the online
    softmax over key chunks and the query-row chunks give the reference's result and gradients."""
    monkeypatch.setattr(nystrom, "CHUNK_ELEMS", chunk)
    q, k, v = qkv(100, B=2, H=2, D=8, dtype=torch.float64, grad=True)
    out = ac.attention("nystrom", q, k, v, landmarks=8)
    torch.testing.assert_close(out, nystrom_reference(q, k, v, 8), atol=1e-10, rtol=1e-8)
    got = torch.autograd.grad(out.pow(2).sum(), (q, k, v))
    monkeypatch.setattr(nystrom, "CHUNK_ELEMS", 1 << 20)  # one chunk
    want = torch.autograd.grad(ac.attention("nystrom", q, k, v, landmarks=8).pow(2).sum(), (q, k, v))
    for a, b in zip(got, want):
        torch.testing.assert_close(a, b, atol=1e-10, rtol=1e-8)


def by_hand(t: torch.Tensor, heads: int) -> torch.Tensor:
    """(B, Hk, n, D) → (B, H, n, D): query head i reads key/value head ⌊i·Hk/H⌋, a loop over heads."""
    return torch.stack([t[:, i * t.shape[1] // heads] for i in range(heads)], dim=1)


@pytest.mark.parametrize("kv_heads", [1, 2])
def test_nystrom_shared_heads_over_chunks_equal_the_reference_of_repeated_heads(monkeypatch, kv_heads):
    """Four query heads reading one or two key/value heads, keys and query rows in chunks of 7 tokens: K̃ once per
    key/value head, the query landmarks of a group folded against it; the reference with each query head given its
    keys, values and gradients."""
    monkeypatch.setattr(nystrom, "CHUNK_ELEMS", 2 * 4 * 8 * 7)
    q = qkv(100, B=2, H=4, D=8, dtype=torch.float64, grad=True)[0]
    k, v = qkv(100, B=2, H=kv_heads, D=8, dtype=torch.float64, seed=1, grad=True)[1:]
    out = ac.attention("nystrom", q, k, v, landmarks=8)
    torch.testing.assert_close(out, nystrom_reference(q, by_hand(k, 4), by_hand(v, 4), 8), atol=1e-10, rtol=1e-8)
    got = torch.autograd.grad(out.pow(2).sum(), (q, k, v))
    want = torch.autograd.grad(ac.attention("nystrom", q, by_hand(k, 4), by_hand(v, 4), landmarks=8).pow(2).sum(),
                               (q, k, v))
    for a, b in zip(got, want):
        torch.testing.assert_close(a, b, atol=1e-10, rtol=1e-8)


def test_nystrom_shared_heads_with_sequences_shorter_than_the_landmarks():
    """Padding that leaves 10 real tokens for 16 landmarks (hollow landmarks) with shared heads: as repeated."""
    q = qkv(36, B=2, H=4, D=8, dtype=torch.float64)[0]
    k, v = qkv(36, B=2, H=2, D=8, dtype=torch.float64, seed=1)[1:]
    mask = torch.arange(36) >= torch.tensor([10, 36])[:, None]
    out = ac.attention("nystrom", q, k, v, landmarks=16, key_padding_mask=mask)
    want = ac.attention("nystrom", q, by_hand(k, 4), by_hand(v, 4), landmarks=16, key_padding_mask=mask)
    torch.testing.assert_close(out, want, atol=1e-10, rtol=1e-9)


@pytest.mark.parametrize("dtype,tol", [(torch.float16, 1e-3), (torch.bfloat16, 1e-2)])
def test_nystrom_half_precision_over_many_key_chunks(monkeypatch, dtype, tol):
    """The running sums over 30 chunks of keys stay in float32 for half inputs."""
    monkeypatch.setattr(nystrom, "CHUNK_ELEMS", 1 * 2 * 32 * 100)
    q, k, v = qkv(3000, B=1, H=2, D=32)
    out = ac.attention("nystrom", q.to(dtype), k.to(dtype), v.to(dtype), landmarks=32)
    assert rel(out, nystrom_reference(q, k, v, 32)) < tol


def test_nystrom_float32_is_close_to_the_reference():
    q, k, v = qkv(200, D=16)
    assert rel(ac.attention("nystrom", q, k, v, landmarks=16), nystrom_reference(q, k, v, 16)) < 1e-4


def test_nystrom_pinv_iterations_converge_to_the_exact_pseudo_inverse():
    """Second check: with enough steps the iteration's result is the one numpy's SVD pseudo-inverse gives."""
    q, k, v = qkv(90, B=1, H=2, D=8, dtype=torch.float64)
    exact = nystrom_reference(q, k, v, 12, iterations=None)
    errors = [rel(ac.attention("nystrom", q, k, v, landmarks=12, pinv_iterations=i), exact) for i in (1, 3, 40)]
    assert errors[0] > errors[1] > errors[2] and errors[2] < 1e-9


def test_iterative_pinv_inverts_and_pseudo_inverts():
    g = torch.Generator().manual_seed(0)
    a = torch.softmax(torch.randn(3, 16, 16, generator=g, dtype=torch.float64), -1)
    torch.testing.assert_close(nystrom.iterative_pinv(a, 40), torch.from_numpy(np.linalg.pinv(a.numpy())))
    low = torch.randn(16, 3, generator=g, dtype=torch.float64) @ torch.randn(3, 16, generator=g, dtype=torch.float64)
    # rank 3: the Moore–Penrose inverse, not an inverse. Not many more steps: on a singular matrix the iteration
    # multiplies rounding in the null space by 13/4 a step (its fixed point at 0 is unstable), 10⁻³ after 30.
    torch.testing.assert_close(nystrom.iterative_pinv(low, 10), torch.from_numpy(np.linalg.pinv(low.numpy())))


def test_segment_means_cover_uneven_segments_with_real_tokens_only():
    x = torch.arange(10.0).view(1, 1, 10, 1)  # 10 tokens, 4 landmarks: segments of 3, 3, 2, 2
    means = nystrom.segment_means(x, 4).flatten().tolist()
    assert means == [1.0, 4.0, 6.5, 8.5]
    assert means == [float(s.mean()) for s in np.array_split(np.arange(10.0), 4)]


def test_nystrom_with_every_token_a_landmark_is_softmax():
    """m = n: the landmarks are the tokens, F = A = B = softmax(QKᵀ/√d) and F·A⁺·B = softmax, up to the
    pseudo-inverse's accuracy: 6 steps leave an error the 40-step result does not have."""
    q, k, v = qkv(48, B=1, H=2, D=8, dtype=torch.float64)
    exact = masked_softmax(q, k, v)
    six = rel(ac.attention("nystrom", q, k, v, landmarks=48), exact)
    many = rel(ac.attention("nystrom", q, k, v, landmarks=48, pinv_iterations=40), exact)
    assert many < 1e-9 and six > many


def test_nystrom_error_falls_as_landmarks_grow_on_smooth_inputs():
    """Slowly varying inputs (accuracy's 'local': AR(1), neighbour correlation 0.9), n = 256, default 6 steps."""
    q, k, v = accuracy.make_inputs("local", 1, 4, 256, 32, seed=0)
    exact = masked_softmax(q, k, v)
    errors = [rel(ac.attention("nystrom", q, k, v, landmarks=m), exact) for m in (4, 16, 64, 256)]
    assert all(a > b for a, b in zip(errors, errors[1:])), errors
    assert errors[-1] < 0.03  # measured 0.011


def test_nystrom_cross_attention_is_exact_when_the_keys_are_the_landmarks():
    """Nq ≠ Nk: with m = Nk each key is its own landmark, K̃ = K, and F·A⁺·B = softmax(QKᵀ/√d)·A⁺·A = softmax."""
    q, k, v = qkv(30, 12, B=1, H=2, D=8, dtype=torch.float64)
    out = ac.attention("nystrom", q, k, v, landmarks=12, pinv_iterations=40)
    torch.testing.assert_close(out, masked_softmax(q, k, v), atol=1e-9, rtol=1e-7)
    torch.testing.assert_close(ac.attention("nystrom", q, k, v, landmarks=5), nystrom_reference(q, k, v, 5),
                               atol=1e-10, rtol=1e-8)


@pytest.mark.parametrize("dtype,tol", [(torch.float16, 1e-3), (torch.bfloat16, 1e-2)])
def test_nystrom_half_precision_against_the_float64_reference(dtype, tol):
    q, k, v = qkv(300, B=1, H=2, D=32)
    want = nystrom_reference(q, k, v, 32)
    out = ac.attention("nystrom", q.to(dtype), k.to(dtype), v.to(dtype), landmarks=32)
    assert out.dtype == dtype and rel(out, want) < tol


@pytest.mark.parametrize("kwargs,q_len,k_len,words", [
    ({"causal": True}, 32, 32, ["Nyströmformer cannot be causal", "untick causal"]),
    ({"landmarks": 40}, 32, 32, ["landmarks = 40", "choose landmarks ≤ 32"]),
    ({"landmarks": 16}, 10, 40, ["landmarks = 16 is more than the 10 queries", "choose landmarks ≤ 10"]),
    ({"pinv_iterations": 0}, 32, 32, ["pinv_iterations = 0", "between 1"]),
])
def test_nystrom_refuses_settings_with_a_sentence(kwargs, q_len, k_len, words):
    with pytest.raises(ValueError) as err:
        ac.attention("nystrom", *qkv(q_len, k_len), **{"landmarks": 8, **kwargs})
    assert all(w in str(err.value) for w in words), str(err.value)


def test_nystrom_gradients_match_the_reference_in_torch():
    """Gradients through the pseudo-inverse iteration against the same formula in plain torch (autograd)."""
    q, k, v = qkv(40, B=1, H=2, D=8, dtype=torch.float64, grad=True)

    def plain(q, k, v, m=8):
        d = q.shape[-1] ** 0.5
        ql = torch.stack([s.mean(-2) for s in torch.tensor_split(q, m, dim=-2)], -2)
        kl = torch.stack([s.mean(-2) for s in torch.tensor_split(k, m, dim=-2)], -2)
        a = torch.softmax(ql @ kl.transpose(-2, -1) / d, -1)
        z = a.transpose(-2, -1) / (a.sum(-2).amax(-1) * a.sum(-1).amax(-1))[..., None, None]
        eye = torch.eye(m, dtype=q.dtype)
        for _ in range(6):
            az = a @ z
            z = 0.25 * z @ (13 * eye - az @ (15 * eye - az @ (7 * eye - az)))
        right = torch.softmax(ql @ k.transpose(-2, -1) / d, -1) @ v
        return torch.softmax(q @ kl.transpose(-2, -1) / d, -1) @ z @ right

    got = torch.autograd.grad(ac.attention("nystrom", q, k, v, landmarks=8).pow(2).sum(), (q, k, v))
    want = torch.autograd.grad(plain(q, k, v).pow(2).sum(), (q, k, v))
    for a, b in zip(got, want):
        torch.testing.assert_close(a, b, atol=1e-9, rtol=1e-7)


# ---- additive ----

def _state(q, k, causal=False, seed=0, attn_dim=8):
    return ac.make_state("additive", Shape.of(q, k, causal), dtype=q.dtype, seed=seed, attn_dim=attn_dim)


@pytest.mark.parametrize("nq,nk,causal", [(1, 1, False), (7, 7, False), (13, 13, True), (5, 9, False), (1, 1, True)])
def test_additive_equals_the_loop_reference(nq, nk, causal):
    q, k, v = qkv(nq, nk, B=2, H=2, D=6, dtype=torch.float64)
    state = _state(q, k, causal)
    torch.testing.assert_close(ac.attention("additive", q, k, v, causal=causal, attn_dim=8, **state),
                               additive_reference(q, k, v, **state, causal=causal), atol=1e-12, rtol=1e-10)


@pytest.mark.parametrize("chunk,rows", [(1, 1), (8 * 11 * 4 * 4, 4), (8 * 11 * 4 * 3 + 5, 3)])
@pytest.mark.parametrize("causal", [False, True])
def test_additive_chunks_of_query_rows_change_nothing(monkeypatch, chunk, rows, causal):
    """Chunks of one row, of 4 rows (4, 4, 3) and of 3 (3, 3, 3, 2): B·H·Nk·attn_dim = 8·11·4 elements per row."""
    monkeypatch.setattr(additive, "CHUNK_ELEMS", chunk)
    assert additive.chunk_rows(8, 11, 11, 4) == rows
    q, k, v = qkv(11, B=2, H=4, D=5, dtype=torch.float64)
    state = _state(q, k, causal, attn_dim=4)
    torch.testing.assert_close(ac.attention("additive", q, k, v, causal=causal, attn_dim=4, **state),
                               additive_reference(q, k, v, **state, causal=causal), atol=1e-12, rtol=1e-10)


@pytest.mark.parametrize("causal", [False, True])
def test_additive_gradients_by_finite_differences(monkeypatch, causal):
    """The chunked backward (tanh recomputed per chunk) against finite differences, every input and weight."""
    monkeypatch.setattr(additive, "CHUNK_ELEMS", 2 * 6 * 3 * 2)  # two rows per chunk, three chunks
    q, k, v = qkv(6, B=1, H=2, D=3, dtype=torch.float64, grad=True)
    state = {name: t.requires_grad_() for name, t in _state(q, k, causal, attn_dim=3).items()}

    def f(q, k, v, W_q, W_k, w):
        return additive.additive_attention(q, k, v, causal=causal, attn_dim=3, W_q=W_q, W_k=W_k, w=w)

    assert torch.autograd.gradcheck(f, (q, k, v, state["W_q"], state["W_k"], state["w"]))


@pytest.mark.parametrize("causal", [False, True])
def test_additive_shared_heads_over_chunks_of_rows(monkeypatch, causal):
    """Six query heads reading two key/value heads (W_kᵀk once for each, added to a group by broadcasting), rows in
    chunks of 4: the loop reference with each query head given its keys and values; gradients by finite
    differences, a shared head's the sum over its group."""
    monkeypatch.setattr(additive, "CHUNK_ELEMS", 12 * 11 * 4 * 4)
    q = qkv(11, B=2, H=6, D=5, dtype=torch.float64)[0]
    k, v = qkv(11, B=2, H=2, D=5, dtype=torch.float64, seed=1)[1:]
    state = _state(q, k, causal, attn_dim=4)
    torch.testing.assert_close(ac.attention("additive", q, k, v, causal=causal, attn_dim=4, **state),
                               additive_reference(q, by_hand(k, 6), by_hand(v, 6), **state, causal=causal),
                               atol=1e-12, rtol=1e-10)
    monkeypatch.setattr(additive, "CHUNK_ELEMS", 4 * 5 * 3 * 2)  # two rows per chunk
    q = qkv(5, B=1, H=4, D=3, dtype=torch.float64, grad=True)[0]
    k, v = qkv(5, B=1, H=2, D=3, dtype=torch.float64, seed=1, grad=True)[1:]
    state = {name: t.requires_grad_() for name, t in _state(q, k, causal, attn_dim=3).items()}

    def f(q, k, v, W_q, W_k, w):
        return additive.additive_attention(q, k, v, causal=causal, attn_dim=3, W_q=W_q, W_k=W_k, w=w)

    assert torch.autograd.gradcheck(f, (q, k, v, state["W_q"], state["W_k"], state["w"]))


def test_additive_state_is_seeded_and_drawn_when_absent():
    q, k, v = qkv(9, 12, D=6)
    state = _state(q, k, seed=3)
    assert {n: tuple(t.shape) for n, t in state.items()} == {"W_q": (6, 8), "W_k": (6, 8), "w": (8,)}
    torch.testing.assert_close(ac.attention("additive", q, k, v, attn_dim=8, seed=3),
                               ac.attention("additive", q, k, v, attn_dim=8, **state))
    assert not torch.allclose(state["W_q"], _state(q, k, seed=4)["W_q"])
    with pytest.raises(ValueError, match=r"W_q must have shape \(6, 8\)"):
        ac.attention("additive", q, k, v, attn_dim=8, **{**state, "W_q": state["W_q"][:, :4]})


def test_additive_never_holds_the_pair_by_hidden_unit_tensor():
    """n = 1024, B = H = 1, attn_dim = 64: the (n, n, attn_dim) tanh tensor is 256 MiB; the peak must be the two
    (n, n) matrices (8 MiB) and one chunk's workspace (at most CHUNK_ELEMS floats, 4 MiB) and a little more."""
    n, a = 1024, 64
    q, k, v = qkv(n, B=1, H=1, D=16)
    state = _state(q, k, attn_dim=a)
    with torch.inference_mode():
        peak = trace_peak_bytes(lambda: ac.attention("additive", q, k, v, attn_dim=a, **state))
    assert peak < 2 * n * n * 4 + additive.CHUNK_ELEMS * 4 + 2 * n * a * 4 + n * n * 4 // 8, peak
    assert peak == pytest.approx(ac.get("additive").cost.memory_bytes(Shape(1, 1, n, n, 16), attn_dim=a), rel=1e-4)


def test_additive_flops_count_the_pair_work_by_hand():
    """n = 4, D = 2, attn_dim = 3, one head: projections 2·(4 + 4)·2·3 = 96; 16 pairs × (3 adds + 3 tanh + 6 for
    the dot product) = 192; P·V 16 × 2·2 = 64. Causal keeps 10 pairs: 96 + 120 + 40."""
    assert ac.get("additive").cost.flops(Shape(1, 1, 4, 4, 2), attn_dim=3) == 96 + 192 + 64
    assert ac.get("additive").cost.flops(Shape(1, 1, 4, 4, 2, causal=True), attn_dim=3) == 96 + 120 + 40
    # Executed, causal, one chunk of all 4 rows: all 16 pairs scored, P·V over all 16 cells.
    assert ac.get("additive").cost.executed(Shape(1, 1, 4, 4, 2, causal=True), attn_dim=3) == 96 + 192 + 64


def test_additive_is_not_softmax_and_says_so():
    spec = ac.get("additive")
    assert not spec.exact and spec.insight.effective is not None
    assert effective.cells_computed("additive", 8, causal=True, attn_dim=4)["cells"] == 36  # scored one by one
    assert not effective.cells_computed("additive", 8, attn_dim=4)["implicit"]
    assert "not an approximation" in spec.insight.accuracy_note and "not an approximation" in spec.insight.regime[2]
    q, k, v = qkv(32)
    assert rel(ac.attention("additive", q, k, v, attn_dim=16), masked_softmax(q, k, v)) > 0.1


def test_the_patterns_page_tells_signed_weights_and_scored_pairs_apart():
    """Nyström's weights are drawn as a linear map of v (its pseudo-inverse has negative entries), additive
    attention's cells as scored one by one, both from their specs."""
    from tests.apptest_helpers import chart_specs
    from tests.dashboard.test_pages_insight import errors, page

    at = page("patterns", pat_mechanisms=["nystrom", "additive"])
    assert errors(at) == []
    charts = {spec["title"]["text"]: spec for spec in chart_specs(at)}
    weights_title = " ".join(charts["Nyströmformer"]["hconcat"][1]["title"]["text"])  # wrapped to the panel
    assert weights_title == "Effective attention: a linear map of v, some weights negative"
    assert " ".join(charts["Additive (Bahdanau)"]["hconcat"][1]["title"]["text"]) == "Effective attention (rows sum to 1)"
    counted = charts["Additive (Bahdanau)"]["title"]["subtitle"][1]
    assert counted.endswith("100.0% of the n² cells"), counted
    assert "implicitly" in charts["Nyströmformer"]["title"]["subtitle"][1]
