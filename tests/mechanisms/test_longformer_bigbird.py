"""Longformer and BigBird against masked softmax under their patterns (tests/baselines.allowed, written cell by cell),
their random blocks against the rules that define them, their costs against counted cells and traced peaks."""
from __future__ import annotations

import math

import numpy as np
import pytest
import torch

import attn_core as ac
from attn_core.insight import effective
from attn_core.spec import Shape
from tests.baselines import allowed, masked_softmax, trace_peak_bytes

LONGFORMER = {"window": 256, "global_tokens": 2}
BIGBIRD = {"block": 64, "window_blocks": 3, "global_blocks": 2, "random_blocks": 3}


def qkv(n: int, *, B: int = 2, H: int = 3, D: int = 16, dtype=torch.float32, seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    return [torch.randn(B, H, n, D, generator=g, dtype=torch.float64).to(dtype) for _ in range(3)]


def check_exact(key: str, n: int, causal: bool, params: dict, *, seed: int = 0, **given) -> None:
    """The mechanism equals masked softmax under its pattern, built cell by cell from the paper's wording."""
    q, k, v = qkv(n, seed=seed)
    state = {**ac.make_state(key, Shape.of(q, k, causal), seed=seed, **params), **given}
    full = {**ac.get(key).defaults, **params}
    expected = masked_softmax(q, k, v, allowed(key, n, n, causal, **full, **state))
    out = ac.attention(key, q, k, v, causal=causal, **params, **state)
    assert out.shape == q.shape and out.dtype == q.dtype
    torch.testing.assert_close(out.double(), expected, atol=2e-5, rtol=1e-5)


# ---- Longformer ----

@pytest.mark.parametrize("n", [1, 2, 37, 130, 300])
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("window,global_tokens", [(0, 0), (0, 3), (1, 0), (1, 2), (5, 1), (40, 7), (300, 2),
                                                  (3, 130), (2, 1000)])
def test_longformer_equals_masked_softmax(n, causal, window, global_tokens):
    """Window 0 (a token and the globals) and 1, no global token, g ≥ n (all global: dense), windows past n;
    n = 130 and 300 are no multiple of the 32-row blocks the band is cut into."""
    check_exact("longformer", n, causal, {"window": window, "global_tokens": global_tokens})


@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("positions", [[0, 50, 99], [99, 3, 64, 65], [42], []])
def test_longformer_takes_given_global_positions(causal, positions):
    """Any distinct positions, in any order, near each other or the ends; the band around them counted once."""
    p = torch.tensor(positions, dtype=torch.long)
    params = {"window": 4, "global_tokens": len(positions)}
    check_exact("longformer", 100, causal, params, global_positions=p)


def test_longformer_without_globals_is_the_sliding_window_and_with_all_is_softmax():
    q, k, v = qkv(77)
    for causal in (False, True):
        torch.testing.assert_close(ac.attention("longformer", q, k, v, causal=causal, window=9, global_tokens=0),
                                   ac.attention("sliding_window", q, k, v, causal=causal, window=9))
        torch.testing.assert_close(ac.attention("longformer", q, k, v, causal=causal, window=3, global_tokens=77),
                                   ac.attention("softmax", q, k, v, causal=causal), atol=1e-6, rtol=1e-5)


def test_longformer_causal_global_tokens_see_only_the_past():
    """A global token at the end of a causal sequence sees everything before it; at the start, only itself."""
    q, k, v = qkv(50, B=1, H=1)
    out = ac.attention("longformer", q, k, v, causal=True, window=2, global_tokens=2,
                       global_positions=torch.tensor([0, 49]))
    torch.testing.assert_close(out[0, 0, 0], v[0, 0, 0])
    torch.testing.assert_close(out[0, 0, 49].double(), masked_softmax(q, k, v)[0, 0, 49], atol=1e-6, rtol=1e-5)


@pytest.mark.parametrize("given,words", [
    (torch.tensor([0, 1, 2]), ["lists 3", "global_tokens = 2", "global_tokens=3"]),
    (torch.tensor([5, 5]), ["distinct", "[0, 40)"]),
    (torch.tensor([3, 40]), ["distinct", "[0, 40)"]),
    (torch.tensor([-1, 3]), ["[0, 40)"]),
    (torch.tensor([0.0, 1.0]), ["1-D integer tensor"]),
    ([0, 1], ["1-D integer tensor"]),
])
def test_longformer_refuses_bad_global_positions(given, words):
    with pytest.raises(ValueError) as err:
        ac.attention("longformer", *qkv(40), window=3, global_tokens=2, global_positions=given)
    assert all(w in str(err.value) for w in words), str(err.value)


# ---- BigBird ----

BIGBIRD_CASES = [
    {"block": 8, "window_blocks": 3, "global_blocks": 1, "random_blocks": 2},
    {"block": 5, "window_blocks": 2, "global_blocks": 2, "random_blocks": 3},  # even window: one more back
    {"block": 3, "window_blocks": 4, "global_blocks": 0, "random_blocks": 5},
    {"block": 8, "window_blocks": 1, "global_blocks": 0, "random_blocks": 0},  # each block alone
    {"block": 1, "window_blocks": 1, "global_blocks": 0, "random_blocks": 1},  # one token a block
    {"block": 7, "window_blocks": 5, "global_blocks": 100, "random_blocks": 3},  # every block global
    {"block": 16, "window_blocks": 7, "global_blocks": 1, "random_blocks": 40},  # more random than candidates
    {"block": 200},  # block ≥ n: one block, global
    {"block": 200, "global_blocks": 0},  # block ≥ n, no global: the window alone, dense
]


@pytest.mark.parametrize("n", [1, 37, 100, 131])
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("params", BIGBIRD_CASES)
def test_bigbird_equals_masked_softmax(n, causal, params):
    """n = 37, 100, 131: no multiple of most blocks (the last block partial, masked)."""
    check_exact("bigbird", n, causal, params, seed=n)


def random_rules(table: torch.Tensor, n: int, causal: bool, block: int, window_blocks: int, global_blocks: int,
                 random_blocks: int) -> None:
    """Each row of a random table, checked against the rules that define it (written out here, not imported)."""
    b = min(block, n)
    nb = math.ceil(n / b)
    back, ahead = window_blocks // 2, 0 if causal else (window_blocks - 1) // 2
    width = min(random_blocks, max(0, nb - min(global_blocks, nb) - 1))
    assert table.dtype == torch.long and tuple(table.shape) == (nb, width)
    for row in range(nb):
        drawn = [int(x) for x in table[row] if x >= 0]
        assert all(x == -1 for x in table[row][len(drawn):]), "−1 only after the drawn blocks"
        if row < global_blocks:
            assert drawn == [], "a global block sees everything already"
            continue
        if causal:
            candidates = [c for c in range(nb) if global_blocks <= c < row - back]
        else:
            candidates = [c for c in range(nb) if c >= global_blocks and not row - back <= c <= row + ahead]
        assert drawn == sorted(set(drawn)), "distinct and sorted"
        assert set(drawn) <= set(candidates), "never a block the window or the global blocks hold"
        assert len(drawn) == min(random_blocks, len(candidates))


@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("n,params", [(1000, BIGBIRD), (131, BIGBIRD_CASES[0]), (100, BIGBIRD_CASES[2]),
                                      (60, BIGBIRD_CASES[6]), (37, BIGBIRD_CASES[7])])
def test_bigbird_random_blocks_follow_the_rules_and_the_seed(causal, n, params):
    full = {**BIGBIRD, **params}
    shape = Shape(1, 1, n, n, 8, causal=causal)
    tables = [ac.make_state("bigbird", shape, seed=s, **full)["random_table"] for s in range(20)]
    for t in tables:
        random_rules(t, n, causal, **full)
    torch.testing.assert_close(ac.make_state("bigbird", shape, seed=7, **full)["random_table"], tables[7])
    if n == 1000:
        assert not any(torch.equal(tables[0], t) for t in tables[1:]), "another seed, other blocks"


def test_bigbird_random_blocks_are_uniform_over_the_candidates():
    """Each of the 12 candidates of query block 2 (n = 1024, b = 64: 16 blocks, 2 global, window 1–3) is drawn
    with probability 3/12; over 4000 seeds each count is 1000 ± 4.5σ (σ = √(4000·¼·¾) ≈ 27)."""
    shape = Shape(1, 1, 1024, 1024, 8)
    counts = np.zeros(16)
    for seed in range(4000):
        for block in ac.make_state("bigbird", shape, seed=seed, **BIGBIRD)["random_table"][2].tolist():
            counts[block] += 1
    assert counts[:4].sum() == 0
    assert np.all(np.abs(counts[4:] - 1000) < 4.5 * math.sqrt(4000 * 0.25 * 0.75)), counts


def test_bigbird_draws_its_table_from_the_seed_and_refuses_a_wrong_one():
    q, k, v = qkv(200)
    state = ac.make_state("bigbird", Shape.of(q, k), seed=11, block=16)
    torch.testing.assert_close(ac.attention("bigbird", q, k, v, block=16, seed=11),
                               ac.attention("bigbird", q, k, v, block=16, **state))
    assert not torch.allclose(ac.attention("bigbird", q, k, v, block=16, seed=11),
                              ac.attention("bigbird", q, k, v, block=16, seed=12))
    with pytest.raises(ValueError, match=r"random_table must be an integer tensor of shape \(13, 3\)"):
        ac.attention("bigbird", q, k, v, block=16, random_table=state["random_table"][:, :2])
    with pytest.raises(ValueError, match="random_table"):
        ac.get("bigbird").insight.pattern(False, **BIGBIRD)  # no table: no pattern to give


def test_the_patterns_page_draws_bigbirds_blocks_for_its_seed():
    """effective.computed_cells and cells_computed use the table of the seed they are given."""
    n, params = 48, {"block": 4, "window_blocks": 3, "global_blocks": 1, "random_blocks": 2}
    for seed in (0, 1):
        table = ac.make_state("bigbird", Shape(1, 1, n, n, 8), seed=seed, **params)["random_table"]
        expected = allowed("bigbird", n, n, False, **params, random_table=table)
        np.testing.assert_array_equal(effective.computed_cells("bigbird", n, n, seed=seed, **params).numpy(),
                                      expected)
        assert effective.cells_computed("bigbird", n, seed=seed, **params)["cells"] == expected.sum()


def test_the_patterns_page_shows_both_and_bigbirds_blocks_for_its_seed():
    """The page's 12-word sentence with each Param's small value (BigBird: blocks of 2, one random block): the
    cells drawn are the independently built mask for the table of the page's seed."""
    from tests.dashboard.test_pages_insight import charts, errors, page, records

    drawn = {}
    for seed in (0, 3):
        at = page("patterns", pat_mechanisms=["longformer", "bigbird"], pat_seed=seed)
        assert errors(at) == []
        specs = charts(at)
        assert [s["title"]["text"] for s in specs[1:]] == [ac.get("longformer").label, ac.get("bigbird").label]
        params = {p.name: at.session_state[f"pat_bigbird_{p.name}"] for p in ac.get("bigbird").params}
        table = ac.make_state("bigbird", Shape(1, 1, 12, 12, 8), seed=seed, **params)["random_table"]
        cells = np.zeros((12, 12), dtype=bool)
        for r in records(specs[-1], "computed"):
            cells[r["i"], r["j"]] = r["computed"] > 0
        np.testing.assert_array_equal(cells, allowed("bigbird", 12, 12, False, **params, random_table=table))
        drawn[seed] = cells
    assert not np.array_equal(drawn[0], drawn[3]), "another seed, other random blocks"


# ---- both ----

@pytest.mark.parametrize("key,params", [("longformer", {"window": 5, "global_tokens": 3}),
                                        ("bigbird", {"block": 8, "global_blocks": 1, "random_blocks": 2})])
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("dtype,tol", [(torch.float16, 2e-2), (torch.bfloat16, 6e-2)])
def test_half_precision_stays_close_to_float32(key, params, causal, dtype, tol):
    q, k, v = qkv(150, B=1, H=2)
    ref = ac.attention(key, q, k, v, causal=causal, **params)
    out = ac.attention(key, q.to(dtype), k.to(dtype), v.to(dtype), causal=causal, **params)
    assert out.dtype == dtype and torch.isfinite(out).all()
    assert ((out.float() - ref).norm() / ref.norm()).item() < tol


def counted(key: str, n: int, causal: bool, params: dict, seed: int = 0) -> int:
    """Cells of the pattern, from the independently written mask."""
    state = ac.make_state(key, Shape(1, 1, n, n, 8, causal=causal), seed=seed, **params)
    return int(allowed(key, n, n, causal, **{**ac.get(key).defaults, **params}, **state).sum())


@pytest.mark.parametrize("n", [1, 13, 64, 100])
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("key,params", [("longformer", {"window": 0, "global_tokens": 0}),
                                        ("longformer", {"window": 3, "global_tokens": 4}),
                                        ("longformer", {"window": 30, "global_tokens": 200}),
                                        ("bigbird", {"block": 4, "window_blocks": 3, "global_blocks": 1}),
                                        ("bigbird", {"block": 4, "window_blocks": 4, "global_blocks": 0,
                                                     "random_blocks": 2}),
                                        ("bigbird", {"block": 16, "global_blocks": 1, "random_blocks": 1}),
                                        ("bigbird", {"block": 100})])
def test_useful_flops_count_the_patterns_cells(key, n, causal, params):
    """4·B·H·D per kept cell (Q Kᵀ and P V); executed ≥ useful. BigBird's random blocks are counted in
    expectation when the partial last block is a candidate (n = 13 with block 4): the mean over 200 seeds."""
    spec = ac.get(key)
    shape = Shape(2, 3, n, n, 8, causal=causal)
    block = params.get("block", 1)
    seeds = range(200) if key == "bigbird" and not causal and n % min(block, n) else range(1)
    cells = np.mean([counted(key, n, causal, params, s) for s in seeds])
    assert spec.cost.flops(shape, **params) == pytest.approx(4 * 6 * 8 * cells, rel=0.03 if len(seeds) > 1 else 1e-12)
    assert spec.cost.executed(shape, **params) >= spec.cost.flops(shape, **params) * (1 - 1e-12)


@pytest.mark.parametrize("key,params", [("longformer", {"global_tokens": 300}), ("longformer", {"window": 16,
                                                                                                "global_tokens": 16}),
                                        ("bigbird", {"block": 16, "window_blocks": 5, "random_blocks": 8}),
                                        ("bigbird", {"block": 8, "global_blocks": 1})])
@pytest.mark.parametrize("causal", [False, True])
def test_spec_memory_matches_a_traced_peak_off_the_defaults(key, params, causal):
    """As tests/contract/test_mechanisms.py does at the defaults: within 2% of the allocator's records, B=2, H=3, n=3000."""
    spec = ac.get(key)
    shape = Shape(2, 3, 3000, 3000, 40, dtype="float32", causal=causal)
    q, k, v = qkv(3000, B=2, H=3, D=40)
    state = ac.make_state(key, shape, **params)
    with torch.inference_mode():
        call = lambda: spec.fn(q, k, v, causal=causal, **params, **state)  # noqa: E731
        call()
        measured = trace_peak_bytes(call)
    assert spec.cost.memory_bytes(shape, **params) == pytest.approx(measured, rel=0.02)


@pytest.mark.parametrize("key,params", [("longformer", LONGFORMER), ("bigbird", BIGBIRD)])
@pytest.mark.parametrize("causal", [False, True])
def test_no_n_by_n_tensor_at_a_larger_n(key, params, causal):
    """n = 16384, B = H = 1, D = 32, defaults: an (n, n) fp32 tensor would be 1 GiB; the traced peak stays under
    48 MiB (the 2 MiB output and a workspace of chunks bounded whatever n), and the spec predicts it."""
    n, d = 16384, 32
    q, k, v = qkv(n, B=1, H=1, D=d)
    shape = Shape(1, 1, n, n, d, causal=causal)
    state = ac.make_state(key, shape, **params)
    with torch.inference_mode():
        peak = trace_peak_bytes(lambda: ac.get(key).fn(q, k, v, causal=causal, **params, **state))
    assert n * d * 4 <= peak < 48 << 20, peak
    assert ac.get(key).cost.memory_bytes(shape, **params) == pytest.approx(peak, rel=0.02)


@pytest.mark.parametrize("key,params", [("longformer", {"window": 4, "global_tokens": 2}),
                                        ("bigbird", {"block": 4, "global_blocks": 1, "random_blocks": 1})])
def test_the_layer_runs_them_with_their_state(key, params):
    """MultiHeadAttention draws BigBird's table for each sequence length from its seed."""
    torch.manual_seed(0)
    layer = ac.MultiHeadAttention(32, 4, mechanism=key, causal=True, seed=3, **params)
    for n in (20, 33):
        x = torch.randn(2, n, 32)
        out = layer(x)
        assert out.shape == x.shape and torch.isfinite(out).all()
        q, k, v = (layer._split(p(x)) for p in (layer.q_proj, layer.k_proj, layer.v_proj))
        state = ac.make_state(key, Shape.of(q, k, True), seed=3, **params)
        inner = ac.attention(key, q, k, v, causal=True, **params, **state)
        torch.testing.assert_close(out, layer.out_proj(inner.transpose(1, 2).reshape(2, n, 32)))
