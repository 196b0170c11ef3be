"""Benchmark scripts: each a configuration over one runner (`runner.run`: the shared machine options, the header, its
figures written as data); they print their figures, and performance is never asserted in tests. What they share
lives here: interleaved timing through the engine's timer and statistics, ratios of calls timed side by side, and
the lines that open and close every printout. `python -m attn_core.benchmarks` lists them."""
from __future__ import annotations

import math
import time
from typing import Callable

import torch

from ..engine import env
from ..engine import measure
from ..engine.measurement import median_iqr
from ..engine.problem import Problem, Settings
from ..mechanisms import MECHANISMS
from ..mechanisms._common import validated
from ..spec import Shape

Timer = Callable[[Callable[[], object], int], float]  # (thunk, calls) → seconds for that many back-to-back calls
CLOCKS = ("wall", "cpu")


def cpu_seconds(thunk: Callable[[], object], calls: int) -> float:
    """This process's CPU seconds (all threads) over `calls` runs: waiting for a busy core does not inflate it."""
    start = time.process_time()
    for _ in range(calls):
        thunk()
    return time.process_time() - start


def timer(device: str, clock: str = "wall") -> Timer:
    """The engine's timer (env.device_timer: wall seconds, the device synchronized), or CPU seconds (clock='cpu')."""
    if clock not in CLOCKS:
        raise ValueError(f"clock {clock!r} is unknown; choose {' or '.join(CLOCKS)}")
    return env.device_timer(device) if clock == "wall" else cpu_seconds


def alternate(measures: dict[str, Callable[[], float]], rounds: int) -> dict[str, list[float]]:
    """Each measure once per round, in turn (A B A B …), so that a drift of the machine hits all alike."""
    figures: dict[str, list[float]] = {name: [] for name in measures}
    for _ in range(rounds):
        for name, take in measures.items():
            figures[name].append(take())
    return figures


def interleaved(calls: dict[str, Callable[[], object]], rounds: int, device: str = "cpu",
                clock: str = "wall") -> dict[str, list[float]]:
    """Seconds per call of each contestant, one call of each per round in turn (see `alternate`), after one untimed
    call each; forward only, our kernels trusting their checked arguments, as the engine times them (`timer`)."""
    timed = timer(device, clock)
    with torch.inference_mode(), validated():
        for call in calls.values():
            call()
        return alternate({name: (lambda call=call: timed(call, 1)) for name, call in calls.items()}, rounds)


def forward_call(key: str, n: int, args, params: dict | None = None,
                 causal: bool | None = None) -> Callable[[], object]:
    """One forward call of mechanism `key` with `params` on seeded fp32 inputs (args.batch, args.heads, n,
    args.head_dim) on args.device, causal as given (None: args.causal): its random state drawn outside, its
    arguments checked once here and trusted inside the call, as the engine does. `timer` synchronizes the device."""
    spec, params = MECHANISMS[key], params or {}
    causal = args.causal if causal is None else causal
    g = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(args.batch, args.heads, n, args.head_dim, generator=g).to(args.device) for _ in range(3))
    shape = Shape(args.batch, args.heads, n, n, args.head_dim, dtype="float32", causal=causal)
    spec.check(shape, params)
    state = {} if spec.state.init is None else spec.state.init(shape, args.device, torch.float32, seed=0, **params)

    def call():
        with torch.inference_mode(), validated():
            return spec.fn(q, k, v, causal=causal, **params, **state)

    return call


HEADROOM = 2 << 30  # bytes left free beside a contestant's predicted peak
GIB = float(1 << 30)


def room(key: str, shape: Shape, device: str, params: dict | None = None) -> str:
    """'' when mechanism `key`'s predicted peak at `shape` (its inputs, and its spec's memory above them) leaves
    HEADROOM of `device`'s free memory; else the sentence saying why it is skipped (the materialized softmax at
    n = 16384, H = 8 holds two n × n fp32 matrices, 16 GiB: a 24 GiB machine cannot spare them)."""
    need = shape.input_bytes + MECHANISMS[key].cost.memory_bytes(shape, **(params or {}))
    free = env.free_memory_bytes(device)
    if need < free - HEADROOM:
        return ""
    return (f"skipped: its spec's peak at n = {shape.Nq}, {'causal' if shape.causal else 'not causal'}, is "
            f"{need / GIB:.1f} GiB, which would not leave {HEADROOM / GIB:.0f} GiB of the {free / GIB:.1f} GiB free "
            f"on {device}; run on a machine with more memory, or lower --compare-n")


def powers(low: int, high: int) -> list[int]:
    """The powers of two from low to high (each rounded down to one): the sequence lengths of a scaling run."""
    return [2**e for e in range(int(math.log2(low)), int(math.log2(high)) + 1)]


def median(samples: list[float]) -> float:
    return median_iqr(samples)[0]


def spread(samples: list[float], scale: float = 1.0, fmt: str = ".2f") -> str:
    """'median (IQR i, min–max)' of the samples times `scale`: the engine's median and IQR, and the range."""
    med, iqr = median_iqr(samples)
    return (f"{med * scale:{fmt}} (IQR {iqr * scale:{fmt}}, {min(samples) * scale:{fmt}}–"
            f"{max(samples) * scale:{fmt}})")


def ratios(a: list[float], b: list[float]) -> list[float]:
    """a / b round by round: the two calls of a round ran side by side, so a busy moment weighs on both."""
    return [x / y for x, y in zip(a, b)]


def ratio_verdict(rounds: list[float], target: float, at_most: bool = True) -> str:
    """'0.83 (IQR …, …–…)×, meets ≤ 1': the per-round ratios' median and spread, judged against a target."""
    good = median(rounds) <= target if at_most else median(rounds) >= target
    return f"{spread(rounds)}×, {'meets' if good else 'MISSES'} {'≤' if at_most else '≥'} {target:g}"


def start(device: str, what: str) -> None:
    """The printout's first line: the device, threads, torch, the load average now (other programs inflate
    timings, so it is printed again at the end), and what is measured."""
    print(f"{env.device_name(device)}, {torch.get_num_threads()} threads, torch {torch.__version__}, load average "
          f"at the start {env.load_average()}; {what}", flush=True)


def end() -> None:
    print(f"\nload average at the end {env.load_average()}")


def point(problem: Problem, settings: Settings) -> tuple[dict, float]:
    """One point measured in this process by the engine, as its saved row, and the seconds it took."""
    measured, took = measure.measure(MECHANISMS[problem.mechanism], problem, settings)
    return measured.to_row(), took
