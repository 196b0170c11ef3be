"""The one runner every benchmark script is a configuration of: the shared machine options, the printout's header and
last line, and the script's figures written as data (`--figures`: docs/figures/<name>.json), which the docs quote, so
that a figure changes by a run, never by an edit of a sentence. (In the spirit of flash-linear-attention's
`benchmarks/ops/run.py`: a registry of configurations, one command line, machine information beside the results.)

A script declares a `Benchmark`: its name, what it measures, its own options, how they settle (--quick), the words
of its header, the shared options' defaults it takes (`Machine`), and a body that prints its lines and returns its
key figures (`Figure`). `run(benchmark, argv)` does the rest.
"""
from __future__ import annotations

import argparse
import contextlib
import datetime
import json
import math
import os
import shlex
import sys
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Callable, Iterable

import torch

from . import CLOCKS, end, start
from .. import native
from ..engine import env
from ..engine.files import write_atomic
from ..engine.measure import format_bytes
from ..engine.measurement import median_iqr
from ..mechanisms._cpu import size_of, usable_cores_now as usable_cores

FIGURES = Path(__file__).resolve().parents[2] / "docs" / "figures"  # where --figures writes <name>.json
DEVICES = ("cpu", "cuda", "mps", "auto")
DTYPES = ("float32", "bfloat16", "float16", "float64")


@dataclass(frozen=True)
class Machine:
    """The shared machine options as one benchmark takes them: its defaults, and the values it can honour. A value
    it cannot honour is refused with a sentence, never ignored."""

    threads: int | None = 2  # torch's intra-op threads; None: torch's default
    device: str = "cpu"
    devices: tuple[str, ...] = DEVICES  # ("cpu",): it measures on the CPU only
    dtypes: tuple[str, ...] = ("float32",)
    rounds: int | None = 5  # None: it has no rounds of its own (its options say how it times)
    clocks: tuple[str, ...] = CLOCKS  # ("wall",): it reads the wall clock only


@dataclass(frozen=True)
class Figure:
    """One key figure of a run, as the docs quote it: its value in `unit`, and, where it comes from samples, their
    interquartile range, least and largest, and how many; where a target is set, the target and whether it is met."""

    name: str
    value: float
    unit: str
    iqr: float | None = None
    min: float | None = None
    max: float | None = None
    n: int = 1
    target: str | None = None
    meets: bool | None = None

    @classmethod
    def of(cls, name: str, samples: list[float], unit: str = "s") -> "Figure":
        """The median of `samples` (seconds, or per-round ratios with unit '×') with its IQR and range."""
        med, iqr = median_iqr(samples)
        return cls(name, med, unit, iqr, min(samples), max(samples), len(samples))

    @classmethod
    def judged(cls, name: str, rounds: list[float], target: float, at_most: bool = True) -> "Figure":
        """The per-round ratios' median against `target` (≤ it, or ≥ it with at_most=False), as `ratio_verdict`."""
        found = cls.of(name, rounds, "×")
        good = found.value <= target if at_most else found.value >= target
        return replace(found, target=f"{'≤' if at_most else '≥'} {target:g}", meets=good)

    @classmethod
    def slope(cls, name: str, value: float, target: float | None = None, absolute: bool = False) -> "Figure":
        """A log-log slope, judged ≤ target (|slope| ≤ target with `absolute`) where one is set."""
        if target is None:
            return cls(name, value, "slope")
        shown = abs(value) if absolute else value
        return cls(name, value, "slope", target=f"{'|slope| ' if absolute else ''}≤ {target:g}",
                   meets=bool(shown <= target))

    def to_dict(self) -> dict:
        return {key: plain(value) for key, value in asdict(self).items()}


@dataclass(frozen=True)
class Benchmark:
    """A benchmark script as a configuration over the runner. `options` adds its own arguments; `settle` acts on
    them once parsed (--quick's sizes, lists read), raising ValueError with a sentence to refuse one; `setting`
    says in the header's words what is measured; `body` prints its lines and returns its key figures."""

    name: str
    measures: str
    body: Callable[[argparse.Namespace], Iterable[Figure] | None]
    options: Callable[[argparse.ArgumentParser], None] = lambda parser: None
    settle: Callable[[argparse.Namespace], None] = lambda args: None
    setting: Callable[[argparse.Namespace], str] = lambda args: ""
    machine: Machine = field(default_factory=Machine)
    doc: str = ""


def machine_options(parser: argparse.ArgumentParser, machine: Machine) -> None:
    """The options every script shares, with `machine`'s defaults; --json-out and --figures say where its figures
    go."""
    shared = parser.add_argument_group("machine options (shared by every benchmark)")
    shared.add_argument("--threads", type=int, default=machine.threads,
                        help=f"torch's intra-op threads (default {machine.threads or 'torch’s own'})")
    shared.add_argument("--device", default=machine.device, help=f"{', '.join(machine.devices)} "
                        f"(default {machine.device})")
    shared.add_argument("--dtype", default=machine.dtypes[0], choices=DTYPES,
                        help=f"the inputs' dtype; this benchmark takes {', '.join(machine.dtypes)}")
    shared.add_argument("--rounds", type=int, default=machine.rounds,
                        help=f"interleaved rounds of each comparison (default {machine.rounds})"
                        if machine.rounds else "not taken: this benchmark says how it times in its own options")
    shared.add_argument("--clock", choices=CLOCKS, default="wall",
                        help="wall (default), or cpu: the process's CPU seconds, for a first look on a shared machine"
                        if "cpu" in machine.clocks else "wall: this benchmark reads the wall clock only")
    where = shared.add_mutually_exclusive_group()
    where.add_argument("--json-out", metavar="PATH", help="write the figures as JSON to PATH")
    where.add_argument("--figures", action="store_true",
                       help="write the figures to docs/figures/<name>.json, the file the docs quote")


def refusal(benchmark: Benchmark, args: argparse.Namespace) -> str:
    """'' when the shared options are ones `benchmark` honours, else the sentence saying why not. Resolves
    args.device ('auto' → the best present)."""
    name, machine = benchmark.name, benchmark.machine
    if args.threads is not None and args.threads < 1:
        return f"--threads must be at least 1 (got {args.threads})"
    if machine.rounds is None and args.rounds is not None:
        return f"--rounds: {name} has no rounds of its own; see its options for how it times"
    if args.rounds is not None and args.rounds < 1:
        return f"--rounds must be at least 1 (got {args.rounds})"
    if args.device not in machine.devices:
        return f"--device {args.device}: {name} measures on {' or '.join(machine.devices)} only"
    if args.dtype not in machine.dtypes:
        return f"--dtype {args.dtype}: {name} measures {' or '.join(machine.dtypes)} only"
    if args.clock not in machine.clocks:
        return f"--clock {args.clock}: {name} reads the {' or '.join(machine.clocks)} clock only"
    if args.json_out and not os.path.isdir(os.path.dirname(os.path.abspath(args.json_out))):
        return f"--json-out {args.json_out}: its folder does not exist"
    try:
        args.device = env.resolve_device(args.device)
    except ValueError as e:
        return f"--device: {e}"
    return ""


def run(benchmark: Benchmark, argv: list[str] | None = None) -> int:
    """Parse the shared options and `benchmark`'s own from argv (None: the command line), refuse a bad one with a
    sentence (argparse's exit, status 2), set the machine up, print the header, run the body, print the last line
    and write the figures where asked (whole or not at all). 0 when it ran."""
    argv = sys.argv[1:] if argv is None else list(argv)
    parser = argparse.ArgumentParser(prog=f"python -m attn_core.benchmarks.{benchmark.name}",
                                     description=benchmark.doc or benchmark.measures,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    benchmark.options(parser)
    machine_options(parser, benchmark.machine)
    args = parser.parse_args(argv)
    given = list(vars(args))
    why = refusal(benchmark, args)
    if not why:
        try:
            benchmark.settle(args)
        except ValueError as e:
            why = str(e)
    if why:
        parser.error(why)
    out = FIGURES / f"{benchmark.name}.json" if args.figures else args.json_out
    set_up(args)
    loads = {"start": load_averages()}
    start(args.device, benchmark.setting(args))
    print(f"  {machine_line()}", flush=True)
    figures = list(benchmark.body(args) or [])
    end()
    loads["end"] = load_averages()
    if out:
        report = figures_report(benchmark, args, argv, {key: getattr(args, key) for key in given}, figures, loads)
        write_figures(out, report)
        print(f"figures written to {out}")
    return 0


def set_up(args: argparse.Namespace) -> None:
    """The threads set, and the allocator steadied as in the engine's worker (buffers below 32 MiB reused, not
    faulted in anew)."""
    if args.threads:
        torch.set_num_threads(args.threads)
    env.steady_allocator()


def figures_report(benchmark: Benchmark, args: argparse.Namespace, argv: list[str], options: dict,
                   figures: list[Figure], loads: dict) -> dict:
    """What a figures file holds: the benchmark, the command that reproduces it, when, the machine (the engine's
    environment stamp, with the cores, caches and load averages), the method, the options and the figures."""
    names = [f.name for f in figures]
    if len(set(names)) != len(names):
        raise ValueError(f"{benchmark.name}: figure names repeat ({sorted({n for n in names if names.count(n) > 1})})"
                         "; each must name one figure for the docs to quote it")
    machine = {**env.environment(args.device, args.dtype, args.threads), "cores_usable": usable_cores(),
               "caches_bytes": cpu_caches(), "load_averages": loads}
    method = (f"{benchmark.measures} {benchmark.setting(args).rstrip('.')}. Machine options: "
              f"{args.threads or 'torch’s default'} threads, {args.device}, {args.dtype}, "
              f"{args.rounds or 'no'} rounds, the {args.clock} clock.")
    command = ["python", "-m", f"attn_core.benchmarks.{benchmark.name}", *argv]
    return {"benchmark": benchmark.name, "command": shlex.join(command),
            "when": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
            "machine": {key: plain(value) for key, value in machine.items()}, "method": method,
            "options": {key: plain(value) for key, value in options.items()},
            "figures": [f.to_dict() for f in figures]}


def write_figures(path: str | os.PathLike, report: dict) -> None:
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    write_atomic(path, (json.dumps(report, indent=2, ensure_ascii=False) + "\n").encode())


def plain(value):
    """`value` as JSON holds it: numbers as floats or ints (NaN and infinities as null), containers element-wise,
    anything else as its text."""
    if value is None or isinstance(value, (bool, str, int)):
        return value
    if getattr(getattr(value, "dtype", None), "kind", "") == "b":  # numpy's bool
        return bool(value)
    if hasattr(value, "__index__") and not isinstance(value, torch.Tensor):  # numpy's integers
        return int(value)
    if isinstance(value, float) or hasattr(value, "__float__") and not isinstance(value, torch.Tensor):
        number = float(value)
        return number if math.isfinite(number) else None
    if isinstance(value, dict):
        return {str(k): plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple, set)):
        return [plain(v) for v in value]
    return str(value)


def load_averages() -> list[float] | None:
    """The OS's load averages over 1, 5 and 15 minutes (os.getloadavg); None where there are none."""
    with contextlib.suppress(AttributeError, OSError):
        return [round(x, 2) for x in os.getloadavg()]
    return None


def cpu_caches() -> dict[str, int]:
    """{'L1d': 32768, 'L1i': 32768, 'L2': 1048576, 'L3': 33554432}: CPU 0's caches in bytes, read from Linux's
    sysfs; {} where they cannot be read (another OS, a container hiding them)."""
    found = {}
    for index in sorted(Path("/sys/devices/system/cpu/cpu0/cache").glob("index*")):
        with contextlib.suppress(OSError, ValueError, KeyError):
            level, kind, size = ((index / part).read_text().strip() for part in ("level", "type", "size"))
            suffix = {"Data": "d", "Instruction": "i"}.get(kind, "")
            found[f"L{level}{suffix}"] = size_of(size)
    return found


def built_kernels() -> str:
    """The C++ kernels built, or found built, for this process, as the dashboard's worker does at its start (a
    forward call never builds, and without them top-k and NSA run their torch forms): `native.describe`'s words,
    which say why where none could be. A benchmark names them beside its figures."""
    with contextlib.suppress(RuntimeError):
        native.build()
    return native.describe()


def machine_line() -> str:
    """The header's second line: CPU model, cores, caches, the load averages, torch and its threads."""
    caches = ", ".join(f"{name} {format_bytes(size)}" for name, size in cpu_caches().items()) or "caches unknown"
    loads = load_averages()
    said = " ".join(f"{x:.2f}" for x in loads) + " (1, 5, 15 min)" if loads else "unknown"
    return (f"CPU {env.cpu_name()}, {os.cpu_count()} cores ({usable_cores()} usable), {caches}; load average {said}; "
            f"torch {torch.__version__}, {torch.get_num_threads()} threads")
