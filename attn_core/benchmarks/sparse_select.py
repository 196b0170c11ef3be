"""Learned sparse selection against dense softmax: `topk` (DeepSeek Sparse Attention's form, top_k = 2048 keys a
query) against `softmax` (materialized) at n = 16384, from interleaved calls (A B A B …, so a busy spell of the
machine hits both alike), median with its spread, beside the spec's FLOPs of each.

    python -m attn_core.benchmarks.sparse_select            # B=1, H=8, D=64, fp32, forward, 2 threads
    python -m attn_core.benchmarks.sparse_select --quick    # n = 4096 with top_k = 512 (the same n / top_k = 8)

The indexer at its defaults (4 heads of width 32, one selection per token for every head): its n² · 4 · 33 · 2
FLOPs are the cheap quadratic part, the selected softmax's 4 · n · top_k · D per head the linear part.
"""
from __future__ import annotations

import argparse

import torch

from .. import MECHANISMS
from . import CLOCKS, end, forward_call, interleaved, ratio_verdict, ratios, spread, start
from ..engine import env
from ..spec import Shape

KEY, BASELINE = "topk", "softmax"
PARAMS = {"top_k": 2048, "index_heads": 4, "index_dim": 32}
TARGET_SPEEDUP = 4.0


def versus_baseline(args: argparse.Namespace, params: dict) -> None:
    n = args.compare_n
    shape = Shape(args.batch, args.heads, n, n, args.head_dim, dtype="float32", causal=args.causal)
    calls = {KEY: forward_call(KEY, n, args, params), BASELINE: forward_call(BASELINE, n, args)}
    samples = interleaved(calls, args.rounds, args.device, args.clock)
    base = samples[BASELINE]
    print(f"\nAt n = {n}, {args.rounds} interleaved rounds: seconds per call, median (IQR, min–max), and the spec's "
          f"executed GFLOPs; speed-up over {BASELINE} as the median (IQR, min–max) of each round's ratio:")
    for key, p in ((BASELINE, {}), (KEY, params)):
        flops = MECHANISMS[key].cost.executed(shape, **p) / 1e9
        verdict = "" if key == BASELINE else f"   {ratio_verdict(ratios(base, samples[key]), TARGET_SPEEDUP, False)}"
        print(f"  {key:8s} {spread(samples[key], fmt='.3g'):>34s} s   {flops:9.1f} GFLOP{verdict}")


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--compare-n", type=int, default=16384)
    p.add_argument("--top-k", type=int, default=PARAMS["top_k"])
    p.add_argument("--batch", type=int, default=1)
    p.add_argument("--heads", type=int, default=8)
    p.add_argument("--head-dim", type=int, default=64)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--device", default="cpu", help="cpu, cuda, mps or auto")
    p.add_argument("--causal", action="store_true")
    p.add_argument("--rounds", type=int, default=3, help="interleaved rounds of the comparison")
    p.add_argument("--clock", choices=CLOCKS, default="wall",
                   help="wall (default), or cpu: the process's CPU seconds, for a first look on a shared machine")
    p.add_argument("--quick", action="store_true", help="n = 4096 with top_k = 512, for a first look")
    args = p.parse_args(argv)
    if args.quick:
        args.compare_n, args.top_k = 4096, 512
    params = {**PARAMS, "top_k": args.top_k}
    args.device = env.resolve_device(args.device)
    torch.set_num_threads(args.threads)
    env.steady_allocator()  # as in the engine's worker: block buffers below 32 MiB reused, not faulted in anew
    start(args.device, f"B={args.batch}, H={args.heads}, D={args.head_dim}, fp32, forward"
                       f"{', causal' if args.causal else ''}.")
    print(f"  {KEY}: {', '.join(f'{k}={v}' for k, v in params.items())}")
    versus_baseline(args, params)
    end()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
