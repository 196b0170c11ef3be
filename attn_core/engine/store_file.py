"""The run store's SQLite file: where it lives, its schema and migrations, and opening it (checked, migrated, or
read only), with sqlite3's errors as sentences; the runs' reads and writes are store.Store's."""
from __future__ import annotations

import contextlib
import os
import pathlib
import socket
import sqlite3
import sys
from typing import Any, Iterator, TypeVar

from attn_core.engine.measurement import COLUMNS, SCHEMA
from attn_core.engine.files import kind_of, not_a_file, read_regular

HOME_VARIABLE = "ATTN_LAB_HOME"  # a folder: the store is FILE_NAME in it
FILE_NAME = "runs.sqlite3"
APPLICATION_ID = 0x41544C42  # "ATLB" in the file's header: tells this store from another program's SQLite file
BUSY_S = 10.0  # a writer waits this long for another one before it is refused
MAX_ID = 2**63 - 1  # SQLite's largest integer: a larger run id names no run
_MAGIC = b"SQLite format 3\x00"
_SQL_TYPES = {"text": "TEXT", "bool": "INTEGER", "int": "INTEGER", "float": "REAL", "samples": "TEXT"}

# Migration k takes a store of schema version k − 1 to version k; the list only grows. A change of the saved row
# schema (measurement.SCHEMA) needs a migration here too: test_store checks that the two agree.
# Row columns added after the first schema, appended by migrations 2, 3, …, each with the value a point stored
# before it holds (no positions; our own kernel; NULL: no one-time cost measured; no sinks, no first tokens kept).
_LATER = {"positions": " NOT NULL DEFAULT 'none'", "implementation": " NOT NULL DEFAULT 'ours'", "compile_s": "",
          "mask_s": "", "sinks": " NOT NULL DEFAULT 0", "keep_first": " NOT NULL DEFAULT 0"}
# the columns of migration 2, of 3, of 4
_ADDED = (("positions",), ("implementation", "compile_s", "mask_s"), ("sinks", "keep_first"))
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


_Open = TypeVar("_Open", bound="StoreFile")  # `with Store(...) as kept`: kept is a Store


class StoreFile:
    """One open store file: the connection, its transactions, and its errors as StoreError sentences (see Store)."""

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

    def __enter__(self: _Open) -> _Open:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

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


def _full(error: sqlite3.OperationalError) -> bool:
    """Whether SQLite failed for want of room: the disk (or the file's largest size) is full."""
    return getattr(error, "sqlite_errorcode", 0) & 0xFF == sqlite3.SQLITE_FULL or "is full" in str(error)

