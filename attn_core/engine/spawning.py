"""Child processes that never run the caller's __main__.

multiprocessing's spawn and forkserver start methods send the child a description of the parent
(`spawn.get_preparation_data`), and the child runs the parent's main module again, by path or by name, before its
target. Under Streamlit the main module is the page script (its script runner installs each script as __main__ at
the start of every run and leaves it there), so a worker would run the dashboard, start a worker of its own and die
("An attempt has been made to start a new process before the current process has finished its bootstrapping phase").

Hiding __main__ by swapping `sys.modules["__main__"]` is not enough: the swap is global, and a script run that
begins on another thread between the swap and the start installs the page again. `without_main()` marks the calling
thread instead; the description taken on that thread leaves the main module out. Our children's targets live in
attn_core modules, which they import by name, so they need nothing of the caller's main.
"""
from __future__ import annotations

import contextlib
import threading
from multiprocessing import spawn
from typing import Iterator

_MAIN_KEYS = ("init_main_from_path", "init_main_from_name")
_local = threading.local()
_lock = threading.Lock()
_original = None


def _preparation_data(name: str) -> dict:
    data = _original(name)
    if getattr(_local, "depth", 0):
        for key in _MAIN_KEYS:
            data.pop(key, None)
    return data


def _install() -> None:
    """Wrap spawn.get_preparation_data once per process; the wrapper changes nothing outside `without_main()`."""
    global _original
    with _lock:
        if _original is None:
            _original = spawn.get_preparation_data
            spawn.get_preparation_data = _preparation_data


@contextlib.contextmanager
def without_main() -> Iterator[None]:
    """Processes started on this thread inside the block do not run the caller's __main__; other threads are not
    affected, and sys.modules is left alone."""
    _install()
    _local.depth = getattr(_local, "depth", 0) + 1
    try:
        yield
    finally:
        _local.depth -= 1
