"""Linear attention in C++ (attn_core/native/linear.cpp), causal and not, against linear attention written here in
float64 from its formula: shared key/value heads, head widths of one to eight vectors, queries and keys of other
lengths than a step or a block, on 1 to 3 threads, through the kernel and through the public call; heads split from
the model dimension, read in place; a row no key weighs; NaN and −inf where the torch form gives them, and the input
named; the peak bytes the memory model predicts, to the byte; what it refuses and what it leaves to the torch
form; and its AVX2 form, built here apart (8 lanes: head widths of 8, 24 and 40 too)."""
from __future__ import annotations

import ctypes
import math
import subprocess

import pytest
import torch

from attn_core import attention, native
from attn_core.native import signatures
from attn_core.mechanisms._common import validated
from attn_core.mechanisms import linear
from attn_core.spec import Shape
from tests.baselines import trace_peak_bytes
from tests.native.test_native import built  # noqa: F401  (the fixture)


@pytest.fixture
def linear_form(built):  # noqa: F811
    if not native.linear_expected():
        pytest.skip(f"the fused linear kernel needs AVX-512, or AVX2 and FMA ({native.describe()})")


def reference(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, causal: bool = False) -> torch.Tensor:
    """Σ_j φ(q_i)·φ(k_j) v_j / Σ_j φ(q_i)·φ(k_j) in float64 (causal: j ≤ i), φ(x) = x + 1 for x > 0, eˣ otherwise,
    the similarities taken pair by pair (no state), k and v repeated to q's heads."""
    phi = lambda x: torch.where(x > 0, x + 1, torch.exp(x))  # noqa: E731
    g = q.shape[1] // k.shape[1]
    fk, v = phi(k.double()).repeat_interleave(g, 1), v.double().repeat_interleave(g, 1)
    weights = phi(q.double()) @ fk.transpose(-1, -2)  # (B, H, Nq, Nk)
    weights = weights.tril() if causal else weights
    return (weights @ v) / weights.sum(-1, keepdim=True)


def qkv(B: int, H: int, Hk: int, nq: int, nk: int, D: int, seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    return (torch.randn(B, H, nq, D, generator=g), torch.randn(B, Hk, nk, D, generator=g),
            torch.randn(B, Hk, nk, D, generator=g))


SHAPES = [(1, 8, 8, 1000, 1000, 64), (2, 4, 2, 333, 517, 32), (1, 3, 1, 1, 5, 16), (1, 2, 2, 700, 300, 128),
          (1, 2, 1, 64, 64, 80), (3, 2, 2, 257, 1, 48)]


@pytest.mark.usefixtures("linear_form")
@pytest.mark.parametrize("B,H,Hk,nq,nk,D", SHAPES)
@pytest.mark.parametrize("threads", [1, 2, 3])
@pytest.mark.parametrize("streams", [False, True])
def test_the_kernel_is_linear_attention(B, H, Hk, nq, nk, D, threads, streams, monkeypatch):
    """Written the usual way, and past the caches (`linear_streams`, the way an output of half the last-level cache
    or more is written)."""
    monkeypatch.setattr(torch, "get_num_threads", lambda: threads)
    monkeypatch.setattr(native.ops, "linear_streams", lambda out: streams and out.data_ptr() % 64 == 0)
    q, k, v = qkv(B, H, Hk, nq, nk, D)
    out = torch.full_like(q, math.nan)
    assert native.linear(q, k, v, out) is False
    assert (out.double() - reference(q, k, v)).abs().max() < 2e-6


CAUSAL_SHAPES = [(1, 8, 8, 1000, 64), (2, 4, 2, 333, 32), (3, 3, 3, 1, 16), (1, 4, 4, 700, 128), (1, 6, 3, 64, 80),
                 (3, 2, 2, 129, 48)]  # B·Hk ≥ 3: a key/value head for each of up to 3 threads


@pytest.mark.usefixtures("linear_form")
@pytest.mark.parametrize("B,H,Hk,n,D", CAUSAL_SHAPES)
@pytest.mark.parametrize("threads", [1, 3])
@pytest.mark.parametrize("streams", [False, True])
def test_the_causal_kernel_is_causal_linear_attention(B, H, Hk, n, D, threads, streams, monkeypatch):
    """Blocks of 64 positions with a last partial one (or none), shared heads, one to eight vectors a row."""
    monkeypatch.setattr(torch, "get_num_threads", lambda: threads)
    monkeypatch.setattr(native.ops, "linear_streams", lambda out: streams and out.data_ptr() % 64 == 0)
    q, k, v = qkv(B, H, Hk, n, n, D)
    out = torch.full_like(q, math.nan)
    assert native.linear(q, k, v, out, causal=True) is False
    assert (out.double() - reference(q, k, v, causal=True)).abs().max() < 2e-6


@pytest.mark.usefixtures("linear_form")
def test_the_causal_public_call_runs_the_kernel_where_each_thread_has_a_key_value_head(monkeypatch):
    """attention('linear', causal=True) in float32 goes through the kernel where B·Hk ≥ torch's threads; with fewer
    key/value heads (one head's positions run in order on one thread) the torch form's segments run; both are
    causal linear attention, and the memory model follows the path."""
    calls = []
    kernel = native.linear
    monkeypatch.setattr(native, "linear", lambda *a, **kw: calls.append(kw) or kernel(*a, **kw))
    monkeypatch.setattr(torch, "get_num_threads", lambda: 2)
    for Hk, through in ((2, True), (1, False)):
        calls.clear()
        q, k, v = qkv(1, 4, Hk, 300, 300, 32)
        out = attention("linear", q, k, v, causal=True)
        assert (calls == [{"causal": True}]) == through
        assert (out.double() - reference(q, k, v, causal=True)).abs().max() < 2e-6
        with torch.inference_mode():
            peak = trace_peak_bytes(lambda: linear.SPEC.fn(q, k, v, causal=True))
        predicted = linear.SPEC.cost.memory_bytes(Shape(1, 4, 300, 300, 32, dtype="float32", causal=True, Hk=Hk))
        assert predicted == peak
        assert (peak == q.numel() * 4 + native.linear_scratch_bytes(Hk, 4, 300, 300, 32, causal=True)) == through


@pytest.mark.usefixtures("linear_form")
def test_a_causal_nan_reaches_the_rows_after_it_as_in_the_torch_form_and_the_input_is_named(monkeypatch):
    """A NaN key at position 100 (inside the second block of 64): rows 0 … 99 of its head's query heads are clean,
    rows 100 on NaN (the block's later keys are set to 0 before they meet V; the state carries it on), as the torch
    form gives it; a NaN value at the last position reaches no normalizer but the state, so it is reported too."""
    q, k, v = qkv(1, 4, 2, 200, 200, 16)
    k[0, 1, 100, 3] = math.nan
    out = torch.empty_like(q)
    assert native.linear(q, k, v, out, causal=True) is True
    rows = out.isnan().any(-1)
    with validated():
        monkeypatch.setattr(native, "linear_runs", lambda *a, **kw: False)
        assert torch.equal(rows, linear.linear_attention(q, k, v, causal=True).isnan().any(-1))
    monkeypatch.undo()
    assert not rows[0, :2].any() and not rows[0, 2:, :100].any() and rows[0, 2:, 100:].all()
    k[0, 1, 100, 3] = 0.0
    v[0, 0, 199, 0] = math.nan
    assert native.linear(q, k, v, out, causal=True) is True and out[0, :2, 199].isnan().any()
    with pytest.raises(ValueError, match="^v holds 1 NaN"):
        attention("linear", q, k, v, causal=True)


@pytest.mark.usefixtures("linear_form")
def test_only_an_output_on_whole_lines_is_streamed():
    """Non-temporal stores need 64-byte lines: an output of half the last-level cache is streamed where it starts
    on one, and written the usual way (no fault) where a view starts 4 bytes in."""
    from attn_core.mechanisms._cpu import caches

    n = caches().shared // 2 // (4 * 64) + 1
    room = torch.empty(n * 64 + 16)
    aligned, shifted = room[:n * 64].view(1, 1, n, 64), room[1:1 + n * 64].view(1, 1, n, 64)
    assert room.data_ptr() % 64 == 0 and native.ops.linear_streams(aligned)
    assert not native.ops.linear_streams(shifted)
    q, k, v = qkv(1, 1, 1, n, 50, 64)
    native.linear(q, k, v, shifted)
    assert (shifted.double() - reference(q, k, v)).abs().max() < 2e-6


@pytest.mark.usefixtures("linear_form")
@pytest.mark.parametrize("B,H,Hk,nq,nk,D", SHAPES[:3])
def test_the_public_call_runs_the_kernel(B, H, Hk, nq, nk, D, monkeypatch):
    """attention('linear', …) non-causal in float32 goes through the kernel, once, and gives linear attention; where
    gradients are wanted it runs the torch form, with the same result."""
    calls = []
    kernel = native.linear
    monkeypatch.setattr(native, "linear", lambda *a: calls.append(1) or kernel(*a))
    q, k, v = qkv(B, H, Hk, nq, nk, D)
    out = attention("linear", q, k, v)
    assert calls == [1] and (out.double() - reference(q, k, v)).abs().max() < 2e-6
    grads = attention("linear", q.requires_grad_(), k, v)
    assert calls == [1] and (grads.detach().double() - reference(q.detach(), k, v)).abs().max() < 2e-6


@pytest.mark.usefixtures("linear_form")
def test_a_row_no_key_weighs_is_zero_and_is_not_an_error():
    """Keys of −200: every feature e⁻²⁰⁰ underflows to 0 in float32, so no normalizer reaches the smallest normal
    number: every row 0, as the torch form makes it, and no non-finite sum is reported."""
    q, k, v = qkv(1, 2, 2, 100, 70, 32)
    out = torch.full_like(q, math.nan)
    assert native.linear(q, k.fill_(-200.0), v, out) is False
    assert torch.equal(out, torch.zeros_like(out))
    with torch.inference_mode():
        assert torch.equal(attention("linear", q, k, v.double()[..., :32].float()), out)


@pytest.mark.usefixtures("linear_form")
def test_nan_and_minus_inf_give_nan_where_the_torch_form_gives_it_and_the_input_is_named(monkeypatch):
    """A NaN key reaches every row of its head's query heads (through the sums over keys), −inf in a query its own
    row (φ(−inf) = e^−inf + (−inf − (−inf)) is NaN), in both forms; the kernel reports them and the public call names
    the tensor."""
    q, k, v = qkv(1, 4, 2, 90, 80, 16)
    k[0, 1, 7, 3], q[0, 0, 11, 5] = math.nan, -math.inf
    out = torch.empty_like(q)
    assert native.linear(q, k, v, out) is True
    nan_rows = out.isnan().any(-1)
    with validated():
        monkeypatch.setattr(native, "linear_runs", lambda *a: False)
        torch_rows = linear.linear_attention(q, k, v).isnan().any(-1)
    assert torch.equal(nan_rows, torch_rows)
    assert nan_rows[0, 2:].all() and nan_rows[0, :2].sum() == 1 and nan_rows[0, 0, 11]
    monkeypatch.undo()
    with pytest.raises(ValueError, match="^q holds 0 NaN and 1 infinite"):
        attention("linear", q, k, v)


@pytest.mark.usefixtures("linear_form")
@pytest.mark.parametrize("B,H,Hk,n,D", [(1, 8, 8, 4096, 64), (2, 4, 2, 1500, 32), (1, 3, 1, 700, 128)])
def test_the_memory_model_predicts_the_kernel_s_peak_to_the_byte(B, H, Hk, n, D):
    """The kernel holds the output and its scratch (`linear_scratch_bytes`: each share's state, a step's φ a thread),
    where the torch form held a group's φ and its products: the model follows the path."""
    q, k, v = qkv(B, H, Hk, n, n, D)
    with torch.inference_mode():
        call = lambda: linear.SPEC.fn(q, k, v)  # noqa: E731
        call()
        measured = trace_peak_bytes(call)
    assert linear.SPEC.cost.memory_bytes(Shape(B, H, n, n, D, dtype="float32", Hk=Hk)) == measured
    assert measured == B * H * n * D * 4 + native.linear_scratch_bytes(B * Hk, B * H, n, n, D)


@pytest.mark.usefixtures("linear_form")
def test_what_the_kernel_would_misread_is_refused_and_the_rest_goes_to_the_torch_form():
    q, k, v = qkv(1, 4, 2, 40, 30, 16)
    out = torch.zeros_like(q)
    lanes = native.linear_lanes()  # 16 with AVX-512, 8 with AVX2
    with pytest.raises(ValueError, match=f"multiple of {lanes}"):
        native.linear(q[..., :lanes // 2], k[..., :lanes // 2], v[..., :lanes // 2], out[..., :lanes // 2])
    with pytest.raises(ValueError, match="contiguous float32 output"):
        native.linear(q, k, v, out.transpose(1, 2).contiguous().transpose(1, 2))
    with pytest.raises(ValueError, match="Hk dividing H"):
        native.linear(q[:, :3], k, v, out[:, :3].contiguous())
    with pytest.raises(ValueError, match="at least one key"):
        native.linear(q, k[:, :, :0], v[:, :, :0], out)
    assert not native.linear_runs(q.double(), k.double(), v.double())
    assert not native.linear_runs(q.requires_grad_(), k, v)
    assert not native.linear_runs(q.transpose(-1, -2), k, v)  # a position's numbers apart
    with pytest.raises(ValueError, match="as many as queries"):
        native.linear(q, k, v, out, causal=True)  # 40 queries, 30 keys


@pytest.mark.usefixtures("linear_form")
def test_heads_split_from_the_model_dimension_are_read_where_they_lie():
    """q, k, v as MultiHeadAttention makes them, (B, N, H·D) seen as (B, H, N, D): the kernel takes them uncopied
    (the peak is the output and the scratch) and gives linear attention."""
    g = torch.Generator().manual_seed(3)
    q, k, v = (torch.randn(2, 300, H * 32, generator=g).view(2, 300, H, 32).transpose(1, 2) for H in (4, 2, 2))
    assert native.linear_runs(q, k, v) and not q.is_contiguous()
    with torch.inference_mode():
        peak = trace_peak_bytes(lambda: linear.SPEC.fn(q, k, v))
        out = linear.SPEC.fn(q, k, v)
    assert peak == q.numel() * 4 + native.linear_scratch_bytes(4, 8, 300, 300, 32)
    assert (out.double() - reference(q, k, v)).abs().max() < 2e-6


@pytest.fixture(scope="module")
def avx2_library(tmp_path_factory):
    """linear.cpp alone, built for AVX2 and FMA (-march=haswell: the vector form of machines without AVX-512, 8 lanes,
    tiles of three rows by three vectors), loaded apart from the project's library."""
    cxx = native.compiler()
    if cxx is None:
        pytest.skip("no C++ compiler here (set CXX to one)")
    with open("/proc/cpuinfo", encoding="utf-8") as f:
        flags = next((line.split() for line in f if line.startswith("flags")), [])
    if not {"avx2", "fma"} <= set(flags):
        pytest.skip("this CPU runs no AVX2 code")
    folder = tmp_path_factory.mktemp("avx2")
    (folder / "signatures.h").write_text(signatures.header())
    target = folder / "linear_avx2.so"
    subprocess.run([cxx, "-O3", "-std=c++17", "-shared", "-fPIC", "-march=haswell", "-fopenmp", f"-I{folder}",
                    str(native.HERE / "linear.cpp"), "-o", str(target)], check=True, capture_output=True, timeout=300)
    lib = ctypes.CDLL(str(target))
    signatures.bind(lib, (signatures.LINEAR, signatures.LINEAR_CAUSAL, signatures.LINEAR_AVAILABLE))
    return lib


@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("B,H,Hk,n,D", [(1, 4, 4, 300, 64), (2, 4, 2, 129, 24), (1, 3, 3, 70, 8), (1, 2, 2, 200, 40)])
@pytest.mark.parametrize("streams", [False, True])
def test_the_avx2_form_is_linear_attention(avx2_library, causal, B, H, Hk, n, D, streams, monkeypatch):
    """Its lanes are 8, so head widths of 8, 24 and 40 go through it too (AVX-512 takes multiples of 16)."""
    assert avx2_library.attn_linear_available() == 8
    monkeypatch.setattr(native.ops, "_kernels", lambda: avx2_library)
    monkeypatch.setattr(native.ops, "linear_lanes", lambda: 8)
    monkeypatch.setattr(native.ops, "linear_streams", lambda out: streams and out.data_ptr() % 64 == 0)
    monkeypatch.setattr(torch, "get_num_threads", lambda: 2)
    q, k, v = qkv(B, H, Hk, n, n, D)
    out = torch.full_like(q, math.nan)
    assert native.linear(q, k, v, out, causal=causal) is False
    assert (out.double() - reference(q, k, v, causal)).abs().max() < 2e-6
    k[0, 0, n // 2, 0] = math.nan
    assert native.linear(q, k, v, out, causal=causal) is True
