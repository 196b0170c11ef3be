"""Every page through streamlit's AppTest: defaults run clean, a tiny sweep draws its charts and table, bad settings
say what to change, downloads hold real files, and a sweep survives reruns, page switches and Stop (saved runs,
replays, sequences, sessions and generate mode: tests/dashboard/test_app_runs.py); the fixtures other page tests import."""
import functools
import io
import json
import time
from pathlib import Path

import pandas as pd
import pytest
from PIL import Image
from streamlit.runtime.media_file_manager import MediaFileManager
from streamlit.runtime.pages_manager import PagesManager
from streamlit.testing.v1 import AppTest, app_test

from attn_core.engine import job as sweep, results, server
from tests.apptest_helpers import chart_specs
from attn_core.engine.job import Job

APP = str(Path(__file__).resolve().parents[2] / "app.py")
PAGES = {"pages/home.py": "Attention Lab", "pages/learn.py": "Learn", "pages/benchmark.py": "Benchmark",
         "pages/accuracy.py": "Accuracy", "pages/patterns.py": "Patterns", "pages/theory.py": "Theory",
         "pages/planner.py": "Plan a model", "pages/compare.py": "Compare runs",
         "pages/recall.py": "Associative recall"}
TINY = {"bench_exact": ["softmax"], "bench_approx": ["linear"], "bench_n": (64, 128), "bench_steps": 2,
        "bench_d_model": 64, "bench_heads": 2}


@pytest.fixture(autouse=True, scope="module")
def private_sweep_lock(tmp_path_factory):
    """A sweep left running elsewhere on this machine (a dashboard, a CLI) must not make these tests wait."""
    path = str(tmp_path_factory.mktemp("lock") / "sweep.lock")
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(sweep, "sweep_lock", functools.partial(sweep.sweep_lock, path=path))
        yield


@pytest.fixture(autouse=True)
def fresh_stage():
    """Each test's sessions get a server stage of their own; a sweep a test leaves running is stopped after it."""
    server.reset()
    yield
    server.reset()


class Routed(PagesManager):
    """AppTest re-detects streamlit's legacy pages/-folder mode before every run, where a server does it once and
    the router leaves it on the first request; runs here are then those of a server past its first request."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        PagesManager.uses_pages_directory = False


@pytest.fixture(autouse=True, scope="module")
def routed():
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(app_test, "PagesManager", Routed)
        yield


def benchmark(**settings) -> AppTest:
    """The Benchmark page after a first run, its widgets then set from `settings` (by key)."""
    at = AppTest.from_file(APP, default_timeout=60).run()
    at.switch_page("pages/benchmark.py").run()
    for key, value in settings.items():
        widget(at, key).set_value(value)
        at.run()
    return at


def widget(at: AppTest, key: str):
    """The widget with this key, whatever its kind."""
    for kind in ("multiselect", "select_slider", "number_input", "toggle", "radio", "selectbox", "slider"):
        found = [w for w in at.get(kind) if w.key == key]
        if found:
            return found[0]
    raise KeyError(key)


RERUN_S = 1.0  # a live page redraws a running sweep at most every Pacing.redraw_s (2 s); its ticks are lighter


def run_to_end(at: AppTest, deadline_s: float = 120) -> AppTest:
    """Rerun the page while its job measures, about as often as a live page redraws (RERUN_S, or at once when the job
    ends), until the job is done (a hang fails, it is not a timing). A full run every 0.1 s held the worker (no
    sample starts while a page draws) nine tenths of the time, which no page does."""
    end = time.monotonic() + deadline_s
    while not (job := at.session_state["bench"].job).done:
        assert time.monotonic() < end, "the sweep did not finish"
        job.wait(RERUN_S)
        at.run()
    return at.run()


def warnings(at: AppTest) -> list[str]:
    return [w.value for w in at.warning]


@pytest.fixture(scope="module")
def swept() -> AppTest:
    """One tiny sweep, finished, shared by the tests that only look at its result."""
    at = benchmark(**TINY)
    at.button(key="bench_run").click().run()
    return run_to_end(at)


@pytest.mark.parametrize("page", list(PAGES))
def test_every_page_runs_with_its_defaults(page):
    """Every page with its defaults: no exception, its title, and each chart it draws a valid Vega-Lite spec (the
    pages make and send their charts unvalidated: pages/_shared.py)."""
    from altair.utils import schemapi
    from altair.vegalite.v6.schema.core import load_schema

    at = AppTest.from_file(APP, default_timeout=120).run()
    at.switch_page(page).run()
    assert not at.exception, [e.value for e in at.exception]
    assert [t.value for t in at.title][:1] == [PAGES[page]]
    assert schemapi.DEBUG_MODE is False
    charts = [json.loads(e.proto.spec) for e in at.main if e.type == "vega_lite_chart"]
    assert bool(charts) == (page not in ("pages/home.py", "pages/benchmark.py", "pages/compare.py")), len(charts)
    for spec in charts:
        assert schemapi.validate_jsonschema(spec, load_schema(), raise_error=False) is None, spec.get("title")


def test_home_shows_the_device_and_the_quick_demo_lands_on_the_benchmark():
    at = AppTest.from_file(APP, default_timeout=60).run()
    assert at.dataframe[0].value["device"].iloc[0] == "cpu"
    at.button(key="home_demo").click().run()
    assert [t.value for t in at.title] == ["Benchmark"]
    job = at.session_state["bench"].job
    assert isinstance(job, Job) and job.sweeps[0].mechanisms == (("softmax", {}), ("linear", {}))
    assert widget(at, "bench_exact").value == ["softmax"] and widget(at, "bench_approx").value == ["linear"]
    assert widget(at, "bench_d_model").value == 256 and widget(at, "bench_n").value == (128, 2048)
    at.button(key="bench_stop").click().run()
    run_to_end(at)
    assert not at.exception


def test_defaults_are_valid_and_run_is_enabled():
    at = benchmark()
    assert warnings(at) == []
    assert not at.button(key="bench_run").disabled and at.button(key="bench_stop").disabled
    assert [i.value for i in at.info] and "press Run" in at.info[0].value


def test_tiny_sweep_renders_both_charts_and_the_table(swept):
    assert not swept.exception
    specs = chart_specs(swept)
    assert len(specs) == 2
    titles = [s["title"]["text"] for s in specs]
    assert titles == ["Time per forward call vs sequence length", "Peak memory of one forward call vs sequence length"]
    points = [r for s in specs for layer in s["layer"] if layer["mark"]["type"] == "point"
              for r in s["datasets"][layer["data"]["name"]] if r.get("drawn")]
    assert {(r["mechanism"], r["n"]) for r in points} == {("softmax", 64), ("softmax", 128), ("linear", 64),
                                                          ("linear", 128)}
    table = swept.dataframe[0].value
    assert list(table["Mechanism"]) == ["Softmax (materialized)", "Linear (elu+1)"]
    assert (table["points measured"] == 2).all()
    # two lengths: no exponent, and the table says why; the SDPA columns are gone and a line says why
    assert table["time ∝ n^k: k"].isna().all() and table["note"].str.contains("needs 3 clean points").all()
    captions = [c.value for c in swept.caption]
    assert "No comparison with Softmax (fused SDPA): this sweep did not measure it." in captions


def test_downloads_hold_real_png_svg_html_csv_and_json(swept, monkeypatch):
    made = {}
    original = MediaFileManager.add_deferred

    def record(self, data, mimetype, coordinates, file_name=None, **kwargs):
        made[file_name] = data
        return original(self, data, mimetype, coordinates, file_name=file_name, **kwargs)

    monkeypatch.setattr(MediaFileManager, "add_deferred", record)
    swept.run()
    assert Image.open(io.BytesIO(made["attention-time.png"]())).format == "PNG"
    assert made["attention-memory.svg"]().lstrip().startswith(b"<svg")
    assert b"vegaEmbed" in made["attention-time.html"]()
    csv = made["attention-run.csv"]().decode()
    table = pd.read_csv(io.StringIO(csv))  # a clean table, the stamp in its last columns
    assert set(table["format"]) == {"attention-lab-run"} and "softmax" in set(table["mechanism"])
    loaded = results.load_run(made["attention-run.json"](), name="download")
    assert loaded.env["torch"] and len(loaded.frame) == 4


def test_export_titles_are_editable(swept):
    swept.text_input(key="bench_title_time_median_s").set_value("The quadratic wall").run()
    swept.text_input(key="bench_subtitle").set_value("live on a laptop").run()
    first = chart_specs(swept)[0]["title"]
    assert (first["text"], first["subtitle"]) == ("The quadratic wall", "live on a laptop")


def test_a_finished_sweep_survives_slider_moves_and_page_switches(swept):
    job = swept.session_state["bench"].job
    swept.segmented_control(key="bench_axes").set_value("linear").run()
    spec = chart_specs(swept)[0]
    assert spec["layer"][0]["encoding"]["y"]["scale"].get("type") != "log"
    swept.switch_page("pages/home.py").run()
    swept.switch_page("pages/benchmark.py").run()
    assert swept.session_state["bench"].job is job and len(chart_specs(swept)) == 2
    assert swept.select_slider(key="bench_n").value == (64, 128)
    assert not swept.exception


@pytest.mark.parametrize("settings, sentence", [
    ({"bench_d_model": 500, "bench_heads": 6}, "d_model 500 is not divisible by 6 heads; choose a multiple of 6"),
    ({"bench_approx": ["linformer"], "bench_causal": True}, "Linformer cannot be causal"),
    ({"bench_approx": ["linformer"], "bench_n": (64, 128)}, "rank = 256 is larger than the shortest sequence length"),
    ({"bench_exact": [], "bench_approx": []}, "no mechanism is selected; choose at least one"),
    ({"bench_implementation": "flex"}, "linear is not defined by a mask, so only our kernel runs it"),
])
def test_impossible_settings_say_what_to_change_and_disable_run(settings, sentence):
    at = benchmark(**settings)
    assert not at.exception
    assert any(sentence in w for w in warnings(at)), warnings(at)
    assert at.button(key="bench_run").disabled


def test_each_mechanism_parameter_comes_from_its_spec():
    at = benchmark(bench_exact=["local", "sliding_window"], bench_approx=[])
    keys = {w.key for w in at.number_input}
    assert {"bench_p_local_block", "bench_p_local_lookback", "bench_p_local_lookahead",
            "bench_p_sliding_window_window"} <= keys
    at.number_input(key="bench_p_sliding_window_window").set_value(32).run()
    assert warnings(at) == []


def test_reruns_while_a_sweep_runs_neither_crash_nor_corrupt_it():
    at = benchmark(**{**TINY, "bench_steps": 3, "bench_n": (64, 256)})
    at.button(key="bench_run").click().run()
    for heads in (4, 2, 4, 2):  # widget changes and reruns while points arrive
        at.number_input(key="bench_heads").set_value(heads).run()
        assert at.button(key="bench_run").disabled or at.session_state["bench"].job.done
    run_to_end(at)
    frame = at.session_state["bench"].job.frame()
    assert len(frame) == 6 and not frame.duplicated(["mechanism", "n"]).any()
    assert set(frame["heads"]) == {2} and (frame["status"] == "ok").all()
    assert not at.exception


def test_stop_cancels_and_keeps_the_finished_points():
    at = benchmark(bench_exact=["softmax"], bench_approx=[], bench_n=(64, 4096), bench_steps=7)
    at.button(key="bench_run").click().run()
    at.button(key="bench_stop").click().run()
    run_to_end(at)
    statuses = list(at.session_state["bench"].job.frame()["status"])
    assert "cancelled" in statuses and len(statuses) == 7
    done = 7 - statuses.count("cancelled")
    assert f"Stopped after {done} of 7 points; the table covers the measured ones." in [i.value for i in at.info]
    assert not at.button(key="bench_run").disabled and not at.exception


def test_a_preset_sets_every_control_in_one_click():
    at = benchmark()
    at.button(key="bench_preset_materialized_vs_fused_softmax").click().run()
    assert at.multiselect(key="bench_exact").value == ["softmax", "sdpa"]
    assert at.multiselect(key="bench_approx").value == []
    assert at.select_slider(key="bench_n").value == (256, 4096)
    assert any("fused kernel" in m.value for m in at.markdown)
    at.button(key="bench_stop").click().run()
    run_to_end(at)
    assert not at.exception
