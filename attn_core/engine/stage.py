"""The sweeps one dashboard server measures: one at a time, the rest queued in order of asking. A sweep belongs to
the sessions watching it: any of them sees its progress and can stop it, a new session (a reload, a second tab) finds
it, and one whose every watcher has gone is cancelled, or taken out of the queue, within ORPHAN_S."""
from __future__ import annotations

import itertools
import logging
import threading
import time
import weakref
from dataclasses import dataclass, field
from typing import Any, Callable

from .results import frame_from_rows

_LOG = logging.getLogger(__name__)
ORPHAN_S = 5.0  # a sweep with no live watcher for this long is cancelled (a network blip reconnects sooner)
CHECK_S = 1.0  # how often the stage's own thread looks for orphans and starts the next sweep


@dataclass(eq=False)
class Entry:
    """One asked-for sweep: its name, how to start it, the job once started, and who watches it."""

    id: int
    name: str
    make: Callable[[], Any]  # starts the job (a SweepRun or SweepSequence) when its turn comes
    watchers: set[str] = field(default_factory=set)
    job: Any = None
    withdrawn: bool = False  # cancelled while queued, or dropped because nobody watched it
    orphaned_at: float | None = None  # when its last watcher was seen gone
    error: str | None = None  # the job could not start

    @property
    def done(self) -> bool:
        return self.withdrawn or self.error is not None or (self.job is not None and self.job.done)


class Stage:
    """`alive(session)` says whether a session is still connected. `submit` queues a sweep and starts it when the
    machine is free; `place` says where an entry stands; `cancel` stops or withdraws it; `check` (run by the stage's
    thread every CHECK_S, and by any caller) cancels orphans and starts the next sweep."""

    def __init__(self, alive: Callable[[str], bool], *, orphan_s: float = ORPHAN_S,
                 clock: Callable[[], float] = time.monotonic, thread: bool = True):
        self.alive, self.orphan_s, self.clock = alive, orphan_s, clock
        self.current: Entry | None = None  # measuring now, or the last one measured
        self.queue: list[Entry] = []
        self._ids = itertools.count(1)
        self._lock = threading.RLock()
        if thread:
            threading.Thread(target=_watch, args=(weakref.ref(self),), name="attn_core-stage", daemon=True).start()

    def submit(self, session: str, name: str, make: Callable[[], Any]) -> Entry:
        entry = Entry(next(self._ids), name, make, {session})
        with self._lock:
            self.queue.append(entry)
        self.check()
        return entry

    def watch(self, session: str, entry: Entry) -> None:
        with self._lock:
            entry.watchers.add(session)
            entry.orphaned_at = None

    def running(self) -> Entry | None:
        """The entry measuring now, if any."""
        with self._lock:
            current = self.current
            return current if current is not None and not current.done else None

    def place(self, entry: Entry) -> int:
        """Its place in the queue: 1 when it starts next, k when k − 1 queued sweeps are ahead of it; 0 when it is
        not queued (measuring, ended or withdrawn)."""
        with self._lock:
            return self.queue.index(entry) + 1 if entry in self.queue else 0

    def cancel(self, entry: Entry) -> None:
        with self._lock:
            if entry in self.queue:
                self.queue.remove(entry)
                entry.withdrawn = True
            elif entry.job is not None:
                entry.job.cancel()
        self.check()

    def check(self) -> None:
        """Cancel a running sweep, and withdraw queued ones, whose watchers have all gone for orphan_s; then start
        the next queued sweep if the machine is free."""
        now = self.clock()
        with self._lock:
            for entry in [e for e in (self.running(), *self.queue) if e is not None]:
                if any(self.alive(s) for s in entry.watchers):
                    entry.orphaned_at = None
                elif entry.orphaned_at is None:
                    entry.orphaned_at = now
                elif now - entry.orphaned_at >= self.orphan_s:
                    if entry in self.queue:
                        self.queue.remove(entry)
                        entry.withdrawn = True
                    else:
                        entry.job.cancel()
                    _LOG.warning("Sweep “%s” %s: no page has shown it for %.0f s", entry.name,
                                 "withdrawn" if entry.withdrawn else "cancelled", self.orphan_s)
            if (running := self.running()) is not None:
                running.job.poll()  # a sequence of sweeps moves on to its next one even while nobody looks
            if self.running() is None and self.queue:
                entry = self.queue.pop(0)
                self.current = entry
                try:
                    entry.job = entry.make()
                except Exception as e:  # a sweep that cannot start must not block the ones behind it
                    entry.error = str(e) or type(e).__name__


def _watch(ref: "weakref.ref[Stage]") -> None:
    """The stage's own check every CHECK_S, for as long as the stage exists."""
    while (stage := ref()) is not None:
        try:
            stage.check()
        except Exception:  # noqa: BLE001 - the watcher outlives any one bad check
            pass
        del stage
        time.sleep(CHECK_S)


def ordinal(k: int) -> str:
    return f"{k}{'th' if 10 <= k % 100 <= 20 else {1: 'st', 2: 'nd', 3: 'rd'}.get(k % 10, 'th')}"


class Ticket:
    """One session's handle on a stage entry, answering like the job itself (poll, frame, progress, cancel, done,
    error, result) from the moment it is asked for: while queued it has no points and says its place in line."""

    def __init__(self, stage: Stage, entry: Entry, total: int = 0, own: bool = True):
        self.stage, self.entry, self.total = stage, entry, total
        self.own = own  # asked for by this session (False: found running, started elsewhere)

    @property
    def job(self) -> Any:
        return self.entry.job

    @property
    def queued(self) -> bool:
        return self.job is None and not self.entry.done

    def poll(self) -> list[dict]:
        """Moves the stage on (stage.check polls the job under the stage's lock, so sessions sharing a sequence of
        sweeps never start its next sweep twice). Returns []: a shared job's rows are read with frame()."""
        self.stage.check()
        return []

    def frame(self):
        return frame_from_rows([]) if self.job is None else self.job.frame()

    def progress(self) -> dict:
        if self.job is not None:
            return self.job.progress()
        place = self.stage.place(self.entry)
        running = self.stage.running()
        after = f" after “{running.name}”" if running is not None else ""
        now = ("withdrawn" if not place else f"queued, next{after}" if place == 1 else
               f"queued, {ordinal(place)} in line{after}")
        return {"done": 0, "total": self.total, "eta_s": None, "current": now, "elapsed_s": 0.0}

    def cancel(self) -> None:
        self.stage.cancel(self.entry)

    @property
    def done(self) -> bool:
        return self.entry.done

    @property
    def error(self) -> str | None:
        if self.entry.error:
            return self.entry.error
        if self.entry.withdrawn:
            return "it was taken out of the queue before it started"
        return None if self.job is None else self.job.error

    def result(self):
        return self.job.result()
