"""Command line: `python -m attn_core sweep ...` measures a sweep in the worker, shows progress on stderr, prints a
summary table and saves the run as JSON or CSV; `python -m attn_core show RUN` prints a saved run's summary;
`python -m attn_core plan MODEL --context N` prints what a model's attention holds and costs at N tokens;
`python -m attn_core runs list|show|export|delete|import|prune|resume` works on the local run store;
`python -m attn_core recall --mechanisms ...` trains each mechanism on associative recall and prints its accuracy
beside its state bytes and train time;
`python -m attn_core distributed --scheme ring|ulysses|state ...` splits one attention over P local processes."""
from __future__ import annotations

import argparse
import contextlib
import dataclasses
import json
import math
import os
import re
import shlex
import signal
import sys
import tempfile
import threading
from typing import Sequence, TextIO

from attn_core.studies.planner import model as planner, measure as planner_measure
from attn_core.studies.recall import mqar as recall
from attn_core.engine import store
from attn_core.engine.files import read_regular, write_atomic
from attn_core.mechanisms.flex import IMPLEMENTATIONS
from .engine import analysis, env, job as sweep_job, worker
from .mechanisms import LATENT, MECHANISMS
from .engine.measure import format_bytes, resolve_mechanisms
from .engine.results import Run, RunFileError, load_run, save_run
from .spec import DTYPE_BYTES
from attn_core.engine.untrusted import printable, terminal
from .engine.config import DEFAULT_SWEEP, SweepConfig, log_spaced
from .engine.job import Job, Progress
from .engine.lock import LOCK_WAIT_S
from .engine.measurement import Measurement
from .engine.positions import NAMES, POSITIONS
from .engine.problem import MODES, Problem, Settings, sharing

EXIT_OK, EXIT_POINTS, EXIT_USAGE, EXIT_BUSY, EXIT_UNSAVED, EXIT_SIGNALLED = 0, 1, 2, 3, 4, 128  # 128 + signal
MAX_SIZE = 2**60  # 1 EiB: the largest --memory-limit
LIST_CHARS = 60  # of a name, machine or label from a file in a table printed on the terminal (`runs list`, `show`)
# Ctrl-C, `timeout` or a container stop, a closed terminal: each cancels the sweep and saves what it measured.
STOP_SIGNALS = tuple(getattr(signal, name) for name in ("SIGINT", "SIGTERM", "SIGHUP") if hasattr(signal, name))

EPILOG = """\
exit codes:
  0    the sweep finished; every point is ok or was deliberately skipped (memory guard, time budget)
  1    the sweep finished, but some points failed or ran out of memory (their reasons are in the table and file)
  2    bad arguments or settings (the message says what to change), or a run file that cannot be read
  3    the sweep could not run: another sweep of yours holds this machine (see --wait), the sweep lock is unsafe
       (the message says what to remove), or the worker could not start
  4    the sweep finished but --out could not be written; the run was saved to a file in the temp folder instead
       (the message says where)
  130  interrupted (Ctrl-C, SIGINT): the sweep was cancelled; the points finished so far are still saved to --out
  143  terminated (SIGTERM: `timeout`, `kill`, a container stop), and 129 hung up (SIGHUP: the terminal closed):
       the same as 130; in general 128 + the signal's number

examples:
  python -m attn_core sweep --mechanisms softmax,sliding_window --n 1024:16384 --out run.json
  python -m attn_core sweep --mechanisms sliding_window:window=128,sliding_window:window=512 --n 256,1024,4096
  python -m attn_core sweep --device cuda --dtype float16 --mode forward+backward --n 1024:32768:6 --out run.csv
  python -m attn_core sweep --mode generate --mechanisms softmax,sliding_window,linear --n 1024:65536:7
  python -m attn_core show run.json
"""


def _size(text: str) -> int:
    """'512MiB', '8GiB', '1e9' → bytes, from 1 B to 1 EiB."""
    m = re.fullmatch(r"\s*([0-9.eE+]+)\s*([KMGT]i?B?|B)?\s*", text)
    try:
        number = float(m.group(1)) if m else math.nan
    except ValueError:  # '1.2.3'
        number = math.nan
    unit = ((m and m.group(2)) or "B").upper().rstrip("B").rstrip("I")
    size = number * 1024 ** " KMGT".index(unit or " ")
    if not 1 <= size <= MAX_SIZE:  # NaN and infinity ('1e400') fail too
        raise argparse.ArgumentTypeError(f"{text!r} is not a size from 1 B to 1 EiB; write e.g. 512MiB or 8GiB")
    return int(size)


def parse_ns(text: str) -> tuple[int, ...]:
    """'1024:16384' (one n per power of two), '1024:16384:5' (5 log-spaced n) or '256,512,1024'."""
    try:
        if ":" in text:
            parts = [int(p) for p in text.split(":")]
            if len(parts) not in (2, 3):
                raise ValueError
            lo, hi = parts[0], parts[1]
            steps = parts[2] if len(parts) == 3 else max(2, round(math.log2(max(hi, 1) / max(lo, 1))) + 1)
            return log_spaced(lo, hi, steps)
        return tuple(int(p) for p in text.split(",") if p.strip())
    except ValueError:
        raise argparse.ArgumentTypeError(f"--n {text!r}: write MIN:MAX, MIN:MAX:STEPS or a list like 256,512,1024 "
                                         "(1 ≤ MIN ≤ MAX)") from None


def parse_mechanisms(text: str) -> tuple[tuple[str, dict], ...]:
    """'softmax,sliding_window:window=128:…' → ((key, params), ...); 'all' is every mechanism at its defaults."""
    if text.strip() == "all":
        return tuple((key, {}) for key in MECHANISMS)
    out = []
    for item in filter(None, (p.strip() for p in text.split(","))):
        key, *assignments = item.split(":")
        params = {}
        for a in assignments:
            name, sep, value = a.partition("=")
            if not sep:
                raise argparse.ArgumentTypeError(f"--mechanisms {item!r}: parameters read name=value, e.g. "
                                                 "sliding_window:window=128")
            params[name.strip()] = _number(value)
        out.append((key.strip(), params))
    return tuple(out)


def _number(value: str) -> int | float:
    try:
        return int(value)
    except ValueError:
        try:
            return float(value)
        except ValueError:
            raise argparse.ArgumentTypeError(f"parameter value {value!r} is not a number") from None


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m attn_core", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter, epilog=EPILOG)
    sub = parser.add_subparsers(dest="command", required=True, metavar="{sweep,show,plan,runs,recall,distributed}")
    d = {**dataclasses.asdict(Problem()), **dataclasses.asdict(Settings())}  # the library's defaults
    s = sub.add_parser("sweep", help="measure time and peak memory over sequence lengths",
                       formatter_class=argparse.RawDescriptionHelpFormatter, epilog=EPILOG,
                       description="Measure each mechanism at each n in a separate worker process, one point at a "
                                   "time; rows stream in as they finish.")
    s.add_argument("--mechanisms", type=parse_mechanisms, default="all", metavar="LIST",
                   help="comma-separated keys, each optionally with parameters key:name=value[:name=value]; "
                        f"'all' (default) is every mechanism over q, k and v. Keys: {', '.join(MECHANISMS)}; and "
                        f"multi-head latent attention's {', '.join(LATENT)} by name")
    s.add_argument("--n", type=parse_ns, default=DEFAULT_SWEEP.ns, metavar="RANGE",
                   help="sequence lengths: MIN:MAX (one per power of two), MIN:MAX:STEPS (log-spaced) or a list "
                        "256,512,1024 (default 256:4096:5)")
    s.add_argument("--batch", type=int, default=d["batch"], help="batch size B (default %(default)s)")
    s.add_argument("--heads", type=int, default=d["heads"], help="attention heads H (default %(default)s)")
    s.add_argument("--kv-heads", type=int, default=None, metavar="G",
                   help="key/value heads, each shared by heads/G query heads: G = heads is multi-head attention "
                        "(the default), 1 multi-query, between them grouped-query (GQA-G); one series may set its "
                        "own, e.g. --mechanisms sdpa,sdpa:kv_heads=2,sdpa:kv_heads=1")
    s.add_argument("--padding", type=int, default=d["padding"], metavar="KEYS",
                   help="the last KEYS keys of every sequence are padding (a key-padding mask; default 0)")
    s.add_argument("--positions", default=d["positions"], choices=list(POSITIONS),
                   help="add positions to every mechanism, their cost measured in the call: rope (q and k turned "
                        "inside it) or alibi (its bias passed as score_bias; mechanisms that take one); default none")
    s.add_argument("--d-model", type=int, default=d["d_model"],
                   help="model width; head_dim = d_model / heads (default %(default)s)")
    s.add_argument("--dtype", default=d["dtype"], choices=list(DTYPE_BYTES), help="(default %(default)s)")
    s.add_argument("--device", default="auto",
                   help="auto (cuda, then mps, then cpu), cpu, cuda or mps; available here: "
                        + ", ".join(env.available_devices()))
    s.add_argument("--mode", default="forward", choices=MODES,
                   help="forward (under inference mode), forward+backward (gradients of q, k, v; FLOPs ×3), or "
                        "generate (one new token's step against the cache of n tokens: time per token, and the "
                        "cache's bytes as memory; always causal)")
    s.add_argument("--causal", action="store_true", help="causal masking (mechanisms that cannot are refused)")
    s.add_argument("--implementation", default="ours", choices=IMPLEMENTATIONS,
                   help="who runs a mechanism defined by a mask: our kernel (default), compiled FlexAttention "
                        "(forward only on CPU; its compile and block mask are timed apart) or SDPA with a dense "
                        "boolean mask")
    s.add_argument("--threads", type=int, default=None, help="torch CPU threads (default: torch's own choice)")
    s.add_argument("--warmup", type=int, default=d["warmup"], help="untimed calls before timing (default %(default)s)")
    s.add_argument("--min-repeats", type=int, default=d["min_repeats"],
                   help="timed samples at least (default %(default)s)")
    s.add_argument("--min-time", type=float, default=d["min_time_s"], metavar="SECONDS",
                   help="timing per point at least (default %(default)s)")
    s.add_argument("--point-budget", type=float, default=d["point_budget_s"], metavar="SECONDS",
                   help="a point taking longer ends that mechanism: its larger n are skipped (default %(default)s)")
    s.add_argument("--no-memory", action="store_true", help="skip the separate peak-memory run of each point")
    s.add_argument("--memory-margin", type=float, default=d["memory_margin"], metavar="FRACTION",
                   help="safety margin of the memory guard: skip a point when predicted bytes × (1 + margin) "
                        "exceed the free memory (default %(default)s)")
    s.add_argument("--memory-limit", type=_size, default=None, metavar="SIZE",
                   help="treat the device as having at most this much free memory, e.g. 8GiB")
    s.add_argument("--seed", type=int, default=d["seed"],
                   help="seed of inputs and random projections (default %(default)s)")
    s.add_argument("--extra-mechanisms", default="", metavar="REFS",
                   help="your own mechanisms to measure too: comma-separated module:attribute references to a "
                        "MechanismSpec (or a dict or list of them); use their keys in --mechanisms")
    s.add_argument("--wait", type=float, default=LOCK_WAIT_S, metavar="SECONDS",
                   help="if another sweep is running on this machine, wait this long for it, then give up with "
                        "exit code 3 (default %(default)s)")
    s.add_argument("--out", default=None, metavar="PATH", help="save the run; .json or .csv chooses the format")
    s.add_argument("--quiet", action="store_true", help="no progress bar")
    add_store_arguments(s)
    show = sub.add_parser("show", help="print the summary of a saved run")
    show.add_argument("path", help="a .json or .csv run file")
    pl = sub.add_parser("plan", help="a model's attention cache, prefill FLOPs and decode reads at a context length")
    pl.add_argument("model", help=f"a built-in model ({', '.join(m.name for m in planner.MODELS.values())}; any "
                                  "case) or a model file (JSON, as Model.to_json writes)")
    pl.add_argument("--context", type=parse_context, default=131072, metavar="N",
                    help="tokens of context: a number, or with k (× 1,024) or M (× 1,048,576): 128k, 1M "
                         "(default 131072, at most 1M)")
    pl.add_argument("--batch", type=int, default=1, help="sequences held at once (default 1)")
    pl.add_argument("--dtype", default=None, help="the cache's dtype: bf16, fp16, fp32 (default: the model's)")
    pl.add_argument("--json", action="store_true", help="print the plan as one JSON object")
    pl.add_argument("--measure", action="store_true",
                    help="time each layer kind here and predict the model's prefill time and decode tokens/s")
    pl.add_argument("--budget", type=float, default=10.0, metavar="S",
                    help="seconds the timing of the kinds may take, about (default 10)")
    add_runs_parser(sub)
    add_recall_parser(sub)
    add_distributed_parser(sub)
    return parser


# -- recall: associative recall trained per mechanism (attn_core.studies.recall.mqar) ---------------------------------------------
RECALL_MECHANISMS = ",".join(recall.Result(key, params).name for key, params in recall.DEFAULT_MECHANISMS)


def add_recall_parser(sub) -> None:
    """The `recall` subcommand; every flag defaults to the page's defaults (recall.Setup())."""
    d = recall.Setup()
    r = sub.add_parser("recall", help="train each mechanism on multi-query associative recall (MQAR)",
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


def run_recall_command(args: argparse.Namespace, out: TextIO, err: TextIO) -> int:
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
    results = []
    with StopSignals() as stops:
        stops.armed = False  # a stop is asked for between steps (train's `stop`): the one in flight ends marked
        for key, params in args.mechanisms:
            if stops.received:
                break
            result = recall.train(key, params, setup, stop=lambda: bool(stops.received))
            results.append(result)
            if not stops.received:
                err.write(f"{result.name}: accuracy {result.accuracy:.3f} (lr {result.best_lr:g}) in "
                          f"{result.train_s:.1f} s\n")
    if stops.received:  # Ctrl-C, SIGTERM or a hangup (the terminal may be gone): what finished is kept
        out, err = _Lenient(out), _Lenient(err)
        finished = sum(not r.stopped for r in results)
        err.write(f"\n{signal.Signals(stops.received[0]).name}: stopped; {_count(finished, 'mechanism')} finished "
                  f"{'is' if finished == 1 else 'are'} kept" + (", the one in flight marked stopped\n"
                                                              if finished < len(results) else "\n"))
    if args.out:
        stamp = env.environment(setup.device, "float32", setup.threads)
        note = args.note + (f" (stopped by {signal.Signals(stops.received[0]).name})" if stops.received else "")
        made = recall.provenance(results, setup, command=shlex.join(["python", "-m", "attn_core", *args.argv]),
                                 stamp=stamp, note=note.strip())
        write_atomic(args.out, (json.dumps(made, indent=1) + "\n").encode())
        err.write(f"saved to {args.out}\n")
    code = EXIT_SIGNALLED + stops.received[0] if stops.received else EXIT_OK  # 130 Ctrl-C, 143 SIGTERM
    if args.json:
        out.write(json.dumps([r.as_dict() for r in results], indent=2) + "\n")
        return code
    out.write(f"{'mechanism':32s} {'accuracy':>8s} {'state a layer':>14s} {'train':>8s}\n")
    for r in results:
        state = format_bytes(r.state_bytes) if r.state_bytes == r.state_bytes else "n/a"
        mark = " (stopped)" if r.stopped else ""
        out.write(f"{r.name:32s} {r.accuracy:8.3f} {state:>14s} {r.train_s:7.1f}s{mark}\n")
    out.write(f"chance: {setup.task.chance:.3f} (one of {setup.task.vocab - setup.task.vocab // 2} values)\n")
    return code


def parse_context(text: str) -> int:
    """'131072', '128k' (× 1,024) or '1M' (× 1,048,576) → tokens; a sentence for anything else."""
    match = re.fullmatch(r"\s*(\d{1,9})\s*([kKmM]?)\s*", text)
    if not match:
        raise argparse.ArgumentTypeError(f"context {text[:20]!r} is not a number of tokens; write 131072, 128k or 1M")
    return int(match[1]) * {"": 1, "k": 1024, "m": 1 << 20}[match[2].lower()]


def run_plan_command(args: argparse.Namespace, out: TextIO, err: TextIO) -> int:
    """Print the plan of a built-in model or a model file; EXIT_USAGE with a sentence when it cannot be made."""
    try:
        if os.path.isfile(args.model) or args.model.endswith(".json"):
            model = planner.Model.from_json(_read_model(args.model))
        else:
            model = planner.find(args.model)
        made = planner.plan(model, args.context, batch=args.batch, dtype=args.dtype)
        predicted = _measured_plan(made, args.budget, err) if args.measure else None
    except (ValueError, OSError) as e:
        err.write(f"error: {printable(e)}\n")
        return EXIT_USAGE
    if args.json:
        out.write(json.dumps({**made.as_dict(), **({"predicted": predicted.as_dict()} if predicted else {})},
                             indent=2) + "\n")
        return EXIT_OK
    out.write(f"{terminal(model.name)} at {made.context:,} tokens, batch {made.batch}, cache in {made.dtype}"
              f"{f' ({terminal(model.source, 1000)})' if model.source else ''}\n")
    for p in made.kinds:
        what = "keys and values" if p.kind == "kv" else "recurrent state"
        out.write(f"  {p.layer.count:4d} × {terminal(p.layer.name, 80):32s} {p.layer.mechanism:15s} {what:16s} "
                  f"{format_bytes(p.bytes_per_layer):>10s} a layer, {format_bytes(p.cache_bytes):>10s} in all\n")
    out.write(f"  KV cache {format_bytes(made.kv_cache_bytes)}, recurrent state {format_bytes(made.state_bytes)}; "
              f"prefill attention {made.prefill_flops:.3g} FLOPs; a new token reads "
              f"{format_bytes(made.decode_bytes)}\n")
    for note in made.notes:
        out.write(f"note: {printable(note)}\n")
    if predicted:
        out.write(f"  predicted prefill of {made.context:,} tokens: {predicted.prefill_s:.3g} s "
                  f"({predicted.prefill_method})\n"
                  f"  predicted decode: {predicted.tokens_per_s:.3g} tokens/s, {predicted.decode_s:.3g} s a step "
                  f"({predicted.decode_method})\n")
        for kind in predicted.kinds:
            out.write(f"    {terminal(kind.layer.name, 80)}: {kind.prefill_method}; {kind.decode_method}\n")
        for note in predicted.notes:
            out.write(f"note: {printable(note)}\n")
    return EXIT_OK


def _measured_plan(made: planner.Plan, budget_s: float, err: TextIO) -> planner_measure.Prediction:
    """Time the plan's layer kinds here (about `budget_s` seconds, progress on `err`) and predict from them."""
    timings = planner_measure.measure_kinds(made.model, budget_s=budget_s,
                                            progress=lambda what: err.write(f"timing {what}\n"))
    return planner_measure.predict(made, timings)


def _read_model(path: str) -> str:
    """A model file's text, at most 1 MiB (a model is a few hundred bytes); a folder, pipe or device is refused
    (read_regular), not waited on."""
    data = read_regular(path, (1 << 20) + 1)  # one past the limit: enough to tell a larger file
    if len(data) > 1 << 20:
        raise ValueError(f"{path} is larger than 1 MiB: it is not a model file")
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError:
        raise ValueError(f"{path} is not UTF-8 text: it is not a model file") from None


def config_from_args(args: argparse.Namespace) -> SweepConfig:
    problem = Problem(batch=args.batch, heads=args.heads, kv_heads=args.kv_heads, d_model=args.d_model,
                      dtype=args.dtype, device=args.device, mode=args.mode, causal=args.causal, padding=args.padding,
                      seed=args.seed, positions=args.positions, implementation=args.implementation)
    settings = Settings(warmup=args.warmup, min_repeats=args.min_repeats, min_time_s=args.min_time,
                        point_budget_s=args.point_budget, measure_memory=not args.no_memory,
                        memory_margin=args.memory_margin, memory_limit_bytes=args.memory_limit, threads=args.threads)
    return SweepConfig(mechanisms=args.mechanisms, ns=tuple(args.n), problem=problem, settings=settings)


def _bar(progress: Progress, width: int = 24) -> str:
    done, total = progress.done, max(progress.total, 1)
    filled = round(width * done / total)
    eta = progress.eta_s
    eta_text = f"ETA {eta:4.0f} s" if eta is not None else "ETA    ? s"
    return f"[{'#' * filled}{'.' * (width - filled)}] {done}/{progress.total}  {eta_text}  {progress.current}"


def _row_line(point: Measurement) -> str:
    row = point.to_row()
    shared = f" {sharing(row['heads'], row['kv_heads'])}" if row["kv_heads"] != row["heads"] else ""
    where = f" + {NAMES[row['positions']]}" if row["positions"] != "none" else ""
    by = f" by {row['implementation']}" if row["implementation"] != "ours" else ""
    what = f"{row['mechanism']}{shared}{where}{by} n={row['n']}"
    if row["status"] != "ok":
        return f"{what}: {row['status']}: {row['reason']}"
    per, memory = (" a token", "cache") if row["mode"] == "generate" else ("", "peak")
    line = (f"{what}: {row['time_median_s'] * 1e3:.3f} ms{per} (IQR {row['time_iqr_s'] * 1e3:.3f}), "
            f"{memory} {format_bytes(row['peak_bytes']) if row['peak_bytes'] == row['peak_bytes'] else 'n/a'}")
    once = [f"{what} {row[column]:.2f} s" for what, column in (("compile", "compile_s"), ("mask", "mask_s"))
            if row[column] == row[column]]
    line += f"; once, not timed: {', '.join(once)}" if once else ""
    if row["disturbed"]:
        return line + f"  DISTURBED: other programs used {row['foreign_cpu']:.2f} cores while it was timed"
    return line + (f"  ({row['retaken']} samples retaken: other programs took CPU)" if row["retaken"] else "")


def follow(job: Job, stream: TextIO, quiet: bool = False) -> None:
    """Progress on `stream` until the job ends: a redrawn bar on a terminal, one line per point otherwise."""
    tty = stream.isatty()
    while True:
        finished = job.wait(0.1 if tty else 0.05)
        points = job.poll()
        if not quiet:
            if tty:
                stream.write("\r\033[K" + _bar(job.progress)[:150] + ("\n" if finished else ""))
            else:
                stream.writelines(_row_line(point) + "\n" for point in points)
            stream.flush()
        if finished:
            return


def format_summary(frame) -> str:
    """The summary as a fixed-width table."""
    table = analysis.summary(frame)
    if table.empty:
        return "no points"
    table["series"] = table["series"].map(lambda text: terminal(text, LIST_CHARS))  # labels from a file, one line
    shown = table[["series", "ok_points", "points", "time_exponent", "memory_exponent", "speedup_vs_softmax",
                   "memory_saving_vs_softmax", "speedup_vs_sdpa", "memory_saving_vs_sdpa", "gflops",
                   "pct_of_device"]].rename(columns={
                       "ok_points": "ok", "time_exponent": "time ~n^", "memory_exponent": "mem ~n^",
                       "speedup_vs_softmax": "×faster/softmax", "memory_saving_vs_softmax": "×smaller/softmax",
                       "speedup_vs_sdpa": "×faster/sdpa", "memory_saving_vs_sdpa": "×smaller/sdpa",
                       "gflops": "GFLOP/s", "pct_of_device": "% device"})
    lines = [shown.to_string(index=False, float_format=lambda x: f"{x:.2f}", na_rep="–")]
    problems = frame[~frame["status"].isin(["ok"])]
    for _, row in problems.iterrows():
        lines.append(f"  {terminal(row['mechanism'], LIST_CHARS)} n={row['n']}: {row['status']}: "
                     f"{terminal(row['reason'], 500)}")
    lines += _memory_lines(frame[frame["status"] == "ok"])
    lines += [f"note: {row['series']}: {terminal(row['note'], 500)}" for _, row in table.iterrows() if row["note"]]
    lines += [text for text in (analysis.mode_note(frame), analysis.precision_note(frame),
                                analysis.contention_summary(frame),
                                analysis.stopped_note(frame), *analysis.summary_notes(frame)) if text]
    return printable("\n".join(lines), keep="\n")  # the file's texts are one line each by now: the rest is ours


def _memory_lines(ok) -> list[str]:
    """'memory: <how it was measured>' (the real methods only) and how many ok points have no memory figure."""
    lines = []
    methods = sorted({m for m in ok["memory_method"] if m and not m.startswith("not measured")})
    if methods:
        lines.append("memory: " + "; ".join(terminal(m, 200) for m in methods))
    unmeasured = ok[ok["peak_bytes"].isna()]
    if len(unmeasured):
        why = sorted({m.removeprefix("not measured: ") for m in unmeasured["memory_method"]
                      if m.startswith("not measured")})
        lines.append(f"memory not measured at {len(unmeasured)} of {len(ok)} measured points"
                     + (f" ({'; '.join(terminal(w, 200) for w in why)})" if why else ""))
    return lines


def out_problem(path: str) -> str | None:
    """Why the run could not be saved to `path`, found before measuring; None when it can. The file is opened for
    appending (nothing in it changes) and removed again if the probe created it."""
    if not path.lower().endswith((".json", ".csv")):
        return f"--out {path!r}: name the file .json or .csv"
    if os.path.islink(path):  # writing through it would create or replace a file the link, not the user, names
        return f"--out {path!r} is a symbolic link (to {os.readlink(path)!r}); name the file itself, or remove the link"
    if os.path.isdir(path):
        return f"--out {path!r} is a folder; name a file in it, e.g. {os.path.join(path, 'run.json')!r}"
    folder = os.path.dirname(os.path.abspath(path))
    if not os.path.isdir(folder):
        above = folder
        while not os.path.lexists(above):
            above = os.path.dirname(above)
        if not os.path.isdir(above):
            return f"--out {path!r}: {above!r} is a file, not a folder; choose a path in a folder"
        return f"--out {path!r}: the folder {folder!r} does not exist; create it or choose another folder"
    existed = os.path.lexists(path)
    try:  # O_NONBLOCK: a FIFO with no reader fails at once instead of hanging the probe
        os.close(os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT | getattr(os, "O_NONBLOCK", 0)
                         | getattr(os, "O_NOFOLLOW", 0), 0o666))
    except OSError as e:
        return f"--out {path!r} cannot be written ({e.strerror or e}); choose a file in a folder you can write to"
    if not existed:
        with contextlib.suppress(OSError):
            os.unlink(path)
    return None


def save_or_fall_back(run: Run, path: str, err: TextIO) -> bool:
    """Save the run to `path`; when that fails, to a new file in the temp folder, saying where (the measured points
    are never lost to a full disk or a folder removed mid-sweep). True when `path` was written."""
    try:
        save_run(run, path)
        err.write(f"saved to {path}\n")
        return True
    except OSError as e:
        why = e.strerror or str(e)
    fallback = os.path.join(tempfile.gettempdir(), "attn_core-run-*")
    try:  # mkstemp: a new file of mode 0o600 under a fresh name, never an existing file or link
        fd, fallback = tempfile.mkstemp(prefix="attn_core-run-", suffix=os.path.splitext(path)[1].lower())
        os.close(fd)
        save_run(run, fallback)
    except OSError as e:
        err.write(f"error: the run could not be saved to {path} ({why}) nor to {fallback} ({e.strerror or e}); "
                  "only the summary below is left\n")
        return False
    err.write(f"error: the run could not be saved to {path} ({why}); it was saved to {fallback} instead\n")
    return False


class Interrupted(KeyboardInterrupt):
    """A stop signal arrived (`signum`): a KeyboardInterrupt, so the Ctrl-C path of cancelling and saving runs."""

    def __init__(self, signum: int):
        super().__init__(signal.Signals(signum).name)
        self.signum = signum


class StopSignals:
    """While inside `with`, STOP_SIGNALS are caught: each is noted in `received`, and the first raises Interrupted
    in the main thread while `armed` (the sweep is being followed). Once disarmed, a signal only counts: the cancel
    and the save run to their end. The previous handlers come back after. Outside the main thread, where Python
    cannot set handlers, only Ctrl-C's own KeyboardInterrupt remains."""

    def __init__(self) -> None:
        self.received: list[int] = []
        self.armed = True
        self._previous: dict = {}

    def _handle(self, signum: int, frame) -> None:
        self.received.append(signum)
        if self.armed and len(self.received) == 1:
            raise Interrupted(signum)

    def __enter__(self) -> "StopSignals":
        if threading.current_thread() is threading.main_thread():
            self._previous = {signum: signal.signal(signum, self._handle) for signum in STOP_SIGNALS}
        return self

    def __exit__(self, *exc) -> None:
        for signum, old in self._previous.items():
            signal.signal(signum, old)


class _Lenient:
    """A stream whose writes may fail silently: after a hangup the terminal is gone, and writing to it must not stop
    the save."""

    def __init__(self, stream: TextIO):
        self.stream = stream

    def write(self, text: str) -> None:
        with contextlib.suppress(OSError, ValueError):
            self.stream.write(text)
            self.stream.flush()


def run_sweep_command(args: argparse.Namespace, out: TextIO, err: TextIO) -> int:
    problems = [p for p in (out_problem(args.out) if args.out else None, _wait_problem(args.wait)) if p]
    extra = tuple(r.strip() for r in args.extra_mechanisms.split(",") if r.strip())
    try:
        config = config_from_args(args)
        problems += config.problems(resolve_mechanisms(extra))
    except ValueError as e:
        problems.append(str(e))
    if not problems and (why := store_problem(args)):
        problems.append(why)
    if problems:
        err.write("".join(f"error: {p}\n" for p in problems))
        return EXIT_USAGE
    try:
        estimate = estimate_text(config, resolve_mechanisms(extra))
    except KeyboardInterrupt:  # Ctrl-C while the worker starts: nothing measured, nothing to save
        err.write("\nSIGINT: cancelled before the first point; nothing was measured\n")
        return EXIT_SIGNALLED + signal.SIGINT
    err.write(f"measuring {_count(config.points, 'point')}: {_count(len(config.mechanisms), 'mechanism')} × "
              f"{_count(len(set(config.ns)), 'length')}{estimate}\n")
    job = Job.measure(", ".join(key for key, _ in config.mechanisms), (config,), extra_mechanisms=extra,
                      lock_wait_s=args.wait, keep=not args.no_store, store_path=args.store)
    with StopSignals() as stops:
        out, err = follow_or_cancel(job, stops, out, err, args.quiet)
        if job.error:
            err.write(f"error: {printable(job.error)}\n")
            return EXIT_BUSY
        result = job.result()
        err.write(f"{len(result.frame)} points in {job.progress.elapsed_s:.1f} s\n")
        report_kept(job, err)
        saved = save_or_fall_back(result, args.out, err) if args.out else True
        out.write(format_summary(result.frame) + "\n")
        if note := analysis.matmul_note(result.env):
            out.write(note + "\n")
    if stops.received:
        return EXIT_SIGNALLED + stops.received[0]  # 130 for Ctrl-C, 143 for SIGTERM, 129 for SIGHUP
    if not saved:
        return EXIT_UNSAVED
    return EXIT_POINTS if result.frame["status"].isin(["failed", "oom"]).any() else EXIT_OK


def estimate_text(config: SweepConfig, registry) -> str:
    """'; estimated 2 s–9 s (...)': the sweep's time from its specs' FLOPs at the matmul rate the measurement worker
    measures now (that process, not this one: no device context is made here beside it); '' when it cannot start."""
    device, settings = env.resolve_device(config.problem.device), config.settings
    try:
        running = worker.get_worker()
        running.wait_ready()
        stamp = running.environment(device, config.problem.dtype, settings.threads)
    except worker.WorkerError:
        return ""  # the sweep says why, when it starts the worker
    gflops = stamp["device_gflops"]
    fast, slow = sweep_job.estimate_s(config, gflops, registry)
    low, high = _duration(fast), _duration(slow)
    busy = ("; other programs are taking CPU now, which makes it longer (samples they slow are timed again)"
            if stamp.get("device_gflops_disturbed") else "")
    return (f"; estimated {low if low == high else f'{low}–{high}'} on a quiet machine (from the specs' FLOPs at "
            f"this machine's measured matmul rate, {gflops:,.0f} GFLOP/s, down to a tenth of it){busy}")


def _duration(seconds: float) -> str:
    """'under 1 s', '40 s', '2 min', '1.5 h': a duration as an estimate is read."""
    if seconds < 1:
        return "under 1 s"
    if seconds < 90:
        return f"{seconds:.0f} s"
    return f"{seconds / 60:.0f} min" if seconds < 5400 else f"{seconds / 3600:.1f} h"


def follow_or_cancel(job: Job, stops: StopSignals, out: TextIO, err: TextIO, quiet: bool = False) -> tuple:
    """Follow `job` to its end; a stop signal or Ctrl-C is noted in `stops`, said, and cancels the job, waited for.
    The streams come back lenient after a signal (a hangup takes the terminal away)."""
    try:
        follow(job, err, quiet)
    except KeyboardInterrupt as e:  # Ctrl-C, or Interrupted by another stop signal
        out, err = _Lenient(out), _Lenient(err)
        stops.received[:1] = [getattr(e, "signum", signal.SIGINT)]
        err.write(f"\n{signal.Signals(stops.received[0]).name}: cancelling; the points finished so far are kept…\n")
        job.cancel()
        job.wait()
    finally:
        stops.armed = False
    return out, err


def _count(k: int, thing: str) -> str:
    return f"{k:,} {thing}{'' if k == 1 else 's'}"


def _wait_problem(wait_s: float) -> str | None:
    if math.isfinite(wait_s) and wait_s >= 0:
        return None
    return f"--wait {wait_s!r}: give the seconds to wait for another sweep as a finite number, 0 or more"


def run_show_command(args: argparse.Namespace, out: TextIO, err: TextIO) -> int:
    try:
        run = load_run(args.path, name=args.path)
    except RunFileError as e:
        err.write(f"error: {printable(e)}\n")
        return EXIT_USAGE
    stamp = {key: terminal(value, 80) for key, value in run.env.items()}  # a file's text, one short line each
    out.write(f"{stamp.get('device_name', '?')} ({stamp.get('device', '?')}), torch {stamp.get('torch', '?')}, "
              f"{stamp.get('dtype', '?')}, {stamp.get('threads', '?')} threads, {stamp.get('timestamp', '?')}\n")
    out.write(format_summary(run.frame) + "\n")
    if note := analysis.matmul_note(run.env):
        out.write(note + "\n")
    return EXIT_OK


# ---- the run store: `sweep --store/--no-store` and `runs list|show|export|delete|import|prune|resume` ----

def add_store_arguments(p: argparse.ArgumentParser, *, sweeping: bool = True) -> None:
    p.add_argument("--store", default=None, metavar="PATH",
                   help=f"the run store's file (default: ${store.HOME_VARIABLE}/{store.FILE_NAME}, else "
                        f"{store.default_path()} here)")
    if sweeping:
        p.add_argument("--no-store", action="store_true", help="keep nothing in the run store")


def store_problem(args: argparse.Namespace) -> str | None:
    """Why the sweep's run store cannot be opened (found before measuring); None when it can or is not used."""
    if args.no_store:
        return None
    try:
        store.Store(args.store).close()
    except (store.StoreError, OSError) as e:
        return f"{e} (or measure with --no-store)"
    return None


def report_kept(job: Job, err: TextIO) -> None:
    if job.store_error:
        err.write(f"warning: {job.store_error}\n")
    elif job.run_id is not None:
        err.write(f"kept in the run store as run {job.run_id} ({job.store_path or store.default_path()})\n")


def add_runs_parser(sub) -> None:
    r = sub.add_parser("runs", help="the runs kept in the local run store: list, show, export, delete, import, "
                                    "prune, resume")
    verbs = r.add_subparsers(dest="verb", required=True, metavar="{list,show,export,delete,import,prune,resume}")
    ls = verbs.add_parser("list", help="every run, newest first")
    ls.add_argument("--json", action="store_true", help="a JSON list: id, status, points and more for each run")
    show = verbs.add_parser("show", help="a run's stamp and summary")
    show.add_argument("id", type=int)
    ex = verbs.add_parser("export", help="write a run as the usual run file (.json or .csv)")
    ex.add_argument("id", type=int)
    ex.add_argument("--out", required=True, metavar="PATH", help="a .json or .csv file")
    de = verbs.add_parser("delete", help="delete runs and their points")
    de.add_argument("ids", type=int, nargs="+", metavar="ID")
    im = verbs.add_parser("import", help="keep a run file (JSON or CSV, checked as `show` reads it) as a new run")
    im.add_argument("path")
    im.add_argument("--name", default=None, help="the run's name (default: the file's name)")
    pr = verbs.add_parser("prune", help="delete old runs: all but the newest --keep, or those older than --days")
    pr.add_argument("--keep", type=int, default=None, metavar="N")
    pr.add_argument("--days", type=float, default=None, metavar="D")
    re_ = verbs.add_parser("resume", help="measure the points an interrupted or failed run lacks, into that run")
    re_.add_argument("id", type=int)
    re_.add_argument("--extra-mechanisms", default="", metavar="REFS", help="as for sweep, when the run used them")
    re_.add_argument("--wait", type=float, default=LOCK_WAIT_S, metavar="SECONDS", help="as for sweep")
    for p in (ls, show, ex, de, im, pr, re_):
        add_store_arguments(p, sweeping=False)


def run_runs_command(args: argparse.Namespace, out: TextIO, err: TextIO) -> int:
    """One verb on the run store; EXIT_USAGE with a sentence for a store, run or file that cannot be used."""
    try:
        if args.verb == "resume":
            return _resume(args, out, err)
        with store.Store(args.store, readonly=args.verb in ("list", "show", "export")) as kept:
            return _RUNS_VERBS[args.verb](kept, args, out, err)
    except (store.StoreError, RunFileError, OSError, ValueError) as e:
        err.write(f"error: {printable(e)}\n")
        return EXIT_USAGE


def _runs_list(kept: store.Store, args: argparse.Namespace, out: TextIO, err: TextIO) -> int:
    history = kept.history()
    if args.json:
        out.write(json.dumps(history.to_dict("records"), indent=1, default=int) + "\n")
    elif history.empty:
        err.write(f"no runs in {kept.path}\n")
    else:
        shown = history.drop(columns="note")
        for column in ("created", "name", "machine", "mechanisms", "sizes", "status"):
            shown[column] = shown[column].map(lambda text: terminal("" if text is None else text, LIST_CHARS))
        out.write(shown.to_string(index=False) + "\n")
    return EXIT_OK


def _runs_show(kept: store.Store, args: argparse.Namespace, out: TextIO, err: TextIO) -> int:
    info, run = kept.info(args.id), kept.run(args.id)
    out.write(f"run {info['id']} '{terminal(info['name'], 200)}', {terminal(info['status'], 40)}, created "
              f"{terminal(info['created'], 40)}" + (f"; note: {terminal(info['note'], 2000)}" if info["note"] else "")
              + "\n")
    out.write(format_summary(run.frame) + "\n")
    return EXIT_OK


def _runs_export(kept: store.Store, args: argparse.Namespace, out: TextIO, err: TextIO) -> int:
    if why := out_problem(args.out):
        raise ValueError(why)
    data = store.export_bytes(kept.run(args.id), os.path.splitext(args.out)[1], f"run {args.id}")
    write_atomic(args.out, data)  # as save_run writes it: whole, or the file there before kept
    err.write(f"saved run {args.id} to {args.out}\n")
    return EXIT_OK


def _runs_delete(kept: store.Store, args: argparse.Namespace, out: TextIO, err: TextIO) -> int:
    for run_id in args.ids:
        kept.info(run_id)  # every id exists, or nothing is deleted
    err.write(f"deleted {_count(kept.delete(args.ids), 'run')}\n")
    return EXIT_OK


def _runs_import(kept: store.Store, args: argparse.Namespace, out: TextIO, err: TextIO) -> int:
    run = load_run(args.path, name=args.path)
    run_id = kept.import_run(run, args.name if args.name is not None else os.path.basename(args.path))
    err.write(f"imported {args.path} as run {run_id} ({_count(len(run.frame), 'point')})\n")
    out.write(f"{run_id}\n")
    return EXIT_OK


def _runs_prune(kept: store.Store, args: argparse.Namespace, out: TextIO, err: TextIO) -> int:
    if args.keep is not None and args.keep < 0:
        raise ValueError(f"--keep {args.keep}: give the number of newest runs to keep, 0 or more")
    if args.days is not None and not (math.isfinite(args.days) and args.days >= 0):
        raise ValueError(f"--days {args.days!r}: give the age in days as a finite number, 0 or more")
    if args.keep is None and args.days is None:
        raise ValueError("say what to prune: --keep N keeps the N newest runs, --days D deletes those older than D "
                         "days")
    before = kept.size_bytes()
    gone = kept.prune(keep=args.keep, older_than_days=args.days)
    err.write(f"deleted {_count(gone, 'run')}; the store went from {format_bytes(before)} to "
              f"{format_bytes(kept.size_bytes())}\n")
    return EXIT_OK


_RUNS_VERBS = {"list": _runs_list, "show": _runs_show, "export": _runs_export, "delete": _runs_delete,
               "import": _runs_import, "prune": _runs_prune}


def _resume(args: argparse.Namespace, out: TextIO, err: TextIO) -> int:
    """Measure what run `args.id` lacks into it; the exit codes of sweep."""
    if (why := _wait_problem(args.wait)) is not None:
        raise ValueError(why)
    with store.Store(args.store, readonly=True) as kept:
        first = store.resumable(kept, args.id)[0]
        here = env.environment(env.resolve_device(str(first.get("device", "auto"))),
                               str(first.get("dtype", "float32")), None)
        plan = store.resume_plan(kept, args.id, here)
    for note in plan.notes:
        err.write(f"note: {printable(note)}\n")
    if not plan.sweeps:
        err.write(f"run {args.id} lacks no point\n")
        return EXIT_OK
    err.write(f"measuring the {_count(plan.missing, 'point')} run {args.id} lacks\n")
    extra = tuple(r.strip() for r in args.extra_mechanisms.split(",") if r.strip())
    job = Job.measure(f"resume of run {args.id}", plan.sweeps, extra_mechanisms=extra, lock_wait_s=args.wait,
                      store_path=args.store, resume=args.id)
    with StopSignals() as stops:
        out, err = follow_or_cancel(job, stops, out, err)
    if job.error:
        err.write(f"error: {printable(job.error)}\n")
        return EXIT_BUSY
    report_kept(job, err)
    if stops.received:
        return EXIT_SIGNALLED + stops.received[0]
    return EXIT_POINTS if job.frame()["status"].isin(["failed", "oom"]).any() else EXIT_OK


# -- distributed: one attention split over P local processes (attn_core.studies.parallel.schemes) -------------------------------

def add_distributed_parser(sub) -> None:
    p = sub.add_parser("distributed", help="one attention split over P processes on this machine (ring, Ulysses, "
                                           "state passing), bytes sent counted beside the cost model")
    p.add_argument("--scheme", required=True, choices=("ring", "ulysses", "state"),
                   help="ring: key/value blocks passed around a ring (softmax); ulysses: heads exchanged by "
                        "all-to-all (any mechanism over q, k, v); state: the running state of linear, mamba2 or "
                        "gated_deltanet passed on (causal)")
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
    p.add_argument("--memory-limit", type=_size, default=None, metavar="SIZE",
                   help="treat the machine as having at most this much free memory, e.g. 8GiB")
    p.add_argument("--wait", type=float, default=LOCK_WAIT_S, metavar="SECONDS",
                   help="if a sweep is running on this machine, wait this long for it, then give up with exit code 3 "
                        "(default %(default)s)")
    p.add_argument("--json", action="store_true", help="print the result as one JSON object")


def run_distributed_command(args: argparse.Namespace, out: TextIO, err: TextIO) -> int:
    """Run one distributed task; EXIT_USAGE for a task refused, EXIT_BUSY for a run that could not finish (another
    sweep holds the machine, a rank died or stalled), 128 + the signal for a stop (Ctrl-C, SIGTERM, SIGHUP), which
    ends every process first. A task the memory guard skips is a result: its reason, EXIT_OK, as in a sweep."""
    from attn_core.studies.parallel import schemes as distributed

    if (why := _wait_problem(args.wait)) is not None:
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
            _Lenient(err).write(f"\n{signal.Signals(signum).name}: stopped; all {args.procs} processes were "
                                "ended\n")
            return EXIT_SIGNALLED + signum
        finally:
            stops.armed = False
    if args.json:
        out.write(json.dumps(result.to_dict(), indent=2) + "\n")
        return EXIT_OK
    t = result.task
    if result.status == "skipped":
        out.write(f"{t.scheme} of {t.mechanism} over {t.procs} processes, n = {t.n}: skipped, {result.reason}\n")
        return EXIT_OK
    out.write(f"{t.scheme} of {t.mechanism} over {t.procs} processes ({result.backend}), n = {t.n}, "
              f"{'causal' if t.causal else 'not causal'}: max |Δ| from one process {result.max_abs_diff:.3g}\n")
    for rank in range(t.procs):
        peak = result.peak_bytes[rank]
        out.write(f"  rank {rank}: {result.time_s[rank] * 1e3:8.2f} ms ({result.comm_s[rank] * 1e3:.2f} ms waiting on "
                  f"transfers), peak {format_bytes(peak) if peak is not None else 'not measured':>10s}, sent "
                  f"{result.bytes_sent[rank]:,} B (model {result.bytes_predicted[rank]:,} B)\n")
    out.write(f"note: peak memory by {result.memory_method}\n")
    return EXIT_OK


def main(argv: Sequence[str] | None = None, out: TextIO | None = None, err: TextIO | None = None) -> int:
    """Entry point; returns the exit code (see --help)."""
    out, err = out or sys.stdout, err or sys.stderr
    parser = build_parser()
    try:  # argparse writes its help and errors to sys.stdout/stderr: send them where the caller asked
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            args = parser.parse_args(argv)
    except SystemExit as e:  # argparse exits 2 on bad arguments, 0 on --help
        return int(e.code or 0)
    args.argv = list(sys.argv[1:] if argv is None else argv)  # the command as typed, for files that record it
    commands = {"sweep": run_sweep_command, "show": run_show_command, "plan": run_plan_command,
                "runs": run_runs_command, "recall": run_recall_command,
                "distributed": run_distributed_command}
    return commands[args.command](args, out, err)
