"""The machine a measurement runs on: devices, dtypes, free memory, its matmul throughput, and the stamp a run carries.

Every platform quirk of the engine lives in one named helper here: `synchronize`, `device_timer`, `free_memory_bytes`,
`peak_memory_probe`, `release_cached_memory`, `ContentionProbe`, `steady_allocator`. CPU, CUDA and MPS differ only
inside these.
"""
from __future__ import annotations

import contextlib
import ctypes
import datetime
import math
import os
import platform
import sys
import time
from dataclasses import dataclass
from typing import Callable, Iterator

import psutil
import torch

from .. import native
from ..spec import dtype_name

DEVICES = ("cpu", "cuda", "mps")


def available_devices() -> list[str]:
    """The devices this process can measure on, CPU first: e.g. ['cpu'] or ['cpu', 'cuda']."""
    found = ["cpu"]
    if torch.cuda.is_available():
        found.append("cuda")
    if getattr(torch.backends, "mps", None) is not None and torch.backends.mps.is_available():
        found.append("mps")
    return found


def resolve_device(device: str = "auto") -> str:
    """'auto' → the fastest available ('cuda', then 'mps', then 'cpu'); a named device must be available."""
    found = available_devices()
    if device == "auto":
        return next(d for d in ("cuda", "mps", "cpu") if d in found)
    if device not in DEVICES:
        raise ValueError(f"device {device!r} is unknown; choose auto, {', '.join(DEVICES)}")
    if device not in found:
        raise ValueError(f"device {device!r} is not available on this machine; choose one of {', '.join(found)}")
    return device


def supported_dtypes(device: str) -> list[str]:
    """The dtypes every mechanism runs in on this device, float32 first."""
    if device == "cuda":  # bfloat16 runs natively from Ampere on and emulated before; asking would start CUDA here
        return ["float32", "float16", "bfloat16", "float64"]
    if device == "mps":
        return ["float32", "float16", "bfloat16"]  # MPS has no float64
    return ["float32", "bfloat16", "float16", "float64"]


def cpu_name() -> str:
    """The CPU model, e.g. 'AMD EPYC 7B13' (from /proc/cpuinfo on Linux)."""
    with contextlib.suppress(OSError):
        with open("/proc/cpuinfo", encoding="utf-8", errors="replace") as f:
            for line in f:
                if line.lower().startswith("model name"):
                    return line.split(":", 1)[1].strip()
    return platform.processor() or platform.machine() or "unknown CPU"


def device_name(device: str) -> str:
    if device == "cuda":
        return torch.cuda.get_device_name(0)
    if device == "mps":
        return f"Apple GPU (MPS) on {platform.machine()}"
    return cpu_name()


def total_memory_bytes(device: str) -> int:
    if device == "cuda":
        return int(torch.cuda.get_device_properties(0).total_memory)
    return int(psutil.virtual_memory().total)  # MPS shares the unified memory with the CPU


def free_memory_bytes(device: str) -> int:
    """Bytes a new allocation can still get: CUDA from the driver, CPU and MPS from the OS (unified memory)."""
    if device == "cuda":
        return int(torch.cuda.mem_get_info()[0])
    free = int(psutil.virtual_memory().available)
    if device == "mps" and hasattr(torch.mps, "recommended_max_memory"):
        free = min(free, int(torch.mps.recommended_max_memory() - torch.mps.driver_allocated_memory()))
    return free


def device_info(device: str) -> dict:
    """name, total_memory_bytes, free_memory_bytes, threads and dtypes of one device."""
    return {"name": device_name(device), "total_memory_bytes": total_memory_bytes(device),
            "free_memory_bytes": free_memory_bytes(device), "threads": torch.get_num_threads(),
            "dtypes": supported_dtypes(device)}


def environment(device: str, dtype: str, threads: int | None) -> dict:
    """The stamp a run carries: software versions, device, memory, threads, dtype, the form of the CPU kernels of our
    own (`native.describe`: C++ and its compiler, or the torch ops and why) and time (no host name)."""
    return {"torch": torch.__version__, "python": platform.python_version(), "os": platform.platform(),
            "machine": platform.machine(), "cpu": cpu_name(), "device": device, "device_name": device_name(device),
            "total_memory_bytes": total_memory_bytes(device), "cpu_count": os.cpu_count(),
            "threads": threads if threads is not None else torch.get_num_threads(), "dtype": dtype_name(dtype),
            "cuda": torch.version.cuda if device == "cuda" else None, "load_average": load_average(),
            "cpu_allocator": allocator_note(), "native_kernels": native.describe(),
            "timestamp": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")}


def load_average() -> float | None:
    """The OS's 1-minute load average (None where there is none): above the core count, other programs were
    competing for the CPU and CPU timings are inflated, often by far more than the load suggests."""
    return round(os.getloadavg()[0], 2) if hasattr(os, "getloadavg") else None


@contextlib.contextmanager
def cpu_threads(count: int | None) -> Iterator[None]:
    """torch's CPU threads set to `count` inside, as they were after (None: left alone). The studies pass one: their
    matrices are small, and on a shared machine a second OpenMP thread of every call waits for a busy core (a
    recall step took fifteen times as long with two threads as with one on a 2-core machine another program kept
    busy; planner timings spread by ×10 or more)."""
    before = torch.get_num_threads()
    if count is not None:
        torch.set_num_threads(count)
    try:
        yield
    finally:
        torch.set_num_threads(before)


@dataclass(frozen=True)
class Contention:
    """What other programs did to a span of wall time `wall_s`: `foreign_s` CPU-seconds they used (all cores,
    system busy time minus this process's; the OS counts in ticks of 10 ms, so short spans are coarse) and
    `waited_s`, the seconds this process's threads spent runnable but waiting for a core (Linux's per-thread
    run_delay, in ns; None where the OS does not say)."""

    wall_s: float = 0.0
    foreign_s: float = 0.0
    waited_s: float | None = None

    def __add__(self, other: "Contention") -> "Contention":
        waited = None if self.waited_s is None or other.waited_s is None else self.waited_s + other.waited_s
        return Contention(self.wall_s + other.wall_s, self.foreign_s + other.foreign_s, waited)

    @property
    def foreign_cores(self) -> float:
        """Cores other programs used on average over the span (≥ 0)."""
        return max(self.foreign_s, 0.0) / self.wall_s if self.wall_s > 0 else 0.0

    def disturbed(self, threads: int) -> bool:
        """True when other programs took CPU from this process during the span. With run_delay: its threads
        waited for a core for more than WAIT_SHARE of their time. Without it: other programs used more than the
        cores this process leaves spare, by FOREIGN_CORES."""
        if self.wall_s <= 0:
            return False
        if self.waited_s is not None:
            return self.waited_s > WAIT_SHARE * self.wall_s * max(threads, 1)
        return self.foreign_cores > spare_cores(threads) + FOREIGN_CORES


def spare_cores(threads: int) -> int:
    """The cores a process running `threads` busy threads leaves to other programs."""
    return max((os.cpu_count() or 1) - threads, 0)


WAIT_SHARE = 0.05  # threads kept waiting for a core more than 5% of the time: the sample is not clean
FOREIGN_CORES = 0.25  # where run_delay is unknown: cores used by others beyond those left spare


class ContentionProbe:
    """Reads, between samples, the counters a Contention is made of (`mark()` then `since(mark)`): system-wide
    busy CPU time (psutil), this process's CPU time, and on Linux the run_delay of each of its threads
    (/proc/self/task/*/schedstat). Files are opened once and re-read; a thread that appears later (a new pool)
    is picked up by `refresh()`."""

    def __init__(self) -> None:
        self._fds: list[int] = []
        self.refresh()

    def refresh(self) -> None:
        self.close()
        with contextlib.suppress(OSError):
            for tid in os.listdir("/proc/self/task"):
                with contextlib.suppress(OSError):
                    self._fds.append(os.open(f"/proc/self/task/{tid}/schedstat", os.O_RDONLY))

    def __del__(self) -> None:
        self.close()

    def close(self) -> None:
        for fd in self._fds:
            with contextlib.suppress(OSError):
                os.close(fd)
        self._fds = []

    def _waited_ns(self) -> int | None:
        if not self._fds:
            return None
        total = 0
        for fd in self._fds:
            with contextlib.suppress(OSError, ValueError, IndexError):
                total += int(os.pread(fd, 64, 0).split()[1])
        return total

    def others_runnable(self, span_s: float) -> float | None:
        """While this process sleeps for `span_s`: the mean number of other threads running or waiting to run,
        sampled every 2 ms from the kernel's instantaneous count (/proc/loadavg, field 4, less the reader itself).
        Unlike CPU times (10 ms ticks) it sees a browser's 20 ms drawing burst. None where the OS does not say."""
        counts: list[int] = []
        end = time.perf_counter() + span_s
        try:
            with open("/proc/loadavg", "rb") as f:
                while not counts or time.perf_counter() < end:
                    f.seek(0)
                    counts.append(int(f.read().split()[3].split(b"/")[0]) - 1)
                    time.sleep(0.002)
        except (OSError, ValueError, IndexError):
            return None
        return sum(counts) / len(counts)

    def mark(self) -> tuple[float, float, float, int | None]:
        t = psutil.cpu_times()
        busy = sum(t) - t.idle - getattr(t, "iowait", 0.0) - getattr(t, "guest", 0.0) - getattr(t, "guest_nice", 0.0)
        return time.perf_counter(), busy, time.process_time(), self._waited_ns()

    def since(self, mark: tuple[float, float, float, int | None]) -> Contention:
        now = self.mark()
        waited = None if now[3] is None or mark[3] is None else (now[3] - mark[3]) / 1e9
        return Contention(now[0] - mark[0], (now[1] - mark[1]) - (now[2] - mark[2]), waited)


ALLOCATOR = {"steady": False}  # whether steady_allocator took effect in this process (the stamp says so)


def steady_allocator() -> None:
    """Make a CPU point's cost independent of what ran before it in this process. glibc serves a block above its
    mmap threshold (raised with each such block freed, up to 32 MiB) with fresh pages, zeroed by the kernel on first
    touch, unless a free stretch of its heap is large enough: the same 32 MiB output then cost 8,193 page faults and
    30 ms in one call and none and 21 ms in the next (linear attention at n = 16384, B·H = 8, D = 64, 2-core Xeon),
    and softmax's n×n buffer was two-valued the same way. Turning mmap off (M_MMAP_MAX = 0) and trimming late ends
    the drift: every block comes from the heap and, once the heap has settled, is reused, as under jemalloc or
    TCMalloc, which PyTorch's performance tuning guide recommends on a CPU. The first call pays the first touch; a
    small request may split a freed block once while a live one lies above it, so the second or third call may pay
    for part of one block again (about half the runs, one call of the two), so a median of three samples is clean.
    release_cached_memory returns the heap's free memory between points. No-op off glibc."""
    with contextlib.suppress(OSError, AttributeError):
        libc = ctypes.CDLL(None)
        m_trim_threshold, m_mmap_max = -1, -4
        ALLOCATOR["steady"] = bool(libc.mallopt(m_mmap_max, 0)) and bool(libc.mallopt(m_trim_threshold, 2**30))


def allocator_note() -> str:
    """How this process's CPU allocator treats freed memory, as the environment stamp says it."""
    if ALLOCATOR["steady"]:
        return ("glibc, mmap off: every block reused once the heap settles (by the third call), first-touch faults "
                "not timed")
    return "the system's default"


def synchronize(device: str) -> None:
    """Wait until queued device work is done (kernels launch asynchronously on CUDA and MPS)."""
    if device == "cuda":
        torch.cuda.synchronize()
    elif device == "mps":
        torch.mps.synchronize()


def device_timer(device: str) -> Callable[[Callable[[], object], int], float]:
    """A function timing `calls` back-to-back runs of a thunk in seconds: CUDA events on CUDA, otherwise
    perf_counter between two synchronizations."""
    if device == "cuda":
        def timed(thunk: Callable[[], object], calls: int) -> float:
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            for _ in range(calls):
                thunk()
            end.record()
            end.synchronize()
            return start.elapsed_time(end) / 1e3
        return timed

    def timed(thunk: Callable[[], object], calls: int) -> float:
        synchronize(device)
        t0 = time.perf_counter()
        for _ in range(calls):
            thunk()
        synchronize(device)
        return time.perf_counter() - t0
    return timed


def release_cached_memory(device: str) -> None:
    """Return cached blocks to the device so the next point starts from a clean allocator (on CPU, under
    steady_allocator: glibc's free heap memory back to the OS, so the memory guard sees it free)."""
    if device == "cuda":
        torch.cuda.empty_cache()
    elif device == "mps":
        torch.mps.empty_cache()
    elif ALLOCATOR["steady"]:
        with contextlib.suppress(OSError, AttributeError):
            ctypes.CDLL(None).malloc_trim(0)


@contextlib.contextmanager
def _stderr_silenced() -> Iterator[None]:
    """Send file descriptor 2 to /dev/null for a moment: kineto writes 'USDT: ... profiler_start/stop' lines there
    on every profile, which no setting turns off and which would garble a progress bar."""
    sys.stderr.flush()
    saved = os.dup(2)
    try:
        with open(os.devnull, "w") as null:
            os.dup2(null.fileno(), 2)
        yield
    finally:
        os.dup2(saved, 2)
        os.close(saved)


def _profiled_peak(thunk: Callable[[], object]) -> int:
    """Running maximum of the CPU allocator's bytes in use above the start (`profiled_peak_held`)."""
    return profiled_peak_held(thunk)[0]


def profiled_peak_held(thunk: Callable[[], object]) -> tuple[int, int]:
    """(peak, held): the running maximum of the CPU allocator's bytes in use above the start, and the bytes still in
    use once the call's result is dropped (what it keeps for later calls, such as a cached table). torch.profiler
    records one '[memory]' event per allocation (+bytes) and per free (−bytes); summed one by one in time order from
    the raw kineto events. (Not the op list's self_cpu_memory_usage: that nets each op's allocations and frees at the
    op's start, so a buffer an op allocates and frees itself, such as sdpa's log-sum-exp and scratch, is never
    seen.) The autograd profiler that torch.profiler wraps: the wrapper's first use imports torch._inductor."""
    from torch.autograd import DeviceType
    from torch.autograd.profiler import profile

    with _stderr_silenced(), profile(use_cpu=True, profile_memory=True) as prof:
        result = thunk()
        del result
    events = [e for e in prof.kineto_results.events()
              if e.name() == "[memory]" and e.device_type() == DeviceType.CPU]
    in_use = peak = 0
    for event in sorted(events, key=lambda e: e.start_ns()):  # stable: ties keep the order they were recorded in
        in_use += event.nbytes()
        peak = max(peak, in_use)
    return peak, in_use


def _cuda_peak(thunk: Callable[[], object]) -> int:
    torch.cuda.synchronize()
    before = torch.cuda.memory_allocated()
    torch.cuda.reset_peak_memory_stats()
    result = thunk()
    torch.cuda.synchronize()
    del result
    return int(torch.cuda.max_memory_allocated() - before)


def _mps_peak(thunk: Callable[[], object]) -> int:
    torch.mps.synchronize()
    before = torch.mps.current_allocated_memory()
    result = thunk()
    torch.mps.synchronize()
    after = torch.mps.current_allocated_memory()
    del result
    return int(after - before)


MEMORY_METHODS = {
    "cpu": "torch.profiler (CPU allocator)",
    "cuda": "cuda max_memory_allocated",
    "mps": "mps current_allocated_memory after the call (no peak counter: a lower bound, temporaries missed)",
}


def peak_memory_probe(device: str) -> tuple[str, Callable[[Callable[[], object]], int]]:
    """(method name, function measuring the peak bytes one call of a thunk allocates above what existed before)."""
    probe = {"cuda": _cuda_peak, "mps": _mps_peak}.get(device, _profiled_peak)
    return MEMORY_METHODS[device if device in MEMORY_METHODS else "cpu"], probe


_MATMUL_CACHE: dict[tuple[str, str, int], tuple[float, bool]] = {}


def matmul_gflops(device: str, dtype: str = "float32", *, refresh: bool = False) -> float:
    """This device's dense matmul throughput in GFLOP/s (see `measure_matmul`), cached per process and (device,
    dtype, thread count); `refresh` measures it again (a sweep does, at its start, so its percentages rest on a
    figure taken beside its own points)."""
    key = (device, dtype_name(dtype), torch.get_num_threads())
    if refresh or key not in _MATMUL_CACHE:
        _MATMUL_CACHE[key] = measure_matmul(device, key[1])
    return _MATMUL_CACHE[key][0]


_BANDWIDTH_CACHE: dict[tuple[str, int], tuple[float, bool]] = {}
BANDWIDTH_BYTES = 256 << 20  # the buffer copied: far past any CPU's last-level cache, so the copy streams memory


def memory_bandwidth(device: str, *, refresh: bool = False) -> float:
    """This device's memory bandwidth in bytes per second (`measure_bandwidth`), cached per process and (device,
    thread count); `refresh` measures again."""
    key = (device, torch.get_num_threads())
    if refresh or key not in _BANDWIDTH_CACHE:
        _BANDWIDTH_CACHE[key] = measure_bandwidth(device)
    return _BANDWIDTH_CACHE[key][0]


def bandwidth_disturbed(device: str) -> bool:
    """Whether the cached bandwidth figure was taken while other programs took CPU from every copy of it."""
    return _BANDWIDTH_CACHE.get((device, torch.get_num_threads()), (0.0, False))[1]


def measure_bandwidth(device: str) -> tuple[float, bool]:
    """(bytes per second, disturbed): a copy of a 256 MiB buffer reads it and writes it (2 × 256 MiB moved); the
    best of 5 timed copies after one untimed (which maps the pages), taken among the copies no other program took
    CPU from (all of them, and disturbed = True, when none was clean: other work can only slow a copy down).
    About 0.3 s on a laptop CPU."""
    timed, threads, probe = device_timer(device), torch.get_num_threads(), ContentionProbe()
    src = torch.ones(BANDWIDTH_BYTES // 4, device=device)
    copy = torch.empty_like(src).copy_
    timed(lambda: copy(src), 1)
    clean: list[float] = []
    every: list[float] = []
    while len(every) < 5 or (not clean and len(every) < 10):
        mark = probe.mark()
        every.append(timed(lambda: copy(src), 1))
        if not probe.since(mark).disturbed(threads):
            clean.append(every[-1])
    probe.close()
    src = copy = None  # both buffers freed before the cache is emptied
    release_cached_memory(device)
    return 2 * BANDWIDTH_BYTES / min(clean or every), not clean


def matmul_disturbed(device: str, dtype: str = "float32") -> bool:
    """Whether the cached matmul figure was taken while other programs took CPU from every sample of it."""
    return _MATMUL_CACHE.get((device, dtype_name(dtype), torch.get_num_threads()), (0.0, False))[1]


def measure_matmul(device: str, dtype: str = "float32", seconds: float = 0.25) -> tuple[float, bool]:
    """(GFLOP/s of m×m products, 2·m³ FLOPs each; disturbed). m doubles from 256 until one product takes ≥ 50 ms
    (or m reaches 1024 on CPU, 8192 on GPUs), which also warms up; then the best of 5 samples of ≥ 10 ms within
    ~`seconds`, taken among the samples no other program took CPU from (all of them, and disturbed = True, when
    none was clean): the device's capability, since competition can only slow a sample down."""
    timed, torch_dtype = device_timer(device), getattr(torch, dtype_name(dtype))
    m, largest = 256, 1024 if device == "cpu" else 8192
    # untimed: a process's first product on a device loads its library and kernels, which ended the doubling at
    # m = 256 on CUDA (an H200 read as 0.6 TFLOP/s in fp32, 51 when warm: the sweep's estimate 80 times too long)
    first = torch.randn(m, m, device=device).to(torch_dtype)
    timed(lambda: first @ first, 1)
    while True:
        a = torch.randn(m, m, device=device).to(torch_dtype)
        one = timed(lambda: a @ a, 1)
        if one >= 0.05 or m >= largest:
            break
        m *= 2
    calls, threads, probe = max(1, math.ceil(0.01 / max(one, 1e-9))), torch.get_num_threads(), ContentionProbe()
    clean: list[float] = []
    every: list[float] = []
    while len(clean) < 5 and (sum(every) * calls < seconds or len(every) < 5) and len(every) < 50:
        mark = probe.mark()
        every.append(timed(lambda: a @ a, calls) / calls)
        if not probe.since(mark).disturbed(threads):
            clean.append(every[-1])
    probe.close()
    return 2.0 * m ** 3 / min(clean or every) / 1e9, not clean
