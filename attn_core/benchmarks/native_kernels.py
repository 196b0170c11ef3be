"""The CPU kernels of our own (`attn_core.native`) against the torch forms they stand beside, through the public call:
top-k without and with the causal mask, and NSA, each timed with the C++ kernels and with the torch forms
(ATTN_LAB_NATIVE=0, read at every call) in interleaved rounds (A B A B …, so a busy spell of the machine hits both
alike), median with its spread, and the speed-up as each round's ratio; the two outputs' largest difference beside.

    python -m attn_core.benchmarks.native_kernels            # n = 16384, B=1, H=8, D=64, fp32, forward, 2 threads
    python -m attn_core.benchmarks.native_kernels --quick    # n = 4096, top_k = 512

Top-k at top_k = 2048 (DeepSeek-V3.2's), its indexer at its defaults; NSA at the paper's settings. The first line
names the form each kernel took (`native.describe`): where no library could be built both sides run the torch forms,
and the script says so instead of a ratio.
"""
from __future__ import annotations

import argparse
import os

import torch

from .. import native
from . import forward_call, interleaved, ratios, spread
from .runner import Benchmark, Figure, Machine, built_kernels, run

CASES = (("topk", False), ("topk", True), ("nsa", True))


def with_switch(call, on: bool):
    """`call` with the C++ kernels on or off (ATTN_LAB_NATIVE), the variable as it was put back after."""
    def switched():
        was = os.environ.get(native.SWITCH)
        os.environ[native.SWITCH] = "1" if on else "0"
        try:
            return call()
        finally:
            if was is None:
                os.environ.pop(native.SWITCH, None)
            else:
                os.environ[native.SWITCH] = was
    return switched


def options(p: argparse.ArgumentParser) -> None:
    p.add_argument("--n", type=int, default=16384)
    p.add_argument("--top-k", type=int, default=2048)
    p.add_argument("--batch", type=int, default=1)
    p.add_argument("--heads", type=int, default=8)
    p.add_argument("--head-dim", type=int, default=64)
    p.add_argument("--quick", action="store_true", help="n = 4096 with top_k = 512, for a first look")


def settle(args: argparse.Namespace) -> None:
    if args.quick:
        args.n, args.top_k = 4096, 512


def measure(args: argparse.Namespace) -> list[Figure]:
    print(f"  CPU kernels: {built_kernels()}")  # where none could be built, both sides run the torch forms
    if args.device != "cpu" or not native.expected():
        print("  nothing to compare: the C++ kernels run on the CPU only, and need a built library")
        return []
    figures = []
    for key, causal in CASES:
        params = {"top_k": args.top_k} if key == "topk" else {}
        call = forward_call(key, args.n, args, params, causal=causal)
        calls = {"C++": with_switch(call, True), "torch": with_switch(call, False)}
        with torch.inference_mode():
            diff = float((calls["C++"]() - calls["torch"]()).abs().max())
        samples = interleaved(calls, args.rounds, args.device, args.clock)
        mask = "causal" if causal else "not causal"
        print(f"\n{key}, {mask}: seconds per call, median (IQR, min–max), "
              f"{args.rounds} interleaved rounds; outputs differ by at most {diff:.2g}")
        for name, times in samples.items():
            print(f"  {name:6s} {spread(times, fmt='.3g'):>34s} s")
        print(f"  speed-up of C++ over torch: {spread(ratios(samples['torch'], samples['C++']))}×")
        figures += [*(Figure.of(f"{key} {name} seconds per call, n = {args.n}, {mask}", times)
                      for name, times in samples.items()),
                    Figure.of(f"speed-up of C++ over torch, {key}, n = {args.n}, {mask}",
                              ratios(samples["torch"], samples["C++"]), "×")]
    return figures


BENCHMARK = Benchmark(
    "native_kernels", "Our C++ CPU kernels (top-k, NSA) against the torch forms they stand beside, interleaved.",
    measure, options, settle,
    lambda args: f"B={args.batch}, H={args.heads}, D={args.head_dim}, fp32, forward, n = {args.n}.",
    Machine(threads=2, rounds=5), __doc__)


def main(argv: list[str] | None = None) -> int:
    return run(BENCHMARK, argv)


if __name__ == "__main__":
    raise SystemExit(main())
