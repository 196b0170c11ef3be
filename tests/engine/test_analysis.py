"""Slopes, theory curves, crossovers and the summary on synthetic points with known answers."""
from __future__ import annotations

import json
import math

import numpy as np
import pytest

import attn_core as ac
from attn_core.engine import analysis
from attn_core.engine.analysis import crossovers, fit_slopes, loglog_slope, series_name, summary, theory_curves
from attn_core.engine.results import frame_from_rows

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
            "executed_flops": 1.0, "gflops": gflops, "device_gflops": 100.0, "pct_of_device": gflops,
            "sdpa_backend": "", "threads": 2.0, "foreign_cpu": 0.0, "load_average": 0.5, "disturbed": False,
            "retaken": 0}


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


def test_loglog_slope_against_known_exponents_and_a_hand_computed_fit():
    ns = [256, 512, 1024, 4096]
    assert loglog_slope(ns, [3 * n ** 1.5 for n in ns]) == pytest.approx(1.5, abs=1e-12)
    assert loglog_slope(ns, [7.0] * len(ns)) == pytest.approx(0.0, abs=1e-12)
    assert math.isnan(loglog_slope([1024, 1024, 1024], [1.0, 2.0, 3.0]))
    assert math.isnan(loglog_slope([], []))
    # Uneven points: the slope is cov(log n, log y) / var(log n), written out here rather than through a fit.
    ys = [0.011, 0.019, 0.047, 0.160]
    xs, ls = [math.log(n) for n in ns], [math.log(y) for y in ys]
    mx, my = sum(xs) / len(xs), sum(ls) / len(ls)
    by_hand = sum((x - mx) * (y - my) for x, y in zip(xs, ls)) / sum((x - mx) ** 2 for x in xs)
    assert loglog_slope(ns, ys) == pytest.approx(by_hand, rel=1e-12)


def test_slope_ignores_non_ok_points_and_needs_three():
    rows = [point("softmax", n, n * n * 1e-9) for n in (256, 512, 1024)] + [point("softmax", 2048, 1.0, status="oom")]
    assert fit_slopes(frame_from_rows(rows), "time_median_s")["slope"].iloc[0] == pytest.approx(2.0)
    two = fit_slopes(frame_from_rows(rows[:2]), "peak_bytes")
    assert math.isnan(two["slope"].iloc[0]) and two["points"].iloc[0] == 2
    assert two["why"].iloc[0] == "needs 3 clean points, has 2"
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
        return spec.cost.memory_bytes(ac.Shape(1, 8, n, n, 64), **spec.defaults)

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


def disturbed(df, mechanism, ns, cores=0.9, retaken=3):
    """df with the points of `mechanism` at `ns` marked disturbed (other programs took `cores` cores)."""
    hit = (df["mechanism"] == mechanism) & df["n"].isin(ns)
    df.loc[hit, ["disturbed", "foreign_cpu", "retaken"]] = [True, cores, retaken]
    return df


def test_disturbed_points_are_left_out_of_slopes_curves_and_n_star():
    # the disturbed softmax points are 10× too slow: any fit that used them would move
    df = frame({"softmax": lambda n: 1e-9 * n ** 2, "sliding_window": lambda n: 1e-6 * n}, ns=(250, 500, 2000, 4000))
    df.loc[(df["mechanism"] == "softmax") & (df["n"] == 4000), "time_median_s"] *= 10
    df = disturbed(df, "softmax", [4000])
    slopes = fit_slopes(df, "time_median_s").set_index("mechanism")
    assert slopes.loc["softmax", "slope"] == pytest.approx(2.0) and slopes.loc["softmax", "disturbed"] == 1
    assert slopes.loc["softmax", "points"] == 3 and slopes.loc["softmax", "n_max"] == 2000
    curves = theory_curves(df, "time_median_s")
    quad = curves[(curves["mechanism"] == "softmax") & (curves["kind"] == "n²")].set_index("n")["value"]
    assert quad[4000] == pytest.approx(1e-9 * 4000 ** 2)  # the curve still reaches the disturbed point's n
    assert crossovers(df, "time_median_s").set_index("mechanism").loc["sliding_window", "n_star"] == \
        pytest.approx(1000.0)
    # peak memory does not depend on contention: the memory fit keeps the point
    assert fit_slopes(df, "peak_bytes").set_index("mechanism").loc["softmax", "points"] == 4


def test_a_series_without_clean_points_gets_no_curve_and_says_why():
    df = disturbed(frame({"softmax": lambda n: 1e-9 * n ** 2, "linear": lambda n: 1e-6 * n}), "linear", NS)
    curves = theory_curves(df, "time_median_s")
    assert set(curves["mechanism"]) == {"softmax"}
    assert analysis.unfitted(df, "time_median_s") == ["Linear (elu+1)"]
    slope = fit_slopes(df, "time_median_s").set_index("mechanism").loc["linear"]
    assert math.isnan(slope["slope"]) and slope["why"] == "needs 3 clean points, has 0 (5 disturbed left out)"


def test_a_sweep_stopped_after_two_points_fits_no_exponent_and_the_table_says_why():
    rows = [point("softmax", n, t) for n, t in ((256, 1e-3), (512, 5e-5))]  # noise: a slope of −4.3
    rows += [point("softmax", n, math.nan, status="cancelled") for n in (1024, 2048, 4096)]
    df = frame_from_rows(rows)
    row = summary(df).iloc[0]
    assert math.isnan(row["time_exponent"]) and math.isnan(row["memory_exponent"])
    assert row["note"] == "time and memory k: needs 3 clean points, has 2"
    assert analysis.stopped_note(df) == "Stopped after 2 of 5 points; the table covers the measured ones."
    assert analysis.stopped_note(df.iloc[:2]) == ""


def test_contention_summary_counts_disturbed_points_cores_and_retakes():
    df = frame({"softmax": lambda n: 1e-9 * n ** 2, "linear": lambda n: 1e-6 * n})
    assert analysis.contention_summary(df) == ""
    df = disturbed(df, "softmax", [256, 512], cores=0.8)
    df = disturbed(df, "linear", [256, 512], cores=1.0)
    df.loc[df["n"] == 1024, "retaken"] = 2  # re-measured, then clean
    assert analysis.contention_summary(df) == (
        "The computer was busy with other programs while 4 of 10 points were timed (they used about 0.9 processor "
        "cores): those points are drawn hollow on the time chart and left out of the dashed curves and n*. 2 points "
        "were slowed by other programs and timed again: 4 slow runs were repeated until clean.")
    clean = df.assign(disturbed=False, retaken=0)
    clean.loc[0, "retaken"] = 1
    assert analysis.contention_summary(clean) == "1 point was slowed by other programs and timed again: 1 slow run " \
                                                 "was repeated until clean."


def test_roofline_is_executed_flops_at_one_device_throughput():
    df = frame({"softmax": lambda n: 1e-9 * n ** 2, "linear": lambda n: 1e-6 * n})
    df["executed_flops"] = [4.0 * n * n if m == "softmax" else 8.0 * n for m, n in zip(df["mechanism"], df["n"])]
    df["device_gflops"] = [100.0, 90.0, 110.0] + [100.0] * (len(df) - 3)
    df.loc[1, "device_gflops"] = math.nan
    roof = analysis.roofline(df)
    assert set(roof["kind"]) == {"roofline"} and len(roof) == len(df)
    assert set(roof["curve"]) == {"hardware limit at 100 GFLOP/s (matmul, measured)"}  # the median, for all
    for r in roof.itertuples():
        flops = 4.0 * r.n ** 2 if r.mechanism == "softmax" else 8.0 * r.n
        assert r.value == pytest.approx(flops / 100e9)
    assert analysis.roofline(df.assign(device_gflops=math.nan)).empty


def test_above_100_percent_of_the_device_carries_a_note():
    df = frame({"linear": lambda n: 1e-6 * n}, gflops=140.0)
    note = summary(df).iloc[0]["note"]
    assert note.startswith("140 % of device: above the device's measured matmul throughput")
    assert math.isclose(summary(df).iloc[0]["pct_of_device"], 140.0)


def test_a_baseline_that_was_not_measured_is_named_with_how_to_include_it():
    df = frame({"softmax": lambda n: 1e-9 * n ** 2, "linear": lambda n: 1e-6 * n})
    assert analysis.baseline_note(df, "softmax") == ""
    assert analysis.baseline_note(df, "sdpa") == ("No crossover against Softmax (fused SDPA): this sweep did not "
                                                  "measure it. Add Softmax (fused SDPA) under Exact mechanisms in "
                                                  "Settings and press Run.")
    assert analysis.summary_notes(df) == ["No comparison with Softmax (fused SDPA): this sweep did not measure it."]
    busy = disturbed(df, "softmax", NS)
    assert "every point of it was disturbed" in analysis.baseline_note(busy, "softmax")
    assert analysis.summary_notes(busy)[0] == "No speed-up vs Softmax (materialized): every timed point of it " \
                                              "was disturbed."


def test_a_busy_matmul_figure_is_said_once_and_only_then():
    from attn_core.engine import analysis

    assert analysis.matmul_note({"device_gflops": 300.0, "device_gflops_disturbed": False}) == ""
    assert analysis.matmul_note({}) == ""
    assert "every % of device reads high" in analysis.matmul_note({"device_gflops_disturbed": True})


@pytest.mark.parametrize("device,dtype,said", [("cuda", "float32", True), ("cuda", "bfloat16", False),
                                               ("cpu", "float32", False)])
def test_float32_on_a_cuda_gpu_says_the_tensor_cores_were_left_off(device, dtype, said):
    from attn_core.cli import format_summary
    df = frame({"softmax": lambda n: n * 1e-6})
    df["device"], df["dtype"] = device, dtype
    assert (analysis.precision_note(df) == analysis.PRECISION_NOTE) is said
    assert (analysis.PRECISION_NOTE in format_summary(df)) is said
