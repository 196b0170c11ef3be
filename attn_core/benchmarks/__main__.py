"""The benchmark scripts by name, each a configuration over one runner (benchmarks/runner.py):

    python -m attn_core.benchmarks                          # the list: name and what it measures
    python -m attn_core.benchmarks run NAME [options]       # one of them, as python -m attn_core.benchmarks.NAME
    python -m attn_core.benchmarks run NAME --help          # its own options and the shared machine options
    python -m attn_core.benchmarks run NAME --figures       # and its figures written to docs/figures/NAME.json
"""
from __future__ import annotations

import importlib
import sys

from .runner import Benchmark, run

# The catalogue, one line a script, as the mechanisms' (principle 4: explicit, no import of a folder's files).
NAMES = ("busy", "chunked", "dashboard", "deltanet", "distributed", "engine", "flex", "generation", "heads", "kda",
         "landmark", "linear", "mechanisms", "native_kernels", "nsa", "planner", "positions", "reformer", "sinks",
         "sparse_select", "ssd", "store", "window")


def benchmark(name: str) -> Benchmark:
    """The configuration a script declares (its module's BENCHMARK); KeyError with the names for an unknown one."""
    if name not in NAMES:
        raise KeyError(f"no benchmark {name!r}; there are {', '.join(NAMES)}")
    return importlib.import_module(f"{__package__}.{name}").BENCHMARK


def listing() -> str:
    """One line a benchmark: its name and what it measures (or why its script does not import here)."""
    lines = []
    for name in NAMES:
        try:
            said = benchmark(name).measures
        except ImportError as e:  # e.g. the dashboard's browser driver missing
            said = f"(does not import here: {e})"
        lines.append(f"  {name:15s} {said}")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    if not argv or argv[0] in ("list", "-h", "--help"):
        print(f"{__doc__}\nBenchmarks:\n{listing()}")
        return 0
    if argv[0] != "run":
        print(f"usage: python -m attn_core.benchmarks [list | run NAME [options]]; {argv[0]!r} is neither list nor "
              "run", file=sys.stderr)
        return 2
    if len(argv) < 2:
        print(f"run: name a benchmark, one of {', '.join(NAMES)}", file=sys.stderr)
        return 2
    try:
        chosen = benchmark(argv[1])
    except KeyError as e:
        print(e.args[0], file=sys.stderr)
        return 2
    return run(chosen, argv[2:])


if __name__ == "__main__":
    raise SystemExit(main())
