"""Files the product writes, written whole or not at all; files it reads from a path a user gave, refused unless they
are regular files (a pipe with no writer would block the open forever)."""
from __future__ import annotations

import contextlib
import errno
import os
import stat
import tempfile


def write_atomic(path: str | os.PathLike, data: bytes) -> None:
    """Write `data` to `path` whole or not at all: into a new temporary file beside it (same folder, so the move
    stays on one file system), flushed and fsync'd, then moved over `path` with os.replace. On any failure (a full
    disk, a folder removed) the temporary file is removed and whatever `path` held is left as it was.

    The file keeps the mode of the one it replaces; a new one gets 0o666 less the umask, as open() would give it.
    A link to a regular file is written through (its target replaced, the link kept); a link to nothing, or a path
    that is a folder, pipe or device, is refused with OSError: a new file there would be created where nobody asked,
    and a pipe or device cannot be replaced."""
    target = _target(os.fspath(path))
    folder, name = os.path.split(os.path.abspath(target))
    mode = stat.S_IMODE(os.stat(target).st_mode) if os.path.exists(target) else 0o666 & ~_umask()
    fd, temp = tempfile.mkstemp(dir=folder, prefix=f".{name}.", suffix=".tmp")
    try:
        os.fchmod(fd, mode)
        view = memoryview(data)
        while view:  # os.write may write part of it
            view = view[os.write(fd, view):]
        os.fsync(fd)
        os.close(fd)
        fd = -1
        os.replace(temp, target)
    except BaseException:
        if fd >= 0:
            os.close(fd)
        with contextlib.suppress(OSError):
            os.unlink(temp)
        raise


def _target(path: str) -> str:
    """The regular file `path` names, through a link; OSError with a sentence for a link to no file or anything but
    a regular file."""
    if os.path.islink(path):
        resolved = os.path.realpath(path)
        if not os.path.isfile(resolved):
            what = "no file" if not os.path.lexists(resolved) else "something other than a file"
            raise OSError(errno.EINVAL, f"{path} is a link to {what} ({resolved}); remove the link or name a file")
        return resolved
    if os.path.lexists(path) and not os.path.isfile(path):
        raise OSError(errno.EINVAL, f"{path} is not a regular file (a folder, pipe or device); name a file")
    return path


class NotAFileError(OSError):
    """A folder, pipe, device or socket where a regular file was asked for; str() is the sentence alone."""

    def __str__(self) -> str:
        return str(self.strerror)


def kind_of(mode: int) -> str:
    """What a file of st_mode `mode` is, in words: 'a regular file', 'a folder', 'a pipe', 'a device', ..."""
    for test, words in ((stat.S_ISREG, "a regular file"), (stat.S_ISDIR, "a folder"), (stat.S_ISFIFO, "a pipe"),
                        (stat.S_ISCHR, "a device"), (stat.S_ISBLK, "a device"), (stat.S_ISSOCK, "a socket")):
        if test(mode):
            return words
    return "not a regular file"


def not_a_file(path: str | os.PathLike) -> str | None:
    """Why `path` (through links) cannot be read as a file, in a sentence: it is a folder, pipe, device or socket;
    None for a regular file or a path where nothing is (opening will say why). Only stat is called: nothing opens."""
    try:
        mode = os.stat(path).st_mode
    except OSError:
        return None
    if stat.S_ISREG(mode):
        return None
    return f"{os.fspath(path)} is {kind_of(mode)}, not a file; name a regular file"


def read_regular(path: str | os.PathLike, limit: int) -> bytes:
    """At most `limit` bytes of the regular file at `path`. A folder, pipe, device or socket is refused with
    NotAFileError (not_a_file's sentence) before anything is read: checked before opening, and again on what was
    opened (without blocking, so a pipe swapped in meanwhile cannot hang the open)."""
    if why := not_a_file(path):
        raise NotAFileError(errno.EINVAL, why)
    fd = os.open(path, os.O_RDONLY | getattr(os, "O_NONBLOCK", 0) | getattr(os, "O_CLOEXEC", 0)
                 | getattr(os, "O_BINARY", 0))
    with os.fdopen(fd, "rb") as f:
        mode = os.fstat(f.fileno()).st_mode
        if not stat.S_ISREG(mode):
            raise NotAFileError(errno.EINVAL, f"{os.fspath(path)} is {kind_of(mode)}, not a file; name a regular "
                                "file")
        return f.read(limit)


def _umask() -> int:
    """The process's umask, read where Linux shows it (setting and restoring it would race other threads)."""
    with contextlib.suppress(OSError, ValueError):
        with open("/proc/self/status", encoding="ascii", errors="replace") as f:
            for line in f:
                if line.startswith("Umask:"):
                    return int(line.split()[1], 8)
    mask = os.umask(0o022)
    os.umask(mask)
    return mask
