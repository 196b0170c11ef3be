"""The suite's own setup (tests/conftest.py): the files it hands out first exist, and a run of the whole suite is
spread over the machine's cores."""
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests import conftest, rewritten_once

ROOT = Path(__file__).resolve().parents[1]


def test_every_file_handed_out_first_exists():
    assert len(set(conftest.LONGEST_FIRST)) == len(conftest.LONGEST_FIRST)
    assert [p for p in conftest.LONGEST_FIRST if not (ROOT / p).is_file()] == []


@pytest.mark.parametrize("args, workers", [([], 3), (["tests"], 3), (["tests/engine/test_measure.py"], None),
                                           (["tests/engine/test_measure.py::test_x"], None)])
def test_the_whole_suite_runs_a_process_a_core_and_one_more_and_a_named_file_one(monkeypatch, args, workers):
    """On two cores (the affinity this process sees, faked), asked for directories: three workers, each file on one;
    asked for a file or a test: one process."""
    class Option:
        numprocesses, dist, loadscopereorder = None, "no", True

    class Config:
        option = Option()

        def __init__(self):
            self.args = [str(ROOT / a) if a else str(ROOT) for a in args] or [str(ROOT)]
            self.invocation_params = type("Invocation", (), {"args": ("-q", "--benchmark-disable", *args)})()
            self.pluginmanager = type("PM", (), {"has_plugin": staticmethod(lambda name: name != "anyio")})()

        def getoption(self, name):
            return False

    rewrites, builds = [], []
    monkeypatch.setattr(conftest, "build_kernels_once", builds.append)
    monkeypatch.delenv("PYTEST_XDIST_WORKER", raising=False)
    monkeypatch.setenv("PYTEST_ADDOPTS", "-x")
    monkeypatch.setattr(conftest.os, "sched_getaffinity", lambda pid: {0, 1}, raising=False)
    monkeypatch.setattr(conftest.rewritten_once, "write_before_the_processes_start",
                        lambda root, config, processes: rewrites.append((root, processes)))
    config = Config()
    conftest.pytest_cmdline_main(config)
    assert config.option.numprocesses == workers
    assert (config.option.dist, config.option.loadscopereorder) == (("loadfile", False) if workers else ("no", True))
    # the workers leave out hypothesis's plugin (loaded, its options not named); benchmark's options are named and
    # anyio's plugin is not loaded here; the test files are rewritten once, by as many processes as cores
    assert os.environ["PYTEST_ADDOPTS"] == ("-x -p no:hypothesispytest" if workers else "-x")
    assert rewrites == ([(ROOT / "tests", 2)] if workers else [])
    assert builds == ([config] if workers else [])  # the kernels built once, for the workers


def test_the_kernels_are_built_once_into_a_private_folder_the_workers_read_and_removed_at_the_end(monkeypatch):
    """build_kernels_once: the build runs with the cache at a new folder of this user's, mode 0700, named to the
    workers by ATTN_LAB_SUITE_CACHE; the folder is removed by the run's cleanup; a build that fails stops nothing."""
    seen, cleanups = [], []

    def build():
        seen.append(os.environ[conftest.native.CACHE])
        raise RuntimeError("no compiler")

    monkeypatch.setenv(conftest.SUITE_CACHE, "")  # put back after, as this worker was given it
    monkeypatch.setattr(conftest.native, "build", build)
    conftest.build_kernels_once(type("Config", (), {"add_cleanup": staticmethod(cleanups.append)})())
    folder = Path(os.environ[conftest.SUITE_CACHE])
    assert seen == [str(folder)] and folder.is_dir() and folder.stat().st_mode & 0o777 == 0o700
    assert folder.stat().st_uid == os.geteuid() and os.environ.get(conftest.native.CACHE) != str(folder)
    (folder / "native").mkdir()
    for cleanup in cleanups:
        cleanup()
    assert not folder.exists()


def test_the_test_files_rewritten_once_are_what_pytest_reads(tmp_path):
    """A file rewritten by tests/rewritten_once.py, then changed with its size and time kept as they were: pytest
    runs the rewritten form it finds (the failing one), and says so with its own rewritten assert message."""
    test = tmp_path / "test_kept.py"
    test.write_text("def test_kept():\n    assert [1, 2] == [1, 3]\n")
    assert rewritten_once.files(tmp_path) == [str(test)]
    assert rewritten_once.rewrite([str(test)]) == 1
    assert rewritten_once.rewrite([str(test)]) == 0  # kept: read, not written again
    stat = test.stat()
    test.write_text("def test_kept():\n    assert [1, 2] == [1, 2]\n")
    os.utime(test, ns=(stat.st_atime_ns, stat.st_mtime_ns))
    run = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", str(test)], cwd=tmp_path,
                         capture_output=True, text=True, env={**os.environ, "PYTHONDONTWRITEBYTECODE": "1"}, timeout=120)
    assert run.returncode == 1 and "assert [1, 2] == [1, 3]" in run.stdout, run.stdout
