"""The sliding window, Longformer and BigBird as the sequence grows: time and peak-memory slopes from n = 4096 to
32768, and their speed-up over PyTorch's fused exact kernel (`sdpa`) at n = 16384, every figure from interleaved
calls (A B A B …, so a busy spell of the machine hits all lines alike), median with its spread.

    python -m attn_core.benchmarks.window            # B=1, H=8, D=64, fp32, forward, 2 threads
    python -m attn_core.benchmarks.window --quick    # n = 1024…4096, sdpa at 4096, for a first look

Settings of the comparison: the sliding window with 256 keys each side (target ≥ 20× sdpa at 16384; the others
≥ 8×); Longformer with a window of 256 keys each side and 2 global tokens; BigBird with blocks
of 64 and a window of 9 blocks (its own and 4 = 256 tokens each side), 2 global blocks and 3 random blocks.
"""
from __future__ import annotations

import argparse

from .. import MECHANISMS
from . import forward_call, interleaved, powers, median, ratio_verdict, ratios, spread
from .runner import Benchmark, Figure, Machine, run
from ..engine import env
from ..engine.analysis import loglog_slope
from ..engine.measure import format_bytes
from ..spec import Shape

LINES = {"sliding_window": {"window": 256},
         "longformer": {"window": 256, "global_tokens": 2},
         "bigbird": {"block": 64, "window_blocks": 9, "global_blocks": 2, "random_blocks": 3}}
BASELINE = "sdpa"
TARGET_SLOPE, TARGET_SPEEDUP = 1.15, 8.0
SPEEDUP = {"sliding_window": 20.0}  # issue 29: the sliding window (w = 256) at least 20× sdpa at n = 16384


def slopes(args: argparse.Namespace) -> list[Figure]:
    ns = powers(args.n_min, args.n_max)
    method, peak_of = env.peak_memory_probe(args.device)
    times: dict[str, list[float]] = {key: [] for key in LINES}
    peaks: dict[str, list[float]] = {key: [] for key in LINES}
    print(f"Time ({args.clock} clock): median (IQR, min–max) of {args.rounds} interleaved calls; memory: peak bytes "
          f"above the inputs ({method}), beside the spec's prediction.")
    for n in ns:
        calls = {key: forward_call(key, n, args, params) for key, params in LINES.items()}
        samples = interleaved(calls, args.rounds, args.device, args.clock)
        for key, call in calls.items():
            env.release_cached_memory(args.device)
            peak = float(peak_of(call))
            predicted = MECHANISMS[key].cost.memory_bytes(
                Shape(args.batch, args.heads, n, n, args.head_dim, dtype="float32", causal=args.causal), **LINES[key])
            times[key].append(median(samples[key]))
            peaks[key].append(peak)
            print(f"  {key:14s} n={n:6d}  {spread(samples[key], 1e3, '.3g'):>34s} ms   "
                  f"peak {format_bytes(peak):>10s} (spec {format_bytes(predicted)})", flush=True)
    print(f"\nLog-log slopes, n = {ns[0]}…{ns[-1]} (target ≤ {TARGET_SLOPE} each):")
    figures = []
    for key in LINES:
        t, m = loglog_slope(ns, times[key]), loglog_slope(ns, peaks[key])
        verdict = "meets target" if t <= TARGET_SLOPE and m <= TARGET_SLOPE else "MISSES target"
        print(f"  {key:14s} time {t:5.2f}   memory {m:5.2f}   {verdict}")
        figures += [Figure.slope(f"{key} {what} slope, n = {ns[0]}…{ns[-1]}", value, TARGET_SLOPE)
                    for what, value in (("time", t), ("memory", m))]
    return figures


def versus_baseline(args: argparse.Namespace) -> list[Figure]:
    n = args.compare_n
    calls = {key: forward_call(key, n, args, params) for key, params in LINES.items()}
    calls[BASELINE] = forward_call(BASELINE, n, args)
    samples = interleaved(calls, args.compare_rounds, args.device, args.clock)
    base = samples[BASELINE]
    print(f"\nAt n = {n}, {args.compare_rounds} interleaved rounds: seconds per call, median (IQR, min–max); "
          f"speed-up over {BASELINE} as the median (IQR, min–max) of each round's ratio:")
    print(f"  {BASELINE:14s} {spread(base, fmt='.3g'):>34s} s")
    for key in LINES:
        print(f"  {key:14s} {spread(samples[key], fmt='.3g'):>34s} s   "
              f"{ratio_verdict(ratios(base, samples[key]), SPEEDUP.get(key, TARGET_SPEEDUP), at_most=False)}")
    return [*(Figure.of(f"{key} seconds per call, n = {n}", samples[key]) for key in samples),
            *(Figure.judged(f"speed-up of {key} over {BASELINE}, n = {n}", ratios(base, samples[key]),
                            SPEEDUP.get(key, TARGET_SPEEDUP), at_most=False) for key in LINES)]


def options(p: argparse.ArgumentParser) -> None:
    p.add_argument("--n-min", type=int, default=4096)
    p.add_argument("--n-max", type=int, default=32768)
    p.add_argument("--compare-n", type=int, default=16384)
    p.add_argument("--batch", type=int, default=1)
    p.add_argument("--heads", type=int, default=8)
    p.add_argument("--head-dim", type=int, default=64)
    p.add_argument("--causal", action="store_true")
    p.add_argument("--compare-rounds", type=int, default=3, help="interleaved rounds of the sdpa comparison")
    p.add_argument("--quick", action="store_true", help="n = 1024…4096, the comparison at 4096")


def settle(args: argparse.Namespace) -> None:
    if args.quick:
        args.n_min, args.n_max, args.compare_n = 1024, 4096, 4096


def measure(args: argparse.Namespace) -> list[Figure]:
    for key, params in LINES.items():
        print(f"  {key}: {', '.join(f'{k}={v}' for k, v in params.items())}")
    return [*slopes(args), *versus_baseline(args)]


BENCHMARK = Benchmark(
    "window", "The sliding window, Longformer and BigBird: time and memory slopes, and their speed-up over sdpa.",
    measure, options, settle,
    lambda args: f"B={args.batch}, H={args.heads}, D={args.head_dim}, fp32, "
                 f"forward{', causal' if args.causal else ''}.",
    Machine(threads=2, rounds=5), __doc__)


def main(argv: list[str] | None = None) -> int:
    return run(BENCHMARK, argv)


if __name__ == "__main__":
    raise SystemExit(main())
