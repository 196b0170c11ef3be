"""`python -m attn_core sweep ...`: measure a sweep in the worker, progress on stderr, a summary table on stdout, the
run saved as JSON or CSV (and kept in the run store)."""
from __future__ import annotations

import argparse
import dataclasses
import os
import signal
import tempfile
from typing import TextIO

from attn_core.cli.common import (EPILOG, EXIT_BUSY, EXIT_OK, EXIT_POINTS, EXIT_SIGNALLED, EXIT_UNSAVED, EXIT_USAGE,
                                  LIST_CHARS, Lenient, StopSignals, add_store_arguments, count, out_problem,
                                  parse_mechanisms, parse_ns, parse_size, report_kept, store_problem, wait_problem)
from attn_core.engine import analysis, env, job as sweep_job, worker
from attn_core.engine.config import DEFAULT_SWEEP, SweepConfig
from attn_core.engine.job import Job, Progress
from attn_core.engine.lock import LOCK_WAIT_S
from attn_core.engine.measure import format_bytes, resolve_mechanisms
from attn_core.engine.measurement import Measurement
from attn_core.engine.positions import NAMES, POSITIONS
from attn_core.engine.problem import MODES, Problem, Settings, sharing
from attn_core.engine.results import Run, save_run
from attn_core.engine.untrusted import printable, terminal
from attn_core.mechanisms import LATENT, MECHANISMS
from attn_core.mechanisms.flex import IMPLEMENTATIONS
from attn_core.spec import DTYPE_BYTES

NAME = "sweep"


def add_parser(sub: argparse._SubParsersAction) -> None:
    d = {**dataclasses.asdict(Problem()), **dataclasses.asdict(Settings())}  # the library's defaults
    s = sub.add_parser(NAME, help="measure time and peak memory over sequence lengths",
                       formatter_class=argparse.RawDescriptionHelpFormatter, epilog=EPILOG,
                       description="Measure each mechanism at each n in a separate worker process, one point at a "
                                   "time; rows stream in as they finish.")
    _problem_arguments(s, d)
    _settings_arguments(s, d)
    s.add_argument("--extra-mechanisms", default="", metavar="REFS",
                   help="your own mechanisms to measure too: comma-separated module:attribute references to a "
                        "MechanismSpec (or a dict or list of them); use their keys in --mechanisms")
    s.add_argument("--wait", type=float, default=LOCK_WAIT_S, metavar="SECONDS",
                   help="if another sweep is running on this machine, wait this long for it, then give up with "
                        "exit code 3 (default %(default)s)")
    s.add_argument("--out", default=None, metavar="PATH", help="save the run; .json or .csv chooses the format")
    s.add_argument("--quiet", action="store_true", help="no progress bar")
    add_store_arguments(s)


def _problem_arguments(s: argparse.ArgumentParser, d: dict) -> None:
    """What is measured: the mechanisms, the lengths and the problem around them (Problem's fields)."""
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


def _settings_arguments(s: argparse.ArgumentParser, d: dict) -> None:
    """How it is measured: threads, timing, the memory run and its guard, the seed (Settings' fields)."""
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
    s.add_argument("--memory-limit", type=parse_size, default=None, metavar="SIZE",
                   help="treat the device as having at most this much free memory, e.g. 8GiB")
    s.add_argument("--seed", type=int, default=d["seed"],
                   help="seed of inputs and random projections (default %(default)s)")


def config_from_args(args: argparse.Namespace) -> SweepConfig:
    problem = Problem(batch=args.batch, heads=args.heads, kv_heads=args.kv_heads, d_model=args.d_model,
                      dtype=args.dtype, device=args.device, mode=args.mode, causal=args.causal, padding=args.padding,
                      seed=args.seed, positions=args.positions, implementation=args.implementation)
    settings = Settings(warmup=args.warmup, min_repeats=args.min_repeats, min_time_s=args.min_time,
                        point_budget_s=args.point_budget, measure_memory=not args.no_memory,
                        memory_margin=args.memory_margin, memory_limit_bytes=args.memory_limit, threads=args.threads)
    return SweepConfig(mechanisms=args.mechanisms, ns=tuple(args.n), problem=problem, settings=settings)


def run(args: argparse.Namespace, out: TextIO, err: TextIO) -> int:
    problems = [p for p in (out_problem(args.out) if args.out else None, wait_problem(args.wait)) if p]
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
    err.write(f"measuring {count(config.points, 'point')}: {count(len(config.mechanisms), 'mechanism')} × "
              f"{count(len(set(config.ns)), 'length')}{estimate}\n")
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


# -- following a job: a progress bar on a terminal, a line a point otherwise ---------------------------------------------

def follow_or_cancel(job: Job, stops: StopSignals, out: TextIO, err: TextIO, quiet: bool = False) -> tuple:
    """Follow `job` to its end; a stop signal or Ctrl-C is noted in `stops`, said, and cancels the job, waited for.
    The streams come back lenient after a signal (a hangup takes the terminal away)."""
    try:
        follow(job, err, quiet)
    except KeyboardInterrupt as e:  # Ctrl-C, or Interrupted by another stop signal
        out, err = Lenient(out), Lenient(err)
        stops.received[:1] = [getattr(e, "signum", signal.SIGINT)]
        err.write(f"\n{signal.Signals(stops.received[0]).name}: cancelling; the points finished so far are kept…\n")
        job.cancel()
        job.wait()
    finally:
        stops.armed = False
    return out, err


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
    own = (" sinks" if row["sinks"] else "") + (f" keep_first={row['keep_first']}" if row["keep_first"] else "")
    what = f"{row['mechanism']}{shared}{own}{where}{by} n={row['n']}"
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


# -- the summary and the saved file ------------------------------------------------------------------------------------

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
