"""The jobs one dashboard server measures: one at a time, the rest queued in order of asking. A job belongs to
the sessions watching it: any of them sees its progress and can stop it, a new session (a reload, a second tab) finds
it, and one that no watcher has been seen showing for ORPHAN_S is cancelled, or taken out of the queue. A session is
seen when its page runs (`seen`, its heartbeat): the host needs no word from its web framework on who is connected."""
from __future__ import annotations

import logging
import math
import os
import threading
import time
import weakref
from typing import Any, Callable


_LOG = logging.getLogger(__name__)
# A sweep whose watchers have none of them been seen for this long is cancelled. Longer than the longest gap between
# two runs of a page that shows it: its progress ticks every 2 s (engine.pacing) while the tab is in view, but a
# browser wakes the timers of a tab hidden for 5 minutes once a minute (Chrome; Safari every 40 s), and a sweep must
# not be lost to a reader who looked at another tab.
ORPHAN_S_DEFAULT = 75.0
ORPHAN_VARIABLE = "ATTN_LAB_ORPHAN_S"  # a host may choose its own (a shared server that frees the machine sooner)


def _orphan_s() -> float:
    text = os.environ.get(ORPHAN_VARIABLE, "")
    try:
        chosen = float(text) if text.strip() else ORPHAN_S_DEFAULT
    except ValueError:
        chosen = math.nan
    if not 0 < chosen < math.inf:
        _LOG.warning("%s=%r is not a number of seconds above 0: %.0f s is used", ORPHAN_VARIABLE, text,
                     ORPHAN_S_DEFAULT)
        return ORPHAN_S_DEFAULT
    return chosen


ORPHAN_S = _orphan_s()
CHECK_S = 1.0  # how often the stage's own thread looks for orphans and starts the next sweep


class Stage:
    """The server's queue of Jobs. `seen(session)` marks a session as showing its page now. `submit` queues a job
    and starts it when the machine is free; `place` says where a job stands; `withdraw` takes a queued job out;
    `check` (run by the stage's thread every CHECK_S, and by a job's poll) cancels orphans and starts the next."""

    def __init__(self, *, orphan_s: float = ORPHAN_S, clock: Callable[[], float] = time.monotonic,
                 thread: bool = True):
        self.orphan_s, self.clock = orphan_s, clock
        self.current: Any = None  # the job measuring now, or the last one measured
        self.queue: list[Any] = []
        self._seen: dict[str, float] = {}  # session → when its page last ran
        self._dropped: weakref.WeakSet[Any] = weakref.WeakSet()  # orphans cancelled, ending (cancelled once)
        self._lock = threading.RLock()
        if thread:
            threading.Thread(target=_watch, args=(weakref.ref(self),), name="attn_core-stage", daemon=True).start()

    def submit(self, job: Any, session: str) -> Any:
        with self._lock:
            job.stage = self
            job.watchers.add(session)
            self.queue.append(job)
            self.seen(session)
        self.check()
        return job

    def watch(self, session: str, job: Any) -> None:
        with self._lock:
            job.watchers.add(session)
            self.seen(session)

    def seen(self, session: str) -> None:
        """`session` shows its page now: the jobs it watches are kept for orphan_s more."""
        with self._lock:
            self._seen[session] = self.clock()

    def _last_seen(self, job: Any) -> float:
        return max((self._seen.get(s, -math.inf) for s in job.watchers), default=-math.inf)

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
        """Cancel a running job, and withdraw queued ones, none of whose watchers has been seen for orphan_s; then
        start the next queued job if the machine is free."""
        now = self.clock()
        with self._lock:
            for job in [j for j in (self.running(), *self.queue) if j is not None and j not in self._dropped]:
                if now - self._last_seen(job) >= self.orphan_s:
                    self._dropped.add(job)
                    if job in self.queue:
                        self.queue.remove(job)
                        job.withdrawn = True
                        job.error = "it was taken out of the queue before it started"
                    else:
                        job.cancel()
                    _LOG.warning("Sweep “%s” %s: no page has shown it for %.0f s", job.name,
                                 "withdrawn" if job.withdrawn else "cancelled", self.orphan_s)
            self._seen = {s: t for s, t in self._seen.items() if now - t < self.orphan_s}  # the gone are forgotten
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
