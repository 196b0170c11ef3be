"""A sweep run point by point in the worker process, streaming rows with progress (the config: config.py; one sweep
at a time per user: lock.py)."""
from __future__ import annotations

import threading
import time
from typing import Callable

import numpy as np
import pandas as pd

from . import env
from .config import SweepConfig, plan
from .lock import LOCK_WAIT_S, SweepBusyError, SweepLockError, sweep_lock
from .measure import MIN_SAMPLE_S, Case, make_row, resolve_mechanisms, theory
from .results import SCHEMA_VERSION, Run, frame_from_rows
from .worker import Worker, WorkerError, get_worker, prestart

# A point normally ends by itself within about 2 × point_budget_s (a warm-up call and one sample past the budget);
# one still running at HARD_LIMIT_FACTOR × budget + HARD_LIMIT_GRACE_S is stopped by killing the worker.
HARD_LIMIT_FACTOR, HARD_LIMIT_GRACE_S = 3.0, 10.0


class SweepRun:
    """Handle on a sweep executing in the worker process; a background thread drives it point by point.

    Poll it from anywhere (a Streamlit fragment, a CLI loop): `poll()` returns the rows that arrived since the last
    poll, `progress()` says where it is, `cancel()` stops it within about a second keeping finished rows, `done`
    turns true at the end, and `error` holds a sentence when the sweep could not run at all.
    """

    def __init__(self, config: SweepConfig, extra_mechanisms: tuple[str, ...] = (),
                 lock_wait_s: float | None = None):
        self.config = config.replaced(device=env.resolve_device(config.problem.device))
        self.extra_mechanisms = tuple(extra_mechanisms)
        self.registry = resolve_mechanisms(self.extra_mechanisms)
        self.cases = plan(self.config)
        self.env: dict = {}
        self.error: str | None = None
        self.lock_wait_s = LOCK_WAIT_S if lock_wait_s is None else lock_wait_s
        self._rows: list[dict] = []
        self._polled = 0
        self._guard = threading.Lock()
        self._cancel = threading.Event()
        self._finished = threading.Event()
        self._current = "starting"
        self._speeds: dict[tuple, float] = {}  # series → achieved GFLOP/s (executed FLOPs) at its last point
        self._overhead, self._timed = 0.0, 0  # seconds a point costs beyond its calls (inputs, transfers): mean
        self._started = time.monotonic()
        self._ended: float | None = None
        self._threads: float = float(self.config.settings.threads) if self.config.settings.threads else float("nan")
        self._thread = threading.Thread(target=self._drive, name="attn_core-sweep", daemon=True)

    @classmethod
    def start(cls, config: SweepConfig, *, extra_mechanisms: tuple[str, ...] = (),
              lock_wait_s: float | None = None) -> "SweepRun":
        """Validate the config (ValueError listing its problems) and start the sweep; returns at once. If another
        sweep holds the machine, this one waits up to `lock_wait_s` (default LOCK_WAIT_S) showing 'waiting for
        another sweep…' as its current point, then ends with `error` saying that one is running."""
        registry = resolve_mechanisms(tuple(extra_mechanisms))
        problems = config.problems(registry)
        if problems:
            raise ValueError(" ".join(p[0].upper() + p[1:] + ("" if p.endswith(".") else ".") for p in problems))
        run = cls(config, tuple(extra_mechanisms), lock_wait_s)
        run._thread.start()
        return run

    # -- what a caller reads --
    @property
    def done(self) -> bool:
        return self._finished.is_set()

    @property
    def rows(self) -> list[dict]:
        with self._guard:
            return list(self._rows)

    def poll(self) -> list[dict]:
        """The rows that arrived since the previous poll (non-blocking)."""
        with self._guard:
            new, self._polled = self._rows[self._polled:], len(self._rows)
            return new

    def frame(self) -> pd.DataFrame:
        return frame_from_rows(self.rows)

    def result(self) -> Run:
        """The run so far as a Run (frame, environment stamp with the SDPA backends used, config)."""
        frame = self.frame()
        backends = sorted({b for b in frame["sdpa_backend"] if b})
        stamp = {**self.env, "sdpa_backend": ", ".join(backends)} if self.env else {}
        return Run(frame, stamp, self.config.to_dict(), SCHEMA_VERSION)

    def progress(self) -> dict:
        """{done, total, eta_s (None until a point has been timed), current (what runs now), elapsed_s}."""
        with self._guard:
            done = len(self._rows)
            current = "finished" if self.done else self._current
        return {"done": done, "total": len(self.cases), "eta_s": 0.0 if self.done else self._eta(done),
                "current": current, "elapsed_s": (self._ended or time.monotonic()) - self._started}

    def cancel(self) -> None:
        """Stop soon (within about a second; a kernel that does not return by then is stopped by killing the
        worker). Finished rows are kept; the rest are marked 'cancelled'. Returns at once."""
        self._cancel.set()
        if not self.done:
            self._set_current("cancelling")

    def wait(self, timeout: float | None = None) -> bool:
        """Block until the sweep has finished (True) or the timeout passed (False)."""
        return self._finished.wait(timeout)

    # -- the driver --
    def _eta(self, done: int) -> float | None:
        """Seconds left, from the specs' executed FLOPs and this device's speed: each remaining point is its
        calls (warm-up, the memory run, the samples) at executed FLOPs ÷ its series' achieved GFLOP/s at its last
        point (a series not measured yet: the median of all measured points, or a quarter of the device's matmul
        figure before any), capped at the point budget, plus the per-point overhead seen so far."""
        with self._guard:
            measured, overhead = dict(self._speeds), self._overhead
        device = self.env.get("device_gflops")
        if not measured and not device:
            return None
        typical = float(np.median(list(measured.values()))) if measured else 0.25 * device
        remaining = 0.0
        for case in self.cases[done:]:
            executed = theory(self.registry[case.mechanism], case)[1]
            call_s = executed / 1e9 / measured.get((case.mechanism, case.params), typical)
            remaining += self._point_seconds(call_s) + overhead
        return remaining

    def _point_seconds(self, call_s: float) -> float:
        c = self.config.settings
        timed = max(c.min_repeats * max(call_s, MIN_SAMPLE_S), c.min_time_s)
        return min((c.warmup + c.measure_memory) * call_s + timed, c.point_budget_s)

    def _add(self, row: dict, series: tuple | None = None, elapsed_s: float = 0.0) -> None:
        with self._guard:
            self._rows.append(row)
            if series is not None and row["status"] == "ok" and row["gflops"] > 0:
                self._speeds[series] = row["gflops"]
                left = max(elapsed_s - self._point_seconds(row["time_median_s"]), 0.0)
                self._timed += 1
                self._overhead += (left - self._overhead) / self._timed  # running mean over the timed points

    def _set_current(self, text: str) -> None:
        with self._guard:
            self._current = text

    def _drive(self) -> None:
        status = "cancelled"  # of the points never measured; 'failed' when the worker or the engine broke
        try:
            with sweep_lock(self.lock_wait_s, self._cancel.is_set,
                            lambda holder: self._set_current(f"waiting for another sweep to finish ({holder})")):
                self._measure_all()
        except (SweepBusyError, SweepLockError) as e:
            self.error = None if self._cancel.is_set() else str(e)
        except WorkerError as e:
            self.error = None if self._cancel.is_set() else str(e)
            status = "failed"
        except Exception as e:  # the sweep must end with a reason, never hang a page
            self.error, status = f"the sweep stopped: {type(e).__name__}: {e}", "failed"
        finally:
            why = "not measured: " + self.error if self.error else "cancelled before it was measured"
            for case in self.cases[len(self.rows):]:
                self._add(self._row(case, status if self.error else "cancelled", why))
            self._ended = time.monotonic()
            self._finished.set()

    def _row(self, case: Case, status: str, reason: str) -> dict:
        return make_row(self.registry[case.mechanism], case, status, reason, threads=self._threads)

    def _ready_worker(self) -> Worker:
        self._set_current("starting the measurement worker")
        worker = get_worker()
        info = worker.wait_ready(cancelled=self._cancel.is_set)
        if not self.config.settings.threads:
            self._threads = float(info["threads"])
        return worker

    def _measure_all(self) -> None:
        worker = self._ready_worker()
        p = self.config.problem
        self.env = worker.environment(p.device, p.dtype, self.config.settings.threads)
        settings = self.config.settings
        budget = settings.point_budget_s
        limit = HARD_LIMIT_FACTOR * budget + HARD_LIMIT_GRACE_S
        over_budget: dict[tuple, str] = {}
        for case in self.cases:
            if self._cancel.is_set():
                return
            series = (case.mechanism, case.params)
            if series in over_budget:
                self._add(self._row(case, "skipped", over_budget[series]))
                continue
            self._set_current(case.describe())
            outcome = worker.measure(case, settings, self.extra_mechanisms, limit_s=limit,
                                     cancelled=self._cancel.is_set)
            row = outcome.row or self._row(case, "cancelled" if outcome.failure == "cancelled" else "failed",
                                           outcome.detail)
            if outcome.elapsed_s > budget:
                over_budget[series] = (f"at n = {case.n} this mechanism took {outcome.elapsed_s:.1f} s, "
                                       f"over the per-point budget of {budget:g} s; raise the budget to measure "
                                       "larger n")
            self._add(row, series, outcome.elapsed_s)
            if outcome.failure in ("died", "timeout", "cancelled"):
                if self._cancel.is_set():
                    prestart()  # a fresh worker for the next sweep, warming up in the background
                    return
                worker = self._ready_worker()


def run_sweep(config: SweepConfig, on_row: Callable[[dict], None] | None = None,
              cancel: Callable[[], bool] | threading.Event | None = None, *,
              extra_mechanisms: tuple[str, ...] = (), lock_wait_s: float | None = None) -> pd.DataFrame:
    """Run a sweep to the end in the worker and return its tidy frame; `on_row(row)` is called in this thread as
    each row arrives; `cancel()` (or a set Event) stops it. Raises ValueError for an invalid config and
    RuntimeError with the reason when the sweep could not run (e.g. another sweep holds the machine)."""
    is_cancelled = cancel.is_set if isinstance(cancel, threading.Event) else cancel or (lambda: False)
    run = SweepRun.start(config, extra_mechanisms=extra_mechanisms, lock_wait_s=lock_wait_s)
    while True:
        finished = run.wait(0.05)
        for row in run.poll():
            if on_row:
                on_row(row)
        if finished:
            break
        if is_cancelled():
            run.cancel()
    if run.error:
        raise RuntimeError(run.error)
    return run.frame()

