"""What a scaling chart promises a reader, read back from its Vega-Lite dict: hollow points stand alone and the legend
says what they are, lines on one another are told apart, subtitles are whole lines, and each summary figure names the
n it was taken at."""
import json

import pandas as pd
import pytest

from attn_core import MEASURED as MECHANISMS  # every measured mechanism, MLA included
from attn_core.charts import scaling, style
from attn_core.engine.results import frame_from_rows
from tests.charts.test_charts import dashed_lines

NS = (128, 256, 512, 1024)


def frame(times: dict[str, dict[int, float]], memory: dict[str, dict[int, float]] | None = None,
          busy: set[tuple[str, int]] = frozenset()) -> pd.DataFrame:
    """A results frame: each mechanism's time (s) and peak memory (bytes) at each n; (mechanism, n) in `busy` was
    timed while other programs took a core (disturbed)."""
    rows = []
    for key, by_n in times.items():
        spec = MECHANISMS[key]
        for n, t in by_n.items():
            peak = (memory or {}).get(key, {}).get(n, 1000.0 * n)
            rows.append(dict(
                mechanism=key, label=spec.label, exact=spec.exact, params=json.dumps(spec.defaults), n=n, batch=1,
                heads=4, d_model=256, head_dim=64, dtype="float32", device="cpu", mode="forward", causal=False,
                status="ok", reason="", time_median_s=t, time_iqr_s=t / 10, time_samples=[t * 0.9, t, t * 1.1],
                repeats=3, peak_bytes=peak, memory_method="torch.profiler (CPU allocator)", predicted_bytes=peak,
                theory_flops=1e6 * n, executed_flops=1e6 * n, gflops=1.0, device_gflops=100.0, pct_of_device=1.0,
                sdpa_backend="", threads=2, foreign_cpu=0.9 if (key, n) in busy else 0.0, load_average=0.5,
                disturbed=(key, n) in busy, retaken=0))
    return frame_from_rows(rows)


def layers(spec: dict, data: str) -> list[dict]:
    return [layer for layer in spec["layer"] if layer.get("data", {}).get("name") == data]


# softmax's point at 256 was slowed 20× by another program: joined, it drew a V (17 ms, then 0.9 ms)
V_SHAPE = frame({"softmax": {n: 1e-8 * n * n * (20 if n == 256 else 1) for n in NS},
                 "linear": {n: 1e-6 * n for n in NS}}, busy={("softmax", 256)})


def test_a_hollow_point_is_drawn_alone_and_the_line_joins_the_clean_points_only():
    spec = scaling.figure(V_SHAPE, "time_median_s").to_dict()
    (line,) = [layer for layer in layers(spec, "lines") if layer["mark"]["type"] == "line"]
    joined = {(r["line"], r["n"]) for r in spec["datasets"]["lines"]}
    softmax = MECHANISMS["softmax"].label
    assert (softmax, 256) not in joined  # the line goes 128 → 512 under it: no V
    assert {n for name, n in joined if name == softmax} == {128, 512, 1024}
    assert len(joined) == 7  # 8 points, one hollow
    (hollow,) = [layer for layer in layers(spec, "disturbed") if layer["mark"].get("filled") is False]
    assert [(r["mechanism"], r["n"]) for r in spec["datasets"]["disturbed"]] == [("softmax", 256)]
    assert hollow["mark"]["type"] == "point"  # a point mark: nothing joins it to its neighbours
    bars = {(r["line"], r["n"]) for r in spec["datasets"]["bars"]}
    assert (softmax, 256) in bars and len(bars) == 8  # its spread is still shown


def test_the_legend_on_screen_says_what_a_hollow_point_is():
    # the page's spec (LiveSpec, which the Benchmark page draws), not only the export's subtitle
    shown = scaling.LiveSpec().update(V_SHAPE, "time_median_s")
    legends = [layer["encoding"]["shape"] for layer in shown["layer"] if "shape" in layer.get("encoding", {})
               and "legend" in layer["encoding"]["shape"] and layer["encoding"]["shape"].get("legend")]
    (busy,) = [s for s in legends if s["field"] == "busy"]
    title = " ".join(busy["title"])
    assert "Hollow" in title and "busy" in title and "left out" in title
    assert busy["legend"]["symbolFillColor"] == "transparent"  # its symbol is hollow too
    assert {r["busy"] for r in shown["datasets"]["disturbed"]} == set(busy["scale"]["domain"])
    clean = scaling.LiveSpec().update(frame({"linear": {n: 1e-6 * n for n in NS}}), "time_median_s")
    assert not any(layer["data"]["name"] == "disturbed" for layer in clean["layer"])  # no legend without one


def test_a_line_on_another_is_dashed_and_named_in_the_subtitle():
    # "One cache, four sizes": absorbed MLA's cache is naive MLA's, to the byte (the same latent a token)
    same = {n: 576 * 4.0 * n for n in NS}
    df = frame({"mla": {n: 1e-5 * n for n in NS}, "mla_naive": {n: 1e-4 * n for n in NS},
                "sdpa": {n: 2e-5 * n for n in NS}},
               memory={"mla": same, "mla_naive": same, "sdpa": {n: 8192 * 4.0 * n for n in NS}})
    spec = scaling.figure(df, "peak_bytes").to_dict()
    absorbed, naive = MECHANISMS["mla"].label, MECHANISMS["mla_naive"].label
    (upper,) = dashed_lines(spec)
    lower = naive if upper == absorbed else absorbed
    assert {upper, lower} == {absorbed, naive}
    subtitle = " ".join(spec["title"]["subtitle"])
    assert f"{upper} lies on {lower}" in subtitle
    solid = [layer for layer in layers(spec, "lines") if not layer["mark"].get("strokeDash")]
    assert solid[0]["transform"][0]["filter"]["not"]["oneOf"] == [upper]  # drawn once, dashed, on top
    assert spec["layer"].index(solid[0]) < spec["layer"].index(layers(spec, "lines")[1])
    assert dashed_lines(scaling.figure(df, "time_median_s").to_dict()) == []  # their times differ: both solid


def test_a_long_subtitle_is_wrapped_into_whole_lines_never_cut():
    words = "Measured on a laptop with a browser, slides and a video call open, one core kept busy by a spinner"
    spec = scaling.scaling_chart(V_SHAPE, "time_median_s", subtitle=[words, "second line"]).to_dict()
    lines = spec["title"]["subtitle"]
    assert all(len(line) <= style.SUBTITLE_CHARS for line in lines) and len(lines) == 3
    assert " ".join(lines) == words + " second line"  # every word kept, none cut with "…"
    assert not any("…" in line for line in lines)
    assert style.wrapped("short") == ["short"] and style.wrapped([]) == []


def test_each_summary_figure_names_the_n_it_was_taken_at():
    # linear's time at 1024 was disturbed: its speed-up comes from 512, its memory saving from 1024
    df = frame({"softmax": {n: 1e-8 * n * n for n in NS}, "linear": {n: 1e-6 * n for n in NS}},
               memory={"softmax": {n: 4.0 * n * n for n in NS}, "linear": {n: 256.0 * n for n in NS}},
               busy={("linear", 1024)})
    table = scaling.summary_table(df).set_index("Mechanism")
    row = table.loc[MECHANISMS["linear"].label]
    # read back from the data: softmax 1e-8·512² s ÷ linear 1e-6·512 s = 5.12; 4·1024² B ÷ 256·1024 B = 16
    assert row["speed-up vs softmax (×)"] == pytest.approx(1e-8 * 512 ** 2 / (1e-6 * 512), rel=1e-3)
    assert row["speed-up at n"] == 512
    assert row["memory saving vs softmax (×)"] == pytest.approx(4.0 * 1024 ** 2 / (256.0 * 1024), rel=1e-3)
    assert row["memory saving at n"] == 1024
    columns = list(table.columns)  # each figure is followed by its n
    assert columns.index("speed-up at n") == columns.index("speed-up vs softmax (×)") + 1
    assert columns.index("memory saving at n") == columns.index("memory saving vs softmax (×)") + 1


def test_a_long_title_is_wrapped_and_a_short_one_stays_one_line():
    long = "Time per forward call on the lecture-hall laptop while the slides and a video call were open"
    title = scaling.scaling_chart(V_SHAPE, "time_median_s", title=long).to_dict()["title"]["text"]
    assert isinstance(title, list) and " ".join(title) == long and all(len(t) <= scaling.TITLE_CHARS for t in title)
    assert scaling.scaling_chart(V_SHAPE, "time_median_s", title="Short").to_dict()["title"]["text"] == "Short"


def test_a_crossover_notice_only_where_the_preset_or_the_reader_asks_for_one():
    from attn_core.engine import analysis
    from attn_core.engine.presets import PRESETS
    assert not analysis.crossover_asked(PRESETS["One cache, four sizes"].look_for)  # no softmax, no n* promised
    assert analysis.crossover_asked(PRESETS["Where linear attention wins"].look_for)  # "past the marked crossover"
    assert analysis.crossover_asked(None)  # the reader's own sweep
    assert analysis.crossover_asked(PRESETS["One cache, four sizes"].look_for, "sdpa")  # a baseline they picked


def test_the_cap_on_colours_is_the_caller_s_and_repeats_are_named():
    lines = [("sliding_window", f"window {w}") for w in range(10)]
    capped = style.colour_scale(lines, style.MAX_COLOURS)
    assert len(set(capped.range)) == 8 and style.repeated(capped) == ["window 8", "window 9"]
    assert capped.range[8:] == capped.range[:2]  # the ninth and tenth take the first and second colours again
    whole = style.colour_scale(lines)  # a chart with no dash to tell a repeat apart keeps every colour distinct
    assert len(set(whole.range)) == 10 and style.repeated(whole) == []
