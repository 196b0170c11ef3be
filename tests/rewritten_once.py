"""The suite's test files with their asserts rewritten by pytest, written once before its processes start.

pytest rewrites a test file's asserts as it imports it and keeps the result beside the file (`__pycache__`, a name
with "pytest" in it), which the next process reads while the file is unchanged. On a fresh checkout the suite's
processes would each rewrite all of them at the same time: 7.9 s of one process's collection here, quiet. The suite's
first process writes them here, its cores sharing the files, and the others read them. Where pytest names these
pieces otherwise, or a file cannot be written, nothing is written and each process rewrites as before.

This module imports nothing of the suite's, so that the processes that share the work start in a fraction of a
second."""
from __future__ import annotations

import concurrent.futures
import multiprocessing
import os
import sys
from pathlib import Path


PYTEST_PIECES = ("get_cache_dir", "PYC_TAIL", "_read_pyc", "_rewrite_test", "_write_pyc_fp")  # used below


def rewrite(paths: list[str]) -> int:
    """Writes pytest's rewritten form of each file whose kept form is missing or stale; the number written."""
    from _pytest.assertion import rewrite as pytest_rewrite

    written = 0
    for name in paths:
        path = Path(name)
        cached = pytest_rewrite.get_cache_dir(path) / (path.name[:-3] + pytest_rewrite.PYC_TAIL)
        if pytest_rewrite._read_pyc(path, cached) is not None:
            continue
        try:
            stat, code = pytest_rewrite._rewrite_test(path, None)  # None: no assertion-pass hook, as the suite's
        except (SyntaxError, OSError, ValueError):  # left to the process that imports it, which says what is wrong
            continue
        cached.parent.mkdir(exist_ok=True)
        partial = f"{cached}.{os.getpid()}"
        with open(partial, "wb") as out:
            pytest_rewrite._write_pyc_fp(out, stat, code)
        os.replace(partial, cached)  # a reader sees the whole file or none
        written += 1
    return written


def files(root: Path) -> list[str]:
    """The files pytest rewrites under root with its default patterns: test_*.py, *_test.py and conftest.py."""
    return sorted(str(p) for p in root.rglob("*.py")
                  if p.name.startswith("test_") or p.name.endswith("_test.py") or p.name == "conftest.py")


def write_before_the_processes_start(root: Path, config, processes: int) -> None:
    """Rewrites root's test files in `processes` processes, where the run rewrites asserts as pytest's defaults do."""
    if (config.getoption("assertmode") != "rewrite" or config.getini("enable_assertion_pass_hook")
            or config.getini("python_files") != ["test_*.py", "*_test.py"]):
        return
    try:
        from _pytest.assertion import rewrite as pytest_rewrite
    except ImportError:
        return
    if not all(hasattr(pytest_rewrite, name) for name in PYTEST_PIECES):  # another pytest: each rewrites its own
        return
    paths = files(root)
    shares = [paths[i::processes] for i in range(processes)]
    try:
        with concurrent.futures.ProcessPoolExecutor(processes,
                                                    mp_context=multiprocessing.get_context("spawn")) as pool:
            list(pool.map(rewrite, shares))
    except Exception as e:  # a read-only checkout, no processes, a pytest whose pieces changed: no harm done
        print(f"tests/rewritten_once.py: each process rewrites the test files itself ({e})", file=sys.stderr)
