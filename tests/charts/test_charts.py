"""Scaling charts, checked through chart.to_dict(): layers, encodings, units and what non-ok points say."""
import html
import json
import math
import re

import altair as alt
import numpy as np
import pandas as pd
import pytest

from attn_core import MECHANISMS
from attn_core.charts import export, scaling, style
from attn_core.insight import charts as insight
from attn_core.engine.presets import QUICK_DEMO
from attn_core.engine.results import frame_from_rows


def results_frame(mechanisms=("softmax", "linear"), ns=(64, 128, 256), causal=False, skip_last=True) -> pd.DataFrame:
    """A typed results frame with the contract's columns: softmax costs n², linear n; softmax's largest n is skipped
    with a reason."""
    rows = []
    for key in mechanisms:
        spec = MECHANISMS[key]
        for n in ns:
            skipped = skip_last and key == "softmax" and n == ns[-1]
            t = float("nan") if skipped else (1e-8 * n * n if key == "softmax" else 1e-6 * n)
            peak = float("nan") if skipped else 4.0 * (n * n if key == "softmax" else 64 * n)
            rows.append(dict(
                mechanism=key, label=spec.label, exact=spec.exact, params=json.dumps(spec.defaults), n=n, batch=1,
                heads=8, d_model=512, head_dim=64, dtype="float32", device="cpu", mode="forward", causal=causal,
                status="skipped" if skipped else "ok", reason="predicted 9 GiB exceeds the guard" if skipped else "",
                time_median_s=t, time_iqr_s=t / 10, time_samples=[] if skipped else [t] * 3,
                repeats=0 if skipped else 3, peak_bytes=peak, memory_method="torch.profiler (CPU allocator)",
                predicted_bytes=4.0 * n * n, theory_flops=4.0 * 8 * n * n * 64, executed_flops=4.0 * 8 * n * n * 64,
                gflops=np.nan if skipped else 12.5, device_gflops=100.0, pct_of_device=np.nan if skipped else 12.5,
                sdpa_backend="", threads=2, foreign_cpu=0.0, load_average=0.5, disturbed=False, retaken=0))
    return frame_from_rows(rows)


def layer_data(spec: dict, mark: str) -> list[list[dict]]:
    """The rows behind each layer drawing `mark`."""
    out = []
    for layer in spec["layer"]:
        kind = layer["mark"]["type"] if isinstance(layer["mark"], dict) else layer["mark"]
        if kind == mark:
            out.append(spec["datasets"][layer["data"]["name"]])
    return out


def test_time_chart_draws_ok_points_in_ms_and_labels_unit_and_method():
    spec = scaling.scaling_chart(results_frame(), "time_median_s").to_dict()
    points = [r for rows in layer_data(spec, "point") for r in rows if r["drawn"]]
    assert len(points) == 5  # six points, softmax at n=256 skipped
    first = next(r for r in points if r["mechanism"] == "softmax" and r["n"] == 64)
    assert first["time_ms"] == pytest.approx(1e-8 * 64 * 64 * 1e3)
    assert "ms median" in first["time"] and "3 repeats" in first["time"]
    y = spec["layer"][0]["encoding"]["y"]
    assert "(ms)" in y["title"][0] and "median wall-clock" in y["title"][1]
    assert y["scale"]["type"] == "log" and spec["layer"][0]["encoding"]["x"]["scale"]["type"] == "log"


def test_memory_chart_names_its_method_and_uses_mib():
    spec = scaling.scaling_chart(results_frame(), "peak_bytes", log=False).to_dict()
    y = spec["layer"][0]["encoding"]["y"]
    assert "MiB" in y["title"][0] and "torch.profiler (CPU allocator)" in y["title"][1]
    assert "scale" not in y or y["scale"].get("type") != "log"
    rows = layer_data(spec, "point")[0]
    linear = next(r for r in rows if r["mechanism"] == "linear" and r["n"] == 128)
    assert linear["memory_mib"] == pytest.approx(4.0 * 64 * 128 / 2**20)
    assert f"{int(4 * 64 * 128):,} B" in linear["memory"]


def test_skipped_point_is_a_cross_whose_tooltip_gives_the_reason():
    spec = scaling.scaling_chart(results_frame(), "time_median_s").to_dict()
    crosses = [layer for layer in spec["layer"] if layer["mark"].get("shape") == "cross"]
    assert len(crosses) == 1
    rows = spec["datasets"][crosses[0]["data"]["name"]]
    assert [(r["mechanism"], r["n"]) for r in rows] == [("softmax", 256)]
    assert rows[0]["why"] == "skipped: predicted 9 GiB exceeds the guard"
    assert any(t["field"] == "why" for t in crosses[0]["encoding"]["tooltip"])


def test_zero_memory_cannot_sit_on_a_log_axis_and_says_so():
    df = results_frame(skip_last=False)
    df.loc[0, "peak_bytes"] = 0.0
    pts = scaling.points_frame(df, "peak_bytes", log=True)
    assert not pts.loc[0, "drawn"] and "log axis" in pts.loc[0, "why"]
    assert scaling.points_frame(df, "peak_bytes", log=False).loc[0, "drawn"]


def svg_texts(chart) -> set[str]:
    """Every text the chart draws, as rendered by Vega (vl-convert): titles, axes, legends, marks."""
    svg = export.chart_svg(chart).decode()
    return {html.unescape(t) for t in re.findall(r"<text[^>]*>([^<]*)</text>", svg)}


def test_theory_curves_are_dashed_and_the_legend_says_how_they_are_scaled():
    spec = scaling.figure(results_frame(), "time_median_s", curves=("spec", "n²")).to_dict()
    dashed = [layer for layer in spec["layer"] if "strokeDash" in layer.get("encoding", {})]
    assert len(dashed) == 1
    title = " ".join(dashed[0]["encoding"]["strokeDash"]["title"])
    assert title == "Dashed: theory, scaled to the clean points"  # how, in words, on the page beside
    rows = spec["datasets"][dashed[0]["data"]["name"]]
    assert {r["kind"] for r in rows} == {"spec", "n²"}
    softmax = [r for r in rows if r["mechanism"] == "softmax" and r["kind"] == "n²"]
    # softmax's two measured points are exactly 1e-8·n² s, so its fitted n² curve passes through them
    assert all(r["time_ms"] == pytest.approx(1e-8 * r["n"] ** 2 * 1e3) for r in softmax)
    assert layer_data(spec, "text") == []  # no label sits on a line: each formula follows its name in the legend
    texts = svg_texts(scaling.figure(results_frame(), "time_median_s", curves=("spec", "n²")))
    assert {"Softmax (materialized) — O(n²·d)", "Linear (elu+1) — O(n·d²)"} <= texts


def test_only_the_chosen_kinds_of_theory_curve_are_drawn():
    spec = scaling.figure(results_frame(), "peak_bytes", curves=("n",)).to_dict()
    (dashed,) = [layer for layer in spec["layer"] if "strokeDash" in layer.get("encoding", {})]
    assert {r["kind"] for r in spec["datasets"][dashed["data"]["name"]]} == {"n"}


def test_crossover_is_marked_at_n_star_where_the_lines_meet():
    # linear (1e-6·n) and softmax (1e-8·n²) meet at n = 100, between the measured 64 and 128
    spec = scaling.figure(results_frame(), "time_median_s", baseline="softmax", curves=()).to_dict()
    (rules,) = layer_data(spec, "rule")
    assert [r["mechanism"] for r in rules] == ["linear"]
    assert rules[0]["n"] == pytest.approx(100, rel=1e-6)
    assert rules[0]["time_ms"] == pytest.approx(1e-6 * 100 * 1e3, rel=1e-6)
    assert rules[0]["line_text"] == "Linear (elu+1) overtakes Softmax (materialized) at n* ≈ 100"
    assert layer_data(spec, "text") == []  # named in a legend, which says the pair
    texts = svg_texts(scaling.figure(results_frame(), "time_median_s", baseline="softmax", curves=()))
    assert "Linear (elu+1) overtakes Softmax (materialized) at n* ≈ 100" in texts


def test_no_crossover_within_the_range_draws_no_mark():
    spec = scaling.figure(results_frame(ns=(256, 512, 1024), skip_last=False), "time_median_s").to_dict()
    assert layer_data(spec, "rule") == []


def test_mixed_causal_frame_keeps_two_lines_per_mechanism_told_apart_by_shape():
    df = pd.concat([results_frame(causal=False), results_frame(causal=True)], ignore_index=True)
    spec = scaling.scaling_chart(df, "time_median_s").to_dict()
    rows = layer_data(spec, "point")[0]
    softmax = "Softmax (materialized)"
    assert {r["series"] for r in rows} >= {f"{softmax} · causal", f"{softmax} · bidirectional"}
    point_layer = next(layer for layer in spec["layer"] if layer["mark"]["type"] == "point")
    assert point_layer["encoding"]["shape"]["field"] == "mask"
    line_layer = next(layer for layer in spec["layer"] if layer["mark"]["type"] == "line")
    assert line_layer["encoding"]["strokeDash"]["field"] == "mask"  # the masks differ in line style too
    dashes = dict(zip(*(line_layer["encoding"]["strokeDash"]["scale"][k] for k in ("domain", "range"))))
    assert dashes["bidirectional"] == [1, 0] and dashes["causal"] not in [*scaling.DASHES.values(), [1, 0]]
    assert "Mask (line style)" in svg_texts(scaling.scaling_chart(df, "time_median_s"))
    table = scaling.summary_table(df)
    assert list(table["Mechanism"]).count("Linear (elu+1) · causal") == 1


def test_summary_table_names_units_and_compares_with_softmax():
    table = scaling.summary_table(results_frame(ns=(64, 128, 256, 512), skip_last=False))
    linear = table.set_index("Mechanism").loc["Linear (elu+1)"]
    assert linear["time ∝ n^k: k"] == pytest.approx(1.0, abs=1e-3)
    assert linear["speed-up vs softmax (×)"] == pytest.approx(1e-8 * 512 / 1e-6, rel=1e-3)
    assert linear["memory measured by"] == "torch.profiler (CPU allocator)"


def test_a_second_setting_of_a_mechanism_is_its_own_line_with_its_own_colour():
    wide = results_frame(("linear",))
    narrow = wide.assign(params='{"window": 8}', mechanism="sliding_window", label="Sliding window")
    spec = scaling.scaling_chart(pd.concat([wide, narrow, narrow.assign(params='{"window": 16}')]), "time_median_s")
    scale = spec.to_dict()["layer"][0]["encoding"]["color"]["scale"]
    assert scale["domain"] == ["Sliding window (window=8)", "Sliding window (window=16)", "Linear (elu+1)"]
    assert len(set(scale["range"])) == 3


def test_colours_follow_the_catalogue_so_a_mechanism_keeps_its_colour():
    one = scaling.scaling_chart(results_frame(("softmax", "linear")), "time_median_s").to_dict()
    two = scaling.scaling_chart(results_frame(("linear",)), "time_median_s").to_dict()
    scale = lambda s: s["layer"][0]["encoding"]["color"]["scale"]  # noqa: E731
    assert dict(zip(scale(one)["domain"], scale(one)["range"]))["Linear (elu+1)"] == scale(two)["range"][0]


def test_talk_mode_uses_larger_type_and_thicker_lines():
    plain = scaling.scaling_chart(results_frame(), "time_median_s").to_dict()
    talk = scaling.scaling_chart(results_frame(), "time_median_s", talk=True).to_dict()
    assert talk["config"]["axis"]["labelFontSize"] > plain["config"]["axis"]["labelFontSize"]
    assert talk["layer"][0]["mark"]["strokeWidth"] > plain["layer"][0]["mark"]["strokeWidth"]


def test_title_and_subtitle_are_editable_and_default_to_the_setup():
    df = results_frame()
    default = scaling.scaling_chart(df, "peak_bytes").to_dict()["title"]
    assert default["text"] == "Peak memory of one forward call vs sequence length"
    assert "d_model 512" in default["subtitle"] and "float32" in default["subtitle"]
    mine = scaling.scaling_chart(df, "peak_bytes", title="The quadratic wall", subtitle="live").to_dict()["title"]
    assert (mine["text"], mine["subtitle"]) == ("The quadratic wall", "live")


def test_an_empty_frame_still_makes_a_valid_chart():
    empty = results_frame().iloc[0:0]
    spec = scaling.scaling_chart(empty, "time_median_s").to_dict()
    assert spec["title"]["subtitle"] == ""


def test_a_live_spec_matches_a_fresh_build_and_is_rebuilt_only_when_its_shape_changes():
    df = results_frame(ns=(64, 128, 256, 512), skip_last=False)
    live = scaling.LiveSpec()
    live.update(df.iloc[:-1], "time_median_s")  # one point fewer: the same lines, lengths and marks
    built = live.spec
    assert live.update(df, "time_median_s") == scaling.figure(df, "time_median_s").to_dict(validate=False)
    assert live.spec is built  # same lines, axes and titles: only the data changed
    live.update(df, "time_median_s", log=False)
    assert live.spec is not built
    live.update(df, "time_median_s")
    assert live.spec is built  # a shape seen before is not built again


NOT_MEASURED = "not measured: the point's time budget was spent on timing"


def without_memory(df, rows=None):
    """df with memory not measured at `rows` (all when None), the reason in memory_method as the engine writes it."""
    hit = df.index if rows is None else rows
    df.loc[hit, ["peak_bytes", "memory_method"]] = [np.nan, NOT_MEASURED]
    return df


def layers_of(spec: dict, mark: str) -> list[dict]:
    return [layer for layer in spec["layer"] if (layer["mark"]["type"] if isinstance(layer["mark"], dict)
                                                 else layer["mark"]) == mark]


@pytest.mark.parametrize("rows", [None, [2, 5], [0]])
def test_memory_not_measured_stays_out_of_the_axis_title_and_the_plot_keeps_its_scale(rows):
    df = without_memory(results_frame(skip_last=False), rows)
    if rows == [0]:
        df = df.iloc[[0, 3]]  # one point drawn: a single value, which Vega would give a flat axis
    for log in (True, False):
        spec = scaling.figure(df, "peak_bytes", log=log).to_dict()
        (y,) = [layer["encoding"]["y"] for layer in spec["layer"] if layer["data"].get("name") == "points"]
        assert not any("not measured" in line for line in y["title"]), y["title"]
        if rows is None:  # nothing drawable: an explicit domain and a sentence in the plot
            assert y["scale"]["domain"] == list(scaling.EMPTY_DOMAIN[log])
            assert layers_of(spec, "text")[0]["mark"]["text"] == "No measured value to draw"
        elif rows == [0]:
            # the theory curve scaled to the one point may carry its last bit of rounding into the top
            assert y["scale"]["domain"] == pytest.approx([0.01, 0.1] if log else [0.0, 2 * 4.0 * 64 * 64 / 2**20],
                                                         rel=1e-12)
        elif log:  # within one decade: the powers of ten around the values
            assert y["scale"]["domain"] == [0.01, 0.1]
        else:
            assert "domain" not in y["scale"]  # a real range: Vega's own
        (crosses,) = [layer for layer in layers_of(spec, "point") if layer["mark"].get("shape") == "cross"]
        assert {r["why"] for r in spec["datasets"][crosses["data"]["name"]]} == {NOT_MEASURED}
    note = scaling.chart_note(df, "peak_bytes")
    assert note.startswith("Not drawn (crosses on the bottom edge): ") and NOT_MEASURED in note


def test_disturbed_points_are_hollow_with_the_figure_in_their_tooltip_and_out_of_the_fits():
    df = results_frame(ns=(64, 128, 256, 512), skip_last=False)
    hit = (df["mechanism"] == "softmax") & (df["n"] == 512)
    df.loc[hit, "time_median_s"] *= 10  # would bend a fit that used it
    df.loc[hit, ["disturbed", "foreign_cpu", "retaken"]] = [True, 0.9, 3]
    spec = scaling.figure(df, "time_median_s", curves=("n²",)).to_dict()
    (hollow,) = [layer for layer in layers_of(spec, "point") if layer["mark"].get("filled") is False
                 and layer["data"]["name"] != "crossings" and "shape" not in layer["mark"]]
    (row,) = spec["datasets"][hollow["data"]["name"]]
    assert (row["mechanism"], row["n"]) == ("softmax", 512)
    assert row["contention"] == "measured while other programs used 0.9 cores; re-measured 3 samples (left out of " \
                                "the fits)"
    filled = [r for layer in layers_of(spec, "point") if layer["mark"].get("filled") is True
              for r in spec["datasets"][layer["data"]["name"]] if "drawn" in r]
    assert ("softmax", 512) not in {(r["mechanism"], r["n"]) for r in filled} and len(filled) == 7
    (dashed,) = [layer for layer in spec["layer"] if "strokeDash" in layer.get("encoding", {})]
    quad = {r["n"]: r["time_ms"] for r in spec["datasets"][dashed["data"]["name"]] if r["mechanism"] == "softmax"}
    assert quad[512] == pytest.approx(1e-8 * 512 ** 2 * 1e3)  # fitted on the three clean points only
    assert spec["title"]["subtitle"][1:] == [scaling.BUSY_FOOTNOTE]  # one line, not the method
    assert not scaling.figure(df, "peak_bytes").to_dict().get("datasets", {}).get("disturbed")  # memory: unaffected
    every = scaling.figure(df.assign(disturbed=True), "time_median_s").to_dict()  # nothing clean: still coloured
    assert every["layer"][0]["encoding"]["color"]["scale"]["domain"] == ["Softmax (materialized)", "Linear (elu+1)"]
    assert "No theory curve for Linear (elu+1): every point of it was disturbed." in \
        scaling.chart_note(df.assign(disturbed=True), "time_median_s")


def test_iqr_bars_span_the_25th_to_75th_percentile_of_the_samples():
    df = results_frame(skip_last=False)
    df["time_samples"] = [[t * f for f in (0.9, 1.0, 1.0, 1.1, 2.0)] for t in df["time_median_s"]]
    spec = scaling.figure(df, "time_median_s").to_dict()
    (bars,) = layers_of(spec, "errorbar")
    assert bars["encoding"]["y"]["field"] == "iqr_low" and bars["encoding"]["y2"]["field"] == "iqr_high"
    for r in spec["datasets"][bars["data"]["name"]]:
        (t,) = df.loc[(df["n"] == r["n"]) & (df["label"] == r["line"]), "time_median_s"]
        assert (r["iqr_low"], r["iqr_high"]) == pytest.approx((t * 1e3, t * 1.1e3))  # skewed: not median ± IQR/2
    assert layers_of(scaling.figure(df, "peak_bytes").to_dict(), "errorbar") == []


def test_roofline_is_executed_flops_at_the_sweeps_measured_matmul_throughput():
    df = results_frame(skip_last=False)
    df["executed_flops"] = 2 * df["theory_flops"]
    spec = scaling.figure(df, "time_median_s", curves=("roofline",)).to_dict()
    (dashed,) = [layer for layer in spec["layer"] if "strokeDash" in layer.get("encoding", {})]
    rows = spec["datasets"][dashed["data"]["name"]]
    assert {r["kind_label"] for r in rows} == {"hardware limit at 100 GFLOP/s (matmul, measured)"}
    assert dashed["encoding"]["strokeDash"]["scale"]["domain"] == ["hardware limit at 100 GFLOP/s (matmul, measured)"]
    for r in rows:
        assert r["time_ms"] == pytest.approx(2 * 4.0 * 8 * r["n"] ** 2 * 64 / 100e9 * 1e3)
    memory = scaling.figure(df, "peak_bytes", curves=("roofline",)).to_dict()
    assert not [layer for layer in memory["layer"] if "strokeDash" in layer.get("encoding", {})]


def test_more_than_100_percent_of_the_device_says_why():
    df = results_frame(skip_last=False)
    df.loc[0, "pct_of_device"] = 130.0
    rows = layer_data(scaling.figure(df, "time_median_s").to_dict(), "point")[0]
    above = next(r for r in rows if r["mechanism"] == "softmax" and r["n"] == 64)
    assert "above the device's measured matmul throughput" in above["throughput"]
    assert "above" not in next(r for r in rows if r["n"] == 128)["throughput"]
    assert "1 point is above the device's measured matmul throughput" in scaling.chart_note(df, "time_median_s")


def test_summary_table_names_its_flops_and_says_why_an_exponent_is_missing():
    table = scaling.summary_table(results_frame(ns=(64, 128), skip_last=False))
    assert table["time ∝ n^k: k"].isna().all() and table["memory ∝ n^k: k"].isna().all()  # kept, empty
    assert set(table["note"]) == {"time and memory k: needs 3 clean points, has 2"}
    assert "% of device matmul (executed FLOPs)" in table and "GFLOP/s at largest n (useful FLOPs)" in table
    assert "note" not in scaling.summary_table(results_frame(skip_last=False))


def colours_of(spec: dict) -> dict[str, str]:
    """A scaling chart's line → colour."""
    scale = spec["layer"][0]["encoding"]["color"]["scale"]
    return dict(zip(scale["domain"], scale["range"]))


def cie_lab(hex_colour: str) -> tuple[float, float, float]:
    """CIE L*a*b* (D65) of an sRGB colour, for CIE76 ΔE: the Euclidean distance of two."""
    rgb = [int(hex_colour[i:i + 2], 16) / 255 for i in (1, 3, 5)]
    r, g, b = [c / 12.92 if c <= 0.04045 else ((c + 0.055) / 1.055) ** 2.4 for c in rgb]
    xyz = (0.4124564 * r + 0.3575761 * g + 0.1804375 * b) / 0.95047, 0.2126729 * r + 0.7151522 * g + 0.0721750 * b, \
        (0.0193339 * r + 0.1191920 * g + 0.9503041 * b) / 1.08883
    x, y, z = [t ** (1 / 3) if t > (6 / 29) ** 3 else t / (3 * (6 / 29) ** 2) + 4 / 29 for t in xyz]
    return 116 * y - 16, 500 * (x - y), 200 * (y - z)


def test_the_palette_is_twelve_colours_each_far_from_the_others():
    assert len(style.PALETTE) >= 12 and len(set(style.PALETTE)) == len(style.PALETTE)
    palette = style.PALETTE
    distances = [math.dist(cie_lab(a), cie_lab(b)) for i, a in enumerate(palette) for b in palette[i + 1:]]
    assert min(distances) > 20  # CIE76: 2.3 is just noticeable; the old Softmax and Linear oranges were 14 apart


def assert_at_most_eight_far_apart(colours: dict[str, str], k: int) -> None:
    """A chart of k lines: min(k, 8) colours, every pair of them more than 10 apart in CIE76 ΔE (2.3 is just
    noticeable), all from the palette."""
    distinct = sorted(set(colours.values()))
    assert len(colours) == k and len(distinct) == min(k, 8) and set(distinct) <= set(style.PALETTE)
    assert all(math.dist(cie_lab(a), cie_lab(b)) > 10 for i, a in enumerate(distinct) for b in distinct[i + 1:])


@pytest.mark.parametrize("k", range(1, 13))
def test_up_to_twelve_mechanisms_get_at_most_eight_far_apart_colours_the_rest_dashed(k):
    keys = [*MECHANISMS][:13]
    keys = [keys[0], keys[-1], *keys[1:-1]][:k]  # softmax and the 13th, whose home colours are the same
    df = results_frame(tuple(keys), skip_last=False)
    df["time_median_s"] *= 1.5 ** df["mechanism"].map(keys.index)  # no line on another: only repeats are dashed
    spec = scaling.scaling_chart(df, "time_median_s").to_dict()
    colours = colours_of(spec)
    assert_at_most_eight_far_apart(colours, k)
    dashed = dashed_lines(spec)
    assert len(dashed) == max(k - 8, 0)  # the lines past the eighth repeat a colour: each drawn dashed, and named
    assert all(line in " ".join(spec["title"]["subtitle"]) for line in dashed)


@pytest.mark.parametrize("k", range(1, 13))
def test_up_to_twelve_settings_of_one_mechanism_get_at_most_eight_far_apart_colours(k):
    one = results_frame(("sliding_window",))
    df = pd.concat([one.assign(params=json.dumps({"window": w}), time_median_s=one["time_median_s"] * w)
                    for w in range(1, k + 1)], ignore_index=True)
    assert_at_most_eight_far_apart(colours_of(scaling.scaling_chart(df, "time_median_s").to_dict()), k)


def dashed_lines(spec: dict) -> list[str]:
    """The measured lines a spec draws dashed: those its dashed line layer keeps (its filter's oneOf)."""
    found = [layer for layer in spec["layer"] if layer["data"]["name"] == "lines"
             and isinstance(layer["mark"], dict) and layer["mark"].get("strokeDash")]
    return [name for layer in found for name in layer["transform"][0]["filter"]["oneOf"]]


def test_the_quick_demo_draws_softmax_and_linear_in_far_apart_colours():
    keys = tuple(key for key, _ in QUICK_DEMO.configs[0].mechanisms)
    assert keys == ("softmax", "linear")
    colours = colours_of(scaling.scaling_chart(results_frame(keys), "time_median_s").to_dict())
    softmax, linear = colours[MECHANISMS["softmax"].label], colours[MECHANISMS["linear"].label]
    assert softmax != linear and {softmax, linear} <= set(style.PALETTE)
    assert math.dist(cie_lab(softmax), cie_lab(linear)) > 50


def test_insight_charts_give_mechanisms_outside_the_catalogue_distinct_colours_not_grey():
    frame = pd.DataFrame({"mechanism": ["softmax", "mine", "theirs", "additive"],
                          "label": ["Softmax", "Mine", "Theirs", "Additive"]})
    scale = insight.mechanism_colours(frame).to_dict()
    assert len(set(scale["range"])) == 4 and set(scale["range"]) <= set(style.PALETTE)


def test_causal_and_bidirectional_lines_of_one_mechanism_share_a_colour_and_differ_in_dash():
    df = pd.concat([results_frame(causal=False), results_frame(causal=True)], ignore_index=True)
    spec = scaling.scaling_chart(df, "time_median_s").to_dict()
    assert len(colours_of(spec)) == 2  # one colour per mechanism: the mask is not told by hue
    line = next(layer for layer in spec["layer"] if layer["mark"]["type"] == "line")
    dash = line["encoding"]["strokeDash"]
    assert dash["field"] == "mask" and line["encoding"]["color"]["field"] == "line"
    dashes = dict(zip(dash["scale"]["domain"], dash["scale"]["range"]))
    assert dashes["causal"] != dashes["bidirectional"]


def test_the_longest_bar_leaves_room_for_its_label_inside_the_plot():
    table = pd.DataFrame({"label": ["Softmax", "Linear"], "mechanism": ["softmax", "linear"],
                          "budget": ["24 GB GPU"] * 2, "largest_n": [90_000, 9_000_000]})
    spec = insight.fit_chart(table).to_dict()
    layers = spec["spec"]["layer"]
    low, high = layers[0]["encoding"]["x"]["scale"]["domain"]
    assert math.log(9_000_000 / low) / math.log(high / low) <= 0.7 + 1e-9  # 30 % of 460 px: "9,000,000" fits
    (text,) = [layer for layer in layers if layer["mark"]["type"] == "text"]
    assert text["mark"]["align"] == "left" and text["mark"]["dx"] > 0


def test_no_text_mark_of_a_scaling_chart_sits_at_a_data_x():
    """n* and the formulas are named in legends, so no label can run off the plot's edge at the largest n."""
    df = results_frame(ns=(64, 128, 256, 512), skip_last=False)
    spec = scaling.figure(df, "time_median_s", curves=("spec", "n²", "n")).to_dict()
    assert layer_data(spec, "rule") and layer_data(spec, "text") == []


def test_talk_mode_wraps_a_subtitle_for_its_type_and_gives_a_fitted_chart_room_for_it():
    """A subtitle written for 13 px, 78 characters a line, is cut by Vega at 18 px: in talk mode no line is longer
    than 56 characters and no word is lost; a height in pixels grows as the type does (1.4×), once, however often
    the chart is styled; a chart without a subtitle or height is left as it is."""
    words = "predicted (roofline), not measured on H100 SXM: max(bytes ÷ bandwidth, FLOPs ÷ FLOP/s) a step"
    base = alt.Chart(pd.DataFrame({"x": [1, 2]})).mark_line().encode(x="x:Q")
    chart = base.properties(height=340, width=600, title=alt.TitleParams("Decode", subtitle=[words, "◇ short"]))
    spec = style.styled(chart, talk=True).to_dict()
    lines = spec["title"]["subtitle"]
    assert max(map(len, lines)) <= 56 and " ".join(lines).split() == (words + " ◇ short").split()
    assert (spec["height"], spec["width"]) == (476, 600)
    again = style.styled(style.styled(chart, talk=True), talk=True).to_dict()  # a page styles a talk chart again
    assert (again["height"], again["title"]["subtitle"]) == (476, lines)
    assert style.styled(chart).to_dict()["title"]["subtitle"] == [words, "◇ short"]  # not in talk mode
    bare = style.styled(base, talk=True).to_dict()
    assert "height" not in bare and "title" not in bare


def test_a_page_spec_is_the_validated_spec_without_the_default_theme_s_view():
    """style.page_spec against Altair's own validated to_dict: the same spec, less the 300-pixel view Altair's default
    theme adds (Streamlit's st.altair_chart leaves it out); a view the chart sets itself is kept."""
    frame = pd.DataFrame({"n": [1, 2, 3], "ms": [0.5, 1.0, 4.0], "mechanism": ["a", "b", "a"]})
    line = alt.Chart(frame).mark_line().encode(x="n:Q", y="ms:Q", color="mechanism:N").properties(title="t")
    layered = alt.layer(line, line.mark_point())
    own = line.configure_view(continuousHeight=120, strokeWidth=0)
    for chart in (line, layered, own):
        validated = chart.to_dict()  # validated against the schema (the reference)
        theme_view = {"continuousWidth": 300, "continuousHeight": 300}
        assert {k: validated["config"]["view"][k] for k in theme_view} == (theme_view if chart is not own else
                                                                          {"continuousWidth": 300,
                                                                           "continuousHeight": 120})
        spec = style.page_spec(chart)
        expected = json.loads(json.dumps(validated))
        if chart is own:
            del expected["config"]["view"]["continuousWidth"]  # the theme's; the chart's own height is kept
        else:
            del expected["config"]
        assert spec == expected
