"""What attention sinks cost (gpt-oss, arXiv 2508.10925): the forward of every mechanism that takes `sinks=` (SDPA,
sliding window, block-local, Longformer, BigBird, top-k, NSA) with and without it, a logit per head in each row's
softmax denominator (NSA: in each branch's). Interleaved calls (A B A B …), median with its
spread and the ratio round by round, through `attn_core.attention` as a user calls it, in torch.inference_mode (the
fused kernels hand back each row's log-sum-exp ℓ, and the rows are scaled by σ(ℓ − a): O(n·H) more; top-k's and
NSA's C++ selected softmax adds e^(a − M) to each row's sum in its one pass: one exponential a row).

    python -m attn_core.benchmarks.sinks                 # B=1, H=8, D=64, fp32, n = 16384, causal
    python -m attn_core.benchmarks.sinks --both          # causal and not
    python -m attn_core.benchmarks.sinks --ns 4096       # a first look
    python -m attn_core.benchmarks.sinks --keys topk nsa # some of them

Target: with sinks ≤ 1.05× without at n = 16384.
"""
from __future__ import annotations

import argparse

import torch

from . import alternate, ratio_verdict, ratios, spread, timer
from .runner import Benchmark, Figure, Machine, run
from attn_core import attention, get

CASES = (("sdpa", {}), ("sliding_window", {"window": 128}), ("local", {}),  # gpt-oss's windows hold 128 tokens
         ("longformer", {"window": 128}), ("bigbird", {}), ("topk", {}), ("nsa", {}))  # the rest: their defaults
HEADS, HEAD_DIM = 8, 64


def measure(args: argparse.Namespace) -> list[Figure]:
    timed, figures = timer(args.device, args.clock), []
    print(f"\nseconds per forward call, median (IQR, min–max) of {args.rounds} interleaved rounds; with sinks over "
          f"without, round by round:")
    for n in args.ns:
        g = torch.Generator().manual_seed(0)
        q, k, v = (torch.randn(1, HEADS, n, HEAD_DIM, generator=g).to(args.device) for _ in range(3))
        sinks = torch.randn(HEADS, generator=g).to(args.device)
        for key, params in (case for case in CASES if case[0] in args.keys):
            for causal in (True, False) if args.both and not get(key).supports.causal_only else (True,):
                with torch.inference_mode():
                    contestants = {"plain": lambda: attention(key, q, k, v, causal=causal, **params),
                                   "sinks": lambda: attention(key, q, k, v, causal=causal, sinks=sinks, **params)}
                    for call in contestants.values():  # the warm-up
                        call()
                    t = alternate({name: (lambda call=call: timed(call, 1)) for name, call in contestants.items()},
                                  args.rounds)
                mode = "causal" if causal else "full"
                rounds = ratios(t["sinks"], t["plain"])
                print(f"  {key:14s} {mode:6s} n={n:5d}  without {spread(t['plain'], fmt='.3g')} s  with "
                      f"{spread(t['sinks'], fmt='.3g')} s  ratio {ratio_verdict(rounds, 1.05)}", flush=True)
                where = f"{key}, {mode}, n = {n}"
                figures += [Figure.of(f"seconds per call without sinks, {where}", t["plain"]),
                            Figure.judged(f"with sinks/without, {where}", rounds, 1.05)]
    return figures


def options(p: argparse.ArgumentParser) -> None:
    p.add_argument("--ns", type=int, nargs="+", default=[16384], help="sequence lengths")
    p.add_argument("--both", action="store_true", help="not causal too (SDPA at 16384: seconds a call on a CPU)")
    p.add_argument("--keys", nargs="+", default=[key for key, _ in CASES], choices=[key for key, _ in CASES],
                   help="the mechanisms (all that take sinks)")


BENCHMARK = Benchmark(
    "sinks", "What attention sinks cost: every mechanism that takes sinks=, with and without them, side by side.",
    measure, options, lambda args: None,
    lambda args: f"B=1, H={HEADS}, D={HEAD_DIM}, fp32, the public calls timed in torch.inference_mode "
                 f"({args.clock} clock).",
    Machine(threads=None, rounds=7), __doc__)


def main(argv: list[str] | None = None) -> int:
    return run(BENCHMARK, argv)


if __name__ == "__main__":
    raise SystemExit(main())
