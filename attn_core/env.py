"""The machine a measurement runs on: devices, dtypes, free memory, its matmul throughput, and the stamp a run carries.

Every platform quirk of the engine lives in one named helper here: `synchronize`, `device_timer`, `free_memory_bytes`,
`peak_memory_probe`, `release_cached_memory`. CPU, CUDA and MPS differ only inside these.
"""
from __future__ import annotations

import contextlib
import datetime
import math
import os
import platform
import sys
import time
from typing import Callable, Iterator

import psutil
import torch

from .spec import dtype_name

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
    """The stamp a run carries: software versions, device, memory, threads, dtype and time (no host name)."""
    return {"torch": torch.__version__, "python": platform.python_version(), "os": platform.platform(),
            "machine": platform.machine(), "cpu": cpu_name(), "device": device, "device_name": device_name(device),
            "total_memory_bytes": total_memory_bytes(device), "cpu_count": os.cpu_count(),
            "threads": threads if threads is not None else torch.get_num_threads(), "dtype": dtype_name(dtype),
            "cuda": torch.version.cuda if device == "cuda" else None, "load_average": load_average(),
            "timestamp": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")}


def load_average() -> float | None:
    """The OS's 1-minute load average (None where there is none): above the core count, other programs were
    competing for the CPU and CPU timings are inflated, often by far more than the load suggests."""
    return round(os.getloadavg()[0], 2) if hasattr(os, "getloadavg") else None


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
    """Return cached blocks to the device so the next point starts from a clean allocator."""
    if device == "cuda":
        torch.cuda.empty_cache()
    elif device == "mps":
        torch.mps.empty_cache()


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
    """Running maximum of the CPU allocator's bytes in use above the start, from torch.profiler's memory events:
    each event's self_cpu_memory_usage (allocations +, frees −) summed in start-time order."""
    from torch.profiler import ProfilerActivity, profile

    with _stderr_silenced(), profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
        result = thunk()
        del result
    in_use = peak = 0
    for event in sorted(prof.events(), key=lambda e: e.time_range.start):
        in_use += event.self_cpu_memory_usage
        peak = max(peak, in_use)
    return peak


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


_MATMUL_CACHE: dict[tuple[str, str, int], float] = {}


def matmul_gflops(device: str, dtype: str = "float32", *, seconds: float = 0.25) -> float:
    """This device's dense matmul throughput in GFLOP/s (2·m³ FLOPs per m×m product), measured once per process
    per (device, dtype, thread count) and cached. m doubles from 256 until one product takes ≥ 50 ms (or m reaches
    1024 on CPU, 8192 on GPUs), which also warms up; then the best of ≥ 3 samples within ~`seconds`: the device's
    capability, since other programs competing for it can only slow a sample down. (Small products are the most
    distorted by competition: a thread pool waits a whole scheduler tick for a pre-empted thread.)"""
    key = (device, dtype_name(dtype), torch.get_num_threads())
    if key not in _MATMUL_CACHE:
        timed, torch_dtype = device_timer(device), getattr(torch, key[1])
        m, largest = 256, 1024 if device == "cpu" else 8192
        while True:
            a = torch.randn(m, m, device=device).to(torch_dtype)
            one = timed(lambda: a @ a, 1)
            if one >= 0.05 or m >= largest:
                break
            m *= 2
        calls = max(1, math.ceil(0.01 / max(one, 1e-9)))  # samples of ≥ 10 ms keep timer noise out
        samples: list[float] = []
        while len(samples) < 3 or (sum(samples) * calls < seconds and len(samples) < 50):
            samples.append(timed(lambda: a @ a, calls) / calls)
        _MATMUL_CACHE[key] = 2.0 * m ** 3 / min(samples) / 1e9
    return _MATMUL_CACHE[key]
