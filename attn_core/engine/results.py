"""A run as data: one tidy row per measured point, saved and loaded as JSON or CSV with a versioned schema and the
stamp of the machine it ran on. Files are parsed as data only: no pickle, no eval."""
from __future__ import annotations

import contextlib
import csv
import io
import json
import math
import os
import stat
import threading
from dataclasses import dataclass, field
from typing import Any

import pandas as pd

from attn_core.engine.files import write_atomic
from . import positions
from attn_core.mechanisms.flex import IMPLEMENTATIONS
from .measurement import COLUMNS, KINDS, STATUSES
from ..mechanisms import MEASURED
from .problem import MAX_COUNT
from attn_core.engine.untrusted import clipped, csv_cell, csv_json, csv_text, printable, printable_data, quoted

SCHEMA_VERSION = 3
# version 1 lacks the contention and executed-FLOP columns, versions 1 and 2 the key/value heads and padding: they
# are filled in (every head its own key/value head, no padding: all an older build could measure)
READABLE_VERSIONS = (1, 2, 3)
FORMAT = "attention-lab-run"
STAMP = ("format", "schema_version", "env", "config")  # a CSV's last columns, the same on every line
MAX_FILE_BYTES = 32 * 1024 * 1024  # ~100k points; larger files are refused before parsing

ADDED_IN_2 = {"executed_flops": None, "foreign_cpu": None, "load_average": None, "disturbed": False, "retaken": 0}
ADDED_IN_3 = ("kv_heads", "padding")
# Columns added without a new file version: a file of any version may lack them (no positions, our own kernels'
# points, no one-time costs, no sinks, no first tokens kept).
OPTIONAL = {"positions": "none", "implementation": "ours", "compile_s": None, "mask_s": None, "sinks": False,
            "keep_first": 0}
TEXT, BOOL, INT, FLOAT = (KINDS[kind] for kind in ("text", "bool", "int", "float"))
# The most characters a loaded row's text keeps (longer is cut, ending "…"); params are JSON, so longer is refused.
TEXT_CHARS = {"label": 200, "reason": 500, "memory_method": 200}
NAME_CHARS = 100  # the other text columns: mechanism, dtype, device, mode, sdpa_backend (status is one of STATUSES)
PARAMS_CHARS = 1000


class RunFileError(ValueError):
    """A file that is not a readable Attention Lab run; the message says what is wrong and what to do."""


@dataclass
class Run:
    """A finished (or partial) sweep: the tidy frame, the environment stamp and the sweep's config as a dict."""

    frame: pd.DataFrame
    env: dict = field(default_factory=dict)
    config: dict = field(default_factory=dict)
    schema_version: int = SCHEMA_VERSION


def frame_from_rows(rows: list[dict]) -> pd.DataFrame:
    """The tidy DataFrame of rows, columns in schema order and dtypes fixed (an empty frame keeps its columns); a row
    without the columns schema 2 added gets ADDED_IN_2's values (contention unknown), one without those of schema 3
    its heads as key/value heads and no padding."""
    df = pd.DataFrame([{c: r.get(c, ADDED_IN_2.get(c, OPTIONAL.get(c))) for c in COLUMNS}
                       | {"kv_heads": r.get("kv_heads", r.get("heads")), "padding": r.get("padding", 0)}
                       | {c: value if r.get(c) in ('', None) else r.get(c) for c, value in OPTIONAL.items()}
                       for r in rows], columns=list(COLUMNS))
    return _typed(df)


def _typed(df: pd.DataFrame) -> pd.DataFrame:
    for c in TEXT:
        df[c] = df[c].map(lambda x: "" if x is None or (isinstance(x, float) and math.isnan(x)) else str(x))
    for c in BOOL:
        df[c] = df[c].map(_as_bool).astype(bool)
    for c in INT:
        df[c] = pd.to_numeric(df[c], errors="raise").astype("int64")
    for c in FLOAT:
        df[c] = pd.to_numeric(df[c], errors="raise").astype("float64")
    df["time_samples"] = df["time_samples"].map(lambda x: [float(t) for t in x] if x is not None else [])
    return df


def _as_bool(x: Any) -> bool:
    if isinstance(x, str):
        if x.strip().lower() not in ("true", "false", "1", "0"):
            raise ValueError(f"{x!r} is not true or false")
        return x.strip().lower() in ("true", "1")
    return bool(x)


def _jsonable(value: Any) -> Any:
    """NaN → None (JSON has no NaN); numpy scalars → Python numbers."""
    if isinstance(value, list):
        return [_jsonable(v) for v in value]
    if hasattr(value, "item") and not isinstance(value, (str, bytes)):
        value = value.item()
    if isinstance(value, float) and not math.isfinite(value):
        return None
    return value


def _records(frame: pd.DataFrame) -> list[dict]:
    return [{c: _jsonable(row[c]) for c in COLUMNS} for row in frame.to_dict("records")]


def to_json_bytes(run: Run) -> bytes:
    """The run as UTF-8 JSON: {format, schema_version, env, config, rows: [{column: value}]}; NaN is null."""
    doc = {"format": FORMAT, "schema_version": SCHEMA_VERSION, "env": run.env, "config": run.config,
           "rows": _records(run.frame)}
    return json.dumps(doc, indent=1, allow_nan=False, default=_jsonable).encode("utf-8")


def to_csv_bytes(run: Run) -> bytes:
    """The run as one clean CSV table (`pandas.read_csv` and a spreadsheet open it as is): a header, then one line per
    point; the run's stamp in the last columns of every line: STAMP = format, schema_version, env and config (JSON).
    params, time_samples, env and config cells hold JSON. No cell can run as a spreadsheet formula: text cells
    starting with =, +, -, @, tab or CR get a leading ' (`csv_cell`, taken off again by load_run), and those
    characters inside JSON strings are \\u escapes (`csv_json`). load_run also reads the older layout, whose stamp
    stood in four '# ' lines above the table."""
    stamp = [FORMAT, SCHEMA_VERSION, *(csv_json(json.dumps(part, allow_nan=False, default=_jsonable))
                                      for part in (run.env, run.config))]
    out = io.StringIO()
    writer = csv.writer(out, lineterminator="\r\n")  # RFC 4180's line end: a CR inside a cell is quoted too, so it
    writer.writerow([*COLUMNS, *STAMP])  # cannot end the row (and start the next with a formula) in a spreadsheet
    for rec in _records(run.frame):
        rec["time_samples"] = json.dumps(rec["time_samples"])
        writer.writerow(["" if rec[c] is None else csv_cell(rec[c]) for c in COLUMNS] + stamp)
    return out.getvalue().encode("utf-8")


def save_run(run: Run, path: str | os.PathLike) -> None:
    """Write a run as JSON (.json) or CSV (.csv), chosen by the file's extension; atomically (`write_atomic`): a
    save that fails leaves the file there before untouched."""
    suffix = os.path.splitext(os.fspath(path))[1].lower()
    if suffix not in (".json", ".csv"):
        raise ValueError(f"cannot save to {os.fspath(path)!r}: name the file .json or .csv")
    write_atomic(path, to_json_bytes(run) if suffix == ".json" else to_csv_bytes(run))  # whole, or the old file kept


def load_run(source: str | os.PathLike | bytes, name: str | None = None) -> Run:
    """Read a run saved by `save_run` (JSON or CSV, recognised by content) from a path or from bytes.

    Raises RunFileError with a sentence for a file too large, not a run, of an unknown schema version, or
    malformed. Only JSON and CSV parsers ever see the content.
    """
    if isinstance(source, (bytes, bytearray)):
        label = clipped(printable(name), 120) if name else "the file"
        if len(source) > MAX_FILE_BYTES:
            raise RunFileError(_too_large(label, len(source)))
        data = bytes(source)
    else:
        label = clipped(printable(name or os.path.basename(os.fspath(source))), 120)
        data = _read_capped(source, label)
    try:
        text = data.decode("utf-8-sig")
    except UnicodeDecodeError:
        raise RunFileError(f"{label} is not a text file; choose a .json or .csv file saved by Attention Lab") from None
    try:
        run = _parse_json(text, label) if text.lstrip().startswith("{") else _parse_csv(text, label)
    except RunFileError:
        raise
    except RecursionError:  # JSON nested thousands deep: json's parser recurses once per level
        raise RunFileError(f"{label} nests its data too deeply to be a run; choose a run file saved by Attention "
                           "Lab") from None
    except (ValueError, TypeError, KeyError, csv.Error) as e:
        raise RunFileError(f"{label} is malformed ({clipped(printable(e), 300)}); save the run again or choose "
                           "another file") from None
    # the stamp's and configuration's texts as the rows' (_text): a device named with ESC or \\ud800 is shown,
    # charted, tabled and kept as text
    return Run(run.frame, printable_data(run.env), printable_data(run.config), run.schema_version)


def _read_capped(path: str | os.PathLike, label: str) -> bytes:
    """At most MAX_FILE_BYTES of any file: a size on disk cannot be trusted (a device, a pipe or /dev/stdin says 0),
    so one byte more than the cap is read and its arrival refuses the file."""
    try:
        with _open_waiting(path, label) as f:
            size = os.fstat(f.fileno()).st_size
            if size > MAX_FILE_BYTES:  # a regular file: refused before reading, with its size
                raise RunFileError(_too_large(label, size))
            data = f.read(MAX_FILE_BYTES + 1)
    except OSError as e:
        raise RunFileError(f"{label}: cannot be read ({e.strerror or e}); check the path") from None
    if len(data) > MAX_FILE_BYTES:
        raise RunFileError(_too_large(label, None))
    return data


PIPE_WAIT_S = 10.0  # how long a named pipe may take to find a writer (`show <(cat run.json)` has one at once)


def _open_waiting(path: str | os.PathLike, label: str):
    """`path` opened to read. A named pipe with no program writing to it would block the open for ever: it is given
    PIPE_WAIT_S to find a writer, then refused with a sentence (the waiting open released by opening the pipe's other
    end, so no thread is left blocked)."""
    try:
        fifo = stat.S_ISFIFO(os.stat(path).st_mode)
    except OSError:
        fifo = False
    if not fifo:
        return open(path, "rb")
    opened: list = []
    opener = threading.Thread(target=lambda: opened.append(open(path, "rb")), daemon=True)
    opener.start()
    opener.join(PIPE_WAIT_S)
    if opener.is_alive():
        with contextlib.suppress(OSError):
            os.close(os.open(path, os.O_WRONLY | os.O_NONBLOCK))  # the waiting open returns; its file is dropped
        opener.join(1.0)
        for f in opened:
            f.close()
        raise RunFileError(f"{label} is a pipe that no program wrote to within {PIPE_WAIT_S:g} s; pipe a run file "
                           "into it, or name the file itself")
    if not opened:
        raise RunFileError(f"{label}: cannot be read; check the path")
    return opened[0]


def _too_large(label: str, size: int | None) -> str:
    what = f"is {size / 2**20:.1f} MiB, larger than" if size is not None else "holds more than"
    return (f"{label} {what} the {MAX_FILE_BYTES // 2**20} MiB a run file may be; choose a run file saved by "
            "Attention Lab")


def _check_header(fmt: Any, version: Any, label: str) -> None:
    if fmt != FORMAT:
        raise RunFileError(f"{label} is not an Attention Lab run (no '{FORMAT}' marker); choose a .json or .csv "
                           "file saved by Attention Lab")
    if not isinstance(version, int) or isinstance(version, bool):
        raise RunFileError(f"{label} has no valid schema version; save the run again")
    if version not in READABLE_VERSIONS:
        newer = "newer than" if version > SCHEMA_VERSION else "older than"
        raise RunFileError(f"{label} uses schema version {version}, {newer} the version {SCHEMA_VERSION} this "
                           "Attention Lab reads; open it with a matching version or measure again")


def _parse_json(text: str, label: str) -> Run:
    try:
        doc = json.loads(text, parse_constant=lambda c: float(c))  # NaN / Infinity written by other tools
    except json.JSONDecodeError as e:
        raise RunFileError(f"{label} is not valid JSON (line {e.lineno}: {e.msg}); choose a run file saved by "
                           "Attention Lab") from None
    if not isinstance(doc, dict):
        raise RunFileError(f"{label} is not an Attention Lab run (a JSON object is expected)")
    _check_header(doc.get("format"), doc.get("schema_version"), label)
    rows, env, config = doc.get("rows"), doc.get("env", {}), doc.get("config", {})
    if not isinstance(rows, list) or not all(isinstance(r, dict) for r in rows):
        raise RunFileError(f"{label} is malformed: 'rows' must be a list of objects")
    if not isinstance(env, dict) or not isinstance(config, dict):
        raise RunFileError(f"{label} is malformed: 'env' and 'config' must be objects")
    return Run(_validated(_upgraded(rows, doc["schema_version"]), label), env, config, SCHEMA_VERSION)


def _upgraded(rows: list[dict], version: int) -> list[dict]:
    """Rows of an older schema with the columns it lacks: contention unknown (NaN), executed FLOPs = useful FLOPs
    (version 1 counted only those); before version 3, one key/value head per query head and no padding."""
    if version < 2:
        rows = [{**ADDED_IN_2, **r, "executed_flops": r.get("theory_flops")} for r in rows]
    if version < 3:
        rows = [{**r, "kv_heads": r.get("heads"), "padding": 0} for r in rows]
    return [{**OPTIONAL, **r} for r in rows]


def _comment_json(line: str, key: str, label: str) -> dict:
    value = json.loads(line.split(":", 1)[1])
    if not isinstance(value, dict):
        raise RunFileError(f"{label} is malformed: the '# {key}:' line must hold a JSON object")
    return value


def _parse_csv(text: str, label: str) -> Run:
    if text.startswith("# "):
        return _parse_commented_csv(text, label)
    reader = csv.DictReader(io.StringIO(text, newline=""))
    if reader.fieldnames is None or not set(STAMP) <= set(reader.fieldnames):
        _check_header(None, None, label)
    rows = [dict(r) for r in reader]
    stamps = {tuple(r.pop(c, None) for c in STAMP) for r in rows}
    if len(stamps) > 1:
        raise RunFileError(f"{label} is malformed: its lines carry different stamps (format, schema_version, env, "
                           "config); save each run to its own file")
    fmt, version_text, env, config = stamps.pop() if stamps else (FORMAT, str(SCHEMA_VERSION), "{}", "{}")
    version = int(version_text) if isinstance(version_text, str) and version_text.isdigit() else None
    _check_header(fmt, version, label)
    parts = [json.loads(env or "{}"), json.loads(config or "{}")]
    if not all(isinstance(part, dict) for part in parts):
        raise RunFileError(f"{label} is malformed: the env and config cells must hold JSON objects")
    return Run(_validated(_csv_rows(rows, reader.fieldnames, version, label), label), *parts, SCHEMA_VERSION)


def _parse_commented_csv(text: str, label: str) -> Run:
    """The older layout: '# attention-lab-run', '# schema_version: N', '# env: {json}', '# config: {json}', then
    the table."""
    lines = text.splitlines(keepends=True)  # kept: a quoted line break inside a cell reaches the reader as written
    if not lines or lines[0].strip() != f"# {FORMAT}":
        _check_header(None, None, label)
    meta, body_start = {}, 1
    while body_start < len(lines) and lines[body_start].startswith("# "):
        key = lines[body_start][2:].split(":", 1)[0].strip()
        meta[key] = lines[body_start]
        body_start += 1
    version_text = meta.get("schema_version", "").split(":", 1)[-1].strip()
    version = int(version_text) if version_text.isdigit() else None
    _check_header(FORMAT, version, label)
    env = _comment_json(meta["env"], "env", label) if "env" in meta else {}
    config = _comment_json(meta["config"], "config", label) if "config" in meta else {}
    reader = csv.DictReader(io.StringIO("".join(lines[body_start:]), newline=""))
    rows = [dict(r) for r in reader]
    return Run(_validated(_csv_rows(rows, reader.fieldnames, version, label), label), env, config, SCHEMA_VERSION)


def _csv_rows(rows: list[dict], names: Any, version: int, label: str) -> list[dict]:
    """A CSV table's rows as typed cells, upgraded from schema `version`."""
    rows = _upgraded(rows, version)
    if names is None:
        raise RunFileError(f"{label} is malformed: the header line of the table is missing")
    _check_columns([*names, *(ADDED_IN_2 if version == 1 else ()), *(ADDED_IN_3 if version < 3 else ())], label)
    for r in rows:
        if None in r:
            raise RunFileError(f"{label} is malformed: a line has more cells than the header")
        r["time_samples"] = json.loads(r["time_samples"] or "[]")
        for c in TEXT:  # the ' that to_csv_bytes put before a formula-like text
            r[c] = csv_text(r[c]) if isinstance(r[c], str) else r[c]
        for c in FLOAT:
            r[c] = r[c] if r[c] not in ("", None) else None
    return rows


def _check_columns(names: Any, label: str) -> None:
    missing = [c for c in COLUMNS if c not in names and c not in OPTIONAL]
    if missing:
        raise RunFileError(f"{label} is malformed: columns {', '.join(missing)} are missing; save the run again")


def _validated(rows: list[dict], label: str) -> pd.DataFrame:
    """The rows as a frame once every cell holds what its column allows; RunFileError naming the row (1 = the first
    point), the column, the value and what is allowed otherwise."""
    clean = []
    for i, r in enumerate(rows, 1):
        _check_columns(r, label)
        r = {**OPTIONAL, **{c: v for c, v in r.items() if not (c in OPTIONAL and v in ("", None))}}
        if r["implementation"] not in IMPLEMENTATIONS:
            raise RunFileError(f"{label} is malformed: row {i}, implementation {_shown(r['implementation'])} is not "
                               f"one of {', '.join(IMPLEMENTATIONS)}")
        if r["status"] not in STATUSES:
            raise RunFileError(f"{label} is malformed: row {i}, status {_shown(r['status'])} is not one of {', '.join(STATUSES)}")
        cells = dict(r)
        for column in (*BOOL, *INT, *FLOAT, "time_samples", "params"):
            try:
                cells[column] = _cell(column, r[column])
            except ValueError as e:
                raise RunFileError(f"{label} is malformed: row {i}, {column} = {_shown(r[column])} is not allowed; "
                                   f"{column} must be {e}") from None
        if cells["heads"] % cells["kv_heads"] or cells["padding"] >= cells["n"]:
            raise RunFileError(f"{label} is malformed: row {i} has kv_heads = {cells['kv_heads']} for "
                               f"{cells['heads']} heads and padding = {cells['padding']} at n = {cells['n']}; "
                               "key/value heads must divide the heads, and padding be less than n")
        if positions.field_problem(r["positions"] or "none"):
            raise RunFileError(f"{label} is malformed: row {i}, positions = {_shown(r['positions'])} is not allowed; "
                               f"positions must be {', '.join(positions.POSITIONS)}, or empty for none")
        if why := _params_problem(r["mechanism"], cells["params"]):
            raise RunFileError(f"{label} is malformed: row {i}, params of {r['mechanism']}: {why}")
        clean.append({**cells, **{column: _text(column, r[column]) for column in TEXT if column != "params"}})
    return frame_from_rows(clean)


def _cell(column: str, value: Any) -> Any:
    """A cell of a run file as its column's type; ValueError with what the column allows."""
    if column in BOOL:
        if isinstance(value, bool):
            return value
        if isinstance(value, str) and value.strip().lower() in ("true", "false"):
            return value.strip().lower() == "true"
        raise ValueError("true or false")
    if column in INT:
        low = 1 if column not in ("repeats", "retaken", "padding", "keep_first") else 0
        number = _number(value)
        if isinstance(number, float) and number.is_integer():
            number = int(number)  # 256.0, as other tools write whole numbers
        if not isinstance(number, int) or not low <= number < MAX_COUNT:
            raise ValueError(f"a whole number from {low} to below 2**40")
        return number
    if column in FLOAT:
        return _measure(value, "a finite number ≥ 0, or empty (null) where it was not measured")
    if column == "time_samples":
        if not isinstance(value, list):
            raise ValueError("a list of seconds, each a finite number ≥ 0")
        return [_measure(t, "a list of seconds, each a finite number ≥ 0", empty=False) for t in value]
    try:  # params: JSON text of an object
        params = json.loads(value or "{}") if isinstance(value, str) else None
    except json.JSONDecodeError:
        params = None
    if not isinstance(params, dict) or len(value) > PARAMS_CHARS:
        raise ValueError(f'JSON text of an object of at most {PARAMS_CHARS:,} characters, e.g. {{"window": 64}}')
    return value


def _text(column: str, value: Any) -> str:
    """A text cell as text ('' for null or NaN) of at most its column's characters (TEXT_CHARS, NAME_CHARS), its
    control characters but tab and line ends written as escapes (`printable`): a label holding ESC or a lone
    surrogate (which JSON's \\ud800 brings) would reach terminals, charts, tables and the store, and no UTF-8 holds
    the latter."""
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return ""
    return clipped(printable(value, keep="\t\n\r"), TEXT_CHARS.get(column, NAME_CHARS))


def _params_problem(mechanism: Any, text: str) -> str | None:
    """Why a row's params (JSON text of an object) cannot be its mechanism's: a name it has not, a value out of its
    range or of the wrong kind (spec.check_params); None when they can, or the mechanism is not in the catalogue
    (a user's own mechanism: its params are kept as they are)."""
    spec = MEASURED.get(mechanism) if isinstance(mechanism, str) else None
    if spec is None:
        return None
    try:
        spec.check_params(json.loads(text or "{}"))
    except ValueError as e:
        return str(e)
    return None


def _measure(value: Any, allowed: str, empty: bool = True) -> float:
    """A measured quantity: finite and ≥ 0, or NaN where `empty` allows it (null, '', NaN)."""
    if empty and (value is None or value == ""):
        return math.nan
    number = _number(value)
    if number is None:
        raise ValueError(allowed)
    try:
        number = float(number)
    except OverflowError:  # an integer beyond float range
        raise ValueError(allowed) from None
    if math.isnan(number) and empty:
        return number
    if not math.isfinite(number) or number < 0:
        raise ValueError(allowed)
    return number


def _number(value: Any) -> int | float | None:
    """An int or float from a JSON number or CSV text; None for anything else (booleans included)."""
    if isinstance(value, bool):
        return None
    if isinstance(value, (int, float)):
        return value
    if isinstance(value, str):
        for kind in (int, float):
            try:
                return kind(value.strip())
            except ValueError:
                pass
    return None


def _shown(value: Any) -> str:
    """A cell's value as written, cut to 40 characters."""
    return quoted(value, 40)
