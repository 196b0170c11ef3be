"""The local run store: every sweep kept as it is measured, in one SQLite file (Python's sqlite3, WAL mode). A run is
one row (id, created, environment stamp, config, status, name, note; the host and process that measure it); a point
is one row of the saved row schema (engine.measurement.SCHEMA, written by Measurement.to_row), so a stored run reads
back through results.frame_from_rows and leaves as the usual run file through results.save_run."""
from __future__ import annotations

import datetime
import json
import math
import os
import socket
from typing import Any, Iterable, Mapping

import pandas as pd

from attn_core.engine.measurement import COLUMNS
from attn_core.engine import results
from attn_core.engine.results import (OPTIONAL, SCHEMA_VERSION as ROW_SCHEMA, Run, frame_from_rows, to_csv_bytes, to_json_bytes)
from attn_core.engine.untrusted import printable
# the file, its schema and its errors (store_file), and resuming a run (store_resume): callers import them from here
from attn_core.engine.store_file import (BUSY_S, FILE_NAME, HOME_VARIABLE, MIGRATIONS, SCHEMA_VERSION, StoreBusyError,
                                         StoreError, StoreFile, default_path, process_alive)
from attn_core.engine.store_file import _LATER  # noqa: F401  (the tests read the migrations' columns here)
from attn_core.engine.store_resume import HAD, Resume, resumable, resume_plan

__all__ = ["BUSY_S", "FILE_NAME", "HAD", "HOME_VARIABLE", "MACHINE_CHARS", "MIGRATIONS", "NAME_CHARS", "NOTE_CHARS",
           "Resume", "SCHEMA_VERSION", "STATUSES", "Store", "StoreBusyError", "StoreError", "default_path",
           "export_bytes", "process_alive", "resumable", "resume_plan"]

STATUSES = ("running", "complete", "interrupted", "failed")
NAME_CHARS, NOTE_CHARS = 200, 2000  # the longest run name and note kept (longer is cut)
MACHINE_CHARS = 200  # the longest machine name history shows
_NAMES = ", ".join(f'"{c}"' for c in COLUMNS)  # the row schema's columns, quoted for SQL


def _now() -> str:
    return datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")


class Store(StoreFile):
    """One open store. `Store(path)` opens (or creates) it for writing, migrating an older schema; `readonly=True`
    only reads (a missing store reads as empty, and nothing is created). Each write is its own transaction,
    committed before the call returns. A second writer waits BUSY_S, then StoreBusyError. Use it in one thread."""

    # -- writing a run as it is measured --
    def begin(self, env: Mapping, config: Mapping, *, name: str = "", status: str = "running") -> int:
        """A new run, 'running' by this process of this host; its id."""
        with self._errors(), self._transaction():
            cursor = self._db.execute(
                "INSERT INTO runs (created, name, status, env, config, host, pid, row_schema) VALUES (?,?,?,?,?,?,?,?)",
                (_now(), name, status, _json(env), _json(config), socket.gethostname(), os.getpid(), ROW_SCHEMA))
        return cursor.lastrowid

    def add_points(self, run_id: int, rows: Iterable[Mapping]) -> None:
        """Rows of the saved schema (Measurement.to_row) appended to a run, committed together (a row without a
        column added later, results.OPTIONAL, gets its default)."""
        run_id = self._known(run_id)
        with self._errors(), self._transaction():
            self._insert_points(run_id, rows)

    def _insert_points(self, run_id: int, rows: Iterable[Mapping]) -> None:
        """Append rows to a run, inside the caller's transaction."""
        rows = [{**OPTIONAL, **row} for row in rows]
        marks = ", ".join("?" * (len(COLUMNS) + 2))
        seq = self._db.execute("SELECT COALESCE(MAX(seq), 0) FROM points WHERE run_id = ?", (run_id,)).fetchone()[0]
        self._db.executemany(f"INSERT INTO points (run_id, seq, {_NAMES}) VALUES ({marks})",
                             [(run_id, seq + i, *(_cell(row[c] if c in row else OPTIONAL[c]) for c in COLUMNS))
                              for i, row in enumerate(rows, 1)])

    def resume(self, run_id: int) -> None:
        """Mark a run 'running' again, by this process (its missing points are being measured)."""
        self._update(run_id, status="running", host=socket.gethostname(), pid=os.getpid())

    def finish(self, run_id: int, status: str, env: Mapping | None = None, config: Mapping | None = None) -> None:
        if status not in STATUSES:
            raise ValueError(f"status {status!r} is not one of {', '.join(STATUSES)}")
        self._update(run_id, status=status, **({"env": _json(env)} if env else {}),
                     **({"config": _json(config)} if config else {}))

    def rename(self, run_id: int, name: str) -> None:
        self._update(run_id, name=printable(str(name))[:NAME_CHARS])

    def set_note(self, run_id: int, note: str) -> None:
        self._update(run_id, note=printable(str(note), keep="\n")[:NOTE_CHARS])

    def _update(self, run_id: int, **values: Any) -> None:
        number = self._known(run_id)
        with self._errors(), self._transaction():
            found = self._db.execute(f"UPDATE runs SET {', '.join(f'{k} = ?' for k in values)} WHERE id = ?",
                                     (*values.values(), number)).rowcount
        if not found:
            raise self._missing(run_id)

    def delete(self, run_ids: Iterable[int]) -> int:
        """Delete runs and their points; how many runs went."""
        ids = [(self._known(i),) for i in run_ids]
        with self._errors(), self._transaction():
            self._db.executemany("DELETE FROM points WHERE run_id = ?", ids)
            gone = sum(self._db.execute("DELETE FROM runs WHERE id = ?", i).rowcount for i in ids)
        self._shrink()
        return gone

    def prune(self, *, keep: int | None = None, older_than_days: float | None = None) -> int:
        """Delete all but the `keep` newest runs, and/or those created more than `older_than_days` ago (a run being
        measured now is kept); the file shrinks by what they held. How many runs went."""
        if keep is None and older_than_days is None:
            raise ValueError("say what to prune: keep the N newest runs, or those of the last D days")
        if keep is not None and keep < 0:
            raise ValueError(f"keep {keep} runs: give 0 or more")
        if older_than_days is not None and not (math.isfinite(older_than_days) and older_than_days >= 0):
            raise ValueError(f"older than {older_than_days!r} days: give a finite number of days, 0 or more")
        rows = self._db.execute("SELECT id, created, status, host, pid FROM runs ORDER BY id DESC").fetchall() \
            if self._db is not None else []
        cutoff = _cutoff(older_than_days) if older_than_days is not None else None
        doomed = [r["id"] for i, r in enumerate(rows) if _shown_status(r) != "running"
                  and ((keep is not None and i >= keep) or (cutoff is not None and r["created"] < cutoff))]
        return self.delete(doomed) if doomed else 0

    def _shrink(self) -> None:
        with self._errors():
            self._db.executescript("PRAGMA incremental_vacuum;")  # a script runs to its end: every free page goes
            self._db.execute("PRAGMA wal_checkpoint(TRUNCATE)")

    def import_run(self, run: Run, name: str = "") -> int:
        """A run read from a file (results.load_run has checked it) as a new complete run; its id. The run and its
        points are one transaction: an import that fails (a full disk) leaves nothing behind."""
        with self._errors(), self._transaction():
            cursor = self._db.execute(
                "INSERT INTO runs (created, name, status, env, config, host, pid, row_schema) VALUES (?,?,?,?,?,?,?,?)",
                (_now(), str(name)[:NAME_CHARS], "complete", _json(run.env), _json(run.config), "", 0, ROW_SCHEMA))
            self._insert_points(cursor.lastrowid, _rows(run.frame))
        return cursor.lastrowid

    # -- reading --
    def history(self) -> pd.DataFrame:
        """One row per run, newest first: id, created, name, machine, mechanisms, sizes (n from – to), status
        (a run left 'running' by a process gone is 'interrupted'), points, ok (measured points), note."""
        columns = ["id", "created", "name", "machine", "mechanisms", "sizes", "status", "points", "ok", "note"]
        if self._db is None:
            return pd.DataFrame(columns=columns)
        with self._errors():
            rows = self._db.execute(
                "SELECT r.id, r.created, r.name, r.note, r.status, r.env, r.host, r.pid, p.points, p.ok, p.mechs,"
                " p.lo, p.hi FROM runs r LEFT JOIN (SELECT run_id, COUNT(*) AS points, SUM(status = 'ok') AS ok,"
                " GROUP_CONCAT(DISTINCT mechanism) AS mechs, MIN(n) AS lo, MAX(n) AS hi FROM points GROUP BY run_id)"
                " p ON p.run_id = r.id ORDER BY r.id DESC").fetchall()
        return pd.DataFrame([[r["id"], r["created"], r["name"], _machine(r["env"]),
                              (r["mechs"] or "").replace(",", ", "), _sizes(r["lo"], r["hi"]), _shown_status(r),
                              r["points"] or 0, r["ok"] or 0, r["note"]] for r in rows], columns=columns)

    def run(self, run_id: int) -> Run:
        """A stored run as results.Run: its points in the order measured, its stamp and config."""
        if self._db is None:
            raise self._missing(run_id)
        number = self._known(run_id)
        with self._errors():
            head = self._db.execute("SELECT env, config FROM runs WHERE id = ?", (number,)).fetchone()
            if head is None:
                raise self._missing(run_id)
            names = ", ".join(f'NULL AS "{c}"' if c in self._absent else f'"{c}"' for c in COLUMNS)
            rows = [dict(r) for r in self._db.execute(
                f"SELECT {names} FROM points "
                "WHERE run_id = ? ORDER BY seq", (number,))]
        try:
            for row in rows:
                row["time_samples"] = json.loads(row["time_samples"] or "[]")
            stamp, config = json.loads(head["env"]), json.loads(head["config"])
        except (ValueError, TypeError, RecursionError) as e:
            raise StoreError(f"run {run_id} in {self.path} is damaged: its points, stamp or configuration are not "
                             f"the JSON the store wrote ({str(e)[:80]}); delete it, or restore the file from a copy"
                             ) from None
        return Run(frame_from_rows(rows), stamp, config)

    def info(self, run_id: int) -> dict:
        """A run's own row: id, created, name, note, status (as history shows it), host, pid."""
        row = self._db.execute("SELECT * FROM runs WHERE id = ?", (self._known(run_id),)).fetchone() \
            if self._db else None
        if row is None:
            raise self._missing(run_id)
        return {**{k: row[k] for k in ("id", "created", "name", "note", "host", "pid")}, "status": _shown_status(row)}


def _json(value: Any) -> str:
    return json.dumps(value, allow_nan=False, default=_plain, sort_keys=True)


def _plain(value: Any) -> Any:
    if hasattr(value, "item"):
        value = value.item()
        return None if isinstance(value, float) and not math.isfinite(value) else value
    raise TypeError(f"{type(value).__name__} is not JSON data")


def _cell(value: Any) -> Any:
    """A row's value as SQLite keeps it: samples as JSON text, NaN as NULL, numpy scalars as Python numbers."""
    if isinstance(value, (list, tuple)):
        return json.dumps([float(v) for v in value])
    if hasattr(value, "item") and not isinstance(value, (str, bytes)):
        value = value.item()
    if isinstance(value, float) and math.isnan(value):
        return None
    return value


def _rows(frame: pd.DataFrame) -> list[dict]:
    return frame.to_dict("records")


def _cutoff(days: float) -> str:
    """The creation time (ISO, UTC) before which a run is older than `days`; '' when no time is that old (days past
    year 1: no run is older)."""
    try:
        return (datetime.datetime.now(datetime.timezone.utc) - datetime.timedelta(days=days)).isoformat(
            timespec="seconds")
    except OverflowError:
        return ""


def _machine(env_text: str) -> str:
    try:
        env = json.loads(env_text)
    except (ValueError, TypeError, RecursionError):
        return ""
    if not isinstance(env, dict):
        return ""
    return str(env.get("device_name") or env.get("cpu") or env.get("device") or "")[:MACHINE_CHARS]


def _sizes(lo: Any, hi: Any) -> str:
    if not isinstance(lo, int) or not isinstance(hi, int):  # none stored (or a damaged row's text)
        return "" if lo is None else f"{lo} – {hi}"
    return f"{lo:,}" if lo == hi else f"{lo:,} – {hi:,}"


def export_bytes(run: Run, suffix: str, label: str = "the run") -> bytes:
    """The run as the run file `suffix` names (.json or .csv), refused with StoreError when it would be larger than
    the results.MAX_FILE_BYTES that load_run, `runs import` and the page's upload read back: whatever is exported
    can be imported again. The sentence gives the size, the limit and what to do instead."""
    kind = suffix.lower().lstrip(".")
    if kind not in ("json", "csv"):
        raise StoreError(f"cannot export {label} as {suffix!r}: name the file .json or .csv")
    data = (to_json_bytes if kind == "json" else to_csv_bytes)(run)
    limit = results.MAX_FILE_BYTES  # read now: one limit, wherever it is set
    if len(data) <= limit:
        return data
    instead = "it stays whole in the store: compare it there (the Compare page, `python -m attn_core runs show`)"
    if kind == "json" and len(other := to_csv_bytes(run)) <= limit:
        instead = f"export it as .csv ({_mib(len(other))}), which fits"
    raise StoreError(f"{label} as {kind.upper()} is {_mib(len(data))}, more than the {_mib(limit)} a run file may "
                     f"be to be imported or uploaded again, so it was not exported; {instead}")


def _mib(size: int) -> str:
    return f"{size / 2**20:.1f} MiB" if size % 2**20 else f"{size // 2**20} MiB"


def _shown_status(row: Mapping) -> str:
    """'interrupted' for a run still 'running' whose process of this host has gone; the stored status otherwise."""
    if row["status"] == "running" and row["host"] == socket.gethostname() and not process_alive(row["pid"]):
        return "interrupted"
    return row["status"]

