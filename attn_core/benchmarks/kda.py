"""`kda` beside `gated_deltanet`: forward time at n = 4096 and 16384 interleaved in one process (targets: kda ≤ 1.3×
gated_deltanet at 16384, kda's time slope 4096 → 16384 ≤ 1.15, i.e. time(16k)/time(4k)/4 ≤ 1.15):

    python -m attn_core.benchmarks.kda              # 5 rounds
    python -m attn_core.benchmarks.kda --rounds 3   # quicker

B = 1, H = 8, D = 64, float32, causal forward, 2 torch threads, each mechanism's default chunk and seeded default
gates drawn outside the timed calls (init_state). Each round times every call once, in turn (A B A B); figures are
medians over the rounds with their spread, ratios taken round by round. `--clock cpu` counts this process's
CPU time instead, for a machine other programs share (then use --threads 1).
"""
from __future__ import annotations

import argparse

import torch

from . import interleaved, median, ratio_verdict, ratios, spread
from .runner import Benchmark, Figure, Machine, run
from ..mechanisms import MECHANISMS
from ..spec import Shape

KEYS = ("kda", "gated_deltanet")
TARGET_RATIO, TARGET_SLOPE = 1.3, 1.15


def calls(n: int, heads: int, head_dim: int, device: str) -> dict:
    """name → thunk of one forward call of each mechanism on the same q, k, v (gates drawn here, untimed)."""
    g = torch.Generator().manual_seed(n)
    q, k, v = (torch.randn(1, heads, n, head_dim, generator=g).to(device) for _ in range(3))
    shape = Shape(1, heads, n, n, head_dim, causal=True)
    found = {}
    for key in KEYS:
        spec = MECHANISMS[key]
        state = {name: t.to(device) for name, t in spec.state.init(shape, seed=0).items()}
        found[key] = lambda spec=spec, state=state: spec.fn(q, k, v, causal=True, **state)
    return found


def options(p: argparse.ArgumentParser) -> None:
    p.add_argument("--n", default="4096,16384", help="two comma-separated sequence lengths")
    p.add_argument("--heads", type=int, default=8)
    p.add_argument("--head-dim", type=int, default=64)


def settle(args: argparse.Namespace) -> None:
    args.ns = [int(x) for x in args.n.split(",")]


def measure(args: argparse.Namespace) -> list[Figure]:
    kda_times, figures = {}, []
    for n in args.ns:
        times = interleaved(calls(n, args.heads, args.head_dim, args.device), args.rounds, args.device,
                            clock=args.clock)
        kda_times[n] = times["kda"]
        print(f"n={n:6d}  ms: " + "  ".join(f"{key} {spread(t, 1e3, '.1f')}" for key, t in times.items()), flush=True)
        each = ratios(times["kda"], times["gated_deltanet"])
        told = ratio_verdict(each, TARGET_RATIO) if n == max(args.ns) else f"{spread(each)}×"
        print(f"{'':8s}kda/gated_deltanet {told}", flush=True)
        figures += [Figure.of(f"{key} seconds per call, n = {n}", t) for key, t in times.items()]
        figures.append(Figure.judged(f"kda/gated_deltanet, n = {n}", each, TARGET_RATIO) if n == max(args.ns) else
                       Figure.of(f"kda/gated_deltanet, n = {n}", each, "×"))
    if len(args.ns) == 2:
        a, b = args.ns
        per = median(kda_times[b]) / median(kda_times[a]) / (b / a)
        print(f"kda time({b})/time({a})/{b // a} = {per:.3f}, {'meets' if per <= TARGET_SLOPE else 'MISSES'} "
              f"≤ {TARGET_SLOPE}", flush=True)
        figures.append(Figure(f"kda time({b})/time({a})/{b // a}", per, "×", target=f"≤ {TARGET_SLOPE}",
                              meets=per <= TARGET_SLOPE))
    return figures


BENCHMARK = Benchmark(
    "kda", "kda beside gated_deltanet: forward time at two lengths, interleaved, and kda's time slope between them.",
    measure, options, settle,
    lambda args: f"B=1, H={args.heads}, D={args.head_dim}, float32, causal forward, default chunks, {args.rounds} "
                 f"interleaved rounds; {args.clock} ms: median (IQR, min–max)",
    Machine(threads=2, rounds=5), __doc__)


def main(argv: list[str] | None = None) -> int:
    return run(BENCHMARK, argv)


if __name__ == "__main__":
    raise SystemExit(main())
