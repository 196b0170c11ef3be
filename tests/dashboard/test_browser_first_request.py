"""A page opened by its URL as a fresh server's first request, in Debian's headless chromium; every page routed
the same way (ensure_routed, read from its source).

Split from tests/dashboard/test_browser.py (its helpers and fixtures are there), so that the suite's processes share
the browser tests."""
import ast
import re
from pathlib import Path

import pytest

from attn_core.benchmarks.dashboard import EXCEPTION, app_server, wait_idle
from tests.dashboard.test_browser import (  # noqa: F401 (page, private_tmp: fixtures)
    ARTIFACTS, PAGES, page, private_tmp)


ROOT = Path(__file__).resolve().parents[2]
# A fresh server a path, each one's first request: Home (the router itself as the legacy page) and two deep links,
# the busiest page and the one that computes most before its first chart. Every other page goes through the same
# first call, which test_every_routed_page_calls_ensure_routed_first reads.
FIRST_REQUESTS = ("", "benchmark", "planner")


def test_every_routed_page_calls_ensure_routed_first():
    """Every page app.py routes to makes ensure_routed() its first statement after its imports (a deep link as a
    server's first request runs the page alone; only that call lets the router run)."""
    routed = re.findall(r'st\.Page\("(pages/[a-z_]+\.py)"', (ROOT / "app.py").read_text())
    assert len(routed) == len(PAGES) + 1  # PAGES' titles and Associative recall
    for name in routed:
        body = [node for node in ast.parse((ROOT / name).read_text()).body
                if not isinstance(node, (ast.Import, ast.ImportFrom))
                and not (isinstance(node, ast.Expr) and isinstance(node.value, ast.Constant))]  # the docstring
        first = body[0]
        assert (isinstance(first, ast.Expr) and isinstance(first.value, ast.Call)
                and getattr(first.value.func, "id", None) == "ensure_routed"), (name, ast.unparse(first))


@pytest.mark.parametrize("path", FIRST_REQUESTS)
def test_a_page_opens_by_its_url_as_the_first_request(page, path, private_tmp):
    from playwright.sync_api import expect  # the page fixture has checked that playwright is there

    with app_server(private_tmp) as server:
        page.goto(f"{server.url}/{path}")
        page.get_by_role("heading", name=PAGES[path], exact=True).first.wait_for()
        # A first request runs the page once outside the router, which reruns it (ensure_routed): the script is idle
        # for a moment between the two runs, so wait for the router's own sidebar before judging the page.
        sidebar = page.locator('[data-testid="stSidebar"]')
        expect(sidebar.get_by_text("Talk mode")).to_have_count(1, timeout=60_000)
        wait_idle(page)
        page.screenshot(path=ARTIFACTS / f"browser-page-{path or 'home'}.png", full_page=True)
        assert page.locator(EXCEPTION).count() == 0
        assert "Page not found" not in page.content()
        # the router ran: its sidebar and page titles, not streamlit's file-name navigation
        assert sidebar.get_by_text("Talk mode").count() == 1
        assert sidebar.get_by_text("Compare runs").count() == 1
