"""The real app in a real browser: `streamlit run app.py` on 127.0.0.1, driven through Debian's headless chromium.

Screenshots go to test-artifacts/. Without chromium this skips, except under CI, where it fails."""
import importlib.util
import os
from pathlib import Path

import pytest

from attn_core import sweep
from attn_core.benchmarks.dashboard import CHART, CHROMIUM, EXCEPTION, app_server, browser_page, wait_idle

ARTIFACTS = Path(__file__).resolve().parents[1] / "test-artifacts"
PAGES = {"": "Attention Lab", "benchmark": "Benchmark", "accuracy": "Accuracy", "patterns": "Patterns",
         "theory": "Theory", "compare": "Compare runs"}
# A tiny sweep as a link: settings are bound to the URL (multiselects by their labels).
TINY = ("bench_exact=Softmax+%28materialized%29&bench_approx=Linear+%28elu%2B1%29&bench_n=64&bench_n=128&bench_steps=2"
        "&bench_d_model=64&bench_heads=2")


def _need_chromium() -> None:
    missing = []
    if not os.access(CHROMIUM, os.X_OK):
        missing.append(f"Debian's chromium is not at {CHROMIUM} (apt-get install chromium)")
    if importlib.util.find_spec("playwright") is None:
        missing.append("the playwright package is not installed (pip install playwright)")
    if missing:
        if os.environ.get("CI"):
            pytest.fail("CI must run the browser test, but " + "; ".join(missing))
        pytest.skip("; ".join(missing))


@pytest.fixture
def private_tmp(tmp_path) -> dict:
    """The server's temp folder, so its sweep lock is its own: a sweep running elsewhere must not stall this test."""
    return {"TMPDIR": str(tmp_path)}


@pytest.fixture
def page():
    _need_chromium()
    ARTIFACTS.mkdir(exist_ok=True)
    with browser_page(1400, 2200) as p:
        yield p


def test_tiny_sweep_draws_the_chart_without_an_exception(page, private_tmp):
    from playwright.sync_api import expect  # the page fixture has checked that playwright is there

    with app_server(private_tmp) as server:
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
        page.locator(".st-key-bench_stop button[disabled]").wait_for()
        page.get_by_text("Export").first.click()
        wait_idle(page)
        page.screenshot(path=ARTIFACTS / "browser-benchmark-tiny-sweep.png", full_page=True)
        for key, magic in (("bench_dl_time_png", b"\x89PNG"), ("bench_dl_json", b"{")):
            with page.expect_download() as download:  # deferred: made by the server on the click
                page.locator(f".st-key-{key} button").click()
            assert Path(download.value.path()).read_bytes().startswith(magic)
        assert page.locator(CHART).count() == 2
        assert page.locator(EXCEPTION).count() == 0
        assert page.locator('[data-testid="stDataFrame"]').count() >= 1


@pytest.mark.parametrize("path", list(PAGES))
def test_each_page_opens_by_its_url_as_the_first_request(page, path, private_tmp):
    with app_server(private_tmp) as server:
        page.goto(f"{server.url}/{path}")
        page.get_by_role("heading", name=PAGES[path], exact=True).first.wait_for()
        wait_idle(page)
        page.screenshot(path=ARTIFACTS / f"browser-page-{path or 'home'}.png", full_page=True)
        assert page.locator(EXCEPTION).count() == 0
        assert "Page not found" not in page.content()
        # the router ran: its sidebar and page titles, not streamlit's file-name navigation
        sidebar = page.locator('[data-testid="stSidebar"]')
        assert sidebar.get_by_text("Talk mode").count() == 1
        assert sidebar.get_by_text("Compare runs").count() == 1


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
    """Reload mid-sweep: the new page shows the sweep's progress and can stop it. Close every page: the server
    cancels the sweep after its grace time (stage.ORPHAN_S) and says so in its log."""
    longer = TINY.replace("bench_n=64&bench_n=128&bench_steps=2", "bench_n=256&bench_n=16%2C384&bench_steps=7")
    with app_server(private_tmp) as server:
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
        lock = os.path.join(sweep.user_folder(private_tmp["TMPDIR"]), sweep.LOCK_NAME)
        with sweep.sweep_lock(wait_s=120, path=lock):  # free once the sweep has ended
            pass
        assert "cancelled: no page has shown it" in server.output()
