"""The dashboard server's jobs (attn_core.engine.server): one stage per process, the worker and the kernels started
ahead without blocking a page, a session's heartbeat keeping its sweep on every page; and the one private Streamlit
call the dashboard keeps (pages._shared.ensure_routed), checked for the day Streamlit changes it."""
import logging

import pytest
from streamlit.testing.v1 import AppTest, app_test

import pages._shared as shared
from attn_core.engine import server, stage, worker
from attn_core.engine.config import DEFAULT_SWEEP
from attn_core.engine.pacing import Pacing
from tests.dashboard import test_app
from tests.dashboard.test_app import APP, fresh_stage, private_sweep_lock, routed  # noqa: F401 (fixtures apply here)
from tests.engine.test_stage import Clock, FakeJob


@pytest.fixture
def clocked(monkeypatch) -> Clock:
    """The server's stage on a clock the test moves, checked only when the test (or a page's poll) asks."""
    clock = Clock()
    monkeypatch.setattr(server, "_stage", stage.Stage(clock=clock, thread=False))
    return clock


def test_the_server_has_one_stage_until_reset():
    first = server.stage()
    assert server.stage() is first
    server.reset()
    assert server.stage() is not first


def test_sweeps_that_cannot_run_give_a_job_that_ended_with_the_sentences():
    job = server.submit("bad", (DEFAULT_SWEEP.replaced(heads=0),), "a")
    assert job.done and job.withdrawn and job.error.startswith("Heads must be")
    assert server.stage().queue == [] and server.stage().running() is None


def test_a_second_session_adopts_the_running_job_and_its_heartbeat_keeps_it(clocked):
    jobs = {}
    job = server.stage().submit(FakeJob("sweep", jobs), "first tab")
    assert server.adopt_running("second tab") is job and job.watchers == {"first tab", "second tab"}
    for tick in range(1, 100):  # the first tab is closed; the second ticks every HEARTBEAT_S
        clocked.now = tick * server.HEARTBEAT_S
        server.seen("second tab")
        server.stage().check()
    assert not job.cancelled
    clocked.now += stage.ORPHAN_S
    server.stage().check()
    assert job.cancelled


def test_the_orphan_time_outlasts_every_gap_between_a_live_pages_runs():
    """A page in view ticks every few seconds; a hidden tab's timers wake once a minute (Chrome, after 5 minutes)."""
    pacing = Pacing()
    slowest_replay = 1 / 0.5  # the replay speed slider's lowest points per second
    assert max(pacing.tick_s, pacing.first_tick_s, slowest_replay, server.HEARTBEAT_S) * 3 <= stage.ORPHAN_S_DEFAULT
    assert stage.ORPHAN_S_DEFAULT > 60


@pytest.mark.parametrize("text, seconds", [("", 75.0), ("20", 20.0), ("2.5", 2.5), ("soon", 75.0), ("0", 75.0),
                                           ("-3", 75.0), ("inf", 75.0), ("nan", 75.0)])
def test_a_host_may_choose_the_orphan_time_and_a_bad_one_is_refused(monkeypatch, text, seconds):
    monkeypatch.setenv(stage.ORPHAN_VARIABLE, text)
    assert stage._orphan_s() == seconds


def test_prestart_starts_the_worker_once_per_process(monkeypatch):
    started = []
    monkeypatch.setattr(server.worker, "prestart", lambda: started.append(1))
    monkeypatch.setattr(server, "_prestarted", False)
    server.prestart()
    server.prestart()
    assert started == [1]


def test_the_worker_builds_the_kernels_as_it_starts():
    """Before its first point (ready), so that a sweep's points and its stamp all see the same kernels."""
    from attn_core import native

    measuring = worker.Worker()
    try:
        said = measuring.wait_ready()["kernels"]
    finally:
        measuring.stop()
    assert said.startswith("C++") == (native.enabled() and native.compiler() is not None), said


def test_a_failed_build_is_logged_and_the_torch_forms_run(monkeypatch, caplog):
    from attn_core import native

    def failing_build(seconds):
        raise RuntimeError("every try failed")

    monkeypatch.setattr(native, "build", failing_build)
    monkeypatch.setattr(native, "enabled", lambda: True)
    with caplog.at_level(logging.WARNING, logger=worker.__name__):
        assert worker._build_kernels() == native.describe()
    assert "could not be built" in caplog.text and "every try failed" in caplog.text


def test_every_page_of_a_session_with_a_sweep_keeps_it_and_a_session_gone_quiet_loses_it(clocked):
    at = AppTest.from_file(APP, default_timeout=60).run()
    job = server.stage().submit(FakeJob("sweep", {}), "this tab")
    at.session_state["session_id"], at.session_state["bench"].job = "this tab", job
    for page in ("pages/benchmark.py", "pages/theory.py", "pages/home.py"):
        at.switch_page(page).run()  # its run marks the session seen: the live view, or the router's heartbeat
        assert not at.exception, [e.value for e in at.exception]
        clocked.now += stage.ORPHAN_S - 1
        server.stage().check()
        assert not job.cancelled, page
    clocked.now += 1  # the tab was closed: no run since
    server.stage().check()
    assert job.cancelled


def test_the_one_private_call_still_routes_a_deep_link_and_is_still_needed(monkeypatch):
    """ensure_routed flips Streamlit's PagesManager.uses_pages_directory, which a folder named pages/ sets. A deep
    link as a session's first run must run inside the router (its sidebar's Talk mode switch); without the flip the
    page runs alone. The day Streamlit renames the flag, the first part fails (an exception); the day it drops the
    legacy mode, the second does, and the private call can go."""
    monkeypatch.setattr(app_test, "PagesManager", test_app.PagesManager)  # not Routed: as a fresh server does
    at = AppTest.from_file(APP, default_timeout=60)
    at.switch_page("pages/benchmark.py").run()
    assert not at.exception, [e.value for e in at.exception]
    assert [t.value for t in at.title] == ["Benchmark"] and "talk" in [t.key for t in at.toggle]
    monkeypatch.setattr(shared, "ensure_routed", lambda: None)
    alone = AppTest.from_file(APP, default_timeout=60)
    alone.switch_page("pages/benchmark.py").run()
    assert [t.value for t in alone.title] == ["Benchmark"] and "talk" not in [t.key for t in alone.toggle]
