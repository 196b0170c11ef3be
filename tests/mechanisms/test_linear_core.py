"""The cache-blocked kernel of linear attention and Performer across many chunks, against the explicit O(n²) forms of
tests/baselines.py (float64, the features as the papers write them, no stabiliser)."""
from __future__ import annotations

import pytest
import torch

import attn_core as ac
from attn_core import native
from attn_core.mechanisms import _linear_core as core
from attn_core.mechanisms import linear, performer
from tests.baselines import elu_plus_one, kernel_attention, positive_random_features

SMALL_CHUNKS = 4096  # bytes: chunks of MIN_ROWS = 64 rows at these shapes, so n = 300 runs in five of them


@pytest.fixture
def small_chunks(monkeypatch):
    monkeypatch.setattr(core, "CHUNK_BYTES", SMALL_CHUNKS)


def qkv(nq: int, nk: int | None = None, *, B: int = 1, H: int = 2, D: int = 16, dtype=torch.float32, seed: int = 0,
        grad: bool = False):
    g = torch.Generator().manual_seed(seed)
    shapes = [(B, H, nq, D), (B, H, nk or nq, D), (B, H, nk or nq, D)]
    return [torch.randn(s, generator=g, dtype=torch.float64).to(dtype).requires_grad_(grad) for s in shapes]


def explicit(key: str, q, k, v, causal: bool, projection=None) -> torch.Tensor:
    if key == "performer":
        return kernel_attention(positive_random_features(q, projection), positive_random_features(k, projection), v,
                                causal)
    return kernel_attention(elu_plus_one(q), elu_plus_one(k), v, causal)


def call(key: str, q, k, v, causal: bool):
    """The mechanism's output and its projection (Performer, 64 features; None for linear)."""
    if key == "linear":
        return ac.attention("linear", q, k, v, causal=causal), None
    w = performer.orthogonal_features(64, q.shape[-1], seed=3, dtype=q.dtype)
    return ac.attention("performer", q, k, v, causal=causal, features=64, projection=w), w


def test_small_chunks_split_the_sequence(small_chunks):
    """The tests below run in several chunks (and causal, a remainder block): else they would test nothing new."""
    assert core.chunk_rows(2, 300, 16, 16, False) == 64 and core.chunk_rows(2, 300, 64, 16, True) == 64
    chunks = core.causal_chunks(300, 64, 32)
    assert chunks[0] == (0, 64, 32) and chunks[-2:] == [(256, 288, 32), (288, 300, 12)]
    assert [s for s, _, _ in chunks[1:]] == [e for _, e, _ in chunks[:-1]]  # contiguous, from 0 to n


@pytest.mark.parametrize("key", ["linear", "performer"])
@pytest.mark.parametrize("causal", [False, True])
def test_chunked_kernel_equals_the_explicit_form(small_chunks, key, causal):
    q, k, v = qkv(300)
    out, w = call(key, q, k, v, causal)
    torch.testing.assert_close(out.double(), explicit(key, q, k, v, causal, w), atol=1e-5, rtol=1e-4)


@pytest.mark.parametrize("key", ["linear", "performer"])
def test_chunked_cross_attention_equals_the_explicit_form(small_chunks, key):
    q, k, v = qkv(70, 300, B=2)
    out, w = call(key, q, k, v, False)
    torch.testing.assert_close(out.double(), explicit(key, q, k, v, False, w), atol=1e-5, rtol=1e-4)


@pytest.mark.parametrize("causal", [False, True])
def test_performer_key_maximum_growing_chunk_by_chunk_is_rescaled_exactly(small_chunks, causal):
    """Keys growing from short along the sequence: each chunk's largest exponent max_m w·k' − |k'|²/2 exceeds the ones
    before, so the sums of earlier chunks are rescaled at every chunk; the result still equals the unstabilised
    float64 form."""
    q, k, v = qkv(300)
    k = k * torch.linspace(0.01, 0.5, 300, dtype=k.dtype)[:, None]
    w = performer.orthogonal_features(64, 16, seed=3)
    tops = [performer.key_features(k[:, :, s:s + 64], performer.base2(w), None)[1] for s in range(0, 300, 64)]
    assert all((b > a).all() for a, b in zip(tops, tops[1:]))
    out = ac.attention("performer", q, k, v, causal=causal, features=64, projection=w)
    torch.testing.assert_close(out.double(), explicit("performer", q, k, v, causal, w), atol=1e-5, rtol=1e-4)


def test_performer_huge_keys_keep_only_the_shortest_key_in_the_last_chunk(small_chunks):
    """k × 10³⁰, not causal, the shortest key at position 290 (the fifth chunk): the earlier chunks' sums are
    rescaled by 2^(−10⁶⁰) = 0 and every query returns that key's value."""
    q, k, v = qkv(300)
    k[:, :, 290] *= 0.01
    out = ac.attention("performer", q, k * 1e30, v, features=32)
    torch.testing.assert_close(out, v[:, :, 290:291].expand_as(out), atol=1e-6, rtol=1e-6)


@pytest.mark.parametrize("key", ["linear", "performer"])
@pytest.mark.parametrize("causal", [False, True])
def test_chunked_gradients_match_the_explicit_form(small_chunks, key, causal):
    q, k, v = qkv(150, D=8, dtype=torch.float64, grad=True)
    out, w = call(key, q, k, v, causal)
    got = torch.autograd.grad(out.pow(2).sum(), (q, k, v))
    want = torch.autograd.grad(explicit(key, q, k, v, causal, w).pow(2).sum(), (q, k, v))
    for a, b in zip(got, want):
        torch.testing.assert_close(a, b, atol=1e-8, rtol=1e-6)


@pytest.mark.parametrize("key", ["linear", "performer"])
def test_float32_gradients_flow_through_the_chunks(small_chunks, key):
    """float32 inputs take other paths than float64 (Performer's key norms); backward must not trip on a tensor
    changed in place, and must agree with float64."""
    q, k, v = qkv(150, D=8, grad=True)
    out, w = call(key, q, k, v, True)
    got = torch.autograd.grad(out.pow(2).sum(), (q, k, v))
    want = torch.autograd.grad(explicit(key, q, k, v, True, w).pow(2).sum(), (q, k, v))
    for a, b in zip(got, want):
        torch.testing.assert_close(a, b, atol=1e-4, rtol=1e-3)


@pytest.mark.parametrize("key", ["linear", "performer"])
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("dtype,bound", [(torch.float16, 0.005), (torch.bfloat16, 0.02)])
def test_chunked_half_precision_stays_near_float64(small_chunks, key, causal, dtype, bound):
    """Each chunk mapped and summed in float32, written back in half precision: max abs error against the float64
    explicit form of the same rounded inputs within the bounds of tests/engine/test_hardening_library.py."""
    q, k, v = qkv(300, dtype=dtype)
    out, w = call(key, q, k, v, causal)
    assert out.dtype == dtype
    assert (out.double() - explicit(key, q, k, v, causal, w)).abs().max().item() <= bound


def test_linear_feature_map_has_the_derivative_of_elu_plus_one_at_zero_too():
    x = torch.tensor([-30.0, -2.0, -0.0, 0.0, 1e-30, 0.5, 30.0], dtype=torch.float64, requires_grad=True)
    got, = torch.autograd.grad(linear.feature_map(x).sum(), x)
    want, = torch.autograd.grad(elu_plus_one(x).sum(), x)
    torch.testing.assert_close(got, want)


@pytest.mark.parametrize("causal", [False, True])
def test_executed_flops_cover_the_useful_ones(causal):
    for n, m, d in [(1, 16, 16), (300, 64, 16), (3000, 256, 40), (8192, 64, 64)]:
        for kv_heads in (8, 2, 1):
            s = ac.Shape(1, 8, n, n, d, causal=causal, Hk=kv_heads)
            useful = core.linear_core_flops(s, m)
            assert core.linear_core_flops(s, m, executed=True) >= useful > 0


def by_hand(t: torch.Tensor, heads: int) -> torch.Tensor:
    """(B, Hk, n, D) → (B, H, n, D): query head i reads key/value head ⌊i·Hk/H⌋, a loop over heads."""
    return torch.stack([t[:, i * t.shape[1] // heads] for i in range(heads)], dim=1)


@pytest.mark.parametrize("key", ["linear", "performer"])
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("kv_heads", [1, 2])
def test_shared_heads_across_chunks_equal_the_explicit_form_of_repeated_heads(small_chunks, key, causal, kv_heads):
    """Four query heads reading one or two key/value heads over five chunks and a remainder block (the query heads of
    a group stacked as a block's rows, each masked j ≤ i at its own positions): the explicit form with each query
    head given its keys and values."""
    q, _, _ = qkv(300, H=4, dtype=torch.float64)
    _, k, v = qkv(300, H=kv_heads, dtype=torch.float64, seed=1)
    out, w = call(key, q, k, v, causal)
    torch.testing.assert_close(out, explicit(key, q, by_hand(k, 4), by_hand(v, 4), causal, w), atol=1e-10,
                               rtol=1e-8)


@pytest.mark.parametrize("key", ["linear", "performer"])
@pytest.mark.parametrize("causal", [False, True])
def test_shared_heads_gradients_across_chunks(small_chunks, key, causal):
    q = qkv(150, H=4, D=8, dtype=torch.float64, grad=True)[0]
    k, v = qkv(150, H=2, D=8, dtype=torch.float64, seed=1, grad=True)[1:]
    out, w = call(key, q, k, v, causal)
    got = torch.autograd.grad(out.pow(2).sum(), (q, k, v))
    want = torch.autograd.grad(explicit(key, q, by_hand(k, 4), by_hand(v, 4), causal, w).pow(2).sum(), (q, k, v))
    for a, b in zip(got, want):
        torch.testing.assert_close(a, b, atol=1e-8, rtol=1e-6)


@pytest.mark.parametrize("causal", [False, True])
def test_performer_stabilizer_is_per_key_value_head(small_chunks, causal):
    """Two key/value heads of very different lengths (× 1 and × 30): each keeps a stabilizer of its own, so the
    short head's features do not underflow against the long head's maximum; float32, against float64 explicit."""
    q, _, _ = qkv(300, H=4)
    _, k, v = qkv(300, H=2, seed=1)
    k = k * torch.tensor([1.0, 30.0])[:, None, None]
    out, w = call("performer", q, k, v, causal)
    assert torch.isfinite(out).all()
    want = explicit("performer", q.double(), by_hand(k, 4).double(), by_hand(v, 4).double(), causal, w)
    torch.testing.assert_close(out[:, :2].double(), want[:, :2], atol=1e-5, rtol=1e-4)


@pytest.mark.parametrize("key", ["linear", "performer"])
def test_shared_heads_in_half_precision_stay_near_float64(small_chunks, key):
    q, _, _ = qkv(300, H=4, dtype=torch.bfloat16)
    _, k, v = qkv(300, H=2, dtype=torch.bfloat16, seed=1)
    for causal in (False, True):
        out, w = call(key, q, k, v, causal)
        assert out.dtype == torch.bfloat16
        want = explicit(key, q, by_hand(k, 4), by_hand(v, 4), causal, w)
        assert (out.double() - want).abs().max().item() <= 0.02


@pytest.mark.parametrize("key", ["linear", "performer"])
@pytest.mark.parametrize("causal", [False, True])
def test_shared_heads_cost_less_than_multi_head(key, causal):
    """The key side is made once per key/value head: fewer FLOPs (useful and executed), less memory and a smaller
    generation state with Hk = 2 of H = 8; the same memory where linear attention's causal C++ kernel runs (it holds
    the output and a thread's scratch, nothing a head: `native.linear_scratch_bytes`)."""
    spec = ac.get(key)
    mha, gqa = ac.Shape(1, 8, 4096, 4096, 64, causal=causal), ac.Shape(1, 8, 4096, 4096, 64, causal=causal, Hk=2)
    for cost in (spec.cost.flops, spec.cost.executed_flops):
        assert cost(gqa) < cost(mha)
    fused = key == "linear" and causal and native.linear_expected() and 2 >= torch.get_num_threads()
    assert spec.cost.memory_bytes(gqa) == spec.cost.memory_bytes(mha) if fused else \
        spec.cost.memory_bytes(gqa) < spec.cost.memory_bytes(mha)
    assert 4 * spec.supports.generation.cache_bytes(gqa) == spec.supports.generation.cache_bytes(mha)
    assert spec.supports.generation.step_flops(gqa) < spec.supports.generation.step_flops(mha)


@pytest.mark.parametrize("key", ["linear", "performer"])
@pytest.mark.parametrize("causal", [False, True])
def test_heads_split_from_the_model_dimension_are_not_copied_whole(small_chunks, key, causal):
    """q, k, v as MultiHeadAttention makes them, (B, N, H, D) seen as (B, H, N, D): the same output as contiguous
    input, and only chunks are copied (a whole copy of q, k or v would lift the peak by its size)."""
    from tests.baselines import trace_peak_bytes

    B, H, n, D = 2, 2, 300, 16
    g = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(B, n, H, D, generator=g).transpose(1, 2) for _ in range(3))
    out, w = call(key, q, k, v, causal)
    torch.testing.assert_close(out, call(key, *(x.contiguous() for x in (q, k, v)), causal)[0])
    state = {"features": 64, "projection": w} if key == "performer" else {}
    shape = ac.Shape.of(q, k, causal)
    with torch.inference_mode():
        peak = trace_peak_bytes(lambda: ac.get(key).fn(q, k, v, causal=causal, **state))
    predicted = ac.get(key).cost.memory_bytes(shape, **({"features": 64} if w is not None else {}))
    assert peak < predicted + q.numel() * 4 / 2


@pytest.mark.parametrize("groups", ["one", "several"])
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("kv_heads,split", [(2, False), (1, False), (2, True)])
def test_whole_tensor_form_equals_the_chunks(small_chunks, monkeypatch, causal, kv_heads, split, groups):
    """`elu_attention` (few large operations) against the cache-blocked chunks it stands in for and the explicit
    kernel form, float64, with a last partial block (n = 300, blocks of 16) and shared or split heads; in one group
    of heads or, with GROUP_BYTES at 4 KiB, a key/value head a group and φ a head at a time (several groups, within
    each batch element where heads are split), and causal in one segment or, with WHOLE_BYTES at 128 KiB, segments
    of 64 positions (the state carried from one to the next, the last with 44 positions: 2 blocks and 12 more); a
    call that fits takes it."""
    if groups == "several":
        monkeypatch.setattr(core, "GROUP_BYTES", 1 << 12)
        assert core.group_heads(2 * kv_heads, 4 // kv_heads * 300, 16, 8, False) == 1
        monkeypatch.setattr(core, "WHOLE_BYTES", 1 << 17)
        assert core.segment_rows(2 * 4, 300, 16) == 64
    g = torch.Generator().manual_seed(2)
    if split:
        q, k, v = (torch.randn(2, 300, h, 16, generator=g, dtype=torch.float64).transpose(1, 2) for h in (2, 2, 2))
    else:
        q, k, v = (torch.randn(2, h, 300, 16, generator=g, dtype=torch.float64) for h in (4, kv_heads, kv_heads))
    whole = core.elu_attention(q, k, v, causal)
    chunked = core.linear_attention_core(q, k, v, causal, linear.feature_map, linear._key_map, 16)
    torch.testing.assert_close(whole, chunked, atol=1e-12, rtol=1e-10)
    shared = q.shape[1] // k.shape[1]  # the query heads of a key/value head, written out for the explicit form
    explicit_form = kernel_attention(elu_plus_one(q), elu_plus_one(k.repeat_interleave(shared, 1)),
                                     v.repeat_interleave(shared, 1), causal)
    torch.testing.assert_close(whole, explicit_form, atol=1e-12, rtol=1e-10)
    assert core.whole_ready(q, k, v, causal)
    assert not core.whole_ready(q.float().requires_grad_(), k.float(), v.float(), causal)
    assert not core.whole_ready(*(x.half() for x in (q, k, v)), causal)
    rows = core.WHOLE_BYTES // (8 * 64 * 4)  # B·H = 8 heads of D = 64 float32 numbers a row fill the limit
    assert core.whole_fits(8, 64 * rows, 64, False) and core.whole_fits(8, 64 * rows, 64, True)  # a CPU: any length
    assert core.whole_fits(8, rows, 64, True, "cuda") and not core.whole_fits(8, rows + 1, 64, False, "cuda")


def test_whole_tensor_form_zeroes_a_query_whose_features_underflow():
    """elu(−10⁴) + 1 = 0 in every feature: the normalizer is 0, the output row 0 (not NaN), the others untouched."""
    q, k, v = qkv(70, D=8)
    q[0, 1, 5] = -1e4
    for causal in (False, True):
        out = core.elu_attention(q, k, v, causal)
        assert torch.equal(out[0, 1, 5], torch.zeros(8)) and out.isfinite().all()
        torch.testing.assert_close(out[0, 0], explicit("linear", q, k, v, causal)[0, 0].float(), atol=1e-5, rtol=1e-4)


@pytest.mark.parametrize("n, rows, c", [(1, 1, 1), (7, 3, 2), (100, 32, 64), (1000, 96, 64), (4097, 512, 64),
                                        (5000, 600, 7), (64, 64, 64)])
def test_chunk_kinds_counts_what_the_kernel_loops_over(n, rows, c):
    listed: dict[tuple[int, int], int] = {}
    for s, e, b in core.causal_chunks(n, rows, c):  # what linear_attention_core iterates, chunk by chunk
        listed[(e - s, b)] = listed.get((e - s, b), 0) + 1
    assert core.chunk_kinds(n, rows, c) == listed
    assert sum(k * count for (k, _), count in listed.items()) == n


def test_the_causal_cost_models_take_no_list_of_chunks_at_a_trillion_tokens(monkeypatch):
    """Theory and the planner ask the models at n up to 2**40: counted, not listed (a list of 2**40 / rows chunks
    took the Theory page 33 s)."""
    monkeypatch.setattr(core, "causal_chunks", lambda *a: pytest.fail("the cost model listed the chunks"))
    s = ac.Shape(B=1, H=8, Nq=2**40, Nk=2**40, D=64, causal=True)
    cost = linear.SPEC.cost
    assert cost.memory_bytes(s) > 0 and cost.executed(s) >= cost.flops(s) > 0


@pytest.mark.parametrize("causal", [False, True])
def test_a_half_precision_projection_is_held_once_in_float32(causal):
    """Performer in bfloat16 with its state's bfloat16 projection: the float32 copy goes once it is scaled to base 2,
    so the allocator's peak is the spec's (a copy held through the call is 256·40·4 = 41 kB, 3% of this peak)."""
    from tests.baselines import trace_peak_bytes

    shape = ac.Shape(2, 3, 1000, 1000, 40, dtype="bfloat16", causal=causal)
    q, k, v = qkv(1000, B=2, H=3, D=40, dtype=torch.bfloat16)
    state = ac.make_state("performer", shape, dtype=torch.bfloat16)
    assert state["projection"].dtype == torch.bfloat16
    with torch.inference_mode():
        call = lambda: ac.attention("performer", q, k, v, causal=causal, **state)  # noqa: E731
        call()
        measured = trace_peak_bytes(call)
    assert performer.SPEC.cost.memory_bytes(shape) == pytest.approx(measured, rel=0.01)


@pytest.mark.parametrize("causal", [False, True])
def test_the_whole_forms_memory_is_the_allocators_in_segments_too(monkeypatch, causal):
    """float32, B = 1, H = 4, n = 1000, D = 32 (blocks of 32) with WHOLE_BYTES at 256 KiB: causal segments of 128
    positions (a quarter of it), the state of the ones before carried beside each, the last of 104 (3 blocks and 8
    more); the spec's peak is the allocator's."""
    from tests.baselines import trace_peak_bytes

    monkeypatch.setattr(core, "WHOLE_BYTES", 1 << 18)
    assert core.segment_rows(4, 1000, 32) == 128 and core.segment_rows(4, 512, 32) == 512  # 512 fill it: one
    q, k, v = qkv(1000, H=4, D=32)
    with torch.inference_mode():
        call = lambda: linear.SPEC.fn(q, k, v, causal=causal)  # noqa: E731
        call()
        measured = trace_peak_bytes(call)
    assert linear.SPEC.cost.memory_bytes(ac.Shape(1, 4, 1000, 1000, 32, causal=causal)) == pytest.approx(measured,
                                                                                                        rel=0.005)
