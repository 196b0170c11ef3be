"""Reformer's LSH attention against an explicit bucketed reference (tests/baselines.py), its neighbours found as
rounds grow, its self-masking, its seeds, half precision and its memory."""
from __future__ import annotations

import math

import pytest
import torch

import attn_core as ac
from attn_core.insight import effective as ef
from attn_core.engine.analysis import theory_curves
from attn_core.mechanisms import reformer
from attn_core.spec import Shape
from tests.baselines import lsh_attention, trace_peak_bytes

SPEC = ac.get("reformer")


def qkv(n: int, *, B: int = 1, H: int = 2, D: int = 8, seed: int = 0, dtype=torch.float64):
    g = torch.Generator().manual_seed(seed)
    return [torch.randn(B, H, n, D, generator=g, dtype=torch.float64).to(dtype) for _ in range(3)]


def state(q, causal=False, *, seed=1, **params):
    return ac.make_state("reformer", Shape.of(q, q, causal), dtype=q.dtype, seed=seed, **params)


# n = 37 and 50 are not whole numbers of chunks; n = 5 is one partial chunk; n = 64 whole chunks
@pytest.mark.parametrize("n,bucket_size,n_hashes,factors", [
    (1, 4, 2, (2,)), (5, 4, 3, (2,)), (37, 8, 2, (4,)), (50, 4, 2, (16,)), (64, 8, 3, (8,)), (100, 16, 2, (8,))])
@pytest.mark.parametrize("causal", [False, True])
def test_equals_the_bucketed_reference_cell_by_cell(n, bucket_size, n_hashes, factors, causal):
    """Output and the dense weights (effective form) against the reference written round by round from the paper."""
    q, k, v = qkv(n)
    params = {"bucket_size": bucket_size, "n_hashes": n_hashes}
    st = state(q, causal, **params)
    want_out, want_weights = lsh_attention(q, v, st["rotations"], factors, bucket_size, causal)
    out = ac.attention("reformer", q, k, v, causal=causal, **params, **st)
    torch.testing.assert_close(out, want_out, atol=1e-10, rtol=1e-10)
    weights = ef.effective_attention("reformer", q, k, v, causal=causal, state=st, **params).weights
    torch.testing.assert_close(weights, want_weights, atol=1e-12, rtol=1e-10)


def test_many_buckets_are_a_product_of_hashes_of_at_most_64():
    """n = 300 with bucket_size 2: 2^round(log2 150) = 128 buckets, hashed as 64 × 2 (33 rotation columns)."""
    assert reformer.n_buckets(300, 2) == 128 and reformer.bucket_factors(128) == (64, 2)
    q, k, v = qkv(300, H=1)
    st = state(q, bucket_size=2, n_hashes=2)
    assert st["rotations"].shape == (8, 2, 33)
    want, _ = lsh_attention(q, v, st["rotations"], (64, 2), 2)
    torch.testing.assert_close(ac.attention("reformer", q, k, v, bucket_size=2, n_hashes=2, **st), want,
                               atol=1e-10, rtol=1e-10)


def test_bucket_counts_follow_n_and_the_hashing_stays_logarithmic():
    assert [reformer.n_buckets(n, 64) for n in (10, 64, 100, 4096, 5000, 6000)] == [2, 2, 2, 64, 64, 128]
    assert reformer.bucket_factors(2) == (2,) and reformer.bucket_factors(4096) == (64, 64)
    assert reformer.bucket_factors(1 << 14) == (64, 64, 4)
    columns = [reformer.rotation_columns(n, 64) for n in (1 << 12, 1 << 15, 1 << 20)]
    assert columns == [32, 36, 66]  # one (D, n/128) rotation would have 32, 256 and 8192


def test_float32_kernel_matches_the_reference_at_a_padded_n():
    q, k, v = qkv(77, H=3, D=16, dtype=torch.float32)
    st = state(q, bucket_size=8, n_hashes=3)
    want, _ = lsh_attention(q, v, st["rotations"], (8,), 8)
    torch.testing.assert_close(ac.attention("reformer", q, k, v, bucket_size=8, n_hashes=3, **st).double(), want,
                               atol=2e-6, rtol=1e-5)


def test_keys_are_the_queries_and_k_is_not_read():
    q, k, v = qkv(40)
    st = state(q, bucket_size=8)
    a = ac.attention("reformer", q, k, v, bucket_size=8, **st)
    torch.testing.assert_close(a, ac.attention("reformer", q, torch.zeros_like(k), v, bucket_size=8, **st))
    assert SPEC.supports.shared_qk and ac.MultiHeadAttention(16, 2, "reformer").k_proj is None


def clustered(n: int, D: int, clusters: int, seed: int):
    """Shared q in tight clusters (64 directions, noise 0.1/√D each), |q| = 60 so that softmax puts nearly all of
    a query's weight on its own cluster; v standard normal. (1, 2, n, D) each."""
    g = torch.Generator().manual_seed(seed)
    centers = torch.nn.functional.normalize(torch.randn(clusters, D, generator=g, dtype=torch.float64), dim=-1)
    x = centers[torch.randint(0, clusters, (n,), generator=g)]
    x = x + 0.1 * torch.randn(n, D, generator=g, dtype=torch.float64) / math.sqrt(D)
    q = (60 * torch.nn.functional.normalize(x, dim=-1)).expand(1, 2, n, D).contiguous()
    return q, torch.randn(1, 2, n, D, generator=g, dtype=torch.float64)


def shared_qk_softmax(q: torch.Tensor) -> torch.Tensor:
    """The full attention LSH approximates, written out: softmax over every other token of q_i·q_j/(|q_j|·√D)."""
    scores = q @ torch.nn.functional.normalize(q, dim=-1).transpose(-1, -2) / math.sqrt(q.shape[-1])
    return torch.softmax(scores.masked_fill(torch.eye(q.shape[-2], dtype=torch.bool), -math.inf), dim=-1)


def test_error_falls_as_rounds_find_more_of_each_cluster():
    """n = 512 in 64 clusters, bucket_size 32, mean over 3 seeds. Measured: relative error 0.91, 0.67, 0.49, 0.39
    and softmax mass on the keys found 0.71, 0.83, 0.94, 0.97 for 1, 2, 4, 8 rounds. The error stays above the mass
    missed because a key found in several rounds is counted once per round (see reformer_attention)."""
    errors, found = [], []
    for rounds in (1, 2, 4, 8):
        e, m = [], []
        for seed in range(3):
            q, v = clustered(512, 32, 64, seed)
            softmax = shared_qk_softmax(q)
            params = {"bucket_size": 32, "n_hashes": rounds, "seed": 10 + seed}
            out = ac.attention("reformer", q, torch.zeros_like(q), v, **params)
            e.append(float((out - softmax @ v).norm() / (softmax @ v).norm()))
            weights = ef.effective_attention("reformer", q, q, v, **params).weights
            m.append(float((softmax * (weights > 0)).sum(-1).mean()))
        errors.append(sum(e) / 3)
        found.append(sum(m) / 3)
    assert errors == sorted(errors, reverse=True) and errors[-1] < 0.5 * errors[0], errors
    assert found == sorted(found) and found[-1] > 0.95, found


def test_one_round_with_a_whole_sequence_chunk_is_shared_qk_softmax():
    q, k, v = qkv(30)
    out = ac.attention("reformer", q, k, v, bucket_size=64, n_hashes=1, seed=3)
    torch.testing.assert_close(out, shared_qk_softmax(q) @ v, atol=1e-12, rtol=1e-10)


def test_a_token_attends_to_itself_only_when_it_has_no_other_key():
    q, k, v = qkv(40, H=1)
    params = {"bucket_size": 4, "n_hashes": 2, "seed": 0}
    weights = ef.effective_attention("reformer", q, k, v, causal=True, **params).weights[0, 0]
    others = (weights > 0).sum(-1) - (weights.diagonal() > 0).long()  # keys other than itself a row weighs
    assert others[0] == 0 and weights[0, 0] == 1  # causal: the first token has only itself
    assert (weights.diagonal()[others > 0] == 0).all()
    out = ac.attention("reformer", q, k, v, causal=True, **params)
    torch.testing.assert_close(out[0, 0, 0], v[0, 0, 0])
    # bucket_size 1, one round, not causal: each chunk is one token and also sees the chunk before it, so only the
    # first token in sorted order is alone
    single = ef.effective_attention("reformer", q, k, v, bucket_size=1, n_hashes=1, seed=0).weights[0, 0]
    alone = (single.diagonal() == 1).nonzero().flatten().tolist()
    assert len(alone) == 1 and single.diagonal().sum() == 1
    assert ((single > 0).sum(-1) == torch.where(torch.arange(40) == alone[0], 1, 1)).all()  # one key per row
    out = ac.attention("reformer", q, k, v, bucket_size=1, n_hashes=1, seed=0)
    torch.testing.assert_close(out[0, 0, alone[0]], v[0, 0, alone[0]])


def test_seeded_rotations_reproduce_and_a_new_seed_redraws():
    q, k, v = qkv(64)
    a, b, c = (state(q, seed=s, bucket_size=8)["rotations"] for s in (7, 7, 8))
    torch.testing.assert_close(a, b)
    assert not torch.allclose(a, c)
    drawn_inside = ac.attention("reformer", q, k, v, bucket_size=8, seed=7)
    torch.testing.assert_close(drawn_inside, ac.attention("reformer", q, k, v, bucket_size=8,
                                                          **state(q, seed=7, bucket_size=8)))
    assert not torch.allclose(drawn_inside, ac.attention("reformer", q, k, v, bucket_size=8, seed=8))


@pytest.mark.parametrize("dtype,tol", [(torch.float16, 2e-3), (torch.bfloat16, 1e-2)])
@pytest.mark.parametrize("causal", [False, True])
def test_half_precision_runs_and_matches_float32_on_the_same_rounded_inputs(dtype, tol, causal):
    """Hashing, sorting and the log-sum-exp run in float32, so half inputs give float32's buckets on the same
    (rounded) values and differ only by the final rounding. (From unrounded inputs a token near a bucket boundary
    may hash elsewhere, and its chunk changes: LSH is not continuous.)"""
    q, k, v = (t.to(dtype) for t in qkv(1000, H=2, D=32, dtype=torch.float32))
    st = state(q.float(), causal, bucket_size=32)
    out = ac.attention("reformer", q, k, v, causal=causal, bucket_size=32, **st)
    ref = ac.attention("reformer", q.float(), k.float(), v.float(), causal=causal, bucket_size=32, **st)
    assert out.dtype == dtype and torch.isfinite(out).all()
    assert float((out.float() - ref).norm() / ref.norm()) < tol


def test_wrong_rotations_are_refused_with_the_shape_to_build():
    q, k, v = qkv(64)
    with pytest.raises(ValueError, match=r"rotations must have shape .*\(8, 4, 1\).*init_state"):
        ac.attention("reformer", q, k, v, rotations=torch.randn(8, 4, 3, dtype=torch.float64))
    with pytest.raises(ValueError, match="bucket_size = 0"):
        ac.attention("reformer", q, k, v, bucket_size=0)
    with pytest.raises(ValueError, match="self-attention only"):
        ac.attention("reformer", q, *qkv(32)[1:])


@pytest.mark.parametrize("causal", [False, True])
def test_no_quadratic_tensor_at_16k_tokens(causal):
    """n = 16384, B = H = 1, D = 64, defaults: the traced peak is the spec's prediction (65 MiB: scores for
    4 rounds × n × 2c, the gathered values and the unnormalised output) and under 10% of one n×n float32 matrix."""
    n = 16384
    q, k, v = qkv(n, H=1, D=64, dtype=torch.float32)
    shape = Shape(1, 1, n, n, 64, dtype="float32", causal=causal)
    st = ac.make_state("reformer", shape)
    with torch.inference_mode():
        peak = trace_peak_bytes(lambda: SPEC.fn(q, k, v, causal=causal, **st))
    assert peak == pytest.approx(SPEC.cost.memory_bytes(shape), rel=0.02)
    assert peak < 0.1 * n * n * 4, peak


def test_flops_by_hand_and_its_own_theory_curve_is_n_log_n():
    """n = 8, D = 1, bucket_size 8, one round: 2 buckets (one rotation column: x·[R; −R] is 2 products of 2 FLOPs
    each per token, 32), the sort 8·log₂ 8 = 24, one chunk of 8 × 8 cells at 4·D each (256; causal: half)."""
    assert SPEC.cost.flops(Shape(1, 1, 8, 8, 1), bucket_size=8, n_hashes=1) == 32 + 24 + 256
    assert SPEC.cost.flops(Shape(1, 1, 8, 8, 1, causal=True), bucket_size=8, n_hashes=1) == 32 + 24 + 128
    from tests.engine.test_analysis import frame

    def flops(n):
        return SPEC.cost.flops(Shape(1, 8, n, n, 64), **SPEC.defaults)

    curves = theory_curves(frame({"reformer": lambda n: 3e-11 * flops(n)}), "time_median_s")
    own = curves[curves["kind"] == "spec"]
    assert set(own["curve"]) == {"O(n·log n) fit"}
    assert own.set_index("n")["value"][1024] == pytest.approx(3e-11 * flops(1024), rel=1e-9)
