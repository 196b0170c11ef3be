"""Nyströmformer and additive attention on this machine: B=1, H=8, D=64, fp32, forward, 2 threads.

1. nystrom (m = 64 landmarks, 6 pseudo-inverse steps): time and peak memory at n = 4096 … 32768 and their log-log
   slopes (target ≤ 1.15 each), through the measurement engine (median and IQR, allocator-level peak).
2. nystrom against nystrom-attention 0.0.14's core, interleaved in one process (ours, the peer, ours, …), the same
   q, k, v, landmarks and steps (target: ours ≤ 1.0× the peer). The peer's module runs with `residual=False` (no
   depthwise-conv residual), `to_qkv` replaced by a module that returns the q|k|v already packed as its linear layer
   would, and `to_out` by the identity: what is timed is its forward from the packed q|k|v to its merged
   (B, n, H·D) output, that is its head split (views), q·scale, landmark sums, three score products and softmaxes,
   pseudo-inverse, (F·Z)·(B·V) and its head merge. Ours: the kernel, (B, H, n, D) in and out. Skipped, with a
   sentence, when the peer is not installed (pip install nystrom-attention==0.0.14).
3. additive (attn_dim = 64): time at n = 256 … 2048 and its slope (≈ 2: n² pairs), the time per query, which grows
   like n (each query scores all n keys through attn_dim tanh units), and the time per (pair, hidden unit), which
   should stay flat.

    python -m attn_core.benchmarks.landmark            # all three
    python -m attn_core.benchmarks.landmark --quick    # fewer n and rounds, for a first look
"""
from __future__ import annotations

import argparse
import math
import sys

import torch

from .. import MECHANISMS
from . import interleaved, point, powers, ratio_verdict, ratios, spread
from .runner import Benchmark, Figure, Machine, run
from ..engine.analysis import fit_slopes, loglog_slope
from ..engine.measure import format_bytes
from ..engine.problem import Problem, Settings
from ..mechanisms._common import validated
from ..engine.results import frame_from_rows

B, H, D = 1, 8, 64
LANDMARKS, STEPS, ATTN_DIM = 64, 6, 64
TARGET_SLOPE, TARGET_RATIO = 1.15, 1.0


def sweep(key: str, params: dict, ns: list[int], settings: Settings):
    """Engine rows (time median and IQR, peak bytes) of `key` at each n, printed as they come."""
    rows = []
    for n in ns:
        row, _ = point(Problem(mechanism=key, params=tuple(sorted(params.items())), n=n, batch=B, heads=H,
                               d_model=H * D, device="cpu"), settings)
        rows.append(row)
        print(f"  {key:9s} n={n:6d} {row['status']:8s} {row['time_median_s'] * 1e3:10.2f} ms "
              f"(IQR {row['time_iqr_s'] * 1e3:.2f})  peak {format_bytes(row['peak_bytes'])}"
              f"{'  disturbed' if row['disturbed'] else ''}  {row['reason']}", file=sys.stderr, flush=True)
    return frame_from_rows(rows)


def slopes(df, n_min: int | None = None) -> tuple[float, float, str]:
    """(time slope, memory slope, a note): the engine's fit of the medians over undisturbed points, and beside it
    the fit of each point's fastest sample (the one another program disturbed least), which a busy machine
    moves far less; when fewer than three undisturbed points are left, the fastest samples' slope alone."""
    t = float(fit_slopes(df, "time_median_s", n_min)["slope"].iloc[0])
    m = float(fit_slopes(df, "peak_bytes", n_min)["slope"].iloc[0])
    kept = df[df.n >= (n_min or 0)]
    fastest = [min(samples) for samples in kept.time_samples]
    low = loglog_slope(kept.n, fastest)
    if math.isnan(t):
        return low, m, " (time: the fastest sample of each point; too few undisturbed medians on this busy machine)"
    return t, m, f" (fastest samples: {low:.2f})"


def nystrom_scaling(args, settings: Settings) -> list[Figure]:
    df = sweep("nystrom", {"landmarks": LANDMARKS, "pinv_iterations": STEPS}, args.nystrom_ns, settings)
    print(f"\n1. nystrom, m = {LANDMARKS}, {STEPS} pseudo-inverse steps: time and peak memory above the inputs")
    for _, r in df.iterrows():
        print(f"   n = {r['n']:6d}  {r['time_median_s'] * 1e3:9.2f} ms (IQR {r['time_iqr_s'] * 1e3:6.2f}, fastest "
              f"{min(r['time_samples']) * 1e3:7.2f})  peak {format_bytes(r['peak_bytes']):>10s}  predicted {format_bytes(r['predicted_bytes']):>10s}"
              f"{'  disturbed: left out of the slope' if r['disturbed'] else ''}")
    t, m, note = slopes(df)
    verdict = "meets" if t <= TARGET_SLOPE and m <= TARGET_SLOPE else "MISSES"
    print(f"   log-log slopes n = {args.nystrom_ns[0]}…{args.nystrom_ns[-1]}: time {t:.2f}, memory {m:.2f} "
          f"(target ≤ {TARGET_SLOPE}: {verdict}){note}")
    span = f"n = {args.nystrom_ns[0]}…{args.nystrom_ns[-1]}"
    return [*(Figure(f"nystrom median seconds, n = {r['n']}", r["time_median_s"], "s", r["time_iqr_s"],
                     min(r["time_samples"]), max(r["time_samples"]), r["repeats"])
              for _, r in df.iterrows() if r["status"] == "ok"),
            Figure.slope(f"nystrom time slope, {span}", t, TARGET_SLOPE),
            Figure.slope(f"nystrom memory slope, {span}", m, TARGET_SLOPE)]


class _Packed(torch.nn.Module):
    """Stands in for the peer's to_qkv: returns q|k|v packed (B, n, 3·H·D) as its linear layer would, ignoring x."""

    def __init__(self, packed: torch.Tensor):
        super().__init__()
        self.packed = packed

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.packed


def peer_core(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor):
    """nystrom-attention 0.0.14's NystromAttention without projections or residual, fed our q, k, v; None when the
    package is missing."""
    try:
        from nystrom_attention import NystromAttention
    except ImportError:
        return None
    n = q.shape[-2]
    module = NystromAttention(dim=H * D, dim_head=D, heads=H, num_landmarks=LANDMARKS, pinv_iterations=STEPS,
                              residual=False).eval()
    module.to_qkv = _Packed(torch.cat([t.transpose(1, 2).reshape(B, n, H * D) for t in (q, k, v)], dim=-1))
    module.to_out = torch.nn.Identity()
    x = torch.empty(B, n, H * D)  # its shape is all the forward reads of x
    return lambda: module(x)


def against_peer(args) -> list[Figure]:
    print(f"\n2. nystrom against nystrom-attention 0.0.14's core (m = {LANDMARKS}, {STEPS} steps), interleaved, "
          f"{args.rounds} rounds")
    figures = []
    for n in args.peer_ns:
        g = torch.Generator().manual_seed(n)
        q, k, v = (torch.randn(B, H, n, D, generator=g) for _ in range(3))
        peer = peer_core(q, k, v)
        if peer is None:
            print("   skipped: nystrom-attention is not installed (pip install nystrom-attention==0.0.14)")
            return figures
        ours_fn = MECHANISMS["nystrom"].fn

        def ours():
            with validated():
                return ours_fn(q, k, v, landmarks=LANDMARKS, pinv_iterations=STEPS)

        with torch.inference_mode():
            gap = (ours().transpose(1, 2).reshape(B, n, H * D) - peer()).norm() / peer().norm()
            times = interleaved({"ours": ours, "peer": peer}, args.rounds)
        print(f"   n = {n:6d}  ours {spread(times['ours'], 1e3)} ms  peer {spread(times['peer'], 1e3)} ms  "
              f"ours/peer, median of rounds: {ratio_verdict(ratios(times['ours'], times['peer']), TARGET_RATIO)}  "
              f"outputs differ by {gap:.1e} (relative)")
        figures += [Figure.of(f"nystrom {who} seconds per call, n = {n}", times[who]) for who in ("ours", "peer")]
        figures.append(Figure.judged(f"nystrom ours/peer, n = {n}", ratios(times["ours"], times["peer"]), TARGET_RATIO))
    print("   The outputs differ because the peer starts the pseudo-inverse from Aᵀ divided by the largest column "
          "and row sums over all heads at once, ours (as the paper) per head's matrix.")
    return figures


def additive_scaling(args, settings: Settings) -> list[Figure]:
    df = sweep("additive", {"attn_dim": ATTN_DIM}, args.additive_ns, settings)
    print(f"\n3. additive, attn_dim = {ATTN_DIM}: every query scores every key through {ATTN_DIM} tanh units")
    for _, r in df.iterrows():
        n, t = r["n"], r["time_median_s"]
        print(f"   n = {n:5d}  {t * 1e3:9.2f} ms (IQR {r['time_iqr_s'] * 1e3:7.2f}, fastest "
              f"{min(r['time_samples']) * 1e3:8.2f})  per query "
              f"{t / (B * H * n) * 1e6:7.2f} µs  per (pair, hidden unit) {t / (B * H * n * n * ATTN_DIM) * 1e9:5.2f} ns"
              f"  peak {format_bytes(r['peak_bytes'])}{'  disturbed' if r['disturbed'] else ''}")
    t, _, note = slopes(df)
    big = args.additive_ns[-3]
    _, m, _ = slopes(df, big)
    print(f"   log-log slopes n = {args.additive_ns[0]}…{args.additive_ns[-1]}: time {t:.2f} (≈ 2 expected: n² "
          f"pairs){note}; memory from n = {big}: {m:.2f} (the (n, n) scores and their softmax, as textbook "
          "softmax; at small n the bounded tanh workspace outweighs them)")
    return [Figure(f"additive time slope, n = {args.additive_ns[0]}…{args.additive_ns[-1]}", t, "slope",
                   target="≈ 2 (n² pairs)"),
            Figure.slope(f"additive memory slope, n = {big}…{args.additive_ns[-1]}", m)]


def options(p: argparse.ArgumentParser) -> None:
    p.add_argument("--repeats", type=int, default=3, help="minimum timed samples per engine point")
    p.add_argument("--min-time", type=float, default=0.3, help="minimum seconds of timed samples per engine point")
    p.add_argument("--parts", default="1,2,3", help="which of the three to run, e.g. 1,2")
    p.add_argument("--quick", action="store_true", help="n = 4096…16384 and 256…1024, 5 rounds at 4096 only")


def settle(args: argparse.Namespace) -> None:
    args.nystrom_ns, args.peer_ns, args.additive_ns = powers(4096, 32768), [4096, 16384], powers(256, 2048)
    if args.quick:
        args.nystrom_ns, args.peer_ns, args.additive_ns, args.rounds = powers(4096, 16384), [4096], powers(256, 1024), 5


def measure(args: argparse.Namespace) -> list[Figure]:
    settings = Settings(warmup=1, min_repeats=args.repeats, min_time_s=args.min_time, point_budget_s=120.0,
                        threads=args.threads)
    parts, figures = set(args.parts.split(",")), []
    if "1" in parts:
        figures += nystrom_scaling(args, settings)
    if "2" in parts:
        figures += against_peer(args)
    if "3" in parts:
        figures += additive_scaling(args, settings)
    return figures


BENCHMARK = Benchmark(
    "landmark", "Nyströmformer (slopes, and against nystrom-attention) and additive attention (slope).",
    measure, options, settle,
    lambda args: f"B={B}, H={H}, D={D}, fp32, forward. Timings on a shared machine are noisy: read the IQRs and "
                 "the disturbed marks.",
    Machine(threads=2, devices=("cpu",), rounds=7, clocks=("wall",)), __doc__)


def main(argv: list[str] | None = None) -> int:
    return run(BENCHMARK, argv)


if __name__ == "__main__":
    raise SystemExit(main())
