"""Kernels of our own in C++, for the CPU steps torch has no one op for, registered as torch operators
(torch.library custom ops in the namespace attn_lab, each with a fake implementation giving its outputs' shapes, so
that torch.compile traces around them and torch.library.opcheck checks them). Each runs beside the torch form it
replaces, which is what runs where no library is built (no compiler, a failed build, not built yet,
ATTN_LAB_NATIVE=0), and `describe` names which ran.

    select(scores, kk)                           the kk highest scores of each row, exactly (select.cpp;
                                                 topk.select's CPU form)
    selected_softmax(q, k, v, idx, usable)       softmax over each query's selected keys, fused (selected_softmax.cpp;
                                                 _sparse.selected_softmax's CPU form without gradients)
    index_scores(qi, kt, w)                      top-k's indexer, fused (index.cpp; topk.index_scores's CPU form,
                                                 float32 on machines with AVX-512)

The ops take no gradient: a backward through one raises a sentence, and the callers send calls that want gradients
to the torch forms. Each wrapper refuses, with a sentence, what its kernel would misread (a device, a dtype, a shape,
a position outside the keys) before it passes a pointer.

The build is explicit (`build`: `python -m attn_core native build`, the dashboard's worker at start-up); a forward
call never builds, it loads a library already built into the cache, else runs the torch form. `$CXX`, else c++, g++
or clang++, with -O3, -march=native (this machine's vector units: the cache key holds the CPU's flags) and -fopenmp
(rows split among torch.get_num_threads() threads; on Linux the library shares the libgomp that torch loaded), each
dropped in turn where the compiler refuses it; the compiler runs in a session of its own, killed whole at the time
limit. Every exported function is declared once, in signatures.py: the build writes signatures.h from it for the
.cpp files (the compiler refuses a definition that differs), ctypes takes its argument lists from it, and the library
carries the table's hash, checked at load (a library built from other declarations is refused). The cache
(cache.py): a per-user folder made 0700, its owner and mode checked and each library's, symbolic links refused;
where none is safe, a private folder made for the process.
"""
from __future__ import annotations

import ctypes
import functools
import hashlib
import os
import platform
import shutil
import signal
import subprocess
import tempfile
import threading
from pathlib import Path

import torch

from . import cache, signatures
from .cache import CACHE, Unsafe, cache_dir

HERE = Path(__file__).resolve().parent
SOURCES = (HERE / "select.cpp", HERE / "selected_softmax.cpp", HERE / "index.cpp")  # one library
SWITCH = "ATTN_LAB_NATIVE"  # "0": the torch forms only
FLAGS = ("-O3", "-std=c++17", "-shared", "-fPIC")
TRIES = (("-march=native", "-fopenmp"), ("-march=native",), ())  # OpenMP and this CPU's vector units, or fewer
BUILD_SECONDS = 120  # one try's time limit (`build(seconds=...)`)
BUILD_HINT = "run `python -m attn_core native build` (or attn_core.native.build())"

_lock = threading.RLock()
# "lib": the CDLL, "how": the build's words; or "why": the reason there is none, "seen": the cache folder's mtime then
_loaded: dict[str, object] = {}


ON, OFF = ("", "1", "true", "yes", "on"), ("0", "false", "no", "off")  # ATTN_LAB_NATIVE's words, unset being on


class Stale(RuntimeError):
    """A library built from other declarations than signatures.py's (an older build): refused, built again."""


def enabled() -> bool:
    """True where ATTN_LAB_NATIVE is unset or on; off, or a value that is neither (which `describe` names), asks for
    the torch forms only."""
    return os.environ.get(SWITCH, "").strip().lower() in ON


def compiler() -> str | None:
    """$CXX, else the first of c++, g++, clang++ on the PATH (None: there is none)."""
    return _compiler(os.environ.get("CXX"), os.environ.get("PATH"))


@functools.lru_cache(maxsize=8)
def _compiler(named: str | None, path: str | None) -> str | None:
    """`compiler` for these CXX and PATH, looked up once (the memory models ask `expected` at every size a search
    tries)."""
    if named:
        return shutil.which(named, path=path)
    return next((found for name in ("c++", "g++", "clang++") if (found := shutil.which(name, path=path))), None)


@functools.lru_cache(maxsize=1)
def _cpu_flags() -> str:
    """What -march=native builds for: the CPU's flags (Linux), else the processor's name and machine (read once: the
    memory models ask `index_expected` at every size a search tries)."""
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as f:
            return next((line for line in f if line.startswith(("flags", "Features"))), "")
    except OSError:
        return f"{platform.processor()} {platform.machine()}"


def _run(command: list[str], seconds: float) -> tuple[int, str]:
    """(exit status, stdout and stderr) of `command`, run in a session of its own; past `seconds` the whole session
    (the compiler's own children: cc1plus, as, ld) is killed and reaped, and subprocess.TimeoutExpired raised."""
    proc = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            start_new_session=True)
    try:
        out, _ = proc.communicate(timeout=seconds)
    except BaseException:  # the time limit, or an interrupt: nothing of the build left running
        _kill_session(proc)
        raise
    return proc.returncode, out or ""


def _kill_session(proc: subprocess.Popen) -> None:
    """Kills every process of `proc`'s session (its process group: it leads both) and reaps `proc`; its output is
    dropped unread (a process that left the group could hold the pipe open for ever)."""
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass
    proc.wait()
    if proc.stdout is not None:
        proc.stdout.close()


@functools.lru_cache(maxsize=8)
def _version(cxx: str) -> str:
    """The compiler's first line of --version (its file name where it says nothing), asked once a process."""
    try:
        status, said = _run([cxx, "--version"], 30)
        return said.splitlines()[0].strip() if status == 0 and said.strip() else os.path.basename(cxx)
    except (OSError, subprocess.SubprocessError):
        return os.path.basename(cxx)


def targets(cxx: str) -> list[tuple[tuple[str, ...], str]]:
    """Each try's flags and its library's file name in the cache: a key of the sources, the declarations, the
    compiler's version, the flags and the CPU."""
    source = b"\0".join(path.read_bytes() for path in SOURCES) + signatures.header().encode()
    found = []
    for extra in TRIES:
        flags = (*FLAGS, *extra)
        key = hashlib.sha256(b"\0".join([source, _version(cxx).encode(), " ".join(flags).encode(),
                                         _cpu_flags().encode(), platform.machine().encode()])).hexdigest()[:20]
        found.append((flags, f"attn_kernels_{key}.so"))
    return found


def _write_new(path: Path, text: str) -> None:
    """A new file in the build's private folder (made 0700 a moment ago, removed with whatever it holds): created
    exclusively, never following a link. Nothing is replaced, so the engine's write_atomic has nothing to protect."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_NOFOLLOW", 0), 0o600)
    try:
        os.write(fd, text.encode("utf-8"))  # a few kB: one write
    finally:
        os.close(fd)


def _compile(cxx: str, flags: tuple[str, ...], target: Path, seconds: float = BUILD_SECONDS) -> str | None:
    """SOURCES built into `target`, with signatures.h and signature.cpp written from the table into a build folder of
    its own beside it (mode 0700), the library made there and renamed into place (processes building at once do not
    collide), mode 0755; None, or the compiler's last words."""
    work = Path(tempfile.mkdtemp(prefix=".build-", dir=target.parent))
    try:
        _write_new(work / "signatures.h", signatures.header())
        _write_new(work / "signature.cpp", signatures.signature_source())
        part = work / target.name
        try:
            status, said = _run([cxx, *flags, f"-I{work}", *map(str, SOURCES), str(work / "signature.cpp"),
                                 "-o", str(part)], seconds)
        except subprocess.TimeoutExpired:
            return f"the compiler ran past {seconds:g} s and was stopped"
        except (OSError, subprocess.SubprocessError) as e:
            return str(e)
        if status != 0:
            last = said.strip().splitlines()
            return next((line for line in reversed(last) if "error" in line), last[-1] if last else f"exit {status}")
        os.chmod(part, 0o755)
        os.replace(part, target)
        return None
    finally:
        shutil.rmtree(work, ignore_errors=True)


def _load(target: Path, folder: int | None = None) -> ctypes.CDLL | None:
    """The library at `target` (None: there is none), checked (`cache.open_library`: its folder `folder`, a
    descriptor from `cache.open_folder`, opened here where not given), loaded through that descriptor, its
    declarations' hash compared with the table's (raises Stale where they differ) and its functions' ctypes types set
    from the table."""
    own = folder is None
    if own:
        folder = cache.open_folder(target.parent, create=False)
    try:
        fd = cache.open_library(folder, target)
    finally:
        if own:
            os.close(folder)
    if fd is None:
        return None
    lib = cache.load(fd, target)
    try:
        said = getattr(lib, signatures.SIGNATURE_FUNCTION)
        said.restype, said.argtypes = ctypes.c_char_p, []
        got = said().decode()
    except AttributeError:
        got = "none"
    if got != signatures.signature():
        raise Stale(f"the library {target} was built from other kernel declarations (signature {got}, not "
                    f"{signatures.signature()})")
    signatures.bind(lib)
    return lib


def _how(cxx: str, flags: tuple[str, ...], lib: ctypes.CDLL, private: str | None) -> str:
    threads = "OpenMP threads" if lib.attn_select_openmp() else "one thread"
    said = f"{_version(cxx)}, {' '.join(f for f in flags if f.startswith(('-O', '-march')))}, {threads}"
    return f"{said}; built for this process only, {private}" if private else said


def _find(cxx: str) -> tuple[ctypes.CDLL, str]:
    """The library built already in the cache for this compiler and CPU (the first try's that loads), and how it was
    built; builds nothing. Raises OSError or Stale with the reason where none can be loaded."""
    try:
        folder = cache.open_folder(cache_dir(), create=False)
    except Unsafe:
        raise
    except OSError as e:  # missing, or a path that cannot hold it
        raise FileNotFoundError("not built" if isinstance(e, FileNotFoundError) else
                                f"not built (no cache folder at {cache_dir()}: {e.strerror})") from e
    try:
        refused = []
        for flags, name in targets(cxx):
            try:
                lib = _load(cache_dir() / name, folder)
            except (OSError, Stale) as e:
                refused.append(str(e))
                continue
            if lib is not None:
                return lib, _how(cxx, flags, lib, None)
        if refused:
            raise OSError(f"the cached library is refused: {'; '.join(refused)}")
        raise FileNotFoundError("not built")
    finally:
        os.close(folder)


def _build(cxx: str, seconds: float) -> tuple[ctypes.CDLL, str]:
    """The library built (or found built) for these sources, declarations, compiler, flags and CPU, loaded; and how
    it was built. In the cache where it is safe, else in a private folder for the process. A cached library that is
    refused or will not load (another machine's, a damaged file, an older build) is built again, once, and the new
    file loaded (a new handle). Raises RuntimeError with each try's last words where none builds."""
    private = None
    try:
        where = cache_dir()
        folder = cache.open_folder(where, create=True)
    except OSError as e:  # Unsafe, or a folder that cannot be made
        private = f"as no cache is safe ({e})"
        where = cache.private_folder()
        folder = cache.open_folder(where, create=False)
    errors = []
    try:
        for flags, name in targets(cxx):
            named = " ".join(flags[len(FLAGS):]) or "plain"
            target = where / name
            for fresh in (False, True):
                if fresh:
                    error = _compile(cxx, flags, target, seconds)
                    if error is not None:
                        errors.append(f"{named}: {error}")
                        break
                try:
                    lib = _load(target, folder)
                except (OSError, Stale) as e:
                    if fresh:
                        errors.append(f"{named}: {e}")
                    continue
                if lib is not None:
                    return lib, _how(cxx, flags, lib, private)
    finally:
        os.close(folder)
    raise RuntimeError("; ".join(errors) or "no build")


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
                    lib, how = _build(cxx, seconds)
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
                    _loaded["lib"], _loaded["how"] = _find(cxx)
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
    fused indexer (built with AVX-512; the memory models ask)."""
    lib = library()
    return lib is not None and bool(lib.attn_index_available())


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


FLOATS = (torch.float32, torch.float64)  # the kernels' types (`select`, `selected_softmax`)


def _threads(items: int) -> int:
    """Threads a kernel splits `items` rows (or pairs of rows) among: torch's, at most one a row. The kernels and their
    scratch's pricing both take it from here."""
    return max(1, min(torch.get_num_threads(), items))


def _refuse_unless(ok: bool, what: str, got: str) -> None:
    if not ok:
        raise ValueError(f"native {what}; got {got}")


def _kernels() -> ctypes.CDLL:
    """The library, for an op's implementation (its wrapper has checked there is one)."""
    lib = library()
    if lib is None:
        raise RuntimeError(f"the C++ kernels are not loaded ({describe()})")
    return lib


def _no_backward(name: str):
    def backward(ctx, *grads):
        raise RuntimeError(f"attn_lab::{name} (a C++ kernel) has no backward: call it without gradients; the "
                           f"attention functions run the torch form where gradients are wanted")
    return backward


# ---- select: the kk highest scores of each row --------------------------------------------------------------------

@torch.library.custom_op("attn_lab::select", mutates_args=(), device_types="cpu")
def _select_op(scores: torch.Tensor, kk: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(rows, m) float32 or float64 scores → (positions (rows, kk) int64, usable (rows, kk) bool): select.cpp."""
    flat = scores.contiguous()
    rows, m = flat.shape
    idx = torch.empty(rows, kk, dtype=torch.long)
    usable = torch.empty(rows, kk, dtype=torch.bool)
    if rows == 0:
        return idx, usable
    threads = _threads(rows)
    wide = flat.dtype == torch.float64
    scratch = torch.empty(threads * 2 * (m + 16), dtype=torch.int64 if wide else torch.int32)
    lib = _kernels()
    fn = lib.attn_select_f64 if wide else lib.attn_select_f32
    fn(flat.data_ptr(), rows, m, kk, threads, scratch.data_ptr(), idx.data_ptr(), usable.data_ptr())
    return idx, usable


@_select_op.register_fake
def _(scores, kk):
    return scores.new_empty(scores.shape[0], kk, dtype=torch.long), scores.new_empty(scores.shape[0], kk,
                                                                                     dtype=torch.bool)


_select_op.register_autograd(_no_backward("select"))


def runs(scores: torch.Tensor) -> bool:
    """Whether `select` takes these scores: float32 or float64 on the CPU, rows of at least one key, and a library."""
    return scores.device.type == "cpu" and scores.dtype in FLOATS and scores.dim() >= 1 and scores.shape[-1] > 0 \
        and library() is not None


def select(scores: torch.Tensor, kk: int) -> tuple[torch.Tensor, torch.Tensor]:
    """The kk highest scores of each row (…, m) of NaN-free float32 or float64 CPU scores (`runs`): (indices (…, kk)
    int64, increasing in each row; usable (…, kk): the score is above −inf), ties at the threshold going to the
    earlier keys: topk._select_exact's selection, with the earliest keys where −inf scores fill a row. O(m) a row
    (select.cpp, the op attn_lab::select), on torch.get_num_threads() threads. Scratch: 2·(m + 16) keys a thread (of
    the scores' width)."""
    _refuse_unless(library() is not None and scores.device.type == "cpu" and scores.dtype in FLOATS
                   and scores.dim() >= 1 and 1 <= kk <= scores.shape[-1],
                   f"select needs a built library, float32 or float64 CPU scores and 1 <= kk <= "
                   f"{scores.shape[-1] if scores.dim() else 0} (the row's length)",
                   f"{scores.dtype} scores of shape {tuple(scores.shape)} on {scores.device} and kk = {kk}")
    rows_shape, m = scores.shape[:-1], scores.shape[-1]
    idx, usable = torch.ops.attn_lab.select(scores.detach().reshape(-1, m), kk)
    return idx.view(*rows_shape, kk), usable.view(*rows_shape, kk)


def scratch_bytes(m: int, rows: int, elem: int = 4) -> int:
    """Bytes of `select`'s scratch for `rows` rows of m scores of `elem` bytes: 2·(m + 16) keys of `elem` bytes for
    each of its threads, min(torch.get_num_threads(), rows)."""
    return _threads(rows) * 2 * (m + 16) * elem


# ---- selected_softmax: softmax over each query's selected keys ----------------------------------------------------

def _rows_of(x: torch.Tensor) -> tuple[torch.Tensor, int, int]:
    """x (B, X, n, D) as rows of D read in place (a copy where its rows are not), and its batch and head strides."""
    if x.stride(-1) != 1 or x.stride(-2) != x.shape[-1]:
        x = x.contiguous()
    return x, x.stride(0), x.stride(1)


@torch.library.custom_op("attn_lab::selected_softmax", mutates_args=(), device_types="cpu")
def _selected_softmax_op(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, idx: torch.Tensor, usable: torch.Tensor,
                         width: int) -> torch.Tensor:
    """q (B, H, r, D), k and v (B, Hk, m, D), idx and usable (B, S, r, kk), `width` keys a part (0: whole rows) →
    (B, H, r, D): selected_softmax.cpp. Refuses a position outside 0 … m − 1 with a sentence."""
    B, H, r, D = q.shape
    Hk, m = k.shape[1], k.shape[2]
    S, kk = idx.shape[1], idx.shape[-1]
    out = q.new_empty(B, H, r, D)
    if out.numel() == 0:
        return out
    if kk == 0:
        return out.zero_()
    low, high = torch.aminmax(idx)
    if int(low) < 0 or int(high) >= m:
        raise ValueError(f"selected positions must lie in 0 … {m - 1}, got {int(low)} … {int(high)}")
    idx = idx.contiguous()
    flags = None if bool(usable.all()) else usable.contiguous()
    q, qb, qh = _rows_of(q.detach())
    k, kb, kh = _rows_of(k.detach())
    v, vb, vh = _rows_of(v.detach())
    threads = _threads(r)
    parts = -(-m // width) if width else 0
    scratch = q.new_empty(threads * kk)
    state = q.new_empty(r * (D + 4) if parts else 1)
    bounds = torch.empty(B * S * r * (parts + 1) if parts else 1, dtype=torch.int64)
    lib = _kernels()
    fn = lib.attn_selected_softmax_f64 if q.dtype == torch.float64 else lib.attn_selected_softmax_f32
    fn(q.data_ptr(), qb, qh, k.data_ptr(), kb, kh, v.data_ptr(), vb, vh, idx.data_ptr(),
       None if flags is None else flags.data_ptr(), B, H, r, D, Hk, S, kk, m, width, D ** -0.5, threads,
       scratch.data_ptr(), state.data_ptr(), bounds.data_ptr(), out.data_ptr())
    return out


@_selected_softmax_op.register_fake
def _(q, k, v, idx, usable, width):
    return q.new_empty(q.shape)


_selected_softmax_op.register_autograd(_no_backward("selected_softmax"))


def softmax_runs(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> bool:
    """Whether `selected_softmax` takes these, once in the work dtype: floating CPU tensors, no gradient wanted
    through them, and a library."""
    wanted = torch.is_grad_enabled() and (q.requires_grad or k.requires_grad or v.requires_grad)
    return all(t.device.type == "cpu" and t.is_floating_point() for t in (q, k, v)) and not wanted and \
        library() is not None


def selected_softmax(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, idx: torch.Tensor,
                     usable: torch.Tensor) -> torch.Tensor:
    """softmax_s∈sel(t) (q_t·k_s/√D) v_s in one pass a query row (selected_softmax.cpp, the op
    attn_lab::selected_softmax): q (B, H, r, D), k and v (B, Hk, m, D) of one CPU float dtype (`softmax_runs`), idx
    and usable (B, S, r, kk) with S = 1 or Hk → (B, H, r, D). A row with no usable key outputs zeros, one with a NaN
    or +inf score NaN. Reads k and v in place; holds the output and kk scores a thread (`softmax_scratch_bytes`).
    Refuses, with a sentence, an index outside 0 … m − 1 (the kernel would read past the keys). No backward: a
    gradient through it raises (`softmax_runs` sends such calls to the torch form)."""
    B, H, r, D = q.shape
    Hk, m = k.shape[1], k.shape[2]
    S, kk = idx.shape[1], idx.shape[-1]
    _refuse_unless(library() is not None and S in (1, Hk) and H % Hk == 0 and idx.shape == (B, S, r, kk)
                   and usable.shape == idx.shape and k.shape == (B, Hk, m, D) and v.shape == k.shape
                   and idx.dtype == torch.int64 and usable.dtype == torch.bool and q.dtype in FLOATS
                   and k.dtype == v.dtype == q.dtype
                   and all(t.device.type == "cpu" for t in (q, k, v, idx, usable)),
                   "selected_softmax needs a library, CPU tensors, q (B, H, r, D), k and v (B, Hk, m, D) of q's "
                   "float32 or float64, and a selection (B, 1 or Hk, r, kk) of int64 positions and bool flags",
                   f"q {tuple(q.shape)} {q.dtype}, k {tuple(k.shape)} {k.dtype}, v {tuple(v.shape)} {v.dtype}, "
                   f"positions {tuple(idx.shape)} {idx.dtype}, flags {usable.dtype}")
    return torch.ops.attn_lab.selected_softmax(q, k, v, idx, usable, _parts(m, D, q.element_size())[0])


PART_BYTES = 1 << 19  # a part's keys and values: 512 KiB, within a core's own cache (see `part_keys`)


def part_keys(m: int, D: int, elem: int) -> int:
    """Keys of one part in `selected_softmax` (0: whole rows): where a head's m keys and values outgrow PART_BYTES
    twice over, every row's entries among the first `part_keys` keys are taken, then the next part's, the softmax
    carried from part to part (its highest score, sum and output, rescaled as a higher score comes), so that each
    part's keys and values are read from the core's cache. A block of top-k at n = 16384, top_k = 2048, D = 64 (341
    rows, a head's keys and values 8 MB) took 18.9, 17.1, 17.2, 17.7 and 20.1 ms in parts of 256 … 4,096 keys, 23.3
    in whole rows (float32; the kernel's other widths and types run whole rows)."""
    width = max(1, PART_BYTES // (2 * D * elem))
    return width if m > 2 * width else 0


def _parts(m: int, D: int, elem: int) -> tuple[int, int]:
    """(`part_keys`, the parts of m keys it makes; 0 for whole rows)."""
    width = part_keys(m, D, elem)
    return width, -(-m // width) if width else 0


def softmax_scratch_bytes(B: int, S: int, r: int, m: int, D: int, kk: int, elem: int = 4) -> int:
    """Bytes of `selected_softmax`'s scratch: kk scores of `elem` bytes for each of its threads, min(threads, r);
    where it runs in parts (`part_keys`), each row's running state (D + 4 numbers) and where each row's entries of
    each part begin (int64, B·S·r·(parts + 1))."""
    parts = _parts(m, D, elem)[1]
    carried = (r * (D + 4) * elem + 8 * B * S * r * (parts + 1)) if parts else elem + 8
    return _threads(r) * kk * elem + carried


# ---- index_scores: top-k's indexer --------------------------------------------------------------------------------

@torch.library.custom_op("attn_lab::index_scores", mutates_args=(), device_types="cpu")
def _index_op(qi: torch.Tensor, kt: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    """qi (B, r, IH·dI) float32, kt (B, dI, m), w (IH,) → (B, r, m) float32: index.cpp."""
    B, r, width = qi.shape
    heads, m = w.shape[0], kt.shape[2]
    out = torch.empty(B, r, m)
    if out.numel() == 0:
        return out
    if qi.stride(2) != 1 or qi.stride(1) != width:
        qi = qi.contiguous()
    kt, w = kt.to(torch.float32), w.to(torch.float32).contiguous()
    if kt.stride(2) != 1:
        kt = kt.contiguous()
    threads = _threads(B * -(-r // 2))
    _kernels().attn_index_scores_f32(qi.data_ptr(), qi.stride(0), kt.data_ptr(), kt.stride(0), kt.stride(1),
                                     w.data_ptr(), B, r, m, heads, width // heads, threads, out.data_ptr())
    return out


@_index_op.register_fake
def _(qi, kt, w):
    return qi.new_empty(qi.shape[0], qi.shape[1], kt.shape[2], dtype=torch.float32)


_index_op.register_autograd(_no_backward("index_scores"))


def index_runs(qi: torch.Tensor) -> bool:
    """Whether `index_scores` takes these indexer queries: float32 on the CPU, and a library built with AVX-512."""
    if qi.device.type != "cpu" or qi.dtype != torch.float32:
        return False
    lib = library()
    return lib is not None and bool(lib.attn_index_available())


def index_scores(qi: torch.Tensor, kt: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    """I_{t,s} = Σ_j w_j · ReLU(q^I_{t,j} · k^I_s) (index.cpp, the op attn_lab::index_scores): qi (B, r, IH·dI)
    float32 CPU (`index_runs`), kt the indexer keys transposed (B, dI, m; a view of the first m of longer rows is read
    in place), w (IH,) → (B, r, m), float32. Two query rows, four heads and 32 keys at a time in registers, the ReLU
    (NaN kept, as torch.relu keeps it) and weighted sum in them: nothing beside the scores. Refuses mismatched shapes
    with a sentence."""
    lib = library()
    _refuse_unless(lib is not None and bool(lib.attn_index_available()) and qi.dim() == 3 and w.dim() == 1
                   and kt.dim() == 3 and kt.shape[0] == qi.shape[0] and w.shape[0] * kt.shape[1] == qi.shape[2]
                   and qi.dtype == torch.float32 and kt.is_floating_point() and w.is_floating_point()
                   and all(t.device.type == "cpu" for t in (qi, kt, w)),
                   "index_scores needs a library built with AVX-512, CPU float32 queries (B, r, IH·dI), keys "
                   "(B, dI, m) and weights (IH,)", f"{tuple(qi.shape)} {qi.dtype}, {tuple(kt.shape)}, {tuple(w.shape)}")
    return torch.ops.attn_lab.index_scores(qi, kt, w)
