"""One mask, three kernels: a sliding window run by our banded kernel, by compiled FlexAttention and by SDPA with a
dense boolean mask (attn_core.flex), from interleaved calls (A B C A B C …, so a busy spell of the machine hits all
three alike), median with its spread; the one-time costs (Flex's compile and block mask, the dense mask) printed
apart, never inside a time.

    python -m attn_core.benchmarks.flex            # window 256, B=1, H=8, D=64, fp32, forward, n = 1k, 4k, 16k
    python -m attn_core.benchmarks.flex --quick    # n = 1k and 4k, fewer rounds, for a first look
"""
from __future__ import annotations

import argparse
import math
import warnings
from typing import Callable

import torch

from .. import MECHANISMS, flex
from . import end, interleaved, machine, machine_options, ratios, spread, start
from ..engine import env
from ..engine.measure import format_bytes
from ..spec import Shape

KEY = "sliding_window"


def calls(n: int, args: argparse.Namespace) -> tuple[dict[str, Callable[[], object]], dict[str, str]]:
    """The public calls on seeded q, k, v (B, H, n, D), each mask built and Flex compiled here, outside the timing:
    ({implementation: call}, {implementation: its one-time costs, or why it cannot run})."""
    g = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(args.batch, args.heads, n, args.head_dim, generator=g).to(args.device) for _ in range(3))
    params = {"window": args.window}
    MECHANISMS[KEY].check(Shape(args.batch, args.heads, n, n, args.head_dim, causal=args.causal), params)
    masking = flex.masking_of(KEY, args.causal, params)
    found: dict[str, Callable[[], object]] = {
        "ours": lambda: MECHANISMS[KEY].fn(q, k, v, causal=args.causal, **params)}
    once: dict[str, str] = {}
    for implementation in ("flex", "dense-mask"):
        try:
            forward, mask_s = flex.forward_of(implementation, masking, n, n, args.batch, args.device)
            call = (lambda forward=forward: forward(q, k, v))
            compile_s = math.nan
            if implementation == "flex":
                with torch.inference_mode(), warnings.catch_warnings():
                    warnings.simplefilter("ignore")
                    compile_s = flex.first_call(call)[1].compile_s
        except (flex.FlexUnavailable, flex.EagerFallback) as e:
            once[implementation] = f"not measured: {e}"
            continue
        found[implementation] = call
        compiled = f"compile {compile_s:.2f} s, " if not math.isnan(compile_s) else ""
        once[implementation] = f"one-time: {compiled}mask {mask_s:.3f} s"
    return found, once


def compare(args: argparse.Namespace) -> None:
    method, peak_of = env.peak_memory_probe(args.device)
    print(f"Seconds per call, median (IQR, min–max) of {args.rounds} interleaved rounds; ours ÷ each as the median "
          f"(IQR, min–max) of each round's ratio (> 1: it is faster than ours); peak bytes above the inputs "
          f"({method}).")
    for n in args.ns:
        found, once = calls(n, args)
        samples = interleaved(found, args.rounds, args.device, args.clock)
        print(f"\nn = {n:,} (load average {env.load_average()}):")
        for implementation in ("ours", "flex", "dense-mask"):
            if implementation not in found:
                print(f"  {implementation:10s} {once[implementation]}")
                continue
            env.release_cached_memory(args.device)
            with torch.inference_mode():
                peak = float(peak_of(found[implementation]))
            versus = ("" if implementation == "ours" else
                      f"   ours ÷ it {spread(ratios(samples['ours'], samples[implementation]))}×")
            print(f"  {implementation:10s} {spread(samples[implementation], 1e3, '.3g'):>34s} ms   peak "
                  f"{format_bytes(peak):>10s}{versus}   {once.get(implementation, '')}", flush=True)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--ns", type=lambda s: [int(x) for x in s.split(",")], default=[1024, 4096, 16384],
                   help="comma-separated sequence lengths (default 1024,4096,16384)")
    p.add_argument("--window", type=int, default=256)
    p.add_argument("--batch", type=int, default=1)
    p.add_argument("--heads", type=int, default=8)
    p.add_argument("--head-dim", type=int, default=64)
    p.add_argument("--causal", action="store_true")
    p.add_argument("--rounds", type=int, default=9, help="interleaved calls per implementation and n")
    p.add_argument("--quick", action="store_true", help="n = 1024 and 4096, 5 rounds")
    machine_options(p, threads=2)
    args = p.parse_args(argv)
    if args.quick:
        args.ns, args.rounds = [1024, 4096], 5
    machine(args)
    start(args.device, f"sliding window {args.window}{', causal' if args.causal else ''}, B={args.batch}, "
                       f"H={args.heads}, D={args.head_dim}, fp32, forward: ours, compiled Flex, dense-mask SDPA.")
    compare(args)
    end()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
