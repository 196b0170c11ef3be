"""The planner's prediction checked, in three parts (--parts):

- speed: every built-in model planned at 1M tokens with --json, as `python -m attn_core plan NAME --context 1M
  --json` plans it (cli.main in this process, after the imports): the first call's seconds and the median of five.
  Target: under 1 s each. One whole process is timed too, the imports included, for scale.
- roofline: a scaled-down stack of each model with an MLP of its shape beside each layer, run here, against the
  roofline on this machine as measured (measure.check_roofline): predicted ÷ measured, prefill and decode.
- stack: each layer kind timed here (attn_core.studies.planner.measure, on fewer heads), then a scaled-down stack
  of the model's kinds in its proportions run for real, its prefill and one decode step through every layer, against
  what the planner predicted for it from those timings. Target: measured ÷ predicted within ×1.5 either way. The
  stack runs at twice the longest length its kinds were timed at, halved while it would overrun its budget: an
  extrapolation, as the full model's is.

    python -m attn_core.benchmarks.planner            # Llama-3-8B, Gemma-3-27B, Qwen3-Next-80B-A3B, 20 s a model
    python -m attn_core.benchmarks.planner --quick    # 6 s a model, for a first look
    python -m attn_core.benchmarks.planner --parts speed
"""
from __future__ import annotations

import argparse
import io
import subprocess
import sys
import time

from .runner import Benchmark, Figure, Machine, run
from attn_core import cli
from attn_core.studies.planner import builtin
from attn_core.studies.planner import model as planner
from attn_core.studies.planner import measure as pm

MODELS = ("llama-3-8b", "gemma-3-27b", "qwen3-next-80b-a3b")
TARGET = 1.5
PARTS = ("speed", "roofline", "stack")
SPEED_TARGET_S = 1.0


def plan_seconds(name: str) -> float:
    """Seconds of `python -m attn_core plan NAME --context 1M --json` in this process (cli.main), its output kept."""
    out, err = io.StringIO(), io.StringIO()
    began = time.perf_counter()
    code = cli.main(["plan", name, "--context", "1M", "--json"], out, err)
    seconds = time.perf_counter() - began
    if code != 0:
        raise RuntimeError(f"planning {name} failed: {err.getvalue().strip()}")
    return seconds


def speed(args: argparse.Namespace) -> list[Figure]:
    """Every built-in model planned at 1M tokens with --json: the first call and the median of five, each judged
    against SPEED_TARGET_S; one whole process (imports included) timed beside them, not judged."""
    figures = []
    print(f"\nplanning each built-in model at 1M tokens with --json (target under {SPEED_TARGET_S:g} s):")
    for name in builtin.MODELS:
        first = plan_seconds(name)
        again = Figure.of(f"{name}: plan at 1M, --json", [plan_seconds(name) for _ in range(5)])
        slowest = max(first, again.max)
        print(f"  {name:24s} first {first * 1e3:7.1f} ms, then median {again.value * 1e3:6.1f} ms")
        figures.append(Figure(f"{name}: plan at 1M, --json, first call", first, "s", target=f"< {SPEED_TARGET_S:g} s",
                              meets=slowest < SPEED_TARGET_S))
    began = time.perf_counter()
    subprocess.run([sys.executable, "-m", "attn_core", "plan", "gpt-oss-20b", "--context", "1M", "--json"],
                   check=True, capture_output=True)
    whole = time.perf_counter() - began
    print(f"  a whole process, `python -m attn_core plan gpt-oss-20b --context 1M --json`: {whole:.2f} s (the "
          "imports of torch and the library included)")
    return figures + [Figure("gpt-oss-20b: a whole `plan` process at 1M, --json", whole, "s")]


def roofline_check(name: str, args: argparse.Namespace) -> list[Figure]:
    """One model's scaled-down stack with its MLPs run here against the roofline: predicted ÷ measured."""
    got = pm.check_roofline(planner.find(name), config=builtin.CONFIG.get(name), budget_s=args.budget / 2,
                            threads=args.threads)
    print(f"\n{name}, roofline check: {got.notes[0]}\n  {got.notes[1]}")
    print(f"  prefill of {got.prefill_n:,} tokens: predicted {got.prefill_predicted_s * 1e3:.3g} ms "
          f"({got.prefill_bound}), measured {got.prefill_measured_s * 1e3:.3g} ms: predicted ÷ measured "
          f"{got.prefill_ratio:.2f}")
    print(f"  decode step at {got.decode_n:,}: predicted {got.decode_predicted_s * 1e3:.3g} ms ({got.decode_bound}), "
          f"measured {got.decode_measured_s * 1e3:.3g} ms: predicted ÷ measured {got.decode_ratio:.2f}")
    return [Figure(f"{name} {what} roofline predicted ÷ measured", ratio, "×")
            for what, ratio in (("prefill", got.prefill_ratio), ("decode step", got.decode_ratio))]


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
    p.add_argument("--parts", default=",".join(PARTS), help=f"which parts, comma-separated: {', '.join(PARTS)}")


def settle(args: argparse.Namespace) -> None:
    if args.quick:
        args.budget = 6.0
    args.parts = [p.strip() for p in args.parts.split(",") if p.strip()]
    if not args.parts or set(args.parts) - set(PARTS):
        raise ValueError(f"--parts must name some of {', '.join(PARTS)}")


def measure(args: argparse.Namespace) -> list[Figure]:
    names = [name.strip() for name in args.models.split(",")]
    figures = speed(args) if "speed" in args.parts else []
    if "roofline" in args.parts:
        figures += [f for name in names for f in roofline_check(name, args)]
    if "stack" in args.parts:
        checked = [f for name in names for f in check(name, args)]
        inside = sum(bool(f.meets) for f in checked)
        print(f"\n{inside} of {len(checked)} ratios within ×{TARGET:g}")
        figures += checked
    return figures


BENCHMARK = Benchmark(
    "planner", "The planner's prediction of a scaled-down stack against the stack run for real.", measure, options,
    settle, lambda args: "the planner's prediction of a scaled-down stack against the stack run for real",
    Machine(threads=1, rounds=None), __doc__)


def main(argv: list[str] | None = None) -> int:
    return run(BENCHMARK, argv)


if __name__ == "__main__":
    raise SystemExit(main())
