"""A measuring worker for the engine's Job without a process, torch calls or a real clock: each point costs what the
test says, on a clock the test owns, and comes back as the test scripts it (its median, its retakes, the foreign
load, disturbed or not). What the job asked of each point (its share of a budget) is recorded."""
from __future__ import annotations

import dataclasses
from typing import Callable

from attn_core.engine import measure as measure_module
from attn_core.engine.measurement import Conditions, Summary, theory_of, unmeasured
from attn_core.engine.worker import Outcome


class Clock:
    """Seconds that pass only when a fake point says so."""

    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


@dataclasses.dataclass(frozen=True)
class Scripted:
    """One point as the fake measures it: seconds a call, its wall-clock cost, samples retaken for contention, the
    cores other programs used, whether it stayed disturbed."""

    median_s: float
    wall_s: float
    retaken: int = 0
    foreign_cpu: float = 0.0
    disturbed: bool = False


class FakeWorker:
    """Worker's interface (wait_ready, environment, measure). `script(index, problem, settings, share)` says how
    point `index` goes; `on_point(index)` runs before it is measured (to read the job's progress then)."""

    def __init__(self, clock: Clock, script: Callable, device_gflops: float = 10.0, threads: int = 2,
                 on_point: Callable[[int], None] = lambda index: None) -> None:
        self.clock, self.script, self.on_point = clock, script, on_point
        self.device_gflops, self.threads = device_gflops, threads
        self.shares: list[float] = []
        self.registry = measure_module.resolve_mechanisms(())

    def wait_ready(self, timeout: float = 0.0, cancelled: Callable[[], bool] = lambda: False) -> dict:
        return {"pid": 0, "threads": self.threads, "kernels": "none"}

    def environment(self, device: str, dtype: str, threads: int | None) -> dict:
        return {"device": device, "dtype": dtype, "device_gflops": self.device_gflops}

    def measure(self, problem, settings, extra, *, limit_s: float, cancelled, wall_s: float = float("inf")) -> Outcome:
        index = len(self.shares)
        self.on_point(index)
        self.shares.append(wall_s)
        plan: Scripted = self.script(index, problem, settings, wall_s)
        self.clock.now += plan.wall_s
        spec = self.registry[problem.mechanism]
        theory = theory_of(spec, problem)
        samples = (plan.median_s,) * settings.min_repeats
        point = dataclasses.replace(
            unmeasured(spec, problem, "ok"), samples=samples,
            summary=Summary(plan.median_s, 0.0, len(samples), theory.executed_flops / plan.median_s / 1e9),
            conditions=Conditions(float(self.threads), self.device_gflops, "", plan.foreign_cpu, 3.0, plan.disturbed,
                                  plan.retaken))
        return Outcome(point, plan.wall_s)
