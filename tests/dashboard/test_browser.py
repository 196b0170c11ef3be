"""The real app in a real browser: `streamlit run app.py` on 127.0.0.1, driven through Debian's headless chromium.

Screenshots go to test-artifacts/. Without chromium this skips, except under CI, where it fails."""
import contextlib
import importlib.util
import json
import os
import shutil
from urllib.parse import quote_plus
from pathlib import Path

import pytest

from attn_core import MECHANISMS
from attn_core.charts import scaling
from attn_core.engine import lock, presets, stage
from attn_core.benchmarks import dashboard
from attn_core.benchmarks.dashboard import CHART, EXCEPTION, app_server, browser_page, wait_idle

ARTIFACTS = Path(__file__).resolve().parents[2] / "test-artifacts"
PAGES = {"": "Attention Lab", "learn": "Learn", "benchmark": "Benchmark", "accuracy": "Accuracy",
         "patterns": "Patterns", "theory": "Theory", "planner": "Plan a model", "compare": "Compare runs"}
# A tiny sweep as a link: settings are bound to the URL (multiselects by their labels).
TINY = ("bench_exact=Softmax+%28materialized%29&bench_approx=Linear+%28elu%2B1%29&bench_n=64&bench_n=128&bench_steps=2"
        "&bench_d_model=64&bench_heads=2")

# Every mechanism on the shortest sweep: the longest labels the page shows
# every mechanism that runs without the causal mask (those that run causal only would refuse the sweep)
_BIDIRECTIONAL = [s for s in MECHANISMS.values() if not s.supports.causal_only]
EVERY = "&".join([*(f"bench_exact={quote_plus(s.label)}" for s in _BIDIRECTIONAL if s.exact),
                  *(f"bench_approx={quote_plus(s.label)}" for s in _BIDIRECTIONAL if not s.exact),
                  "bench_n=256", "bench_n=512", "bench_steps=2", "bench_d_model=64", "bench_heads=2"])


def find_chromium() -> str | None:
    """Chromium where this machine has it: on the PATH under one of its usual names, else the benchmark's path."""
    found = [shutil.which(name) for name in ("chromium", "chromium-browser", "google-chrome", "chrome")]
    return next(filter(None, found), dashboard.CHROMIUM if os.access(dashboard.CHROMIUM, os.X_OK) else None)


def _need_chromium() -> None:
    """Skip, naming what is missing, when this machine has no Chromium or no playwright; fail instead under CI (env
    CI set), where a browser test that cannot run must not pass as skipped."""
    missing = []
    if (chromium := find_chromium()) is None:
        missing.append("no Chromium on the PATH (chromium, chromium-browser, google-chrome) nor at "
                       f"{dashboard.CHROMIUM} (apt-get install chromium)")
    else:
        dashboard.CHROMIUM = chromium  # browser_page launches the one found here
    if importlib.util.find_spec("playwright") is None:
        missing.append("the playwright package is not installed (pip install playwright)")
    if missing:
        if os.environ.get("CI"):
            pytest.fail("CI must run the browser test, but " + "; ".join(missing))
        pytest.skip("; ".join(missing))


@pytest.fixture
def private_tmp(tmp_path) -> dict:
    """The server's temp folder and run store, so its sweep lock and its history are its own: a sweep running
    elsewhere must not stall this test, nor runs kept by other tests change the page it sees."""
    return {"TMPDIR": str(tmp_path), "ATTN_LAB_HOME": str(tmp_path / "store")}


@pytest.fixture(scope="module")
def lab_server(tmp_path_factory):
    """One server for a file's tests that need no fresh one (its own temp folder and run store, as private_tmp
    gives): each test's page is a session of its own, and a server's start is seconds of a busy machine's time."""
    _need_chromium()
    tmp = tmp_path_factory.mktemp("lab")
    with app_server({"TMPDIR": str(tmp), "ATTN_LAB_HOME": str(tmp / "store")}) as server:
        yield server


@pytest.fixture
def page():
    _need_chromium()
    ARTIFACTS.mkdir(exist_ok=True)
    with browser_page(1400, 2200) as p:
        yield p


def test_pages_share_the_process_s_browser_each_in_a_context_of_its_own_and_a_closed_browser_is_relaunched():
    """browser_page keeps one chromium a process (a launch is seconds of a busy machine's time), but gives each
    page a fresh context: a cookie set by one page is not seen by the next; a browser that has gone is replaced."""
    _need_chromium()
    with browser_page(320, 200) as first:
        first.context.add_cookies([{"name": "seen", "value": "1", "url": "http://127.0.0.1/"}])
        assert len(first.context.cookies()) == 1
        kept = first.context.browser
    with browser_page(320, 200) as second:
        assert second.context.browser is kept and kept.is_connected()
        assert second.context.cookies() == [] and second.viewport_size == {"width": 320, "height": 200}
    kept.close()
    with browser_page() as third:
        assert third.context.browser is not kept and third.evaluate("1 + 1") == 2


def test_tiny_sweep_draws_the_chart_without_an_exception(page, lab_server):
    from playwright.sync_api import expect  # the page fixture has checked that playwright is there

    server = lab_server
    page.goto(f"{server.url}/benchmark?{TINY}")
    run = page.locator(".st-key-bench_run button")
    run.wait_for()
    wait_idle(page)
    # The link's settings land in the widgets after the first script run: wait for them (auto-retrying).
    expect(page.locator(".st-key-bench_exact")).to_contain_text("Softmax (materialized)", timeout=30_000)
    expect(page.locator(".st-key-bench_approx")).to_contain_text("Linear (elu+1)", timeout=30_000)
    assert page.locator(".st-key-bench_exact").inner_text().count("Softmax (materialized)") == 1
    run.click()
    page.wait_for_selector(CHART)
    page.locator(".st-key-bench_stop button[disabled]").wait_for(timeout=120_000)
    page.locator('[data-testid="stTable"]').wait_for(timeout=120_000)  # the run's summary: it has ended
    open_fold(page, "Export", ".st-key-bench_dl_time_png button")
    page.screenshot(path=ARTIFACTS / "browser-benchmark-tiny-sweep.png", full_page=True)
    for key, magic in (("bench_dl_time_png", b"\x89PNG"), ("bench_dl_json", b"{")):
        assert downloaded(page, key).startswith(magic)
    assert page.locator(CHART).count() == 2
    assert page.locator(EXCEPTION).count() == 0
    assert page.locator('[data-testid="stDataFrame"]').count() >= 1


def test_talk_mode_is_the_first_click_on_a_fresh_server_and_it_counts(page, private_tmp):
    with app_server(private_tmp) as server:
        page.goto(server.url)
        page.get_by_role("heading", name="Attention Lab").wait_for()
        wait_idle(page)
        page.locator(".st-key-talk label p").click()
        # the server answered: talk mode's style is on the page (a lost click leaves the browser's 16px)
        page.wait_for_function("getComputedStyle(document.documentElement).fontSize === '21px'", timeout=10_000)
        wait_idle(page)
        page.screenshot(path=ARTIFACTS / "browser-home-talk-mode.png", full_page=True)


def test_a_reload_finds_the_running_sweep_and_a_sweep_nobody_watches_is_cancelled(page, private_tmp):
    """Reload mid-sweep: the new page shows the sweep's progress and can stop it. Close every page: no page says it
    is there any more (its heartbeat), and the server cancels the sweep after its orphan time and says so in its
    log."""
    # 16 lengths of a batch of 16: minutes of measuring on any CPU (7 lengths of one sequence ended in 12.8 s on a
    # quiet machine, before the orphan time), so the sweep is still running when the orphan time runs out
    longer = TINY.replace("bench_n=64&bench_n=128&bench_steps=2", "bench_n=256&bench_n=16%2C384&bench_steps=16"
                          ) + "&bench_batch=16"
    orphan_s = 15  # the server's own (stage.ORPHAN_VARIABLE): the sweep is still measuring when it runs out
    with app_server({**private_tmp, stage.ORPHAN_VARIABLE: str(orphan_s)}) as server:
        page.goto(f"{server.url}/benchmark?{longer}")
        wait_idle(page)
        page.locator(".st-key-bench_run button").click()
        page.locator('[data-testid="stProgress"]').wait_for()
        page.reload()
        page.get_by_text("was started before this page opened").wait_for()
        page.locator('[data-testid="stProgress"]').wait_for()
        assert page.locator(".st-key-bench_stop button:not([disabled])").count() == 1
        assert page.locator(EXCEPTION).count() == 0
        page.goto("about:blank")  # every page of the sweep has gone
        path = os.path.join(lock.user_folder(private_tmp["TMPDIR"]), lock.LOCK_NAME)
        with lock.sweep_lock(wait_s=orphan_s + 120, path=path):  # free once the sweep has ended
            pass
        assert "cancelled: no page has shown it" in server.output()


# Text cut short on the page: an element that clips what it holds (an ellipsis, hidden overflow) holding more than
# fits (Streamlit shortens a button's label in a div.stMarkdownEllipsis).
CUT_SHORT = """() => [...document.querySelectorAll('[data-testid="stMain"] *')].filter(e => {
    const cs = getComputedStyle(e);
    return e.offsetParent !== null && e.textContent.trim() && e.scrollWidth > e.clientWidth + 1
        && (cs.textOverflow === 'ellipsis' || ['hidden', 'clip'].includes(cs.overflowX));
}).map(e => e.textContent.trim().slice(0, 60))"""
GRID_WIDE = """() => [...document.querySelectorAll('[data-testid="stDataFrame"]')].filter(g => g.offsetParent !== null)
    .map(g => { const s = g.querySelector('.dvn-scroller'); return s ? s.scrollWidth - s.clientWidth : 0; })
    .filter(wider => wider > 1)"""  # data grids draw on a canvas: a column cut off shows only as a wider scroller
CHART_TEXT = """() => [...document.querySelectorAll('[data-testid="stVegaLiteChart"] svg text')]
    .filter(t => t.textContent.trim()).map(t => [t.textContent, parseFloat(getComputedStyle(t).fontSize)])"""


def open_fold(page, title: str, inside: str, tries: int = 3) -> None:
    """Unfold the expander `title` (its summary, not hidden text of that name) until the element `inside` shows: a
    rerun at a run's end may draw the expander anew, folded, after a click that came while the app was busy."""
    from playwright.sync_api import TimeoutError as PlaywrightTimeout

    for attempt in range(tries):
        wait_idle(page)
        if not page.locator(inside).first.is_visible():
            page.locator("summary:visible", has_text=title).first.click()
        try:
            page.locator(inside).first.wait_for(state="visible", timeout=10_000)
            return
        except PlaywrightTimeout:
            if attempt == tries - 1:
                raise


def downloaded(page, key: str, tries: int = 3) -> bytes:
    """The file the download button `key` gives (deferred: made by the server on the click), clicked once the app is
    idle, and again if no download came: a rerun may draw the button anew while a click is on its way (once in a
    quiet suite, the tiny sweep's PNG never came in 60 s)."""
    from playwright.sync_api import TimeoutError as PlaywrightTimeout

    for attempt in range(tries):
        wait_idle(page)
        try:
            with page.expect_download(timeout=30_000) as download:
                page.locator(f".st-key-{key} button").click()
            return Path(download.value.path()).read_bytes()
        except PlaywrightTimeout:
            if attempt == tries - 1:
                raise


def settled(page, probe: str, want, timeout_ms: int = 10_000):
    """The probe's value once the page has settled: waited on until it reads `want` or the timeout passes (a
    rerun's layout, a sidebar folding, talk mode's fonts growing, which a loaded machine draws late), then read
    once more for the caller's assertion, so a layout that stays wrong still fails."""
    from playwright.sync_api import TimeoutError as PlaywrightTimeout

    expected = json.dumps(json.dumps(want, separators=(",", ":")))  # as JSON.stringify writes it, quoted for JS
    with contextlib.suppress(PlaywrightTimeout):
        page.wait_for_function(f"JSON.stringify(({probe})()) === {expected}", timeout=timeout_ms)
    return page.evaluate(probe)


def test_talk_mode_fits_a_projector_and_a_screen(lab_server):
    """Talk mode at 1280×720, then the same page with the window at 1920×1080 (a run's page is laid out by the
    browser: the window's size is not the server's to know): sidebar folded, nothing cut short, each chart and its
    title within the window, every chart text at least 18 px, the summary a short table in large type."""
    from attn_core.charts.style import TALK_MIN_PX

    with browser_page(1280, 720) as page:
        # every mechanism, so that the Settings panel holds its longest labels
        page.goto(f"{lab_server.url}/benchmark?{EVERY}")
        page.locator(".st-key-bench_run button").wait_for()
        wait_idle(page)
        page.locator(".st-key-talk label p").click()
        page.wait_for_function("getComputedStyle(document.documentElement).fontSize === '21px'")
        wait_idle(page)
        page.get_by_text("Settings (folded away in talk mode)").click()
        page.locator(".st-key-bench_d_model input").wait_for()  # open
        page.wait_for_function("""() => { const s = document.querySelector('[data-testid="stSidebar"]');
                                         return s.getBoundingClientRect().right <= 1; }""")  # folded away
        page.screenshot(path=ARTIFACTS / "browser-talk-1280x720-settings.png")
        assert page.evaluate(CUT_SHORT) == []
        page.locator(".st-key-bench_run button").click()
        page.locator(".st-key-bench_stop button:not([disabled])").wait_for()
        page.locator(".st-key-bench_stop button[disabled]").wait_for(timeout=120_000)
        page.locator('[data-testid="stTable"]').wait_for()
        wait_idle(page)
        for width, height in ((1280, 720), (1920, 1080)):
            page.set_viewport_size({"width": width, "height": height})
            assert settled(page, "() => [window.innerWidth, window.innerHeight]", [width, height]) == [width, height]
            assert settled(page, CUT_SHORT, []) == [], width
            page.screenshot(path=ARTIFACTS / f"browser-talk-{width}x{height}.png", full_page=True)
            assert page.locator(EXCEPTION).count() == 0
            header = page.locator('[data-testid="stHeader"]').bounding_box()["height"]
            charts = page.locator(CHART)
            assert charts.count() == 2
            stop = page.locator(".st-key-bench_stop button p")  # disabled: grey, not black text that looks live
            assert stop.evaluate("p => getComputedStyle(p).color") not in ("rgb(0, 0, 0)", "rgb(49, 51, 63)")
            for i in range(2):
                charts.nth(i).scroll_into_view_if_needed()
                page.screenshot(path=ARTIFACTS / f"browser-talk-{width}x{height}-chart{i + 1}.png")
                box = charts.nth(i).bounding_box()
                assert box["height"] <= height - header, (width, box, header)
                assert box["width"] <= width
            texts = page.evaluate(CHART_TEXT)
            assert texts and min(size for _, size in texts) >= TALK_MIN_PX, sorted(texts, key=lambda t: t[1])[:3]
            assert not any(text.endswith("…") for text, _ in texts)
            table = page.locator('[data-testid="stTable"]')
            assert float(table.evaluate("t => parseFloat(getComputedStyle(t.querySelector('td')).fontSize)")) >= 18
            assert table.locator("tbody tr").count() == len(_BIDIRECTIONAL)  # one row each; the rest a click away
            assert page.get_by_text("Every column of the summary").count() == 1


def test_learn_page_in_talk_mode_at_1280x720_is_readable(lab_server):
    """Every step's figure at 1280×720 in talk mode: nothing cut short, every chart text at least 18 px, each figure
    within the window's width."""
    from attn_core.charts.style import TALK_MIN_PX

    with browser_page(1280, 720) as page:
        page.goto(f"{lab_server.url}/learn?")
        page.get_by_role("heading", name="Learn", exact=True).first.wait_for()
        wait_idle(page)
        page.locator(".st-key-talk label p").click()
        page.wait_for_function("getComputedStyle(document.documentElement).fontSize === '21px'")
        wait_idle(page)
        page.locator('[data-testid="stTable"]').wait_for()
        page.screenshot(path=ARTIFACTS / "browser-learn-talk-1280x720.png")
        assert page.locator(EXCEPTION).count() == 0
        assert page.evaluate(CUT_SHORT) == []
        texts = page.evaluate(CHART_TEXT)
        assert texts and min(size for _, size in texts) >= TALK_MIN_PX, sorted(texts, key=lambda t: t[1])[:3]
        assert not any(text.endswith("…") for text, _ in texts)
        main = page.locator('[data-testid="stMain"]').bounding_box()
        for chart in page.locator(CHART).all():
            box = chart.bounding_box()
            assert box["x"] + box["width"] <= main["x"] + main["width"]


# Content wider than the main area: the page scrolls sideways, or a panel is cut off at its right edge.
OVERFLOW = """() => { const main = document.querySelector('[data-testid="stMain"]');
    const right = main.getBoundingClientRect().right;
    return [document.documentElement.scrollWidth > window.innerWidth + 1,
            [...main.querySelectorAll('[data-testid="stVegaLiteChart"], [data-testid="stHorizontalBlock"]')]
              .filter(e => e.offsetParent !== null && e.getBoundingClientRect().right > right + 1).length]; }"""
IN_VIEW = """() => { const c = document.querySelector('[data-testid="stVegaLiteChart"]');
    if (!c) return false; const b = c.getBoundingClientRect();
    return b.top >= 0 && b.top < window.innerHeight / 2; }"""
PRESETS_LOOK_FOR = {name: p.look_for for name, p in presets.PRESETS.items()}
SCROLL_DOWN = """() => { const m = document.querySelector('[data-testid="stMain"]');
    m.scrollTo({top: m.scrollHeight}); }"""


# A line of the page that says only "None": an expression statement written by Streamlit's magic.
STRAY_NONE = """() => document.querySelector('[data-testid="stMain"]').innerText.split('\\n')
    .filter(line => line.trim() === 'None').length"""
FIT_JARGON = ("least squares", "log space", "fitted")  # the method, kept behind "How this was measured"


def finished_run_reads_plainly(page, *, export: bool) -> None:
    """A finished run's page: no stray "None" under its summary, no fitting method in a chart's legend; `export`: the
    exported SVG carries no fit either, and the one-line busy footnote exactly when the page says the computer was
    busy."""
    import html

    page.locator('[data-testid="stDataFrame"], [data-testid="stTable"]').first.wait_for()  # the summary is drawn
    assert page.evaluate(STRAY_NONE) == 0
    legend = " ".join(text for text, _ in page.evaluate(CHART_TEXT)).lower()
    assert legend and not [words for words in FIT_JARGON if words in legend], legend
    if not export:
        return
    busy = page.get_by_text("the computer was busy: hollow points left out").count() > 0
    open_fold(page, "Export", ".st-key-bench_dl_time_svg button")
    svg = html.unescape(downloaded(page, "bench_dl_time_svg").decode("utf-8"))
    assert not [words for words in FIT_JARGON if words in svg.lower()]
    assert (scaling.BUSY_FOOTNOTE in svg) == busy, busy
