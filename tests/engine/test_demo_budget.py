"""A demo keeps its word on a busy machine: past its share of the wall-clock budget a point is kept as it is (drawn
hollow, labelled), never retaken forever; the ETA counts retakes and the foreign load, says when the machine is busy,
and promises nothing before a point is measured. Injected clocks and a fake worker: no real timing."""
from __future__ import annotations

import math
import os

import pytest

from attn_core.charts.scaling_data import points_frame
from attn_core.engine import timing as loop
from attn_core.engine.config import SweepConfig
from attn_core.engine.job import KEPT_BUSY, Job
from attn_core.engine.problem import Settings
from attn_core.engine.timing import time_samples
from tests.engine.fake_worker import Clock, FakeWorker, Scripted
from tests.engine.test_measure import FakeClock, FakeProbe
from tests.fake_mechanisms import private_sweep_lock  # noqa: F401 (an autouse fixture)

SMALL = dict(heads=2, d_model=16, warmup=1, min_repeats=3, min_time_s=0.0, measure_memory=False, device="cpu")


def sweep(mechanisms=("softmax", "linear"), ns=(16, 32, 64, 128, 256), **kw) -> SweepConfig:
    return SweepConfig(mechanisms=tuple((m, {}) for m in mechanisms), ns=ns).replaced(**{**SMALL, **kw})


def run(job: Job) -> Job:
    job.start()
    assert job.wait(30) and job.error is None, job.error  # the fake clock never waits: this ends at once
    return job


def always_disturbed(floor_s: float):
    """A busy machine: every sample disturbed. Without a share the point retakes until its point budget is spent
    (the engine's bounded retakes, 10 s here); with one it stops at its share, or after `floor_s` (its first
    samples) when the share is smaller still."""
    def script(index, problem, settings, share):
        spent = settings.point_budget_s if math.isinf(share) else max(min(share, settings.point_budget_s), floor_s)
        return Scripted(median_s=1e-3, wall_s=spent, retaken=20, foreign_cpu=1.0, disturbed=True)
    return script


def test_a_demo_on_a_busy_machine_ends_within_its_budget_with_its_points_kept_hollow_and_labelled():
    config = sweep(point_budget_s=10.0)  # 2 mechanisms × 5 lengths = 10 points, as the quick demo
    clock = Clock()
    fake = FakeWorker(clock, always_disturbed(floor_s=0.1))
    job = run(Job("demo", (config,), clock=clock, keep=False, budget_s=6.0, workers=lambda: fake))
    # each share is a part of what is left of the budget, so they add up to 6 s at most; a point whose share
    # fell below 0.1 s took 0.1 s: 6 + 10 × 0.1 = 7 s is the most the job can take
    assert len(fake.shares) == 10 and sum(fake.shares) <= 6.0 + 1e-9
    assert clock.now <= 6.0 + 10 * 0.1
    frame = job.frame()
    assert list(frame["status"]) == ["ok"] * 10 and frame["disturbed"].all()
    assert list(frame["reason"]) == [KEPT_BUSY] * 10 == ["kept: the machine was busy"] * 10
    assert points_frame(frame, "time_median_s")["hollow"].all()  # the chart draws each one hollow


def test_without_a_budget_the_same_machine_takes_every_point_budget():
    """The contrast: no budget, no share (inf), and each of the 10 points retakes for its 10 s: 100 s."""
    clock = Clock()
    fake = FakeWorker(clock, always_disturbed(floor_s=0.1))
    run(Job("sweep", (sweep(point_budget_s=10.0),), clock=clock, keep=False, workers=lambda: fake))
    assert fake.shares == [math.inf] * 10 and clock.now == 100.0


def test_a_share_follows_the_forecast_of_the_points_left():
    """Two points of one series, equal work: the first gets half of the 4 s budget; it spent 1 s, so the second
    gets all of the 3 s left."""
    clock = Clock()
    fake = FakeWorker(clock, lambda i, p, s, share: Scripted(median_s=1e-3, wall_s=1.0))
    config = sweep(("softmax",), ns=(32,))
    run(Job("demo", (config, config), clock=clock, keep=False, budget_s=4.0, workers=lambda: fake))
    assert fake.shares == [pytest.approx(2.0), pytest.approx(3.0)]


# The ETA after two points, by hand. Settings: 1 warm-up call, no memory run, 3 samples, no minimum time, point
# budget 30 s; a call of ≥ 1 ms is one sample, so a point at c s a call, its samples taken 1 + r times, takes
# c + 3·c·(1 + r). Plan: A, B, A, B (two sweeps of softmax and linear at one n: the same problem comes back).
# Point 0, A: 10 ms a call, quiet (foreign 0, 2 threads on 2 cores: no slowdown), 1 s of wall clock
#   → its calls 0.01 + 0.03 = 0.04 s, overhead 0.96 s.
# Point 1, B: 20 ms a call, 3 samples retaken (r = 1), another program on 1 core (slowdown (2 + 1) / 2 = 1.5), 2 s
#   → its calls 0.02 + 0.06·2 = 0.14 s, overhead 1.86 s; mean overhead (0.96 + 1.86) / 2 = 1.41 s.
# Left: A at 10 ms × 1.5 (its quiet speed, slowed now) = 15 ms, B at 20 ms (measured under this load); retakes so far
# 3 of 6 kept samples, r = 0.5:
#   A 0.015 + 0.045·1.5 = 0.0825, B 0.02 + 0.06·1.5 = 0.11, plus 2 × 1.41 → 3.0125 s.
# Without retakes (r = 0): 0.015 + 0.045 + 0.02 + 0.06 + 2.82 = 2.96 s.
POINTS = (Scripted(median_s=0.01, wall_s=1.0), Scripted(median_s=0.02, wall_s=2.0, retaken=3, foreign_cpu=1.0))


@pytest.mark.parametrize("budget_s, eta, text", [
    (None, 3.0125, "the machine is busy: about 3 s left"),
    (100.0, 3.0125, "the machine is busy: about 3 s left"),  # 97 s of budget left: the forecast stands
    (2.0, 2.96, "the machine is busy: about 3 s left"),  # spent: the points left, once each, without retakes
])
def test_the_eta_counts_retakes_and_the_foreign_load_and_says_the_machine_is_busy(monkeypatch, budget_s, eta, text):
    monkeypatch.setattr(os, "cpu_count", lambda: 2)
    clock, seen = Clock(), {}
    config = sweep(("softmax", "linear"), ns=(32,), point_budget_s=30.0)
    job = Job("eta", (config, config), clock=clock, keep=False, budget_s=budget_s)
    fake = FakeWorker(clock, lambda i, p, s, share: POINTS[i] if i < 2 else POINTS[0],
                      on_point=lambda i: seen.setdefault(i, job.progress))
    job._workers = lambda: fake
    run(job)
    assert seen[0].eta_s is None and seen[0].eta_text == "measuring the first point…"  # never "about 1 s"
    assert seen[2].done == 2 and seen[2].busy and seen[2].eta_s == pytest.approx(eta)
    assert seen[2].eta_text == text
    assert seen[1].eta_text.startswith("about ")  # after a quiet first point: no word of a busy machine


def test_time_samples_past_its_share_keeps_disturbed_samples_without_retakes_or_waits(monkeypatch):
    """`until` already passed: every sample is disturbed, none is retaken, no quiet is waited for, and the point
    ends at its 3 samples, flagged disturbed and late."""
    waits = []
    monkeypatch.setattr(loop, "wait_for_quiet", lambda *args: waits.append(args))
    monkeypatch.setattr(loop, "time", FakeClock())
    timing = time_samples(lambda: None, "cpu", Settings(warmup=1, min_repeats=3, min_time_s=1e9),
                          probe=FakeProbe([True] * 100), until=0.0)
    assert (timing.retaken, len(timing.samples), timing.disturbed, timing.late) == (0, 3, True, True)
    assert waits == []


def test_a_queued_job_promises_no_first_point():
    """Queued behind another: no time and no 'measuring' line (the queue line says where it stands)."""
    job = Job("queued", (sweep(("softmax",), ns=(32,)),), keep=False)
    assert job.progress.eta_text == "" and job.progress.eta_s is None


def test_the_server_gives_a_demo_its_announced_seconds_as_its_budget_and_any_other_sweep_none(monkeypatch):
    from attn_core.engine import presets, server

    asked = {}
    monkeypatch.setattr(server.Job, "measure", classmethod(lambda cls, name, configs, **kw: asked.setdefault(name, kw)))
    for name in ("Quick demo", "One cache, four sizes", "my own sweep"):
        server.submit(name, (), "session")
    assert asked["Quick demo"]["budget_s"] == presets.QUICK_DEMO.seconds is not None
    assert asked["One cache, four sizes"]["budget_s"] == presets.PRESETS["One cache, four sizes"].seconds is not None
    assert asked["my own sweep"]["budget_s"] is None
