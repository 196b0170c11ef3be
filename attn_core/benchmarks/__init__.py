"""Benchmark scripts: they print their figures; performance is never asserted in tests."""
from __future__ import annotations

import time
from typing import Callable

import torch

from ..mechanisms._common import validated

CLOCKS = {"wall": time.perf_counter, "cpu": time.process_time}  # cpu: this process's CPU seconds, all threads


def interleaved(calls: dict[str, Callable[[], object]], rounds: int,
                clock: Callable[[], float] = time.perf_counter) -> dict[str, list[float]]:
    """Seconds per call of each contestant, one call of each per round in turn (A B A B …: a drift of the machine
    hits all alike), after one untimed call each; forward only, our kernels trusting their checked arguments, as the
    engine times them. `clock`: wall time, or CPU time (CLOCKS['cpu']), which waiting for a busy core does not
    inflate."""
    times: dict[str, list[float]] = {name: [] for name in calls}
    with torch.inference_mode(), validated():
        for call in calls.values():
            call()
        for _ in range(rounds):
            for name, call in calls.items():
                start = clock()
                call()
                times[name].append(clock() - start)
    return times
