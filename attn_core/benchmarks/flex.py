"""One mask, three kernels: a mechanism defined by a mask (a sliding window by default) run by our kernel, by
compiled FlexAttention and by SDPA with a dense boolean mask (attn_core.mechanisms.flex), from interleaved calls (A B C A B C …,
so a busy spell of the machine hits all three alike), median with its spread; the one-time costs (Flex's compile and
block mask, the dense mask) printed apart, never inside a time. Each n ends with the load average and a verdict on
ours ÷ compiled Flex against issue 25's targets: ≤ 1.0× on a quiet machine, ≤ 1.5× with one core busy (--busy: a
process spinning on one core for the whole run, stopped at the end whatever happens).

    python -m attn_core.benchmarks.flex            # window 256, B=1, H=8, D=64, fp32, forward, n = 1k, 4k, 16k
    python -m attn_core.benchmarks.flex --quick    # n = 1k and 4k, fewer rounds, for a first look
    python -m attn_core.benchmarks.flex --mechanism bigbird --busy   # BigBird's defaults, one core kept busy
"""
from __future__ import annotations

import argparse
import contextlib
import math
import os
import subprocess
import sys
import warnings
from typing import Callable, Iterator

import torch

from attn_core import MECHANISMS, make_state
from attn_core.mechanisms import flex
from . import interleaved, ratio_verdict, ratios, spread
from .runner import Benchmark, Figure, Machine, run
from ..engine import env
from ..engine.measure import format_bytes
from ..spec import Shape

CHOICES = ("sliding_window", "local", "longformer", "bigbird", "softmax")  # softmax: causal, the mask Flex skips
TARGETS = {False: 1.0, True: 1.5}  # ours ÷ compiled Flex at most, quiet and with one core busy (issue 25)
BUSY_FROM = 4096  # the busy target is set at 4k and 16k


def params_of(args: argparse.Namespace) -> dict:
    """The mechanism's parameters: its spec's defaults, with --window where it has a window."""
    params = dict(MECHANISMS[args.mechanism].defaults)
    if args.window is not None:
        if "window" not in params:
            raise ValueError(f"--window: {args.mechanism} has no window; its parameters are {', '.join(params)}")
        params["window"] = args.window
    return params


@contextlib.contextmanager
def spinning(busy: bool) -> Iterator[None]:
    """With `busy`, one process spinning on the machine's last core for the duration, always stopped at the end
    (an error, Ctrl-C); nothing otherwise."""
    if not busy:
        yield
        return
    core = (os.cpu_count() or 1) - 1
    spinner = subprocess.Popen([sys.executable, "-c", "while True: pass"],
                               preexec_fn=lambda: os.sched_setaffinity(0, {core}))
    print(f"A process spinning on core {core} (pid {spinner.pid}) until the end.", flush=True)
    try:
        yield
    finally:
        spinner.kill()
        spinner.wait()


def calls(n: int, args: argparse.Namespace) -> tuple[dict[str, Callable[[], object]], dict[str, str]]:
    """The public calls on seeded q, k, v (B, H, n, D), each mask built and Flex compiled here, outside the timing:
    ({implementation: call}, {implementation: its one-time costs, or why it cannot run})."""
    g = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(args.batch, args.heads, n, args.head_dim, generator=g).to(args.device) for _ in range(3))
    key, params = args.mechanism, params_of(args)
    shape = Shape(args.batch, args.heads, n, n, args.head_dim, causal=args.causal)
    MECHANISMS[key].check(shape, params)
    state = make_state(key, shape, args.device, seed=0, **params)  # BigBird's random blocks, drawn once
    masking = flex.masking_of(key, args.causal, params, state)
    found: dict[str, Callable[[], object]] = {
        "ours": lambda: MECHANISMS[key].fn(q, k, v, causal=args.causal, **params, **state)}
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


def compare(args: argparse.Namespace) -> list[Figure]:
    method, peak_of = env.peak_memory_probe(args.device)
    print(f"Seconds per call, median (IQR, min–max) of {args.rounds} interleaved rounds; ours ÷ each as the median "
          f"(IQR, min–max) of each round's ratio (> 1: it is faster than ours); peak bytes above the inputs "
          f"({method}).")
    figures = []
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
            figures += [Figure.of(f"{implementation} seconds per call, n = {n}", samples[implementation]),
                        Figure(f"{implementation} peak bytes, n = {n}", peak, "bytes")]
            if implementation == "dense-mask":
                figures.append(Figure.of(f"ours ÷ dense-mask, n = {n}",
                                         ratios(samples["ours"], samples[implementation]), "×"))
        print(f"  {verdict(samples, n, args.busy)}", flush=True)
        if "flex" in samples:
            figures.append(Figure.judged(f"ours ÷ compiled Flex, n = {n}{', one core busy' if args.busy else ''}",
                                         ratios(samples["ours"], samples["flex"]), TARGETS[args.busy]))
    return figures


def verdict(samples: dict[str, list[float]], n: int, busy: bool) -> str:
    """Ours ÷ compiled Flex per round against the target of this machine's state (quiet or one core busy)."""
    if "flex" not in samples:
        return "verdict: none, compiled Flex did not run"
    target = TARGETS[busy]
    said = f"ours ÷ compiled Flex {ratio_verdict(ratios(samples['ours'], samples['flex']), target)}"
    aside = f" (the busy target is set from n = {BUSY_FROM:,})" if busy and n < BUSY_FROM else ""
    load, cores = env.load_average(), os.cpu_count() or 1
    if not busy and load is not None and load > cores:
        aside += f" (load {load} on {cores} cores: the machine was not quiet)"
    return f"verdict ({'one core busy' if busy else 'quiet'}): {said}{aside}"


def options(p: argparse.ArgumentParser) -> None:
    p.add_argument("--ns", type=lambda s: [int(x) for x in s.split(",")], default=[1024, 4096, 16384],
                   help="comma-separated sequence lengths (default 1024,4096,16384)")
    p.add_argument("--mechanism", choices=CHOICES, default="sliding_window",
                   help="the mask, with its spec's defaults (softmax: causal)")
    p.add_argument("--window", type=int, default=None, help="the window, where the mechanism has one (default: its "
                   "spec's, 256)")
    p.add_argument("--batch", type=int, default=1)
    p.add_argument("--heads", type=int, default=8)
    p.add_argument("--head-dim", type=int, default=64)
    p.add_argument("--causal", action="store_true")
    p.add_argument("--quick", action="store_true", help="n = 1024 and 4096, 5 rounds")
    p.add_argument("--busy", action="store_true", help="one process spinning on one core for the whole run")


def settle(args: argparse.Namespace) -> None:
    if args.quick:
        args.ns, args.rounds = [1024, 4096], 5
    args.causal = args.causal or args.mechanism == "softmax"
    params_of(args)  # refuses a --window the mechanism does not have


def setting(args: argparse.Namespace) -> str:
    said = ", ".join(f"{k}={v}" for k, v in params_of(args).items())
    return (f"{args.mechanism}{f' ({said})' if said else ''}{', causal' if args.causal else ''}, B={args.batch}, "
            f"H={args.heads}, D={args.head_dim}, fp32, forward: ours, compiled Flex, dense-mask SDPA"
            f"{'; one core busy' if args.busy else ''}.")


def measure(args: argparse.Namespace) -> list[Figure]:
    with spinning(args.busy):
        return compare(args)


BENCHMARK = Benchmark(
    "flex", "One mask, three kernels: ours, compiled FlexAttention and SDPA with a dense mask, interleaved.",
    measure, options, settle, setting, Machine(threads=2, rounds=9), __doc__)


def main(argv: list[str] | None = None) -> int:
    return run(BENCHMARK, argv)


if __name__ == "__main__":
    raise SystemExit(main())
