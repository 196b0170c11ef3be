"""Slopes, theory curves, crossovers and the summary on synthetic points with known answers."""
from __future__ import annotations

import json
import math

import numpy as np
import pytest

import attn_core as ac
from attn_core.analysis import crossovers, fit_slopes, series_name, summary, theory_curves
from attn_core.results import frame_from_rows

NS = (256, 512, 1024, 2048, 4096)


def point(mechanism, n, t, peak=None, status="ok", params=None, gflops=10.0):
    spec = ac.get(mechanism)
    return {"mechanism": mechanism, "label": spec.label, "exact": spec.exact,
            "params": json.dumps(params if params is not None else spec.defaults, sort_keys=True), "n": n,
            "batch": 1, "heads": 8, "d_model": 512, "head_dim": 64, "dtype": "float32", "device": "cpu",
            "mode": "forward", "causal": False, "status": status, "reason": "" if status == "ok" else "x",
            "time_median_s": t if status == "ok" else math.nan, "time_iqr_s": 0.0, "time_samples": [t],
            "repeats": 1, "peak_bytes": (peak if peak is not None else t * 1e9) if status == "ok" else math.nan,
            "memory_method": "torch.profiler (CPU allocator)", "predicted_bytes": 1.0, "theory_flops": 1.0,
            "gflops": gflops, "device_gflops": 100.0, "pct_of_device": gflops, "sdpa_backend": "", "threads": 2.0}


def frame(series: dict, ns=NS, **kw):
    return frame_from_rows([point(m, n, f(n), **kw) for m, f in series.items() for n in ns])


def test_slope_recovers_a_known_exponent_with_its_n_range():
    df = frame({"softmax": lambda n: 3e-9 * n ** 2, "linear": lambda n: 2e-6 * n ** 1.5})
    slopes = fit_slopes(df, "time_median_s").set_index("mechanism")
    assert slopes.loc["softmax", "slope"] == pytest.approx(2.0, abs=1e-9)
    assert slopes.loc["linear", "slope"] == pytest.approx(1.5, abs=1e-9)
    assert (slopes.loc["linear", "n_min"], slopes.loc["linear", "n_max"], slopes.loc["linear", "points"]) == \
        (256, 4096, 5)
    upper = fit_slopes(df, "time_median_s", n_min=1024).set_index("mechanism")
    assert (upper.loc["softmax", "n_min"], upper.loc["softmax", "points"]) == (1024, 3)


def test_slope_ignores_non_ok_points_and_needs_two():
    rows = [point("softmax", 256, 1.0), point("softmax", 512, 4.0), point("softmax", 1024, 1.0, status="oom")]
    assert fit_slopes(frame_from_rows(rows), "time_median_s")["slope"].iloc[0] == pytest.approx(2.0)
    one = fit_slopes(frame_from_rows(rows[:1]), "peak_bytes")
    assert math.isnan(one["slope"].iloc[0]) and one["points"].iloc[0] == 1
    with pytest.raises(ValueError, match="metric"):
        fit_slopes(frame_from_rows(rows), "colour")


def test_theory_curves_are_scaled_by_least_squares_in_log_space():
    df = frame({"softmax": lambda n: 3e-9 * n ** 2, "sliding_window": lambda n: 5e-7 * n})
    curves = theory_curves(df, "time_median_s")
    soft = curves[(curves["mechanism"] == "softmax") & (curves["curve"] == "O(n²) fit")].set_index("n")["value"]
    for n in NS:  # an exact n² law is passed through exactly
        assert soft[n] == pytest.approx(3e-9 * n ** 2, rel=1e-9)
    labels = set(curves[curves["mechanism"] == "sliding_window"]["curve"])
    assert labels == {"O(n²) fit", "O(n) fit", "O(n·w·d) fit"}
    lin = curves[(curves["mechanism"] == "sliding_window") & (curves["kind"] == "n")].set_index("n")["value"]
    assert lin[1024] == pytest.approx(5e-7 * 1024, rel=1e-9)
    # least squares in log space: the geometric mean of the ratios measured / n² is the constant
    ratios = np.array([5e-7 * n / n ** 2 for n in NS])
    quad = curves[(curves["mechanism"] == "sliding_window") & (curves["kind"] == "n²")].set_index("n")["value"]
    assert quad[1024] == pytest.approx(math.exp(np.log(ratios).mean()) * 1024 ** 2, rel=1e-9)


def test_own_curve_follows_the_spec_cost_over_n():
    spec = ac.get("sliding_window")

    def cost(n):
        return spec.memory_bytes(ac.Shape(1, 8, n, n, 64), **spec.defaults)

    df = frame({"sliding_window": lambda n: 1e-9}, )
    df["peak_bytes"] = [7.0 * cost(n) for n in df["n"]]
    own = theory_curves(df, "peak_bytes")
    own = own[own["kind"] == "spec"].set_index("n")["value"]
    assert own[2048] == pytest.approx(7.0 * cost(2048), rel=1e-9)


def test_crossover_is_interpolated_in_log_log_space():
    # softmax 1e-9·n², sliding window 1e-6·n: equal at n = 1000, which is not a measured n
    df = frame({"softmax": lambda n: 1e-9 * n ** 2, "sliding_window": lambda n: 1e-6 * n}, ns=(250, 500, 2000, 4000))
    out = crossovers(df, "time_median_s", "softmax").set_index("mechanism")
    assert out.loc["sliding_window", "n_star"] == pytest.approx(1000.0, rel=1e-9)
    assert "faster than softmax from n ≈ 1000 (between n = 500 and 2000)" == out.loc["sliding_window", "note"]
    assert "softmax" not in out.index


def test_crossover_not_within_the_measured_range():
    df = frame({"softmax": lambda n: 1e-9 * n ** 2, "sdpa": lambda n: 1e-12 * n ** 2,
                "linear": lambda n: 1.0 * n})
    out = crossovers(df, "peak_bytes", "softmax").set_index("mechanism")
    assert math.isnan(out.loc["sdpa", "n_star"]) and math.isnan(out.loc["linear", "n_star"])
    assert out.loc["sdpa", "note"] == "not within the measured range: already smaller than softmax at the " \
                                      "smallest common n = 256"
    assert out.loc["linear", "note"] == "not within the measured range: not smaller than softmax up to n = 4096"
    missing = crossovers(df, "time_median_s", "performer")
    assert missing["note"].str.contains("no measured points").all()


def test_series_are_told_apart_by_their_non_default_parameters():
    assert series_name("sliding_window", "Sliding window", '{"window": 64}') == "Sliding window (window=64)"
    assert series_name("sliding_window", "Sliding window", '{"window": 256}') == "Sliding window"
    rows = [point("sliding_window", n, 1e-6 * n * w, params={"window": w}) for w in (64, 256) for n in NS]
    assert len(fit_slopes(frame_from_rows(rows), "time_median_s")) == 2


def test_summary_reports_exponents_speedups_and_savings_at_the_largest_common_n():
    df = frame({"softmax": lambda n: 1e-9 * n ** 2, "sdpa": lambda n: 0.5e-9 * n ** 2,
                "sliding_window": lambda n: 1e-6 * n})
    table = summary(df).set_index("mechanism")
    sw = table.loc["sliding_window"]
    assert sw["time_exponent"] == pytest.approx(1.0) and sw["memory_exponent"] == pytest.approx(1.0)
    assert sw["speedup_vs_softmax"] == pytest.approx(1e-9 * 4096 ** 2 / (1e-6 * 4096))
    assert sw["speedup_vs_sdpa"] == pytest.approx(0.5e-9 * 4096 ** 2 / (1e-6 * 4096))
    assert sw["at_n_vs_softmax"] == 4096 and sw["ok_points"] == 5 and sw["points"] == 5
    assert table.loc["softmax", "speedup_vs_softmax"] == 1.0
    assert sw["memory_method"] == "torch.profiler (CPU allocator)" and sw["gflops"] == 10.0
