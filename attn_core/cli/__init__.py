"""Command line: `python -m attn_core sweep ...` measures a sweep in the worker, shows progress on stderr, prints a
summary table and saves the run as JSON or CSV; `python -m attn_core show RUN` prints a saved run's summary;
`python -m attn_core plan MODEL --context N` prints what a model's attention holds and costs at N tokens;
`python -m attn_core runs list|show|export|delete|import|prune|resume` works on the local run store;
`python -m attn_core recall --mechanisms ...` trains each mechanism on associative recall and prints its accuracy
beside its state bytes and train time;
`python -m attn_core distributed --scheme ring|ulysses|state ...` splits one attention over P local processes;
`python -m attn_core native build|status` builds the C++ kernels or says which form the CPU kernels take."""
from __future__ import annotations

import argparse
import contextlib
import functools
import importlib
import sys
from typing import Sequence, TextIO

from attn_core.cli.common import (EPILOG, EXIT_BUSY, EXIT_OK, EXIT_POINTS, EXIT_SIGNALLED, EXIT_UNSAVED, EXIT_USAGE,
                                  Interrupted, StopSignals, Verb, out_problem, parse_mechanisms, parse_ns, parse_size)
from attn_core.cli.sweep import config_from_args, format_summary, save_or_fall_back

# The verbs, in the order --help lists them: each a module with NAME, add_parser(sub) and run(args, out, err) (the
# Verb protocol). A study's verb lives in its study's folder; adding a verb is one file and one entry here. They are
# named, and imported when the parser is built: a study's verb imports this package's common pieces, so importing
# the studies from here would make the command line and the studies import each other.
VERB_MODULES = ("attn_core.cli.sweep", "attn_core.cli.show", "attn_core.studies.planner.cli", "attn_core.cli.runs",
                "attn_core.studies.recall.cli", "attn_core.studies.parallel.cli", "attn_core.cli.native")


@functools.cache
def verbs() -> tuple[Verb, ...]:
    """The verb modules of VERB_MODULES, imported once."""
    return tuple(importlib.import_module(name) for name in VERB_MODULES)

_size = parse_size  # the name the tests know

__all__ = ["EXIT_BUSY", "EXIT_OK", "EXIT_POINTS", "EXIT_SIGNALLED", "EXIT_UNSAVED", "EXIT_USAGE", "Interrupted",
           "StopSignals", "VERB_MODULES", "Verb", "build_parser", "config_from_args", "format_summary", "main",
           "out_problem", "parse_mechanisms", "parse_ns", "parse_size", "save_or_fall_back", "verbs"]


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m attn_core", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter, epilog=EPILOG)
    sub = parser.add_subparsers(dest="command", required=True,
                                metavar="{" + ",".join(verb.NAME for verb in verbs()) + "}")
    for verb in verbs():
        verb.add_parser(sub)
    return parser


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
    runs_of = {verb.NAME: verb.run for verb in verbs()}
    return runs_of[args.command](args, out, err)
