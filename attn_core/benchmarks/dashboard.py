"""How fast the dashboard answers, in a real browser: server start to first page, first point after Run, the default
sweep, and a click while a sweep runs. Prints figures; asserts nothing. `python -m attn_core.benchmarks.dashboard`."""
from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path
from typing import Iterator

ROOT = Path(__file__).resolve().parents[2]
CHROMIUM = "/usr/bin/chromium"
CHROMIUM_FLAGS = ("--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
                  "--disable-component-update", "--disable-sync", "--no-first-run")
EXCEPTION = '[data-testid="stException"]'
CHART = '[data-testid="stVegaLiteChart"]'
# The new sweep's progress bar counts a point (its charts come in the same script run).
FIRST_POINT = """() => { const bar = document.querySelector('[data-testid="stProgress"]');
                         return bar !== null && /^[1-9][0-9]* of /.test(bar.innerText)
                                && document.querySelector('[data-testid="stVegaLiteChart"]') !== null; }"""


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class AppServer:
    """`streamlit run app.py` on 127.0.0.1 and a free port, in its own process group so that stopping it also stops
    the measuring worker it started."""

    def __init__(self, timeout_s: float = 60.0, env: dict | None = None) -> None:
        self.port, self.timeout_s = free_port(), timeout_s
        self.url = f"http://127.0.0.1:{self.port}"
        self.log = tempfile.NamedTemporaryFile("w+", prefix="streamlit-", suffix=".log", delete=False)
        self.started = time.perf_counter()
        self.process = subprocess.Popen(
            [sys.executable, "-m", "streamlit", "run", "app.py", "--server.address=127.0.0.1",
             f"--server.port={self.port}", "--server.headless=true", "--browser.gatherUsageStats=false",
             "--server.fileWatcherType=none"],
            cwd=ROOT, stdout=self.log, stderr=subprocess.STDOUT, start_new_session=True,
            env={**os.environ, **(env or {})})

    def wait_ready(self) -> None:
        """Until the health endpoint answers; RuntimeError with the server's log if it dies or times out."""
        deadline = time.perf_counter() + self.timeout_s
        while time.perf_counter() < deadline:
            if self.process.poll() is not None:
                raise RuntimeError(f"streamlit exited with {self.process.returncode}:\n{self.output()}")
            with contextlib.suppress(OSError):
                with urllib.request.urlopen(f"{self.url}/_stcore/health", timeout=1) as r:
                    if r.status == 200:
                        return
            time.sleep(0.05)
        raise RuntimeError(f"streamlit did not answer within {self.timeout_s:.0f} s:\n{self.output()}")

    def output(self) -> str:
        self.log.flush()
        return Path(self.log.name).read_text(errors="replace")[-4000:]

    def stop(self) -> None:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.process.pid, signal.SIGTERM)
        try:
            self.process.wait(10)
        except subprocess.TimeoutExpired:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.process.pid, signal.SIGKILL)
            self.process.wait(5)
        self.log.close()
        os.unlink(self.log.name)


@contextlib.contextmanager
def app_server(env: dict | None = None) -> Iterator[AppServer]:
    server = AppServer(env=env)
    try:
        server.wait_ready()
        yield server
    finally:
        server.stop()


@contextlib.contextmanager
def browser_page(width: int = 1400, height: int = 1000):
    """A page of Debian's headless chromium driven by playwright (never a downloaded browser)."""
    from playwright.sync_api import sync_playwright

    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, args=list(CHROMIUM_FLAGS))
        try:
            page = browser.new_page(viewport={"width": width, "height": height})
            page.set_default_timeout(60_000)
            yield page
        finally:
            browser.close()


def wait_idle(page, timeout_s: float = 60) -> None:
    """Until the app has run its script and is not running it now (the state streamlit's own e2e tests wait on)."""
    page.wait_for_selector('[data-testid="stApp"][data-test-script-state="notRunning"]', timeout=timeout_s * 1000)


def measure() -> dict[str, float]:
    """Seconds: server start → first rendered page; Run → first point (pressed as soon as the page is up, then again
    with the worker warm); a click while the sweep runs → the server's answer on screen; Run → default sweep done."""
    figures = {}
    with browser_page() as page:
        server = AppServer()
        try:
            server.wait_ready()
            page.goto(server.url)
            page.get_by_role("heading", name="Attention Lab").wait_for()
            figures["server start → first rendered page"] = time.perf_counter() - server.started
            page.goto(f"{server.url}/benchmark")
            run, done = page.locator(".st-key-bench_run button"), page.locator(".st-key-bench_stop button[disabled]")
            run.wait_for()
            wait_idle(page)
            t0 = time.perf_counter()
            run.click()
            page.wait_for_selector(CHART)
            figures["Run → first point on the chart (Run pressed at once)"] = time.perf_counter() - t0
            figures["a click while the sweep runs → answer on screen"] = answer_time(page)
            done.wait_for(timeout=300_000)
            figures["Run → default sweep done"] = time.perf_counter() - t0
            wait_idle(page)
            t0 = time.perf_counter()
            run.click()
            page.wait_for_function(FIRST_POINT)
            figures["Run → first point on the chart (worker warm)"] = time.perf_counter() - t0
            page.locator(".st-key-bench_stop button").click()
            if page.locator(EXCEPTION).count():
                print("an exception box is on the page:", page.locator(EXCEPTION).first.inner_text())
        finally:
            server.stop()
    return figures


def answer_time(page) -> float:
    """Type an invalid d_model and wait for the page's sentence about it (a full rerun), then put it back."""
    d_model = page.locator(".st-key-bench_d_model input")
    t0 = time.perf_counter()
    d_model.fill("500")
    d_model.press("Enter")
    page.get_by_text("not divisible", exact=False).first.wait_for()
    seconds = time.perf_counter() - t0
    d_model.fill("512")
    d_model.press("Enter")
    return seconds


def engine_alone() -> float:
    """Seconds the default sweep takes through the engine with no dashboard, for comparison."""
    from attn_core.sweep import DEFAULT_SWEEP, run_sweep
    from attn_core.worker import prestart

    prestart().wait_ready()
    t0 = time.perf_counter()
    run_sweep(DEFAULT_SWEEP)
    return time.perf_counter() - t0


def main() -> None:
    print(f"dashboard response times on this machine ({os.cpu_count()} CPUs, load average "
          f"{os.getloadavg()[0]:.1f} at the start), default settings:")
    for name, seconds in measure().items():
        print(f"  {name:<56} {seconds:6.2f} s")
    print(f"  {'the default sweep through the engine alone (no dashboard)':<56} {engine_alone():6.2f} s")


if __name__ == "__main__":
    main()
