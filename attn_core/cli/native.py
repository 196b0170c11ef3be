"""`python -m attn_core native build|status`: build the C++ kernels (attn_core.native) explicitly, or say which form
the CPU kernels take here."""
from __future__ import annotations

import argparse
from typing import TextIO

from attn_core import native
from attn_core.cli.common import EXIT_OK
from attn_core.engine.untrusted import printable

NAME = "native"
EXIT_NOT_BUILT = 1  # the kernels cannot be built here; the torch ops still run


def add_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(NAME, help="build the C++ kernels, or say which form the CPU kernels take here")
    actions = p.add_subparsers(dest="action", required=True, metavar="{build,status}")
    actions.add_parser("build", help="compile the kernels (or find them built) and load them; exit 1 with the "
                                     "reason where they cannot be")
    actions.add_parser("status", help="which form the kernels take in this process (builds nothing)")


def run(args: argparse.Namespace, out: TextIO, err: TextIO) -> int:
    if args.action == "status":
        out.write(f"{printable(native.describe())}\n")
        return EXIT_OK
    try:
        said = native.build()
    except RuntimeError as e:
        err.write(f"error: {printable(e)}\n")
        return EXIT_NOT_BUILT
    out.write(f"{printable(said)}\n")
    return EXIT_OK

