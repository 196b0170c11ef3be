"""Efficiency of every mechanism on this machine: time, allocator-level peak memory, log-log slopes, and the share
of the device's own matmul throughput, all measured in one run.

    python -m attn_core.benchmarks.mechanisms            # B=1, H=8, D=64, fp32, forward, 2 threads, n = 1024…32768
    python -m attn_core.benchmarks.mechanisms --quick    # n = 512…4096, for a first look
    python -m attn_core.benchmarks.mechanisms --mechanisms linear --n-min 4096 --n-max 16384 --rounds 5
                                                         # the sizes interleaved five times over: steadier slopes
"""
from __future__ import annotations

import argparse
import math
import sys

import torch

from .. import MECHANISMS
from . import point, powers
from .runner import Benchmark, Figure, Machine, run
from ..engine import env
from ..engine.analysis import fit_slopes
from ..engine.measure import format_bytes
from ..engine.measurement import unmeasured
from ..engine.problem import Problem, Settings
from ..engine.results import frame_from_rows
from attn_core.engine.files import write_atomic
from attn_core.engine.untrusted import csv_bytes

EFFICIENT = {"local": {}, "sliding_window": {"window": 256}, "linformer": {"rank": 256},
             "performer": {"features": 256}, "linear": {}}
TARGET_TIME_SLOPE, TARGET_MEMORY_SLOPE = 1.15, 1.1


def lines(args: argparse.Namespace) -> list[tuple[str, dict, bool]]:
    """(mechanism, params, causal) for every mechanism at its defaults (the efficient ones at the issue's settings),
    and the causal variant of every mechanism that has one."""
    out = []
    for key, spec in MECHANISMS.items():
        params = {**spec.defaults, **EFFICIENT.get(key, {})}
        out += [(key, params, causal) for causal in (False, True) if not causal or spec.supports.causal]
    return [line for line in out if not args.mechanisms or line[0] in args.mechanisms.split(",")]


def measure(args: argparse.Namespace):
    """Each line's sizes in turn, `--rounds` times over (A B C A B C …: a drift of the machine's speed during the run
    falls on every size alike instead of on the larger ones, which come last), each size's figure its round of the
    median time. A size that took longer than the budget skips the larger ones of its line from then on."""
    settings = Settings(warmup=1, min_repeats=args.repeats, min_time_s=args.min_time, point_budget_s=args.budget,
                        threads=args.threads)
    ns = powers(args.n_min, args.n_max)
    rounds = args.rounds or 1
    rows = []
    for key, params, causal in lines(args):
        problems = {n: Problem(mechanism=key, params=tuple(sorted(params.items())), n=n, heads=args.heads,
                               d_model=args.heads * args.head_dim, device="cpu", causal=causal) for n in ns}
        taken: dict[int, list[dict]] = {n: [] for n in ns}
        limit = None  # the smallest n of this line that took longer than the budget
        for turn in range(rounds):
            for n in ns:
                if limit is not None and n > limit:
                    continue
                row, took = point(problems[n], settings)
                taken[n].append(row)
                if took > args.budget:
                    limit = n if limit is None else min(limit, n)
                peak = "—" if math.isnan(row["peak_bytes"]) else format_bytes(row["peak_bytes"])
                print(f"  {key:15s} {'causal' if causal else '      '} n={n:6d} {row['status']:8s} "
                      f"{row['time_median_s'] * 1e3:10.2f} ms  {peak:>10s}  {row['reason']}"
                      f"{f'  (round {turn + 1})' if rounds > 1 else ''}", file=sys.stderr, flush=True)
        for n in ns:
            if taken[n]:
                ranked = sorted(taken[n], key=lambda r: (math.isnan(r["time_median_s"]), r["time_median_s"]))
                rows.append(ranked[(len(ranked) - 1) // 2])
            else:
                rows.append(unmeasured(MECHANISMS[key], problems[n], "skipped",
                                       f"a smaller n of this line took longer than the {args.budget:g} s budget")
                            .to_row())
    return frame_from_rows(rows)


def report(df, args) -> list[Figure]:
    ok = df[df.status == "ok"].copy()
    ok["line"] = ok.mechanism + ok.causal.map({True: " (causal)", False: ""})
    ok["ms"] = ok.time_median_s * 1e3
    ok["iqr_ms"] = ok.time_iqr_s * 1e3
    ok["peak_MiB"] = ok.peak_bytes / 2**20
    ok["predicted_MiB"] = ok.predicted_bytes / 2**20
    ok["GFLOP/s"] = ok.gflops
    ok["% matmul"] = ok.pct_of_device
    print(f"\nDevice: {env.device_name('cpu')}, {torch.get_num_threads()} threads, fp32 matmul "
          f"{env.matmul_gflops('cpu', 'float32'):.1f} GFLOP/s (measured in this run)")
    print("Memory: peak bytes allocated above the inputs, torch.profiler allocator events; time: median (IQR).\n")
    cols = ["line", "n", "ms", "iqr_ms", "peak_MiB", "predicted_MiB", "GFLOP/s", "% matmul"]
    print(ok[cols].to_string(index=False, float_format=lambda x: f"{x:.2f}"))
    figures = [Figure(f"{r.line} median seconds, n = {r.n}", r.time_median_s, "s", r.time_iqr_s, n=r.repeats)
               for r in ok.itertuples()]

    print(f"\nLog-log slopes from n = {args.slope_from} to the largest n measured "
          f"(targets for the efficient mechanisms: time ≤ {TARGET_TIME_SLOPE}, memory ≤ {TARGET_MEMORY_SLOPE}):")
    for causal in (False, True):
        part = ok[ok.causal == causal].assign(mechanism=lambda d: d.line)
        t = fit_slopes(part, "time_median_s", n_min=args.slope_from).set_index("mechanism")
        m = fit_slopes(part, "peak_bytes", n_min=args.slope_from).set_index("mechanism")
        for line in t.index:
            key = line.split(" ")[0]
            mark = ""
            if key in EFFICIENT:
                good = t.slope[line] <= TARGET_TIME_SLOPE and m.slope.get(line, 0) <= TARGET_MEMORY_SLOPE
                mark = "meets target" if good else "MISSES target"
            print(f"  {line:28s} time {t.slope[line]:5.2f}  memory {m.slope.get(line, float('nan')):5.2f}  "
                  f"(n {t.n_min[line]:.0f}–{t.n_max[line]:.0f})  {mark}")
            span = f"n = {t.n_min[line]:.0f}…{t.n_max[line]:.0f}"
            efficient = key in EFFICIENT
            figures += [Figure.slope(f"{line} time slope, {span}", t.slope[line],
                                     TARGET_TIME_SLOPE if efficient else None),
                        Figure.slope(f"{line} memory slope, {span}", m.slope.get(line, float("nan")),
                                     TARGET_MEMORY_SLOPE if efficient else None)]

    at = ok[(ok.n == args.compare_n) & ~ok.causal].set_index("mechanism")
    if {"sliding_window", "sdpa", "softmax"} <= set(at.index):
        sw, sd, sm = at.loc["sliding_window"], at.loc["sdpa"], at.loc["softmax"]
        print(f"\nAt n = {args.compare_n}: sliding_window (w=256) is {sd.ms / sw.ms:.1f}× faster than sdpa "
              f"(target ≥ 10×) and uses {sw.peak_bytes / sm.peak_bytes:.4f} of softmax's peak memory "
              f"(target < 0.01; {format_bytes(sw.peak_bytes)} vs {format_bytes(sm.peak_bytes)}).")
        figures += [Figure(f"speed-up of sliding_window over sdpa, n = {args.compare_n}", sd.ms / sw.ms, "×",
                           target="≥ 10", meets=sd.ms / sw.ms >= 10),
                    Figure(f"sliding_window peak over softmax's, n = {args.compare_n}", sw.peak_bytes / sm.peak_bytes,
                           "×", target="< 0.01", meets=sw.peak_bytes / sm.peak_bytes < 0.01)]
    low = ok[(ok.n >= 4096) & (ok["% matmul"] < 25)]
    if len(low):
        print("\nBelow 25% of the matmul throughput at n ≥ 4096:")
        for line, g in low.groupby("line"):
            print(f"  {line}: {g['% matmul'].min():.0f}–{g['% matmul'].max():.0f}%")
    return figures


def options(p: argparse.ArgumentParser) -> None:
    p.add_argument("--n-min", type=int, default=1024)
    p.add_argument("--n-max", type=int, default=32768)
    p.add_argument("--heads", type=int, default=8)
    p.add_argument("--head-dim", type=int, default=64)
    p.add_argument("--repeats", type=int, default=3, help="minimum timed samples per point")
    p.add_argument("--min-time", type=float, default=0.5, help="minimum seconds of timed samples per point")
    p.add_argument("--budget", type=float, default=60.0, help="seconds per point; larger n of a slower line skip")
    p.add_argument("--slope-from", type=int, default=4096)
    p.add_argument("--compare-n", type=int, default=16384)
    p.add_argument("--mechanisms", default="", help="comma-separated keys (default: all)")
    p.add_argument("--quick", action="store_true", help="n = 512…4096, slopes from 1024")
    p.add_argument("--csv", default="", help="also write the rows to this CSV file")


def settle(args: argparse.Namespace) -> None:
    if args.quick:
        args.n_min, args.n_max, args.slope_from, args.compare_n = 512, 4096, 1024, 4096


def body(args: argparse.Namespace) -> list[Figure]:
    df = measure(args)
    if args.csv:
        write_atomic(args.csv, csv_bytes(df))
    return report(df, args)


BENCHMARK = Benchmark(
    "mechanisms", "Every mechanism through the engine: time, peak memory, log-log slopes, share of the matmul "
    "throughput.", body, options, settle,
    lambda args: f"B=1, H={args.heads}, D={args.head_dim}, fp32, forward, through the measurement engine",
    Machine(threads=2, devices=("cpu",), rounds=1, clocks=("wall",)), __doc__)


def main(argv: list[str] | None = None) -> int:
    return run(BENCHMARK, argv)


if __name__ == "__main__":
    raise SystemExit(main())
