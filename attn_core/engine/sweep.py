"""Sweeps declared as data and run point by point in the worker process, streaming rows with progress; one sweep at
a time per user of a machine."""
from __future__ import annotations

import contextlib
import dataclasses
import math
import os
import stat
import tempfile
import threading
import time
from dataclasses import dataclass
from typing import Any, Callable, Iterator, Mapping

import numpy as np
import pandas as pd

from . import env
from ..mechanisms import MECHANISMS
from .measure import MIN_SAMPLE_S, MODES, Case, Settings, make_row, resolve_mechanisms, theory
from .results import MAX_COUNT, SCHEMA_VERSION, Run, frame_from_rows
from ..spec import DTYPE_BYTES, MechanismSpec, Shape
from .worker import Worker, WorkerError, get_worker, prestart

try:
    import fcntl
except ImportError:  # Windows: sweeps are serialised within one process only
    fcntl = None

LOCK_NAME = "sweep.lock"  # inside the user's own folder of the temp folder, see user_folder()
LOCK_WAIT_S = 10.0  # how long a second sweep waits for the first before it is told that one is running
# A point normally ends by itself within about 2 × point_budget_s (a warm-up call and one sample past the budget);
# one still running at HARD_LIMIT_FACTOR × budget + HARD_LIMIT_GRACE_S is stopped by killing the worker.
HARD_LIMIT_FACTOR, HARD_LIMIT_GRACE_S = 3.0, 10.0
MAX_THREADS = 4 * (os.cpu_count() or 1)  # far more torch threads than cores only thrash; 10,000 crash the worker
MAX_SEED = 2**63 - 1  # torch's generator takes a 64-bit seed


@dataclass(frozen=True)
class SweepConfig:
    """A sweep as data: each (mechanism key, its parameters) measured at each n, everything else fixed.

    Timing: `warmup` untimed calls, then samples until `min_repeats` and `min_time_s` are both reached; a point
    that takes longer than `point_budget_s` ends its mechanism's sweep (larger n are skipped). Memory: a separate
    profiled call (`measure_memory`); a point whose predicted need × (1 + `memory_margin`) exceeds the free memory
    (capped at `memory_limit_bytes` when set) is skipped. `threads`: torch CPU threads (None: torch's default).
    """

    mechanisms: tuple[tuple[str, dict], ...]
    ns: tuple[int, ...]
    batch: int = 1
    heads: int = 8
    d_model: int = 512
    dtype: str = "float32"
    device: str = "cpu"
    mode: str = "forward"
    causal: bool = False
    threads: int | None = None
    warmup: int = 1
    min_repeats: int = 5
    min_time_s: float = 0.2
    point_budget_s: float = 30.0
    measure_memory: bool = True
    memory_margin: float = 0.2
    seed: int = 0
    memory_limit_bytes: int | None = None

    def problems(self, registry: Mapping[str, MechanismSpec] | None = None) -> list[str]:
        """Every reason this sweep cannot run, each a sentence saying what to change; [] when it can."""
        registry = MECHANISMS if registry is None else registry
        found = _shape_problems(self) + _setting_problems(self)
        if not self.mechanisms:
            found.append("no mechanism is selected; choose at least one")
        if found or not self.ns:
            return found
        shape = Shape(self.batch, self.heads, min(self.ns), min(self.ns), self.d_model // self.heads,
                      self.dtype, self.causal)
        for key, params in self.mechanisms:
            if key not in registry:
                found.append(f"mechanism {key!r} is unknown; choose one of {', '.join(registry)}")
                continue
            spec = registry[key]
            try:
                spec.check(shape, params)
            except ValueError as e:
                text = str(e).replace("the sequence length", "the shortest sequence length")
                found.append(text if text.startswith(spec.label) else f"{spec.label}: {text}")
        return list(dict.fromkeys(found))

    def settings(self) -> Settings:
        return Settings(warmup=self.warmup, min_repeats=self.min_repeats, min_time_s=self.min_time_s,
                        budget_s=self.point_budget_s, measure_memory=self.measure_memory,
                        memory_margin=self.memory_margin, memory_limit_bytes=self.memory_limit_bytes,
                        threads=self.threads)

    def to_dict(self) -> dict:
        """Plain JSON-ready data: mechanisms as [[key, params], ...], ns as a list."""
        d = dataclasses.asdict(self)
        d["mechanisms"] = [[key, dict(params)] for key, params in self.mechanisms]
        d["ns"] = list(self.ns)
        return d

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> "SweepConfig":
        """Inverse of to_dict; ValueError naming any unknown or malformed setting."""
        names = {f.name for f in dataclasses.fields(cls)}
        unknown = set(d) - names
        if unknown:
            raise ValueError(f"unknown sweep settings {', '.join(sorted(unknown))}; known: {', '.join(sorted(names))}")
        try:
            mechanisms = tuple((str(key), dict(params)) for key, params in d["mechanisms"])
            ns = tuple(int(n) for n in d["ns"])
        except (KeyError, TypeError, ValueError) as e:
            raise ValueError(f"a sweep needs 'mechanisms' as [[key, params], ...] and 'ns' as numbers ({e})") from None
        return cls(**{**d, "mechanisms": mechanisms, "ns": ns})


def _is_int(x: Any) -> bool:
    return isinstance(x, int) and not isinstance(x, bool)


def _shape_problems(c: SweepConfig) -> list[str]:
    found = []
    if not c.ns:
        found.append("no sequence length is given; give at least one n")
    elif not all(_is_int(n) and 1 <= n < MAX_COUNT for n in c.ns):
        found.append(f"sequence lengths must be positive integers below 2**40, got {', '.join(map(str, c.ns))}")
    for name in ("batch", "heads", "d_model"):
        value = getattr(c, name)
        if not _is_int(value) or not 1 <= value < MAX_COUNT:
            found.append(f"{name} must be a positive integer below 2**40, got {value!r}")
    if not found and c.d_model % c.heads:
        found.append(f"d_model {c.d_model} is not divisible by {c.heads} heads; choose a multiple of {c.heads}")
    if c.mode not in MODES:
        found.append(f"mode {c.mode!r} is unknown; choose {' or '.join(MODES)}")
    try:
        device = env.resolve_device(c.device)
    except ValueError as e:
        return found + [str(e)]
    if c.dtype not in DTYPE_BYTES or c.dtype not in env.supported_dtypes(device):
        choices = ", ".join(env.supported_dtypes(device))
        found.append(f"dtype {c.dtype!r} is not supported on {device}; choose {choices}")
    return found


def _setting_problems(c: SweepConfig) -> list[str]:
    rules = (
        (_is_int(c.warmup) and c.warmup >= 1, f"warmup must be at least 1 (the first call is cold), got {c.warmup!r}"),
        (_is_int(c.min_repeats) and c.min_repeats >= 1, f"min_repeats must be at least 1, got {c.min_repeats!r}"),
        (_is_number(c.min_time_s) and c.min_time_s >= 0,
         f"min_time_s must be 0 or more seconds, got {c.min_time_s!r}"),
        (_is_number(c.point_budget_s) and c.point_budget_s > 0,
         f"point_budget_s must be a positive number of seconds, got {c.point_budget_s!r}"),
        (_is_number(c.memory_margin) and 0 <= c.memory_margin <= 10,
         f"memory_margin must be between 0 and 10 (a fraction: 0.2 = 20%), got {c.memory_margin!r}"),
        (c.threads is None or (_is_int(c.threads) and 1 <= c.threads <= MAX_THREADS),
         f"threads must be from 1 to {MAX_THREADS} (4 × this machine's {os.cpu_count() or 1} cores) or empty for "
         f"torch's default, got {c.threads!r}"),
        (c.memory_limit_bytes is None or (_is_int(c.memory_limit_bytes) and 0 < c.memory_limit_bytes < 2**63),
         f"memory_limit_bytes must be a positive integer below 2**63 or empty, got {c.memory_limit_bytes!r}"),
        (_is_int(c.seed) and 0 <= c.seed <= MAX_SEED, f"seed must be an integer from 0 to 2**63 - 1, got {c.seed!r}"),
    )
    return [message for ok, message in rules if not ok]


def _is_number(x: Any) -> bool:
    """A finite int or float (not a bool): infinity or NaN as a time or margin would never end or never compare."""
    return isinstance(x, (int, float)) and not isinstance(x, bool) and math.isfinite(x)


def log_spaced(n_min: int, n_max: int, steps: int) -> tuple[int, ...]:
    """`steps` integers from n_min to n_max, evenly spaced in log n (duplicates after rounding dropped):
    log_spaced(256, 4096, 5) = (256, 512, 1024, 2048, 4096)."""
    if not (1 <= n_min <= n_max) or steps < 1:
        raise ValueError(f"need 1 ≤ n_min ≤ n_max and steps ≥ 1, got {n_min}, {n_max}, {steps}")
    if steps == 1 or n_min == n_max:
        return (n_min,) if n_min == n_max or steps == 1 else (n_min, n_max)
    ratio = math.log(n_max / n_min) / (steps - 1)
    return tuple(dict.fromkeys(round(n_min * math.exp(i * ratio)) for i in range(steps)))


# The dashboard's first chart tells one story in four lines: the quadratic wall (softmax) and the three ways
# around it: a fused exact kernel (same arithmetic, memory O(n)), a sparse pattern (the window), a kernel feature
# map (linear). The other mechanisms are one click away; eight lines and their curves on one chart were a tangle.
DEFAULT_MECHANISMS = ("softmax", "sdpa", "sliding_window", "linear")
DEFAULT_SWEEP = SweepConfig(
    mechanisms=tuple((key, {}) for key in DEFAULT_MECHANISMS), ns=log_spaced(256, 4096, 5), batch=1, heads=8,
    d_model=512, dtype="float32", device="auto", mode="forward", warmup=1, min_repeats=3, min_time_s=0.05,
    point_budget_s=10.0,
)
"""The dashboard's default: DEFAULT_MECHANISMS at their defaults, n = 256 … 4096, short timing (~6 s, 2 idle
cores)."""


def plan(config: SweepConfig) -> list[Case]:
    """The points in the order they run: n ascending, the mechanisms in their order at each n (so a chart fills
    from the left and a time budget can skip the larger n of one mechanism)."""
    device = env.resolve_device(config.device)
    return [Case(mechanism=key, params=tuple(sorted(params.items())), n=n, batch=config.batch, heads=config.heads,
                 d_model=config.d_model, dtype=config.dtype, device=device, mode=config.mode, causal=config.causal,
                 seed=config.seed)
            for n in sorted(set(config.ns)) for key, params in config.mechanisms]


# ---- one sweep at a time per machine --------------------------------------------------------------------------

class SweepBusyError(RuntimeError):
    """Another sweep holds the machine's sweep lock."""


class SweepLockError(RuntimeError):
    """The sweep lock's file or folder cannot be used safely (a link, another user's folder); the message says what
    to remove."""


_process_lock = threading.Lock()  # where fcntl is missing


@contextlib.contextmanager
def sweep_lock(wait_s: float = 0.0, cancelled: Callable[[], bool] = lambda: False,
               on_wait: Callable[[str], None] = lambda holder: None, path: str | None = None) -> Iterator[None]:
    """Hold the sweep lock: an flock on `path`, by default LOCK_NAME in the user's own folder of the temp folder
    (user_folder()), which also excludes a second sweep in the same process. Waits up to `wait_s`, calling
    `on_wait(holder)` once, then raises SweepBusyError saying who holds it; the lock goes with the process, so a
    crashed sweep never leaves it held.

    The lock once sat at one fixed path in the shared temp folder and was opened following links, so any user could
    plant a link there and have a sweep overwrite the file it pointed to. It is now per user (two sweeps of one user
    still exclude each other; other users' sweeps are theirs to schedule), in a folder only that user can enter, and
    opened with O_NOFOLLOW: a link at its path raises SweepLockError instead."""
    if fcntl is None:
        if not _process_lock.acquire(timeout=max(wait_s, 0)):
            raise SweepBusyError("another sweep is running in this process; wait for it to finish or cancel it")
        try:
            yield
        finally:
            _process_lock.release()
        return
    fd = _open_lock_file(path or os.path.join(user_folder(), LOCK_NAME))
    try:
        deadline, told = time.monotonic() + wait_s, False
        while True:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except OSError:
                holder = _lock_holder(fd)
                if time.monotonic() >= deadline or cancelled():
                    raise SweepBusyError(f"another sweep is running on this machine ({holder}); wait for it to "
                                         "finish or cancel it, then start again") from None
                if not told:
                    on_wait(holder)
                    told = True
                time.sleep(0.1)
        with contextlib.suppress(OSError):
            os.ftruncate(fd, 0)
            os.pwrite(fd, f"pid {os.getpid()}, started {time.strftime('%H:%M:%S')}".encode(), 0)
        yield
    finally:
        os.close(fd)  # closing the descriptor releases the flock


def user_folder(base: str | None = None) -> str:
    """This user's private folder in the temp folder (`base`), 'attn_core-<uid>', created with mode 0o700; raises
    SweepLockError when its name is taken by a link, a file or another user's folder, or it cannot be made."""
    base = tempfile.gettempdir() if base is None else base
    uid = os.getuid()
    folder = os.path.join(base, f"attn_core-{uid}")
    try:
        with contextlib.suppress(FileExistsError):
            os.mkdir(folder, 0o700)
        info = os.lstat(folder)
    except OSError as e:
        raise SweepLockError(f"the sweep lock's folder {folder} cannot be made ({e.strerror or e}); make the temp "
                             "folder writable or set TMPDIR to a folder of yours") from None
    if stat.S_ISLNK(info.st_mode) or not stat.S_ISDIR(info.st_mode):
        kind = "a symbolic link" if stat.S_ISLNK(info.st_mode) else "not a folder"
        raise SweepLockError(f"the sweep lock's folder {folder} is {kind}, which another user could have planted; "
                             "remove it and start again")
    if info.st_uid != uid:
        raise SweepLockError(f"the sweep lock's folder {folder} belongs to another user (uid {info.st_uid}), who "
                             "could read or replace the lock; ask them or an administrator to remove it")
    if stat.S_IMODE(info.st_mode) != 0o700:
        os.chmod(folder, 0o700)  # ours, but open to others (made under another umask): close it
    return folder


def _open_lock_file(path: str) -> int:
    """A descriptor on the lock file, created 0o600; never through a link (O_NOFOLLOW) and never anything but a
    regular file, so a planted link or device cannot redirect the holder's line written into it."""
    flags = os.O_RDWR | os.O_CREAT | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_CLOEXEC", 0)
    try:
        fd = os.open(path, flags, 0o600)
    except PermissionError:  # another user's file: flock works on a read-only descriptor too
        fd = _open_read_only(path)
    except OSError as e:
        if os.path.islink(path):
            raise SweepLockError(f"the sweep lock {path} is a symbolic link, which would make a sweep overwrite "
                                 "the file it points to; remove the link and start again") from None
        raise SweepLockError(f"the sweep lock {path} cannot be opened ({e.strerror or e}); remove it or free its "
                             "folder and start again") from None
    if not stat.S_ISREG(os.fstat(fd).st_mode):
        os.close(fd)
        raise SweepLockError(f"the sweep lock {path} is not a regular file; remove it and start again")
    return fd


def _open_read_only(path: str) -> int:
    try:
        return os.open(path, os.O_RDONLY | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_CLOEXEC", 0))
    except OSError as e:
        raise SweepLockError(f"the sweep lock {path} cannot be opened ({e.strerror or e}); remove it and start "
                             "again") from None


def _lock_holder(fd: int) -> str:
    """The holder's line ('pid 123, started 10:04:05') read through our own descriptor, not the path again."""
    with contextlib.suppress(OSError):
        text = os.pread(fd, 200, 0).decode("utf-8", errors="replace").strip()
        if text:
            return text
    return "holder unknown"


# ---- a sweep executing in the worker ----------------------------------------------------------------------

class SweepRun:
    """Handle on a sweep executing in the worker process; a background thread drives it point by point.

    Poll it from anywhere (a Streamlit fragment, a CLI loop): `poll()` returns the rows that arrived since the last
    poll, `progress()` says where it is, `cancel()` stops it within about a second keeping finished rows, `done`
    turns true at the end, and `error` holds a sentence when the sweep could not run at all.
    """

    def __init__(self, config: SweepConfig, extra_mechanisms: tuple[str, ...] = (),
                 lock_wait_s: float | None = None):
        self.config = dataclasses.replace(config, device=env.resolve_device(config.device))
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
        self._threads: float = float(self.config.threads) if self.config.threads else float("nan")
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
        c = self.config
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
        if not self.config.threads:
            self._threads = float(info["threads"])
        return worker

    def _measure_all(self) -> None:
        worker = self._ready_worker()
        self.env = worker.environment(self.config.device, self.config.dtype, self.config.threads)
        settings, budget = self.config.settings(), self.config.point_budget_s
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

