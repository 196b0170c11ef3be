"""What positions cost: softmax and SDPA forward with no positions, with RoPE turning q and k in the call (Su et al.
2021, arXiv 2104.09864), and with ALiBi's (H, n, n) score bias (Press et al. 2021, arXiv 2108.12409) passed as
`score_bias=`. Interleaved calls (A B C A B C …), median with its spread, through `attn_core.attention` as a user
calls it.

    python -m attn_core.benchmarks.positions            # B=1, H=8, D=64, fp32, n = 1024 and 4096
    python -m attn_core.benchmarks.positions --quick    # n = 512 and 1024, for a first look

Then the same three through the engine, as the Benchmark page and `python -m attn_core sweep --positions` measure
them (engine/positions.py: RoPE's tables and ALiBi's bias built outside the timed call, q and k turned inside it):
each point alone, its median, and its peak beside the spec's prediction with the positions' share.

RoPE adds O(n·d) elementwise work to an O(n²·d) call: its ratio should fall towards 1 as n grows. ALiBi's bias is
built once outside the timed call (a model caches it); inside, softmax adds it to the materialized scores, one more
(H, n, n) pass, while SDPA takes it as a float attn_mask, which the flash kernels do not accept: PyTorch falls back
to the memory-efficient or math kernel, and the ratio says what that fallback costs here.
"""
from __future__ import annotations

import argparse

import torch

from . import alternate, point, ratios, spread, timer
from .runner import Benchmark, Figure, Machine, run
from attn_core import attention
from attn_core.positions import encodings as positional
from ..engine import env
from ..engine.measure import format_bytes
from ..engine.problem import Problem, Settings

KEYS = ("softmax", "sdpa")
HEADS, HEAD_DIM = 8, 64


def calls(key: str, n: int, device: str, causal: bool) -> dict:
    g = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(1, HEADS, n, HEAD_DIM, generator=g).to(device) for _ in range(3))
    positions = torch.arange(n, device=device)
    bias = positional.alibi_bias(HEADS, n, n).to(device)
    return {"none": lambda: attention(key, q, k, v, causal=causal),
            "RoPE": lambda: attention(key, positional.rope(q, positions), positional.rope(k, positions), v,
                                      causal=causal),
            "ALiBi": lambda: attention(key, q, k, v, causal=causal, score_bias=bias)}


def measure(args: argparse.Namespace) -> list[Figure]:
    timed, figures = timer(args.device, args.clock), []
    print(f"\nseconds per forward call, median (IQR, min–max) of {args.rounds} interleaved rounds; the ratio to no "
          f"positions round by round:")
    for key in KEYS:
        for n in args.ns:
            for causal in (False, True):
                with torch.inference_mode():
                    contestants = calls(key, n, args.device, causal)
                    for call in contestants.values():  # the warm-up
                        call()
                    t = alternate({name: (lambda call=call: timed(call, 1)) for name, call in contestants.items()},
                                  args.rounds)
                label = f"  {key:8s} {'causal' if causal else 'full':6s} n={n:5d}"
                versus = "  ".join(f"{name} {spread(ratios(t[name], t['none']))}×" for name in ("RoPE", "ALiBi"))
                print(f"{label}  none {spread(t['none'], fmt='.3g')} s  {versus}", flush=True)
                where = f"{key}, {'causal' if causal else 'full'}, n = {n}"
                figures += [Figure.of(f"seconds per call, no positions, {where}", t["none"]),
                            *(Figure.of(f"{name}/none, {where}", ratios(t[name], t["none"]), "×")
                              for name in ("RoPE", "ALiBi"))]
        env.release_cached_memory(args.device)
    return figures


def through_engine(args: argparse.Namespace) -> list[Figure]:
    """Each (mechanism, n, positions) measured alone by the engine (benchmarks.point), non-causal."""
    figures = []
    print("\nthrough the engine, one point at a time (median of its samples; peak measured / predicted):")
    settings = Settings(warmup=1, min_repeats=args.rounds, min_time_s=0.2)
    for key in KEYS:
        for n in args.ns:
            cells = []
            for where in ("none", "rope", "alibi"):
                problem = Problem(mechanism=key, n=n, heads=HEADS, d_model=HEADS * HEAD_DIM, device=args.device,
                                  positions=where)
                row, _ = point(problem, settings)
                if row["status"] != "ok":
                    cells.append(f"{where} {row['status']}: {row['reason']}")
                    continue
                cells.append(f"{where} {row['time_median_s'] * 1e3:.2f} ms, {format_bytes(row['peak_bytes'])} / "
                             f"{format_bytes(row['predicted_bytes'])}")
                figures += [Figure(f"engine median seconds, {key}, positions {where}, n = {n}", row["time_median_s"],
                                   "s", row["time_iqr_s"], n=row["repeats"]),
                            Figure(f"engine peak bytes, {key}, positions {where}, n = {n}", row["peak_bytes"], "bytes",
                                   target=f"the spec's {row['predicted_bytes']:.0f}")]
            print(f"  {key:8s} n={n:5d}  " + "  ".join(cells), flush=True)
    return figures


def options(p: argparse.ArgumentParser) -> None:
    p.add_argument("--ns", type=int, nargs="+", default=[1024, 4096], help="sequence lengths")
    p.add_argument("--quick", action="store_true", help="n = 512 and 1024, 5 rounds")


def settle(args: argparse.Namespace) -> None:
    if args.quick:
        args.ns, args.rounds = [512, 1024], min(args.rounds, 5)


BENCHMARK = Benchmark(
    "positions", "What positions cost: softmax and SDPA with none, RoPE and ALiBi, side by side and in the engine.",
    lambda args: [*measure(args), *through_engine(args)], options, settle,
    lambda args: f"B=1, H={HEADS}, D={HEAD_DIM}, fp32, the public calls timed in torch.inference_mode "
                 f"({args.clock} clock).",
    Machine(threads=None, rounds=7), __doc__)


def main(argv: list[str] | None = None) -> int:
    return run(BENCHMARK, argv)


if __name__ == "__main__":
    raise SystemExit(main())
