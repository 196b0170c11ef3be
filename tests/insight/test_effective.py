"""Effective attention matrices: each one times its values must give the mechanism's own output."""
from __future__ import annotations

import numpy as np
import pytest
import torch

import attn_core as ac
from attn_core.insight import effective as ef
from tests.baselines import allowed, nsa_cells, runs, topk_cells
from tests.copies import with_copies

SMALL = {"sliding_window": {"window": 3}, "local": {"block": 4, "lookback": 1, "lookahead": 1},
         "sparse": {"stride": 4}, "longformer": {"window": 2, "global_tokens": 2},
         "bigbird": {"block": 2, "window_blocks": 3, "global_blocks": 1, "random_blocks": 1},
         "linformer": {"rank": 6}, "performer": {"features": 48}, "reformer": {"bucket_size": 4, "n_hashes": 2},
         "nystrom": {"landmarks": 4}, "additive": {"attn_dim": 8}, "mamba2": {"chunk": 4}}
# Weights that are not a distribution: Nyströmformer's F·A⁺·B, whose pseudo-inverse has negative entries and whose
# rows sum to 1 only as far as the iteration has converged (6 steps: within 5% here).
SIGNED = {"nystrom": 0.1}
# Weights not meant to sum to 1, checked in the mechanism's own tests (tests/mechanisms/test_<key>.py).
UNNORMALIZED = {"differential": "rows sum to 1 − λ, some entries negative", "sigmoid": "sigmoids nothing normalises",
                "mamba2": "a recurrence's (q·k)·decay·dt: signed, rows not normalised",
                "gated_deltanet": "a memory's decayed, delta-corrected mixing matrix: rows of any sum",
                "kda": "the same memory decayed per key channel: rows of any sum",
                "nsa": "three attentions mixed by gates that need not sum to 1"}
REF_KIND = {"softmax": "full", "sdpa": "full", "sliding_window": "sliding_window", "local": "local",
            "sparse": "sparse", "longformer": "longformer", "bigbird": "bigbird"}
# a copy is tested as its original
SMALL, SIGNED, REF_KIND, UNNORMALIZED = (with_copies(t) for t in (SMALL, SIGNED, REF_KIND, UNNORMALIZED))
CASES = [(key, causal) for key, spec in ac.MECHANISMS.items() for causal in (False, True) if runs(spec, causal)]


def qkv(nq: int, nk: int | None = None, *, seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    return [torch.randn(2, 3, m, 8, generator=g, dtype=torch.float64) for m in (nq, nk or nq, nk or nq)]


@pytest.mark.parametrize("key,causal", CASES)
def test_effective_matrix_times_values_is_the_mechanism_output(key, causal):
    q, k, v = qkv(13)
    params = SMALL.get(key, {})
    state = ac.make_state(key, ac.Shape.of(q, k, causal), dtype=q.dtype, seed=5, **params)
    out = ac.attention(key, q, k, v, causal=causal, **params, **state)
    eff = ef.effective_attention(key, q, k, v, causal=causal, seed=5, **params)  # state drawn from the same seed
    torch.testing.assert_close(eff.output(), out, rtol=1e-9, atol=1e-10)
    if key in UNNORMALIZED:
        return
    if key in SIGNED:
        torch.testing.assert_close(eff.weights.sum(-1), torch.ones(2, 3, 13, dtype=q.dtype), atol=SIGNED[key], rtol=0)
        return
    torch.testing.assert_close(eff.weights.sum(-1), torch.ones(2, 3, 13, dtype=q.dtype))
    assert (eff.weights >= 0).all()


@pytest.mark.parametrize("key", [k for k, s in ac.MECHANISMS.items() if s.supports.cross])
def test_cross_attention_effective_matrix(key):
    q, k, v = qkv(5, 11, seed=1)
    params = SMALL.get(key, {})
    out_state = ac.make_state(key, ac.Shape.of(q, k), dtype=q.dtype, seed=2, **params)
    eff = ef.effective_attention(key, q, k, v, state=out_state, **params)
    torch.testing.assert_close(eff.output(), ac.attention(key, q, k, v, **params, **out_state))


@pytest.mark.parametrize("key", list(REF_KIND))
@pytest.mark.parametrize("causal", [False, True])
def test_exact_weights_vanish_exactly_outside_the_pattern(key, causal):
    n, params = 13, SMALL.get(key, {})
    state = ac.make_state(key, ac.Shape(1, 1, n, n, 8, causal=causal), seed=4, **params)  # random blocks, if any
    expected = allowed(REF_KIND[key], n, n, causal, **params, **state)  # written cell by cell in tests/baselines.py
    cells = ef.computed_cells(key, n, n, causal, seed=4, **params)
    np.testing.assert_array_equal(cells.numpy(), expected)
    q, k, v = qkv(n)
    weights = ef.effective_attention(key, q, k, v, causal=causal, seed=4, **params).weights
    np.testing.assert_array_equal((weights > 0).all(dim=(0, 1)).numpy(), expected)


def test_linformer_cells_are_n_by_rank_and_pull_back_reproduces_the_output():
    q, k, v = qkv(9)
    assert ef.computed_cells("linformer", 9, 9, rank=4).shape == (9, 4)
    state = ac.make_state("linformer", ac.Shape.of(q, k), dtype=q.dtype, seed=0, rank=4)
    eff = ef.effective_attention("linformer", q, k, v, state=state, rank=4)
    assert eff.columns == ef.PROJECTED and eff.weights.shape == (2, 3, 9, 4)
    full = ef.pulled_back(eff, state)
    assert full.shape == (2, 3, 9, 9)
    torch.testing.assert_close(full @ v, ac.attention("linformer", q, k, v, rank=4, **state))


def test_cell_counter_hand_counted():
    # n = 4, |i − j| ≤ 1: 4 diagonal + 2·3 off-diagonal = 10 of 16 cells.
    c = ef.cells_computed("sliding_window", 4, window=1)
    assert (c["cells"], c["total"], c["fraction"]) == (10, 16, 10 / 16)
    assert c["sentence"] == "Sliding window, window=1, n=4: 62.5% of the n² cells"
    # Causal: only i − j ∈ {0, 1}: 4 + 3 = 7.
    assert ef.cells_computed("sliding_window", 4, causal=True, window=1)["cells"] == 7
    # n = 1024, w = 64: 1024 + 2·(1024·64 − 64·65/2) = 127 936 cells, 12.2% (129/1024 = 12.6% ignores the edges).
    big = ef.cells_computed("sliding_window", 1024, window=64)
    assert big["cells"] == 127_936 and "12.2% of the n² cells" in big["sentence"]
    lin = ef.cells_computed("linformer", 1024, rank=256)
    assert lin["fraction"] == 0.25 and "1024×256" in lin["sentence"]
    perf = ef.cells_computed("performer", 8, causal=True)
    assert perf["implicit"] and perf["cells"] == 36 and "implicitly" in perf["sentence"]


def test_counter_refuses_settings_the_mechanism_cannot_take():
    with pytest.raises(ValueError, match="rank"):
        ef.cells_computed("linformer", 100, rank=256)
    with pytest.raises(ValueError, match="cannot be causal"):
        ef.cells_computed("linformer", 100, causal=True, rank=8)


def test_small_defaults_are_valid_for_every_mechanism():
    for key, spec in ac.MECHANISMS.items():
        params = ef.small_defaults(key, 10)
        spec.check(ac.Shape(1, 1, 10, 10, 4, causal=bool(spec.supports.causal_only)), params)


def test_matrix_frame_and_token_labels():
    tokens = ef.token_labels("the cat saw the dog")
    assert tokens == ["0 the", "1 cat", "2 saw", "3 the", "4 dog"]
    frame = ef.matrix_frame(torch.arange(2 * 5 * 5, dtype=torch.float64).view(2, 5, 5), tokens, tokens)
    assert len(frame) == 50 and set(frame["head"]) == {1, 2}
    row = frame[(frame["head"] == 2) & (frame["i"] == 1) & (frame["j"] == 3)].iloc[0]
    assert (row["query"], row["key"], row["weight"]) == ("1 cat", "3 the", 25 + 5 + 3)
    with pytest.raises(ValueError, match="empty"):
        ef.token_labels("   ")
    with pytest.raises(ValueError, match="at most 4"):
        ef.token_labels("a b c d e", limit=4)


@pytest.mark.parametrize("causal", [False, True])
def test_topk_cells_are_the_keys_a_brute_force_indexer_keeps(causal):
    q, k, _ = qkv(17, seed=3)
    params = {"top_k": 5, "index_heads": 3, "index_dim": 4}
    state = ac.make_state("topk", ac.Shape.of(q, k, causal), dtype=q.dtype, seed=7, **params)
    expected = topk_cells(q, k, causal, 5, **state)
    cells = ef.computed_cells("topk", 17, 17, causal, q=q, k=k, seed=7, **params)
    np.testing.assert_array_equal(cells.numpy(), expected)
    assert (cells.sum(1) == (torch.arange(17).clamp_max(4) + 1 if causal else 5)).all()
    with pytest.raises(ValueError, match="pass q= and k="):
        ef.computed_cells("topk", 17, 17, causal, **params)


@pytest.mark.parametrize("kv_heads,params", [
    (3, {"block": 4, "stride": 2, "select_block": 4, "select_blocks": 2, "window": 3}),
    (1, {"block": 4, "stride": 4, "select_block": 2, "select_blocks": 3, "window": 2}),
    (3, {"block": 2, "stride": 2, "select_block": 4, "select_blocks": 1, "window": 5}),
])
def test_nsa_cells_are_a_brute_force_selection_window_and_compressed_blocks(kv_heads, params):
    q, k, _ = qkv(19, seed=5)
    k = k[:, :kv_heads]
    expected = nsa_cells(q, k, **params)
    cells, names = ef.selected_cells("nsa", q, k, True, **params)
    np.testing.assert_array_equal(cells.numpy(), expected)
    m = (19 - params["block"]) // params["stride"] + 1
    assert len(names) == m and names[0] == f"c0 0–{params['block'] - 1}"
    # the count without inputs bounds these reads from above, and is the reads exactly where a query's window lies
    # inside its own block (nothing chosen can overlap it)
    count = ef.cells_computed("nsa", 19, True, **params)
    assert count["cells"] >= expected[:, :, :19].sum((1, 2)).max() and "at most" in count["sentence"]
    inside = {**params, "window": 1}
    exact = nsa_cells(q, k, **inside)[:, :, :19].sum((1, 2))
    assert ef.cells_computed("nsa", 19, True, **inside)["cells"] == exact.min() == exact.max()


def test_topk_counts_what_softmax_reads_and_says_what_the_indexer_scores():
    c = ef.cells_computed("topk", 8, True, top_k=3, index_heads=2, index_dim=4)
    assert c["cells"] == 1 + 2 + 3 * 6 and not c["implicit"]  # Σ_t min(3, t + 1)
    assert c["sentence"] == ("Top-k (DeepSeek sparse), top_k=3, index_heads=2, index_dim=4, n=8: 32.8% of the n² "
                             "cells read by softmax (each query's top_k keys); the indexer scores every earlier key "
                             "(56.2% of the cells), cheaply: 2 heads × 4 products a cell, once for all heads")
    assert ef.cells_computed("topk", 8, top_k=3, index_heads=2, index_dim=4)["cells"] == 24
