"""The dashboard's numbers against the command line's, in a real browser: agreement of the medians (default sweep and
quick demo), repeatability of two runs, the default sweep's time, the first point after Run (fresh server and warm),
a click while a sweep runs, and what a process spinning on one core does to a sweep's points (flagged or re-measured
clean). With `--demos` instead: the quick demo and the presets run through the dashboard's own Job (each with its
announced budget, Preset.seconds) while a process spins on one core, announced against taken for each; the figures
the presets announce come from here. Prints figures; asserts nothing. `python -m attn_core.benchmarks.dashboard`."""
from __future__ import annotations

import argparse
import contextlib
import math
import multiprocessing
import os
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from pathlib import Path
from typing import Iterator

import numpy as np
import pandas as pd

from .runner import Benchmark, Figure, Machine, run
from ..engine import presets, results
from ..engine.config import DEFAULT_SWEEP, SweepConfig
from ..engine.job import KEPT_BUSY, Job
from attn_core.engine.files import write_atomic
from attn_core.engine.untrusted import csv_bytes

ROOT = Path(__file__).resolve().parents[2]
CHROMIUM = "/usr/bin/chromium"
CHROMIUM_FLAGS = ("--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
                  "--disable-component-update", "--disable-sync", "--no-first-run")
EXCEPTION = '[data-testid="stException"]'
CHART = '[data-testid="stVegaLiteChart"]'
DEFAULT = DEFAULT_SWEEP
DEFAULT_CPU = DEFAULT_SWEEP.replaced(device="cpu")
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


# This process's playwright driver and chromium, by thread (playwright's sync objects belong to the thread that made
# them): launched by the first browser_page and kept until the process ends.
_BROWSERS: dict[tuple[int, int], tuple] = {}


def _browser():
    """The calling thread's headless chromium, launched on first use and relaunched where it has gone. Kept between
    pages: a launch (playwright's node driver, chromium and its GPU process) cost about 1.4 CPU-s on a 2-core EPYC
    (tests/dashboard/test_browser_in_view.py, five pages: 110.7 CPU-s of driver and browser with a launch each, 105.0
    with one); each page gets a context of its own (browser_page)."""
    import atexit

    from playwright.sync_api import sync_playwright

    key = (os.getpid(), threading.get_ident())
    kept = _BROWSERS.get(key)
    if kept is None or not kept[1].is_connected():
        if kept is not None:
            _close_browser(key)
        driver = sync_playwright().start()
        try:
            browser = driver.chromium.launch(executable_path=CHROMIUM, args=list(CHROMIUM_FLAGS))
        except BaseException:
            driver.stop()
            raise
        if not _BROWSERS:
            atexit.register(_close_browsers)
        _BROWSERS[key] = kept = (driver, browser)
    return kept[1]


def _close_browser(key: tuple[int, int]) -> None:
    driver, browser = _BROWSERS.pop(key)
    for close in (browser.close, driver.stop):
        with contextlib.suppress(Exception):  # a browser already gone, a driver that ended with it
            close()


def _close_browsers() -> None:
    if (key := (os.getpid(), threading.get_ident())) in _BROWSERS:  # at exit: this process's main thread's
        _close_browser(key)


@contextlib.contextmanager
def browser_page(width: int = 1400, height: int = 1000):
    """A page of Debian's headless chromium driven by playwright (never a downloaded browser), in a fresh context
    (no cookies, storage or cache of an earlier page) of the process's kept browser (_browser)."""
    context = _browser().new_context(viewport={"width": width, "height": height})
    try:
        page = context.new_page()
        page.set_default_timeout(60_000)
        yield page
    finally:
        with contextlib.suppress(Exception):  # a browser that crashed: the next page launches another
            context.close()


def wait_idle(page, timeout_s: float = 60) -> None:
    """Until the app has run its script and is not running it now (the state streamlit's own e2e tests wait on)."""
    page.wait_for_selector('[data-testid="stApp"][data-test-script-state="notRunning"]', timeout=timeout_s * 1000)


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


DONE = ".st-key-bench_stop button[disabled]"


def quietly(page, predicate: str, timeout_s: float, every_ms: int = 250) -> None:
    """Wait until the JavaScript `predicate` holds, checked every `every_ms`. (A locator's wait or a default
    wait_for_function checks on every animation frame: a browser busy 60 times a second beside the measurement.)"""
    page.wait_for_function(predicate, polling=every_ms, timeout=timeout_s * 1000)


def wait_done(page) -> None:
    """Until the sweep has ended and the page has drawn its end (Run back, the Export panel there)."""
    quietly(page, f"() => document.querySelector('{DONE}') !== null", 300)
    page.get_by_text("Export", exact=True).first.wait_for(timeout=60_000)
    wait_idle(page)


def exported(page) -> pd.DataFrame:
    """The finished sweep's rows, through the page's own JSON export (what a user downloads)."""
    wait_idle(page)
    button = page.locator(".st-key-bench_dl_json button")
    if not button.is_visible():  # the panel keeps its state between sweeps: open it only when it is shut
        page.get_by_text("Export", exact=True).first.click()
    button.wait_for()
    wait_idle(page)
    from playwright.sync_api import TimeoutError as PlaywrightTimeout  # only the browser's part needs it

    for attempt in range(6):  # a click the page was not ready for starts no download: click again
        try:
            with page.expect_download(timeout=10_000) as download:
                button.click()
            return results.load_run(Path(download.value.path()).read_bytes()).frame
        except PlaywrightTimeout:
            wait_idle(page)
    raise RuntimeError("the JSON export never started a download")


def points_done(page) -> int:
    text = page.locator('[data-testid="stProgress"]').first.inner_text()
    return int(text.split(" of ")[0]) if " of " in text else 0


def dashboard_default(page, url: str, busy_halfway: bool = False) -> tuple[pd.DataFrame, dict]:
    """The default sweep through the page: Run, first point, end; optionally a process spinning on one core from
    the moment half the points are in (figures: seconds, and the points measured before it started)."""
    page.goto(f"{url}/benchmark")
    run = page.locator(".st-key-bench_run button")
    run.wait_for()
    wait_idle(page)
    t0 = time.perf_counter()
    run.click()
    quietly(page, FIRST_POINT, 120, every_ms=25)
    figures = {"first point": time.perf_counter() - t0}
    spinner = None
    if busy_halfway:
        total = len(DEFAULT.mechanisms) * len(DEFAULT.ns)
        quietly(page, f"""() => {{ const bar = document.querySelector('[data-testid="stProgress"]');
            return bar !== null && parseInt(bar.innerText) >= {total // 2}; }}""", 300)
        spinner = subprocess.Popen([sys.executable, "-c", "while True: pass"],
                                   preexec_fn=lambda: os.sched_setaffinity(0, {(os.cpu_count() or 1) - 1}))
        figures["points before the busy process"] = points_done(page)
    try:
        wait_done(page)
    finally:
        if spinner is not None:
            spinner.kill()
            spinner.wait()
    figures["seconds"] = time.perf_counter() - t0
    return exported(page), figures


def dashboard_demo(page, url: str) -> pd.DataFrame:
    page.goto(url)
    page.locator(".st-key-home_demo button").click()
    page.locator(".st-key-bench_run button").wait_for()
    wait_done(page)
    return exported(page)


def cli_run(config: SweepConfig) -> pd.DataFrame:
    """The same sweep through `python -m attn_core sweep` (a process of its own, as a user runs it)."""
    with tempfile.TemporaryDirectory() as folder:
        out = Path(folder) / "run.json"
        mechanisms = ",".join(key for key, _ in config.mechanisms)
        p, s = config.problem, config.settings
        subprocess.run([sys.executable, "-m", "attn_core", "sweep", "--mechanisms", mechanisms,
                        "--n", ",".join(map(str, config.ns)), "--d-model", str(p.d_model),
                        "--heads", str(p.heads), "--batch", str(p.batch), "--device", "cpu",
                        "--warmup", str(s.warmup), "--min-repeats", str(s.min_repeats),
                        "--min-time", str(s.min_time_s), "--point-budget", str(s.point_budget_s),
                        "--quiet", "--out", str(out)], cwd=ROOT, check=False, capture_output=True)
        return results.load_run(out).frame


def medians(frame: pd.DataFrame) -> pd.Series:
    ok = frame[frame["status"] == "ok"]
    return ok.set_index(["mechanism", "params", "n"])["time_median_s"]


def compare(a: pd.DataFrame, b: pd.DataFrame, floor_s: float) -> dict:
    """Per point of at least `floor_s` in b: the ratio a / b of the medians (worst as the larger of r and 1/r)."""
    ma, mb = medians(a), medians(b)
    common = ma.index.intersection(mb.index)
    common = [i for i in common if mb[i] >= floor_s]
    ratio = pd.Series({i: ma[i] / mb[i] for i in common}, dtype=float)
    off = np.maximum(ratio, 1 / ratio)
    if off.empty:
        return {"points": 0}
    worst = off.idxmax()
    return {"points": len(off), "median": float(off.median()), "worst": float(off.max()),
            "worst_at": f"{worst[0]} n={worst[2]}", "within_1.3": int((off <= 1.3).sum()),
            "within_10pct": int((off <= 1.1).sum()), "bias": float(np.exp(np.log(ratio).mean()))}


def say(name: str, c: dict) -> list[Figure]:
    """The comparison `c` printed; its median and worst ratio as figures (none without common points)."""
    if not c["points"]:
        print(f"  {name:<58} no common points")
        return []
    print(f"  {name:<58} {c['points']:>2} points: median ×{c['median']:.3f}, worst ×{c['worst']:.2f} "
          f"({c['worst_at']}); within ×1.3: {c['within_1.3']}, within 10%: {c['within_10pct']}; first ÷ second "
          f"×{c['bias']:.3f} (geometric mean)")
    return [Figure(f"{name}: median ratio", c["median"], "×", n=c["points"]),
            Figure(f"{name}: worst ratio", c["worst"], "×", n=c["points"])]


def disturbed_share(frame: pd.DataFrame, before: int) -> str:
    """Of the points measured after the busy process started: how many were flagged or re-measured clean."""
    later = frame.iloc[before:]
    later = later[later["status"] == "ok"]
    flagged, retaken = int(later["disturbed"].sum()), int((~later["disturbed"] & (later["retaken"] > 0)).sum())
    untouched = len(later) - flagged - retaken
    return (f"{len(later)} points measured with a process spinning on one core: {flagged} flagged disturbed, "
            f"{retaken} re-measured clean (samples retaken), {untouched} neither; mean foreign CPU "
            f"{later['foreign_cpu'].mean():.2f} cores")


def save(runs: dict[str, pd.DataFrame], folder: str | None) -> None:
    """Each run as CSV in `folder` (ATTN_BENCH_OUT), for a closer look; nothing without one."""
    if folder:
        Path(folder).mkdir(parents=True, exist_ok=True)
        for name, frame in runs.items():
            write_atomic(Path(folder) / f"{name.replace(' ', '_')}.csv", csv_bytes(frame))


def measure(args) -> list[Figure]:
    if args.demos is not None:
        return demos(args.demos, args.spin_s, args.try_s)
    quick = presets.QUICK_DEMO.for_device("cpu")[0]
    figures, runs = {}, {}
    with browser_page() as page:
        server = AppServer()
        try:
            server.wait_ready()
            page.goto(server.url)
            page.get_by_role("heading", name="Attention Lab").wait_for()
            figures["server start → first rendered page"] = time.perf_counter() - server.started
            runs["dash default 1"], first = dashboard_default(page, server.url)
            figures["Run → first point, fresh server (Run pressed at once)"] = first["first point"]
            figures["default sweep in the dashboard, fresh server"] = first["seconds"]
            runs["cli default 1"] = cli_run(DEFAULT_CPU)
            runs["dash default 2"], second = dashboard_default(page, server.url)
            figures["Run → first point, warm worker"] = second["first point"]
            figures["default sweep in the dashboard, warm"] = second["seconds"]
            runs["cli default 2"] = cli_run(DEFAULT_CPU)
            for i in (1, 2):
                runs[f"dash demo {i}"] = dashboard_demo(page, server.url)
                runs[f"cli demo {i}"] = cli_run(quick)
            runs["dash busy"], busy = dashboard_default(page, server.url, busy_halfway=True)
            figures["answer to a click during a sweep"] = answer_during_sweep(page, server.url)
            if page.locator(EXCEPTION).count():
                print("an exception box is on the page:", page.locator(EXCEPTION).first.inner_text())
        finally:
            server.stop()
    found = []
    for name, seconds in figures.items():
        print(f"  {name:<58} {seconds:6.2f} s")
        found.append(Figure(name, seconds, "s"))
    print("Dashboard vs command line (target: every point ≥ 0.5 ms within ×1.3):")
    for i in (1, 2):
        found += say(f"default sweep, run {i}", compare(runs[f"dash default {i}"], runs[f"cli default {i}"], 5e-4))
        found += say(f"quick demo, run {i}", compare(runs[f"dash demo {i}"], runs[f"cli demo {i}"], 5e-4))
    print("Repeatability, two runs of one sweep (target: every point ≥ 1 ms within 10%):")
    for kind in ("dash", "cli"):
        found += say(f"{kind} default sweep", compare(runs[f"{kind} default 1"], runs[f"{kind} default 2"], 1e-3))
        found += say(f"{kind} quick demo", compare(runs[f"{kind} demo 1"], runs[f"{kind} demo 2"], 1e-3))
    print("A process spinning on one core from halfway through a default sweep in the dashboard:")
    print("  " + disturbed_share(runs["dash busy"], int(busy["points before the busy process"])))
    found += say("its points against the clean dashboard run", compare(runs["dash busy"], runs["dash default 2"], 5e-4))
    save(runs, os.environ.get("ATTN_BENCH_OUT"))
    return found


def answer_during_sweep(page, url: str) -> float:
    """Seconds from typing a bad value to the page's sentence about it, while a sweep measures; then Stop."""
    page.goto(f"{url}/benchmark")
    page.locator(".st-key-bench_run button").click()
    quietly(page, FIRST_POINT, 120, every_ms=25)
    seconds = answer_time(page)
    wait_idle(page)  # the sentence's rerun moved the buttons: until it ends, the old Stop is on the page as well
    page.locator(".st-key-bench_stop button").first.click()
    quietly(page, f"() => document.querySelector('{DONE}') !== null", 60)
    return seconds


# ---- --demos: the demos keep their word ----

DEMOS = {presets.QUICK_DEMO.name: presets.QUICK_DEMO, **presets.PRESETS}
SLACK = 1.5  # a demo keeps its word when it ends within its announced seconds × this


def _spin(core: int, limit_s: float) -> None:
    """Keep one core busy for `limit_s` seconds at most (a neighbour: a browser, a video call)."""
    with contextlib.suppress(OSError, AttributeError):
        os.sched_setaffinity(0, {core})
    end = time.monotonic() + limit_s
    while time.monotonic() < end:
        pass


@contextlib.contextmanager
def spinning(limit_s: float) -> Iterator[None]:
    """A process spinning on the last core, started with multiprocessing, ending by itself after `limit_s` and killed
    when the block ends."""
    spinner = multiprocessing.get_context("spawn").Process(target=_spin, args=((os.cpu_count() or 1) - 1, limit_s),
                                                           daemon=True, name="attn_core-spinner")
    spinner.start()
    try:
        yield
    finally:
        spinner.kill()
        spinner.join(5)


def run_demo(preset: presets.Preset, budget_s: float | None) -> dict:
    """One demo through the dashboard's Job on the CPU with the budget `budget_s`: seconds taken, seconds to its
    first point, points kept hollow (KEPT_BUSY), samples retaken."""
    began = time.perf_counter()
    job = Job.measure(preset.name, preset.for_device("cpu"), keep=False, budget_s=budget_s)
    first = math.nan
    while not job.wait(0.05):
        if math.isnan(first) and job.measurements:
            first = time.perf_counter() - began
    taken = time.perf_counter() - began
    frame = job.frame()
    ok = frame[frame["status"] == "ok"]
    return {"taken": taken, "first": first if not math.isnan(first) else taken, "points": len(frame),
            "kept": int((ok["reason"] == KEPT_BUSY).sum()), "retaken": int(ok["retaken"].sum()),
            "error": job.error or ""}


def demos(names: list[str], spin_s: float, try_s: float | None) -> list[Figure]:
    """Each demo named (all when none is) with a process spinning on one core: announced against taken. A demo
    that announces nothing yet runs under the budget `try_s` (None: none), and what it took is the figure to
    announce."""
    chosen = {name: DEMOS[name] for name in (names or DEMOS)}
    found: list[Figure] = []
    print(f"load before: {' '.join(f'{x:.2f}' for x in os.getloadavg())} on {os.cpu_count()} cores; a process spins "
          "on one core throughout")
    with spinning(spin_s):
        for name, preset in chosen.items():
            r = run_demo(preset, preset.seconds or try_s)
            said = (f"{preset.seconds:5.0f} s" if preset.seconds else
                    f"none (tried {try_s:g} s)" if try_s else "none")
            kept = (preset.seconds is None or r["taken"] <= SLACK * preset.seconds) and not r["error"]
            print(f"  {name:<34} announced {said}  taken {r['taken']:6.1f} s  first point {r['first']:5.1f} s  "
                  f"{r['points']:>2} points, {r['kept']} kept hollow, {r['retaken']} samples retaken"
                  + (f"  ERROR {r['error']}" if r["error"] else "") + ("" if kept else "  (word not kept)"))
            target = None if preset.seconds is None else f"≤ {SLACK * preset.seconds:.0f}"
            found += [Figure(f"{name}: seconds taken", r["taken"], "s", target=target,
                             meets=None if target is None else kept),
                      Figure(f"{name}: seconds to the first point", r["first"], "s")]
    print(f"load after: {' '.join(f'{x:.2f}' for x in os.getloadavg())}")
    return found


def options(p: argparse.ArgumentParser) -> None:
    p.add_argument("--demos", nargs="*", default=None, metavar="NAME",
                   help="drive the quick demo and the presets (or those named) through the dashboard's job with one "
                        "core busy, instead of the browser comparisons")
    p.add_argument("--spin-s", type=float, default=900.0, help="the longest the spinning process runs (s)")
    p.add_argument("--try-s", type=float, default=None,
                   help="the budget of a demo that announces no seconds yet (default: none)")


def settle(args: argparse.Namespace) -> None:
    unknown = [name for name in args.demos or () if name not in DEMOS]
    if unknown:
        raise ValueError(f"no demo called {', '.join(map(repr, unknown))}; the demos are {', '.join(DEMOS)}")


BENCHMARK = Benchmark(
    "dashboard", "The dashboard's numbers against the command line's, in a real browser: agreement, repeatability, "
    "the default sweep's time, the first point after Run, a click during a sweep, a busy core; or (--demos) each "
    "demo's announced seconds against those it took with one core busy.", measure, options=options, settle=settle,
    setting=lambda args: f"the dashboard against the command line, {os.cpu_count()} CPUs; Chromium shows the page "
                         "throughout. Ratios are medians of the same point, max(a/b, b/a).",
    machine=Machine(threads=None, devices=("cpu",), rounds=None, clocks=("wall",)), doc=__doc__)


def main(argv: list[str] | None = None) -> int:
    return run(BENCHMARK, argv)


if __name__ == "__main__":
    raise SystemExit(main())
