"""The run store: points kept as a sweep measures them, a killed sweep's points kept and its run marked interrupted,
two writers at once, files that are not a store refused unchanged, export → import, prune, resume and the CLI."""
from __future__ import annotations

import contextlib
import json
import multiprocessing
import math
import os
import signal
import sqlite3
import subprocess
import sys
import threading
import time
from pathlib import Path

import pandas as pd
import pytest

from attn_core import cli
from attn_core.engine import store
from attn_core.engine.config import SweepConfig
from attn_core.engine.job import Job, run_sweep
from attn_core.engine.measurement import COLUMNS
from attn_core.engine.results import Run, frame_from_rows, load_run, save_run
from tests.fake_mechanisms import REF, private_sweep_lock  # noqa: F401 (an autouse fixture)

ROOT = Path(__file__).resolve().parents[2]
TINY = dict(heads=2, d_model=16, warmup=1, min_repeats=2, min_time_s=0.0, point_budget_s=30.0, device="cpu")


def row(mechanism: str = "softmax", n: int = 16, status: str = "ok", **changes) -> dict:
    """A saved row written out by hand, every column given (not through Measurement.to_row)."""
    measured = status == "ok"
    return {"mechanism": mechanism, "label": f"=HYPERLINK(\"x\") {mechanism}", "exact": mechanism == "softmax",
            "params": "{}", "n": n, "batch": 1, "heads": 2, "kv_heads": 2, "d_model": 16, "head_dim": 8,
            "dtype": "float32", "device": "cpu", "mode": "forward", "causal": False, "padding": 0, "status": status,
            "reason": "" if measured else "deliberate, «for the test»", "time_median_s": 1e-4 if measured else None,
            "time_iqr_s": 2e-6 if measured else None, "time_samples": [1.5e-4, 1e-4, 0.9e-4] if measured else [],
            "repeats": 3 if measured else 0, "peak_bytes": 4096.0 if measured else None,
            "memory_method": "torch.profiler", "predicted_bytes": 4000.0, "theory_flops": 1e6,
            "executed_flops": 1.2e6, "gflops": 12.0 if measured else None, "device_gflops": 100.0,
            "pct_of_device": 12.0 if measured else None, "sdpa_backend": "", "threads": 2.0,
            "foreign_cpu": 0.25, "load_average": None, "disturbed": n == 32, "retaken": 1, **changes}


def frame(rows: list[dict]) -> pd.DataFrame:
    return frame_from_rows([dict(r) for r in rows])


CONFIG = SweepConfig(mechanisms=(("softmax", {}), ("linear", {})), ns=(16, 32)).replaced(**TINY)


def test_points_are_in_the_store_as_the_sweep_shows_them_and_the_run_reads_back_whole(tmp_path):
    path = tmp_path / "runs.sqlite3"
    kept_when_shown = []

    def on_point(point):
        with store.Store(path, readonly=True) as reader:  # a second process's view: read-only, while it runs
            history = reader.history()
            kept_when_shown.append((int(history["points"][0]), history["status"][0]))

    measured = run_sweep(CONFIG, on_point, store_path=str(path), lock_wait_s=0)
    # a point shown is a point kept: the store holds it (and those after it, when the sweep outruns the display)
    assert len(kept_when_shown) == 4
    assert all(kept >= shown for shown, (kept, _) in enumerate(kept_when_shown, 1)), kept_when_shown
    assert all(status in ("running", "complete") for _, status in kept_when_shown)
    with store.Store(path, readonly=True) as reader:
        (entry,) = reader.history().to_dict("records")
        run = reader.run(entry["id"])
    assert (entry["status"], entry["points"], entry["ok"], entry["sizes"]) == ("complete", 4, 4, "16 – 32")
    pd.testing.assert_frame_equal(run.frame, measured)
    assert run.config == CONFIG.to_dict() and run.env["device"] == "cpu" and entry["machine"] == run.env["device_name"]


def test_a_cancelled_sweep_ends_interrupted_with_the_points_it_finished(tmp_path):
    path = tmp_path / "runs.sqlite3"
    config = SweepConfig(mechanisms=(("softmax", {}), ("hangs", {})), ns=(16,)).replaced(**TINY)
    job = Job.measure("cut", (config,), extra_mechanisms=(REF,), lock_wait_s=0, store_path=str(path))
    deadline = time.monotonic() + 60
    while not job.progress.current.startswith("hangs") and time.monotonic() < deadline:
        time.sleep(0.05)
    job.cancel()
    assert job.wait(30)
    with store.Store(path, readonly=True) as reader:
        (entry,) = reader.history().to_dict("records")
        kept = reader.run(entry["id"]).frame
    assert entry["status"] == "interrupted" and job.run_id == entry["id"] and job.store_error is None
    assert kept[["mechanism", "status"]].values.tolist() == [["softmax", "ok"], ["hangs", "cancelled"]]


def test_the_default_store_is_the_private_one_the_tests_set_and_else_the_user_s_data_folder(monkeypatch, tmp_path):
    assert store.default_path() == os.path.join(os.environ[store.HOME_VARIABLE], "runs.sqlite3")
    monkeypatch.delenv(store.HOME_VARIABLE)
    monkeypatch.setenv("HOME", "/home/ada")
    monkeypatch.setenv("XDG_DATA_HOME", "/data/ada")
    monkeypatch.setenv("LOCALAPPDATA", "C:/Users/ada/AppData/Local")
    expected = {"linux": "/data/ada/attention-lab/runs.sqlite3",
                "darwin": "/home/ada/Library/Application Support/attention-lab/runs.sqlite3",
                "win32": "C:/Users/ada/AppData/Local/attention-lab/runs.sqlite3"}
    for platform, path in expected.items():
        monkeypatch.setattr(sys, "platform", platform)
        assert store.default_path().replace(os.sep, "/") == path
    monkeypatch.setattr(sys, "platform", "linux")
    monkeypatch.delenv("XDG_DATA_HOME")
    assert store.default_path() == "/home/ada/.local/share/attention-lab/runs.sqlite3"


def _children(pid: int) -> list[int]:
    found = []
    for task in Path(f"/proc/{pid}/task").iterdir():
        found += [int(c) for c in (task / "children").read_text().split()]
    return found


@pytest.mark.skipif(not Path("/proc/self/task").exists(), reason="finds the worker through Linux's /proc")
def test_a_killed_worker_then_a_killed_parent_leave_the_points_measured_before_marked_interrupted(tmp_path):
    path = tmp_path / "runs.sqlite3"
    proc = subprocess.Popen(
        [sys.executable, "-m", "attn_core", "sweep", "--mechanisms", "softmax,hangs", "--n", "16,32", "--heads", "2",
         "--d-model", "16", "--min-repeats", "2", "--min-time", "0", "--quiet", "--device", "cpu",
         "--extra-mechanisms", REF, "--wait", "0", "--store", str(path)],
        cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
        env={**os.environ, "PYTHONPATH": str(ROOT), "TMPDIR": str(tmp_path)})  # TMPDIR: a private sweep lock
    try:
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:  # softmax n=16 kept; the worker now hangs in the second point
            if path.exists() and store.Store(path, readonly=True).history()["points"].sum() >= 1:
                break
            assert proc.poll() is None, proc.stderr.read()
            time.sleep(0.1)
        workers = [c for c in _children(proc.pid) if b"spawn_main" in Path(f"/proc/{c}/cmdline").read_bytes()]
        assert len(workers) == 1
        os.kill(workers[0], signal.SIGKILL)
        proc.kill()  # SIGKILL: no handler runs, the run stays 'running' in the file
    finally:
        proc.kill()
        proc.wait()
    with store.Store(path, readonly=True) as reader:
        (entry,) = reader.history().to_dict("records")
        kept = reader.run(entry["id"]).frame
    assert entry["status"] == "interrupted"  # shown so: its process is gone
    assert kept[["mechanism", "n", "status"]].values.tolist()[0] == ["softmax", 16, "ok"]
    with store.Store(path) as writer:  # a writer's open writes it down
        assert writer._db.execute("SELECT status FROM runs").fetchall()[0][0] == "interrupted"


def _write(path: str, name: str, go, rows: list[dict]) -> None:
    """One writer process: a run of 100 points, each its own commit, begun when `go` is set."""
    with store.Store(path) as kept:
        run_id = kept.begin({}, {}, name=name)
        go.wait(30)
        for i in range(100):
            kept.add_points(run_id, [dict(rows[i % len(rows)], n=16 + i)])
        kept.finish(run_id, "complete")


def test_two_processes_writing_at_once_lose_nothing(tmp_path):
    path = str(tmp_path / "runs.sqlite3")
    store.Store(path).close()
    methods = multiprocessing.get_all_start_methods()
    context = multiprocessing.get_context("fork" if "fork" in methods else "spawn")  # fork: no second torch import
    go = context.Event()
    procs = [context.Process(target=_write, args=(path, name, go, [row(), row(n=32, status="failed")]))
             for name in ("first", "second")]
    for p in procs:
        p.start()
    go.set()  # the 100 points of each overlap
    for p in procs:
        p.join(60)
        assert p.exitcode == 0
    with store.Store(path, readonly=True) as reader:
        history = reader.history().set_index("name")
        assert history.loc[["first", "second"], "points"].tolist() == [100, 100]
        assert history["status"].tolist() == ["complete", "complete"]
        assert reader.run(history.loc["first", "id"]).frame["n"].tolist() == list(range(16, 116))


def test_a_second_writer_waits_for_the_first_then_is_refused_with_a_sentence(tmp_path):
    path = tmp_path / "runs.sqlite3"
    with store.Store(path) as kept:
        run_id = kept.begin({}, {})
    holder = sqlite3.connect(path, isolation_level=None, check_same_thread=False)
    holder.execute("BEGIN IMMEDIATE")  # another process's write in progress
    try:
        with store.Store(path, busy_s=0.2) as second, pytest.raises(store.StoreBusyError) as refused:
            second.add_points(run_id, [row()])
        assert "is being written by another process" in str(refused.value)
        waiting = store.Store(path, busy_s=10)
        threading.Timer(0.3, lambda: holder.execute("COMMIT")).start()
        waiting.add_points(run_id, [row()])  # waits for the commit, then writes
        assert waiting.history()["points"].tolist() == [1]
        waiting.close()
    finally:
        holder.close()


def _damaged(path: Path) -> None:
    with store.Store(path) as kept:
        kept.add_points(kept.begin({}, {}), [row(n=16 + i) for i in range(50)])
    data = bytearray(path.read_bytes())
    data[100:] = bytes((i * 7 + 3) % 256 for i in range(len(data) - 100))  # every page but the header garbled
    path.write_bytes(bytes(data))


def _newer(path: Path) -> None:
    with store.Store(path):
        pass
    with contextlib.closing(sqlite3.connect(path)) as db:
        db.execute(f"PRAGMA user_version = {store.SCHEMA_VERSION + 1}")


def _foreign(path: Path) -> None:
    with contextlib.closing(sqlite3.connect(path)) as db, db:
        db.execute("CREATE TABLE notes (text TEXT)")
        db.execute("INSERT INTO notes VALUES ('mine')")


REFUSED = {"damaged": (_damaged, "is damaged"),
           "newer schema": (_newer, "was written by a newer Attention Lab"),
           "another program's SQLite": (_foreign, "is an SQLite database of another program"),
           "not SQLite": (lambda p: p.write_text("name,age\nada,36\n" * 20), "not an SQLite database")}


@pytest.mark.parametrize("kind", REFUSED)
def test_a_file_that_is_not_a_usable_store_is_refused_with_a_sentence_and_left_unchanged(tmp_path, kind):
    path = tmp_path / "runs.sqlite3"
    make, said = REFUSED[kind]
    make(path)
    before = path.read_bytes()
    for readonly in (False, True):
        with pytest.raises(store.StoreError) as refused:
            with store.Store(path, readonly=readonly) as opened:
                opened.history()
        assert said in str(refused.value) and str(path) in str(refused.value)
        assert path.read_bytes() == before
    code, _, err = run_cli("runs", "list", "--store", str(path))
    assert code == cli.EXIT_USAGE and said in err and path.read_bytes() == before
    code, _, err = run_cli("sweep", "--mechanisms", "softmax", "--n", "16", "--store", str(path))
    assert code == cli.EXIT_USAGE and "or measure with --no-store" in err and path.read_bytes() == before


def test_the_store_s_points_table_follows_the_saved_row_schema_and_carries_its_version(tmp_path):
    path = tmp_path / "runs.sqlite3"
    store.Store(path).close()
    with contextlib.closing(sqlite3.connect(path)) as db:
        columns = [r[1] for r in db.execute("PRAGMA table_info(points)")]
        assert columns == ["run_id", "seq", *COLUMNS]  # a new row column needs a store migration
        assert db.execute("PRAGMA user_version").fetchone()[0] == store.SCHEMA_VERSION == len(store.MIGRATIONS)
        assert db.execute("PRAGMA journal_mode").fetchone()[0] == "wal"
    assert int.from_bytes(path.read_bytes()[68:72], "big") == 0x41544C42


@pytest.mark.parametrize("suffix", [".json", ".csv"])
def test_export_then_import_round_trips_every_column(tmp_path, suffix):
    original = Run(frame([row(), row("linear", 32), row("linear", 64, "failed")]),
                   {"device_name": "a CPU", "threads": 2}, {"ns": [16, 32, 64], "mechanisms": [["softmax", {}]]})
    path = tmp_path / "runs.sqlite3"
    with store.Store(path) as kept:
        first = kept.import_run(original, "by hand")
    out = tmp_path / f"run{suffix}"
    assert run_cli("runs", "export", str(first), "--out", str(out), "--store", str(path))[0] == 0
    code, printed, _ = run_cli("runs", "import", str(out), "--store", str(path))
    assert code == 0
    with store.Store(path, readonly=True) as reader:
        again = reader.run(int(printed))
        assert reader.info(int(printed))["name"] == f"run{suffix}"
    pd.testing.assert_frame_equal(again.frame, original.frame)
    assert list(again.frame.columns) == list(COLUMNS)
    assert (again.env, again.config) == (original.env, original.config)
    assert math.isnan(again.frame["load_average"][0]) and again.frame["disturbed"].tolist() == [False, True, False]


def run_cli(*argv: str) -> tuple[int, str, str]:
    import io

    out, err = io.StringIO(), io.StringIO()
    return cli.main(list(argv), out, err), out.getvalue(), err.getvalue()


def test_runs_list_json_rename_note_delete_and_prune(tmp_path):
    path = tmp_path / "runs.sqlite3"
    with store.Store(path) as kept:
        ids = [kept.import_run(Run(frame([row(), row(n=32)]), {}, {}), f"run {i}") for i in range(4)]
        kept.rename(ids[0], "Monday's")
        kept.set_note(ids[0], "before the talk")
        kept._db.execute("UPDATE runs SET created = '2020-01-01T00:00:00+00:00' WHERE id = ?", (ids[1],))
        orphan = kept.begin({}, {})
        kept._db.execute("UPDATE runs SET pid = 2147483647 WHERE id = ?", (orphan,))  # a process that is not there
    code, printed, _ = run_cli("runs", "list", "--json", "--store", str(path))
    listed = json.loads(printed)
    assert code == 0 and [(r["id"], r["status"], r["points"]) for r in listed] == [
        (orphan, "interrupted", 0), *[(i, "complete", 2) for i in reversed(ids)]]
    assert (listed[-1]["name"], listed[-1]["note"]) == ("Monday's", "before the talk")
    assert run_cli("runs", "delete", str(ids[3]), "999", "--store", str(path))[0] == cli.EXIT_USAGE  # none deleted
    assert run_cli("runs", "delete", str(ids[3]), "--store", str(path))[0] == 0
    with store.Store(path) as kept:
        assert kept.prune(older_than_days=365) == 1  # ids[1], made old above
        assert kept.prune(keep=2) == 1  # the orphan and ids[2] stay (newest), ids[0] goes
        assert kept.history()["id"].tolist() == [orphan, ids[2]]
        with pytest.raises(ValueError, match="say what to prune"):
            kept.prune()


def test_pruning_gives_the_space_back(tmp_path):
    path = tmp_path / "runs.sqlite3"
    with store.Store(path) as kept:
        for _ in range(5):
            run_id = kept.begin({}, {})
            kept.add_points(run_id, [row(n=16 + i) for i in range(400)])
            kept.finish(run_id, "complete")  # a run still measuring is never pruned
        before = kept.size_bytes()
        assert kept.prune(keep=1) == 4
        assert kept.size_bytes() < before / 3 and kept.history()["points"].tolist() == [400]


def test_resume_plans_exactly_the_points_an_interrupted_run_lacks_and_says_when_the_environment_changed(tmp_path):
    config = SweepConfig(mechanisms=(("softmax", {}), ("sliding_window", {"window": 4})), ns=(16, 32, 64)).replaced(
        **TINY)
    with store.Store(tmp_path / "runs.sqlite3") as kept:
        run_id = kept.begin({"device_name": "old GPU", "torch": "2.3"}, config.to_dict())
        kept.add_points(run_id, [row("softmax", 16), row("sliding_window", 16, params='{"window": 4}'),
                                 row("softmax", 32, "failed"), row("sliding_window", 32, params='{"window": 4}')])
        with pytest.raises(store.StoreError, match="only an interrupted or failed run can be resumed"):
            store.resume_plan(kept, run_id)
        kept.finish(run_id, "interrupted")
        plan = store.resume_plan(kept, run_id, {"device_name": "new GPU", "torch": "2.3"})
    wanted = {("softmax", 32), ("softmax", 64), ("sliding_window", 64)}
    assert {(key, n) for s in plan.sweeps for key, _ in s.mechanisms for n in s.ns} == wanted
    assert plan.missing == 3 and all(s.problem == config.problem for s in plan.sweeps)
    assert plan.notes == ("the environment changed since the run was measured: device_name old GPU → new GPU",)


def test_a_store_that_does_not_exist_reads_as_empty_and_is_not_created(tmp_path):
    path = tmp_path / "nowhere" / "runs.sqlite3"
    with store.Store(path, readonly=True) as reader:
        assert reader.history().empty and reader.size_bytes() == 0
    assert not path.parent.exists()


def test_runs_resume_measures_only_the_missing_point_into_the_same_run(tmp_path):
    path = tmp_path / "runs.sqlite3"
    with store.Store(path) as kept:
        run_id = kept.begin({"device_name": "a CPU"}, CONFIG.to_dict())
        kept.add_points(run_id, [row("softmax", 16), row("linear", 16), row("softmax", 32)])
        kept.finish(run_id, "interrupted")
    code, _, err = run_cli("runs", "resume", str(run_id), "--store", str(path), "--wait", "0")
    assert code == 0, err
    assert "measuring the 1 point run" in err and "note: the environment changed" in err  # "a CPU" is not this one
    with store.Store(path, readonly=True) as reader:
        assert reader.info(run_id)["status"] == "complete"
        points = reader.run(run_id).frame
    assert points[["mechanism", "n", "status"]].values.tolist()[3] == ["linear", 32, "ok"] and len(points) == 4
    assert run_cli("runs", "resume", str(run_id), "--store", str(path))[2].endswith(
        "only an interrupted or failed run can be resumed\n")
