"""The CPU the kernels run on, read when they are imported: its cache sizes and the cores this process may use.

The CPU kernels size their blocks, chunks and groups of heads so that the tensors one step makes stay in a cache
between its operations. Those sizes were first tuned on one CPU (an AMD EPYC with 1 MiB of level-2 cache a core and
32 MiB of level-3 shared by its two cores); they are written here as fractions of the caches of the CPU at hand, so
that they give the tuned values on that CPU and scale on another (an Intel Xeon with 2 MiB a core and 36 MiB shared
gets chunks twice as long). Where the OS does not say (no sysfs, no `sysconf` names), the values of that EPYC stand in.
"""
from __future__ import annotations

import contextlib
import functools
import os
import threading
from concurrent.futures import ThreadPoolExecutor, wait
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Iterator, Sequence

import torch

SYSFS = Path("/sys/devices/system/cpu/cpu0/cache")
FALLBACK_L2 = 1 << 20  # bytes a core, the EPYC the sizes were first measured on
FALLBACK_SHARED = 32 << 20  # its last-level cache


@dataclass(frozen=True)
class Caches:
    """A core's own cache (`per_core`, the unified level 2, bytes), the last level the cores share (`shared`,
    bytes), and the cores this process may use that the kernels' threads run on (`cores`); `source` says where the
    sizes were read."""

    per_core: int
    shared: int
    cores: int
    source: str

    @property
    def own(self) -> int:
        """The level-2 caches of the cores the threads run on, together: the most a step's working set, split
        between the threads, can take and stay in each core's own cache."""
        return self.per_core * self.cores

    def describe(self) -> str:
        mib = 1 << 20
        return (f"L2 {self.per_core / mib:g} MiB a core × {self.cores} cores, last level {self.shared / mib:g} MiB "
                f"({self.source})")


def size_of(text: str) -> int:
    """'1024K' → 1048576; '36M' → 37748736; '512' → 512."""
    text = text.strip().upper()
    scale = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}.get(text[-1:], 1)
    return int(text.rstrip("KMG")) * scale


def _from_sysfs(root: Path = SYSFS) -> tuple[int | None, int | None]:
    """(level-2 bytes a core, last-level bytes) from Linux's sysfs, None for what it does not list."""
    l2 = shared = None
    top = 0
    try:
        entries = sorted(root.glob("index*"))
    except OSError:
        return None, None
    for entry in entries:
        try:
            level = int((entry / "level").read_text())
            kind = (entry / "type").read_text().strip()
            size = size_of((entry / "size").read_text())
        except (OSError, ValueError):
            continue
        if kind not in ("Unified", "Data"):
            continue
        if level == 2:
            l2 = size
        if level >= top and level >= 2:
            top, shared = level, size
    return l2, shared


def _from_sysconf() -> tuple[int | None, int | None]:
    """The same from glibc's sysconf names (0 or missing where it does not know)."""
    def read(name: str) -> int | None:
        try:
            value = os.sysconf(name) if name in os.sysconf_names else 0
        except (OSError, ValueError):
            return None
        return value if value > 0 else None
    l2 = read("SC_LEVEL2_CACHE_SIZE")
    return l2, read("SC_LEVEL3_CACHE_SIZE") or l2


def usable_cores() -> int:
    """Cores this process may run on (its affinity), no more than torch's intra-op threads at import."""
    return max(1, min(usable_cores_now(), torch.get_num_threads()))


SHARED_TAKEN = 32 << 20  # the most of a last-level cache the kernels size their steps by


def taken(l2: int, shared: int | None, source: str) -> tuple[int, str]:
    """(the last level's bytes the kernels size their steps by, where it was read): the size reported, at least the
    level 2, at most SHARED_TAKEN, the 32 MiB that 8 cores of the EPYC the sizes were tuned on share. A larger figure
    is a whole socket's cache, which a guest of two cores shares with the socket's other cores: a 2-core Intel Xeon
    guest reports 480 MiB, and linear attention's segments sized from it (half and an eighth: 240 and 60 MiB)
    took 251 ms causal and 94 not at n = 32768 (B = 1, H = 8, D = 64), against 127 and 77 ms sized from 32 MiB (5
    interleaved rounds; at 8192 the same either way)."""
    size = max(shared or l2, l2)
    if size <= SHARED_TAKEN:
        return size, source
    return SHARED_TAKEN, f"{source}; {size / (1 << 20):g} MiB reported, a socket's, {SHARED_TAKEN >> 20} MiB taken"


@functools.lru_cache(maxsize=1)
def caches() -> Caches:
    """This CPU's caches (read once a process): sysfs, then sysconf, then the EPYC's sizes; the last level as
    `taken` bounds it."""
    for source, (l2, shared) in (("sysfs", _from_sysfs()), ("sysconf", _from_sysconf())):
        if l2:
            size, where = taken(l2, shared, source)
            return Caches(l2, size, usable_cores(), where)
    return Caches(FALLBACK_L2, FALLBACK_SHARED, usable_cores(), "not reported: an AMD EPYC's sizes assumed")


# -- threads from the free cores at call time -------------------------------------------------------------------
FIT_WORK = 1 << 20  # B·H·n·D numbers at least (a call of a millisecond or more) before the free cores are counted
_LOADAVG: list[int] = []  # /proc/loadavg opened once (a pread each call: a few µs)


def _running_now() -> int | None:
    """Tasks running or runnable on the machine this instant, the reader included (Linux: /proc/loadavg's fourth
    field, 'running/total'); None where the OS does not say."""
    try:
        if not _LOADAVG:
            _LOADAVG.append(os.open("/proc/loadavg", os.O_RDONLY))
        return int(os.pread(_LOADAVG[0], 128, 0).split()[3].split(b"/")[0])
    except (OSError, ValueError, IndexError):
        return None


_TASKS: dict[str, int] = {}  # this process's threads' stat files, opened once each


def _own_running() -> int:
    """This process's threads running or runnable this instant (state R in /proc/self/task/*/stat): the caller,
    and torch's workers still spinning after their last operation."""
    try:
        tasks = set(os.listdir("/proc/self/task"))
    except OSError:
        return 1
    for tid in [t for t in _TASKS if t not in tasks]:  # threads gone: their files closed
        with contextlib.suppress(OSError):
            os.close(_TASKS.pop(tid))
    count = 0
    for tid in tasks:
        try:
            if tid not in _TASKS:
                _TASKS[tid] = os.open(f"/proc/self/task/{tid}/stat", os.O_RDONLY)
            stat = os.pread(_TASKS[tid], 512, 0)
        except OSError:
            continue
        count += stat[stat.rfind(b")") + 2:stat.rfind(b")") + 3] == b"R"
    return max(count, 1)


def others_running() -> int:
    """Threads of other programs running or waiting for a core this instant (0 where the OS does not say): the
    machine's count less this process's own. One file read when the machine is otherwise idle; the process's
    threads are read only when it is not."""
    total = _running_now()
    if total is None or total <= 1:
        return 0
    return max(total - _own_running(), 0)


ALWAYS = "always"  # `Cost.keeps_threads`'s answer for a call whose threads take its work as they come free


def fitted(threads: int, cores: int, others: int, *, fused: bool | str = False) -> int:
    """The threads a call takes: as many as torch would (`threads`), but no more than the cores other programs
    leave free, and at least one. `fused` (a call of a few long parallel regions, `Cost.keeps_threads`): all of
    torch's where no core is free, since each core then holds other programs alike and a thread on each gets a share
    of each; with one core of two free, the thread sharing the other would make its half of the rows last twice as
    long (top-k at n = 16384 beside one spinning program: 9.2 s on two threads, 2.2× SDPA, against 1.14× on one).
    `fused` = ALWAYS (`run_blocks`: each thread takes the next piece of work as it comes free, so a thread a busy
    core slows takes fewer): all of torch's at any load."""
    if fused == ALWAYS or (fused and others >= cores):
        return threads
    return max(1, min(threads, cores - others))


@contextlib.contextmanager
def free_core_threads(work: int, *, fused: bool | str = False) -> Iterator[None]:
    """torch's intra-op threads cut, for the calls inside, to the cores free at this instant (`fitted`), then set
    back. Why: each parallel operation ends when its slowest thread does; with another program on one of two
    cores, the thread that shares that core waits a time slice (milliseconds) at every operation, and a kernel made
    of many small operations (chunks, blocks, groups of heads) pays it at each. On the benchmark's 2-core EPYC at
    load 15, linear attention at n = 8192 took 6.9× a whole-tensor peer's time on 2 threads and 0.95× on one. Calls
    of less than FIT_WORK numbers (B·H·n·D) are left alone: their time is too short for the count to pay. `fused`:
    see `fitted`."""
    want = torch.get_num_threads()
    if work < FIT_WORK or want <= 1:
        yield
        return
    use = fitted(want, usable_cores_now(), others_running(), fused=fused)
    if use == want:
        yield
        return
    torch.set_num_threads(use)
    try:
        yield
    finally:
        torch.set_num_threads(want)


def usable_cores_now() -> int:
    """Cores this process may run on now (its affinity), whatever torch's threads."""
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        return os.cpu_count() or 1


# -- blocks of work shared among threads as they come free ----------------------------------------------------------
_POOLS: dict[tuple[int, int], ThreadPoolExecutor] = {}
_POOL_LOCK = threading.Lock()
_ONE_THREAD = threading.local()  # set in a pool's thread once its torch operations run on one thread


def _pool(workers: int) -> ThreadPoolExecutor:
    """The process's pool of `workers` threads. Kept by process id too: a child forked after a pool started has the
    pool's object but none of its threads, and tasks given to it would wait forever."""
    with _POOL_LOCK:
        key = (os.getpid(), workers)
        if key not in _POOLS:
            _POOLS[key] = ThreadPoolExecutor(workers, thread_name_prefix="attn-blocks")
        return _POOLS[key]


def _one_thread() -> None:
    """torch's intra-op threads of the calling pool thread set to one, once (OpenMP's and MKL's counts are each
    thread's own; torch's default for threads yet to start, which this writes too, the caller sets back)."""
    if not getattr(_ONE_THREAD, "set", False):
        torch.set_num_threads(1)
        _ONE_THREAD.set = True


def run_blocks(tasks: Sequence[Callable[[], None]], workers: int) -> None:
    """Run `tasks` (each writing its own part of a result; heaviest first) on `workers` threads of a pool kept for the
    process, each thread taking the next task as it comes free and running the torch operations inside on one
    thread. Why: a parallel operation ends when its slowest thread does, so a call of many operations on torch's
    threads waits, at each, for the thread another program holds; here the threads meet once, at the end, and a
    thread a busy core slows simply takes fewer tasks. NSA's public call at n = 16384 (8 heads, D = 64, causal,
    2-core Xeon, against SDPA interleaved; `nsa.block_workers`): 1.47 against 1.71 s beside one spinning program
    (one fitted thread: 1.67), 1.82 against 2.19 beside two (one fitted thread 3.27, torch's two 2.07), 3.96 against
    4.37 beside six (one fitted thread 7.76). One worker, or one task: in the caller, as they come. The caller's
    grad and inference modes (each thread's own) are the workers' too; its autocast and profiler are not (the caller
    runs one worker under them). The first error a task raises stops the others at their next task and is raised
    here. Not for autograd: the tasks' in-place writes from several threads would race in its graph."""
    if workers <= 1 or len(tasks) <= 1:
        for task in tasks:
            task()
        return
    threads = torch.get_num_threads()
    queue, lock, failed = iter(tasks), threading.Lock(), threading.Event()
    grad, inference = torch.is_grad_enabled(), torch.is_inference_mode_enabled()  # each thread's own: carried

    def worker() -> None:
        _one_thread()
        with torch.inference_mode(inference), torch.set_grad_enabled(grad):
            while not failed.is_set():
                with lock:
                    task = next(queue, None)
                if task is None:
                    return
                try:
                    task()
                except BaseException:
                    failed.set()
                    raise

    try:
        futures = [_pool(workers).submit(worker) for _ in range(workers)]
        wait(futures)  # every thread done before an error is raised: none still writing
        for future in futures:
            future.result()
    finally:
        torch.set_num_threads(threads)  # torch's default for threads yet to start, which the workers wrote
