"""Reformer's LSH attention on this machine: time and peak-memory slopes over n, and its speed beside
reformer-pytorch 1.4.4's LSHAttention at the same bucket size, rounds and causal flag, interleaved.

    python -m attn_core.benchmarks.reformer             # B=1, H=8, D=64, fp32, forward, 2 threads
    python -m attn_core.benchmarks.reformer --causal    # the causal form too

Slopes: the measurement engine (warm-up, repeats, samples disturbed by other processes set aside) at n = 4096 …
32768; target time slope ≤ 1.25. Peer: `pip install reformer-pytorch==1.4.4`; both get their inputs built
outside the timed call, ours its rotations too (the peer draws its own inside each call, (1, D, rounds, n/128)
numbers), and run A B A B … in one process; a ratio below 1 means ours is faster.
"""
from __future__ import annotations

import argparse
import math

import torch

from .. import MECHANISMS
from . import interleaved, point, ratio_verdict, ratios, spread
from .runner import Benchmark, Figure, Machine, run
from ..engine.analysis import fit_slopes, loglog_slope
from ..engine.measure import format_bytes
from ..engine.problem import Problem, Settings
from ..engine.results import frame_from_rows
from ..spec import Shape

TARGET_TIME_SLOPE, TARGET_RATIO = 1.25, 1.0


def slopes(args: argparse.Namespace) -> list[Figure]:
    settings = Settings(warmup=1, min_repeats=args.repeats, min_time_s=0.0, point_budget_s=args.budget,
                        threads=args.threads)
    params = (("bucket_size", args.bucket_size), ("n_hashes", args.n_hashes))
    rows = []
    for causal in (False, True) if args.causal else (False,):
        for n in args.slope_n:
            row, _ = point(Problem(mechanism="reformer", params=params, n=n, heads=args.heads,
                                   d_model=args.heads * args.head_dim, device="cpu", causal=causal), settings)
            rows.append(row)
            print(f"  {'causal' if causal else 'full  '} n={n:6d} {row['status']:8s} "
                  f"{row['time_median_s'] * 1e3:9.1f} ms (IQR {row['time_iqr_s'] * 1e3:.1f})  "
                  f"peak {format_bytes(row['peak_bytes']):>10s}  predicted {format_bytes(row['predicted_bytes']):>10s}"
                  f"  {row['reason']}", flush=True)
    df, figures = frame_from_rows(rows), []
    for causal in sorted(set(df.causal)):
        part = df[(df.causal == causal) & (df.status == "ok")]
        t, m = fit_slopes(part, "time_median_s").iloc[0], fit_slopes(part, "peak_bytes").iloc[0]
        label = f"slopes{' (causal)' if causal else ''}, n {part.n.min()}–{part.n.max()}"
        if math.isnan(t.slope):  # every point disturbed by other processes: the slope of them all, said so
            t_slope = loglog_slope(part.n, part.time_median_s)
            note = f"all {len(part)} points disturbed by other processes: fitted anyway, read with care"
        else:
            t_slope, note = t.slope, f"{t.disturbed} disturbed points left out"
        verdict = "meets" if t_slope <= TARGET_TIME_SLOPE else "MISSES"
        print(f"  {label}: time {t_slope:.2f}, memory {m.slope:.2f} ({verdict} the time target ≤ "
              f"{TARGET_TIME_SLOPE}; {note})")
        figures += [Figure.slope(f"time {label}", t_slope, TARGET_TIME_SLOPE), Figure.slope(f"memory {label}", m.slope)]
    return figures


def peer_ratios(args: argparse.Namespace) -> list[Figure]:
    try:
        from reformer_pytorch.reformer_pytorch import LSHAttention
    except ImportError:
        print("  reformer-pytorch is not installed (pip install reformer-pytorch==1.4.4): the side-by-side "
              "comparison is skipped.")
        return []
    fn, figures = MECHANISMS["reformer"].fn, []
    for causal in (False, True) if args.causal else (False,):
        peer = LSHAttention(bucket_size=args.bucket_size, n_hashes=args.n_hashes, causal=causal)
        for n in args.peer_n:
            g = torch.Generator().manual_seed(n)
            q, v = (torch.randn(1, args.heads, n, args.head_dim, generator=g) for _ in range(2))
            state = MECHANISMS["reformer"].state.init(Shape.of(q, q, causal), seed=0, bucket_size=args.bucket_size,
                                                      n_hashes=args.n_hashes)
            qk2, v2 = q.view(args.heads, n, args.head_dim), v.view(args.heads, n, args.head_dim)

            def ours():
                fn(q, q, v, causal=causal, bucket_size=args.bucket_size, n_hashes=args.n_hashes, **state)

            def theirs():
                peer(qk2, v2)

            times = interleaved({"ours": ours, "peer": theirs}, args.rounds)
            a, b = times["ours"], times["peer"]
            print(f"  {'causal' if causal else 'full  '} n={n:6d}  ours {spread(a, 1e3, '.1f')} ms  peer "
                  f"{spread(b, 1e3, '.1f')} ms  ratio ours/peer, median of pairs: "
                  f"{ratio_verdict(ratios(a, b), TARGET_RATIO)}", flush=True)
            where = f"{'causal' if causal else 'full'}, n = {n}"
            figures += [Figure.of(f"ours seconds per call, {where}", a),
                        Figure.of(f"peer seconds per call, {where}", b),
                        Figure.judged(f"ours/peer, {where}", ratios(a, b), TARGET_RATIO)]
    return figures


def options(p: argparse.ArgumentParser) -> None:
    p.add_argument("--heads", type=int, default=8)
    p.add_argument("--head-dim", type=int, default=64)
    p.add_argument("--bucket-size", type=int, default=64)
    p.add_argument("--n-hashes", type=int, default=4)
    p.add_argument("--causal", action="store_true", help="measure the causal form as well")
    p.add_argument("--slope-n", type=int, nargs="+", default=[4096, 8192, 16384, 32768])
    p.add_argument("--peer-n", type=int, nargs="+", default=[4096, 8192, 16384])
    p.add_argument("--repeats", type=int, default=3, help="minimum timed samples per point of the slopes")
    p.add_argument("--budget", type=float, default=120.0, help="seconds per point of the slopes")
    p.add_argument("--skip-slopes", action="store_true")
    p.add_argument("--skip-peer", action="store_true")


def measure(args: argparse.Namespace) -> list[Figure]:
    figures = []
    if not args.skip_slopes:
        print("Time (median of the engine's samples) and peak memory (profiler) over n:")
        figures += slopes(args)
    if not args.skip_peer:
        print("\nSide by side with reformer-pytorch's LSHAttention, interleaved:")
        figures += peer_ratios(args)
    return figures


BENCHMARK = Benchmark(
    "reformer", "Reformer's LSH attention: time and memory slopes, and its speed beside reformer-pytorch's, "
    "interleaved (--rounds: calls of each side per n).", measure, options,
    setting=lambda args: f"B=1, H={args.heads}, D={args.head_dim}, float32, forward, bucket_size={args.bucket_size}, "
                         f"n_hashes={args.n_hashes}",
    machine=Machine(threads=2, devices=("cpu",), rounds=5, clocks=("wall",)), doc=__doc__)


def main(argv: list[str] | None = None) -> int:
    return run(BENCHMARK, argv)


if __name__ == "__main__":
    raise SystemExit(main())
