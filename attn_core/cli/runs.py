"""`python -m attn_core runs list|show|export|delete|import|prune|resume`: the runs kept in the local run store."""
from __future__ import annotations

import argparse
import json
import math
import os
from typing import TextIO

from attn_core.cli.common import (EXIT_BUSY, EXIT_OK, EXIT_POINTS, EXIT_SIGNALLED, EXIT_USAGE, LIST_CHARS,
                                  StopSignals, add_store_arguments, count, out_problem, report_kept, wait_problem)
from attn_core.cli.sweep import follow_or_cancel, format_summary
from attn_core.engine import env, store
from attn_core.engine.files import write_atomic
from attn_core.engine.job import Job
from attn_core.engine.lock import LOCK_WAIT_S
from attn_core.engine.measure import format_bytes
from attn_core.engine.results import RunFileError, load_run
from attn_core.engine.untrusted import printable, terminal

NAME = "runs"


def add_parser(sub: argparse._SubParsersAction) -> None:
    r = sub.add_parser(NAME, help="the runs kept in the local run store: list, show, export, delete, import, "
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


def run(args: argparse.Namespace, out: TextIO, err: TextIO) -> int:
    """One verb on the run store; EXIT_USAGE with a sentence for a store, run or file that cannot be used."""
    try:
        if args.verb == "resume":
            return _resume(args, out, err)
        with store.Store(args.store, readonly=args.verb in ("list", "show", "export")) as kept:
            return _VERBS[args.verb](kept, args, out, err)
    except (store.StoreError, RunFileError, OSError, ValueError) as e:
        err.write(f"error: {printable(e)}\n")
        return EXIT_USAGE


def _list(kept: store.Store, args: argparse.Namespace, out: TextIO, err: TextIO) -> int:
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


def _show(kept: store.Store, args: argparse.Namespace, out: TextIO, err: TextIO) -> int:
    info, kept_run = kept.info(args.id), kept.run(args.id)
    out.write(f"run {info['id']} '{terminal(info['name'], 200)}', {terminal(info['status'], 40)}, created "
              f"{terminal(info['created'], 40)}" + (f"; note: {terminal(info['note'], 2000)}" if info["note"] else "")
              + "\n")
    out.write(format_summary(kept_run.frame) + "\n")
    return EXIT_OK


def _export(kept: store.Store, args: argparse.Namespace, out: TextIO, err: TextIO) -> int:
    if why := out_problem(args.out):
        raise ValueError(why)
    data = store.export_bytes(kept.run(args.id), os.path.splitext(args.out)[1], f"run {args.id}")
    write_atomic(args.out, data)  # as save_run writes it: whole, or the file there before kept
    err.write(f"saved run {args.id} to {args.out}\n")
    return EXIT_OK


def _delete(kept: store.Store, args: argparse.Namespace, out: TextIO, err: TextIO) -> int:
    for run_id in args.ids:
        kept.info(run_id)  # every id exists, or nothing is deleted
    err.write(f"deleted {count(kept.delete(args.ids), 'run')}\n")
    return EXIT_OK


def _import(kept: store.Store, args: argparse.Namespace, out: TextIO, err: TextIO) -> int:
    loaded = load_run(args.path, name=args.path)
    run_id = kept.import_run(loaded, args.name if args.name is not None else os.path.basename(args.path))
    err.write(f"imported {args.path} as run {run_id} ({count(len(loaded.frame), 'point')})\n")
    out.write(f"{run_id}\n")
    return EXIT_OK


def _prune(kept: store.Store, args: argparse.Namespace, out: TextIO, err: TextIO) -> int:
    if args.keep is not None and args.keep < 0:
        raise ValueError(f"--keep {args.keep}: give the number of newest runs to keep, 0 or more")
    if args.days is not None and not (math.isfinite(args.days) and args.days >= 0):
        raise ValueError(f"--days {args.days!r}: give the age in days as a finite number, 0 or more")
    if args.keep is None and args.days is None:
        raise ValueError("say what to prune: --keep N keeps the N newest runs, --days D deletes those older than D "
                         "days")
    before = kept.size_bytes()
    gone = kept.prune(keep=args.keep, older_than_days=args.days)
    err.write(f"deleted {count(gone, 'run')}; the store went from {format_bytes(before)} to "
              f"{format_bytes(kept.size_bytes())}\n")
    return EXIT_OK


_VERBS = {"list": _list, "show": _show, "export": _export, "delete": _delete, "import": _import, "prune": _prune}


def _resume(args: argparse.Namespace, out: TextIO, err: TextIO) -> int:
    """Measure what run `args.id` lacks into it; the exit codes of sweep."""
    if (why := wait_problem(args.wait)) is not None:
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
    err.write(f"measuring the {count(plan.missing, 'point')} run {args.id} lacks\n")
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
