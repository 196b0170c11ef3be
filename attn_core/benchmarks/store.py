"""The run store's costs with 10,000 stored points: the Compare page's history read (open read-only, one row per
run; the target is under 200 ms), one run read back whole, a writer's open (its integrity check) and one point
committed (what a sweep pays per point). Prints figures; asserts nothing.

    python -m attn_core.benchmarks.store            # 10,000 points in 100 runs, 30 rounds
    python -m attn_core.benchmarks.store --quick    # the same points, 5 rounds
"""
from __future__ import annotations

import argparse
import os
import tempfile
import time
from dataclasses import replace
from typing import Callable

from . import median, spread
from .runner import Benchmark, Figure, Machine, run
from attn_core.engine import store

TARGET_S = 0.2  # the bound on the history read


def row(mechanism: str, n: int) -> dict:
    """A measured point of the saved schema, its figures made up."""
    t = 1e-9 * n * n
    return {"mechanism": mechanism, "label": mechanism, "exact": True, "params": "{}", "n": n, "batch": 1,
            "heads": 8, "kv_heads": 8, "d_model": 512, "head_dim": 64, "dtype": "float32", "device": "cpu",
            "mode": "forward", "causal": False, "padding": 0, "status": "ok", "reason": "", "time_median_s": t,
            "time_iqr_s": t / 10, "time_samples": [t] * 5, "repeats": 5, "peak_bytes": 4.0 * n * n,
            "memory_method": "torch.profiler", "predicted_bytes": 4.0 * n * n, "theory_flops": 4.0 * n * n * 64,
            "executed_flops": 4.0 * n * n * 64, "gflops": 10.0, "device_gflops": 100.0, "pct_of_device": 10.0,
            "sdpa_backend": "", "threads": 2.0, "foreign_cpu": 0.0, "load_average": 1.0, "disturbed": False,
            "retaken": 0}


def filled(path: str, runs: int, per_run: int) -> None:
    env = {"device_name": "a CPU", "cpu": "a CPU", "torch": "2.x"}
    with store.Store(path) as kept:
        for r in range(runs):
            run_id = kept.begin(env, {"ns": [256], "mechanisms": [["softmax", {}]]}, name=f"run {r}")
            kept.add_points(run_id, [row(("softmax", "sdpa", "linear", "local")[i % 4], 256 + i)
                                     for i in range(per_run)])
            kept.finish(run_id, "complete")


def timed(call: Callable[[], object], rounds: int) -> list[float]:
    call()  # the first, cold call is not counted
    samples = []
    for _ in range(rounds):
        t0 = time.perf_counter()
        call()
        samples.append(time.perf_counter() - t0)
    return samples


def history_read(path: str) -> None:
    with store.Store(path, readonly=True) as kept:
        kept.history()
        kept.size_bytes()


def options(p: argparse.ArgumentParser) -> None:
    p.add_argument("--points", type=int, default=10_000)
    p.add_argument("--runs", type=int, default=100)
    p.add_argument("--quick", action="store_true", help="5 rounds instead of 30")


def settle(args: argparse.Namespace) -> None:
    if args.quick:
        args.rounds = min(args.rounds, 5)


def measure(args: argparse.Namespace) -> list[Figure]:
    rounds = args.rounds
    with tempfile.TemporaryDirectory() as folder:
        path = os.path.join(folder, store.FILE_NAME)
        t0 = time.perf_counter()
        filled(path, args.runs, args.points // args.runs)
        print(f"filled in {time.perf_counter() - t0:.1f} s (one commit per run); the file holds "
              f"{os.path.getsize(path) / 2**20:.1f} MiB")
        history = timed(lambda: history_read(path), rounds)
        print(f"\nhistory read (open read-only, history(), size): {spread(history, 1e3)} ms; target under "
              f"{TARGET_S * 1e3:.0f} ms: {'met' if median(history) < TARGET_S else 'NOT met'}")
        with store.Store(path, readonly=True) as kept:
            one = timed(lambda: kept.run(args.runs // 2), rounds)
        print(f"one run of {args.points // args.runs} points read back whole: {spread(one, 1e3)} ms")
        opened = timed(lambda: store.Store(path).close(), rounds)
        print(f"a writer's open (integrity check included): {spread(opened, 1e3)} ms")
        with store.Store(path) as kept:
            run_id = kept.begin({}, {})
            commits = timed(lambda: kept.add_points(run_id, [row("softmax", 256)]), rounds)
        print(f"one point committed (synchronous, as a sweep does): {spread(commits, 1e3)} ms")
    where = f"{args.points} points in {args.runs} runs"
    return [replace(Figure.of(f"history read seconds, {where}", history), target=f"< {TARGET_S:g}",
                    meets=median(history) < TARGET_S),
            Figure.of(f"one run read back whole, seconds, {where}", one),
            Figure.of(f"a writer's open, seconds, {where}", opened),
            Figure.of(f"one point committed, seconds, {where}", commits)]


BENCHMARK = Benchmark(
    "store", "The run store's costs with 10,000 stored points: the history read, one run read back, a writer's "
    "open, one point committed.", measure, options, settle,
    lambda args: f"the run store with {args.points:,} points in {args.runs} runs, {args.rounds} rounds each",
    Machine(threads=None, devices=("cpu",), rounds=30, clocks=("wall",)), __doc__)


def main(argv: list[str] | None = None) -> int:
    return run(BENCHMARK, argv)


if __name__ == "__main__":
    raise SystemExit(main())
