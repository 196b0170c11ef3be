"""Sweeps in the worker process: config problems, every status, the time budget, cancel, worker death, the lock."""
from __future__ import annotations

import dataclasses
import functools
import math
import os
import stat
import sys
import threading
import time
import types

import pytest

import attn_core as ac
from attn_core.engine import job as sweep_module, lock as lock_module
from attn_core.engine import worker
from attn_core.engine.config import DEFAULT_SWEEP, SweepConfig, log_spaced, plan
from attn_core.engine.job import Job, run_sweep
from attn_core.engine.measurement import COLUMNS


def start(config: SweepConfig, **kw) -> Job:
    return Job.measure("test", (config,), **kw)
from tests.fake_mechanisms import REF, hangs_started, private_sweep_lock  # noqa: F401 (an autouse fixture)

TINY = dict(heads=2, d_model=16, warmup=1, min_repeats=2, min_time_s=0.0, point_budget_s=30.0)


def config(mechanisms, ns=(32,), **kw) -> SweepConfig:
    return SweepConfig(mechanisms=tuple((m, {}) if isinstance(m, str) else m for m in mechanisms),
                       ns=ns).replaced(**{**TINY, **kw})


def statuses(df) -> list[tuple[str, int, str]]:
    return list(zip(df["mechanism"], df["n"], df["status"]))


def wait_until(predicate, timeout=60.0):
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, "timed out waiting"
        time.sleep(0.02)


# ---- the config as data ----

def test_problems_are_sentences_saying_what_to_change():
    assert config(["softmax"]).problems() == []
    assert config(["softmax"], d_model=500, heads=6).problems() == [
        "d_model 500 is not divisible by 6 heads; choose a multiple of 6"]
    assert config(["linformer"], causal=True).problems() == [
        "Linformer cannot be causal; untick causal or choose another mechanism"]
    (rank,) = config([("linformer", {"rank": 512})], ns=(256, 1024)).problems()
    assert rank.startswith("Linformer") and "512" in rank and "shortest sequence length 256" in rank
    assert "unknown" in config(["nope"]).problems()[0]
    assert "not supported" in config(["softmax"], dtype="int8").problems()[0]
    assert "warmup" in config(["softmax"], warmup=0).problems()[0]
    assert config([], ns=()).problems() == ["no sequence length is given; give at least one n",
                                            "no mechanism is selected; choose at least one"]


def test_a_config_of_more_than_max_points_is_refused_and_bad_lengths_are_quoted_short():
    from attn_core.engine.config import MAX_POINTS

    assert config(["softmax", "linear"], ns=tuple(range(1, MAX_POINTS // 2 + 1))).problems() == []
    (too_many,) = config(["softmax", "linear"], ns=tuple(range(1, MAX_POINTS // 2 + 2))).problems()
    assert too_many.startswith("the sweep has 501 lengths × 2 mechanisms = 1,002 points, more than the 1,000")
    assert config(["softmax"], ns=(16, 16, 32)).points == 2  # a repeated length is measured once
    (bad,) = config(["softmax"], ns=(16, *range(-100, 0))).problems()
    assert bad == "sequence lengths must be positive integers below 2**40, got -100, -99, -98, -97, -96 and 95 more"


def test_config_round_trips_through_a_dict_and_refuses_unknown_settings():
    c = config([("sliding_window", {"window": 8}), "softmax"], ns=(16, 64), causal=True, memory_limit_bytes=1 << 30)
    assert SweepConfig.from_dict(c.to_dict()) == c
    with pytest.raises(ValueError, match="unknown sweep settings"):
        SweepConfig.from_dict({**c.to_dict(), "colour": "red"})


def test_log_spaced_and_the_default_dashboard_sweep():
    assert log_spaced(256, 4096, 5) == (256, 512, 1024, 2048, 4096)
    assert log_spaced(100, 100, 3) == (100,) and log_spaced(1, 2, 5) == (1, 2)
    assert DEFAULT_SWEEP.problems() == []
    assert [m for m, _ in DEFAULT_SWEEP.mechanisms] == ["softmax", "sdpa", "sliding_window", "linear"]
    p = DEFAULT_SWEEP.problem
    assert (p.batch, p.heads, p.d_model, p.dtype, p.mode) == (1, 8, 512, "float32", "forward")


def test_plan_runs_n_ascending_with_every_mechanism_at_each_n():
    problems = plan(config(["softmax", "linear"], ns=(64, 16)))
    assert [(p.mechanism, p.n) for p in problems] == [("softmax", 16), ("linear", 16), ("softmax", 64), ("linear", 64)]


# ---- running ----

def test_rows_stream_with_progress_and_the_worker_persists():
    seen = []
    df = run_sweep(config(["softmax", "sdpa"], ns=(16, 32)), on_point=seen.append)
    assert list(df.columns) == list(COLUMNS) and len(seen) == 4
    assert set(df["status"]) == {"ok"} and all(len(s) >= 2 for s in df["time_samples"])
    pid = worker.get_worker().process.pid
    run = start(config(["softmax"]))
    run.wait(60)
    assert run.done and run.error is None and worker.get_worker().process.pid == pid  # same worker
    p = run.progress
    assert (p.done, p.total, p.current, p.eta_s) == (1, 1, "finished", 0.0)
    assert run.poll() and not run.poll()  # rows are handed out once
    assert run.result().env["device"] == "cpu"


def test_every_status_in_one_sweep():
    """A mechanism that raises, a fake OOM, and the memory guard under a small fake memory limit."""
    c = config(["softmax", "raises", "fake_oom"], ns=(16, 512), memory_limit_bytes=1 << 20)
    df = run_sweep(c, extra_mechanisms=(REF,))
    assert statuses(df) == [("softmax", 16, "ok"), ("raises", 16, "failed"), ("fake_oom", 16, "oom"),
                            ("softmax", 512, "skipped"), ("raises", 512, "failed"), ("fake_oom", 512, "oom")]
    reasons = dict(zip(zip(df["mechanism"], df["n"]), df["reason"]))
    assert "RuntimeError: deliberate failure" in reasons[("raises", 16)]
    assert reasons[("fake_oom", 16)].startswith("out of memory")
    assert reasons[("softmax", 512)].startswith("would need ") and "1.0 MiB free" in reasons[("softmax", 512)]
    bad = df[df["status"] != "ok"]
    assert bad["time_median_s"].isna().all() and bad["peak_bytes"].isna().all()


def test_a_point_over_the_time_budget_skips_the_larger_n_of_that_mechanism():
    """`slow` sleeps n ms a call: at n = 650 its first call alone sleeps past the 0.6 s budget, whatever the
    machine (a sleep never ends early); at n = 4 even 23 calls (a warm-up, 2 samples, 20 retaken) sleep 0.09 s, and
    linear attention at these n takes well under a millisecond a call, so only a stalled machine could take them
    past the budget."""
    c = config(["slow", "linear"], ns=(4, 650, 1300, 2600), point_budget_s=0.6, measure_memory=False)
    df = run_sweep(c, extra_mechanisms=(REF,))
    slow = df[df["mechanism"] == "slow"]
    assert list(slow["status"]) == ["ok", "ok", "skipped", "skipped"]
    assert slow["reason"].iloc[2].startswith("at n = 650") and "budget of 0.6 s" in slow["reason"].iloc[2]  # no
    # 'skipped:' of its own: the status says that, and the CLI prints "skipped: <reason>"
    assert set(df[df["mechanism"] == "linear"]["status"]) == {"ok"}  # the budget is spent a series at a time


def test_a_point_far_past_the_budget_is_stopped_and_the_sweep_goes_on(monkeypatch):
    """A hard limit of 5 s: `hangs` never returns. Softmax at n ≤ 32 takes milliseconds, but in the fresh worker
    its first request also imports this module's mechanisms (pytest with them: 2.4 s seen on a busy machine) and may
    wait for quiet moments, all counted towards the limit, not the 1 s budget; no memory run (a process's first
    profiler run alone takes a third of a second of the budget)."""
    monkeypatch.setattr(sweep_module, "HARD_LIMIT_FACTOR", 0.0)
    monkeypatch.setattr(sweep_module, "HARD_LIMIT_GRACE_S", 5.0)
    c = config(["hangs", "softmax"], ns=(16, 32), point_budget_s=1.0, measure_memory=False)
    df = run_sweep(c, extra_mechanisms=(REF,))
    assert statuses(df) == [("hangs", 16, "failed"), ("softmax", 16, "ok"), ("hangs", 32, "skipped"),
                            ("softmax", 32, "ok")]
    assert "hard limit" in df["reason"].iloc[0]


def test_worker_death_marks_the_point_failed_and_the_sweep_continues():
    df = run_sweep(config(["exits", "softmax", "sigkill", "linear"]), extra_mechanisms=(REF,))
    assert statuses(df) == [("exits", 32, "failed"), ("softmax", 32, "ok"), ("sigkill", 32, "failed"),
                            ("linear", 32, "ok")]
    assert "exited with code 3" in df["reason"].iloc[0]
    assert "SIGKILL" in df["reason"].iloc[2] and "out-of-memory" in df["reason"].iloc[2]


def test_the_worker_never_runs_the_hosts_main_script(tmp_path, monkeypatch):
    """Streamlit installs each page script as __main__; spawn would run it again in the worker."""
    script = tmp_path / "page.py"
    script.write_text("raise SystemExit(7)  # a page that must not run in the worker\n")
    page = types.ModuleType("__main__")
    page.__file__ = str(script)
    monkeypatch.setitem(sys.modules, "__main__", page)
    worker.shutdown()
    df = run_sweep(config(["softmax"]))
    assert df["status"].tolist() == ["ok"] and sys.modules["__main__"] is page


def test_cancel_between_samples_keeps_finished_rows():
    """A first sweep that ends by itself (2 samples), then one whose points sample for 600 s: cancelled mid-point.
    (One sweep of both would end its first point only at MAX_SAMPLES, a minute on a busy machine.)"""
    finished = config(["softmax"], ns=(16,), measure_memory=False)
    endless = config(["slow", "linear"], ns=(16, 32), min_time_s=600.0, measure_memory=False, point_budget_s=600.0)
    run = Job.measure("test", (finished, endless), extra_mechanisms=(REF,))
    wait_until(lambda: run.progress.current.startswith("slow"))
    pid = worker.get_worker().process.pid
    run.cancel()
    assert run.wait(30)
    df = run.frame()
    assert statuses(df) == [("softmax", 16, "ok"), ("slow", 16, "cancelled"), ("linear", 16, "cancelled"),
                            ("slow", 32, "cancelled"), ("linear", 32, "cancelled")]
    assert df["reason"].iloc[1] == "cancelled while this point was measured"
    assert worker.get_worker().process.pid == pid  # it stopped by itself: no kill needed


def test_cancel_during_a_call_that_does_not_return_kills_the_worker():
    """Cancelled once the call has begun (a cancel before it, while a fresh worker still loads the mechanism, ends
    the point at its next check, with nothing to kill)."""
    started = hangs_started(os.getpid())
    started.unlink(missing_ok=True)
    run = start(config(["hangs", "softmax"]), extra_mechanisms=(REF,))
    wait_until(started.exists)
    run.cancel()
    assert run.wait(30)
    assert statuses(run.frame()) == [("hangs", 32, "cancelled"), ("softmax", 32, "cancelled")]
    assert "stopped" in run.frame()["reason"].iloc[0]
    assert worker.get_worker().wait_ready()  # a fresh worker is already warming up
    started.unlink()


def test_a_second_sweep_waits_for_the_lock_then_is_told():
    with sweep_module.sweep_lock():
        run = start(config(["softmax"]), lock_wait_s=0.5)
        assert run.wait(30)
        assert "another sweep is running on this machine" in run.error and "pid" in run.error
        assert run.frame()["status"].tolist() == ["cancelled"]
        with pytest.raises(RuntimeError, match="another sweep"):
            run_sweep(config(["softmax"]), lock_wait_s=0.2)


def test_a_waiting_sweep_starts_when_the_lock_is_released():
    held = sweep_module.sweep_lock()
    held.__enter__()
    run = start(config(["softmax"]), lock_wait_s=60)
    wait_until(lambda: run.progress.current.startswith("waiting for another sweep"))
    threading.Timer(0.2, held.__exit__, (None, None, None)).start()
    assert run.wait(60) and run.error is None
    assert run.frame()["status"].tolist() == ["ok"]


def test_a_link_planted_at_the_lock_path_is_refused_and_its_target_untouched(tmp_path, monkeypatch):
    target = tmp_path / "precious.txt"
    target.write_text("keep me")
    link = tmp_path / "sweep.lock"
    link.symlink_to(target)
    with pytest.raises(lock_module.SweepLockError, match="sweep.lock is a symbolic link.*remove the link"):
        with lock_module.sweep_lock(path=str(link)):
            pass
    monkeypatch.setattr(sweep_module, "sweep_lock", functools.partial(lock_module.sweep_lock, path=str(link)))
    run = start(config(["softmax"]))
    assert run.wait(30) and "is a symbolic link" in run.error and run.frame()["status"].tolist() == ["cancelled"]
    assert target.read_text() == "keep me"


def test_the_lock_lives_in_a_folder_of_the_users_own(tmp_path):
    folder = lock_module.user_folder(str(tmp_path))
    assert folder == str(tmp_path / f"attn_core-{os.getuid()}") and stat.S_IMODE(os.stat(folder).st_mode) == 0o700
    lock = os.path.join(folder, lock_module.LOCK_NAME)
    with lock_module.sweep_lock(path=lock):
        assert stat.S_IMODE(os.stat(lock).st_mode) == 0o600
    planted = tmp_path / "planted"
    planted.mkdir()
    (planted / f"attn_core-{os.getuid()}").symlink_to(tmp_path)
    with pytest.raises(lock_module.SweepLockError, match="is a symbolic link, which another user could have"):
        lock_module.user_folder(str(planted))


@pytest.mark.skipif(os.geteuid() != 0, reason="only root can make a folder that belongs to another user")
def test_a_lock_folder_of_another_user_is_refused(tmp_path):
    other = tmp_path / f"attn_core-{os.getuid()}"
    other.mkdir(mode=0o700)
    os.chown(other, 12345, 12345)
    with pytest.raises(lock_module.SweepLockError, match="belongs to another user .uid 12345."):
        lock_module.user_folder(str(tmp_path))


def test_invalid_config_is_refused_before_starting():
    with pytest.raises(ValueError, match="divisible"):
        start(config(["softmax"], d_model=10, heads=3))


def test_eta_comes_from_executed_flops_and_the_device_speed_not_from_fixed_costs(monkeypatch):
    """The first points are the cheapest: an ETA that scaled their wall time (overheads included) by the FLOP ratio
    said 'about 5055 s left' for a 36 s sweep. Now: calls × executed FLOPs ÷ achieved speed, plus the overhead seen.
    A fake worker on an injected clock: the first point runs at 50 GFLOP/s inside 5 s of wall clock, on a quiet
    machine (2 threads on 2 cores, nothing foreign)."""
    from attn_core.engine.measurement import theory_of
    from tests.engine.fake_worker import Clock, FakeWorker, Scripted

    monkeypatch.setattr(os, "cpu_count", lambda: 2)
    c = config(["softmax"], ns=(256, 1024, 4096), measure_memory=False, min_repeats=3, min_time_s=0.0, warmup=1)
    spec = ac.get("softmax")
    executed = [theory_of(spec, p).executed_flops for p in plan(c)]  # the spec's figures: what the ETA is made of

    def seconds(call_s: float) -> float:
        """A point of these settings: one warm-up call (no memory run), then 3 samples of back-to-back calls adding
        up to 1 ms or more each; the 30 s budget is far off (4 calls of n = 4096 at 50 GFLOP/s take 0.1 s)."""
        return 1 * call_s + 3 * max(call_s, 1e-3)

    assert c.settings.point_budget_s == 30.0 and seconds(max(executed) / 50e9) < 1.0
    clock, seen = Clock(), {}
    run = Job("eta", (c,), clock=clock, keep=False)
    fake = FakeWorker(clock, lambda i, p, s, share: Scripted(median_s=executed[i] / 50e9, wall_s=5.0),
                      on_point=lambda i: seen.setdefault(i, run.progress))
    run._workers = lambda: fake
    run.start()
    assert run.wait(30) and run.error is None
    assert seen[0].eta_s is None  # nothing timed yet: no figure promised
    overhead = 5.0 - seconds(executed[0] / 50e9)  # 5 s of fixed costs around a tiny point
    assert seen[1].eta_s == pytest.approx(sum(seconds(f / 50e9) + overhead for f in executed[1:]))
    assert seen[1].eta_text == f"about {seen[1].eta_s:.0f} s left" and not seen[1].busy


def test_a_sweeps_measurement_settings_are_carried_by_name_not_by_position():
    """Distinct values in every field: a swapped pair (two Optional[int] side by side) would show here."""
    from attn_core.engine.problem import Settings

    c = DEFAULT_SWEEP.replaced(warmup=2, min_repeats=7, min_time_s=0.3, point_budget_s=11.0,
                            measure_memory=False, memory_margin=0.4, memory_limit_bytes=1 << 20, threads=3)
    assert c.settings == Settings(warmup=2, min_repeats=7, min_time_s=0.3, point_budget_s=11.0, measure_memory=False,
                                    memory_margin=0.4, memory_limit_bytes=1 << 20, threads=3)
    with pytest.raises(TypeError):
        Settings(2, 7)  # keyword-only: a positional copy cannot be written
