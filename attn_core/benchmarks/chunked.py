"""Llama 4's chunked attention beside full causal attention: `local` with block = C and no blocks back or ahead
(queries see only their own chunk of C tokens, causal: masks.chunked(C)), each chunk one causal square for PyTorch's
fused kernel, against `sdpa` causal over all n keys, forward, interleaved calls (A B A B …), median with its spread
and the speed-up round by round. Target (issue 46): ≥ 5× at n = 65,536, C = 8,192 (the work is n·C/2 score cells
against n²/2: 8× fewer).

    python -m attn_core.benchmarks.chunked            # B=1, H=1, D=64, fp32, n = 65536, C = 8192, 2 threads: minutes
    python -m attn_core.benchmarks.chunked --quick    # n = 16384, C = 2048: a first look in seconds
"""
from __future__ import annotations

import argparse

from . import forward_call, interleaved, ratio_verdict, ratios, spread
from .runner import Benchmark, Figure, Machine, run

TARGET = 5.0  # sdpa's time over chunked's, at least


def options(p: argparse.ArgumentParser) -> None:
    p.add_argument("--n", type=int, default=65536, help="sequence length (tokens)")
    p.add_argument("--chunk", type=int, default=8192, help="tokens a chunk (Llama 4: 8192)")
    p.add_argument("--heads", type=int, default=1)
    p.add_argument("--head-dim", type=int, default=64)
    p.add_argument("--quick", action="store_true", help="n = 16384, C = 2048")


def settle(args: argparse.Namespace) -> None:
    if args.quick:
        args.n, args.chunk = 16384, 2048
    if args.chunk < 1 or args.n < args.chunk:
        raise ValueError(f"--chunk must be at least 1 and at most --n ({args.n}), got {args.chunk}")
    args.batch, args.causal = 1, True  # what forward_call reads


def measure(args: argparse.Namespace) -> list[Figure]:
    n, chunk = args.n, args.chunk
    calls = {"chunked": forward_call("local", n, args, {"block": chunk, "lookback": 0, "lookahead": 0}),
             "sdpa": forward_call("sdpa", n, args)}
    times = interleaved(calls, args.rounds, args.device, args.clock)
    speedup = ratios(times["sdpa"], times["chunked"])
    print(f"\nseconds per forward call, median (IQR, min–max) of {args.rounds} interleaved rounds, n = {n}, "
          f"C = {chunk}:")
    print(f"  chunked (local, block {chunk}, causal)  {spread(times['chunked'], fmt='.3g')} s")
    print(f"  sdpa, full causal                  {spread(times['sdpa'], fmt='.3g')} s")
    print(f"  sdpa / chunked, round by round     {ratio_verdict(speedup, TARGET, at_most=False)}", flush=True)
    where = f"n = {n}, C = {chunk}"
    return [Figure.of(f"chunked seconds per call, {where}", times["chunked"]),
            Figure.of(f"sdpa causal seconds per call, {where}", times["sdpa"]),
            Figure.judged(f"sdpa causal / chunked, {where}", speedup, TARGET, at_most=False)]


BENCHMARK = Benchmark(
    "chunked", "Llama 4's chunked attention (local, block = C, causal) against full causal SDPA, interleaved.",
    measure, options, settle,
    lambda args: f"B=1, H={args.heads}, D={args.head_dim}, fp32, causal forward, n = {args.n}, C = {args.chunk}, "
                 f"{args.rounds} interleaved rounds after one untimed call each ({args.clock} clock).",
    Machine(threads=2, rounds=3), __doc__)


def main(argv: list[str] | None = None) -> int:
    return run(BENCHMARK, argv)


if __name__ == "__main__":
    raise SystemExit(main())
