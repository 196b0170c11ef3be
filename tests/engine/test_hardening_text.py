"""Every text from a file (run names, notes, labels, model names, device names, file names) holding control
characters, markup, formula prefixes or a megabyte reaches a chart export, a table, a terminal and a page as text:
exports render (vl-convert's panics stay in its own process), nothing is interpreted, nothing grows huge."""
import io
import json
import re
import sys
import xml.etree.ElementTree as ElementTree

import pytest
from streamlit.testing.v1 import AppTest

from attn_core import cli
from attn_core.studies.planner import model as planner
from attn_core.engine import store, untrusted
from attn_core.charts import export
from attn_core.insight import charts as insight_charts
from attn_core.engine import results
from attn_core.insight import published, ratio
from tests.apptest_helpers import displayed
from tests.dashboard.test_app import APP, fresh_stage, private_sweep_lock, routed  # noqa: F401 (fixtures apply here)
from tests.charts.test_charts import results_frame
from tests.dashboard.test_hardening_web import runs_as_formula, shown_markdown, spreadsheet_cells

HOSTILE = {
    "bel": "run\x07",
    "osc-title": "\x1b]0;pwned\x07",
    "clear-screen": "\x1b[2J\x1b[H",
    "nul": "a\x00b",
    "uffff": "a\uffff\ufffe",
    "lone-surrogate": "a\ud800b",
    "c1-csi": "a\x9b31mred",
    "bidi-override": "abc\u202edcba\u2066",
    "markdown": "**bold** [link](http://evil.example/x) ![img](http://evil.example/i.png)",
    "html": "<script>alert(1)</script><img src=x onerror=alert(2)>",
    "hyperlink": '=HYPERLINK("http://evil.example/x","open")',
    "plus-cmd": "+cmd|' /C calc'!A0",
    "at-sum": "@SUM(1+1)",
    "backslash-escapes": 'a\\x1b\\u0007\\" b\\',
}
MEGABYTE = "m" * (1 << 20)
# one string of every kind the pages must show as typed, for the slower page tests
EVERYTHING = HOSTILE["markdown"] + HOSTILE["html"] + HOSTILE["osc-title"] + HOSTILE["lone-surrogate"] \
    + HOSTILE["backslash-escapes"]


def raw_controls(text: str) -> list[str]:
    """The characters no text from a file may bring as they are, found one code point at a time: C0 controls but
    line feed, DEL, C1 controls, the bidi embeddings, overrides and isolates, U+FFFE, U+FFFF, surrogates."""
    bad = set(range(0x00, 0x20)) - {0x0A} | {0x7F} | set(range(0x80, 0xA0)) | set(range(0x202A, 0x202F)) \
        | set(range(0x2066, 0x206A)) | {0xFFFE, 0xFFFF} | set(range(0xD800, 0xE000))
    return [c for c in text if ord(c) in bad]


def escaped(text: str) -> str:
    """The reference escape of such characters, as Python writes them in a string literal (\\x1b, \\u202e)."""
    def one(c: str) -> str:
        if not raw_controls(c) and c != "\n":
            return c
        return f"\\x{ord(c):02x}" if ord(c) < 0x100 else f"\\u{ord(c):04x}"
    return "".join(one(c) for c in text)


# ---- the cleaning functions, against the reference ----

@pytest.mark.parametrize("name", HOSTILE)
def test_printable_writes_each_control_character_as_its_escape_and_nothing_else(name):
    text = HOSTILE[name]
    assert untrusted.printable(text) == escaped(text)
    assert raw_controls(untrusted.terminal(text)) == [] and "\n" not in untrusted.terminal("a\nb")
    assert untrusted.printable("Softmax · n² ≤ 4096 → ok") == "Softmax · n² ≤ 4096 → ok"  # clean text unchanged
    assert untrusted.printable("a\tb\nc", keep="\t\n") == "a\tb\nc"
    assert displayed(untrusted.literal(text)) == escaped(text)  # Markdown shows the escaped text as typed


def test_a_megabyte_is_cut_where_it_is_shown_and_quoted():
    assert len(untrusted.terminal(MEGABYTE)) == 200 and untrusted.terminal(MEGABYTE).endswith("…")
    assert len(untrusted.quoted(MEGABYTE)) == untrusted.SHOWN_CHARS
    assert untrusted.quoted(10 ** 5000) == "a number of thousands of digits"


# ---- chart exports: PNG, SVG and CSV of charts carrying hostile text in every field ----

def sent(text: str) -> str:
    """`text` as a browser or a command line can send it (a file name, --name): UTF-8, so no lone surrogate."""
    return text.encode("utf-8", "replace").decode("utf-8")


def run_file(text: str, columns=("label",)) -> bytes:
    """A run file whose `columns` and device name hold `text` as a file can: JSON, where \\ud800 is a lone
    surrogate (which no DataFrame holds, so the text is put into the file's bytes)."""
    frame = results_frame()
    for column in columns:
        frame[column] = frame[column] + " @TEXT@" if column == "label" else "@TEXT@"
    data = results.to_json_bytes(results.Run(frame, {"device_name": "@TEXT@", "torch": "@TEXT@"}, {}))
    return data.replace(b"@TEXT@", json.dumps(text)[1:-1].encode("ascii"))


def hostile_runs(text: str) -> dict[str, results.Run]:
    """Two runs as the Compare page opens them: named by their file's name, or a kept run's title (its name and
    note), their labels and device names holding `text`."""
    data = run_file(text)
    return {name: results.load_run(data, name=name) for name in (f"{sent(text)}.json", f"#2 {sent(text)} (2025)")}


def hostile_charts(text: str) -> list[tuple[object, object]]:
    """(chart, its data) for the Compare page's overlay and ratio charts and the planner's cache chart."""
    runs = hostile_runs(text)
    frame = published.runs_frame(runs).drop(columns="time_samples")
    (a, run_a), (b, run_b) = runs.items()
    ratios = published.run_ratio(run_a.frame, run_b.frame)
    name = text[:planner.MAX_NAME] if text.strip() else "x"
    model = planner.Model.from_json(json.dumps({"name": name, "layers": [
        {"name": name, "mechanism": "sdpa", "count": 2, "heads": 4, "head_dim": 64}]}))
    curves = planner.curves([model], [1024, 4096])
    return [(insight_charts.runs_chart(frame), frame), (ratio.ratio_chart(ratios, a, b), ratios),
            (insight_charts.theory_chart(curves, "cache_bytes", legend="Model"), curves)]


def check_exports(chart, data, stem: str, png: bool = True) -> str:
    """Every download of one chart: a PNG (where `png`), an SVG that is well-formed XML without raw control
    characters, a CSV that runs no formula. The SVG's text, for the caller to look into."""
    made = {fmt: (make() if png or fmt != "PNG" else b"", name)
            for fmt, make, name, _ in insight_charts.downloads(chart, data, stem)}
    assert made["PNG"][0][:8] == b"\x89PNG\r\n\x1a\n" or not png
    svg = made["SVG"][0].decode("utf-8")
    ElementTree.fromstring(svg)  # XML 1.0 forbids the characters vl-convert panicked on: parsed, none is left
    assert raw_controls(svg.replace("\t", "").replace("\r", "")) == []
    assert not [cell for cell in spreadsheet_cells(made["CSV"][0]) if runs_as_formula(cell)]
    assert {name for _, name in made.values()} == {f"{untrusted.file_stem(stem, 80)}.{ext}" for ext in
                                                 ("png", "svg", "csv")}
    assert not raw_controls("".join(name for _, name in made.values()))
    return svg


@pytest.mark.parametrize("name", HOSTILE)
def test_charts_with_hostile_names_labels_and_machines_export_to_png_svg_and_csv(name):
    text = HOSTILE[name]
    for chart, data in hostile_charts(text):  # PNG where vl-convert panicked: its SVG step is the PNG's first
        svg = check_exports(chart, data, f"chart {text}", png=bool(raw_controls(text)))
        if raw_controls(text):
            assert escaped(text)[:12] in svg.replace("\u29f5", "\\")  # shown, as its escapes (titles: ⧵ for \)


def test_a_megabyte_in_every_field_exports_cut_short():
    for i, (chart, data) in enumerate(hostile_charts(MEGABYTE)):
        svg = check_exports(chart, data, MEGABYTE, png=i == 0)
        assert "m" * export.SPEC_TEXT_CHARS not in svg and "m" * 60 in svg


def test_the_spec_of_a_clean_chart_goes_to_vl_convert_unchanged():
    """Clean text is left as it is, so the exports of every ordinary chart are what they were."""
    from attn_core.charts import scaling

    frame = results_frame()
    for chart in (scaling.figure(frame, "time_median_s", title="Time", subtitle="a · b"),
                  insight_charts.runs_chart(published.runs_frame({"run.json": results.Run(frame, {}, {})}))):
        assert export._spec(chart) == chart.to_dict()


def test_chart_text_cuts_texts_but_never_an_expression_and_makes_a_title_s_backslashes_inert():
    spec = export.chart_text({"title": "a\\x1b", "labelExpr": "'" + "x" * 5000 + "'", "data": {"values": [
        {"label": "y" * 5000, "y" * 5000: 1}]}})
    assert spec["title"] == "a\u29f5x1b" and spec["labelExpr"] == "'" + "x" * 5000 + "'"
    ((key, value),) = [(k, v) for row in spec["data"]["values"] for k, v in row.items() if k != "label"]
    assert len(spec["data"]["values"][0]["label"]) == len(key) == export.SPEC_TEXT_CHARS and value == 1


def test_html_export_of_hostile_text_holds_no_raw_control_character():
    chart, _ = hostile_charts(HOSTILE["osc-title"] + HOSTILE["html"])[0]
    html = export.chart_html(chart).decode("utf-8")
    body = html[html.rindex('<div id="vega-chart">'):]  # after the bundled Vega: the chart's spec
    assert raw_controls(html.replace("\t", "").replace("\r", "")) == [] and "<img" not in body


# ---- the renderer's child process: its crash is a sentence, and the caller lives on ----

BELL_SPEC = {"title": "bell \x07", "mark": "point", "data": {"values": [{"x": 1}]},
             "encoding": {"x": {"field": "x", "type": "quantitative"}}}


def test_vl_convert_panicking_in_its_process_is_a_sentence_and_the_next_export_works():
    """The spec goes to the child uncleaned (export._convert): vl-convert's own panic on BEL aborts the child."""
    with pytest.raises(export.ExportError, match=r"could not be drawn as SVG: the renderer \(vl-convert\) crashed"):
        export._convert("svg", BELL_SPEC)
    assert "bell ⧵x07".encode() in export.chart_svg(BELL_SPEC)  # a new child, and the spec cleaned this time


def test_a_renderer_that_aborts_or_hangs_is_a_sentence(monkeypatch):
    renderer = export._Renderer()
    monkeypatch.setattr(export, "CHILD", (sys.executable, "-c", "import os; os.abort()"))
    with pytest.raises(export.ExportError, match="crashed .killed by SIGABRT.; the server is unaffected"):
        renderer.convert("png", {}, {}, 60)
    monkeypatch.setattr(export, "CHILD", (sys.executable, "-c", "import time; time.sleep(60)"))
    with pytest.raises(export.ExportError, match="took longer than 1 s and was stopped"):
        renderer.convert("png", {}, {}, 1)


def test_vl_convert_refusing_a_spec_is_a_sentence():
    with pytest.raises(export.ExportError, match="vl-convert refused it"):
        export.chart_svg({"mark": "no such mark", "data": {"values": []}})


# ---- the terminal: show, runs list, runs show and plan print file text escaped and cut ----

def hostile_file(tmp_path, text: str) -> str:
    path = tmp_path / "hostile.json"
    path.write_bytes(run_file(text, ("label", "reason", "memory_method")).replace(b'"softmax"', b'"my_own"'))
    return str(path)


def said(argv: list[str]) -> tuple[int, str]:
    out, err = io.StringIO(), io.StringIO()
    code = cli.main(argv, out, err)
    return code, out.getvalue() + err.getvalue()


def check_terminal(text: str, output: str) -> None:
    assert raw_controls(output) == [], [hex(ord(c)) for c in raw_controls(output)][:5]
    if raw_controls(text) and len(text) < 40:
        assert escaped(text) in output


@pytest.mark.parametrize("name", [*HOSTILE, "megabyte"])
def test_show_runs_list_and_runs_show_print_file_text_escaped_and_cut(tmp_path, name):
    text = HOSTILE.get(name, MEGABYTE)
    path, kept = hostile_file(tmp_path, text), str(tmp_path / "runs.sqlite")
    code, output = said(["show", path])
    assert code == cli.EXIT_OK
    check_terminal(text, output)
    code, output = said(["runs", "import", path, "--name", sent(text), "--store", kept])
    assert code == cli.EXIT_OK, output
    run_id = int(re.search(r"as run (\d+)", output)[1])
    with store.Store(kept) as runs:  # a note as the Compare page or another program may have left it
        runs.set_note(run_id, sent(text))
    for verb in (["runs", "list", "--store", kept], ["runs", "show", str(run_id), "--store", kept]):
        code, output = said(verb)
        assert code == cli.EXIT_OK, output
        check_terminal(text, output)
        assert len(output) < 20_000  # a megabyte name, machine or label prints cut short


@pytest.mark.parametrize("name", ["osc-title", "clear-screen", "bidi-override", "markdown", "900 kB"])
def test_plan_prints_a_model_file_s_names_escaped_and_a_long_value_quoted_short(tmp_path, name):
    text = HOSTILE.get(name, MEGABYTE[:900_000])  # a model file is at most 1 MiB
    path = tmp_path / "model.json"
    layer = {"name": text[:60], "mechanism": "sdpa", "count": 2, "heads": 4, "head_dim": 64}
    path.write_text(json.dumps({"name": text[:60], "source": text, "layers": [layer]}))
    code, output = said(["plan", str(path), "--context", "4096"])
    assert code == cli.EXIT_OK, output
    check_terminal(text[:60], output)
    path.write_text(json.dumps({"name": "m", "layers": [{**layer, "count": text}]}))
    code, output = said(["plan", str(path)])
    assert code == cli.EXIT_USAGE and "count must be a whole number" in output and len(output) < 1000
    check_terminal("", output)


# ---- the pages: Markdown shows file text as typed ----

def unescaped_markup(body: str) -> list[str]:
    """The hostile strings' markup a Markdown body would render: an image, a link, bold text, a tag (escaped by
    `literal`, each holds a backslash)."""
    return [markup for markup in ("![img](", "[link](", "**bold**", "<script", "<img")
            if re.search(r"(?<!\\)" + re.escape(markup), body)]


def planner_with(model: dict) -> AppTest:
    at = AppTest.from_file(APP, default_timeout=60).run()
    at.switch_page("pages/planner.py").run()
    at.file_uploader(key="plan_upload").upload("model.json", json.dumps(model).encode(), "application/json")
    return at.run()


@pytest.mark.parametrize("text", [HOSTILE["markdown"], EVERYTHING[-planner.MAX_NAME:]])
def test_a_model_s_name_and_layer_names_are_text_on_the_planner_page(text):
    at = planner_with({"name": text, "source": text, "layers": [
        {"name": text, "mechanism": "sdpa", "count": 32, "heads": 32, "kv_heads": 8, "head_dim": 128}]})
    assert not at.exception, [e.value for e in at.exception]
    assert displayed(at.subheader[0].value) == untrusted.clipped(escaped(text), planner.MAX_NAME)
    assert [m for body in shown_markdown(at) + [s.value for s in at.subheader] for m in unescaped_markup(body)] == []
    assert at.metric  # planned, charted


def test_a_hybrid_of_a_model_with_an_80_character_name_is_planned_and_a_longer_name_refused():
    layer = {"name": "full attention", "mechanism": "sdpa", "count": 32, "heads": 32, "kv_heads": 8, "head_dim": 128}
    at = planner_with({"name": "N" * planner.MAX_NAME, "layers": [layer]})
    assert not at.exception and not at.warning and not at.error
    shown = {m.label: m.value for m in at.metric}
    assert shown["Holds less from"] == "128 tokens"  # as Llama-3-8B's: the name changes nothing
    at = planner_with({"name": "N" * (planner.MAX_NAME + 1), "layers": [layer]})
    assert not at.exception
    assert [displayed(e.value) for e in at.error] == [f"The file model.json is not a model this page can plan: name "
                                                      f"must be a text of 1 to {planner.MAX_NAME} characters"]


def test_a_share_that_turns_no_layer_says_so_rather_than_a_crossover():
    at = AppTest.from_file(APP, default_timeout=60).run()
    at.switch_page("pages/planner.py").run()
    at.select_slider(key="plan_hybrid_share").set_value(0.0).run()
    assert not at.exception and {m.label: m.value for m in at.metric}["Holds less from"] == "no layer turned"


def test_a_replayed_run_s_labels_are_text_in_the_benchmark_summary_table():
    text = EVERYTHING
    at = AppTest.from_file(APP, default_timeout=60)
    at.switch_page("pages/benchmark.py").run()
    at.file_uploader(key="bench_upload").upload(f"{sent(text)}.json", run_file(text), "application/json")
    at.run()
    at.button(key="bench_show").click().run()
    assert not at.exception, [e.value for e in at.exception]
    (table,) = at.table
    shown = list(table.value.index)
    assert untrusted.literal(f"Softmax (materialized) {escaped(text)}") in shown
    assert [m for body in shown + shown_markdown(at) for m in unescaped_markup(body)] == []
