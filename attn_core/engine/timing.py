"""How a point is timed: warm-up, then samples of back-to-back calls until enough clean ones are taken, each sample
taking its turn with a page drawing beside it, and set aside and taken again when another program took CPU from it."""
from __future__ import annotations

import math
import os
import time
from dataclasses import dataclass
from typing import Any, Callable

import torch

from . import env
from .problem import Settings

MIN_SAMPLE_S = 1e-3  # a sample times back-to-back calls adding up to ≥ 1 ms, so timer overhead stays small
MAX_CALLS_PER_SAMPLE = 100
MAX_SAMPLES = 1000


class Cancelled(Exception):
    """The sweep was cancelled while this point was being measured."""


@dataclass(frozen=True)
class Timing:
    """The timed samples of one point: `samples` (seconds per call) that the median is taken from, the seconds
    spent in all, what other programs did during those samples (`contention`), how many samples were taken again
    because another program took CPU from them (`retaken`), whether the point stayed disturbed after the
    bounded retakes (then `samples` holds every sample, disturbed ones included), the seconds it waited for its
    turn or for quiet (`waited_s`, part of `spent_s`; not counted against the point's budget), and whether it ran
    past its share of a demo's wall-clock budget (`late`: from then on no retake and no wait for quiet)."""

    samples: list[float]
    spent_s: float
    contention: env.Contention = env.Contention()
    retaken: int = 0
    disturbed: bool = False
    waited_s: float = 0.0
    late: bool = False


MAX_RETAKES = 20  # disturbed samples taken again per point, at most ...
RETAKE_S = 1.0  # ... and at most this many seconds (or the clean samples' own time, if longer) spent on them
QUIET_STEP_S, QUIET_WAIT_S = 0.025, 0.5  # after two disturbed samples in a row: a quiet 25 ms, waited 0.5 s at most
HOLD_MAX_S = 3.0  # the longest a hold (a page is drawing) keeps one sample waiting ...
AFTER_HOLD_QUIET_S, AFTER_HOLD_WAIT_S = 0.1, 1.0  # ... then 0.1 s of quiet (the browser drew), waited 1 s at most
BUSY_OTHERS = 0.5  # threads or cores of other programs beyond the spare ones that make a moment not quiet
RETAKES = "ATTN_LAB_RETAKES"  # "0": keep every sample as measured (retaking), for this process and those it starts


_OFF, _ON = ("0", "false", "no", "off"), ("", "1", "true", "yes", "on")


def retaking() -> bool:
    """Whether disturbed samples are set aside and taken again and quiet moments waited for: yes, unless the
    environment variable ATTN_LAB_RETAKES is "0" (or false, no, off). Off, a sample is kept as measured (a point left
    disturbed is drawn hollow and labelled, as a demo past its budget is): a sweep on a machine that is never quiet
    (a laptop on stage, a test suite beside other programs) takes the time its samples take, not up to RETAKE_S and
    QUIET_WAIT_S more a point. Read at each point, so the worker and the dashboard's server follow the variable they
    started with. ValueError, a sentence, for any other value (the point fails with it as its reason)."""
    value = os.environ.get(RETAKES, "").strip().lower()
    if value not in _OFF + _ON:
        raise ValueError(f"{RETAKES} must be 0 (keep every sample as measured) or 1 (retake disturbed samples), got "
                         f"{os.environ[RETAKES]!r}; set it to one of them or unset it")
    return value not in _OFF


def wait_for_quiet(probe: env.ContentionProbe, threads: int, quiet_s: float = QUIET_STEP_S,
                   max_s: float = QUIET_WAIT_S) -> None:
    """Sleep until other programs have kept fewer than half a thread running beyond the spare cores for `quiet_s`
    in a row (checked every QUIET_STEP_S; env.ContentionProbe.others_runnable, else CPU times), at most `max_s`: a
    browser drawing a chart, a page's script run."""
    deadline, calm = time.perf_counter() + max_s, 0.0
    while time.perf_counter() < deadline and calm < quiet_s:
        began, mark = time.perf_counter(), probe.mark()
        others = probe.others_runnable(QUIET_STEP_S)
        if others is None:
            others = probe.since(mark).foreign_cores
        calm = 0.0 if busy(others, threads) else calm + time.perf_counter() - began


def busy(others: float, threads: int) -> bool:
    """Whether other programs, keeping `others` threads running (or using that many cores), leave this process's
    `threads` less than the machine: half a core or more beyond the spare ones."""
    return others >= env.spare_cores(threads) + BUSY_OTHERS


@dataclass(frozen=True)
class Turns:
    """How timed samples take turns with a page drawing beside them (worker.hold). `claim()` before a sample: True
    when it may start now, False while the page holds the machine; `release()` after it, so a page waiting for the
    sample in flight to end may go on."""

    claim: Callable[[], bool] = lambda: True
    release: Callable[[], None] = lambda: None


def take_turn(probe: env.ContentionProbe, threads: int, crowded: bool, turns: Turns,
              cancelled: Callable[[], bool], settle: bool = True) -> float:
    """Wait until a timed sample may start, and claim it: while the page holds the machine (HOLD_MAX_S at most, so
    a page that never lets go cannot stall a sweep), then for AFTER_HOLD_QUIET_S of quiet (the browser draws what
    it was sent; not when `settle` is off: retaking()); when other programs `crowded` it just before, for a short
    quiet moment. The seconds waited."""
    began, drew = time.perf_counter(), False
    while time.perf_counter() - began < HOLD_MAX_S and not cancelled():
        if not turns.claim():
            drew = True
            time.sleep(QUIET_STEP_S / 5)
            continue
        if not ((drew and settle) or crowded):
            break
        turns.release()  # the page may draw while this waits for quiet
        wait_for_quiet(probe, threads, *((AFTER_HOLD_QUIET_S, AFTER_HOLD_WAIT_S) if drew else (QUIET_STEP_S,
                                                                                             QUIET_WAIT_S)))
        drew = crowded = False
    return time.perf_counter() - began


def time_samples(thunk: Callable[[], Any], device: str, settings: Settings,
                 cancelled: Callable[[], bool] = lambda: False, probe: env.ContentionProbe | None = None,
                 first_call_s: float | None = None, turns: Turns = Turns(), until: float = math.inf) -> Timing:
    """Seconds per call, one sample per block of back-to-back calls: `warmup` untimed calls, then samples until
    both `min_repeats` clean samples and `min_time_s` of them are reached, or the point's `point_budget_s` is spent
    (≥ 1 sample). Each sample takes its turn (take_turn): none starts while the caller's page draws, and after a
    busy warm-up or two disturbed samples in a row it waits for a quiet moment. A sample during which another
    program took CPU from this process anyway (env.Contention.disturbed) is set aside and taken again, at most
    MAX_RETAKES times and RETAKE_S seconds; a point still short of clean samples then is `disturbed`.
    `first_call_s`: the thunk already ran once, taking that long (it counts as a warm-up call). Waits do not count
    towards the budget. `until` (on this module's clock, waits included): the end of the point's share of a demo's
    wall-clock budget; past it the point is `late` and kept as it is: no retake, no wait for quiet, and it ends at
    `min_repeats` samples whatever `min_time_s` asks. With retaking() off, every sample is kept as it is: no retake
    and no wait for quiet from the first. Raises Cancelled when `cancelled()` turns true."""
    timed, threads = env.device_timer(device), torch.get_num_threads()
    probe = probe or env.ContentionProbe()
    start, one, warm, keep = time.perf_counter(), first_call_s or 0.0, probe.mark(), not retaking()
    for _ in range(settings.warmup - (first_call_s is not None)):
        if cancelled():
            raise Cancelled
        one = timed(thunk, 1)
    crowded = busy(probe.since(warm).foreign_cores, threads)
    probe.refresh()  # the warm-up may have started the thread pool
    calls = max(1, min(MAX_CALLS_PER_SAMPLE, math.ceil(MIN_SAMPLE_S / max(one, 1e-9))))
    kept: list[tuple[float, env.Contention]] = []
    set_aside: list[tuple[float, env.Contention]] = []
    spent = retake_s = waited = 0.0
    last_hit = late = False
    while len(kept) + len(set_aside) < MAX_SAMPLES:
        if cancelled():
            raise Cancelled
        late = late or time.perf_counter() >= until
        waited += take_turn(probe, threads, crowded and not (late or keep), turns, cancelled, settle=not keep)
        try:
            mark = probe.mark()
            t = timed(thunk, calls)
            seen = probe.since(mark)
        finally:
            turns.release()
        now = time.perf_counter()
        over, late = now - start - waited > settings.point_budget_s, late or now >= until
        may_retake = (len(set_aside) < MAX_RETAKES and retake_s < max(RETAKE_S, spent)
                      and not (over or late or keep))
        hit = seen.disturbed(threads)
        crowded, last_hit = hit and last_hit, hit  # a blip passes by itself; after two in a row, wait for quiet
        if hit and may_retake:
            set_aside.append((t / calls, seen))
            retake_s += t
            continue
        kept.append((t / calls, seen))
        spent += t
        if over or (len(kept) >= settings.min_repeats and (spent >= settings.min_time_s or late)):
            break
    clean = [(t, c) for t, c in kept if not c.disturbed(threads)]
    disturbed = len(clean) < min(settings.min_repeats, len(kept))
    used = kept + set_aside if disturbed else kept
    total = sum((c for _, c in used), env.Contention(0.0, 0.0, 0.0))
    return Timing([t for t, _ in used], time.perf_counter() - start, total, len(set_aside), disturbed, waited, late)
