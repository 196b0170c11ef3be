"""Ring attention over 2 processes against the single-process kernel, at several n, with the share of time spent
waiting on transfers and the bytes sent beside the cost model:

    python -m attn_core.benchmarks.distributed            # n = 1024…8192, 5 rounds
    python -m attn_core.benchmarks.distributed --quick    # n = 1024 and 2048, 3 rounds

B = 1, H = 8, D = 64, float32, forward, not causal (--causal: zig-zag causal), on the CPU over gloo. The ring's time
is the slower rank's, one call per round after one untimed call, all rounds in one process group; the single
process runs softmax (materialized, the arithmetic each ring step does on its block) and sdpa with all the threads
the ring's two processes share between them. On a machine of few cores the two processes share those cores: the
ring then splits the work without adding any, and what it shows is the cost of splitting (transfers, the online
softmax), not a speed-up. Ring attention pays off where each process has a device of its own (Liu, Zaharia, Abbeel
2023, arXiv 2310.01889); see attn_core.studies.parallel.cost.overlap_block for when the transfer hides behind the compute.
"""
from __future__ import annotations

import argparse
import os
import time

import torch

from . import median, powers, spread
from .runner import Benchmark, Figure, Machine, run
from attn_core.studies import parallel as dist_attn
from ..mechanisms import MECHANISMS

HEADS, HEAD_DIM, PROCS = 8, 64, 2


def single(task: dist_attn.Task, rounds: int) -> dict[str, list[float]]:
    """Seconds per call of softmax and sdpa in this process on the task's inputs, one untimed call first."""
    q, k, v = dist_attn.inputs(task)
    times: dict[str, list[float]] = {}
    with torch.inference_mode():
        for key in ("softmax", "sdpa"):
            fn = MECHANISMS[key].fn
            fn(q, k, v, causal=task.causal)
            times[key] = []
            for _ in range(rounds):
                t0 = time.perf_counter()
                fn(q, k, v, causal=task.causal)
                times[key].append(time.perf_counter() - t0)
    return times


def options(p: argparse.ArgumentParser) -> None:
    p.add_argument("--quick", action="store_true", help="n = 1024 and 2048, 3 rounds")
    p.add_argument("--causal", action="store_true", help="causal, zig-zag blocks")


def settle(args: argparse.Namespace) -> None:
    args.ns = powers(1024, 2048) if args.quick else powers(1024, 8192)
    if args.quick:
        args.rounds = min(args.rounds, 3)


def setting(args: argparse.Namespace) -> str:
    cores = os.cpu_count() or 1
    return (f"ring attention over {PROCS} processes (gloo, {max(1, cores // PROCS)} thread each) against one "
            f"process ({torch.get_num_threads()} threads); B = 1, H = {HEADS}, D = {HEAD_DIM}, float32, "
            f"{'causal' if args.causal else 'not causal'}")


def measure(args: argparse.Namespace) -> list[Figure]:
    cores, rounds, figures = os.cpu_count() or 1, args.rounds, []
    if cores <= PROCS:
        print(f"note: this machine has {cores} cores: the {PROCS} processes share them, so the ring cannot be faster "
              "than one process here; the figures show what splitting costs")
    print(f"{'n':>6s} {'ring ms':>24s} {'waiting %':>9s} {'softmax ms':>24s} {'sdpa ms':>24s} {'ring/softmax':>12s} "
          f"{'sent B/rank':>12s} {'model B':>12s} {'max |Δ|':>9s}")
    for n in args.ns:
        task = dist_attn.Task("ring", n=n, causal=args.causal, heads=HEADS, head_dim=HEAD_DIM, procs=PROCS)
        results = dist_attn.run_tasks([task] * rounds, memory=False, warmup=1)
        if results[0].status != "ok":
            print(f"{n:6d} skipped: {results[0].reason}", flush=True)
            continue
        ring = [max(r.time_s) for r in results]
        share = median([max(c / t for c, t in zip(r.comm_s, r.time_s)) for r in results])
        base = single(task, rounds)
        print(f"{n:6d} {spread(ring, 1e3):>24s} {share * 100:9.1f} {spread(base['softmax'], 1e3):>24s} "
              f"{spread(base['sdpa'], 1e3):>24s} {median(ring) / median(base['softmax']):12.2f} "
              f"{results[0].bytes_sent[0]:12,d} {results[0].bytes_predicted[0]:12,d} "
              f"{max(r.max_abs_diff for r in results):9.2g}", flush=True)
        figures += [Figure.of(f"ring seconds per call, n = {n}", ring),
                    Figure(f"ring's share of time waiting on transfers, n = {n}", share, "share"),
                    *(Figure.of(f"{key} seconds per call, one process, n = {n}", base[key]) for key in base),
                    Figure(f"ring/softmax, n = {n}", median(ring) / median(base["softmax"]), "×"),
                    Figure(f"bytes sent per rank, n = {n}", results[0].bytes_sent[0], "bytes",
                           target=f"the cost model's {results[0].bytes_predicted[0]}")]
    print("waiting %: the slower rank's seconds blocked on a transfer (after the step's compute) over its call's")
    return figures


BENCHMARK = Benchmark(
    "distributed", "Ring attention over 2 processes against the single-process kernel, the waiting and the bytes.",
    measure, options, settle, setting,
    Machine(threads=os.cpu_count() or 1, devices=("cpu",), rounds=5, clocks=("wall",)), __doc__)


def main(argv: list[str] | None = None) -> int:
    return run(BENCHMARK, argv)


if __name__ == "__main__":
    raise SystemExit(main())
