"""Hostile files and values: a run file read with a hard byte cap whatever its kind, every bad cell refused with a
sentence, flags and mechanism parameters refused before measuring, an --out that cannot lose a sweep."""
from __future__ import annotations

import csv
import io
import json
import os
import re
import shutil
import tempfile
import threading

import pytest

from attn_core import cli
from attn_core.engine import results
from attn_core.engine.results import Run, RunFileError, frame_from_rows, load_run, to_json_bytes
from attn_core.engine.problem import MAX_THREADS
from tests.fake_mechanisms import private_sweep_lock  # noqa: F401 (an autouse fixture)

INF, NAN = float("inf"), float("nan")
TINY = ["--heads", "2", "--d-model", "16", "--min-repeats", "2", "--min-time", "0", "--quiet"]


def run_main(*argv: str) -> tuple[int, str, str]:
    out, err = io.StringIO(), io.StringIO()
    code = cli.main(list(argv), out, err)
    return code, out.getvalue(), err.getvalue()


def point(n: int, **kw) -> dict:
    base = {"mechanism": "softmax", "label": "Softmax", "exact": True, "params": "{}", "n": n, "batch": 1,
            "heads": 2, "d_model": 16, "head_dim": 8, "dtype": "float32", "device": "cpu", "mode": "forward",
            "causal": False, "status": "ok", "reason": "", "time_median_s": 1e-4, "time_iqr_s": 1e-5,
            "time_samples": [1e-4, 1.1e-4], "repeats": 2, "peak_bytes": 4096.0,
            "memory_method": "torch.profiler (CPU allocator)", "predicted_bytes": 4096.0, "theory_flops": 1e6,
            "executed_flops": 1e6, "gflops": 10.0, "device_gflops": 100.0, "pct_of_device": 10.0,
            "sdpa_backend": "", "threads": 2.0, "foreign_cpu": 0.0, "load_average": 0.1, "disturbed": False,
            "retaken": 0}
    return {**base, **kw}


def valid_doc() -> dict:
    run = Run(frame_from_rows([point(16), point(32)]), {"torch": "2.x", "device": "cpu"}, {"ns": [16, 32]})
    return json.loads(to_json_bytes(run))


def csv_text(doc: dict) -> str:
    """The document as a run CSV, cells written as other tools would: str() of each value, lists as JSON."""
    out = io.StringIO()
    out.write(f"# attention-lab-run\n# schema_version: {doc['schema_version']}\n")
    out.write(f"# env: {json.dumps(doc['env'])}\n# config: {json.dumps(doc['config'])}\n")
    writer = csv.writer(out, lineterminator="\n")
    writer.writerow(results.COLUMNS)
    for r in doc["rows"]:
        writer.writerow(["" if r[c] is None else json.dumps(r[c]) if isinstance(r[c], list) else r[c]
                         for c in results.COLUMNS])
    return out.getvalue()


# ---- 1. any path is read with a hard byte cap ----

def test_show_dev_zero_is_refused_after_reading_the_cap():
    code, _, err = run_main("show", "/dev/zero")
    assert code == 2 and "/dev/zero holds more than the 32 MiB a run file may be" in err


def feed(path: str, data: bytes) -> threading.Thread:
    """Write `data` into the FIFO at `path` from a thread (the reader may close early: a broken pipe is fine)."""
    def write():
        try:
            with open(path, "wb") as f:
                f.write(data)
        except BrokenPipeError:
            pass
    thread = threading.Thread(target=write, daemon=True)
    thread.start()
    return thread


def test_a_pipe_is_read_up_to_the_cap(tmp_path, monkeypatch):
    fifo = str(tmp_path / "run.json")
    os.mkfifo(fifo)
    writer = feed(fifo, to_json_bytes(Run(frame_from_rows([point(16)]))))
    assert load_run(fifo).frame["n"].tolist() == [16]  # a small run through a pipe still loads
    writer.join(5)
    monkeypatch.setattr(results, "MAX_FILE_BYTES", 1000)
    writer = feed(fifo, b"{" + b" " * 200_000)  # more than a pipe holds: the writer blocks until we stop reading
    with pytest.raises(RunFileError, match="run.json holds more than the 0 MiB"):
        load_run(fifo)
    writer.join(5)
    assert not writer.is_alive()


def test_a_regular_file_over_the_cap_is_refused_with_its_size(tmp_path, monkeypatch):
    monkeypatch.setattr(results, "MAX_FILE_BYTES", 1000)
    (tmp_path / "big.json").write_bytes(b"{" + b" " * 3 * 2**20)
    code, _, err = run_main("show", str(tmp_path / "big.json"))
    assert code == 2 and "big.json is 3.0 MiB, larger than" in err


# ---- 4. every cell holds what its column allows ----

CELL_CASES = [  # (column of the second row, bad value, words the sentence must hold)
    ("n", 10**30, ["row 2", "n = ", "1000000000000000000000000000000", "whole number from 1 to below 2**40"]),
    ("n", 0, ["row 2", "n = ", "0", "from 1"]),
    ("n", -4, ["n = ", "-4", "from 1"]),
    ("n", True, ["n = ", "True", "whole number"]),
    ("n", 64.5, ["n = ", "64.5", "whole number"]),
    ("n", 2**62, ["n = ", str(2**62), "below 2**40"]),
    ("heads", "many", ["heads = ", "many", "whole number"]),
    ("repeats", -1, ["repeats = ", "-1", "from 0"]),
    ("time_median_s", INF, ["time_median_s = ", "inf", "finite number ≥ 0, or empty"]),
    ("time_median_s", -0.5, ["time_median_s = ", "-0.5", "finite number ≥ 0"]),
    ("peak_bytes", -1.0, ["peak_bytes = ", "-1.0", "finite number ≥ 0"]),
    ("time_samples", [1e-4, -2.0], ["time_samples = ", "-2.0", "each a finite number ≥ 0"]),
    ("time_samples", [NAN], ["time_samples = ", "nan", "each a finite number"]),
    ("exact", 1, ["exact = ", "1", "true or false"]),
    ("causal", "maybe", ["causal = ", "maybe", "true or false"]),
    ("params", "[1, 2]", ["params = ", "[1, 2]", "JSON text of an object"]),
]


@pytest.mark.parametrize("fmt", ["json", "csv"])
@pytest.mark.parametrize("column, value, words", CELL_CASES)
def test_a_bad_cell_is_refused_naming_row_column_value_and_what_is_allowed(tmp_path, fmt, column, value, words):
    doc = valid_doc()
    doc["rows"][1][column] = value
    path = tmp_path / f"run.{fmt}"
    path.write_text(json.dumps(doc) if fmt == "json" else csv_text(doc))
    code, _, err = run_main("show", str(path))
    assert code == 2 and err.startswith(f"error: {path} is malformed: row 2, {column} = ")
    for w in words:
        assert w in err


def test_the_valid_run_of_these_tests_loads_in_both_formats(tmp_path):
    """The baseline the table mutates: without the mutation it loads, so each refusal above is the mutation's."""
    for fmt, text in (("json", json.dumps(valid_doc())), ("csv", csv_text(valid_doc()))):
        (tmp_path / f"run.{fmt}").write_text(text)
        code, stdout, err = run_main("show", str(tmp_path / f"run.{fmt}"))
        assert code == 0 and "Softmax" in stdout, err
    doc = valid_doc()
    doc["rows"][1]["n"] = 64.0  # a whole number written as a float by another tool
    assert load_run(json.dumps(doc).encode()).frame["n"].tolist() == [16, 64]


DEEP = "[" * 50_000 + "]" * 50_000  # a CSV cell holds at most 131,072 characters; Python recurses 1,000 deep
NESTING_CASES = [  # (mutation of the valid run's JSON or CSV text, words)
    (lambda text: '{"a": ' * 100_000 + "1" + "}" * 100_000, ["nests its data too deeply"]),
    (lambda text: text.replace('"env": {', '"env": {"deep": ' + DEEP + ", ", 1), ["nests its data too deeply"]),
    (lambda text: text.replace('"params": "{}"', f'"params": "{DEEP}"', 1), ["nests its data too deeply"]),
    (lambda text: csv_text(valid_doc()).replace("[0.0001, 0.00011]", DEEP, 1), ["nests its data too deeply"]),
]


@pytest.mark.parametrize("mutation, words", NESTING_CASES)
def test_data_nested_too_deeply_is_refused_not_a_recursion_error(tmp_path, mutation, words):
    text = mutation(json.dumps(valid_doc()))
    assert len(text) > 100_000  # the mutation applied
    path = tmp_path / "deep.json"
    path.write_text(text)
    code, _, err = run_main("show", str(path))
    assert code == 2
    for w in words:
        assert w in err


# ---- 5. flags and mechanism parameters ----

BASE = ["sweep", "--mechanisms", "softmax", "--n", "16", *TINY]
FLAG_CASES = [  # (flags added to a valid sweep, words the message must hold)
    (["--mechanisms", "sliding_window:window=1e3"], ["window = 1000.0", "an integer between 1 and", "window=1000"]),
    (["--mechanisms", "sliding_window:window=256.0"], ["window = 256.0", "window=256"]),
    (["--mechanisms", "sliding_window:window=inf"], ["Sliding window", "window = inf", "between 1 and 1048576"]),
    (["--mechanisms", "sliding_window:window=nan"], ["window = nan", "between 1 and 1048576"]),
    (["--mechanisms", "sliding_window:window=2.5"], ["window = 2.5", "integer"]),
    (["--memory-limit", "1e400"], ["--memory-limit", "'1e400'", "size from 1 B to 1 EiB"]),
    (["--memory-limit", "1.2.3"], ["--memory-limit", "'1.2.3'", "512MiB"]),
    (["--memory-limit", "0"], ["--memory-limit", "'0'", "from 1 B"]),
    (["--threads", "10000"], ["threads", "10000", f"from 1 to {MAX_THREADS}"]),
    (["--threads", "0"], ["threads", "got 0", f"from 1 to {MAX_THREADS}"]),
    (["--seed", str(2**70)], ["seed", str(2**70), "from 0 to 2**63 - 1"]),
    (["--seed", "-1"], ["seed", "-1", "from 0 to 2**63 - 1"]),
    (["--min-time", "inf"], ["min_time_s", "inf", "0 or more seconds"]),
    (["--point-budget", "nan"], ["point_budget_s", "nan", "positive number of seconds"]),
    (["--memory-margin", "nan"], ["memory_margin", "nan", "between 0 and 10"]),
    (["--wait", "inf"], ["--wait", "inf", "finite number, 0 or more"]),
    (["--n", str(2**40)], ["sequence lengths", str(2**40), "below 2**40"]),
    (["--batch", str(2**40)], ["batch", str(2**40), "below 2**40"]),
]


@pytest.mark.parametrize("flags, words", FLAG_CASES)
def test_a_bad_flag_or_parameter_exits_2_naming_it_the_value_and_the_range(flags, words):
    code, _, err = run_main(*BASE, *flags)
    assert code == 2 and "points in" not in err  # refused before measuring
    for w in words:
        assert w in err


def test_the_cli_sweep_of_these_tests_is_valid(tmp_path):
    """The baseline the table adds flags to passes every check, so each refusal above is the flag's."""
    args = cli.build_parser().parse_args(BASE)
    assert cli.config_from_args(args).problems() == [] and cli.out_problem(str(tmp_path / "run.json")) is None


# ---- 2. --out checked before measuring; a failed save falls back ----

OUT_CASES = [  # (make the --out path in tmp_path, words)
    (lambda tmp: str(tmp / "missing" / "run.json"), ["folder", "missing", "does not exist"]),
    (lambda tmp: (tmp / "file.txt").write_text("x") and str(tmp / "file.txt" / "run.json"),
     ["file.txt", "is a file, not a folder"]),
    (lambda tmp: (tmp / "dir.json").mkdir() or str(tmp / "dir.json"), ["dir.json", "is a folder", "name a file"]),
    (lambda tmp: os.mkfifo(tmp / "pipe.json") or str(tmp / "pipe.json"), ["pipe.json", "cannot be written"]),
]


@pytest.mark.parametrize("make, words", OUT_CASES)
def test_a_bad_out_is_refused_before_measuring(tmp_path, make, words):
    path = make(tmp_path)
    code, _, err = run_main(*BASE, "--out", path)
    assert code == 2 and err.startswith(f"error: --out {path!r}") and "points in" not in err
    for w in words:
        assert w in err


NOBODY = 65534  # the unprivileged user and group of Linux distributions


def run_main_without_root(*argv: str) -> tuple[int, str, str]:
    """run_main in a forked child that has given up root's rights for good (uid and gid 65534, no other groups) when
    this process has them: root writes into any folder, and the tests run as root here and in CI. The child runs
    what this process has imported (it may not read root's home, where Python lives) and never returns to pytest."""
    if os.geteuid() != 0:
        return run_main(*argv)
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:
        try:
            os.close(read)
            os.setgroups([])
            os.setgid(NOBODY)
            os.setuid(NOBODY)
            reply = run_main(*argv) if os.geteuid() == NOBODY else (-1, "", "root's rights were not given up")
        except BaseException as e:  # noqa: BLE001 - said to the parent, which fails the test with it
            reply = (-1, "", f"the child failed: {type(e).__name__}: {e}")
        finally:
            try:
                with os.fdopen(write, "w") as pipe:
                    json.dump(reply, pipe)
            finally:
                os._exit(0)
    os.close(write)
    with os.fdopen(read) as pipe:
        reply = json.load(pipe)
    os.waitpid(pid, 0)
    return tuple(reply)


def test_an_out_in_a_read_only_folder_of_ones_own_is_refused_before_measuring():
    """A folder its owner made read-only (0500), checked by a user without root's rights: a child that dropped
    them, the folder given to that user, in a folder it may pass through (pytest's own are root's, 0700)."""
    base = tempfile.mkdtemp(prefix="attn-lab-locked-")
    try:
        os.chmod(base, 0o711)
        folder = os.path.join(base, "locked")
        os.mkdir(folder, 0o500)
        if os.geteuid() == 0:
            os.chown(folder, NOBODY, NOBODY)
        path = os.path.join(folder, "run.json")
        code, _, err = run_main_without_root(*BASE, "--out", path)
        assert code == 2 and err.startswith(f"error: --out {path!r}") and "points in" not in err, err
        assert "cannot be written" in err and "Permission denied" in err
        assert not os.path.exists(path)
    finally:
        shutil.rmtree(base)


def test_probing_out_changes_no_file(tmp_path):
    kept = tmp_path / "kept.json"
    kept.write_text("earlier run")
    assert cli.out_problem(str(kept)) is None and kept.read_text() == "earlier run"
    assert cli.out_problem(str(tmp_path / "new.csv")) is None and not (tmp_path / "new.csv").exists()


@pytest.mark.skipif(not os.path.exists("/proc/self/fd"), reason="finds the written file through /proc")
def test_a_save_that_fails_after_measuring_falls_back_to_the_temp_folder(tmp_path, monkeypatch):
    from tests.engine.test_files import fail_midway

    out = tmp_path / "run.json"
    out.write_text("earlier run")
    fail_midway(monkeypatch, tmp_path)  # the probe passes; every write into tmp_path then finds the disk full
    code, stdout, err = run_main(*BASE, "--out", str(out))
    monkeypatch.undo()
    assert code == cli.EXIT_UNSAVED == 4 and "Softmax" in stdout
    assert out.read_text() == "earlier run" and os.listdir(tmp_path) == ["run.json"]
    found = re.search(r"could not be saved to \S+ \(No space left on device\); it was saved to (\S+) instead", err)
    assert found, err
    try:
        assert load_run(found.group(1)).frame["status"].tolist() == ["ok"]
        assert os.stat(found.group(1)).st_mode & 0o077 == 0  # the fallback is the user's alone
    finally:
        os.unlink(found.group(1))


# ---- 6. summaries say each thing once ----

def test_the_memory_line_lists_real_methods_and_counts_points_not_measured():
    budget = "not measured: the point's time budget was spent on timing"
    frame = frame_from_rows([point(16), point(32, peak_bytes=NAN, memory_method=budget),
                             point(64, status="skipped", reason="would need 9 GiB", memory_method="")])
    lines = cli.format_summary(frame).splitlines()
    assert "memory: torch.profiler (CPU allocator)" in lines
    assert "memory not measured at 1 of 2 measured points (the point's time budget was spent on timing)" in lines
    assert "  softmax n=64: skipped: would need 9 GiB" in lines
    assert not any("torch.profiler" in line and "not measured" in line for line in lines)


def test_a_save_that_works_says_where(tmp_path):
    err = io.StringIO()
    run = Run(frame_from_rows([point(16)]))
    assert cli.save_or_fall_back(run, str(tmp_path / "run.csv"), err)
    assert err.getvalue() == f"saved to {tmp_path / 'run.csv'}\n" and len(load_run(tmp_path / "run.csv").frame) == 1



# ---- round two, 5. a row's params are its mechanism's ----

def windowed(params: str, mechanism: str = "sliding_window") -> bytes:
    """The valid run with its second row a sliding window (or `mechanism`) holding `params`."""
    doc = valid_doc()
    doc["rows"][1].update(mechanism=mechanism, label="Sliding window", params=params)
    return json.dumps(doc).encode()


PARAMS_CASES = [  # (params of row 2, words the sentence must hold)
    ('{"window": "xxxx"}', ["window = 'xxxx' is not allowed", "choose an integer between 1 and 1048576"]),
    ('{"window": 64.5}', ["window = 64.5 is not allowed", "an integer"]),
    ('{"window": 0}', ["window = 0 is not allowed", "between 1 and"]),
    ('{"window": null}', ["window = None is not allowed", "an integer"]),
    ('{"window": 64, "colour": 1}', ["Sliding window has no parameter colour; its parameters are window"]),
]


@pytest.mark.parametrize("params, words", PARAMS_CASES)
def test_params_a_mechanism_does_not_take_are_refused_when_loading(params, words):
    """Before, {"window": "xxxx"} loaded and the Benchmark page's replay (replay_panel: load_run, then st.error for a
    RunFileError) showed a traceback; the sentence is now the RunFileError the page shows."""
    with pytest.raises(RunFileError) as refused:
        load_run(windowed(params), name="run.json")
    message = str(refused.value)
    assert message.startswith("run.json is malformed: row 2, params of sliding_window: ")
    for w in words:
        assert w in message


def test_params_that_fit_and_params_of_a_mechanism_not_in_the_catalogue_load():
    assert load_run(windowed('{"window": 64}')).frame["params"].tolist() == ["{}", '{"window": 64}']
    mine = load_run(windowed('{"anything": "goes"}', mechanism="my_own")).frame
    assert mine["params"].tolist()[1] == '{"anything": "goes"}'


# ---- round two, 8. a loaded row's text has a length limit ----

def test_long_text_in_a_loaded_row_is_clipped_and_long_params_are_refused():
    """Before, a 100,000-character label made the SVG export take 72 s and the PNG 106 MB."""
    doc = valid_doc()
    doc["rows"][1].update(label="L" * 100_000, reason="R" * 100_000, memory_method="M" * 100_000,
                          device="D" * 100_000, sdpa_backend="S" * 100_000)
    for fmt, data in (("json", json.dumps(doc)), ("csv", csv_text(doc))):
        row = load_run(data.encode(), name=f"run.{fmt}").frame.iloc[1]
        assert row["label"] == "L" * 199 + "…" and row["reason"] == "R" * 499 + "…"
        assert row["memory_method"] == "M" * 199 + "…"
        assert row["device"] == "D" * 99 + "…" and row["sdpa_backend"] == "S" * 99 + "…"
    assert load_run(json.dumps(valid_doc()).encode()).frame["label"].tolist() == ["Softmax", "Softmax"]  # as written
    params = json.dumps({"p": "x" * 2000})
    with pytest.raises(RunFileError, match=r"row 2, params = .* must be JSON text of an object of at most 1,000 "):
        load_run(windowed(params, mechanism="my_own"))
