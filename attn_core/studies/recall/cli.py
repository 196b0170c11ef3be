"""`python -m attn_core recall --mechanisms ...`: train each mechanism on associative recall (mqar) and print its
accuracy beside its state bytes and train time; --out saves the table the page reads."""
from __future__ import annotations

import argparse
import json
import shlex
import signal
from typing import TextIO

from attn_core.cli.common import (EXIT_OK, EXIT_SIGNALLED, EXIT_USAGE, Lenient, StopSignals, count, out_problem,
                                  parse_mechanisms)
from attn_core.engine import env
from attn_core.engine.files import write_atomic
from attn_core.engine.measure import format_bytes
from attn_core.engine.untrusted import printable
from attn_core.studies.recall import mqar as recall

NAME = "recall"
RECALL_MECHANISMS = ",".join(recall.Result(key, params).name for key, params in recall.DEFAULT_MECHANISMS)


def add_parser(sub: argparse._SubParsersAction) -> None:
    """The `recall` subcommand; every flag defaults to the page's defaults (recall.Setup())."""
    d = recall.Setup()
    r = sub.add_parser(NAME, help="train each mechanism on multi-query associative recall (MQAR)",
                       description="Train a tiny causal model of each mechanism on MQAR (Zoology, arXiv 2312.04927) "
                                   "once per learning rate; print the best held-out accuracy, the cache or state "
                                   "bytes one layer holds for one sequence, and the seconds training took.")
    r.add_argument("--mechanisms", type=parse_mechanisms, default=RECALL_MECHANISMS, metavar="LIST",
                   help=f"comma-separated keys, each optionally with parameters key:name=value (kv_heads=G shares "
                        f"key/value heads), as for sweep; causal mechanisms only (default {RECALL_MECHANISMS})")
    r.add_argument("--seq", type=int, default=d.task.seq, metavar="N", help="tokens a sequence (default %(default)s)")
    r.add_argument("--pairs", type=int, default=d.task.pairs, metavar="K",
                   help="key-value pairs a sequence, each queried once: 4K <= N (default %(default)s)")
    r.add_argument("--vocab", type=int, default=d.task.vocab, help="vocabulary size, keys in its first half, "
                                                                  "values in its second (default %(default)s)")
    r.add_argument("--d-model", type=int, default=d.d_model, help="model width (default %(default)s)")
    r.add_argument("--layers", type=int, default=d.layers, help="attention + MLP blocks (default %(default)s)")
    r.add_argument("--heads", type=int, default=d.heads, help="attention heads (default %(default)s)")
    r.add_argument("--steps", type=int, default=d.steps, help="training steps per learning rate (default %(default)s)")
    r.add_argument("--batch", type=int, default=d.batch, help="sequences a step (default %(default)s)")
    r.add_argument("--lrs", type=_learning_rates, default=d.lrs, metavar="LIST",
                   help=f"learning rates swept, the best reported (default {','.join(map(str, d.lrs))})")
    r.add_argument("--eval", type=int, default=d.eval_sequences, metavar="SEQUENCES",
                   help="held-out sequences for the final accuracy (default %(default)s)")
    r.add_argument("--seed", type=int, default=d.seed, help="seed of weights and data (default %(default)s)")
    r.add_argument("--threads", type=int, default=d.threads,
                   help="torch CPU threads while training (default %(default)s: tiny matrices gain nothing from more)")
    r.add_argument("--device", default="cpu", help="cpu (default), cuda or mps")
    r.add_argument("--json", action="store_true", help="print one JSON list, an object per mechanism")
    r.add_argument("--out", default=None, metavar="PATH",
                   help="also save the results as a JSON file with the command, the machine and the versions (the "
                        "form of the page's reference table); Ctrl-C or SIGTERM saves the mechanisms finished, the one "
                        "in flight marked stopped, and exits 128 + the signal")
    r.add_argument("--note", default="", help="a sentence saved with --out (e.g. how busy the machine was)")


def _learning_rates(text: str) -> tuple[float, ...]:
    try:
        return tuple(float(p) for p in text.split(",") if p.strip())
    except ValueError:
        raise argparse.ArgumentTypeError(f"--lrs {text!r}: write learning rates like 3e-3,1e-2") from None


def run(args: argparse.Namespace, out: TextIO, err: TextIO) -> int:
    """Train each mechanism in turn, progress on `err`; the results on `out` as a table or JSON."""
    try:
        setup = recall.Setup(task=recall.Task(args.vocab, args.seq, args.pairs), d_model=args.d_model,
                             layers=args.layers, heads=args.heads, steps=args.steps, batch=args.batch,
                             lrs=args.lrs, eval_sequences=args.eval, seed=args.seed, device=args.device,
                             threads=args.threads).check()
        for key, params in args.mechanisms:
            recall.check_mechanism(key, dict(params), setup)
    except ValueError as e:
        err.write(f"error: {printable(e)}\n")
        return EXIT_USAGE
    if args.out and (problem := out_problem(args.out)):
        err.write(f"error: {problem}\n")
        return EXIT_USAGE
    results, stopped = _train_each(args.mechanisms, setup, err)
    if stopped:  # Ctrl-C, SIGTERM or a hangup (the terminal may be gone): what finished is kept
        out, err = Lenient(out), Lenient(err)
        finished = sum(not r.stopped for r in results)
        err.write(f"\n{signal.Signals(stopped).name}: stopped; {count(finished, 'mechanism')} finished "
                  f"{'is' if finished == 1 else 'are'} kept" + (", the one in flight marked stopped\n"
                                                              if finished < len(results) else "\n"))
    if args.out:
        stamp = env.environment(setup.device, "float32", setup.threads)
        note = args.note + (f" (stopped by {signal.Signals(stopped).name})" if stopped else "")
        made = recall.provenance(results, setup, command=shlex.join(["python", "-m", "attn_core", *args.argv]),
                                 stamp=stamp, note=note.strip())
        write_atomic(args.out, (json.dumps(made, indent=1) + "\n").encode())
        err.write(f"saved to {args.out}\n")
    code = EXIT_SIGNALLED + stopped if stopped else EXIT_OK  # 130 Ctrl-C, 143 SIGTERM
    if args.json:
        out.write(json.dumps([r.as_dict() for r in results], indent=2) + "\n")
        return code
    _print_table(results, setup, out)
    return code


def _train_each(mechanisms, setup: recall.Setup, err: TextIO) -> tuple[list, int]:
    """Each mechanism trained in turn, a line on `err` as each finishes; the results, and the first stop signal's
    number (0 when none came): a stop is asked for between steps, and the one in flight ends marked stopped."""
    results = []
    with StopSignals() as stops:
        stops.armed = False  # a stop is asked for between steps (train's `stop`): the one in flight ends marked
        for key, params in mechanisms:
            if stops.received:
                break
            result = recall.train(key, params, setup, stop=lambda: bool(stops.received))
            results.append(result)
            if not stops.received:
                err.write(f"{result.name}: accuracy {result.accuracy:.3f} (lr {result.best_lr:g}) in "
                          f"{result.train_s:.1f} s\n")
    return results, (stops.received[0] if stops.received else 0)


def _print_table(results: list, setup: recall.Setup, out: TextIO) -> None:
    out.write(f"{'mechanism':32s} {'accuracy':>8s} {'state a layer':>14s} {'train':>8s}\n")
    for r in results:
        state = format_bytes(r.state_bytes) if r.state_bytes == r.state_bytes else "n/a"
        mark = " (stopped)" if r.stopped else ""
        out.write(f"{r.name:32s} {r.accuracy:8.3f} {state:>14s} {r.train_s:7.1f}s{mark}\n")
    out.write(f"chance: {setup.task.chance:.3f} (one of {setup.task.vocab - setup.task.vocab // 2} values)\n")
