"""The C++ kernel of softmax over selected blocks of keys (attn_core/native/block_softmax.cpp, NSA's selection branch)
against the softmax written here row by row in float64: each row's blocks spelled out as the keys it may read (at or
before its position, before the last key), one selection for every head or one per key/value head, widths on and off
the vector width, rows split into tasks, threads, sinks; NaN and infinities as softmax gives them; refusals."""
from __future__ import annotations

import pytest
import torch

from attn_core import native
from attn_core.mechanisms import _sparse
from tests.native.test_native import built, needs_library  # noqa: F401  (built: the fixture)


def spelled_out(q, k, v, blocks, block, first, sinks=None):
    """Row t of head h (position first + t) over the keys of its listed blocks (a block listed twice, twice) that lie
    at or before it and before m: scores q·k/√D, exp less their highest, a sink's e^(a_h − max) in the sum, over the
    values; a row with no key gives zeros."""
    B, H, r, D = q.shape
    Hk, m, S = k.shape[1], k.shape[2], blocks.shape[1]
    g = H // Hk
    out = torch.zeros(B, H, r, D, dtype=torch.float64)
    for b in range(B):
        for h in range(H):
            s = 0 if S == 1 else h // g
            for t in range(r):
                keys = [j * block + i for j in blocks[b, s, t].tolist() for i in range(block)
                        if j * block + i <= first + t and j * block + i < m]
                if not keys:
                    continue
                logits = k[b, h // g, keys].double() @ q[b, h, t].double() / D ** 0.5
                top = logits.max()
                w = torch.exp(logits - top)
                total = w.sum() + (torch.exp(sinks[h].double() - top) if sinks is not None else 0.0)
                out[b, h, t] = (w / total) @ v[b, h // g, keys].double()
    return out


CASES = [  # B, H, Hk, S, r, m, D, block, nb, first
    (1, 2, 2, 2, 9, 40, 16, 4, 3, 20),  # D two vectors of AVX2 (its two-vector steps of columns)
    (2, 4, 2, 2, 13, 64, 64, 8, 4, 40),  # query heads sharing a key/value head's selection
    (1, 4, 1, 1, 17, 50, 24, 5, 3, 30),  # one key/value head: rows split into tasks; D = 3 vectors, a block of 5
    (1, 2, 2, 1, 6, 33, 12, 7, 2, 10),  # one selection for every head; D off the vector width (plain loops)
    (1, 3, 3, 3, 70, 300, 32, 16, 5, 200),  # rows in groups of four, three, two and one a block
    (1, 1, 1, 1, 5, 90, 200, 64, 2, 60),  # wider than 128, a block longer than the rows
    (1, 2, 2, 2, 40, 256, 64, 64, 4, 216),  # NSA's sizes: blocks of 64, the rows' own block partly visible
]


@needs_library
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64], ids=["float32", "float64"])
@pytest.mark.parametrize("sinks", [False, True], ids=["no sinks", "sinks"])
@pytest.mark.parametrize("B,H,Hk,S,r,m,D,block,nb,first", CASES)
def test_the_block_softmax_is_the_formula(B, H, Hk, S, r, m, D, block, nb, first, dtype, sinks):
    """Random blocks (repeats, blocks past a row, the last block short of a whole one), keys read through a view;
    the row that lists only blocks past it outputs zeros."""
    g = torch.Generator().manual_seed(r * m + nb)
    q = torch.randn(B, H, r, D, generator=g, dtype=dtype)
    k = torch.randn(B, Hk, m + 5, D, generator=g, dtype=dtype)[:, :, 2:m + 2]  # a view: rows in place, offset
    v = torch.randn(B, Hk, m, D, generator=g, dtype=dtype)
    blocks = torch.randint(0, -(-m // block), (B, S, r, nb), generator=g)
    blocks[0, 0, 0] = -(-m // block) - 1  # row 0 lists only the last block, past it
    logits = torch.randn(H, generator=g, dtype=dtype) if sinks else None
    got = native.block_softmax(q, k, v, blocks, block, first, logits)
    want = spelled_out(q, k, v, blocks, block, first, logits)
    torch.testing.assert_close(got.double(), want, rtol=1e-5 if dtype == torch.float32 else 1e-12,
                               atol=1e-6 if dtype == torch.float32 else 1e-12)
    if first + 1 < (-(-m // block) - 1) * block:
        assert not got[0, :H // S if S > 1 else H, 0].any()


@needs_library
@pytest.mark.parametrize("threads", [1, 2, 3])
def test_threads_and_tasks_change_nothing(threads):
    """The same output, bit for bit, on 1, 2 or 3 threads: a row's blocks are folded in the same order whichever
    thread takes its task."""
    g = torch.Generator().manual_seed(5)
    q = torch.randn(2, 4, 33, 64, generator=g)
    k, v = (torch.randn(2, 1, 200, 64, generator=g) for _ in "kv")
    blocks = torch.randint(0, 7, (2, 1, 33, 5), generator=g)
    before = torch.get_num_threads()
    try:
        torch.set_num_threads(1)
        one = native.block_softmax(q, k, v, blocks, 32, 150)
        torch.set_num_threads(threads)
        assert torch.equal(native.block_softmax(q, k, v, blocks, 32, 150), one)
    finally:
        torch.set_num_threads(before)


@needs_library
def test_nan_and_infinities_act_as_softmax_over_them():
    """float32, D = 64, blocks of 8: a NaN key makes every row that reads it NaN, a +inf score too; a −inf score
    drops only its key; other rows equal the float64 formula."""
    g = torch.Generator().manual_seed(3)
    q, k, v = (torch.randn(1, 2, 6, 64, generator=g) for _ in range(3))
    k, v = (torch.cat([x, torch.randn(1, 2, 34, 64, generator=g)], 2) for x in (k, v))  # 40 keys, 5 blocks
    q[0, 1, :, 0] = q[0, 1, :, 0].abs() + 0.5  # head 1's first coordinate positive: an infinite key's score is +inf
    blocks = torch.tensor([[[[0, 2], [1, 2], [0, 4], [3, 4], [1, 3], [2, 4]],
                            [[0, 1], [1, 3], [2, 4], [0, 3], [0, 4], [1, 2]]]])
    k[0, 0, 3, 0] = float("nan")  # head 0, block 0: rows 0 and 2
    k[0, 1, 9, 0] = float("inf")  # head 1, block 1: rows 0, 1 and 5
    k[0, 1, 33, 0] = float("-inf")  # head 1, block 4: rows 2 and 4 (the key dropped only)
    out = native.block_softmax(q, k, v, blocks, 8, 34)
    nan_rows = out.isnan().all(-1)[0].tolist()
    assert nan_rows == [[True, False, True, False, False, False], [True, True, False, False, False, True]]
    assert not (out.isnan().any(-1) & ~out.isnan().all(-1)).any()  # a row is NaN whole or not at all
    k[0, 1, 33, 0] = 0.0
    want = spelled_out(q, k, v, blocks, 8, 34)
    kept = ~out.isnan().all(-1)
    kept[0, 1, 2] = kept[0, 1, 4] = False  # head 1's rows that read the −inf key: checked alone below
    torch.testing.assert_close(out[kept].double(), want[kept], rtol=1e-5, atol=1e-6)
    k[0, 1, 33, 0] = float("-inf")
    for row, listed in ((2, (2, 4)), (4, (0, 4))):  # their keys without key 33
        keys = [j * 8 + i for j in listed for i in range(8) if j * 8 + i != 33 and j * 8 + i <= 34 + row]
        logits = k[0, 1, keys].double() @ q[0, 1, row].double() / 8
        torch.testing.assert_close(out[0, 1, row].double(), torch.softmax(logits, 0) @ v[0, 1, keys].double(),
                                   rtol=1e-5, atol=1e-6)


@needs_library
def test_a_block_outside_the_keys_and_mismatched_shapes_are_refused_with_a_sentence():
    g = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(1, 2, 4, 16, generator=g) for _ in range(3))
    blocks = torch.tensor([[[[0], [1], [0], [1]]]])
    with pytest.raises(ValueError, match=r"selected blocks must lie in 0 … 1 \(4 keys in blocks of 2\), got 1 … 2"):
        native.block_softmax(q, k, v, blocks + 1, 2, 0)
    with pytest.raises(ValueError, match=r"blocks \(1, 1, 3, 1\)"):  # fewer rows of blocks than queries
        native.block_softmax(q, k, v, blocks[:, :, :3], 2, 0)
    with pytest.raises(ValueError, match="a block of at least one key"):
        native.block_softmax(q, k, v, blocks, 0, 0)


@needs_library
def test_the_torch_form_beside_it_gives_the_same():
    """`_sparse.block_softmax` with gradients wanted (the torch form: positions and flags for `selected_softmax`, or
    the gathered form where a row's blocks run past the keys) against the kernel, and its gradients exist."""
    g = torch.Generator().manual_seed(7)
    q = torch.randn(1, 4, 10, 32, generator=g, dtype=torch.float64)
    k, v = (torch.randn(1, 2, 64, 32, generator=g, dtype=torch.float64) for _ in "kv")
    blocks = torch.randint(0, 4, (1, 2, 10, 3), generator=g)
    for m in (64, 61):  # whole blocks, and the last one short (a decoding step inside a block)
        kk, vv = k[:, :, :m], v[:, :, :m]
        want = native.block_softmax(q, kk, vv, blocks, 16, 50)
        qg = q.clone().requires_grad_(True)
        got = _sparse.block_softmax(qg, kk, vv, blocks, 16, 50)
        torch.testing.assert_close(got.detach(), want, rtol=1e-12, atol=1e-12)
        got.sum().backward()
        assert qg.grad is not None and qg.grad.abs().sum() > 0
