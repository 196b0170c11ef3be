"""Where the kernels' libraries are kept, and the checks before one is loaded: a library runs its code as whoever
loads it, so nothing is loaded from a folder or a file another user owns or can write.

The cache is a per-user folder: $ATTN_LAB_CACHE/native, else attention-lab/native in $XDG_CACHE_HOME or ~/.cache,
created with mode 0700, never a shared temporary folder. Before anything in it is loaded the folder, opened without
following a symbolic link, must be a folder owned by this user that no one else can write; the library, opened
relative to that folder and without following a link, a regular file owned by this user that no one else can write.
It is loaded through the descriptor those checks read (/proc/self/fd/N on Linux), so a file swapped in after the
checks is not what is loaded; the descriptor stays open while the library is loaded, so its name is never reused
for another file (the dynamic loader hands back an already loaded library by name). Where no safe cache exists,
a build goes to a private folder made for the process (mkdtemp, mode 0700) and removed at its exit.

torch's Inductor, which compiles Flex, keeps its libraries in attention-lab/inductor beside them (`inductor_folder`):
its own default is torchinductor_<user> in the shared temporary folder, a name any local user can make first.
"""
from __future__ import annotations

import atexit
import ctypes
import os
import shutil
import stat
import tempfile
from pathlib import Path

CACHE = "ATTN_LAB_CACHE"  # a folder for the built libraries
INDUCTOR = "TORCHINDUCTOR_CACHE_DIR"  # where torch's Inductor keeps what it compiles (torch reads it at each compile)


class Unsafe(OSError):
    """A folder or file refused: another user owns it or can write it, or it is a symbolic link."""


def cache_dir(kind: str = "native") -> Path:
    """The per-user cache folder's path ($ATTN_LAB_CACHE/<kind>, else attention-lab/<kind> in $XDG_CACHE_HOME or
    ~/.cache): "native" for our kernels, "inductor" for Inductor's; nothing is made or checked here (`open_folder`
    does both)."""
    named = os.environ.get(CACHE)
    if named:
        return Path(named) / kind
    home = os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache"
    return Path(home) / "attention-lab" / kind


def _refusal(st: os.stat_result, path: Path, what: str) -> str | None:
    """Why a folder or file with this status may not be trusted, or None: owned by another user, or writable by the
    group or others."""
    me = os.geteuid()
    if st.st_uid != me:
        return f"the {what} {path} is owned by uid {st.st_uid}, not by this user (uid {me})"
    if st.st_mode & (stat.S_IWGRP | stat.S_IWOTH):
        return (f"the {what} {path} can be written by other users (mode {stat.S_IMODE(st.st_mode):04o}; make it "
                f"0700, or remove it)")
    return None


def open_folder(path: Path, *, create: bool) -> int:
    """A descriptor of the folder `path`, made (mode 0700, its parents too) where `create` and it is missing, once it
    is checked: a folder, not a symbolic link, owned by this user, writable by no one else. Raises Unsafe with the
    reason; FileNotFoundError where it is missing and not to be made."""
    if not hasattr(os, "geteuid"):
        raise Unsafe("this system has no file owners to check (os.geteuid): no cache is kept")
    if create:
        path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
        try:
            os.mkdir(path, 0o700)
        except FileExistsError:
            pass
    if os.path.islink(path):
        raise Unsafe(f"the cache folder {path} is a symbolic link")
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC)
    why = _refusal(os.fstat(fd), path, "cache folder")
    if why:
        os.close(fd)
        raise Unsafe(why)
    return fd


def open_library(folder: int, path: Path) -> int | None:
    """A descriptor of the library `path` (named in the folder `folder`, a descriptor from `open_folder`), checked: a
    regular file, not a symbolic link, owned by this user, writable by no one else. None where there is none; raises
    Unsafe with the reason."""
    try:
        st = os.lstat(path.name, dir_fd=folder)
    except FileNotFoundError:
        return None
    if stat.S_ISLNK(st.st_mode):
        raise Unsafe(f"the library {path} is a symbolic link")
    fd = os.open(path.name, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=folder)
    st = os.fstat(fd)
    why = None if stat.S_ISREG(st.st_mode) else f"the library {path} is not a regular file"
    why = why or _refusal(st, path, "library")
    if why:
        os.close(fd)
        raise Unsafe(why)
    return fd


_held: list[int] = []  # descriptors of loaded libraries: kept open, so that /proc/self/fd/N names one file only


def load(fd: int, path: Path) -> ctypes.CDLL:
    """The library the descriptor `fd` reads (from `open_library`), loaded through that descriptor where the system
    has /proc/self/fd, else by its checked path. The descriptor is kept open once loaded (closed if loading fails)."""
    through = Path(f"/proc/self/fd/{fd}")
    try:
        lib = ctypes.CDLL(str(through if through.exists() else path))
    except OSError:
        os.close(fd)
        raise
    _held.append(fd)
    return lib


_private: list[Path] = []  # this process's private build folder, once made


def private_folder() -> Path:
    """A folder for this process alone (mkdtemp: a fresh name, mode 0700, owned by this user), removed at exit: where
    a build goes when no safe cache exists."""
    if not _private:
        made = Path(tempfile.mkdtemp(prefix="attention-lab-native-"))
        atexit.register(shutil.rmtree, made, ignore_errors=True)
        _private.append(made)
    return _private[0]


def inductor_folder() -> Path:
    """The folder torch's Inductor compiles Flex's kernels into, named in its variable (INDUCTOR) for this process
    and the processes it starts: attention-lab/inductor in the per-user cache (`cache_dir`), made and checked as
    our kernels' folder is (`open_folder`), and its parent writable by no one else unless sticky, since Inductor
    opens what it loads by path; where that is refused, a folder in this process's private one. A folder the user
    named in the variable is theirs and kept.

    Why: Inductor's default is torchinductor_<user> in the shared temporary folder (/tmp), which any local user can
    make first and fill with the libraries Inductor would load and run (pytorch/pytorch#121122 asks to move it; torch
    2.13 keeps it). Its precompiled headers go there whatever the variable says (torch 2.13: codecache._HEADER_DIR),
    so Flex compiles without them (flex._keep_compiles_private)."""
    from torch._inductor.runtime.cache_dir_utils import default_cache_dir

    named = os.environ.get(INDUCTOR)
    if named and (named in _inductor or os.path.abspath(named) != os.path.abspath(default_cache_dir())):
        return Path(named)  # ours, set before; or the user's own (torch writes its default here once it has used it)
    folder = cache_dir("inductor")
    try:
        os.close(open_folder(folder, create=True))
        st = os.stat(folder.parent)
        if st.st_mode & (stat.S_IWGRP | stat.S_IWOTH) and not st.st_mode & stat.S_ISVTX:
            raise Unsafe(f"the folder {folder.parent} can be written by other users, who could put another folder "
                         f"in the place of {folder.name}")
    except OSError:  # Unsafe, or a cache that cannot be made (a read-only home): this process's own folder
        folder = private_folder() / "inductor"
        folder.mkdir(mode=0o700, exist_ok=True)
    _inductor.append(str(folder))
    os.environ[INDUCTOR] = str(folder)
    return folder


_inductor: list[str] = []  # the folders inductor_folder has named in INDUCTOR
