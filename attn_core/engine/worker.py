"""The measurement worker: a separate process that measures one point per request, so an out-of-memory kill, a crash
or a hung kernel never takes down the caller (the Streamlit server). One persistent worker per process, started
ahead of time (`prestart`), because a fresh process spends seconds importing torch, building the C++ kernels and
initialising the profiler.
"""
from __future__ import annotations

import contextlib
import logging
import math
import multiprocessing
import os
import signal
import threading
import time
from dataclasses import dataclass
from typing import Any, Callable

from attn_core.engine import spawning

_LOG = logging.getLogger(__name__)
_CTX = multiprocessing.get_context("spawn")  # fork would copy the caller's threads and CUDA state
CANCEL_GRACE_S = 1.0  # a cancelled point that has not stopped by then is stopped by killing the worker
START_TIMEOUT_S = 120.0
KERNEL_BUILD_S = 30.0  # each compiler run at most, so that native.build's three tries end within START_TIMEOUT_S


class WorkerError(RuntimeError):
    """The worker could not start or answer; the message says why."""


@dataclass
class Outcome:
    """What came back for one point: the worker's Measurement, or why there is none ('died', 'timeout',
    'cancelled', 'error')."""

    point: Any
    elapsed_s: float
    failure: str = ""
    detail: str = ""


def describe_exit(code: int | None) -> str:
    """The end of a sentence for a worker's exit code, e.g. 'was killed by SIGKILL (...)'."""
    if code is None:
        return "stopped answering"
    if code < 0:
        try:
            name = signal.Signals(-code).name
        except ValueError:
            name = f"signal {-code}"
        if -code == signal.SIGKILL:
            return f"was killed by {name} (the system's out-of-memory killer does this when memory runs out)"
        return f"crashed with {name}"
    return f"exited with code {code}"


class Worker:
    """Handle on one worker process. Requests go through a pipe, one at a time; `cancel_event` asks the point in
    flight to stop at its next sample; until the wall-clock time in `held_until` (a page is drawing) no timed sample
    starts, and `in_sample` is 1 while one runs (see hold)."""

    def __init__(self) -> None:
        self._conn, child = _CTX.Pipe()
        self.cancel_event = _CTX.Event()
        self.held_until, self.in_sample = _CTX.Value("d", 0.0, lock=False), _CTX.Value("b", 0, lock=False)
        self.process = _CTX.Process(target=_serve, args=(child, self.cancel_event, self.held_until, self.in_sample),
                                    daemon=True,
                                    name="attn_core-worker")
        with spawning.without_main():  # Streamlit's page script is __main__: the worker must not run it
            self.process.start()
        child.close()
        self.info: dict[str, Any] | None = None

    def alive(self) -> bool:
        return self.process.is_alive()

    def wait_ready(self, timeout: float = START_TIMEOUT_S, cancelled: Callable[[], bool] = lambda: False) -> dict:
        """Block until the worker has imported torch and warmed up; its info {pid, threads}."""
        if self.info is None:
            reply = self._receive(time.monotonic() + timeout, cancelled)
            if reply is None and cancelled() and self.alive():  # keep it warming up for the next sweep
                raise WorkerError("cancelled while the measurement worker was starting")
            if reply is None or reply[0] != "ready":
                self.kill()
                raise WorkerError(f"the measurement worker could not start: it {describe_exit(self.process.exitcode)}")
            self.info = reply[1]
        return self.info

    def environment(self, device: str, dtype: str, threads: int | None) -> dict:
        """The environment stamp, taken inside the worker, the process that measures (its threads, allocator and
        device state are the ones the figures come from), with the device's matmul throughput measured afresh
        (`device_gflops`): a sweep's percentages rest on a figure of its own."""
        self._conn.send(("env", device, dtype, threads))
        reply = self._receive(time.monotonic() + START_TIMEOUT_S, lambda: False)
        if reply is None or reply[0] != "env":
            raise WorkerError(f"the measurement worker {describe_exit(self.process.exitcode)}"
                              + (f": {reply[1]}" if reply else ""))
        return reply[1]

    def measure(self, problem: Any, settings: Any, extra: tuple[str, ...], *, limit_s: float,
                cancelled: Callable[[], bool], wall_s: float = math.inf) -> Outcome:
        """Measure one Problem; the same object comes back on its Measurement. `wall_s`: its share of a demo's
        wall-clock budget (measure.measure). A worker that dies, runs past `limit_s`, or ignores a cancel for
        CANCEL_GRACE_S is killed, and the Outcome says so (the caller starts a new worker)."""
        self.cancel_event.clear()
        self._conn.send(("measure", problem, settings, extra, wall_s))
        start, cancel_at = time.monotonic(), None
        while True:
            if self._conn.poll(0.05):
                reply = self._recv_or_none()
                if reply is not None and reply[0] == "point":
                    return Outcome(reply[1], reply[2])
                if reply is not None:  # the worker answered with an error and lives on
                    return Outcome(None, time.monotonic() - start, "error", reply[1])
            elapsed = time.monotonic() - start
            if not self.alive():
                code = self.process.exitcode
                return Outcome(None, elapsed, "died", f"the measurement process {describe_exit(code)} while "
                                                      "measuring this point; the sweep went on in a new one")
            if cancelled() and cancel_at is None:
                self.cancel_event.set()
                cancel_at = time.monotonic()
            if cancel_at is not None and time.monotonic() - cancel_at > CANCEL_GRACE_S:
                self.kill()
                return Outcome(None, elapsed, "cancelled", "cancelled while this point was measured; the "
                                                           "measurement process was stopped")
            if elapsed > limit_s:
                self.kill()
                return Outcome(None, elapsed, "timeout", f"stopped after {elapsed:.0f} s, past the hard limit of "
                                                         f"{limit_s:.0f} s for one point")

    def _recv_or_none(self) -> tuple | None:
        try:
            return self._conn.recv()
        except (EOFError, OSError):
            return None

    def _receive(self, deadline: float, cancelled: Callable[[], bool]) -> tuple | None:
        while time.monotonic() < deadline and not cancelled():
            if self._conn.poll(0.05):
                return self._recv_or_none()
            if not self.alive():
                return None
        return None

    def kill(self) -> None:
        """Stop the process now (SIGKILL) and reap it."""
        if self.process.is_alive():
            self.process.kill()
        self.process.join(timeout=5)
        self._conn.close()

    def stop(self) -> None:
        """Ask the worker to exit, then make sure it has."""
        with contextlib.suppress(OSError, ValueError):
            self._conn.send(("stop",))
        self.process.join(timeout=2)
        self.kill()


_worker: Worker | None = None
_worker_lock = threading.Lock()


def get_worker() -> Worker:
    """The process's persistent worker, started now if there is none alive (does not wait for it to be ready)."""
    global _worker
    with _worker_lock:
        if _worker is None or not _worker.alive() or _worker._conn.closed:
            if _worker is not None:
                _worker.kill()  # reap the dead one and close its pipe
            _worker = Worker()
        return _worker


def prestart() -> Worker:
    """Start the persistent worker in the background so a sweep's first point arrives quickly; cheap when one is
    already running. Call it when a page that can start a sweep loads."""
    return get_worker()


HOLD_S = 3.0  # a hold not released by then lapses: a page that fails mid-draw cannot stall a sweep
PARK_WAIT_S = 1.0  # hold(True) waits at most this long for the sample in flight to end


def hold(on: bool) -> None:
    """While on, the running worker starts no timed sample (measure.take_turn waits): a page holds it while it
    draws, so the measurement never competes with the dashboard. hold(True) returns once the sample in flight has
    ended (PARK_WAIT_S at most); the hold lapses after HOLD_S. No-op without a worker."""
    current = _worker
    if current is None or not current.alive():
        return
    current.held_until.value = time.time() + HOLD_S if on else 0.0
    deadline = time.monotonic() + PARK_WAIT_S
    while on and current.in_sample.value and time.monotonic() < deadline:
        time.sleep(0.002)


def _turns(held_until: Any, in_sample: Any) -> Any:
    """The worker's side of hold: a sample claims its turn by marking itself in flight, then backs off if a page
    holds the machine (marking first, checking second: a page that holds just then waits for this sample)."""
    from .timing import Turns

    def claim() -> bool:
        in_sample.value = 1
        if time.time() < held_until.value:
            in_sample.value = 0
            return False
        return True

    return Turns(claim, lambda: setattr(in_sample, "value", 0))


def shutdown() -> None:
    """Stop the persistent worker (tests, or a host that wants the memory back)."""
    global _worker
    with _worker_lock:
        if _worker is not None:
            _worker.stop()
            _worker = None


# ---- inside the worker process -------------------------------------------------------------------------------

def _warm_up() -> str:
    """A steady allocator (env.steady_allocator), the C++ kernels built, and the memory probe's first use paid now
    rather than by the first point; returns what the kernels are (`_build_kernels`)."""
    import torch

    from . import env

    env.steady_allocator()
    kernels = _build_kernels()
    env.peak_memory_probe("cpu")[1](lambda: torch.ones(8) + 1)
    return kernels


def _build_kernels() -> str:
    """Build the C++ kernels (or load them, built already) before the first point, so that every point of a sweep
    and its environment stamp see the same ones; native.describe's words. Never raises: where they cannot be built
    the torch forms run, and the log says why."""
    from .. import native

    if native.enabled():
        try:
            native.build(seconds=KERNEL_BUILD_S)
        except Exception as e:  # noqa: BLE001 - no compiler, a failed build: the worker measures on regardless
            _LOG.warning("The C++ kernels could not be built, their torch forms run instead: %s", e)
    return native.describe()


def _serve(conn: Any, cancel_event: Any, held_until: Any, in_sample: Any) -> None:
    """The worker's loop: answer 'measure', 'env' and 'stop' requests until the caller goes away (EOF)."""
    import torch

    from . import env, measure

    # Ctrl-C and a closed terminal reach the whole process group: they are the caller's to handle (it cancels the
    # sweep and saves). SIGTERM still ends the worker: multiprocessing stops its children with it.
    for name in ("SIGINT", "SIGHUP"):
        if hasattr(signal, name):
            signal.signal(getattr(signal, name), signal.SIG_IGN)
    default_threads = torch.get_num_threads()
    kernels = _warm_up()
    conn.send(("ready", {"pid": os.getpid(), "threads": default_threads, "kernels": kernels}))
    while True:
        try:
            message = conn.recv()
        except (EOFError, OSError, KeyboardInterrupt):
            return
        kind = message[0]
        if kind == "stop":
            return
        try:
            if kind == "env":
                _, device, dtype, threads = message
                torch.set_num_threads(threads or default_threads)
                gflops = env.matmul_gflops(device, dtype, refresh=True)  # each sweep measures its own figure
                reply: tuple = ("env", {**env.environment(device, dtype, torch.get_num_threads()),
                                        "device_gflops": gflops,
                                        "device_gflops_disturbed": env.matmul_disturbed(device, dtype)})
            elif kind == "measure":
                _, problem, settings, extra, wall_s = message
                torch.set_num_threads(settings.threads or default_threads)
                spec = measure.resolve_mechanisms(extra)[problem.mechanism]
                point, elapsed = measure.measure(spec, problem, settings, cancel_event.is_set,
                                                 _turns(held_until, in_sample), wall_s)
                reply = ("point", point, elapsed)
            else:
                reply = ("error", f"unknown request {kind!r}")
        except Exception as e:  # a bad request must not end the worker
            reply = ("error", f"{type(e).__name__}: {e}")
        try:
            conn.send(reply)
        except OSError:  # the caller went away mid-point
            return
