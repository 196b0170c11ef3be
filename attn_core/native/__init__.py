"""Kernels of our own in C++, for the CPU steps torch has no one op for: built at first use with the machine's C++
compiler, kept in a cache, loaded through ctypes. Each runs beside the torch form it replaces, which is what runs
where none can be built (no compiler, a failed build, ATTN_LAB_NATIVE=0), and `describe` names which ran.

    select(scores, kk)                           the kk highest scores of each row, exactly (select.cpp;
                                                 topk.select's CPU form)
    selected_softmax(q, k, v, idx, usable)       softmax over each query's selected keys, fused (selected_softmax.cpp;
                                                 _sparse.selected_softmax's CPU form without gradients)
    index_scores(qi, kt, w)                      top-k's indexer, fused (index.cpp; topk.index_scores's CPU form,
                                                 float32 on machines with AVX-512)

The build: `$CXX`, else c++, g++ or clang++, with -O3, -march=native (this machine's vector units: the cache key holds
the CPU's flags, so a cache shared with another CPU builds anew) and -fopenmp (rows split among
torch.get_num_threads() threads; on Linux the library shares the libgomp that torch loaded), each dropped in turn
where the compiler refuses it. The cache: `cache_dir`; each build is written under a name of its own and renamed
into place, so that processes building at once do not collide. Each wrapper refuses, with a sentence, what its
kernel would misread (a device, a dtype, a shape, a position outside the keys) before it passes a pointer.
"""
from __future__ import annotations

import ctypes
import functools
import hashlib
import os
import platform
import shutil
import subprocess
import tempfile
import threading
from pathlib import Path

import torch

HERE = Path(__file__).resolve().parent
SOURCES = (HERE / "select.cpp", HERE / "selected_softmax.cpp", HERE / "index.cpp")  # one library
SWITCH = "ATTN_LAB_NATIVE"  # "0": the torch forms only
CACHE = "ATTN_LAB_CACHE"  # a folder for the built libraries
FLAGS = ("-O3", "-std=c++17", "-shared", "-fPIC")
TRIES = (("-march=native", "-fopenmp"), ("-march=native",), ())  # OpenMP and this CPU's vector units, or fewer
BUILD_SECONDS = 120

_lock = threading.Lock()
_loaded: dict[str, object] = {}  # "lib": the CDLL, or "why": the reason there is none; "how": the build's words


ON, OFF = ("", "1", "true", "yes", "on"), ("0", "false", "no", "off")  # ATTN_LAB_NATIVE's words, unset being on


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


def _version(cxx: str) -> str:
    try:
        done = subprocess.run([cxx, "--version"], capture_output=True, text=True, timeout=30)
        return (done.stdout or done.stderr).splitlines()[0].strip()
    except (OSError, subprocess.SubprocessError, IndexError):
        return os.path.basename(cxx)


def cache_dir() -> Path:
    """Where built libraries are kept: $ATTN_LAB_CACHE, else attention-lab in $XDG_CACHE_HOME or ~/.cache, else in
    the temporary directory (the first of them that can be written)."""
    home = os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache"
    for where in (os.environ.get(CACHE), Path(home) / "attention-lab", Path(tempfile.gettempdir()) / "attention-lab"):
        if where:
            path = Path(where) / "native"
            try:
                path.mkdir(parents=True, exist_ok=True)
            except OSError:
                continue
            if os.access(path, os.W_OK):
                return path
    raise OSError("no folder to build in can be written: set ATTN_LAB_CACHE to one")


def _compile(cxx: str, flags: tuple[str, ...], target: Path) -> str | None:
    """SOURCES built into `target` (written under a name of its own, then renamed into place); None, or the compiler's
    last words."""
    part = target.with_name(f"{target.stem}.{os.getpid()}.{threading.get_ident()}.part")
    try:
        done = subprocess.run([cxx, *flags, *map(str, SOURCES), "-o", str(part)], capture_output=True, text=True,
                              timeout=BUILD_SECONDS)
    except (OSError, subprocess.SubprocessError) as e:
        part.unlink(missing_ok=True)
        return str(e)
    if done.returncode != 0:
        part.unlink(missing_ok=True)
        last = (done.stderr or done.stdout).strip().splitlines()
        return last[-1] if last else f"exit {done.returncode}"
    os.replace(part, target)
    return None


def _load(target: Path) -> ctypes.CDLL:
    """The library at `target`, its functions' signatures declared (ctypes checks the arguments' types and counts)."""
    lib = ctypes.CDLL(str(target))
    for name in ("attn_select_f32", "attn_select_f64"):
        fn = getattr(lib, name)
        fn.restype = None
        fn.argtypes = [ctypes.c_void_p] + [ctypes.c_int64] * 4 + [ctypes.c_void_p] * 3
    for name, real in (("attn_selected_softmax_f32", ctypes.c_float), ("attn_selected_softmax_f64", ctypes.c_double)):
        fn = getattr(lib, name)
        fn.restype = None
        fn.argtypes = [ctypes.c_void_p] * 8 + [real, ctypes.c_int64] + [ctypes.c_void_p] * 4
    lib.attn_index_scores_f32.restype = None
    lib.attn_index_scores_f32.argtypes = [ctypes.c_void_p, ctypes.c_int64, ctypes.c_void_p, ctypes.c_int64,
                                          ctypes.c_int64, ctypes.c_void_p] + [ctypes.c_int64] * 6 + [ctypes.c_void_p]
    lib.attn_select_openmp.restype = ctypes.c_int64
    lib.attn_index_available.restype = ctypes.c_int64
    return lib


def _build(cxx: str) -> tuple[ctypes.CDLL, str]:
    """The library built (or found built) for these sources, this compiler, flags and CPU, loaded; and how it was
    built. A cached library that will not load (another machine's, a damaged file) is built again, once. Raises
    RuntimeError with each try's last words where none builds."""
    version, source = _version(cxx), b"\0".join(path.read_bytes() for path in SOURCES)
    errors = []
    for extra in TRIES:
        flags = (*FLAGS, *extra)
        named = " ".join(extra) or "plain"
        key = hashlib.sha256(b"\0".join([source, version.encode(), " ".join(flags).encode(),
                                         _cpu_flags().encode(), platform.machine().encode()])).hexdigest()[:20]
        target = cache_dir() / f"attn_kernels_{key}.so"
        for fresh in (False, True):
            if fresh or not target.exists():
                error = _compile(cxx, flags, target)
                if error is not None:
                    errors.append(f"{named}: {error}")
                    break
            try:
                lib = _load(target)
            except (OSError, AttributeError) as e:
                if fresh:
                    errors.append(f"{named}: {e}")
                continue
            threads = "OpenMP threads" if lib.attn_select_openmp() else "one thread"
            return lib, f"{version}, {' '.join(f for f in flags if f.startswith(('-O', '-march')))}, {threads}"
    raise RuntimeError("; ".join(errors) or "no build")


def library() -> ctypes.CDLL | None:
    """The built library, building it on the first call of the process (None: disabled, or it cannot be built;
    `describe` says why). A failed build is not tried again in the process."""
    if not enabled():
        return None
    with _lock:
        if "lib" not in _loaded and "why" not in _loaded:
            cxx = compiler()
            if cxx is None:
                _loaded["why"] = "no C++ compiler on the PATH (set CXX)"
            else:
                try:
                    _loaded["lib"], _loaded["how"] = _build(cxx)
                except (RuntimeError, OSError) as e:
                    _loaded["why"] = f"the build failed ({e})"
        return _loaded.get("lib")  # type: ignore[return-value]


def expected() -> bool:
    """Whether the kernels run, without building anything: built already, or not yet tried and a compiler is there
    (the memory models ask, and must stay cheap)."""
    if not enabled():
        return False
    if "lib" in _loaded or "why" in _loaded:
        return "lib" in _loaded
    return compiler() is not None


def index_expected() -> bool:
    """Whether `index_scores` runs (float32 work), without building anything: `expected`, and the library has the
    fused indexer, or, not built yet, the CPU has AVX-512 (the memory models ask)."""
    if not expected():
        return False
    lib = _loaded.get("lib")
    return bool(lib.attn_index_available()) if lib is not None else "avx512f" in _cpu_flags().split()


def describe() -> str:
    """Which form the CPU kernels take, in words: 'C++ (g++ …, -O3 -march=native, OpenMP threads)', or 'torch ops:
    <why>'."""
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


def runs(scores: torch.Tensor) -> bool:
    """Whether `select` takes these scores: float32 or float64 on the CPU, rows of at least one key, and a library."""
    return scores.device.type == "cpu" and scores.dtype in FLOATS and scores.dim() >= 1 and scores.shape[-1] > 0 \
        and library() is not None


def select(scores: torch.Tensor, kk: int) -> tuple[torch.Tensor, torch.Tensor]:
    """The kk highest scores of each row (…, m) of NaN-free float32 or float64 CPU scores (`runs`): (indices (…, kk)
    int64, increasing in each row; usable (…, kk): the score is above −inf), ties at the threshold going to the
    earlier keys: topk._select_exact's selection, with the earliest keys where −inf scores fill a row. O(m) a row
    (select.cpp), on torch.get_num_threads() threads. Scratch: 2·(m + 16) keys a thread (of the scores' width)."""
    lib = library()
    _refuse_unless(lib is not None and scores.device.type == "cpu" and scores.dtype in FLOATS and scores.dim() >= 1
                   and 1 <= kk <= scores.shape[-1],
                   f"select needs a built library, float32 or float64 CPU scores and 1 <= kk <= "
                   f"{scores.shape[-1] if scores.dim() else 0} (the row's length)",
                   f"{scores.dtype} scores of shape {tuple(scores.shape)} on {scores.device} and kk = {kk}")
    rows_shape, m = scores.shape[:-1], scores.shape[-1]
    flat = scores.detach().contiguous().view(-1, m)
    rows = flat.shape[0]
    idx = torch.empty(*rows_shape, kk, dtype=torch.long)
    usable = torch.empty(*rows_shape, kk, dtype=torch.bool)
    if rows == 0:
        return idx, usable
    threads = _threads(rows)
    wide = flat.dtype == torch.float64
    scratch = torch.empty(threads * 2 * (m + 16), dtype=torch.int64 if wide else torch.int32)
    fn = lib.attn_select_f64 if wide else lib.attn_select_f32
    fn(flat.data_ptr(), rows, m, kk, threads, scratch.data_ptr(), idx.data_ptr(), usable.data_ptr())
    return idx, usable


def scratch_bytes(m: int, rows: int, elem: int = 4) -> int:
    """Bytes of `select`'s scratch for `rows` rows of m scores of `elem` bytes: 2·(m + 16) keys of `elem` bytes for
    each of its threads, min(torch.get_num_threads(), rows)."""
    return _threads(rows) * 2 * (m + 16) * elem


def softmax_runs(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> bool:
    """Whether `selected_softmax` takes these, once in the work dtype: floating CPU tensors, no gradient wanted
    through them, and a library."""
    wanted = torch.is_grad_enabled() and (q.requires_grad or k.requires_grad or v.requires_grad)
    return all(t.device.type == "cpu" and t.is_floating_point() for t in (q, k, v)) and not wanted and \
        library() is not None


def _rows_of(x: torch.Tensor) -> tuple[torch.Tensor, int, int]:
    """x (B, X, n, D) as rows of D read in place (a copy where its rows are not), and its batch and head strides."""
    if x.stride(-1) != 1 or x.stride(-2) != x.shape[-1]:
        x = x.contiguous()
    return x, x.stride(0), x.stride(1)


def selected_softmax(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, idx: torch.Tensor,
                     usable: torch.Tensor) -> torch.Tensor:
    """softmax_s∈sel(t) (q_t·k_s/√D) v_s in one pass a query row (selected_softmax.cpp): q (B, H, r, D), k and v
    (B, Hk, m, D) of one CPU float dtype (`softmax_runs`), idx and usable (B, S, r, kk) with S = 1 or Hk →
    (B, H, r, D). A row with no usable key outputs zeros, one with a NaN or +inf score NaN. Reads k and v in place;
    holds the output and kk scores a thread (`softmax_scratch_bytes`). Refuses, with a sentence, an index outside
    0 … m − 1 (the kernel would read past the keys)."""
    lib = library()
    B, H, r, D = q.shape
    Hk, m = k.shape[1], k.shape[2]
    S, kk = idx.shape[1], idx.shape[-1]
    _refuse_unless(lib is not None and S in (1, Hk) and H % Hk == 0 and idx.shape == (B, S, r, kk)
                   and usable.shape == idx.shape and k.shape == (B, Hk, m, D) and v.shape == k.shape
                   and idx.dtype == torch.int64 and usable.dtype == torch.bool and q.dtype in FLOATS
                   and k.dtype == v.dtype == q.dtype
                   and all(t.device.type == "cpu" for t in (q, k, v, idx, usable)),
                   "selected_softmax needs a library, CPU tensors, q (B, H, r, D), k and v (B, Hk, m, D) of q's "
                   "float32 or float64, and a selection (B, 1 or Hk, r, kk) of int64 positions and bool flags",
                   f"q {tuple(q.shape)} {q.dtype}, k {tuple(k.shape)} {k.dtype}, v {tuple(v.shape)} {v.dtype}, "
                   f"positions {tuple(idx.shape)} {idx.dtype}, flags {usable.dtype}")
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
    width, parts = _parts(m, D, q.element_size())
    scratch = q.new_empty(threads * kk)
    state = q.new_empty(r * (D + 4) if parts else 1)
    bounds = torch.empty(B * S * r * (parts + 1) if parts else 1, dtype=torch.int64)
    strides = torch.tensor([qb, qh], dtype=torch.int64)
    kv = torch.tensor([kb, kh, vb, vh], dtype=torch.int64)
    dims = torch.tensor([B, H, r, D, Hk, S, kk, m, width], dtype=torch.int64)
    fn = lib.attn_selected_softmax_f64 if q.dtype == torch.float64 else lib.attn_selected_softmax_f32
    fn(q.data_ptr(), strides.data_ptr(), k.data_ptr(), v.data_ptr(), kv.data_ptr(), idx.data_ptr(),
       None if flags is None else flags.data_ptr(), dims.data_ptr(), D ** -0.5, threads, scratch.data_ptr(),
       state.data_ptr(), bounds.data_ptr(), out.data_ptr())
    return out


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


def index_runs(qi: torch.Tensor) -> bool:
    """Whether `index_scores` takes these indexer queries: float32 on the CPU, and a library built with AVX-512."""
    if qi.device.type != "cpu" or qi.dtype != torch.float32:
        return False
    lib = library()
    return lib is not None and bool(lib.attn_index_available())


def index_scores(qi: torch.Tensor, kt: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    """I_{t,s} = Σ_j w_j · ReLU(q^I_{t,j} · k^I_s) (index.cpp): qi (B, r, IH·dI) float32 CPU (`index_runs`), kt the
    indexer keys transposed (B, dI, m; a view of the first m of longer rows is read in place), w (IH,) → (B, r, m),
    float32. Two query rows, four heads and 32 keys at a time in registers, the ReLU and weighted sum in them:
    nothing beside the scores. Refuses mismatched shapes with a sentence."""
    lib = library()
    B, r, width = qi.shape
    heads = w.shape[0]
    _refuse_unless(lib is not None and bool(lib.attn_index_available()) and w.dim() == 1 and kt.dim() == 3
                   and kt.shape[0] == B
                   and heads * kt.shape[1] == width and qi.dtype == torch.float32 and kt.is_floating_point()
                   and all(t.device.type == "cpu" for t in (qi, kt, w)),
                   "index_scores needs a library built with AVX-512, CPU float32 queries (B, r, IH·dI), keys "
                   "(B, dI, m) and weights (IH,)", f"{tuple(qi.shape)} {qi.dtype}, {tuple(kt.shape)}, {tuple(w.shape)}")
    m = kt.shape[2]
    out = torch.empty(B, r, m)
    if out.numel() == 0:
        return out
    if qi.stride(2) != 1 or qi.stride(1) != width:
        qi = qi.contiguous()
    kt, w = kt.to(torch.float32), w.to(torch.float32).contiguous()
    if kt.stride(2) != 1:
        kt = kt.contiguous()
    threads = _threads(B * -(-r // 2))
    lib.attn_index_scores_f32(qi.data_ptr(), qi.stride(0), kt.data_ptr(), kt.stride(0), kt.stride(1), w.data_ptr(),
                              B, r, m, heads, width // heads, threads, out.data_ptr())
    return out
