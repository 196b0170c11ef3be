"""The C++ kernels' build: the compiler, its flags, one compile in a private folder, and loading a library built
into the cache (its declarations' hash checked); `loader` keeps the library a process uses."""
from __future__ import annotations

import contextlib
import ctypes
import functools
import hashlib
import os
import platform
import shutil
import signal
import subprocess
import tempfile
import time
from pathlib import Path

from . import cache, signatures
from .cache import Unsafe, cache_dir

HERE = Path(__file__).resolve().parent
SOURCES = (HERE / "select.cpp", HERE / "selected_softmax.cpp", HERE / "block_softmax.cpp", HERE / "index.cpp",
           HERE / "elu_plus_one.cpp", HERE / "prefix.cpp", HERE / "band.cpp",
           HERE / "linear.cpp")
HEADERS = (HERE / "vector.h",)  # included by the sources beside it (their own folder is searched first)
FLAGS = ("-O3", "-std=c++17", "-shared", "-fPIC")
TRIES = (("-march=native", "-fopenmp"), ("-march=native",), ())  # OpenMP and this CPU's vector units, or fewer
BUILD_SECONDS = 120  # one try's time limit (`build(seconds=...)`)


class Stale(RuntimeError):
    """A library built from other declarations than signatures.py's (an older build): refused, built again."""


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


def _run_all(commands: list[list[str]], seconds: float, folder: Path) -> list[tuple[int, str]]:
    """(exit status, stdout and stderr) of each command, all started at once, each in a session of its own, its
    output into an unnamed file of `folder`; past `seconds` from the start, or on an interrupt, every session (the
    compilers' own children with them) is killed and reaped, and subprocess.TimeoutExpired (or the interrupt)
    raised."""
    deadline = time.monotonic() + seconds
    procs: list[subprocess.Popen] = []
    with contextlib.ExitStack() as files:
        sinks = [files.enter_context(tempfile.TemporaryFile(dir=folder)) for _ in commands]
        try:
            for command, sink in zip(commands, sinks):
                procs.append(subprocess.Popen(command, stdout=sink, stderr=subprocess.STDOUT, start_new_session=True))
            for proc in procs:
                proc.wait(timeout=max(0.0, deadline - time.monotonic()))
        except BaseException:  # the time limit, or an interrupt: nothing of the build left running
            for proc in procs:
                if proc.poll() is None:
                    _kill_session(proc)
            raise
        said = []
        for proc, sink in zip(procs, sinks):
            sink.seek(0)
            said.append((proc.returncode, sink.read().decode("utf-8", errors="replace")))
        return said


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
    source = b"\0".join(path.read_bytes() for path in (*SOURCES, *HEADERS)) + signatures.header().encode()
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
    its own beside it (mode 0700): each source compiled to an object by a compiler of its own, all at once (on two
    cores 5.5–5.9 s where one compiler for all took 9.7–10.1), then linked there and renamed into place
    (processes building at once do not collide), mode 0755; None, or the first failing compiler's last words.
    `seconds` bounds the whole build."""
    work = Path(tempfile.mkdtemp(prefix=".build-", dir=target.parent))
    start = time.monotonic()
    try:
        _write_new(work / "signatures.h", signatures.header())
        _write_new(work / "signature.cpp", signatures.signature_source())
        part = work / target.name
        sources = [*SOURCES, work / "signature.cpp"]
        objects = [work / f"{i}-{source.stem}.o" for i, source in enumerate(sources)]
        compile_flags = [flag for flag in flags if flag != "-shared"]
        try:
            said = _run_all([[cxx, *compile_flags, f"-I{work}", "-c", str(source), "-o", str(obj)]
                             for source, obj in zip(sources, objects)], seconds, work)
            if all(status == 0 for status, _ in said):
                said = [_run([cxx, *flags, *map(str, objects), "-o", str(part)],
                             max(1.0, seconds - (time.monotonic() - start)))]
        except subprocess.TimeoutExpired:
            return f"the compiler ran past {seconds:g} s and was stopped"
        except (OSError, subprocess.SubprocessError) as e:
            return str(e)
        failed = next(((status, text) for status, text in said if status != 0), None)
        if failed is not None:
            status, text = failed
            last = text.strip().splitlines()
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


def find_built(cxx: str) -> tuple[ctypes.CDLL, str]:
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


def build_library(cxx: str, seconds: float) -> tuple[ctypes.CDLL, str]:
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
