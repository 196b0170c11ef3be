"""The suite's own setup (tests/conftest.py): the files it hands out first exist, and a run of the whole suite is
spread over the machine's cores."""
from pathlib import Path

import pytest

from tests import conftest

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
            self.pluginmanager = type("PM", (), {"has_plugin": staticmethod(lambda name: True)})()

        def getoption(self, name):
            return False

    monkeypatch.delenv("PYTEST_XDIST_WORKER", raising=False)
    monkeypatch.setattr(conftest.os, "sched_getaffinity", lambda pid: {0, 1}, raising=False)
    config = Config()
    conftest.pytest_cmdline_main(config)
    assert config.option.numprocesses == workers
    assert (config.option.dist, config.option.loadscopereorder) == (("loadfile", False) if workers else ("no", True))
