"""`python -m attn_core distributed --scheme ring|ulysses|state ...`: one attention split over P local processes
(schemes), the bytes each sent counted beside the cost model."""
from __future__ import annotations

import argparse
import json
import signal
from typing import TextIO

from attn_core.cli.common import (EXIT_BUSY, EXIT_OK, EXIT_SIGNALLED, EXIT_USAGE, Lenient, StopSignals, parse_size,
                                  wait_problem)
from attn_core.engine.lock import LOCK_WAIT_S
from attn_core.engine.measure import format_bytes
from attn_core.engine.untrusted import printable

NAME = "distributed"


def add_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(NAME, help="one attention split over P processes on this machine (ring, Ulysses, "
                                  "state passing), bytes sent counted beside the cost model")
    p.add_argument("--scheme", required=True, choices=("ring", "ulysses", "state"),
                   help="ring: key/value blocks passed around a ring (softmax); ulysses: heads exchanged by "
                        "all-to-all (any mechanism over q, k, v); state: the running state of linear, mamba2, "
                        "gated_deltanet or kda passed on (causal)")
    p.add_argument("--mechanism", default="softmax", help="a mechanism key (default %(default)s)")
    p.add_argument("--procs", type=int, default=2, help="processes P (default %(default)s)")
    p.add_argument("--n", type=int, default=1024, help="sequence length, a multiple of P (causal ring: of 2·P)")
    p.add_argument("--heads", type=int, default=8, help="attention heads (default %(default)s)")
    p.add_argument("--head-dim", type=int, default=64, help="values a head (default %(default)s)")
    p.add_argument("--batch", type=int, default=1, help="batch size (default %(default)s)")
    p.add_argument("--causal", action="store_true", help="causal masking")
    p.add_argument("--seed", type=int, default=0, help="seed of q, k, v (default %(default)s)")
    p.add_argument("--timeout", type=float, default=60.0, metavar="SECONDS",
                   help="the longest wait on any one collective; a dead or stalled process ends the run "
                        "(default %(default)s)")
    p.add_argument("--device", default=None, help="cpu (gloo) or cuda (NCCL); default cuda where present")
    p.add_argument("--no-memory", action="store_true", help="skip the peak-memory run of each process")
    p.add_argument("--memory-margin", type=float, default=0.2, metavar="FRACTION",
                   help="safety margin of the memory guard: skip the run when its predicted bytes (P processes and "
                        "the single-process reference) × (1 + margin) exceed the free memory (default %(default)s)")
    p.add_argument("--memory-limit", type=parse_size, default=None, metavar="SIZE",
                   help="treat the machine as having at most this much free memory, e.g. 8GiB")
    p.add_argument("--wait", type=float, default=LOCK_WAIT_S, metavar="SECONDS",
                   help="if a sweep is running on this machine, wait this long for it, then give up with exit code 3 "
                        "(default %(default)s)")
    p.add_argument("--json", action="store_true", help="print the result as one JSON object")


def run(args: argparse.Namespace, out: TextIO, err: TextIO) -> int:
    """Run one distributed task; EXIT_USAGE for a task refused, EXIT_BUSY for a run that could not finish (another
    sweep holds the machine, a rank died or stalled), 128 + the signal for a stop (Ctrl-C, SIGTERM, SIGHUP), which
    ends every process first. A task the memory guard skips is a result: its reason, EXIT_OK, as in a sweep."""
    from attn_core.studies import parallel as distributed  # torch.distributed only when this verb runs

    if (why := wait_problem(args.wait)) is not None:
        err.write(f"error: {why}\n")
        return EXIT_USAGE
    with StopSignals() as stops:
        try:
            result = distributed.run(args.scheme, args.mechanism, args.procs, args.n, causal=args.causal,
                                     batch=args.batch, heads=args.heads, head_dim=args.head_dim, seed=args.seed,
                                     timeout_s=args.timeout, device=args.device, memory=not args.no_memory,
                                     lock_wait_s=args.wait, memory_margin=args.memory_margin,
                                     memory_limit_bytes=args.memory_limit)
        except ValueError as e:
            err.write(f"error: {printable(e)}\n")
            return EXIT_USAGE
        except distributed.DistributedError as e:
            err.write(f"error: {printable(e)}\n")
            return EXIT_BUSY
        except KeyboardInterrupt as e:  # Ctrl-C, or Interrupted by another stop signal: the ranks are ended by now
            signum = getattr(e, "signum", signal.SIGINT)
            Lenient(err).write(f"\n{signal.Signals(signum).name}: stopped; all {args.procs} processes were "
                               "ended\n")
            return EXIT_SIGNALLED + signum
        finally:
            stops.armed = False
    if args.json:
        out.write(json.dumps(result.to_dict(), indent=2) + "\n")
        return EXIT_OK
    _print_result(result, out)
    return EXIT_OK


def _print_result(result, out: TextIO) -> None:
    """The task, the difference from one process, and each rank's time, peak memory and bytes sent."""
    t = result.task
    if result.status == "skipped":
        out.write(f"{t.scheme} of {t.mechanism} over {t.procs} processes, n = {t.n}: skipped, {result.reason}\n")
        return
    out.write(f"{t.scheme} of {t.mechanism} over {t.procs} processes ({result.backend}), n = {t.n}, "
              f"{'causal' if t.causal else 'not causal'}: max |Δ| from one process {result.max_abs_diff:.3g}\n")
    for rank in range(t.procs):
        peak = result.peak_bytes[rank]
        out.write(f"  rank {rank}: {result.time_s[rank] * 1e3:8.2f} ms ({result.comm_s[rank] * 1e3:.2f} ms waiting on "
                  f"transfers), peak {format_bytes(peak) if peak is not None else 'not measured':>10s}, sent "
                  f"{result.bytes_sent[rank]:,} B (model {result.bytes_predicted[rank]:,} B)\n")
    out.write(f"note: peak memory by {result.memory_method}\n")
