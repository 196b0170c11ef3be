"""The local run store: every sweep kept as it is measured, in one SQLite file (Python's sqlite3, WAL mode). A run is
one row (id, created, environment stamp, config, status, name, note; the host and process that measure it); a point
is one row of the saved row schema (engine.measurement.SCHEMA, written by Measurement.to_row), so a stored run reads
back through results.frame_from_rows and leaves as the usual run file through results.save_run."""
from __future__ import annotations

import contextlib
import dataclasses
import datetime
import json
import math
import os
import pathlib
import socket
import sqlite3
import sys
from dataclasses import dataclass
from typing import Any, Iterable, Iterator, Mapping

import pandas as pd

from attn_core.engine.measurement import COLUMNS, SCHEMA
from attn_core.engine import results
from attn_core.engine.results import (OPTIONAL, SCHEMA_VERSION as ROW_SCHEMA, Run, frame_from_rows, to_csv_bytes, to_json_bytes)
from attn_core.engine.files import kind_of, not_a_file, read_regular
from attn_core.engine.untrusted import printable

HOME_VARIABLE = "ATTN_LAB_HOME"  # a folder: the store is FILE_NAME in it
FILE_NAME = "runs.sqlite3"
APPLICATION_ID = 0x41544C42  # "ATLB" in the file's header: tells this store from another program's SQLite file
BUSY_S = 10.0  # a writer waits this long for another one before it is refused
STATUSES = ("running", "complete", "interrupted", "failed")
NAME_CHARS, NOTE_CHARS = 200, 2000  # the longest run name and note kept (longer is cut)
MACHINE_CHARS = 200  # the longest machine name history shows
MAX_ID = 2**63 - 1  # SQLite's largest integer: a larger run id names no run
_MAGIC = b"SQLite format 3\x00"
_NAMES = ", ".join(f'"{c}"' for c in COLUMNS)  # the row schema's columns, quoted for SQL
_SQL_TYPES = {"text": "TEXT", "bool": "INTEGER", "int": "INTEGER", "float": "REAL", "samples": "TEXT"}

# Migration k takes a store of schema version k − 1 to version k; the list only grows. A change of the saved row
# schema (measurement.SCHEMA) needs a migration here too: test_store checks that the two agree.
# Row columns added after the first schema, appended by migrations 2, 3, …, each with the value a point stored
# before it holds (no positions; our own kernel; NULL: no one-time cost measured).
_LATER = {"positions": " NOT NULL DEFAULT 'none'", "implementation": " NOT NULL DEFAULT 'ours'", "compile_s": "",
          "mask_s": ""}
_ADDED = (("positions",), ("implementation", "compile_s", "mask_s"))  # the columns of migration 2, of 3
MIGRATIONS: tuple[tuple[str, ...], ...] = (
    (f"PRAGMA application_id = {APPLICATION_ID}",
     "CREATE TABLE runs (id INTEGER PRIMARY KEY AUTOINCREMENT, created TEXT NOT NULL, name TEXT NOT NULL DEFAULT '',"
     " note TEXT NOT NULL DEFAULT '', status TEXT NOT NULL, env TEXT NOT NULL, config TEXT NOT NULL,"
     " host TEXT NOT NULL DEFAULT '', pid INTEGER NOT NULL DEFAULT 0, row_schema INTEGER NOT NULL)",
     "CREATE TABLE points (run_id INTEGER NOT NULL REFERENCES runs(id) ON DELETE CASCADE, seq INTEGER NOT NULL, "
     + ", ".join(f'"{name}" {_SQL_TYPES[kind]}' for name, kind in SCHEMA if name not in _LATER)
     + ", PRIMARY KEY (run_id, seq))"),
    *(tuple(f'ALTER TABLE points ADD COLUMN "{name}" {_SQL_TYPES[kind]}{_LATER[name]}' for name, kind in SCHEMA
            if name in added) for added in _ADDED),
)
SCHEMA_VERSION = len(MIGRATIONS)


class StoreError(ValueError):
    """A store that cannot be used as asked (damaged, not a store, newer, busy); the message says what to do."""


class StoreBusyError(StoreError):
    """Another process held the store's write lock for longer than BUSY_S."""


def default_path() -> str:
    """Where the store lives: $ATTN_LAB_HOME/runs.sqlite3, else the user's data folder as platformdirs computes it:
    %LOCALAPPDATA%\\attention-lab (Windows), ~/Library/Application Support/attention-lab (macOS),
    $XDG_DATA_HOME/attention-lab or ~/.local/share/attention-lab (elsewhere)."""
    if home := os.environ.get(HOME_VARIABLE):
        return os.path.join(os.path.expanduser(home), FILE_NAME)
    if sys.platform == "win32":
        base = os.environ.get("LOCALAPPDATA") or os.path.join(os.path.expanduser("~"), "AppData", "Local")
    elif sys.platform == "darwin":
        base = os.path.join(os.path.expanduser("~"), "Library", "Application Support")
    else:
        base = os.environ.get("XDG_DATA_HOME") or os.path.join(os.path.expanduser("~"), ".local", "share")
    return os.path.join(base, "attention-lab", FILE_NAME)


def _now() -> str:
    return datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")


def process_alive(pid: int) -> bool:
    """Whether process `pid` of this host still runs (a zombie counts as running). On Windows os.kill(pid, 0) would
    end the process: its kernel is asked instead."""
    if not 0 < pid < 2**31:  # beyond any system's process ids (a damaged row): os.kill would overflow
        return False
    if sys.platform == "win32":
        import ctypes

        kernel = ctypes.windll.kernel32
        handle = kernel.OpenProcess(0x1000, False, pid)  # PROCESS_QUERY_LIMITED_INFORMATION
        if not handle:
            return False
        code = ctypes.c_ulong()
        kernel.GetExitCodeProcess(handle, ctypes.byref(code))
        kernel.CloseHandle(handle)
        return code.value == 259  # STILL_ACTIVE
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except OSError:  # another user's process: it exists
        return True
    return True


def _header(path: str) -> tuple[int, int] | None:
    """(application_id, user_version) from an SQLite file's 100-byte header, read without SQLite (which could write
    to the file); None for an empty file. StoreError for a file that is not an SQLite database."""
    try:
        head = read_regular(path, 100)
    except OSError as e:
        raise StoreError(f"{path} cannot be read ({e.strerror or e}); check its permissions, or choose another store "
                         f"with --store or {HOME_VARIABLE}") from None
    if not head:
        return None
    if len(head) < 100 or not head.startswith(_MAGIC):
        raise StoreError(f"{path} is not an Attention Lab run store (not an SQLite database); it was left as it is: "
                         f"move it aside, or choose another store with --store or {HOME_VARIABLE}")
    return int.from_bytes(head[68:72], "big"), int.from_bytes(head[60:64], "big")


def _refusal(path: str, application_id: int, version: int) -> str | None:
    """Why a store whose header holds these cannot be opened; None when it can."""
    if application_id != APPLICATION_ID:
        return (f"{path} is an SQLite database of another program, not an Attention Lab run store; it was left as it "
                f"is: choose another store with --store or {HOME_VARIABLE}")
    if version > SCHEMA_VERSION:
        return (f"{path} was written by a newer Attention Lab (store schema {version}; this one reads up to "
                f"{SCHEMA_VERSION}); it was left as it is: open it with that version, or choose another store")
    return None


class Store:
    """One open store. `Store(path)` opens (or creates) it for writing, migrating an older schema; `readonly=True`
    only reads (a missing store reads as empty, and nothing is created). Each write is its own transaction,
    committed before the call returns. A second writer waits BUSY_S, then StoreBusyError. Use it in one thread."""

    def __init__(self, path: str | os.PathLike | None = None, *, readonly: bool = False, busy_s: float = BUSY_S):
        self.path = os.path.abspath(os.fspath(path) if path is not None else default_path())
        self.readonly, self.busy_s = readonly, busy_s
        self._absent: set[str] = set()  # row columns an older store opened to read only lacks
        self._immutable = False  # read without locks: its folder cannot be written here (see _connect)
        self._db: sqlite3.Connection | None = None
        if os.path.isdir(self.path):
            raise StoreError(f"{self.path} is a folder; name the store's file, e.g. "
                             f"{os.path.join(self.path, FILE_NAME)}")
        if not_a_file(self.path):  # a pipe would block SQLite's open (and ours) forever
            raise StoreError(f"{self.path} is {kind_of(os.stat(self.path).st_mode)}, not a run store (one SQLite "
                             f"file); it was left as it is: choose another store with --store or {HOME_VARIABLE}")
        exists = os.path.exists(self.path)
        found = _header(self.path) if exists else None
        if found is not None and found != (0, 0) and (why := _refusal(self.path, *found)):
            raise StoreError(why)  # (0, 0): a store being made, its header still in the write-ahead log, or foreign
        if readonly and found is None:
            return  # nothing stored yet: empty, and nothing created
        if not readonly and exists and not (os.access(self.path, os.W_OK)
                                            and os.access(os.path.dirname(self.path), os.W_OK)):
            raise StoreError(f"{self.path} can only be read here: it or its folder cannot be written (a read-only "
                             "mount, or another user's files); list, show and export its runs, or choose another "
                             f"store with --store or {HOME_VARIABLE}")
        if not exists:
            os.makedirs(os.path.dirname(self.path), mode=0o700, exist_ok=True)
        try:
            with self._errors():
                self._db = self._connect()
                self._db.row_factory = sqlite3.Row
                application_id, version = (self._pragma("application_id"), self._pragma("user_version"))
                blank = (application_id, version) == (0, 0) and not self._db.execute(
                    "SELECT COUNT(*) FROM sqlite_master").fetchone()[0]
                if not blank and (why := _refusal(self.path, application_id, version)):
                    raise StoreError(why)  # decided on what SQLite reads, the write-ahead log included
                if readonly and blank:
                    self.close()  # nothing stored yet
                    return
                if not readonly:
                    self._open_for_writing(version)
                self._check_tables()
        except BaseException:  # a store not opened holds no connection (a full disk leaves it open in _errors)
            self.close()
            raise

    # -- opening --
    def _connect(self, **flags: Any) -> sqlite3.Connection:
        """The connection: read-write (creating the file), or read-only. A reader of a WAL store needs its
        shared-memory file, which SQLite cannot make in a folder nobody may write (a read-only mount, another user's
        folder); such a store cannot change while it is read, so it is then read as immutable (no locks, no
        shared memory), unless its write-ahead log holds changes the file lacks."""
        mode = {"mode": "ro" if self.readonly else "rwc", **flags}
        uri = f"{pathlib.Path(self.path).as_uri()}?{'&'.join(f'{k}={v}' for k, v in mode.items())}"  # as_uri
        db = sqlite3.connect(uri, uri=True, timeout=self.busy_s, isolation_level=None,  # escapes ? # %
                             check_same_thread=False)
        if not self.readonly or flags:
            return db
        try:
            db.execute("PRAGMA application_id").fetchone()
            return db
        except sqlite3.OperationalError as e:
            db.close()
            if getattr(e, "sqlite_errorcode", 0) & 0xFF not in (sqlite3.SQLITE_CANTOPEN, sqlite3.SQLITE_READONLY):
                raise
        if os.path.exists(self.path + "-wal") and os.path.getsize(self.path + "-wal"):
            raise StoreError(f"{self.path} cannot be read here: its folder cannot be written and its write-ahead log "
                             f"({self.path}-wal) holds changes the file lacks; open it once where its folder can be "
                             "written (any `runs list` there folds them in), or copy the folder with both files")
        self._immutable = True
        return self._connect(immutable=1)

    def _pragma(self, name: str) -> int:
        return self._db.execute(f"PRAGMA {name}").fetchone()[0]

    def _open_for_writing(self, version: int) -> None:
        if version:
            check = self._db.execute("PRAGMA quick_check").fetchone()[0]
            if check != "ok":
                raise sqlite3.DatabaseError(check)
        else:
            self._db.execute("PRAGMA auto_vacuum = INCREMENTAL")  # before the first table: prune can give space back
        self._db.execute("PRAGMA journal_mode = WAL")
        self._db.execute("PRAGMA synchronous = FULL")  # a committed point survives a power cut too
        self._db.execute("PRAGMA foreign_keys = ON")
        if version < SCHEMA_VERSION:
            with self._transaction():  # re-read under the write lock: another process may have migrated meanwhile
                for target in range(self._pragma("user_version") + 1, SCHEMA_VERSION + 1):
                    for statement in MIGRATIONS[target - 1]:
                        self._db.execute(statement)
                    self._db.execute(f"PRAGMA user_version = {target}")
            self._db.execute("PRAGMA wal_checkpoint(TRUNCATE)")  # the header on disk shows the new version
        self._settle_orphans()

    def _check_tables(self) -> None:
        found = {row[1] for row in self._db.execute("PRAGMA table_info(points)")}
        # an older store opened to read only keeps its schema: a later column reads as empty (its default)
        self._absent = set(_LATER) - found if self.readonly else set()
        if ({"run_id", "seq", *COLUMNS} - found - self._absent
                or not self._db.execute("PRAGMA table_info(runs)").fetchall()):
            raise StoreError(f"{self.path} lacks the tables of a run store (damaged, or another program's); it was "
                             f"left as it is: move it aside, or choose another store with --store or {HOME_VARIABLE}")

    def _settle_orphans(self) -> None:
        """Runs left 'running' by a process of this host that has gone (killed, powered off) become 'interrupted'."""
        host = socket.gethostname()
        dead = [row["id"] for row in self._db.execute("SELECT id, pid FROM runs WHERE status = 'running' AND host = ?",
                                                       (host,)) if not process_alive(row["pid"])]
        if dead:
            with self._transaction():
                self._db.executemany("UPDATE runs SET status = 'interrupted' WHERE id = ?", [(i,) for i in dead])

    @contextlib.contextmanager
    def _errors(self) -> Iterator[None]:
        """sqlite3's errors as StoreError sentences: busy, damaged, unwritable."""
        try:
            yield
        except StoreError:
            self.close()
            raise
        except sqlite3.OperationalError as e:
            if "locked" in str(e) or "busy" in str(e):
                raise StoreBusyError(f"{self.path} is being written by another process that did not finish within "
                                     f"{self.busy_s:g} s; try again when its sweep has ended") from None
            if _full(e):  # the change was rolled back whole; the store stays open, to try again once there is room
                raise StoreError(f"{self.path} could not be written: the disk is full, so nothing of this change was "
                                 f"kept; free some space and try again, or choose another store with --store or "
                                 f"{HOME_VARIABLE}") from None
            self.close()
            raise StoreError(f"{self.path} cannot be used ({e}); check the folder's permissions and free space, or "
                             f"choose another store with --store or {HOME_VARIABLE}") from None
        except sqlite3.DatabaseError as e:
            self.close()
            if self._immutable:  # read without locks: a write elsewhere meanwhile looks like damage, and is not
                raise StoreError(f"{self.path} changed while it was read without locks (its folder cannot be written "
                                 f"here) ({e}); try again") from None
            raise StoreError(f"{self.path} is damaged ({e}); it was left as it is: move it aside (a new store is "
                             f"made in its place), or choose another store with --store or {HOME_VARIABLE}") from None

    @contextlib.contextmanager
    def _transaction(self) -> Iterator[None]:
        """One explicit transaction: every statement inside is committed together, or none is. (The connection is
        in autocommit mode, isolation_level=None: sqlite3 begins and commits nothing on its own in between.)"""
        self._writable()
        self._db.execute("BEGIN IMMEDIATE")  # the write lock now: a busy store waits here, not half-way
        try:
            yield
            self._db.execute("COMMIT")  # a COMMIT that fails (a full disk) is rolled back below too
        except BaseException:
            if self._db.in_transaction:  # SQLite itself rolls back on some errors (a full disk): then nothing is open
                with contextlib.suppress(sqlite3.Error):  # the error that brought us here is the one to report
                    self._db.execute("ROLLBACK")
            raise

    def _writable(self) -> None:
        if self.readonly:
            raise StoreError(f"{self.path} was opened to read only; open it without readonly to change it")
        if self._db is None:
            raise StoreError(f"{self.path} was closed after an earlier error; open the store again")

    def close(self) -> None:
        if self._db is not None:
            self._db.close()
            self._db = None

    def __enter__(self) -> "Store":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

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

    def _missing(self, run_id: Any) -> StoreError:
        shown = str(run_id) if len(str(run_id)) <= 30 else f"{str(run_id)[:20]}… ({len(str(run_id))} digits)"
        return StoreError(f"there is no run {shown} in {self.path}; `python -m attn_core runs list` lists them")

    def _known(self, run_id: Any) -> int:
        """A run id as SQLite can hold it; StoreError (no such run) for one beyond its integers (10**23)."""
        number = int(run_id)
        if not -MAX_ID <= number <= MAX_ID:
            raise self._missing(number)
        return number

    def size_bytes(self) -> int:
        """The bytes the store takes on disk: the database and its write-ahead log."""
        return sum(os.path.getsize(p) for p in (self.path, self.path + "-wal", self.path + "-shm")
                   if os.path.exists(p))


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


def _full(error: sqlite3.OperationalError) -> bool:
    """Whether SQLite failed for want of room: the disk (or the file's largest size) is full."""
    return getattr(error, "sqlite_errorcode", 0) & 0xFF == sqlite3.SQLITE_FULL or "is full" in str(error)


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


# -- resume: measure what is missing --
HAD = ("ok", "skipped", "oom")  # a point of these statuses is measured (or deliberately not); failed or cancelled
# points, and those never reached, are what a resume measures
_JSON_KINDS = {list: "list", str: "string", int: "number", float: "number", bool: "boolean", type(None): "null"}
_SAME_ENV = ("device_name", "cpu", "torch", "python", "os", "cuda", "dtype")


@dataclass(frozen=True)
class Resume:
    """What measuring the rest of run `run_id` takes: `sweeps`, one per series with the lengths it lacks (empty
    when nothing is missing), `missing` points in all, and `notes`: sentences on what differs from the run's own
    environment (another host, device, torch...)."""

    run_id: int
    sweeps: tuple
    missing: int
    notes: tuple[str, ...] = ()


def _point_key(mechanism: str, n: int, kv_heads: int, params: Mapping) -> tuple:
    return mechanism, int(n), int(kv_heads), json.dumps(dict(params), sort_keys=True)


def resumable(source: Store, run_id: int) -> list[dict]:
    """The sweeps (as run files hold them) that run `run_id` was measured with: its config's "sweeps" list, or the
    config itself for a run of one sweep. StoreError for a run that is not interrupted or failed, or whose config
    holds no sweep (an empty list, a list, text)."""
    return _sweeps_of(run_id, source.info(run_id)["status"], source.run(run_id).config)


def _sweeps_of(run_id: int, status: str, config: Any) -> list[dict]:
    if status not in ("interrupted", "failed"):
        raise StoreError(f"run {run_id} is {status}; only an interrupted or failed run can be resumed")
    sweeps = config.get("sweeps", [config]) if isinstance(config, dict) else None
    if not isinstance(sweeps, list) or not sweeps or not all(isinstance(s, dict) for s in sweeps):
        held = ("an empty list of sweeps" if sweeps == [] else "'sweeps' that are not a list of sweeps"
                if isinstance(config, dict) else f"a JSON {_JSON_KINDS.get(type(config), 'value')}, not a sweep")
        raise StoreError(f"run {run_id}'s config holds {held}, so what it lacks cannot be known; measure it again as "
                         "a new sweep")
    return sweeps


def resume_plan(source: Store, run_id: int, environment: Mapping | None = None) -> Resume:
    """The sweeps that measure the points run `run_id` lacks: each planned point (of its config, one sweep or
    several) without a stored point of status in HAD, grouped by series. `environment`: the stamp to compare with
    the run's (env.environment of the device and dtype); the notes say what differs. StoreError for a run that is
    complete or running, or whose config cannot be read back."""
    from attn_core.engine.config import SweepConfig
    from attn_core.engine.measurement import theory_of
    from attn_core.mechanisms import MEASURED

    info, run = source.info(run_id), source.run(run_id)
    try:
        configs = [SweepConfig.from_dict(c) for c in _sweeps_of(run_id, info["status"], run.config)]
    except (ValueError, TypeError) as e:
        raise StoreError(f"run {run_id}'s config cannot be read back ({e}); measure it again as a new sweep") from None
    had = {_point_key(r["mechanism"], r["n"], r["kv_heads"], json.loads(r["params"] or "{}"))
           for r in run.frame.to_dict("records") if r["status"] in HAD}
    sweeps, missing = [], 0
    for config in configs:
        lacking: dict[tuple, list] = {}  # the lengths a series lacks → the series lacking them: one sweep each
        for key, series_params in config.mechanisms:
            ns = []
            for n in sorted(set(config.ns)):
                problem = config.problem.at(key, series_params, n)
                spec = MEASURED.get(key)
                params = theory_of(spec, problem).params if spec is not None else dict(problem.params)
                if _point_key(key, n, problem.key_heads, params) not in had:
                    ns.append(n)
            if ns:
                lacking.setdefault(tuple(ns), []).append((key, series_params))
                missing += len(ns)
        sweeps += [dataclasses.replace(config, mechanisms=tuple(series), ns=ns) for ns, series in lacking.items()]
    return Resume(run_id, tuple(sweeps), missing, _differences(run.env, info, environment))


def _differences(stamp: Mapping, info: Mapping, environment: Mapping | None) -> tuple[str, ...]:
    notes = []
    if info.get("host") and info["host"] != socket.gethostname():
        notes.append(f"run {info['id']} was measured on another host ({info['host']}); its points and the new ones "
                     "will not be comparable")
    if environment:
        changed = [f"{k} {stamp.get(k)!s} → {environment.get(k)!s}" for k in _SAME_ENV
                   if k in stamp and stamp.get(k) != environment.get(k)]
        if changed:
            notes.append("the environment changed since the run was measured: " + "; ".join(changed))
    return tuple(notes)
