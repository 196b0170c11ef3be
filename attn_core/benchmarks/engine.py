"""How far the measurement engine can be trusted on this machine, in four printed figures:

1. measured CPU peak memory against each spec's prediction (softmax, sdpa, sliding_window at n = 1024 … 8192);
2. repeatability: two back-to-back sweeps, every point of 10 ms or more within 10%;
3. harness overhead: the engine's per-call time against a bare timed loop of the same call (≤ 5%);
4. the default dashboard sweep (DEFAULT_SWEEP) completing within 15 s, with the worker pre-started.

    python -m attn_core.benchmarks.engine            # all four
    python -m attn_core.benchmarks.engine --quick    # smaller n for the memory check, one overhead case
"""
from __future__ import annotations

import argparse
import time

import torch

from .. import MECHANISMS
from . import alternate, median
from .runner import Benchmark, Figure, Machine, run
from ..engine import env, worker
from ..engine.measure import call_of, format_bytes, make_state
from ..engine.config import DEFAULT_SWEEP, SweepConfig
from ..engine.job import Job, run_sweep
from ..engine.problem import Problem, Settings
from ..engine.timing import time_samples

MEMORY_MECHANISMS = ("softmax", "sdpa", "sliding_window")
MEMORY_TOLERANCE, REPEAT_TOLERANCE, REPEAT_MIN_S, OVERHEAD_LIMIT, DEFAULT_LIMIT_S = 0.05, 0.10, 0.010, 0.05, 15.0


def check_memory(ns: tuple[int, ...]) -> tuple[bool, list[Figure]]:
    """Peak bytes above the inputs (torch.profiler, CPU allocator) against spec.cost.memory_bytes: whether all are
    within the tolerance, and each error."""
    config = SweepConfig(mechanisms=tuple((m, {}) for m in MEMORY_MECHANISMS), ns=ns,
                         problem=Problem(heads=8, d_model=512),
                         settings=Settings(warmup=1, min_repeats=1, min_time_s=0.0, point_budget_s=120.0))
    df = run_sweep(config)
    print(f"\n1. Peak memory vs spec prediction (B=1, H=8, D=64, fp32, forward; target ±{MEMORY_TOLERANCE:.0%})")
    print(f"   {'mechanism':<16}{'n':>6}  {'measured':>11}  {'predicted':>11}  {'error':>8}")
    good, figures = True, []
    for _, r in df.iterrows():
        if r["status"] != "ok":
            print(f"   {r['mechanism']:<16}{r['n']:>6}  {r['status']}: {r['reason']}")
            good = False
            continue
        error = r["peak_bytes"] / r["predicted_bytes"] - 1
        good &= abs(error) <= MEMORY_TOLERANCE
        flag = "" if abs(error) <= MEMORY_TOLERANCE else "  OFF"
        print(f"   {r['mechanism']:<16}{r['n']:>6}  {format_bytes(r['peak_bytes']):>11}  "
              f"{format_bytes(r['predicted_bytes']):>11}  {error:>+8.2%}{flag}")
        figures.append(Figure(f"peak memory over the spec's prediction − 1, {r['mechanism']}, n = {r['n']}", error,
                              "share", target=f"within ±{MEMORY_TOLERANCE:g}", meets=abs(error) <= MEMORY_TOLERANCE))
    print(f"   method: {df['memory_method'].iloc[0]}")
    return good, figures


def timed_sweep(config: SweepConfig) -> tuple[float, "object"]:
    """(wall seconds from start to the last row, frame) of one sweep on the warm worker."""
    began = time.perf_counter()
    run = Job.measure("timed sweep", (config,))
    run.wait()
    if run.error:
        raise RuntimeError(run.error)
    return time.perf_counter() - began, run.frame()


def repeatability(a, b, title: str) -> tuple[bool, Figure]:
    """Print how well two sweeps agree on every point of ≥ 10 ms; True when all are within 10%, and the largest
    difference."""
    keys = ["mechanism", "n"]
    both = a[keys + ["time_median_s"]].merge(b[keys + ["time_median_s"]], on=keys, suffixes=("_a", "_b"))
    both = both[both[["time_median_s_a", "time_median_s_b"]].min(axis=1) >= REPEAT_MIN_S]
    both["diff"] = (both["time_median_s_b"] / both["time_median_s_a"] - 1).abs()
    worst = both.sort_values("diff", ascending=False)
    bad = worst[worst["diff"] > REPEAT_TOLERANCE]
    print(f"\n2. Repeatability, {title}: {len(both)} points of ≥ 10 ms, {len(both) - len(bad)} within "
          f"{REPEAT_TOLERANCE:.0%}; median difference {both['diff'].median():.1%}, largest {worst['diff'].max():.1%}")
    for _, r in worst.head(3).iterrows():
        print(f"   {r['mechanism']:<16}{r['n']:>6}  {r['time_median_s_a'] * 1e3:9.2f} ms  "
              f"{r['time_median_s_b'] * 1e3:9.2f} ms  {r['diff']:6.1%}")
    return bad.empty, Figure(f"largest difference between two runs, {title}", worst["diff"].max(), "share",
                             target=f"≤ {REPEAT_TOLERANCE:g} on every point of ≥ 10 ms", meets=bad.empty)


def check_default_and_repeatability() -> tuple[dict[str, bool], list[Figure]]:
    """The default dashboard sweep twice, back to back (its wall time, and how well the two agree); then the same
    points twice with the engine's standard timing (≥ 5 samples and ≥ 0.2 s per point), time only."""
    worker.prestart().wait_ready()
    first_s, a = timed_sweep(DEFAULT_SWEEP)
    second_s, b = timed_sweep(DEFAULT_SWEEP)
    print(f"\n4. Default dashboard sweep ({len(DEFAULT_SWEEP.mechanisms)} mechanisms × n = "
          f"{', '.join(map(str, DEFAULT_SWEEP.ns))}, {len(a)} points, worker pre-started; target ≤ "
          f"{DEFAULT_LIMIT_S:.0f} s): {first_s:.1f} s, then {second_s:.1f} s; statuses "
          f"{dict(a['status'].value_counts())}")
    short, short_figure = repeatability(a, b, "two back-to-back default sweeps (3 samples per point)")
    standard = DEFAULT_SWEEP.replaced(min_repeats=Settings.min_repeats, min_time_s=Settings.min_time_s,
                                      measure_memory=False)
    c, d = timed_sweep(standard)[1], timed_sweep(standard)[1]
    s = standard.settings
    long, long_figure = repeatability(c, d, f"the same points with standard timing (≥ {s.min_repeats} samples, "
                                            f"≥ {s.min_time_s} s per point)")
    figures = [Figure(f"default dashboard sweep seconds, {which}", seconds, "s", target=f"≤ {DEFAULT_LIMIT_S:g}",
                      meets=seconds <= DEFAULT_LIMIT_S)
               for which, seconds in (("first", first_s), ("second", second_s))]
    return ({"default sweep ≤ 15 s": first_s <= DEFAULT_LIMIT_S, "repeatability (default timing)": short,
             "repeatability (standard timing)": long}, [*figures, short_figure, long_figure])


def check_overhead(cases: list[tuple[str, int]], rounds: int = 15) -> tuple[bool, list[Figure]]:
    """Engine (time_samples: per-sample synchronisation, clock reads, contention counters, cancel and budget checks) against a bare loop
    of the same thunk, interleaved round by round so drift of the machine hits both alike. Competing programs only
    add time, so the ratio of the fastest rounds is printed beside the ratio of the medians; the target is judged
    on the medians."""
    settings, timed = Settings(warmup=1, min_repeats=5, min_time_s=0.0), env.device_timer("cpu")
    print(f"\n3. Harness overhead vs a bare timed loop (same process, same thunk, interleaved {rounds} rounds; "
          f"target ≤ {OVERHEAD_LIMIT:.0%})")
    good, found = True, []
    for key, n in cases:
        problem = Problem(mechanism=key, n=n, batch=1, heads=8, d_model=512, device="cpu")
        spec = MECHANISMS[key]
        thunk = call_of(spec, problem, *problem.inputs(), state=make_state(spec, problem))
        calls = {"samples": 0}  # the bare loop makes as many calls as the engine's round just timed

        def engine_round() -> float:
            samples = time_samples(thunk, "cpu", settings).samples
            calls["samples"] = len(samples)
            return median(samples)

        def bare_round() -> float:  # the simplest honest timing: one warm call, then the calls between two clock reads
            thunk()
            return timed(thunk, calls["samples"]) / calls["samples"]

        with torch.inference_mode():
            figures = alternate({"engine": engine_round, "bare": bare_round}, rounds)
        engine_t, bare_t = figures["engine"], figures["bare"]
        e, b = median(engine_t), median(bare_t)
        good &= e / b - 1 <= OVERHEAD_LIMIT
        print(f"   {key:<16}{n:>6}  engine {e * 1e3:9.3f} ms  bare {b * 1e3:9.3f} ms  overhead {e / b - 1:+6.1%}"
              f"   (fastest rounds: {min(engine_t) * 1e3:.3f} vs {min(bare_t) * 1e3:.3f} ms, "
              f"{min(engine_t) / min(bare_t) - 1:+.1%})")
        found.append(Figure(f"harness overhead, {key}, n = {n}", e / b - 1, "share", target=f"≤ {OVERHEAD_LIMIT:g}",
                            meets=e / b - 1 <= OVERHEAD_LIMIT))
    return good, found


def options(p: argparse.ArgumentParser) -> None:
    p.add_argument("--quick", action="store_true", help="n = 1024 … 4096 for memory, one overhead case")


def measure(args: argparse.Namespace) -> list[Figure]:
    worker.prestart()
    ns = (1024, 2048, 4096) if args.quick else (1024, 2048, 4096, 8192)
    good, figures = check_memory(ns)
    results = {"memory": good}
    met, found = check_default_and_repeatability()
    results.update(met)
    cases = [("softmax", 1024)] if args.quick else [("softmax", 1024), ("sdpa", 1024), ("sliding_window", 2048),
                                                   ("linear", 4096)]
    results["overhead"], overhead = check_overhead(cases, args.rounds)
    print(", ".join(f"{k}: {'met' if v else 'NOT met'}" for k, v in results.items()))
    worker.shutdown()
    return [*figures, *found, *overhead]


BENCHMARK = Benchmark(
    "engine", "How far the measurement engine can be trusted here: memory against the specs, repeatability, harness "
    "overhead, the default sweep's time.", measure, options,
    setting=lambda args: "other work on the machine distorts timings",
    machine=Machine(threads=None, devices=("cpu",), rounds=15, clocks=("wall",)), doc=__doc__)


def main(argv: list[str] | None = None) -> int:
    return run(BENCHMARK, argv)


if __name__ == "__main__":
    raise SystemExit(main())
