"""What each mechanism costs per generated token: the time of one step against a cache of n tokens, the bytes the
cache holds, and the log-log slope of the step time against n (softmax and sdpa ≈ 1 at large n: a step reads the
whole key-value cache; a sliding window, Longformer's window and global tokens, and the fixed-size states of linear
attention and Performer ≈ 0).

    python -m attn_core.benchmarks.generation           # B=1, H=8, D=64, fp32, 2 threads, n = 1k … 64k, 50 steps
    python -m attn_core.benchmarks.generation --quick   # n = 1k … 8k, 20 steps

Each cache is built by `generation.remember` from random keys and values of n tokens, not by a prefill: the prompt's
own causal attention is beside the point here and would cost O(n²) (softmax materializes n² scores, 32 GiB a head
at 64k). The cache is preallocated for every step that follows (max_len), so no timed step reallocates it; steps run
inside `validated()`, so no timed step pays for argument checks. Each sample is one step, synchronized on a GPU.
"""
from __future__ import annotations

import argparse
import sys

import torch

from . import powers, spread
from .runner import Benchmark, Figure, Machine, run
from ..engine import env
from ..engine.analysis import loglog_slope
from attn_core.nn import generation as gen
from ..api import make_state
from ..mechanisms import MECHANISMS
from ..mechanisms._common import validated
from ..engine.measure import format_bytes
from ..engine.measurement import median_iqr
from ..engine.timing import wait_for_quiet
from ..spec import Shape

LINES = {"softmax": {}, "sdpa": {}, "sliding_window": {"window": 256}, "longformer": {"window": 256, "global_tokens": 2},
         "linear": {}, "performer": {"features": 256}}


def tokens(n: int, args, device: str, seed: int) -> list[torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    shape = (1, args.heads, n, args.head_dim)
    return [torch.randn(shape, generator=g).to(device) for _ in range(3)]


def time_steps(key: str, params: dict, n: int, args, device: str) -> tuple[list[float], int, int]:
    """Seconds of `args.steps` clean steps after `args.warmup` untimed ones, against a cache of n random tokens; the
    cache's bytes at context n; and how many steps were set aside because another program took a core from this
    one meanwhile (env.ContentionProbe, as the engine judges its samples; at most `args.steps` of them, after two
    in a row a short wait for a quiet moment). Every step adds a token: the context ends at most 3·steps + warmup
    past n, the cache preallocated for it."""
    k, v = tokens(n, args, device, seed=n)[1:]
    state = make_state(key, Shape(1, args.heads, n, n, args.head_dim), device, seed=0, **params)
    total = args.warmup + 2 * args.steps
    cache = gen.remember(key, k, v, max_len=n + total, **params, **state)
    held = cache.nbytes
    del k, v
    q, k, v = tokens(total, args, device, seed=-n % 2**31)
    timer, probe, threads = env.device_timer(device), env.ContentionProbe(), torch.get_num_threads()
    clean, set_aside, last_hit = [], 0, False
    with validated():
        for i in range(total):
            t = (q[:, :, i:i + 1], k[:, :, i:i + 1], v[:, :, i:i + 1])
            if i == args.warmup:
                probe.refresh()  # the warm-up may have started the thread pool
            mark = probe.mark()
            took = timer(lambda: gen.step(key, *t, cache), 1)
            hit = probe.since(mark).disturbed(threads)
            if i < args.warmup:
                continue
            if hit and set_aside < args.steps:
                set_aside += 1
                if last_hit:
                    wait_for_quiet(probe, threads)
                last_hit = True
                continue
            clean.append(took)
            last_hit = False
            if len(clean) == args.steps:
                break
    return clean, held, set_aside


def options(p: argparse.ArgumentParser) -> None:
    p.add_argument("--n-min", type=int, default=1024)
    p.add_argument("--n-max", type=int, default=65536)
    p.add_argument("--heads", type=int, default=8)
    p.add_argument("--head-dim", type=int, default=64)
    p.add_argument("--steps", type=int, default=50, help="timed steps per point")
    p.add_argument("--warmup", type=int, default=5, help="untimed steps before them")
    p.add_argument("--slope-from", type=int, default=8192, help="the fitted slope uses n ≥ this")
    p.add_argument("--mechanisms", default=",".join(LINES),
                   help="comma-separated keys (any mechanism with a generation form; parameters at its defaults "
                        "unless listed in LINES)")
    p.add_argument("--quick", action="store_true", help="n up to 8k, at most 20 steps, slope from 2k")


def settle(args: argparse.Namespace) -> None:
    """--quick applied."""
    if args.quick:
        args.n_max, args.steps, args.slope_from = min(args.n_max, 8192), min(args.steps, 20), 2048


def measure(args: argparse.Namespace) -> list[Figure]:
    device = args.device  # resolved, and the threads set, by the runner
    keys = [k.strip() for k in args.mechanisms.split(",") if k.strip()]
    for key in keys:
        able, why = gen.can_generate(key)
        if not able:
            print(f"{key} is left out: {why}", file=sys.stderr)
    keys = [k for k in keys if gen.can_generate(k)[0]]
    ns = powers(args.n_min, args.n_max)

    rows, figures = [], []
    for n in ns:  # every mechanism at one n before the next n: a slow spell of the machine hits them all alike
        for key in keys:
            params = {**MECHANISMS[key].defaults, **LINES.get(key, {})}
            samples, held, set_aside = time_steps(key, params, n, args, device)
            rows.append((key, n, *median_iqr(samples), held, min(samples), set_aside))
            print(f"  {key:15s} n={n:6d}  {spread(samples, 1e6, '.1f')} µs  "
                  f"cache {format_bytes(held)}  {set_aside} disturbed steps set aside", file=sys.stderr, flush=True)
            env.release_cached_memory(device)

    print("\nPer-token step time, median µs (interquartile range; * where more than half the steps were "
          "disturbed and set aside), and the cache's bytes:")
    print(f"  {'mechanism':15s} " + " ".join(f"{n:>18d}" for n in ns))
    for key in keys:
        mine = [r for r in rows if r[0] == key]
        cells = (f"{r[2] * 1e6:8.1f} ({r[3] * 1e6:6.1f}){'*' if 2 * r[6] > args.steps else ' '}" for r in mine)
        print(f"  {key:15s} " + " ".join(cells))
        print(f"  {'':15s} " + " ".join(f"{format_bytes(r[4]):>18s}" for r in mine))
    print(f"\nLog-log slope of the median step time against n (fit over n ≥ {args.slope_from}; in brackets, "
          f"between successive n), of the fastest step (contention only ever adds time), and of the cache's bytes:")
    for key in keys:
        mine = [r for r in rows if r[0] == key]
        big = [r for r in mine if r[1] >= args.slope_from]
        local = [loglog_slope([a[1], b[1]], [a[2], b[2]]) for a, b in zip(mine, mine[1:])]
        memory = loglog_slope([r[1] for r in big], [r[4] for r in big])
        fastest = loglog_slope([r[1] for r in big], [r[5] for r in big])
        print(f"  {key:15s} time {loglog_slope([r[1] for r in big], [r[2] for r in big]):5.2f} "
              f"[{', '.join(f'{s:.2f}' for s in local)}]  fastest {fastest:5.2f}  cache {memory:5.2f}")
        figures += [*(Figure(f"{key} step seconds, n = {r[1]}", r[2], "s", r[3], n=args.steps) for r in mine),
                    Figure.slope(f"{key} step time slope, n ≥ {args.slope_from}",
                                 loglog_slope([r[1] for r in big], [r[2] for r in big])),
                    Figure.slope(f"{key} cache bytes slope, n ≥ {args.slope_from}", memory)]
    print("\nExpected: softmax and sdpa ≈ 1 (a step reads all n cached keys and values), sliding_window ≈ 0 "
          "(w + 1 of them), longformer ≈ 0 (w + 1 and the g global ones), linear and performer ≈ 0 (an m × D "
          "state). Timings on a shared machine are noisy.")
    return figures


BENCHMARK = Benchmark(
    "generation", "What each mechanism costs per generated token: a step's time against a cache of n tokens, the "
    "cache's bytes, and the slope of the step time against n.", measure, options, settle,
    lambda args: f"B=1, H={args.heads}, D={args.head_dim}, fp32; {args.steps} timed steps per point after "
                 f"{args.warmup}",
    Machine(threads=2, rounds=None, clocks=("wall",)), __doc__)


def main(argv: list[str] | None = None) -> int:
    return run(BENCHMARK, argv)


if __name__ == "__main__":
    raise SystemExit(main())
