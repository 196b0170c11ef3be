"""The Compare page's history of kept runs: the table and its filter, runs opened together, name and note saved,
deletion and pruning only once confirmed, run files kept, the store's size, resume offered, a damaged store said."""
from __future__ import annotations


import pytest
from streamlit.testing.v1 import AppTest

from attn_core.engine import store
from attn_core.engine.config import SweepConfig
from attn_core.engine.results import load_run
from tests.dashboard.test_pages_insight import ROOT, charts, errors, records, run_bytes


@pytest.fixture
def kept(tmp_path, monkeypatch):
    """A store of its own with three runs: a laptop's, a server's (both complete) and an interrupted one."""
    monkeypatch.setenv(store.HOME_VARIABLE, str(tmp_path))
    with store.Store() as s:
        laptop = s.import_run(load_run(run_bytes("Laptop CPU", 1.0)), "laptop")
        server = s.import_run(load_run(run_bytes("Server CPU", 0.25)), "server")
        config = SweepConfig(mechanisms=(("softmax", {}), ("linear", {})), ns=(256, 512)).replaced(
            heads=4, d_model=256, device="cpu")  # run_bytes's sizes
        cut = load_run(run_bytes("Laptop CPU", 1.0, ns=(256,), keys=("softmax",)))
        cut.config = config.to_dict()
        short = s.import_run(cut, "cut short")
        s.finish(short, "interrupted")
    return {"laptop": laptop, "server": server, "short": short, "path": tmp_path / store.FILE_NAME}


def compare() -> AppTest:
    return AppTest.from_file(str(ROOT / "pages" / "compare.py"), default_timeout=60).run()


def names() -> list[str]:
    with store.Store(readonly=True) as s:
        return s.history()["name"].tolist()


def test_the_history_lists_each_run_and_the_filter_narrows_it(kept):
    at = compare()
    assert errors(at) == []
    table = at.dataframe[0].value
    assert table["name"].tolist() == ["cut short", "server", "laptop"]
    assert table["status"].tolist() == ["interrupted", "complete", "complete"]
    assert table["points"].tolist() == [1, 9, 9] and table["sizes"].tolist()[1] == "256 – 1,024"
    assert table["machine"].tolist()[1] == "Server CPU"
    assert any("3 runs" in c.value for c in at.caption)  # where it lives and its size
    at.text_input(key="cmp_filter").set_value("server").run()
    assert at.dataframe[0].value["name"].tolist() == ["server"]


def test_runs_opened_together_are_drawn_and_compared(kept):
    at = compare()
    at.multiselect(key="cmp_open").set_value([kept["laptop"], kept["server"]]).run()
    assert errors(at) == []
    overlay, _, ratio = charts(at)
    sources = {r["source"] for r in records(overlay, "source")}
    day = _day()
    assert sources == {f"#{kept['laptop']} laptop ({day}) · Laptop CPU",
                       f"#{kept['server']} server ({day}) · Server CPU"}
    ratios = [r["ratio"] for r in records(ratio, "ratio")]
    assert ratios and all(r == pytest.approx(0.25) for r in ratios)  # the server took a quarter of the time


def _day() -> str:
    with store.Store(readonly=True) as s:
        return s.history()["created"][0][:10]


def test_name_and_note_are_saved_to_the_store(kept):
    at = compare()
    at.selectbox(key="cmp_pick").set_value(kept["laptop"]).run()
    at.text_input(key=f"cmp_name_{kept['laptop']}").set_value("Monday's laptop").run()
    at.text_area(key=f"cmp_note_{kept['laptop']}").set_value("before the talk").run()
    at.button(key="cmp_save").click().run()
    assert errors(at) == []
    with store.Store(readonly=True) as s:
        assert (s.info(kept["laptop"])["name"], s.info(kept["laptop"])["note"]) == ("Monday's laptop",
                                                                                    "before the talk")
    assert "Monday's laptop" in at.dataframe[0].value["name"].tolist()


def test_a_run_is_deleted_only_once_confirmed(kept):
    at = compare()
    at.selectbox(key="cmp_pick").set_value(kept["server"]).run()
    at.button(key="cmp_delete").click().run()
    assert any("Delete run" in w.value and "cannot be undone" in w.value for w in at.warning)
    assert "server" in names()
    at.button(key="cmp_confirm_no").click().run()
    assert "server" in names() and not any("cannot be undone" in w.value for w in at.warning)
    at.button(key="cmp_delete").click().run()
    at.button(key="cmp_confirm_yes").click().run()
    assert errors(at) == [] and names() == ["cut short", "laptop"]
    assert at.dataframe[0].value["name"].tolist() == ["cut short", "laptop"]


def test_pruning_keeps_the_newest_once_confirmed(kept):
    at = compare()
    at.number_input(key="cmp_prune_keep").set_value(1).run()
    at.button(key="cmp_prune").click().run()
    assert names() == ["cut short", "server", "laptop"]
    at.button(key="cmp_confirm_yes").click().run()
    assert names() == ["cut short"]


def test_run_files_are_kept_in_the_store_and_exported_as_run_files(kept):
    at = compare()
    at.file_uploader(key="cmp_import").set_value([("desk.json", run_bytes("Desk CPU", 2.0), "application/json")])
    at.run()
    at.button(key="cmp_import_keep").click().run()
    assert errors(at) == [] and names()[0] == "desk.json"
    at.selectbox(key="cmp_pick").set_value(kept["laptop"]).run()
    exported = [b for b in at.get("download_button") if b.key == "cmp_export_json"]
    assert len(exported) == 1


def test_an_interrupted_run_offers_to_measure_what_it_lacks(kept):
    at = compare()
    at.selectbox(key="cmp_pick").set_value(kept["short"]).run()
    assert errors(at) == []
    assert [b.label for b in at.button if b.key == "cmp_resume"] == ["Measure the 3 missing points"]
    at.selectbox(key="cmp_pick").set_value(kept["laptop"]).run()
    assert [b for b in at.button if b.key == "cmp_resume"] == []


def test_a_damaged_store_is_said_and_uploads_still_work(kept):
    data = kept["path"].read_bytes()
    kept["path"].write_bytes(data[:100] + bytes(len(data) - 100))
    for side in ("-wal", "-shm"):
        kept["path"].with_name(kept["path"].name + side).unlink(missing_ok=True)
    at = compare()
    assert any("is damaged" in e or "lacks the tables" in e for e in errors(at))
    at.file_uploader(key="cmp_upload").set_value([("a.json", run_bytes("A CPU", 1.0), "application/json")]).run()
    assert len(charts(at)) == 2  # the overlay and the baseline; a ratio needs a second run


def test_measure_what_is_missing_queues_the_points_into_the_run_and_opens_the_benchmark_page(kept):
    from tests.dashboard.test_app import APP

    at = AppTest.from_file(APP, default_timeout=60).run()
    at.switch_page("pages/compare.py").run()
    at.selectbox(key="cmp_pick").set_value(kept["short"]).run()
    at.button(key="cmp_resume").click().run()
    job = at.session_state["bench"].job
    try:
        assert [t.value for t in at.title] == ["Benchmark"]
        assert job.run_id == kept["short"] and len(job.problems) == 3
        assert {(p.mechanism, p.n) for p in job.problems} == {("softmax", 512), ("linear", 256), ("linear", 512)}
    finally:
        job.cancel()
        job.wait(30)


def test_a_run_damaged_after_it_was_listed_is_said_when_opened(kept):
    import sqlite3

    at = compare()
    assert errors(at) == []  # listed, and the newest run opened for its export
    with sqlite3.connect(kept["path"]) as db:  # another hand spoils one run's configuration (history never reads it)
        db.execute("UPDATE runs SET config = '{not json' WHERE id = ?", (kept["laptop"],))
    db.close()
    at.selectbox(key="cmp_pick").set_value(kept["laptop"]).run()
    assert not at.exception, [e.value for e in at.exception]
    said = [e for e in errors(at) if e.startswith(f"Run #{kept['laptop']} cannot be opened")]
    assert len(said) == 1 and "is damaged" in said[0] and "delete it, or restore the file" in said[0]
    assert [b for b in at.get("download_button") if b.key == "cmp_export_json"] == []
    assert [b.key for b in at.button if b.key == "cmp_delete"] == ["cmp_delete"]  # it can still be deleted
    at.multiselect(key="cmp_open").set_value([kept["laptop"], kept["server"]]).run()
    assert not at.exception and sum("cannot be opened" in e for e in errors(at)) == 2  # opening it together too


@pytest.mark.parametrize("failure", [store.StoreBusyError("runs.sqlite3 is being written by another process"),
                                     store.StoreError("runs.sqlite3 is damaged (file is not a database)"),
                                     PermissionError(13, "Permission denied")])
def test_a_store_error_while_opening_a_run_is_a_sentence(kept, monkeypatch, failure):
    at = compare()

    def refuses(self, run_id):
        raise failure

    monkeypatch.setattr(store.Store, "run", refuses)
    at.selectbox(key="cmp_pick").set_value(kept["server"]).run()
    assert not at.exception, [e.value for e in at.exception]
    assert any(e.startswith(f"Run #{kept['server']} cannot be opened: ") and str(failure)[:20] in e
               for e in errors(at))
