"""The run store against a hostile machine: a full disk (an import leaves nothing, and says why), a pipe or device
where the store or a model file should be (refused, never waited on), a store on a read-only mount (listed), run
ids, ages and configs that used to end in tracebacks, an export no larger than import takes back, huge texts."""
from __future__ import annotations

import contextlib
import io
import json
import os
import shutil
import sqlite3
import subprocess
import sys
import threading
from pathlib import Path

import pandas as pd
import pytest

from attn_core import cli
from attn_core.engine import store
from attn_core.engine import results
from attn_core.engine.results import Run, load_run
from tests.fake_mechanisms import private_sweep_lock  # noqa: F401 (an autouse fixture)
from tests.dashboard.test_compare_store import compare, kept  # noqa: F401 (kept: the Compare page's store, a fixture)
from tests.dashboard.test_pages_insight import errors
from tests.engine.test_store import frame, row

ROOT = Path(__file__).resolve().parents[2]
HUGE_ID = str(10**23)


def run_cli(*argv: str) -> tuple[int, str, str]:
    out, err = io.StringIO(), io.StringIO()
    return cli.main(list(argv), out, err), out.getvalue(), err.getvalue()


def refused(code: int, err: str) -> bool:
    """Exit code 2 and one line of error: a sentence, no traceback."""
    return code == cli.EXIT_USAGE and err.startswith("error: ") and err.count("\n") == 1 and "Traceback" not in err


def count(path: Path, table: str) -> int:
    """Rows of a table, read with plain sqlite3 (not through the store)."""
    with contextlib.closing(sqlite3.connect(path)) as db:
        return db.execute(f"SELECT COUNT(*) FROM {table}").fetchone()[0]


def many(points: int) -> Run:
    return Run(frame([row(n=16 + i) for i in range(points)]), {"device_name": "a CPU"}, {})


# ---- 1. a full disk: an import is one transaction; the message names the cause ----

def test_an_import_that_fills_the_disk_leaves_no_run_and_says_the_disk_is_full(tmp_path):
    path = tmp_path / "runs.sqlite3"
    with store.Store(path) as kept:
        first = kept.import_run(many(1), "small")
        # SQLite's own "database or disk is full" (SQLITE_FULL), as a full disk gives it: the file may not grow
        # more than a few pages, far less than 2,000 points take
        kept._db.execute(f"PRAGMA max_page_count = {kept._db.execute('PRAGMA page_count').fetchone()[0] + 3}")
        with pytest.raises(store.StoreError, match="the disk is full, so nothing of this change was kept; free some "
                                                   "space and try again") as caught:
            kept.import_run(many(2000), "big")
        assert "rollback" not in str(caught.value)
        assert kept.history()["id"].tolist() == [first]  # the same store, still open: nothing half-kept
        # a writer whose write failed for want of room tries again once there is room (a sweep keeps its points)
        kept._db.execute("PRAGMA max_page_count = 1073741823")
        again = kept.import_run(many(2000), "big")
    assert count(path, "runs") == 2 and count(path, "points") == 1 + 2000
    with store.Store(path, readonly=True) as reader:
        assert reader.history()[["id", "points"]].values.tolist() == [[again, 2000], [first, 1]]


def test_points_refused_by_a_full_disk_are_taken_when_there_is_room_again(tmp_path):
    path = tmp_path / "runs.sqlite3"
    with store.Store(path) as kept:
        run_id = kept.begin({}, {})
        kept._db.execute(f"PRAGMA max_page_count = {kept._db.execute('PRAGMA page_count').fetchone()[0] + 1}")
        with pytest.raises(store.StoreError, match="the disk is full"):
            kept.add_points(run_id, [row(n=16 + i) for i in range(1000)])
        kept._db.execute("PRAGMA max_page_count = 1073741823")
        kept.add_points(run_id, [row(n=16 + i) for i in range(1000)])
    assert count(path, "points") == 1000


def _user_namespace(script: str, timeout: float = 120) -> subprocess.CompletedProcess:
    """`script` (sh) as root of a new user and mount namespace, where it may mount; skipped where that is not
    allowed."""
    if not shutil.which("unshare"):
        pytest.skip("needs unshare (util-linux) to mount a folder of the test's own")
    probe = subprocess.run(["unshare", "-r", "-m", "sh", "-c", "mount -t tmpfs tmpfs /mnt"], capture_output=True)
    if probe.returncode:
        pytest.skip(f"needs user namespaces that may mount (unshare -r -m): {probe.stderr.decode()[:200].strip()}")
    return subprocess.run(["unshare", "-r", "-m", "sh", "-c", script], capture_output=True, text=True, cwd=ROOT,
                          timeout=timeout, env={**os.environ, "PYTHONPATH": str(ROOT)})


def test_runs_import_onto_a_really_full_disk_keeps_nothing_and_names_the_cause(tmp_path):
    results.save_run(many(1), tmp_path / "small.json")
    results.save_run(many(3000), tmp_path / "big.json")  # 2.8 MB of points; the disk below holds 400 KiB
    disk = tmp_path / "disk"
    disk.mkdir()
    python, store_path = sys.executable, disk / "runs.sqlite3"
    done = _user_namespace(
        f"mount -t tmpfs -o size=400k tmpfs {disk} || exit 99\n"
        f"{python} -m attn_core runs import {tmp_path / 'small.json'} --store {store_path} || exit 98\n"
        f"{python} -m attn_core runs import {tmp_path / 'big.json'} --store {store_path}; echo \"rc=$?\"\n"
        f"{python} -m attn_core runs list --json --store {store_path}\n")
    assert "rc=2" in done.stdout, done.stderr
    assert "could not be written: the disk is full, so nothing of this change was kept" in done.stderr
    assert "Traceback" not in done.stderr and "rollback" not in done.stderr
    listed = json.loads(done.stdout.split("rc=2", 1)[1])
    assert [(r["name"], r["points"]) for r in listed] == [("small.json", 1)]


# ---- 2. a pipe or a device is refused, not waited on; a read-only store is listed ----

def _ends(action, fifo: Path, seconds: float = 60):
    """action()'s value; the test fails (and the pipe is released) if it is still waiting on the pipe after
    `seconds`: a hang guard, not a timing."""
    outcome = []

    def run() -> None:
        try:
            outcome.append((True, action()))
        except Exception as e:  # raised again below, in the test's own thread
            outcome.append((False, e))

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    thread.join(seconds)
    if thread.is_alive():
        with contextlib.suppress(OSError):  # a writer that comes and goes lets a reader blocked in open() go on
            os.close(os.open(fifo, os.O_WRONLY | os.O_NONBLOCK))
        thread.join(10)
        pytest.fail(f"still waiting on the pipe {fifo} after {seconds} s")
    ok, value = outcome[0]
    if not ok:
        raise value
    return value


@pytest.mark.parametrize("argv", [["runs", "list"], ["runs", "show", "1"], ["runs", "import", "RUN"],
                                  ["runs", "prune", "--keep", "1"],
                                  ["sweep", "--mechanisms", "softmax", "--n", "16", "--quiet"]])
def test_a_pipe_as_the_store_is_refused_with_a_sentence(tmp_path, argv):
    fifo = tmp_path / "runs.sqlite3"
    os.mkfifo(fifo)
    results.save_run(many(1), tmp_path / "run.json")
    argv = [str(tmp_path / "run.json") if a == "RUN" else a for a in argv]
    code, _, err = _ends(lambda: run_cli(*argv, "--store", str(fifo)), fifo)
    assert refused(code, err) and f"{fifo} is a pipe, not a run store (one SQLite file)" in err, err
    assert "choose another store with --store" in err


def test_a_pipe_or_a_device_opened_as_a_store_by_the_library_is_refused(tmp_path):
    fifo = tmp_path / "runs.sqlite3"
    os.mkfifo(fifo)
    for readonly in (True, False):
        with pytest.raises(store.StoreError, match="is a pipe, not a run store"):
            _ends(lambda: store.Store(fifo, readonly=readonly), fifo)
    with pytest.raises(store.StoreError, match="/dev/null is a device, not a run store"):
        store.Store("/dev/null", readonly=True)  # read as an empty store before: "no runs"
    assert fifo.is_fifo()


def test_a_pipe_or_a_folder_as_a_model_file_is_refused_with_a_sentence(tmp_path):
    fifo = tmp_path / "model.json"
    os.mkfifo(fifo)
    code, _, err = _ends(lambda: run_cli("plan", str(fifo)), fifo)
    assert refused(code, err) and f"{fifo} is a pipe, not a file; name a regular file" in err, err
    (tmp_path / "folder.json").mkdir()
    code, _, err = run_cli("plan", str(tmp_path / "folder.json"))
    assert refused(code, err) and "folder.json is a folder, not a file" in err, err


def test_a_store_on_a_read_only_mount_is_listed_shown_and_exported_and_a_change_is_refused(tmp_path):
    folder = tmp_path / "kept"
    folder.mkdir()
    path = folder / "runs.sqlite3"
    with store.Store(path) as kept:
        run_id = kept.import_run(many(3), "on a read-only disk")
    assert sorted(p.name for p in folder.iterdir()) == ["runs.sqlite3"]  # no -wal, no -shm: a clean close
    python, out = sys.executable, tmp_path / "out.json"
    done = _user_namespace(
        f"mount --bind {folder} {folder} && mount -o remount,ro,bind {folder} || exit 99\n"
        f"touch {folder}/probe 2>/dev/null && exit 97\n"  # the mount really is read-only
        f"{python} -m attn_core runs list --json --store {path} || exit 1\n"
        f"{python} -m attn_core runs export {run_id} --out {out} --store {path} || exit 2\n"
        f"{python} -m attn_core runs delete {run_id} --store {path}; echo \"rc=$?\"\n")
    assert done.returncode == 0, (done.returncode, done.stderr)
    listed = json.loads(done.stdout.split("rc=")[0])
    assert [(r["id"], r["name"], r["points"]) for r in listed] == [(run_id, "on a read-only disk", 3)]
    assert len(load_run(out).frame) == 3
    assert "rc=2" in done.stdout and f"{path} can only be read here: it or its folder cannot be written" in done.stderr
    with store.Store(path, readonly=True) as reader:
        assert reader.history()["id"].tolist() == [run_id]  # the delete was refused: the run is still there


# ---- 3. values that ended in tracebacks ----

@pytest.fixture
def kept_runs(tmp_path):
    """A store with a complete run and interrupted runs whose configs are not a sweep."""
    path = tmp_path / "runs.sqlite3"
    ids = {}
    with store.Store(path) as kept:
        ids["complete"] = kept.import_run(many(2), "done")
        for name, config in [("empty", {"sweeps": []}), ("list", [{"ns": [16]}]), ("text", "a sweep"),
                             ("numbers", {"sweeps": [1, 2]})]:
            ids[name] = kept.begin({}, config)
            kept.add_points(ids[name], [row()])
            kept.finish(ids[name], "interrupted")
    return path, ids


@pytest.mark.parametrize("argv, words", [
    (["runs", "show", HUGE_ID], f"there is no run {HUGE_ID} in"),
    (["runs", "export", HUGE_ID, "--out", "OUT"], f"there is no run {HUGE_ID} in"),
    (["runs", "delete", "1", HUGE_ID], f"there is no run {HUGE_ID} in"),
    (["runs", "resume", HUGE_ID], f"there is no run {HUGE_ID} in"),
    (["runs", "show", str(-10**23)], f"there is no run -{HUGE_ID} in"),
    (["runs", "prune", "--days", "inf"], "--days inf: give the age in days as a finite number, 0 or more"),
    (["runs", "prune", "--days", "nan"], "--days nan: give the age in days as a finite number, 0 or more"),
    (["runs", "prune", "--days", "-1"], "--days -1.0: give the age in days as a finite number, 0 or more"),
    (["runs", "prune", "--keep", "-1"], "--keep -1: give the number of newest runs to keep, 0 or more"),
    (["runs", "prune"], "say what to prune: --keep N keeps the N newest runs, --days D deletes"),
    (["runs", "resume", "ID:empty"], "config holds an empty list of sweeps, so what it lacks cannot be known"),
    (["runs", "resume", "ID:list"], "config holds a JSON list, not a sweep, so what it lacks cannot be known"),
    (["runs", "resume", "ID:text"], "config holds a JSON string, not a sweep"),
    (["runs", "resume", "ID:numbers"], "config holds 'sweeps' that are not a list of sweeps"),
    (["runs", "resume", "ID:complete"], "is complete; only an interrupted or failed run can be resumed"),
    (["runs", "resume", "ID:empty", "--wait", "inf"], "--wait inf: give the seconds to wait for another sweep"),
])
def test_a_value_that_ended_in_a_traceback_is_refused_with_a_sentence(kept_runs, tmp_path, argv, words):
    path, ids = kept_runs
    argv = [str(ids[a[3:]]) if a.startswith("ID:") else str(tmp_path / "out.json") if a == "OUT" else a
            for a in argv]
    code, _, err = run_cli(*argv, "--store", str(path))
    assert refused(code, err) and words in err, err
    assert count(path, "runs") == len(ids) and not (tmp_path / "out.json").exists()  # nothing lost, nothing written
    if "resume" in argv and "config holds" in words:
        assert "measure it again as a new sweep" in err


def test_an_age_beyond_the_calendar_prunes_nothing_and_a_day_prunes_the_old_run(kept_runs):
    path, ids = kept_runs
    with contextlib.closing(sqlite3.connect(path)) as db, db:
        db.execute("UPDATE runs SET created = '2020-01-01T00:00:00+00:00' WHERE id = ?", (ids["complete"],))
    code, _, err = run_cli("runs", "prune", "--days", "1e300", "--store", str(path))
    assert code == 0 and err.startswith("deleted 0 runs;")
    code, _, err = run_cli("runs", "prune", "--days", "1", "--store", str(path))
    assert code == 0 and err.startswith("deleted 1 run;") and count(path, "runs") == len(ids) - 1


# ---- 4. what is exported can be imported again ----

def test_the_export_limit_is_the_import_limit_and_the_upload_limit():
    upload = next(line for line in (ROOT / ".streamlit" / "config.toml").read_text().splitlines()
                  if line.startswith("maxUploadSize"))
    assert int(upload.split("=")[1]) * 2**20 == results.MAX_FILE_BYTES == 32 * 2**20


def test_an_export_larger_than_import_takes_is_refused_naming_both_sizes_and_the_csv_that_fits(tmp_path,
                                                                                                monkeypatch):
    path = tmp_path / "runs.sqlite3"
    run = Run(frame([row(n=16 + i, time_samples=[1e-4] * 200) for i in range(40)]), {"device_name": "a CPU"}, {})
    with store.Store(path) as kept:
        run_id = kept.import_run(run, "long")
    sizes = {kind: len(getattr(results, f"to_{kind}_bytes")(run)) for kind in ("json", "csv")}
    assert sizes["csv"] < sizes["json"]
    limit = (sizes["csv"] + sizes["json"]) // 2  # the JSON file is larger than a run file may be, the CSV is not
    monkeypatch.setattr(results, "MAX_FILE_BYTES", limit)
    code, _, err = run_cli("runs", "export", str(run_id), "--out", str(tmp_path / "run.json"), "--store", str(path))
    assert refused(code, err) and not (tmp_path / "run.json").exists(), err
    assert (f"run {run_id} as JSON is {sizes['json'] / 2**20:.1f} MiB, more than the {limit / 2**20:.1f} MiB a run "
            f"file may be to be imported or uploaded again, so it was not exported; export it as .csv "
            f"({sizes['csv'] / 2**20:.1f} MiB), which fits") in err
    assert run_cli("runs", "export", str(run_id), "--out", str(tmp_path / "run.csv"), "--store", str(path))[0] == 0
    code, printed, err = run_cli("runs", "import", str(tmp_path / "run.csv"), "--store", str(path))
    assert code == 0, err
    with store.Store(path, readonly=True) as reader:
        pd.testing.assert_frame_equal(reader.run(int(printed)).frame, run.frame)
    monkeypatch.setattr(results, "MAX_FILE_BYTES", sizes["csv"] - 1)  # neither fits now
    code, _, err = run_cli("runs", "export", str(run_id), "--out", str(tmp_path / "run2.csv"), "--store", str(path))
    assert refused(code, err) and "it stays whole in the store" in err and not (tmp_path / "run2.csv").exists()


# ---- 5. the history with huge texts ----

def test_the_history_returns_huge_and_damaged_texts_without_failing(tmp_path):
    path = tmp_path / "runs.sqlite3"
    with store.Store(path) as kept:
        named = kept.import_run(Run(frame([row()]), {"device_name": "x" * 2**20}, {}), "n" * 2**20)
        deep = kept.begin({}, {})
        orphan = kept.begin({}, {})
    nested = "[" * 100_000 + "]" * 100_000  # json.loads recurses once a level: a RecursionError, not a ValueError
    with contextlib.closing(sqlite3.connect(path)) as db, db:
        db.execute("UPDATE runs SET env = ?, config = ? WHERE id = ?", (nested, nested, deep))
        db.execute("UPDATE runs SET pid = ? WHERE id = ?", (2**62, orphan))  # no process has it: os.kill overflows
    with store.Store(path, readonly=True) as reader:
        history = reader.history().set_index("id")
        assert history.loc[named, "name"] == "n" * store.NAME_CHARS
        assert history.loc[named, "machine"] == "x" * store.MACHINE_CHARS
        assert history.loc[deep, "machine"] == "" and history.loc[orphan, "status"] == "interrupted"
        with pytest.raises(store.StoreError, match=f"run {deep} in .* is damaged"):
            reader.run(deep)


def test_the_compare_page_offers_no_export_larger_than_its_upload_takes_back(kept, monkeypatch):
    with store.Store(readonly=True) as reader:
        run = reader.run(kept["laptop"])
    sizes = {kind: len(getattr(results, f"to_{kind}_bytes")(run)) for kind in ("json", "csv")}
    monkeypatch.setattr(results, "MAX_FILE_BYTES", (sizes["csv"] + sizes["json"]) // 2)
    at = compare()
    at.selectbox(key="cmp_pick").set_value(kept["laptop"]).run()
    assert not at.exception and errors(at) == []
    assert [b.key for b in at.get("download_button")] == ["cmp_export_csv"]
    shown = [c.value.replace("\\", "") for c in at.caption]  # Markdown's escapes (untrusted.literal) taken off
    assert any(f"Run #{kept['laptop']} as JSON is" in c and "export it as .csv" in c for c in shown), shown


def test_the_compare_page_says_why_a_run_whose_config_is_not_a_sweep_cannot_be_resumed(kept):
    with store.Store() as kept_store:
        cut = kept_store.begin({}, [{"ns": [16]}])
        kept_store.finish(cut, "interrupted")
    at = compare()
    at.selectbox(key="cmp_pick").set_value(cut).run()
    assert not at.exception, [e.value for e in at.exception]
    shown = [c.value.replace("\\", "") for c in at.caption]
    assert any(f"run {cut}'s config holds a JSON list, not a sweep" in c for c in shown), shown
    assert [b for b in at.button if b.key == "cmp_resume"] == []


def test_names_and_notes_set_by_hand_are_kept_as_printable_text(tmp_path):
    """A name or note typed with ESC or a lone surrogate is kept with the character written as its escape, so the
    store, a table and a terminal all show the same inert text (newlines in a note stay)."""
    with store.Store(tmp_path / "runs.sqlite3") as kept:
        run_id = kept.import_run(many(1), "plain")
        kept.rename(run_id, "evil\x1b]0;title\x07\ud800")
        kept.set_note(run_id, "line one\nline two\x1b[2J")
        info = kept.info(run_id)
    assert info["name"] == "evil\\x1b]0;title\\x07\\ud800"
    assert info["note"] == "line one\nline two\\x1b[2J"
