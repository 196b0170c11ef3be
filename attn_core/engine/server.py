"""The jobs of a server that measures for many sessions (the dashboard's): the process's one Stage, the measuring
worker (and with it the C++ kernels) made ready before the first sweep asks, and what a session asks of them. No web
framework here: a session is a string its host makes up, and it says it is still there by `seen` (its heartbeat)."""
from __future__ import annotations

import threading
from typing import Sequence

from .config import SweepConfig
from .job import Job
from .results import Run
from .stage import Stage
from . import presets, worker

HEARTBEAT_S = 5.0  # how often a page that watches a job says so, whatever the page: well inside stage.ORPHAN_S
_stage: Stage | None = None
_prestarted = False
_lock = threading.Lock()


def stage() -> Stage:
    """The process's one Stage, made at first use: sweeps run one at a time, each watched by its sessions."""
    global _stage
    with _lock:
        if _stage is None:
            _stage = Stage()
        return _stage


def reset(wait_s: float = 30.0) -> None:
    """Withdraw what the stage holds, cancel what it runs (waiting up to `wait_s` for it to end, so that it frees the
    machine), and begin again on a fresh stage (tests)."""
    global _stage
    with _lock:
        old, _stage = _stage, None
    if old is not None:
        for job in list(old.queue):
            old.withdraw(job)
        if (running := old.running()) is not None:
            running.cancel()
            running.wait(wait_s)


def prestart() -> None:
    """Start the measuring worker now, once per process: it imports torch and builds the C++ kernels while the
    reader looks around, so a first point comes fast. Returns at once: the page never waits for it."""
    global _prestarted
    with _lock:
        if not _prestarted:
            worker.prestart()
            _prestarted = True


def seen(session: str) -> None:
    """`session`'s page runs now: the jobs it watches are kept (Stage.seen)."""
    stage().seen(session)


def submit(name: str, configs: Sequence[SweepConfig], session: str, *, resume: int | None = None,
           budget_s: float | None = None) -> Job:
    """Sweeps run one after another as one job, queued on the stage for `session` (into run `resume` of the store,
    if given). A demo (a preset or the quick demo, by its name) keeps to the seconds it announces (`budget_s`, else
    its Preset.seconds). Sweeps that cannot run (a preset on a device without its dtype) give a job that ended at
    once with the sentences as its error."""
    if budget_s is None and resume is None:
        budget_s = presets.announced_s(name)
    try:
        return Job.measure(name, tuple(configs), stage=stage(), watcher=session, resume=resume, budget_s=budget_s)
    except ValueError as e:
        return Job.refused(name, str(e))


def adopt_running(session: str) -> Job | None:
    """The job the stage is measuring, watched by `session` from now on (a reload, a second tab); None when none
    is."""
    desk = stage()
    job = desk.running()
    if job is not None:
        desk.watch(session, job)
    return job


def replay(run: Run, points_per_s: float, *, at_once: bool) -> Job:
    """A saved run played back point by point, or (`at_once`) shown whole; it needs no stage."""
    return Job.replay(run, points_per_s, shown=at_once)
