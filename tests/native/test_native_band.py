"""Banded attention in C++ (attn_core/native/band.cpp) against attention written here in float64 from the pattern's
predicate: the sliding window and block-local, causal and not, shared key/value heads, head widths of one to eight
vectors, blocks that are not a multiple of the lanes, on 1 to 3 threads; the ends of the sequence against the keys
inside it; a NaN key in the rows the flash kernel gives it; the peak bytes the memory model predicts, to the byte;
what it refuses."""
from __future__ import annotations

import math

import pytest
import torch

from attn_core import attention, native
from attn_core.mechanisms import _banded, local, sliding_window
from attn_core.spec import Shape
from tests.baselines import trace_peak_bytes
from tests.native.test_native import built  # noqa: F401  (the fixture)


@pytest.fixture
def band_form(built):  # noqa: F811
    if not native.band_expected():
        pytest.skip(f"the band kernel needs AVX-512 ({native.describe()})")


def dense(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, keep) -> torch.Tensor:
    """softmax(q kᵀ/√D, masked where keep(i, j) is false) v in float64, k and v repeated to q's heads."""
    n, D = q.shape[-2], q.shape[-1]
    i, j = torch.arange(n)[:, None], torch.arange(n)[None, :]
    g = q.shape[1] // k.shape[1]
    k, v = (x.double().repeat_interleave(g, 1) for x in (k, v))
    s = (q.double() @ k.transpose(-1, -2)) / math.sqrt(D)
    return torch.softmax(s.masked_fill(~keep(i, j), -math.inf), -1) @ v


def window(causal: bool, w: int):
    return (lambda i, j: (i - j >= 0) & (i - j <= w)) if causal else (lambda i, j: (i - j).abs() <= w)


def blocks(b: int, back: int, ahead: int, causal: bool):
    def keep(i, j):
        bi, bj = i // b, j // b
        near = (bj >= bi - back) & (bj <= bi + (0 if causal else ahead))
        return near & (j <= i) if causal else near
    return keep


def qkv(B: int, H: int, Hk: int, n: int, D: int, seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    return (torch.randn(B, H, n, D, generator=g), torch.randn(B, Hk, n, D, generator=g),
            torch.randn(B, Hk, n, D, generator=g))


@pytest.mark.usefixtures("band_form")
@pytest.mark.parametrize("B,H,Hk,n,D,w,causal", [
    (1, 2, 2, 700, 64, 64, True), (2, 4, 2, 1000, 32, 100, False), (1, 3, 1, 513, 16, 7, True),
    (1, 2, 2, 1500, 128, 256, True), (1, 1, 1, 300, 48, 33, False), (1, 2, 1, 900, 80, 40, False)])
@pytest.mark.parametrize("threads", [1, 2, 3])
def test_the_sliding_window_through_the_kernel_is_attention_over_its_window(B, H, Hk, n, D, w, causal, threads,
                                                                            monkeypatch):
    monkeypatch.setattr(torch, "get_num_threads", lambda: threads)
    q, k, v = qkv(B, H, Hk, n, D)
    assert _banded.uses_band(q, k, v, w, 0 if causal else w)
    out = attention("sliding_window", q, k, v, causal=causal, window=w)
    assert (out.double() - dense(q, k, v, window(causal, w))).abs().max() < 2e-6


@pytest.mark.usefixtures("band_form")
@pytest.mark.parametrize("b,back,ahead,causal", [(128, 1, 1, False), (64, 2, 0, True), (40, 1, 2, False),
                                                  (7, 3, 1, False), (33, 1, 0, True)])
def test_block_local_through_the_kernel_is_attention_over_its_blocks(b, back, ahead, causal):
    q, k, v = qkv(1, 4, 2, 1000, 32, seed=b)
    out = attention("local", q, k, v, causal=causal, block=b, lookback=back, lookahead=ahead)
    assert (out.double() - dense(q, k, v, blocks(b, back, ahead, causal))).abs().max() < 2e-6


@pytest.mark.usefixtures("band_form")
def test_a_nan_key_reaches_the_rows_that_see_it_as_the_flash_kernel_s_and_no_others(monkeypatch):
    """Inside `validated()` a NaN passes through (the public call refuses it first). Both kernels add the bias to
    every score of a block's window, so a NaN key reaches the rows of each block whose window holds it, those that
    see it among them: rows 288 … 351 (blocks of 32) for key 300 at a window of 50."""
    q, k, v = qkv(1, 2, 2, 600, 32)
    k[0, 1, 300, 5] = math.nan
    with torch.inference_mode():
        ours = torch.isnan(sliding_window.sliding_window_attention(q, k, v, causal=True, window=50)).any(-1)
        monkeypatch.setattr(_banded, "uses_band", lambda *a: False)
        flash = torch.isnan(sliding_window.sliding_window_attention(q, k, v, causal=True, window=50)).any(-1)
    assert torch.equal(ours, flash) and ours[0, 0].sum() == 0
    assert ours[0, 1].nonzero().flatten().tolist() == list(range(288, 352))


@pytest.mark.usefixtures("band_form")
@pytest.mark.parametrize("n", [256, 250, 17, 9])
def test_the_kernel_writes_every_row_the_ends_against_the_keys_inside_the_sequence(n):
    """Blocks of 16 rows, each against the 32 keys before it and its own 16, every key kept: at the start a block's
    window begins before key 0, at the end the last block has what is left of n; only keys in [0, n) count."""
    q, k, v = qkv(1, 2, 2, n, 16)
    out = torch.full_like(q, math.nan)
    native.band(q, k, v, torch.zeros(48, native.band_rows(16)), out, 16, 32)
    keep = lambda i, j: (j >= i // 16 * 16 - 32) & (j < i // 16 * 16 + 16)  # noqa: E731
    assert (out.double() - dense(q, k, v, keep)).abs().max() < 2e-6


@pytest.mark.usefixtures("band_form")
@pytest.mark.parametrize("key,params,causal", [("sliding_window", {}, True), ("sliding_window", {"window": 100}, False),
                                               ("local", {}, False), ("local", {"block": 64}, True)])
@pytest.mark.parametrize("B,H,Hk,n,D", [(2, 3, 3, 3000, 64), (1, 8, 2, 2048, 32)])
def test_the_memory_model_predicts_the_kernel_s_peak_to_the_byte(key, params, causal, B, H, Hk, n, D):
    """The kernel writes the rows in place and holds only its threads' scratch (`band_scratch_bytes`), where the flash
    kernel's call held its output and buffers: the model follows the path."""
    q, k, v = qkv(B, H, Hk, n, D)
    mod = {"sliding_window": sliding_window, "local": local}[key]
    with torch.inference_mode():
        call = lambda: mod.SPEC.fn(q, k, v, causal=causal, **params)  # noqa: E731
        call()
        measured = trace_peak_bytes(call)
    shape = Shape(B, H, n, n, D, dtype="float32", causal=causal, Hk=Hk)
    assert mod.SPEC.cost.memory_bytes(shape, **{**mod.SPEC.defaults, **params}) == measured


@pytest.mark.usefixtures("band_form")
def test_what_the_kernel_would_misread_is_refused_and_the_rest_goes_to_the_flash_kernel():
    q, k, v = qkv(1, 2, 2, 256, 16)
    bias_t = torch.zeros(48, native.band_rows(16))
    out = torch.zeros_like(q)
    with pytest.raises(ValueError, match="holds the block's own"):
        native.band(q, k, v, bias_t, out, 16, 40)  # 40 keys back and 16 of its own: more than the 48 of the bias
    with pytest.raises(ValueError, match="multiple of 16"):
        native.band(q[..., :8], k[..., :8], v[..., :8], bias_t, out[..., :8], 16, 32)
    with pytest.raises(ValueError, match="contiguous"):
        native.band(q, k, v, bias_t, out.transpose(1, 2).contiguous().transpose(1, 2), 16, 32)
    with pytest.raises(ValueError, match="bias"):
        native.band(q, k, v, bias_t[:, :16].contiguous(), out, 16, 32)
    assert not native.band_runs(q.double(), k.double(), v.double())
    assert not native.band_runs(q.requires_grad_(), k, v)
    assert not _banded.uses_band(q.detach(), k, v, 0, 0)  # no window past the block's own keys
