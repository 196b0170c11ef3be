"""The C++ kernels (attn_core/native): the top-k selection against a stable sort written here, row by row in float64
(descending score, ties to the earlier key, the first kk, their positions sorted), and against the torch forms it
stands beside; the build's cache, its refusals, and the torch form where no library can be built. The kernels are
built explicitly (`built`: a forward call never builds); tests/native/test_native_ops.py checks them as torch operators,
tests/native/test_native_cache.py the cache's refusals and the build's process handling."""
from __future__ import annotations

import subprocess
import sys

import pytest
import torch

import attn_core as ac
from attn_core import native
from attn_core.native import loader, ops, toolchain
from attn_core.engine import env
from attn_core.mechanisms import _cpu, _sparse
from attn_core.mechanisms import topk as tk
from attn_core.spec import Shape



def kernels() -> None:
    """The kernels built for this test session (`native.build`, into the session's cache: a forward call never
    builds), or a skip naming what is missing; a build that fails where a compiler is there fails the test."""
    if not native.enabled():
        pytest.skip(f"the C++ kernels are switched off here ({native.describe()})")
    if native.compiler() is None:
        pytest.skip("no C++ compiler here (set CXX to one)")
    native.build()


@pytest.fixture
def built():
    """`kernels`, as a fixture (other test modules import it: tests/mechanisms/test_topk.py)."""
    kernels()


needs_library = pytest.mark.usefixtures("built")


@pytest.fixture(scope="module")
def with_kernels():
    """The C++ kernels built where a compiler is, skipping nothing: a module's CPU calls then run them (as after
    `python -m attn_core native build`), and its torch forms where none is (tests/mechanisms/test_topk.py, tests/mechanisms/test_nsa.py)."""
    if native.enabled() and native.compiler() is not None:
        native.build()
NEG, POS = float("-inf"), float("inf")


def stable_top(scores: torch.Tensor, kk: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Each row's kk highest scores by stable sorts (ties: the earlier key first, −inf ones included; a NaN below
    every number), their positions increasing; usable where the score is above −inf."""
    rows = scores.double().reshape(-1, scores.shape[-1])
    picked = []
    for row in rows:
        nan = row.isnan()
        by_value = torch.sort(row.masked_fill(nan, NEG), descending=True, stable=True).indices
        order = by_value[torch.sort(nan[by_value].to(torch.int8), stable=True).indices]  # numbers first, then NaN
        picked.append(order[:kk].sort().values)
    idx = torch.stack(picked).view(*scores.shape[:-1], kk)
    return idx, scores.double().gather(-1, idx) > NEG


def scores_of(kind: str, rows: int, m: int, dtype: torch.dtype, seed: int) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(rows, m, generator=g, dtype=torch.float64)
    if kind == "ties":  # a few values only: long runs of equal scores at every threshold
        x = x.mul(3).round()
    elif kind == "relu":  # most of a row at zero, as a ReLU indexer's heads give
        x = x.relu()
    elif kind == "masked":  # every other row −inf past its first third: fewer finite scores than kk
        x[::2, m // 3:] = NEG
    elif kind == "signed zeros":  # −0 and +0 compare equal: one tie
        x = torch.where(torch.rand(rows, m, generator=g) < 0.3, torch.tensor(-0.0, dtype=x.dtype), x.relu())
    elif kind == "infinite":
        x[:, ::7] = POS
        x[:, 3::11] = NEG
    elif kind == "all masked":
        x[:] = NEG
    elif kind == "nan":  # outside select's contract (it sends such rows to the exact torch form): still kk a row
        x[:, ::5] = float("nan")
        x[::2, 1::3] = NEG
    return x.to(dtype)


KINDS = ["gaussian", "ties", "relu", "masked", "signed zeros", "infinite", "all masked", "nan"]


@needs_library
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64], ids=["float32", "float64"])
@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("m,kk", [(1, 1), (17, 5), (16, 16), (100, 99), (333, 40), (4096, 512), (5003, 7),
                                  (9001, 2048), (2048, 512)])
def test_the_selection_is_a_stable_sorts(m, kk, kind, dtype):
    """Short rows (the whole row searched) and long ones (4·kk ≤ m: a sample's bounds, then a band), lengths that
    are and are not multiples of the vector width, kk of one, of every key and between; the same indices and
    flags as the stable sort."""
    scores = scores_of(kind, 6, m, dtype, seed=m + kk)
    got = native.select(scores, kk)
    want = stable_top(scores, kk)
    assert got[0].dtype == torch.long and got[1].dtype == torch.bool
    assert torch.equal(got[0], want[0]) and torch.equal(got[1], want[1])


@needs_library
@pytest.mark.parametrize("kind", ["gaussian", "ties", "relu"])
def test_the_selection_is_the_torch_forms(kind, monkeypatch):
    """The C++ form against `_select_exact` and `_select_sampled` (the forms the GPU runs) on indexer-sized rows:
    the same indices and flags (rows whose scores are all finite: there the torch forms' choice is defined)."""
    scores = scores_of(kind, 40, 16384, torch.float32, seed=5).view(2, 20, -1)
    got = native.select(scores, 2048)
    exact = tk._select_exact(scores.clone(), 2048)
    assert torch.equal(got[0], exact[0]) and torch.equal(got[1], exact[1])
    sampled = tk._select_sampled(scores.clone(), 2048)
    if sampled is not None:
        assert torch.equal(got[0], sampled[0]) and torch.equal(got[1], sampled[1])


@needs_library
def test_threads_split_the_rows_and_change_nothing():
    """One thread and two, and more rows than threads or fewer: the same selection."""
    scores = scores_of("ties", 9, 3000, torch.float32, seed=2)
    before = torch.get_num_threads()
    try:
        torch.set_num_threads(1)
        one = native.select(scores, 300)
        torch.set_num_threads(2)
        two = native.select(scores, 300)
        few = native.select(scores[:1], 300)
    finally:
        torch.set_num_threads(before)
    assert torch.equal(one[0], two[0]) and torch.equal(one[1], two[1]) and torch.equal(few[0], one[0][:1])


@needs_library
def test_select_takes_the_cpp_form_on_the_cpu_and_refuses_what_it_cannot_take():
    """`topk.select` runs the C++ form for finite float CPU scores (the first row's −inf tail is filled with its
    earliest keys, which the exact torch form leaves to its top-k); NaN scores (finite=False) take the exact form,
    which keeps a NaN. A kk outside 1 … m is refused with a sentence."""
    scores = scores_of("masked", 4, 600, torch.float32, seed=1)
    idx, usable = tk.select(scores, 300, finite=True)
    assert torch.equal(idx, stable_top(scores, 300)[0]) and not usable[0].all()
    with_nan = scores.clone()
    with_nan[1, 5] = float("nan")
    idx, usable = tk.select(with_nan, 300)
    assert 5 in idx[1].tolist()
    with pytest.raises(ValueError, match="1 <= kk <= 600"):
        native.select(scores, 601)


@needs_library
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("dtype", [torch.float64, torch.float32], ids=["float64", "float32"])
def test_a_whole_call_is_the_same_with_either_form(causal, dtype, monkeypatch):
    """topk_attention and NSA with the C++ kernels and with the torch forms (ATTN_LAB_NATIVE=0): the same output to
    the dtype's rounding (the fused softmax sums in another order), with padding for top-k, at a size whose
    selection samples (4·top_k ≤ n). float32 adds the C++ indexer, whose scores round differently from torch's
    tiles: the same selection here, though a near tie at a row's threshold could go either way."""
    g = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(2, 4, 1500, 16, generator=g, dtype=dtype) for _ in range(3))
    pad = torch.zeros(2, 1500, dtype=torch.bool)
    pad[1, 1400:] = True
    state = ac.make_state("topk", Shape.of(q, k), top_k=256)
    calls = [lambda: tk.topk_attention(q, k, v, causal=causal, top_k=256, key_padding_mask=pad, **state)]
    if causal:
        calls.append(lambda: ac.attention("nsa", q, k, v, causal=True))
    cpp = [call() for call in calls]
    monkeypatch.setenv(native.SWITCH, "0")
    assert not native.runs(q) and not native.softmax_runs(q, k, v)
    for got, call in zip(cpp, calls):
        torch.testing.assert_close(got, call(), rtol=1e-5 if dtype == torch.float32 else 1e-12,
                                   atol=1e-6 if dtype == torch.float32 else 1e-12)


def gathered(q, k, v, idx, usable):
    """Softmax over each row's selected keys in float64, row by row: scores at the usable selected keys, exp less
    their highest, normalised, times the values (a row with none: zeros); each key/value head for its query heads."""
    B, H, r, D = q.shape
    Hk, S = k.shape[1], idx.shape[1]
    out = torch.zeros(B, H, r, D, dtype=torch.float64)
    for b in range(B):
        for h in range(H):
            kh, s = h // (H // Hk), 0 if S == 1 else h // (H // Hk)
            for t in range(r):
                keep = idx[b, s, t][usable[b, s, t]]
                if keep.numel() == 0:
                    continue
                logits = k[b, kh, keep].double() @ q[b, h, t].double() / D ** 0.5
                w = torch.exp(logits - logits.max())
                out[b, h, t] = (w / w.sum()) @ v[b, kh, keep].double()
    return out


@needs_library
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64], ids=["float32", "float64"])
@pytest.mark.parametrize("B,H,Hk,S,r,m,D,kk", [(1, 4, 4, 1, 9, 300, 64, 40), (2, 4, 2, 2, 5, 50, 8, 7),
                                               (1, 2, 1, 1, 3, 40, 128, 40), (2, 6, 3, 3, 4, 33, 24, 12),
                                               (1, 2, 2, 1, 6, 20, 16, 30), (1, 1, 1, 1, 2, 70, 200, 17)])
@pytest.mark.parametrize("parted", [False, True], ids=["whole rows", "in parts"])
def test_the_fused_softmax_is_the_formula(B, H, Hk, S, r, m, D, kk, dtype, parted, monkeypatch):
    """`native.selected_softmax` against the softmax written row by row in float64: one selection for every head or
    one per key/value head, head widths on and off the vector width (8 … 200), unusable keys and a row with none
    (zeros), repeated keys (kk > m: each copy counts, as in the gathered form), a row not in increasing order; keys
    and values read through views. Whole rows, and in parts of 4 keys (`part_keys`: the softmax carried from part to
    part, many parts holding none or one of a row's keys; float32 at widths of whole vectors, the others whole)."""
    if parted:
        elem = torch.finfo(dtype).bits // 8
        monkeypatch.setattr(ops, "PART_BYTES", 4 * 2 * D * elem)
        assert native.part_keys(m, D, elem) == 4
    g = torch.Generator().manual_seed(r * m + kk)
    q = torch.randn(B, H, r, D, generator=g, dtype=dtype)
    k = torch.randn(B, Hk, m + 5, D, generator=g, dtype=dtype)[:, :, 2:m + 2]  # a view: rows in place, offset
    v = torch.randn(B, Hk, m, D, generator=g, dtype=dtype)
    idx = torch.randint(0, m, (B, S, r, kk), generator=g).sort(-1).values
    usable = torch.rand(B, S, r, kk, generator=g) < 0.8
    usable[0, 0, 0] = False
    idx[-1, -1, -1] = idx[-1, -1, -1].flip(0)  # the last row decreasing (the kernel runs it whole)
    got = native.selected_softmax(q, k, v, idx, usable)
    want = gathered(q, k, v, idx, usable)
    torch.testing.assert_close(got.double(), want, rtol=1e-5 if dtype == torch.float32 else 1e-12,
                               atol=1e-6 if dtype == torch.float32 else 1e-12)
    assert not got[0, :H // S if S > 1 else H, 0].any()  # the row with no usable key


def test_a_part_of_the_fused_softmax_is_a_quarter_of_this_cpu_s_own_cache(monkeypatch):
    """`part_bytes`: a quarter of a core's L2 (`_cpu.caches`), PART_BYTES where a caller sets it; parts only where a
    head's keys and values fill two parts: a CPU of 2 MiB a core parts 16,384 keys of D = 64 in float32 into
    1,024 keys (512 KiB of keys and values), one of 512 KiB into 256 keys, and 512 keys of that one not at all."""
    monkeypatch.setattr(ops, "PART_BYTES", None)
    for l2, keys in ((2 << 20, 1024), (512 << 10, 256)):
        monkeypatch.setattr(_cpu, "caches", lambda l2=l2: _cpu.Caches(l2, 32 << 20, 2, "test"))
        assert native.part_bytes() == l2 // 4 and native.part_keys(16384, 64, 4) == keys
    assert native.part_keys(512, 64, 4) == 0 and native.part_keys(513, 64, 4) == 256
    monkeypatch.setattr(ops, "PART_BYTES", 4 * 2 * 64 * 4)
    assert native.part_bytes() == 2048 and native.part_keys(16384, 64, 4) == 4


@needs_library
@pytest.mark.parametrize("part_bytes", [None, 128], ids=["whole rows", "in parts"])
def test_the_fused_softmax_gives_nan_where_softmax_does_and_refuses_bad_positions(part_bytes, monkeypatch):
    """A NaN or +inf score makes its row NaN (softmax over it is), other rows untouched; a −inf one only drops its
    key. A selected position outside the keys is refused with a sentence before the kernel reads it."""
    if part_bytes:  # parts of one key: a NaN part, an infinite one, a dropped one, each carried on
        monkeypatch.setattr(ops, "PART_BYTES", part_bytes)
        assert native.part_keys(4, 16, 4) == 1
    g = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(1, 2, 4, 16, generator=g) for _ in range(3))
    idx = torch.tensor([[[[0, 1, 2], [1, 2, 3], [0, 2, 3], [0, 1, 3]]]])
    usable = torch.ones_like(idx, dtype=torch.bool)
    q[0, 1, :, 0] = q[0, 1, :, 0].abs() + 0.5  # head 1's first query coordinate positive: an infinite key's score
    k[0, 0, 0, 0], k[0, 1, 1, 0], k[0, 1, 2, 0] = float("nan"), float("inf"), float("-inf")  # is +inf, or −inf
    out = native.selected_softmax(q, k, v, idx, usable)
    plain = _sparse.gathered_softmax(q, k, v, idx, usable)
    rows_nan = out.isnan().all(dim=-1)[0].tolist()
    assert rows_nan == [[True, False, True, True], [True, True, False, True]]  # rows that read key 0; key 1
    assert torch.equal(out.isnan(), plain.isnan()) and not out.isnan().any(dim=-1).logical_and(
        ~out.isnan().all(dim=-1)).any()  # a row is NaN whole or not at all
    torch.testing.assert_close(out.nan_to_num(7.0), plain.nan_to_num(7.0))  # row 2 of head 1 drops key 2
    with pytest.raises(ValueError, match="selected positions must lie in 0 … 3"):
        native.selected_softmax(q, k, v, idx + 1, usable)
    with pytest.raises(ValueError, match=r"v \(1, 2, 3, 16\)"):  # values fewer than the keys: refused, not read past
        native.selected_softmax(q, k, v[:, :, :3], idx, usable)


@needs_library
def test_the_fused_softmax_s_eight_keys_a_step_keep_nan_infinities_and_flags():
    """Rows of 21 selected keys, float32, D = 64 (AVX2's form scores 8 keys a step, then a tail of 5): a NaN key and a
    +inf score inside a step make their rows NaN, a −inf score and an unusable key drop only their key, in a step and
    in the tail; every other row equals the float64 formula."""
    g = torch.Generator().manual_seed(3)
    q, k, v = (torch.randn(1, 2, 6, 64, generator=g) for _ in range(3))
    q[0, 1, :, 0] = q[0, 1, :, 0].abs() + 0.5  # head 1: key 9's +inf coordinate gives a +inf score
    k = torch.cat([k, torch.randn(1, 2, 34, 64, generator=g)], 2)
    v = torch.cat([v, torch.randn(1, 2, 34, 64, generator=g)], 2)
    idx = torch.stack([torch.randperm(40, generator=g)[:21].sort().values for _ in range(6)])[None, None]
    idx[0, 0, :, 2], idx[0, 0, :, 5], idx[0, 0, :, 19] = 3, 9, 33  # keys 3, 9 and 33 at steps' places
    idx = idx.sort(-1).values
    usable = torch.ones_like(idx, dtype=torch.bool)
    usable[0, 0, 4, 6], usable[0, 0, 5, 20] = False, False  # one in a step, one in the tail
    k[0, 0, 3, 0] = float("nan")  # head 0: every row reads key 3
    k[0, 1, 9, 0] = float("inf")  # head 1: +inf score
    k[0, 1, 33, 0] = float("-inf")  # head 1: a −inf score
    out = native.selected_softmax(q, k, v, idx, usable)
    assert out[0, 0].isnan().all() and out[0, 1].isnan().all()  # every row reads key 3 and key 9
    k[0, 0, 3, 0], k[0, 1, 9, 0] = 0.0, 0.0
    out = native.selected_softmax(q, k, v, idx, usable)
    dropped = usable & (idx != 33)  # key 33 unusable: head 1's −inf score must weigh as nothing, as this does
    torch.testing.assert_close(out[0, 0].double(), gathered(q, k, v, idx, usable)[0, 0], rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(out[0, 1].double(), gathered(q, k, v, idx, dropped)[0, 1], rtol=1e-5, atol=1e-6)


@needs_library
def test_gradients_take_the_torch_form():
    """Wanting gradients through q, k or v leaves the fused kernel aside (it has no backward): the torch form runs,
    and its gradients match the float64 formula's."""
    g = torch.Generator().manual_seed(1)
    q, k, v = (torch.randn(1, 2, 5, 8, generator=g, dtype=torch.float64, requires_grad=True) for _ in range(3))
    idx = torch.randint(0, 5, (1, 1, 5, 3), generator=g).sort(-1).values
    usable = torch.ones_like(idx, dtype=torch.bool)
    assert not native.softmax_runs(q, k, v)
    with torch.no_grad():
        assert native.softmax_runs(q, k, v)
    out = _sparse.selected_softmax(q, k, v, idx, usable)
    out.sum().backward()
    qr, kr, vr = (t.detach().clone().requires_grad_(True) for t in (q, k, v))
    gathered(qr, kr, vr, idx, usable).sum().backward()
    for a, b in ((q, qr), (k, kr), (v, vr)):
        torch.testing.assert_close(a.grad, b.grad)


@pytest.mark.parametrize("B,r,m,IH,dI", [(1, 102, 3000, 4, 32), (2, 7, 50, 3, 5), (3, 1, 33, 7, 9),
                                         (1, 5, 16, 1, 1), (2, 4, 1, 4, 32), (1, 9, 47, 8, 16),
                                         (2, 5, 1100, 5, 64)])
def test_the_fused_indexer_is_its_formula(B, r, m, IH, dI):
    """`native.index_scores` against I_{t,s} = Σ_j w_j · ReLU(q^I_{t,j} · k^I_s) written with einsum in float64:
    heads in the kernel's groups (4 with AVX-512, 2 with AVX2) and the rest (1 … 8), widths on and off the vector's,
    keys on and off the step's multiples (32, 24) (one key), several blocks of keys with a tail in two batches (1100
    keys of 64: blocks of 512 or 504), an odd number of rows (one left unpaired), queries a view of longer rows, the
    keys a view of the first m of longer transposed rows, and a negative weight."""
    kernels()
    if not native.index_runs(torch.zeros(1)):
        pytest.skip(f"no C++ indexer here (it needs AVX-512, or AVX2 with FMA): {native.describe()}")
    g = torch.Generator().manual_seed(B * r + m)
    qi = torch.randn(B, r + 3, IH * dI, generator=g)[:, 1:r + 1]
    ki = torch.randn(B, m + 7, dI, generator=g)
    kt = ki.transpose(1, 2).contiguous()[:, :, :m]
    w = torch.rand(IH, generator=g) - 0.2
    want = (torch.einsum("brjd,bsd->brjs", qi.double().view(B, r, IH, dI), ki[:, :m].double()).clamp(min=0)
            * w.double()[:, None]).sum(2)
    torch.testing.assert_close(native.index_scores(qi, kt, w).double(), want, rtol=1e-5, atol=1e-5)
    with pytest.raises(ValueError, match="queries \\(B, r, IH·dI\\)"):
        native.index_scores(qi, kt[:, :-1], w)


def indexer_or_skip() -> None:
    kernels()
    if not native.index_runs(torch.zeros(1)):
        pytest.skip(f"no C++ indexer here (it needs AVX-512, or AVX2 with FMA): {native.describe()}")


@pytest.mark.parametrize("where", ["query", "key", "weight", "inf against a zero weight", "inf and -inf"])
def test_the_fused_indexer_keeps_nan_and_inf_as_the_torch_form_does(where):
    """Non-finite inputs: the C++ indexer and topk.index_scores's torch form (its tiles, torch.relu) give NaN at the
    same scores, ±inf at the same scores, and the same finite scores elsewhere. A NaN product stays NaN through the
    ReLU (it once became 0: a finite score, and another selection, where torch's was NaN); an inf one times a zero
    weight is NaN; +inf and −inf heads summed are NaN."""
    indexer_or_skip()
    g = torch.Generator().manual_seed(7)
    B, r, m, IH, dI = 2, 5, 70, 4, 8
    qi = torch.randn(B, r, IH * dI, generator=g)
    ki = torch.randn(B, m, dI, generator=g)
    w = torch.rand(IH, generator=g) + 0.1
    if where == "query":
        qi[0, 1, 3] = float("nan")  # row 1's head 0: NaN against every key
    elif where == "key":
        ki[1, 40, 2] = float("nan")  # key 40 of batch 1: NaN for every row
    elif where == "weight":
        w[2] = float("nan")
    elif where == "inf against a zero weight":
        qi[0, 2, 9] = float("inf")  # head 1 of row 2: ±inf products
        w[1] = 0.0
    else:  # heads 0 and 3 of row 4 infinite: keys where both ReLUs are +inf, weights of both signs
        qi[1, 4, 0], qi[1, 4, 3 * dI] = float("inf"), float("inf")
        w[3] = -0.5
    got = native.index_scores(qi, ki.transpose(1, 2).contiguous(), w)
    want = tk.index_scores(qi, ki, w)  # no transposed keys: the torch form
    assert want.isnan().any() or want.isinf().any()
    assert torch.equal(got.isnan(), want.isnan()) and torch.equal(got.isinf(), want.isinf())
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5, equal_nan=True)


def test_a_whole_topk_call_with_a_nan_key_is_the_same_with_either_form(monkeypatch):
    """topk_attention with a NaN in one key: its indexer score is NaN for every row in both forms (the exact
    selection then takes it), so the same output, NaN in the same rows; with the NaN turned to 0 by the C++ ReLU,
    rows passed it by and came out finite."""
    indexer_or_skip()
    g = torch.Generator().manual_seed(3)
    q, k, v = (torch.randn(1, 2, 300, 16, generator=g) for _ in range(3))
    k[0, 1, 150, 4] = float("nan")
    state = ac.make_state("topk", Shape.of(q, k), top_k=32)
    call = lambda: tk.topk_attention(q, k, v, causal=True, top_k=32, **state)  # noqa: E731
    cpp = call()
    monkeypatch.setenv(native.SWITCH, "0")
    torch_form = call()
    assert cpp.isnan().any()
    torch.testing.assert_close(cpp, torch_form, rtol=1e-5, atol=1e-6, equal_nan=True)

@needs_library
def test_the_kernels_build_and_answer_without_avx512(tmp_path, monkeypatch):
    """Built without -march=native or OpenMP (a CPU without AVX-512, a compiler without OpenMP): the library builds,
    has no indexer, and its plain loops give the stable sort's selection and the row-by-row softmax (float32 at a
    vector width, whole rows where a part's width is asked for)."""
    target = tmp_path / "plain.so"
    assert toolchain._compile(native.compiler(), native.FLAGS, target) is None
    lib = toolchain._load(target)  # (tmp_path: a folder of this user's that no one else can write)
    assert lib.attn_index_available() == 0 and lib.attn_select_openmp() == 0
    monkeypatch.setitem(loader._loaded, "lib", lib)
    scores = scores_of("ties", 6, 5003, torch.float32, seed=3)
    got, want = native.select(scores, 600), stable_top(scores, 600)
    assert torch.equal(got[0], want[0]) and torch.equal(got[1], want[1])
    monkeypatch.setattr(ops, "PART_BYTES", 4 * 2 * 64 * 4)
    g = torch.Generator().manual_seed(2)
    q, k, v = (torch.randn(1, 2, n, 64, generator=g) for n in (5, 90, 90))
    idx = torch.randint(0, 90, (1, 1, 5, 30), generator=g).sort(-1).values
    usable = torch.rand(1, 1, 5, 30, generator=g) < 0.8
    torch.testing.assert_close(native.selected_softmax(q, k, v, idx, usable).double(), gathered(q, k, v, idx, usable),
                               rtol=1e-5, atol=1e-6)


def run_fresh(code: str, **environment: str) -> str:
    """`code` in a new Python process (the library is built or refused once a process) with these variables."""
    import os

    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300,
                          env={**os.environ, **environment})
    assert done.returncode == 0, done.stderr
    return done.stdout.strip()


CHECK = ("import torch; from attn_core import native; from attn_core.mechanisms import topk as tk; "
         "s = torch.randn(1, 3, 4000); i, u = tk.select(s, 500, finite=True); "
         "print(native.describe()); print(torch.equal(i, tk._select_exact(s.clone(), 500)[0]))")
BUILD = ("from attn_core import native\ntry:\n    native.build()\nexcept RuntimeError as e:\n    print(e)\n"
         "else:\n    print('built')\n")


@pytest.mark.parametrize("compiler,why", [("no-such-compiler-here", "torch ops: no C++ compiler on the PATH"),
                                          ("false", "torch ops: the build failed")])
def test_without_a_compiler_the_torch_form_runs_and_says_why(compiler, why, tmp_path):
    """No compiler, or one whose build fails: `build` refuses with a sentence, the selection still answers, by the
    torch form, and `describe` (which the run's stamp carries) says why; nothing half-built is left in the cache."""
    refused, said, same = run_fresh(BUILD + CHECK.replace("; ", "\n"), CXX=compiler,
                                    ATTN_LAB_CACHE=str(tmp_path)).splitlines()
    assert refused.startswith("the C++ kernels cannot be built: " + why.split(": ")[1])
    assert said.startswith(why) and same == "True"
    assert not [p for p in tmp_path.rglob("*") if p.is_file()]


def test_a_forward_call_never_builds(tmp_path):
    """A process that never calls `build` runs the torch form, says it is not built and how to build it, and leaves
    the cache as it found it (not even made)."""
    said, same = run_fresh(CHECK, ATTN_LAB_CACHE=str(tmp_path)).splitlines()
    assert said.startswith("torch ops: not built; run `python -m attn_core native build`") and same == "True"
    assert not list(tmp_path.iterdir())


@needs_library
def test_a_build_is_kept_and_found_by_the_next_process(tmp_path):
    """The first process builds one library into the cache (mode 0700), under a name that holds the sources, the
    declarations, compiler, flags and CPU; the next, which does not build, loads it and says so in the same words."""
    first = run_fresh(BUILD + CHECK.replace("; ", "\n"), ATTN_LAB_CACHE=str(tmp_path))
    built = sorted(p.name for p in (tmp_path / "native").iterdir())
    second = run_fresh(CHECK, ATTN_LAB_CACHE=str(tmp_path))
    assert len(built) == 1 and built[0].startswith("attn_kernels_") and built[0].endswith(".so")
    assert sorted(p.name for p in (tmp_path / "native").iterdir()) == built
    assert (tmp_path / "native").stat().st_mode & 0o777 == 0o700
    assert first == "built\n" + second and second.startswith("C++ (") and second.endswith("True")


def test_the_switch_turns_it_off_and_the_stamp_says_which_ran(monkeypatch):
    """ATTN_LAB_NATIVE=0: no library is asked for, and a run's stamp names the form its CPU kernels took; a value
    that is neither on nor off is taken as off, and said so."""
    monkeypatch.setenv(native.SWITCH, "0")
    assert not native.enabled() and native.library() is None and not native.expected()
    assert env.environment("cpu", "float32", 1)["native_kernels"] == "torch ops: ATTN_LAB_NATIVE=0"
    monkeypatch.setenv(native.SWITCH, "maybe")  # neither word: the torch forms, and a sentence saying what to set
    assert not native.enabled() and native.describe() == ("torch ops: ATTN_LAB_NATIVE='maybe' is neither on (1) nor "
                                                          "off (0); set it to one of them")
    monkeypatch.delenv(native.SWITCH)
    assert env.environment("cpu", "float32", 1)["native_kernels"] == native.describe()
