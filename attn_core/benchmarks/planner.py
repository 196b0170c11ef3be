"""The planner's prediction checked: for a few built-in models, each layer kind timed here (attn_core.studies.planner.measure,
on fewer heads), then a scaled-down stack of the model's kinds in its proportions run for real, its prefill and one
decode step through every layer, against what the planner predicted for it from those timings. Target: measured ÷
predicted within ×1.5 either way. The stack runs at twice the longest length its kinds were timed at, halved while
it would overrun its budget: an extrapolation, as the full model's prediction is.

    python -m attn_core.benchmarks.planner            # Llama-3-8B, Gemma-3-27B, Qwen3-Next-80B-A3B, 20 s a model
    python -m attn_core.benchmarks.planner --quick    # 6 s a model, for a first look
"""
from __future__ import annotations

import argparse

from .runner import Benchmark, Figure, Machine, run
from attn_core.studies.planner import model as planner
from attn_core.studies.planner import measure as pm

MODELS = ("llama-3-8b", "gemma-3-27b", "qwen3-next-80b-a3b")
TARGET = 1.5


def verdict(ratio: float) -> str:
    return f"{ratio:.2f}×, {'meets' if 1 / TARGET <= ratio <= TARGET else 'MISSES'} ×{TARGET:g}"


def check(name: str, args: argparse.Namespace) -> list[Figure]:
    """One model: its kinds timed, its stack run; the two ratios (measured ÷ predicted), prefill's and decode's."""
    timings = pm.measure_kinds(planner.find(name), budget_s=args.budget, device=args.device, threads=args.threads)
    got = pm.check_stack(timings, budget_s=args.budget)
    print(f"\n{name}: kinds timed in {timings.spent_s:.1f} s on {timings.device} ({timings.threads} thread(s), "
          f"{timings.dtype}); {got.notes[0]}")
    for kind in timings.kinds:
        for mode in pm.MODES:
            shown = ", ".join(f"{p.n:,}: {p.seconds * 1e3:.3g} ms" for p in kind.points(mode))
            print(f"  {kind.measured.name} on {kind.measured.heads} heads, {mode}: {shown or 'no point'}")
        for note in kind.notes:
            print(f"    note: {note}")
    print(f"  prefill of {got.prefill_n:,} tokens: predicted {got.prefill_predicted_s * 1e3:.3g} ms, measured "
          f"{got.prefill_measured_s * 1e3:.3g} ms, ratio {verdict(got.prefill_ratio)}")
    print(f"  decode step at {got.decode_n:,}: predicted {got.decode_predicted_s * 1e3:.3g} ms, measured "
          f"{got.decode_measured_s * 1e3:.3g} ms, ratio {verdict(got.decode_ratio)}")
    return [Figure(f"{name} {what} measured ÷ predicted", ratio, "×", target=f"within ×{TARGET:g}",
                   meets=1 / TARGET <= ratio <= TARGET)
            for what, ratio in (("prefill", got.prefill_ratio), ("decode step", got.decode_ratio))]


def options(p: argparse.ArgumentParser) -> None:
    p.add_argument("--models", default=",".join(MODELS), help="built-in models, comma-separated")
    p.add_argument("--budget", type=float, default=20.0, help="seconds to time a model's kinds, and again its stack")
    p.add_argument("--quick", action="store_true", help="6 s a model")


def settle(args: argparse.Namespace) -> None:
    if args.quick:
        args.budget = 6.0


def measure(args: argparse.Namespace) -> list[Figure]:
    figures = [f for name in args.models.split(",") for f in check(name.strip(), args)]
    inside = sum(bool(f.meets) for f in figures)
    print(f"\n{inside} of {len(figures)} ratios within ×{TARGET:g}")
    return figures


BENCHMARK = Benchmark(
    "planner", "The planner's prediction of a scaled-down stack against the stack run for real.", measure, options,
    settle, lambda args: "the planner's prediction of a scaled-down stack against the stack run for real",
    Machine(threads=1, rounds=None), __doc__)


def main(argv: list[str] | None = None) -> int:
    return run(BENCHMARK, argv)


if __name__ == "__main__":
    raise SystemExit(main())
