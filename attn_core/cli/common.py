"""What several verbs of the command line share: exit codes, the parsers of sizes, lengths and mechanism lists, the
--out probe, the run store's arguments, and the handling of stop signals (Ctrl-C, SIGTERM, SIGHUP)."""
from __future__ import annotations

import argparse
import contextlib
import math
import os
import re
import signal
import threading
from typing import Protocol, TextIO

from attn_core.engine import store
from attn_core.engine.config import log_spaced
from attn_core.engine.job import Job
from attn_core.mechanisms import MECHANISMS

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


class Verb(Protocol):
    """A verb of `python -m attn_core`: a module with these three names, listed in attn_core/cli/__init__.py."""

    NAME: str

    def add_parser(self, sub: argparse._SubParsersAction) -> None:
        """Add the verb's subparser (named NAME) to `sub`."""

    def run(self, args: argparse.Namespace, out: TextIO, err: TextIO) -> int:
        """Do what the parsed `args` ask, results on `out`, progress and errors on `err`; the exit code."""


# -- arguments ---------------------------------------------------------------------------------------------------------

def parse_size(text: str) -> int:
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


def wait_problem(wait_s: float) -> str | None:
    if math.isfinite(wait_s) and wait_s >= 0:
        return None
    return f"--wait {wait_s!r}: give the seconds to wait for another sweep as a finite number, 0 or more"


def count(k: int, thing: str) -> str:
    return f"{k:,} {thing}{'' if k == 1 else 's'}"


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


# -- the run store: `sweep --store/--no-store`, `runs ... --store` ------------------------------------------------------

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


# -- stop signals ------------------------------------------------------------------------------------------------------

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


class Lenient:
    """A stream whose writes may fail silently: after a hangup the terminal is gone, and writing to it must not stop
    the save."""

    def __init__(self, stream: TextIO):
        self.stream = stream

    def write(self, text: str) -> None:
        with contextlib.suppress(OSError, ValueError):
            self.stream.write(text)
            self.stream.flush()
