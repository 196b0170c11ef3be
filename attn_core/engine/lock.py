"""One sweep at a time per user of a machine: an flock in the user's own folder of the temp folder."""
from __future__ import annotations

import contextlib
import os
import stat
import tempfile
import threading
import time
from typing import Callable, Iterator

try:
    import fcntl
except ImportError:  # Windows: sweeps are serialised within one process only
    fcntl = None

LOCK_NAME = "sweep.lock"  # inside the user's own folder of the temp folder, see user_folder()
LOCK_WAIT_S = 10.0  # how long a second sweep waits for the first before it is told that one is running


class SweepBusyError(RuntimeError):
    """Another sweep holds the machine's sweep lock."""


class SweepLockError(RuntimeError):
    """The sweep lock's file or folder cannot be used safely (a link, another user's folder); the message says what
    to remove."""


_process_lock = threading.Lock()  # where fcntl is missing


@contextlib.contextmanager
def sweep_lock(wait_s: float = 0.0, cancelled: Callable[[], bool] = lambda: False,
               on_wait: Callable[[str], None] = lambda holder: None, path: str | None = None) -> Iterator[None]:
    """Hold the sweep lock: an flock on `path`, by default LOCK_NAME in the user's own folder of the temp folder
    (user_folder()), which also excludes a second sweep in the same process. Waits up to `wait_s`, calling
    `on_wait(holder)` once, then raises SweepBusyError saying who holds it; the lock goes with the process, so a
    crashed sweep never leaves it held.

    The lock once sat at one fixed path in the shared temp folder and was opened following links, so any user could
    plant a link there and have a sweep overwrite the file it pointed to. It is now per user (two sweeps of one user
    still exclude each other; other users' sweeps are theirs to schedule), in a folder only that user can enter, and
    opened with O_NOFOLLOW: a link at its path raises SweepLockError instead."""
    if fcntl is None:
        if not _process_lock.acquire(timeout=max(wait_s, 0)):
            raise SweepBusyError("another sweep is running in this process; wait for it to finish or cancel it")
        try:
            yield
        finally:
            _process_lock.release()
        return
    fd = _open_lock_file(path or os.path.join(user_folder(), LOCK_NAME))
    try:
        deadline, told = time.monotonic() + wait_s, False
        while True:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except OSError:
                holder = _lock_holder(fd)
                if time.monotonic() >= deadline or cancelled():
                    raise SweepBusyError(f"another sweep is running on this machine ({holder}); wait for it to "
                                         "finish or cancel it, then start again") from None
                if not told:
                    on_wait(holder)
                    told = True
                time.sleep(0.1)
        with contextlib.suppress(OSError):
            os.ftruncate(fd, 0)
            os.pwrite(fd, f"pid {os.getpid()}, started {time.strftime('%H:%M:%S')}".encode(), 0)
        yield
    finally:
        os.close(fd)  # closing the descriptor releases the flock


def user_folder(base: str | None = None) -> str:
    """This user's private folder in the temp folder (`base`), 'attn_core-<uid>', created with mode 0o700; raises
    SweepLockError when its name is taken by a link, a file or another user's folder, or it cannot be made."""
    base = tempfile.gettempdir() if base is None else base
    uid = os.getuid()
    folder = os.path.join(base, f"attn_core-{uid}")
    try:
        with contextlib.suppress(FileExistsError):
            os.mkdir(folder, 0o700)
        info = os.lstat(folder)
    except OSError as e:
        raise SweepLockError(f"the sweep lock's folder {folder} cannot be made ({e.strerror or e}); make the temp "
                             "folder writable or set TMPDIR to a folder of yours") from None
    if stat.S_ISLNK(info.st_mode) or not stat.S_ISDIR(info.st_mode):
        kind = "a symbolic link" if stat.S_ISLNK(info.st_mode) else "not a folder"
        raise SweepLockError(f"the sweep lock's folder {folder} is {kind}, which another user could have planted; "
                             "remove it and start again")
    if info.st_uid != uid:
        raise SweepLockError(f"the sweep lock's folder {folder} belongs to another user (uid {info.st_uid}), who "
                             "could read or replace the lock; ask them or an administrator to remove it")
    if stat.S_IMODE(info.st_mode) != 0o700:
        os.chmod(folder, 0o700)  # ours, but open to others (made under another umask): close it
    return folder


def _open_lock_file(path: str) -> int:
    """A descriptor on the lock file, created 0o600; never through a link (O_NOFOLLOW) and never anything but a
    regular file, so a planted link or device cannot redirect the holder's line written into it."""
    flags = os.O_RDWR | os.O_CREAT | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_CLOEXEC", 0)
    try:
        fd = os.open(path, flags, 0o600)
    except PermissionError:  # another user's file: flock works on a read-only descriptor too
        fd = _open_read_only(path)
    except OSError as e:
        if os.path.islink(path):
            raise SweepLockError(f"the sweep lock {path} is a symbolic link, which would make a sweep overwrite "
                                 "the file it points to; remove the link and start again") from None
        raise SweepLockError(f"the sweep lock {path} cannot be opened ({e.strerror or e}); remove it or free its "
                             "folder and start again") from None
    if not stat.S_ISREG(os.fstat(fd).st_mode):
        os.close(fd)
        raise SweepLockError(f"the sweep lock {path} is not a regular file; remove it and start again")
    return fd


def _open_read_only(path: str) -> int:
    try:
        return os.open(path, os.O_RDONLY | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_CLOEXEC", 0))
    except OSError as e:
        raise SweepLockError(f"the sweep lock {path} cannot be opened ({e.strerror or e}); remove it and start "
                             "again") from None


def _lock_holder(fd: int) -> str:
    """The holder's line ('pid 123, started 10:04:05') read through our own descriptor, not the path again."""
    with contextlib.suppress(OSError):
        text = os.pread(fd, 200, 0).decode("utf-8", errors="replace").strip()
        if text:
            return text
    return "holder unknown"
