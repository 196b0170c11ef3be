"""`python -m attn_core show RUN`: a saved run's machine stamp and summary."""
from __future__ import annotations

import argparse
from typing import TextIO

from attn_core.cli.common import EXIT_OK, EXIT_USAGE
from attn_core.cli.sweep import format_summary
from attn_core.engine import analysis
from attn_core.engine.results import RunFileError, load_run
from attn_core.engine.untrusted import printable, terminal

NAME = "show"


def add_parser(sub: argparse._SubParsersAction) -> None:
    show = sub.add_parser(NAME, help="print the summary of a saved run")
    show.add_argument("path", help="a .json or .csv run file")


def run(args: argparse.Namespace, out: TextIO, err: TextIO) -> int:
    try:
        saved = load_run(args.path, name=args.path)
    except RunFileError as e:
        err.write(f"error: {printable(e)}\n")
        return EXIT_USAGE
    stamp = {key: terminal(value, 80) for key, value in saved.env.items()}  # a file's text, one short line each
    out.write(f"{stamp.get('device_name', '?')} ({stamp.get('device', '?')}), torch {stamp.get('torch', '?')}, "
              f"{stamp.get('dtype', '?')}, {stamp.get('threads', '?')} threads, {stamp.get('timestamp', '?')}\n")
    out.write(format_summary(saved.frame) + "\n")
    if note := analysis.matmul_note(saved.env):
        out.write(note + "\n")
    return EXIT_OK
