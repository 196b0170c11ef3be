"""The jobs one dashboard server measures: one at a time, the rest queued in order of asking. A job belongs to
the sessions watching it: any of them sees its progress and can stop it, a new session (a reload, a second tab) finds
it, and one whose every watcher has gone is cancelled, or taken out of the queue, within ORPHAN_S."""
from __future__ import annotations

import logging
import threading
import time
import weakref
from typing import Any, Callable


_LOG = logging.getLogger(__name__)
ORPHAN_S = 5.0  # a sweep with no live watcher for this long is cancelled (a network blip reconnects sooner)
CHECK_S = 1.0  # how often the stage's own thread looks for orphans and starts the next sweep


class Stage:
    """The server's queue of Jobs. `alive(session)` says whether a session is still connected. `submit` queues a job
    and starts it when the machine is free; `place` says where a job stands; `withdraw` takes a queued job out;
    `check` (run by the stage's thread every CHECK_S, and by a job's poll) cancels orphans and starts the next."""

    def __init__(self, alive: Callable[[str], bool], *, orphan_s: float = ORPHAN_S,
                 clock: Callable[[], float] = time.monotonic, thread: bool = True):
        self.alive, self.orphan_s, self.clock = alive, orphan_s, clock
        self.current: Any = None  # the job measuring now, or the last one measured
        self.queue: list[Any] = []
        self._orphaned: dict[int, float] = {}  # id(job) → when its last watcher was seen gone
        self._lock = threading.RLock()
        if thread:
            threading.Thread(target=_watch, args=(weakref.ref(self),), name="attn_core-stage", daemon=True).start()

    def submit(self, job: Any, session: str) -> Any:
        with self._lock:
            job.stage = self
            job.watchers.add(session)
            self.queue.append(job)
        self.check()
        return job

    def watch(self, session: str, job: Any) -> None:
        with self._lock:
            job.watchers.add(session)
            self._orphaned.pop(id(job), None)

    def running(self) -> Any:
        """The job measuring now, if any."""
        with self._lock:
            current = self.current
            return current if current is not None and not current.done else None

    def place(self, job: Any) -> int:
        """Its place in the queue: 1 when it starts next, k when k − 1 queued jobs are ahead of it; 0 when it is
        not queued (measuring, ended or withdrawn)."""
        with self._lock:
            return self.queue.index(job) + 1 if job in self.queue else 0

    def withdraw(self, job: Any) -> None:
        with self._lock:
            if job in self.queue:
                self.queue.remove(job)
                job.withdrawn = True
                job.error = "it was taken out of the queue before it started"
        self.check()

    def check(self) -> None:
        """Cancel a running job, and withdraw queued ones, whose watchers have all gone for orphan_s; then start
        the next queued job if the machine is free."""
        now = self.clock()
        with self._lock:
            for job in [j for j in (self.running(), *self.queue) if j is not None]:
                if any(self.alive(s) for s in job.watchers):
                    self._orphaned.pop(id(job), None)
                elif id(job) not in self._orphaned:
                    self._orphaned[id(job)] = now
                elif now - self._orphaned[id(job)] >= self.orphan_s:
                    self._orphaned.pop(id(job))
                    if job in self.queue:
                        self.queue.remove(job)
                        job.withdrawn = True
                        job.error = "it was taken out of the queue before it started"
                    else:
                        job.cancel()
                    _LOG.warning("Sweep “%s” %s: no page has shown it for %.0f s", job.name,
                                 "withdrawn" if job.withdrawn else "cancelled", self.orphan_s)
            if self.running() is None and self.queue:
                job = self.queue.pop(0)
                self.current = job
                try:
                    job.start()
                except Exception as e:  # a job that cannot start must not block the ones behind it
                    job.error = str(e) or type(e).__name__
                    job.withdrawn = True


def _watch(ref: "weakref.ref[Stage]") -> None:
    """The stage's own check every CHECK_S, for as long as the stage exists."""
    while (stage := ref()) is not None:
        try:
            stage.check()
        except Exception:  # noqa: BLE001 - the watcher outlives any one bad check
            pass
        del stage
        time.sleep(CHECK_S)
