"""Runs saved and loaded as JSON and CSV: exact round trips, and a clear error for every kind of bad file."""
from __future__ import annotations

import csv
import io
import json
import math

import pandas as pd
import pytest

from attn_core.engine import results
from attn_core.engine.results import COLUMNS, Run, RunFileError, frame_from_rows, load_run, save_run, to_csv_bytes, \
    to_json_bytes

NAN = float("nan")


def row(**kw) -> dict:
    base = {"mechanism": "softmax", "label": "Softmax, \"materialized\"", "exact": True, "params": "{}", "n": 256,
            "batch": 1, "heads": 8, "d_model": 512, "head_dim": 64, "dtype": "float32", "device": "cpu",
            "mode": "forward", "causal": False, "status": "ok", "reason": "", "time_median_s": 0.0123,
            "time_iqr_s": 0.0004, "time_samples": [0.012, 0.0123, 0.0125], "repeats": 3, "peak_bytes": 4194304.0,
            "memory_method": "torch.profiler (CPU allocator)", "predicted_bytes": 4194304.0,
            "theory_flops": 1.1e9, "gflops": 89.4, "device_gflops": 140.0, "pct_of_device": 63.9,
            "sdpa_backend": "", "threads": 2.0, "executed_flops": 1.2e9, "foreign_cpu": 0.02, "load_average": 0.4,
            "disturbed": False, "retaken": 0}
    return {**base, **kw}


def sample_run() -> Run:
    rows = [row(), row(mechanism="sliding_window", label="Sliding window", exact=True, params='{"window": 64}',
                       causal=True, sdpa_backend=""),
            row(mechanism="sdpa", n=8192, status="skipped", reason="would need 34.0 GiB, 18.2 GiB free",
                time_median_s=NAN, time_iqr_s=NAN, time_samples=[], repeats=0, peak_bytes=NAN, gflops=NAN,
                device_gflops=NAN, pct_of_device=NAN, memory_method="", threads=NAN),
            row(status="failed", reason="RuntimeError: a, \"quoted\"\nsecond line", time_median_s=NAN,
                time_samples=[], repeats=0)]
    env = {"torch": "2.13.0", "device_name": "AMD EPYC", "threads": 2, "timestamp": "2026-01-01T00:00:00+00:00"}
    return Run(frame_from_rows(rows), env, {"ns": [256, 8192], "mechanisms": [["softmax", {}]]})


@pytest.mark.parametrize("suffix", [".json", ".csv"])
def test_round_trip_is_exact(tmp_path, suffix):
    run = sample_run()
    path = tmp_path / f"run{suffix}"
    save_run(run, path)
    back = load_run(path)
    pd.testing.assert_frame_equal(back.frame, run.frame)
    assert back.env == run.env and back.config == run.config and back.schema_version == results.SCHEMA_VERSION
    again = load_run(path.read_bytes(), name=path.name)  # an upload arrives as bytes
    pd.testing.assert_frame_equal(again.frame, run.frame)


def test_frame_has_the_schema_columns_and_types_even_when_empty():
    empty = frame_from_rows([])
    assert list(empty.columns) == list(COLUMNS) and len(empty) == 0
    back = load_run(to_csv_bytes(Run(empty)))
    assert list(back.frame.columns) == list(COLUMNS) and len(back.frame) == 0
    df = sample_run().frame
    assert df["n"].dtype == "int64" and df["exact"].dtype == bool and df["peak_bytes"].dtype == "float64"


def test_json_has_no_nan_and_csv_starts_with_the_stamp():
    doc = json.loads(to_json_bytes(sample_run()))
    assert doc["format"] == "attention-lab-run" and doc["schema_version"] == 3
    assert doc["rows"][2]["time_median_s"] is None

def test_the_csv_opens_as_a_clean_table_with_its_stamp_in_columns(tmp_path):
    """What a user takes to a spreadsheet: pandas.read_csv(path) reads it as is, one line per point, the stamp in
    the last columns."""
    run = sample_run()
    save_run(run, tmp_path / "run.csv")
    table = pd.read_csv(tmp_path / "run.csv")
    assert list(table.columns) == [*COLUMNS, "format", "schema_version", "env", "config"]
    assert len(table) == 4 and table["n"].tolist() == [256, 256, 8192, 256]
    assert set(table["format"]) == {"attention-lab-run"} and set(table["schema_version"]) == {3}
    assert {json.loads(cell)["device_name"] for cell in table["env"]} == {"AMD EPYC"}
    assert json.loads(table["config"][0]) == {"ns": [256, 8192], "mechanisms": [["softmax", {}]]}


def test_a_csv_whose_lines_carry_different_stamps_is_refused():
    lines = to_csv_bytes(sample_run()).decode().splitlines()
    lines[2] = lines[2].replace('""torch"": ""2.13.0""', '""torch"": ""2.14.0""')
    with pytest.raises(RunFileError, match="different stamps"):
        load_run("\n".join(lines).encode(), name="mixed.csv")


def test_save_refuses_an_unknown_extension(tmp_path):
    with pytest.raises(ValueError, match=".json or .csv"):
        save_run(sample_run(), tmp_path / "run.pkl")


@pytest.mark.parametrize("data, match", [
    (b"{not json", "not valid JSON"),
    (b'{"rows": []}', "not an Attention Lab run"),
    (b"[1, 2, 3]", "not an Attention Lab run"),
    (b'{"format": "attention-lab-run", "schema_version": 99, "rows": []}', "schema version 99, newer"),
    (b'{"format": "attention-lab-run", "schema_version": "1", "rows": []}', "no valid schema version"),
    (b'{"format": "attention-lab-run", "schema_version": 1, "rows": {"a": 1}}', "malformed"),
    (b'{"format": "attention-lab-run", "schema_version": 1, "rows": [{"n": 1}]}', "columns .* are missing"),
    (b"mechanism,n\nsoftmax,256\n", "not an Attention Lab run"),
    (b"# attention-lab-run\n# schema_version: 0\nmechanism\n", "schema version 0, older"),
    (b"\x80\x04\x95pickle\x00\x00", "not a text file"),
    (b"", "not an Attention Lab run"),
])
def test_bad_files_raise_a_clear_error(data, match):
    with pytest.raises(RunFileError, match=match):
        load_run(data, name="upload.json")


def test_malformed_cells_are_reported_not_evaluated(tmp_path):
    good = to_csv_bytes(sample_run()).decode()
    evil = good.replace("[0.012, 0.0123, 0.0125]", "__import__('os').system('touch pwned')", 1)
    with pytest.raises(RunFileError, match="malformed"):
        load_run(evil.encode())
    bad_status = json.loads(to_json_bytes(sample_run()))
    bad_status["rows"][0]["status"] = "great"
    with pytest.raises(RunFileError, match="status 'great'"):
        load_run(json.dumps(bad_status).encode())
    bad_number = json.loads(to_json_bytes(sample_run()))
    bad_number["rows"][0]["n"] = "many"
    with pytest.raises(RunFileError, match="malformed"):
        load_run(json.dumps(bad_number).encode())
    assert not (tmp_path / "pwned").exists()


def test_oversized_files_are_refused_before_parsing(tmp_path, monkeypatch):
    monkeypatch.setattr(results, "MAX_FILE_BYTES", 1000)
    with pytest.raises(RunFileError, match="larger than"):
        load_run(b"{" + b" " * 2000 + b"}", name="big.json")
    path = tmp_path / "big.csv"
    path.write_bytes(b"#" * 5000)
    with pytest.raises(RunFileError, match="big.csv is 0.0 MiB, larger than"):
        load_run(path)


def test_missing_file_is_a_clear_error(tmp_path):
    with pytest.raises(RunFileError, match="cannot be read"):
        load_run(tmp_path / "nothing.json")


def test_nan_written_by_other_tools_still_loads():
    text = to_json_bytes(sample_run()).decode().replace('"time_median_s": null', '"time_median_s": NaN', 1)
    assert math.isnan(load_run(text.encode()).frame["time_median_s"].iloc[2])


def older_file(fmt: str, version: int, dropped) -> bytes:
    """sample_run() saved as a file of schema `version`, as JSON or CSV, without the columns `dropped`."""
    if fmt == "json":
        doc = json.loads(to_json_bytes(sample_run()))
        doc["schema_version"] = version
        doc["rows"] = [{k: v for k, v in r.items() if k not in dropped} for r in doc["rows"]]
        return json.dumps(doc).encode()
    return commented_csv(json.loads(to_json_bytes(sample_run())), version, dropped)


def commented_csv(doc: dict, version: int, dropped=()) -> bytes:
    """A run document in the CSV layout older builds wrote: four '# ' lines of stamp above the table."""
    out = io.StringIO()
    out.write(f"# attention-lab-run\n# schema_version: {version}\n")
    out.write(f"# env: {json.dumps(doc['env'])}\n# config: {json.dumps(doc['config'])}\n")
    names = [c for c in COLUMNS if c not in dropped]
    writer = csv.writer(out, lineterminator="\n")
    writer.writerow(names)
    for r in doc["rows"]:
        writer.writerow(["" if r[c] is None else json.dumps(r[c]) if isinstance(r[c], list) else r[c] for c in names])
    return out.getvalue().encode()


def test_a_csv_in_the_older_layout_still_loads_the_same():
    run = sample_run()
    back = load_run(commented_csv(json.loads(to_json_bytes(run)), 3), name="old.csv")
    assert back.env == run.env and back.config == run.config
    pd.testing.assert_frame_equal(back.frame, run.frame)


@pytest.mark.parametrize("fmt", ["json", "csv"])
def test_a_version_1_file_still_opens_with_the_new_columns_filled(fmt):
    """Runs saved before the contention columns existed: executed FLOPs = the useful ones, contention unknown."""
    back = load_run(older_file(fmt, 1, (*results.ADDED_IN_2, *results.ADDED_IN_3)), name=f"old.{fmt}")
    assert list(back.frame.columns) == list(COLUMNS)
    assert (back.frame["executed_flops"] == back.frame["theory_flops"]).all()
    assert back.frame["foreign_cpu"].isna().all() and not back.frame["disturbed"].any()
    assert (back.frame["retaken"] == 0).all()
    assert (back.frame["kv_heads"] == back.frame["heads"]).all() and (back.frame["padding"] == 0).all()


@pytest.mark.parametrize("fmt", ["json", "csv"])
def test_a_version_2_file_opens_as_multi_head_attention_without_padding(fmt):
    """Runs saved before key/value heads and padding were columns measured one key/value head per query head and no
    padding: that is what they get."""
    back = load_run(older_file(fmt, 2, results.ADDED_IN_3), name=f"old.{fmt}")
    assert list(back.frame.columns) == list(COLUMNS)
    assert (back.frame["kv_heads"] == back.frame["heads"]).all() and (back.frame["padding"] == 0).all()


def test_a_row_whose_key_value_heads_do_not_divide_its_heads_is_refused():
    doc = json.loads(to_json_bytes(sample_run()))
    doc["rows"][0]["kv_heads"] = 3
    with pytest.raises(RunFileError, match=r"row 1 has kv_heads = 3 for 8 heads.*must divide the heads"):
        load_run(json.dumps(doc).encode(), name="bad.json")


def test_a_pipe_no_program_writes_to_is_refused_not_waited_on_for_ever(tmp_path, monkeypatch):
    """A named pipe with no writer blocks open() for ever; the loader gives it PIPE_WAIT_S and then says so."""
    import os
    import threading

    monkeypatch.setattr(results, "PIPE_WAIT_S", 0.3)
    fifo = tmp_path / "run.json"
    os.mkfifo(fifo)
    outcome: list = []
    reader = threading.Thread(target=lambda: outcome.append(_refusal(fifo)), daemon=True)
    reader.start()
    reader.join(60)  # a bound for a regression (a hang) to fail on, not a performance figure
    assert not reader.is_alive(), "load_run hung on a pipe with no writer"
    assert outcome and "pipe that no program wrote to" in outcome[0]


def test_a_pipe_with_a_writer_still_loads(tmp_path):
    import os
    import threading

    fifo = tmp_path / "run.json"
    os.mkfifo(fifo)
    save_run(sample_run(), tmp_path / "whole.json")
    writer = threading.Thread(target=lambda: fifo.write_bytes((tmp_path / "whole.json").read_bytes()), daemon=True)
    writer.start()
    loaded = load_run(fifo)
    writer.join(60)
    pd.testing.assert_frame_equal(loaded.frame, load_run(tmp_path / "whole.json").frame)


def _refusal(path) -> str:
    try:
        load_run(path)
    except RunFileError as e:
        return str(e)
    return "loaded"
