"""The first minutes in a real browser: the quick demo's chart and a preset's in view, popovers whole.

Split from tests/dashboard/test_browser.py (its helpers and fixtures are there), so that the suite's processes share
the browser tests."""
from attn_core.benchmarks.dashboard import CHART, EXCEPTION, app_server, browser_page, wait_idle
from tests.dashboard.test_browser import (  # noqa: F401 (private_tmp: a fixture)
    ARTIFACTS, CUT_SHORT, GRID_WIDE, IN_VIEW, OVERFLOW, PRESETS_LOOK_FOR, SCROLL_DOWN, _need_chromium,
    finished_run_reads_plainly, private_tmp)


def test_the_first_minutes_chart_in_view_popovers_full_nothing_wider_than_the_window(private_tmp):
    """Issue 30, on one server: the quick demo's chart in view as soon as it is drawn, at 1280×720 and 1920×1080,
    normal and talk mode (no scrolling, though Home was scrolled down), and so is the chart of a preset started from
    the Benchmark page scrolled down to its presets; the Learn page's export popovers hold their buttons and none lies
    on the page. (Every page at 1280×720, normal and talk: test_nothing_cut_short_and_no_request_leaves_the_machine.)"""
    from playwright.sync_api import expect

    _need_chromium()
    preset = "Where linear attention wins"
    with app_server(private_tmp) as server:
        # the smaller window plain and the larger in talk mode: the two other pairings of a run's chart with the
        # window are measured by test_every_first_chart_whole_in_the_window
        for width, height, talk in ((1280, 720, False), (1920, 1080, True)):
            shot = f"{width}x{height}{'-talk' * talk}"
            with browser_page(width, height) as page:
                page.goto(server.url)
                page.locator(".st-key-home_demo button").wait_for()
                wait_idle(page)
                if talk:
                    page.locator(".st-key-talk label p").click()
                    page.wait_for_function("getComputedStyle(document.documentElement).fontSize === '21px'")
                    wait_idle(page)
                page.evaluate(SCROLL_DOWN)  # as a reader does before the demo button; the run must bring the chart up
                page.locator(".st-key-home_demo button").click()
                page.wait_for_selector(CHART, timeout=120_000)
                page.wait_for_function(IN_VIEW, timeout=30_000)  # drawn in view, no scroll asked
                page.screenshot(path=ARTIFACTS / f"browser-first-chart-{shot}.png")
                page.locator(".st-key-bench_stop button[disabled]").wait_for(timeout=120_000)
                wait_idle(page)
                assert page.evaluate(CUT_SHORT) == [], (width, talk)  # preset names, options, tables whole
                assert page.evaluate(GRID_WIDE) == [], (width, talk)
                assert page.evaluate(OVERFLOW) == [False, 0], (width, talk)
                finished_run_reads_plainly(page, export=not talk)
                # a preset from the Benchmark page, its buttons below the finished run's chart: the new chart comes up
                button = page.locator(f".st-key-bench_preset_{preset.lower().replace(' ', '_')} button")
                # the reader down among the presets, the chart out of view: scrolled to the bottom until the page has
                # stopped growing (the finished run's table and exports may still be drawn)
                page.wait_for_function(f"() => {{ ({SCROLL_DOWN})(); return !({IN_VIEW})(); }}", timeout=30_000)
                button.click()
                expect(page.get_by_text(PRESETS_LOOK_FOR[preset])).to_have_count(1, timeout=30_000)
                page.wait_for_selector(CHART, timeout=120_000)
                page.wait_for_function(IN_VIEW, timeout=30_000)
                page.screenshot(path=ARTIFACTS / f"browser-preset-chart-{shot}.png")
                stop = page.locator(".st-key-bench_stop button")
                if stop.is_enabled():
                    stop.click()  # its chart is in view: the rest of its sweep is not this test's business
                page.locator(".st-key-bench_stop button[disabled]").wait_for(timeout=120_000)
                assert page.locator(EXCEPTION).count() == 0, (width, talk)
        with browser_page(1280, 720) as page:
            page.goto(f"{server.url}/learn")
            page.get_by_role("heading", name="Learn", exact=True).first.wait_for()
            wait_idle(page)
            assert page.locator('[data-testid="stDownloadButton"]').count() == 0  # none spilled onto the page
            popover = page.locator('[data-testid="stPopover"] button').first
            popover.click()
            page.locator('[data-testid="stPopoverBody"] [data-testid="stDownloadButton"]').first.wait_for()
            assert page.locator('[data-testid="stPopoverBody"] [data-testid="stDownloadButton"]').count() == 3
            page.screenshot(path=ARTIFACTS / "browser-learn-popover-1280x720.png")
            page.keyboard.press("Escape")
            assert page.locator(EXCEPTION).count() == 0
