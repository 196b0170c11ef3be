"""Whether the C++ kernels run in this process: the ATTN_LAB_NATIVE switch, the explicit build, the library loaded
once (never built by a forward call), and `describe`'s words for which form runs. The one home of that state."""
from __future__ import annotations

import ctypes
import os
import threading
from pathlib import Path

from .cache import cache_dir
from .toolchain import BUILD_SECONDS, Stale, build_library, compiler, find_built

SWITCH = "ATTN_LAB_NATIVE"  # "0": the torch forms only
BUILD_HINT = "run `python -m attn_core native build` (or attn_core.native.build())"

_lock = threading.RLock()
# "lib": the CDLL, "how": the build's words; or "why": the reason there is none, "seen": the cache folder's mtime then
_loaded: dict[str, object] = {}
ON, OFF = ("", "1", "true", "yes", "on"), ("0", "false", "no", "off")  # ATTN_LAB_NATIVE's words, unset being on


def enabled() -> bool:
    """True where ATTN_LAB_NATIVE is unset or on; off, or a value that is neither (which `describe` names), asks for
    the torch forms only."""
    return os.environ.get(SWITCH, "").strip().lower() in ON


def build(*, seconds: float = BUILD_SECONDS) -> str:
    """Builds the kernels (or finds them built) and loads them for this process; returns `describe`'s words. Each
    compiler run is stopped after `seconds`. Raises RuntimeError with a sentence where they cannot be (ATTN_LAB_NATIVE
    off, no compiler, every try failed); `describe` then says the same."""
    if not enabled():
        raise RuntimeError(f"the C++ kernels are switched off ({describe()}): unset {SWITCH} to build them")
    with _lock:
        if "lib" not in _loaded:
            cxx = compiler()
            if cxx is None:
                why = "no C++ compiler on the PATH (set CXX)"
            else:
                try:
                    lib, how = build_library(cxx, seconds)
                    _loaded.clear()
                    _loaded.update(lib=lib, how=how)
                    return describe()
                except (RuntimeError, OSError) as e:
                    why = f"the build failed ({e})"
            _loaded.clear()
            _loaded["why"] = why
            raise RuntimeError(f"the C++ kernels cannot be built: {why}")
    return describe()


def _mtime(path: Path) -> int | None:
    try:
        return os.stat(path).st_mtime_ns
    except OSError:
        return None


def library() -> ctypes.CDLL | None:
    """The loaded library, or None (switched off; not built; refused; no compiler; `describe` says why). Never builds:
    a build already in the cache is loaded on the first call of the process; where there was none, the cache is looked
    at again only once its folder has changed."""
    if not enabled():
        return None
    lib = _loaded.get("lib")
    if lib is not None:
        return lib  # type: ignore[return-value]
    with _lock:
        if "seen" in _loaded and _mtime(cache_dir()) != _loaded["seen"]:
            _loaded.clear()  # something was built or removed since: look again
        if "lib" not in _loaded and "why" not in _loaded:
            cxx = compiler()
            if cxx is None:
                _loaded["why"] = "no C++ compiler on the PATH (set CXX)"
            else:
                seen = _mtime(cache_dir())
                try:
                    _loaded["lib"], _loaded["how"] = find_built(cxx)
                except FileNotFoundError as e:
                    _loaded.update(why=f"{e}; {BUILD_HINT}", seen=seen)
                except (OSError, Stale) as e:
                    _loaded.update(why=f"{e}; {BUILD_HINT}", seen=seen)
        return _loaded.get("lib")  # type: ignore[return-value]


def expected() -> bool:
    """Whether the kernels run, without building anything: a library loaded, or built already in the cache (looked
    up once a process; the memory models ask, and must stay cheap)."""
    return library() is not None


def index_expected() -> bool:
    """Whether `index_scores` runs (float32 work), without building anything: `expected`, and the library has the
    fused indexer (built with AVX-512, or AVX2 with FMA; the memory models ask)."""
    lib = library()
    return lib is not None and bool(lib.attn_index_available())


def elu_expected() -> bool:
    """Whether `elu_plus_one` runs (contiguous float32 work), without building anything: `expected`, and the library
    has its vector form (AVX-512, or AVX2 with FMA; the memory models ask)."""
    lib = library()
    return lib is not None and bool(lib.attn_elu_plus_one_available())


def band_expected() -> bool:
    """Whether `band` runs (float32 work), without building anything: `expected`, and the library has its AVX-512
    form (AVX2 machines keep the flash kernel; the memory models ask)."""
    lib = library()
    return lib is not None and bool(lib.attn_band_available())


def linear_lanes() -> int:
    """The lanes of `linear`'s vector (16 with AVX-512, 8 with AVX2 and FMA: the head widths it takes are a multiple
    of them), 0 where it does not run (no library, or one without a vector form), without building anything (the
    memory models ask)."""
    lib = library()
    return 0 if lib is None else int(lib.attn_linear_available())


def linear_expected() -> bool:
    """Whether `linear` runs (float32 work, a head width of whole vectors: `linear_lanes`)."""
    return linear_lanes() > 0


def describe() -> str:
    """Which form the CPU kernels take, in words: 'C++ (g++ …, -O3 -march=native, OpenMP threads)', or 'torch ops:
    <why>' (not built, refused, switched off). Builds nothing."""
    if not enabled():
        value = os.environ.get(SWITCH, "")
        if value.strip().lower() in OFF:
            return f"torch ops: {SWITCH}=0"
        return f"torch ops: {SWITCH}={value!r} is neither on (1) nor off (0); set it to one of them"
    if library() is not None:
        return f"C++ ({_loaded['how']})"
    return f"torch ops: {_loaded['why']}"
