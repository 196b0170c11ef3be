"""A Job: what the dashboard, the CLI and the tests run and watch, from asking to its last point. It measures one or
more sweeps one after another in the worker process (a background thread drives them, holding the machine's sweep
lock), or plays a saved run back point by point; on a Stage it first waits its turn. Everyone reads it the same way:
`poll()`, `progress`, `cancel()`, `done`, `error`, `frame()`, `result()`."""
from __future__ import annotations

import dataclasses
import os
import threading
import time
from dataclasses import dataclass
from typing import Any, Callable, Sequence

import numpy as np
import pandas as pd

from . import env
from .config import SweepConfig, plan
from .lock import LOCK_WAIT_S, SweepBusyError, SweepLockError, sweep_lock
from .measure import resolve_mechanisms
from .measurement import Measurement, theory_of, unmeasured
from .problem import Problem
from .results import SCHEMA_VERSION, Run, frame_from_rows
from .timing import MIN_SAMPLE_S, busy
from attn_core.engine.store import Store, StoreError
from .worker import WorkerError, get_worker, prestart

KEPT_BUSY = "kept: the machine was busy"  # the reason on a point kept disturbed (drawn hollow)

# A point normally ends by itself within about 2 × point_budget_s (a warm-up call and one sample past the budget);
# one still running at HARD_LIMIT_FACTOR × budget + HARD_LIMIT_GRACE_S is stopped by killing the worker.
HARD_LIMIT_FACTOR, HARD_LIMIT_GRACE_S = 3.0, 10.0


@dataclass(frozen=True)
class Progress:
    """Where a job is: points `done` of `total`, seconds left (None until a point has been timed), what runs now,
    the seconds since it started, whether other programs were taking the machine at the last point (`busy`), and
    whether it measures now (`measuring`: not queued, withdrawn, replayed or finished)."""

    done: int
    total: int
    eta_s: float | None
    current: str
    elapsed_s: float = 0.0
    busy: bool = False
    measuring: bool = False

    @property
    def eta_text(self) -> str:
        """The time left in words: 'about 12 s left', 'the machine is busy: about 40 s left', 'measuring the first
        point…' before any point gives a rate; '' when there is nothing to say."""
        if self.eta_s is None:
            return "measuring the first point…" if self.measuring and self.done == 0 else ""
        return f"{'the machine is busy: ' if self.busy else ''}about {self.eta_s:.0f} s left"


class Job:
    """One job. Build it with `Job.measure(name, sweeps)` (validated; started at once, or queued on `stage`) or
    `Job.replay(run)`. `poll()` returns the points that arrived since the previous poll (and moves a queue on);
    `cancel()` stops it within about a second keeping finished points (a queued job is withdrawn); `done` turns true
    at the end, and `error` holds a sentence when it could not run at all."""

    def __init__(self, name: str, sweeps: Sequence[SweepConfig] = (), *, extra_mechanisms: tuple[str, ...] = (),
                 lock_wait_s: float | None = None, replay: Run | None = None, points_per_s: float = 3.0,
                 clock: Callable[[], float] = time.monotonic, keep: bool = True, store_path: str | None = None,
                 resume: int | None = None, budget_s: float | None = None, workers: Callable[[], Any] = get_worker):
        self.name = name
        self.budget_s = budget_s  # a demo's wall-clock budget (the seconds it announces); None: no budget
        self._workers = workers  # where the measuring worker comes from (a test's fake)
        self.sweeps = tuple(s.replaced(device=env.resolve_device(s.problem.device)) for s in sweeps)
        self.extra_mechanisms = tuple(extra_mechanisms)
        self.registry = resolve_mechanisms(self.extra_mechanisms)
        self._plan = [(p, s.settings) for s in self.sweeps for p in plan(s)]  # every point, with its settings
        self.problems = [p for p, _ in self._plan]
        self.lock_wait_s = LOCK_WAIT_S if lock_wait_s is None else lock_wait_s
        self.error: str | None = None
        self.env: dict = {}
        self.stage = None  # the Stage it waits on, when queued (Stage.submit sets it)
        self.watchers: set[str] = set()  # sessions showing it (Stage)
        self.started = self.withdrawn = False
        self._points: list[Measurement] = []
        self._polled = 0
        self._guard = threading.Lock()
        self._cancel = threading.Event()
        self._finished = threading.Event()
        self._current = "starting"
        self._speeds: dict[tuple, float] = {}  # series → GFLOP/s (executed FLOPs) at its last point, quiet machine
        self._overhead, self._timed = 0.0, 0  # seconds a point costs beyond its calls (inputs, waits): mean
        self._retaken, self._repeats = 0, 0  # samples taken again for contention, and samples kept, in all
        self._slowdown, self._busy = 1.0, False  # the last point's: time × this under its foreign load; busy
        self._clock = clock
        self._began: float | None = None
        self._ended: float | None = None
        self._threads = float("nan")
        self._replay = replay
        self.points_per_s = points_per_s
        # The run store (attn_core.engine.store): each point measured is committed as it arrives, into a new run or into
        # run `resume`; store_error says why the store could not keep them (the sweep goes on regardless).
        self.keep, self.store_path, self.run_id = keep and replay is None, store_path, resume
        self.store_error: str | None = None
        self._store: Store | None = None
        self._resumed = resume is not None
        self._unsaved: list[dict] = []
        if replay is not None:
            self._source = [Measurement.from_row(r) for r in replay.frame.to_dict("records")]

    # -- building --
    @classmethod
    def measure(cls, name: str, sweeps: Sequence[SweepConfig], *, stage=None, watcher: str = "",
                extra_mechanisms: tuple[str, ...] = (), lock_wait_s: float | None = None, keep: bool = True,
                store_path: str | None = None, resume: int | None = None, budget_s: float | None = None,
                workers: Callable[[], Any] = get_worker) -> "Job":
        """Validate the sweeps (ValueError listing their problems, each a sentence) and start measuring them one
        after another, or queue them on `stage` (for `watcher`, a session) to start when the machine is free. If
        another sweep holds the machine's lock, the job waits up to `lock_wait_s` (default LOCK_WAIT_S) showing
        'waiting for another sweep…', then ends with `error` saying that one is running. Its points go to the run
        store as they arrive (`keep`; at `store_path`, else store.default_path()), into run `resume` if given.
        `budget_s`: a demo's wall-clock budget; each point gets a share of what is left of it, weighed by its
        forecast, and past its share is kept as it is (no retakes, drawn hollow and labelled KEPT_BUSY)."""
        registry = resolve_mechanisms(tuple(extra_mechanisms))
        found = [p for s in sweeps for p in s.problems(registry)] if sweeps else ["no sweep is given"]
        if found:
            found = list(dict.fromkeys(found))
            raise ValueError(" ".join(p[0].upper() + p[1:] + ("" if p.endswith(".") else ".") for p in found))
        job = cls(name, sweeps, extra_mechanisms=extra_mechanisms, lock_wait_s=lock_wait_s, keep=keep,
                  store_path=store_path, resume=resume, budget_s=budget_s, workers=workers)
        if stage is None:
            job.start()
        else:
            stage.submit(job, watcher)
        return job

    @classmethod
    def refused(cls, name: str, why: str) -> "Job":
        """A job that could not run: done at once, `why` its error."""
        job = cls(name)
        job.error, job.withdrawn = why, True
        return job

    @classmethod
    def replay(cls, run: Run, points_per_s: float = 3.0, *, shown: bool = False,
               clock: Callable[[], float] = time.monotonic) -> "Job":
        """A saved run played back at `points_per_s` as if it were measured now (`shown`: all of it at once)."""
        job = cls("replay", replay=run, points_per_s=points_per_s, clock=clock)
        job.start()
        if shown:
            job._take(len(job._source))
        return job

    def start(self) -> None:
        """Begin now (a Stage calls it when the job's turn comes)."""
        if self.started:
            return
        self.started, self._began = True, self._clock()
        if self._replay is None:
            threading.Thread(target=self._drive, name="attn_core-sweep", daemon=True).start()

    # -- what a caller reads --
    @property
    def replaying(self) -> bool:
        return self._replay is not None

    @property
    def queued(self) -> bool:
        return not self.started and not self.withdrawn

    @property
    def total(self) -> int:
        return len(self._source) if self.replaying else len(self.problems)

    @property
    def done(self) -> bool:
        if self.withdrawn:
            return True
        if self.replaying:
            return self._cancel.is_set() or len(self._points) >= self.total
        return self._finished.is_set()

    @property
    def due(self) -> int:
        """A replay: how many points its pace has reached by now (taken by the next poll)."""
        if not self.replaying or self._cancel.is_set() or self._began is None:
            return len(self._points)
        return min(self.total, 1 + int((self._clock() - self._began) * self.points_per_s))

    @property
    def measurements(self) -> list[Measurement]:
        with self._guard:
            return list(self._points)

    def poll(self) -> list[Measurement]:
        """The points that arrived since the previous poll (non-blocking); a replay takes the points now due, and a
        queued job moves its stage on."""
        if self.stage is not None:
            self.stage.check()
        if self.replaying:
            self._take(self.due)
        with self._guard:
            new, self._polled = self._points[self._polled:], len(self._points)
            return new

    def frame(self) -> pd.DataFrame:
        return frame_from_rows([m.to_row() for m in self.measurements])

    def result(self) -> Run:
        """The points so far as a Run: the environment stamp of its measuring (with the SDPA backends used) and its
        config (a list of them for several sweeps); a replay keeps its file's."""
        frame = self.frame()
        if self.replaying:
            return Run(frame, self._replay.env, self._replay.config, SCHEMA_VERSION)
        return Run(frame, self._stamp(frame), self._config(), SCHEMA_VERSION)

    def _stamp(self, frame: pd.DataFrame) -> dict:
        backends = sorted({b for b in frame["sdpa_backend"] if b})
        return {**self.env, "sdpa_backend": ", ".join(backends)} if self.env else {}

    def _config(self) -> dict:
        return self.sweeps[0].to_dict() if len(self.sweeps) == 1 else {"sweeps": [s.to_dict() for s in self.sweeps]}

    @property
    def progress(self) -> Progress:
        with self._guard:
            done = len(self._points)
            current = self._current
        elapsed = ((self._ended or self._clock()) - self._began) if self._began is not None else 0.0
        if self.queued or self.withdrawn:
            return Progress(0, self.total, None, self._queue_line(), 0.0)
        if self.replaying:
            last = self._points[-1].problem if done else None
            now = (f"replaying {self._points[-1].theory.label} at n = {last.n:,}" if last is not None else
                   "nothing to replay" if not self.total else "replaying")
            return Progress(done, self.total, (self.total - done) / self.points_per_s, now, elapsed)
        if self.done:
            return Progress(done, self.total, 0.0, "finished", elapsed)
        return Progress(done, self.total, self._eta(done, elapsed), current, elapsed, self._busy, True)

    def cancel(self) -> None:
        """Stop soon (within about a second; a kernel that does not return by then is stopped by killing the
        worker); a queued job is withdrawn. Finished points are kept; the rest are marked 'cancelled'."""
        if self.stage is not None and self.queued:
            self.stage.withdraw(self)
            return
        self._cancel.set()
        if not self.done:
            self._set_current("cancelling")

    def wait(self, timeout: float | None = None) -> bool:
        """Block until the job has finished (True) or the timeout passed (False)."""
        if self.replaying:
            deadline = None if timeout is None else time.monotonic() + timeout
            while not self.done and (deadline is None or time.monotonic() < deadline):
                self.poll()
                time.sleep(0.01)
            return self.done
        return self._finished.wait(timeout)

    def _queue_line(self) -> str:
        if self.withdrawn:
            return "withdrawn"
        place = self.stage.place(self) if self.stage is not None else 0
        running = self.stage.running() if self.stage is not None else None
        after = f" after “{running.name}”" if running is not None else ""
        return f"queued, next{after}" if place == 1 else f"queued, {ordinal(place)} in line{after}"

    # -- the driver --
    def _take(self, upto: int) -> None:
        with self._guard:
            self._points.extend(self._source[len(self._points):upto])

    def _forecast(self, done: int, retakes: bool = True) -> list[float] | None:
        """Each remaining point's expected seconds: its calls at executed FLOPs ÷ its series' speed (GFLOP/s on a
        quiet machine, the last measured one's: else the median of all; before any, a quarter of the device's matmul
        figure), slowed by the foreign load measured at the last point, its samples taken 1 + (retakes per kept
        sample so far) times (`retakes`), capped at the point budget, plus the per-point overhead seen so far
        (inputs, waits for quiet). None when nothing gives a speed yet."""
        with self._guard:
            measured, overhead, slowdown = dict(self._speeds), self._overhead, self._slowdown
            rate = self._retaken / self._repeats if retakes and self._repeats else 0.0
        device = self.env.get("device_gflops")
        if not measured and not device:
            return None
        typical = float(np.median(list(measured.values()))) if measured else 0.25 * device
        out = []
        for problem, settings in self._plan[done:]:
            executed = theory_of(self.registry[problem.mechanism], problem).executed_flops
            call_s = (0.0 if np.isnan(executed) else executed) / 1e9 / measured.get(_series(problem), typical)
            out.append(_point_seconds(settings, call_s * slowdown, rate) + overhead)
        return out

    def _eta(self, done: int, elapsed: float = 0.0) -> float | None:
        """Seconds left: the forecast's sum (None until a point has been timed: a first line never promises what
        nothing measured). Under a budget, at most what is left of it, but never below the remaining points taken
        once each without retakes."""
        if not self._timed:
            return None
        left = sum(self._forecast(done) or [])
        if self.budget_s is not None:
            left = min(left, max(self.budget_s - elapsed, sum(self._forecast(done, retakes=False) or [])))
        return left

    def _share(self, index: int) -> float:
        """The wall-clock seconds point `index` may take: what is left of the budget, in proportion to its forecast
        among the remaining points' (equal shares before any forecast); inf without a budget."""
        if self.budget_s is None:
            return float("inf")
        left = max(self.budget_s - (self._clock() - self._began), 0.0)
        weights = self._forecast(index) or [1.0] * (len(self._plan) - index)
        return left * weights[0] / sum(weights) if sum(weights) > 0 else left / len(weights)

    def _add(self, point: Measurement, elapsed_s: float = 0.0) -> None:
        """Points arrive in the plan's order, so the next one's settings are the plan's. `elapsed_s`: the point's
        wall-clock seconds, waits included."""
        with self._guard:
            settings = self._plan[len(self._points)][1] if not self.replaying else None
            self._points.append(point)
            if settings is not None and point.ok and point.summary.gflops > 0:
                c = point.conditions
                foreign = 0.0 if np.isnan(c.foreign_cpu) else c.foreign_cpu
                threads = 1.0 if np.isnan(c.threads) else c.threads
                self._slowdown = max(1.0, (threads + foreign) / (os.cpu_count() or 1))
                self._speeds[_series(point.problem)] = point.summary.gflops * self._slowdown  # on a quiet machine
                self._busy = c.disturbed or c.retaken > 0 or busy(foreign, int(threads))
                retakes = c.retaken / max(point.summary.repeats, 1)
                self._retaken, self._repeats = self._retaken + c.retaken, self._repeats + point.summary.repeats
                left = max(elapsed_s - _point_seconds(settings, point.summary.median_s, retakes), 0.0)
                self._timed += 1
                self._overhead += (left - self._overhead) / self._timed  # running mean over the timed points

    def _set_current(self, text: str) -> None:
        with self._guard:
            self._current = text

    def _unmeasured(self, problem: Problem, status: str, reason: str) -> Measurement:
        return unmeasured(self.registry[problem.mechanism], problem, status, reason, threads=self._threads)

    def _drive(self) -> None:
        status = "cancelled"  # of the points never measured; 'failed' when the worker or the engine broke
        try:
            with sweep_lock(self.lock_wait_s, self._cancel.is_set,
                            lambda holder: self._set_current(f"waiting for another sweep to finish ({holder})")):
                for sweep in self.sweeps:
                    if self._cancel.is_set():
                        break
                    self._measure_sweep(sweep)
        except (SweepBusyError, SweepLockError) as e:
            self.error = None if self._cancel.is_set() else str(e)
        except WorkerError as e:
            self.error = None if self._cancel.is_set() else str(e)
            status = "failed"
        except Exception as e:  # the job must end with a reason, never hang a page
            self.error, status = f"the sweep stopped: {type(e).__name__}: {e}", "failed"
        finally:
            why = "not measured: " + self.error if self.error else "cancelled before it was measured"
            for problem in self.problems[len(self.measurements):]:
                self._add(self._unmeasured(problem, status if self.error else "cancelled", why))
            self._close_record("failed" if status == "failed" else "interrupted" if self._cancel.is_set() else
                               "complete")
            self._ended = self._clock()
            self._finished.set()

    def _ready_worker(self, threads: int | None):
        self._set_current("starting the measurement worker")
        worker = self._workers()
        info = worker.wait_ready(cancelled=self._cancel.is_set)
        self._threads = float(threads or info["threads"])
        return worker

    def _measure_sweep(self, sweep: SweepConfig) -> None:
        settings = sweep.settings
        worker = self._ready_worker(settings.threads)
        stamp = worker.environment(sweep.problem.device, sweep.problem.dtype, settings.threads)
        self.env = self.env or stamp  # the first sweep's stamp stands for the job
        self._open_record()
        budget = settings.point_budget_s
        limit = HARD_LIMIT_FACTOR * budget + HARD_LIMIT_GRACE_S
        over_budget: dict[tuple, str] = {}
        for problem in plan(sweep):
            if self._cancel.is_set():
                return
            series = _series(problem)
            if series in over_budget:
                self._add(self._kept(self._unmeasured(problem, "skipped", over_budget[series])))
                continue
            self._set_current(problem.describe())
            began = self._clock()
            outcome = worker.measure(problem, settings, self.extra_mechanisms, limit_s=limit,
                                     cancelled=self._cancel.is_set, wall_s=self._share(len(self.measurements)))
            point = outcome.point or self._unmeasured(
                problem, "cancelled" if outcome.failure == "cancelled" else "failed", outcome.detail)
            if outcome.elapsed_s > budget:
                over_budget[series] = (f"at n = {problem.n} this mechanism took {outcome.elapsed_s:.1f} s, "
                                       f"over the per-point budget of {budget:g} s; raise the budget to measure "
                                       "larger n")
            if point.ok and point.conditions.disturbed and not point.reason:
                point = dataclasses.replace(point, reason=KEPT_BUSY)
            self._add(self._kept(point), self._clock() - began)
            if outcome.failure in ("died", "timeout", "cancelled"):
                if self._cancel.is_set():
                    prestart()  # a fresh worker for the next sweep, warming up in the background
                    return
                worker = self._ready_worker(settings.threads)
                # the new process's matmul figure, measured now: its next point must not pay it (seconds on a busy
                # machine) inside its budget and hard limit
                worker.environment(sweep.problem.device, sweep.problem.dtype, settings.threads)

    # -- the run store --
    def _open_record(self) -> None:
        """Open the store and begin the run (or take up run `resume`) once the first stamp is known."""
        if not self.keep or self._store is not None or self.store_error:
            return
        try:
            self._store = Store(self.store_path)
            if self.run_id is None:
                self.run_id = self._store.begin(self._stamp(self.frame()), self._config(), name=self.name)
            else:
                self._store.resume(self.run_id)
        except (StoreError, OSError) as e:
            self.store_error = f"the run store cannot keep this sweep: {e}"
            if self._store is not None:
                self._store.close()
                self._store = None

    def _kept(self, point: Measurement) -> Measurement:
        """Commit `point` to the store (with any a busy store made wait) before it is shown: a point shown is kept."""
        if self._store is not None:
            self._unsaved.append(point.to_row())
            self._flush()
        return point

    def _flush(self) -> None:
        try:
            self._store.add_points(self.run_id, self._unsaved)
            self._unsaved, self.store_error = [], None
        except StoreError as e:  # busy past its wait: kept in memory, tried again with the next point
            self.store_error = f"the run store did not take {len(self._unsaved)} point(s) yet: {e}"

    def _close_record(self, status: str) -> None:
        if self._store is None:
            return
        try:
            if self._unsaved:
                self._flush()
            self._store.finish(self.run_id, status, None if self._resumed else self._stamp(self.frame()))
        except StoreError as e:
            self.store_error = str(e)
        finally:
            self._store.close()
            self._store = None


# Before a sweep: each point's calls at its spec's executed FLOPs at the device's matmul rate (no attention kernel
# beats a dense matmul) and at a tenth of it (small or irregular work reaches a fraction), capped at the point budget.
ESTIMATE_SHARES = (1.0, 0.1)


def estimate_s(config: SweepConfig, gflops: float, registry, shares: tuple[float, ...] = ESTIMATE_SHARES) -> tuple:
    """Seconds a sweep's points will take, one figure for each share of the matmul rate `gflops` (GFLOP/s), from
    the specs alone: a point is its warm-up and memory calls and its samples (`_point_seconds`); a point the spec
    cannot price (NaN) counts its fixed minimum time."""
    flops = [theory_of(registry[p.mechanism], p).executed_flops for p in plan(config)]
    return tuple(sum(_point_seconds(config.settings, (0.0 if np.isnan(f) else f) / 1e9 / (share * gflops))
                     for f in flops) for share in shares)


def _point_seconds(c, call_s: float, retakes: float = 0.0) -> float:
    """A point's expected seconds under settings `c` at `call_s` a call: warm-up and memory calls, then the samples,
    each taken 1 + `retakes` times on average, capped at the point budget."""
    timed = max(c.min_repeats * max(call_s, MIN_SAMPLE_S), c.min_time_s) * (1.0 + retakes)
    return min((c.warmup + c.measure_memory) * call_s + timed, c.point_budget_s)


def _series(problem: Problem) -> tuple:
    return problem.mechanism, problem.params


def ordinal(k: int) -> str:
    return f"{k}{'th' if 10 <= k % 100 <= 20 else {1: 'st', 2: 'nd', 3: 'rd'}.get(k % 10, 'th')}"


def run_sweep(config: SweepConfig, on_point: Callable[[Measurement], None] | None = None,
              cancel: Callable[[], bool] | threading.Event | None = None, *,
              extra_mechanisms: tuple[str, ...] = (), lock_wait_s: float | None = None, keep: bool = True,
              store_path: str | None = None) -> pd.DataFrame:
    """Run a sweep to the end in the worker and return its tidy frame; `on_point(measurement)` is called in this
    thread as each point arrives; `cancel()` (or a set Event) stops it. Raises ValueError for an invalid config and
    RuntimeError with the reason when the sweep could not run (e.g. another sweep holds the machine). Its points go to
    the run store as they arrive (`keep`, `store_path`: see Job.measure)."""
    is_cancelled = cancel.is_set if isinstance(cancel, threading.Event) else cancel or (lambda: False)
    job = Job.measure(", ".join(key for key, _ in config.mechanisms), (config,), extra_mechanisms=extra_mechanisms,
                      lock_wait_s=lock_wait_s, keep=keep, store_path=store_path)
    while True:
        finished = job.wait(0.05)
        for point in job.poll():
            if on_point:
                on_point(point)
        if finished:
            break
        if is_cancelled():
            job.cancel()
    if job.error:
        raise RuntimeError(job.error)
    return job.frame()
