"""When does compiling pay off (attn_core.charts.payoff) and the sentence saying where compiled Flex is faster
(engine.analysis.flex_faster), from frames of rows written here, the break-even k worked out by hand."""
from __future__ import annotations

import math

import pytest

from attn_core.charts import payoff
from attn_core.engine import analysis
from attn_core.engine.results import frame_from_rows

NAN = math.nan


def row(implementation: str, n: int, t: float, compile_s: float = NAN, mask_s: float = NAN, **kw) -> dict:
    base = {"mechanism": "sliding_window", "label": "Sliding window", "exact": True, "params": '{"window": 256}',
            "n": n, "batch": 1, "heads": 8, "d_model": 512, "head_dim": 64, "dtype": "float32", "device": "cpu",
            "mode": "forward", "causal": False, "status": "ok", "reason": "", "time_median_s": t,
            "time_iqr_s": t / 10, "time_samples": [t] * 3, "repeats": 3, "peak_bytes": 1e6,
            "memory_method": "torch.profiler (CPU allocator)", "predicted_bytes": 1e6, "theory_flops": 1e9,
            "executed_flops": 1e9, "gflops": 1.0, "device_gflops": 100.0, "pct_of_device": 1.0, "sdpa_backend": "",
            "threads": 2.0, "foreign_cpu": 0.0, "load_average": 0.5, "disturbed": False, "retaken": 0,
            "implementation": implementation, "compile_s": compile_s, "mask_s": mask_s}
    return {**base, **kw}


def frame():
    """n = 1,024: Flex slower than ours; n = 4,096: ours 10 ms, Flex 6 ms after 12 s of compile and 0.4 s of block
    mask, the dense mask 40 ms after 0.05 s."""
    return frame_from_rows([
        row("ours", 1024, 0.002), row("flex", 1024, 0.003, 10.0, 0.1), row("dense-mask", 1024, 0.01, NAN, 0.01),
        row("ours", 4096, 0.010), row("flex", 4096, 0.006, 12.0, 0.4), row("dense-mask", 4096, 0.04, NAN, 0.05)])


def test_break_even_k_is_the_one_time_cost_over_the_time_saved_a_call():
    even = payoff.break_even(frame(), 4096).set_index("implementation")
    assert even.loc["flex", "k_star"] == pytest.approx(12.4 / (0.010 - 0.006))  # 3,100 calls
    assert "pays off after k ≈ 3,100 calls" in even.loc["flex", "note"]
    assert math.isnan(even.loc["dense-mask", "k_star"]) and "never pays off" in even.loc["dense-mask", "note"]
    assert math.isnan(payoff.break_even(frame(), 1024).set_index("implementation").loc["flex", "k_star"])


def test_the_total_of_k_calls_is_once_plus_k_times_a_call_and_the_axis_reaches_past_k_star():
    lines = payoff.payoff_frame(frame(), 4096)
    flex = lines[lines["implementation"] == "flex"]
    for k, total in zip(flex["k"], flex["total_s"]):
        assert total == pytest.approx(12.4 + k * 0.006)
    ours = lines[lines["implementation"] == "ours"]
    assert ours["total_s"].tolist() == pytest.approx([k * 0.010 for k in ours["k"]])
    assert flex["k"].min() == 1 and flex["k"].max() == 100_000  # 4 × 3,100 rounded up to a power of ten
    dense = lines[lines["implementation"] == "dense-mask"]  # a compile not measured counts 0
    assert dense["total_s"].iloc[0] == pytest.approx(0.05 + 0.04)


def test_the_chart_marks_k_star_where_the_lines_cross_and_says_flex_is_faster():
    spec = payoff.payoff_chart(frame(), 4096).to_dict()
    marked = [layer for layer in spec["layer"] if (layer["mark"]["type"] if isinstance(layer["mark"], dict)
                                                   else layer["mark"]) == "text"]
    (points,) = [spec["datasets"][layer["data"]["name"]] for layer in marked]
    assert [p["label"] for p in points] == ["k* ≈ 3,100"]
    assert points[0]["total_s"] == pytest.approx(3100 * 0.010)  # on our line too: the two totals meet there
    subtitle = " ".join(spec["title"]["subtitle"])
    assert "faster per call than our kernel" in subtitle and "n = 4,096" in subtitle
    assert "faster" not in " ".join(payoff.payoff_chart(frame(), 1024).to_dict()["title"]["subtitle"][2:])


def test_flex_faster_names_where_its_median_is_lower_and_only_there():
    said = analysis.flex_faster(frame())
    assert "Sliding window at n = 4,096 (6 ms against ours 10 ms, 1.67× faster)" in said
    assert "1,024" not in said
    slower = frame_from_rows([row("ours", 4096, 0.005), row("flex", 4096, 0.006, 12.0, 0.4)])
    assert analysis.flex_faster(slower) == ""
    other = frame_from_rows([row("ours", 4096, 0.010, causal=True), row("flex", 4096, 0.006, 12.0, 0.4)])
    assert analysis.flex_faster(other) == ""  # a causal kernel of ours is not the same problem


def test_the_one_time_table_lists_only_other_implementations_with_their_costs():
    table = payoff.one_time_table(frame())
    assert len(table) == 4 and table["Implementation"].str.contains(" · ").all()  # ours pays nothing once
    flex = table[table["Implementation"].str.endswith("compiled Flex") & (table["n"] == 4096)].iloc[0]
    assert flex["compile (s, once, not in the time)"] == 12.0 and flex["time per call (ms, median)"] == 6.0
    assert payoff.payoff_ns(frame()) == [1024, 4096]
    assert payoff.payoff_ns(frame_from_rows([row("ours", 4096, 0.01)])) == []


def test_the_chart_exports_as_the_other_figures_do_with_its_marks_and_data():
    from attn_core.insight import charts as insight
    chart = payoff.payoff_chart(frame(), 4096)
    made = {fmt: (data, name) for fmt, data, name, _ in insight.downloads(chart, payoff.payoff_frame(frame(), 4096),
                                                                          "attention-payoff")}
    svg = made["SVG"][0]()
    svg = svg.decode() if isinstance(svg, bytes) else svg
    assert "When does compiling pay off? n = 4,096" in svg and "k* ≈ 3,100" in svg
    csv = made["CSV"][0]()
    assert made["CSV"][1] == "attention-payoff.csv" and b"total_s" in (csv if isinstance(csv, bytes) else csv.encode())
