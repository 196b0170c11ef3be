"""Fixtures every test shares: the run store kept in a private folder, never the user's own; one torch thread a
process."""
from __future__ import annotations

import contextlib
import functools
import multiprocessing.util
import os
import shutil
import sys
import tempfile
from pathlib import Path

# One thread a process, this one and every process the tests start (the measuring worker, the dashboard's server, the
# CLI), set before torch is imported. The suite must pass in minutes on two cores with one of them kept busy, as a
# laptop is; there a two-thread parallel region waits for the busy core's time slice at every operation, and
# tests/contract took 466 s instead of 83 (with one thread: 104 s for its three slowest tests, 223 s before). Tests
# of the thread choices set the threads they need themselves; the benchmark scripts, not the tests, measure speed.
os.environ["OMP_NUM_THREADS"] = "1"
# Every sample kept as measured (attn_core.engine.timing.retaking): the suite's sweeps run beside each other's and
# other programs' work, where quiet never comes; waiting for it and retaking took a dashboard test 79 s instead of 9
# with one core busy. The tests of retaking turn it back on (tests/engine/test_measure.py).
os.environ["ATTN_LAB_RETAKES"] = "0"

# Bytecode for the project's own modules, written once before the suite starts where this environment writes none
# (PYTHONDONTWRITEBYTECODE, as a container may set): every process the suite starts (a measuring worker, a server, a
# CLI run) would compile them again from source, half a second each of a busy machine's time. Python reads a cached
# file only while it matches its source. Installed packages have theirs from pip.
if sys.dont_write_bytecode and not os.environ.get("PYTEST_XDIST_WORKER"):
    import compileall

    for _package in ("attn_core", "tests"):
        compileall.compile_dir(os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), _package),
                               quiet=2)

# Each of the suite's processes (pytest-xdist's workers, below) keeps its own temporary folder, where the sweep
# lock lives: two workers' sweeps must not queue behind each other. Short (Chromium's sockets live there, and a Unix
# socket's path is at most 107 bytes) and passable by others (0711: the privilege test's child runs as nobody).
if _WORKER := os.environ.get("PYTEST_XDIST_WORKER"):
    _TMP = tempfile.mkdtemp(prefix=f"al-{_WORKER}-")
    os.chmod(_TMP, 0o711)
    os.environ["TMPDIR"] = _TMP
    tempfile.tempdir = None  # gettempdir() reads TMPDIR again
    # removed at exit after multiprocessing's own folders in it (theirs are finalized at priority -100; an atexit
    # hook would run first and leave their finalizers a missing folder to print about)
    multiprocessing.util.Finalize(None, shutil.rmtree, args=(_TMP, True), exitpriority=-101)

import pytest  # noqa: E402
import torch  # noqa: E402

from attn_core import native  # noqa: E402
from attn_core.engine import store
from tests import rewritten_once  # noqa: E402


torch.set_num_threads(1)  # where torch was imported before this file (a plugin): the variable came too late


MAX_WORKERS = 4  # the suite's processes at most: some tests hold a few GiB, and each worker builds the kernels


@pytest.hookimpl(tryfirst=True)
def pytest_cmdline_main(config):
    """`python3 -m pytest -q` runs the suite in one process a core and one more (at most MAX_WORKERS; pytest-xdist,
    each test file kept on one worker, so a file's module fixtures are made once). The extra one computes while
    another waits for what its test started (a server, a browser, a measuring worker). With one core kept busy on
    this 2-core machine: one process 27 min 49 s, two 16 min 10 s, three 14 min 33 s (13 min 3 s later), four
    12 min 39 s with a browser test timing out (each process the slower). A run naming files or tests
    (`pytest tests/x.py::test`), asking for `-n` itself, or on one core stays in one process, as does `-n 0`."""
    if os.environ.get("PYTEST_XDIST_WORKER") or not config.pluginmanager.has_plugin("xdist"):
        return
    named = [a for a in config.args if not os.path.isdir(a.split("::")[0])]
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    if config.option.numprocesses is None and not named and cores > 1 and not config.getoption("usepdb"):
        config.option.numprocesses = min(cores + 1, MAX_WORKERS)
        if config.option.dist == "no":
            config.option.dist = "loadfile"
            config.option.loadscopereorder = False  # LONGEST_FIRST's order, not the files with most tests first
    if config.option.numprocesses:
        keep_unused_plugins_out_of_the_workers(config)
        rewritten_once.write_before_the_processes_start(Path(__file__).parent, config, cores)
        build_kernels_once(config)


# Installed pytest plugins the suite does not use, each with the start of its options. pytest rewrites the asserts of
# every module of a plugin's package as it imports it: these three are 116 modules, 3.2 s of one process's collection
# here, quiet (18.9 s -> 15.7 s). The workers are started with them left out; a run that names one of their options
# keeps them. With tests/rewritten_once.py, the suite's collection by its three processes took 11.8-12.6 s instead of
# 17.0-18.0 quiet, 12.0-14.6 s instead of 17.1 with one core busy (`pytest --co`, the rewritten files removed first).
UNUSED_PLUGINS = {"hypothesispytest": "--hypothesis", "anyio": "--anyio", "benchmark": "--benchmark"}


def keep_unused_plugins_out_of_the_workers(config) -> None:
    """Adds `-p no:NAME` to PYTEST_ADDOPTS, which xdist's workers (and the pytest runs they start) read, for each
    plugin of UNUSED_PLUGINS that is loaded here and whose options this run does not name."""
    named = " ".join(config.invocation_params.args)
    left_out = [f"-p no:{name}" for name, options in UNUSED_PLUGINS.items()
                if config.pluginmanager.has_plugin(name) and options not in named]
    if left_out:
        os.environ["PYTEST_ADDOPTS"] = " ".join([os.environ.get("PYTEST_ADDOPTS", ""), *left_out]).strip()


SUITE_CACHE = "ATTN_LAB_SUITE_CACHE"  # the kernels' cache the suite's first process built, for its workers


def build_kernels_once(config) -> None:
    """The C++ kernels built once, by the process that starts the workers, into a folder of its own (mkdtemp: mode
    0700, this user's) that every worker then uses as its cache (private_run_store), removed when the run ends.
    Each worker built its own at its start: three compiles of 4.4 s of CPU, at the moment the three processes also
    collect the suite."""
    folder = tempfile.mkdtemp(prefix="attention-lab-cache-")
    config.add_cleanup(functools.partial(shutil.rmtree, folder, True))
    os.environ[SUITE_CACHE] = folder
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv(native.CACHE, folder)
        with contextlib.suppress(RuntimeError):  # no compiler, or a build that fails: each worker says so itself
            native.build()


# The suite's longest files, measured with one core busy (seconds, the sum of their tests' times), handed out first,
# longest first (longest processing time first): xdist hands out a file when a worker has two tests left, in the
# order the items come, so a long file late in the alphabet (tests/native, tests/studies) started near the end and
# kept one worker busy after the others had stopped; and by default it hands out the files with most tests first,
# where the browser tests have few. The others follow in their usual order.
LONGEST_FIRST = (
    "tests/dashboard/test_browser_in_view.py",  # 195
    "tests/dashboard/test_browser.py",  # 169
    "tests/contract/test_mechanisms.py",  # 169
    "tests/dashboard/test_app_runs.py",  # 107
    "tests/engine/test_hardening_text.py",  # 93
    "tests/dashboard/test_planner_page.py",  # 92
    "tests/engine/test_store_hardening.py",  # 72
    "tests/engine/test_sweep.py",  # 68
    "tests/cli/test_cli.py",  # 68
    "tests/contract/test_copies.py",  # 63
    "tests/mechanisms/test_topk.py",  # 63
    "tests/native/test_native.py",  # 62
    "tests/dashboard/test_browser_first_minutes.py",  # 62
    "tests/mechanisms/test_sinks.py",  # 53
    "tests/mechanisms/test_nsa.py",  # 49
    "tests/dashboard/test_app.py",  # 49
    "tests/dashboard/test_browser_first_request.py",  # 44
    "tests/mechanisms/test_flex.py",  # 44
    "tests/studies/test_distributed_lifeline.py",  # 43
    "tests/insight/test_theory.py",  # 40
    "tests/dashboard/test_pages_insight.py",  # 39
    "tests/charts/test_charts.py",  # 30
    "tests/dashboard/test_hardening_web.py",  # 29
    "tests/engine/test_measure.py",  # 26
    "tests/contract/test_toy_mechanism.py",  # 25
    "tests/contract/test_shared_kv.py",  # 24
    "tests/engine/test_store.py",  # 22
    "tests/contract/test_flop_counter.py",  # 22
    "tests/nn/test_generation.py",  # 22
    "tests/studies/test_distributed.py",  # 21
    "tests/mechanisms/test_longformer_bigbird.py",  # 20
)


def pytest_collection_modifyitems(config, items):
    """LONGEST_FIRST's files first, each file's tests in their order (a stable sort)."""
    rank = {path: i for i, path in enumerate(LONGEST_FIRST)}
    items.sort(key=lambda item: rank.get(item.nodeid.split("::")[0], len(rank)))


@pytest.fixture(autouse=True, scope="session")
def components_scanned_once():
    """Each AppTest scans every installed package for Streamlit components before its first run (0.2 s quiet, near
    0.5 s with one core busy, for some two hundred AppTests), where a server scans once at its start: the AppTests of
    a process reuse its first scan. Nothing is changed where Streamlit is not loaded or names the scan otherwise."""
    scan = None
    if "streamlit" in sys.modules:
        with contextlib.suppress(ImportError, AttributeError):
            from streamlit.components.v2 import manifest_scanner
            scan = manifest_scanner.scan_component_manifests
    if scan is None:
        yield
        return
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(manifest_scanner, "scan_component_manifests", functools.cache(scan))
        yield


@pytest.fixture(autouse=True, scope="session")
def private_run_store(tmp_path_factory):
    """ATTN_LAB_HOME set to a temporary folder for the whole session, so that sweeps (and the worker and CLI
    processes the tests start, which inherit it) keep their runs there; ATTN_LAB_CACHE too, for the C++ kernels
    the session builds. The kernels are built here (or found built by the first process: build_kernels_once), as
    the dashboard's start and `native build` do (a forward call never builds), so every test sees the form a user
    would; where they cannot be built, the torch forms run and the kernels' own tests skip with the reason."""
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv(store.HOME_VARIABLE, str(tmp_path_factory.mktemp("attention-lab-home")))
        cache = os.environ.get(SUITE_CACHE)  # built once for all the workers (build_kernels_once), else here
        if cache is None:
            cache = tmp_path_factory.mktemp("attention-lab-cache")
            cache.chmod(0o700)
        mp.setenv(native.CACHE, str(cache))
        try:
            native.build()
        except RuntimeError:
            pass
        yield
