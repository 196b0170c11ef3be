"""Accuracy metrics on hand-computed cases, the input generators, and errors of real mechanisms."""
from __future__ import annotations

import math

import pandas as pd
import pytest
import torch

from attn_core.insight import accuracy as acc

T = torch.tensor
SMALL = dict(n=64, d_model=32, heads=2, repeats=1)


def test_relative_frobenius_by_hand():
    exact, approx = T([[1.0, 0.0], [0.0, 1.0]]), T([[1.0, 0.0], [0.0, 0.0]])
    assert acc.relative_frobenius(approx, exact) == pytest.approx(1 / math.sqrt(2))  # ‖diff‖ = 1, ‖E‖ = √2
    assert acc.relative_frobenius(exact, exact) == 0.0


def test_max_abs_error_by_hand():
    assert acc.max_abs_error(T([1.0, 2.5, -3.0]), T([1.0, 2.0, -2.0])) == 1.0


def test_mean_cosine_by_hand():
    # Rows: orthogonal (0), parallel (1), zero vs zero (1), zero vs non-zero (0): mean 0.5.
    approx = T([[1.0, 0.0], [1.0, 1.0], [0.0, 0.0], [0.0, 0.0]])
    exact = T([[0.0, 1.0], [2.0, 2.0], [0.0, 0.0], [3.0, 0.0]])
    assert acc.mean_cosine(approx, exact) == pytest.approx(0.5)
    assert acc.mean_cosine(T([[1.0, 0.0]]), T([[-1.0, 0.0]])) == pytest.approx(-1.0)


def test_kl_by_hand_and_zero_entries():
    # KL([½, ½] ‖ [¼, ¾]) = ½·ln 2 + ½·ln(2/3) = ½·ln(4/3).
    assert acc.kl_rows(T([[0.5, 0.5]]), T([[0.25, 0.75]])) == pytest.approx(0.5 * math.log(4 / 3))
    assert acc.kl_rows(T([[1.0, 0.0]]), T([[0.5, 0.5]])) == pytest.approx(math.log(2))  # 0·log 0 = 0
    assert acc.kl_rows(T([[1.0, 0.0]]), T([[1.0, 0.0]])) == 0.0  # zero where both are zero
    assert acc.kl_rows(T([[0.5, 0.5]]), T([[1.0, 0.0]])) == math.inf  # q rules out what p allows
    # Mean over rows: [0, ln 2] → ln 2 / 2.
    assert acc.kl_rows(T([[1.0, 0.0], [1.0, 0.0]]), T([[1.0, 0.0], [0.5, 0.5]])) == pytest.approx(math.log(2) / 2)


def test_dropped_mass_by_hand():
    assert acc.dropped_mass(T([[0.5, 0.3, 0.2], [1.0, 0.0, 0.0]]), T([[0.6, 0.4, 0.0], [0.0, 1.0, 0.0]])) == \
        pytest.approx((0.2 + 1.0) / 2)


def test_pareto_front_by_hand():
    frame = pd.DataFrame({"time_s": [1, 2, 3, 2, 3, 1, math.nan],
                          "rel_fro": [3, 2, 1, 3, 3, 3, 0.1]})
    # (1,3) twice: tied, neither beats the other; (2,3) and (3,3) are beaten; NaN never on the front.
    assert acc.pareto_front(frame).tolist() == [True, True, True, False, False, True, False]
    # Below the floor errors tie, so only the fastest of the "exact" points stays.
    exact = pd.DataFrame({"time_s": [1.0, 2.0], "rel_fro": [3e-7, 1e-7]})
    assert acc.pareto_front(exact).tolist() == [True, True]
    assert acc.pareto_front(exact, floor=1e-5).tolist() == [True, False]


@pytest.mark.parametrize("kind", acc.INPUTS)
def test_inputs_are_seeded(kind):
    a = acc.make_inputs(kind, 1, 2, 16, 4, seed=3)
    b = acc.make_inputs(kind, 1, 2, 16, 4, seed=3)
    c = acc.make_inputs(kind, 1, 2, 16, 4, seed=4)
    assert all(torch.equal(x, y) for x, y in zip(a, b))
    assert not torch.equal(a[0], c[0]) and a[0].shape == (1, 2, 16, 4)


def test_input_distributions_have_their_stated_statistics():
    q, k, _ = acc.make_inputs("peaky", 1, 4, 512, 64, seed=0)
    assert (q.std().item(), k.std().item()) == pytest.approx((acc.PEAKY_SCALE, acc.PEAKY_SCALE), rel=0.02)
    q, k, v = acc.make_inputs("local", 1, 4, 2048, 64, seed=0)
    x = v[0, :, :-1].flatten()
    y = v[0, :, 1:].flatten()
    assert torch.corrcoef(torch.stack([x, y]))[0, 1].item() == pytest.approx(acc.LOCAL_RHO, abs=0.02)
    # q and k share one slow sequence: a query scores its own position far above one 200 steps away.
    near = (q * k).sum(-1).mean().item()
    far = (q[:, :, :-200] * k[:, :, 200:]).sum(-1).mean().item()
    assert near > 10 * abs(far)
    with pytest.raises(ValueError, match="choose one of gaussian, peaky, local"):
        acc.make_inputs("uniform", 1, 1, 4, 4)


@pytest.mark.parametrize("key", ["softmax", "sdpa", "local", "sparse", "sliding_window"])
def test_exact_mechanisms_covering_everything_have_rounding_error_only(key):
    params = {"local": {"block": 64}, "sparse": {"stride": 64}, "sliding_window": {"window": 64}}.get(key, {})
    row = acc.evaluate(key, params, **SMALL)
    assert row["rel_fro"] < 1e-5 and row["cosine"] == pytest.approx(1.0)
    assert row["kl"] == pytest.approx(0.0, abs=1e-9) and row["dropped_mass"] == 0.0


def test_a_narrow_window_drops_mass_and_has_infinite_kl():
    row = acc.evaluate("sliding_window", {"window": 2}, inputs="gaussian", **SMALL)
    assert row["kl"] == math.inf and 0.5 < row["dropped_mass"] < 1 and row["rel_fro"] > 0.1
    local = acc.evaluate("sliding_window", {"window": 2}, inputs="local", **SMALL)
    assert local["dropped_mass"] < row["dropped_mass"]  # locally correlated inputs keep their mass near the diagonal


def test_performer_error_falls_as_features_grow():
    sweep = acc.parameter_sweep("performer", "features", [4, 64, 1024], inputs="local", **SMALL)
    errors = sweep["rel_fro"].tolist()
    assert errors[0] > errors[1] > errors[2]
    assert sweep["kl"].is_monotonic_decreasing and (sweep["dropped_mass"] == 0).all()
    assert list(sweep["param"].unique()) == ["features"] and sweep["value"].tolist() == [4, 64, 1024]


def test_linformer_has_no_kl_and_the_row_is_complete():
    row = acc.evaluate("linformer", {"rank": 16}, **SMALL)
    assert math.isnan(row["kl"]) and math.isnan(row["dropped_mass"])
    assert row["params"] == "rank=16" and row["predicted_bytes"] > 0 and row["time_s"] > 0
    assert row["head_dim"] == 16 and not row["exact"]


def test_kl_is_skipped_above_its_size_limit():
    row = acc.evaluate("performer", {"features": 8}, kl_max_n=32, **SMALL)
    assert math.isnan(row["kl"]) and math.isfinite(row["rel_fro"])


def test_invalid_settings_are_refused_with_a_sentence():
    assert acc.problems("softmax", n=64, d_model=30, heads=4) == [
        "d_model 30 is not divisible by 4 heads; choose a multiple of 4"]
    assert "cannot be causal" in acc.problems("linformer", n=64, d_model=32, heads=2, causal=True)[0]
    assert "choose rank ≤ 64" in acc.problems("linformer", n=64, d_model=32, heads=2, rank=128)[0]
    assert acc.problems("performer", n=64, d_model=32, heads=2, features=16) == []
    with pytest.raises(ValueError, match="choose rank ≤ 64"):
        acc.parameter_sweep("linformer", "rank", [8, 128], **SMALL)


def test_speed_accuracy_marks_a_front_and_default_configs_fit_n():
    configs = acc.default_configs(32, ["sdpa", "softmax", "performer"], steps=2)
    assert configs == [("sdpa", {}), ("softmax", {}), ("performer", {"features": 4}),
                       ("performer", {"features": 1024})]
    frame = acc.speed_accuracy(configs, n=32, d_model=16, heads=1, repeats=1)
    assert frame["pareto"].any()
    exact = frame[frame["mechanism"].isin(["sdpa", "softmax"])]
    assert exact["pareto"].sum() == 1  # both exact up to rounding: only the faster one is on the front
    assert acc.sweep_values("linformer", "rank", 100) == [4, 8, 16, 32, 64]
    assert acc.sweep_values("local", "lookback", 100, steps=3) == [0, 1, 2]
