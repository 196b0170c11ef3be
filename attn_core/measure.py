"""One point of a sweep: time (warm-up, repeats, raw samples) and peak memory of one mechanism at one size, guarded
against running out of memory; failures become statuses, never crashes."""
from __future__ import annotations

import functools
import importlib
import json
import math
import time
from dataclasses import dataclass
from typing import Any, Callable, Iterable

import torch

from . import env
from .mechanisms import MECHANISMS
from .mechanisms.sdpa import sdpa_backend
from .results import COLUMNS
from .spec import MechanismSpec, Shape

MODES = ("forward", "forward+backward")
BACKWARD_FLOP_FACTOR = 3  # backward ≈ 2× forward (a product for each operand's gradient): 3× in all
MIN_SAMPLE_S = 1e-3  # a sample times back-to-back calls adding up to ≥ 1 ms, so timer overhead stays small
MAX_CALLS_PER_SAMPLE = 100
MAX_SAMPLES = 1000


class Cancelled(Exception):
    """The sweep was cancelled while this point was being measured."""


@dataclass(frozen=True)
class Case:
    """What is measured: one mechanism with its parameters at one problem size, dtype, device and mode."""

    mechanism: str
    params: tuple[tuple[str, Any], ...]
    n: int
    batch: int
    heads: int
    d_model: int
    dtype: str
    device: str
    mode: str = "forward"
    causal: bool = False
    seed: int = 0

    @property
    def head_dim(self) -> int:
        return self.d_model // self.heads

    @property
    def shape(self) -> Shape:
        return Shape(self.batch, self.heads, self.n, self.n, self.head_dim, self.dtype, self.causal)

    def describe(self) -> str:
        extra = "".join(f", {k}={v}" for k, v in self.params)
        return f"{self.mechanism}{extra} at n = {self.n}"


@dataclass(frozen=True)
class Settings:
    """How a point is measured. `memory_limit_bytes` caps the free memory the guard sees (None: the device's own)."""

    warmup: int = 1
    min_repeats: int = 5
    min_time_s: float = 0.2
    budget_s: float = 30.0
    measure_memory: bool = True
    memory_margin: float = 0.2
    memory_limit_bytes: int | None = None
    threads: int | None = None


@functools.lru_cache(maxsize=32)
def resolve_mechanisms(extra: tuple[str, ...] = ()) -> dict[str, MechanismSpec]:
    """The catalogue plus mechanisms of your own, named as importable 'module:attribute' references to a
    MechanismSpec or to a dict or list of them (their functions must live at module level so the worker can
    import them). ValueError with a sentence for a reference that does not resolve."""
    registry = dict(MECHANISMS)
    for ref in extra:
        module, _, attribute = ref.partition(":")
        try:
            found = getattr(importlib.import_module(module), attribute)
        except (ImportError, AttributeError, ValueError) as e:
            raise ValueError(f"extra mechanism {ref!r} cannot be imported ({e}); give it as module:attribute") from None
        specs = found.values() if isinstance(found, dict) else [found] if isinstance(found, MechanismSpec) else found
        if not isinstance(specs, Iterable) or not all(isinstance(s, MechanismSpec) for s in specs):
            raise ValueError(f"extra mechanism {ref!r} is not a MechanismSpec (nor a dict or list of them)")
        registry.update({s.key: s for s in specs})
    return registry


def format_bytes(n: float) -> str:
    """'34.0 GiB', '512.0 MiB', '3.0 KiB', '12 B'."""
    for unit, size in (("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if abs(n) >= size:
            return f"{n / size:.1f} {unit}"
    return f"{n:.0f} B"


def theory(spec: MechanismSpec, case: Case) -> tuple[float, float]:
    """(FLOPs of the measured call, the spec's predicted forward peak bytes); FLOPs ×3 for forward+backward."""
    params = spec.resolved(dict(case.params))
    flops = float(spec.flops(case.shape, **params))
    factor = BACKWARD_FLOP_FACTOR if case.mode == "forward+backward" else 1
    return flops * factor, float(spec.memory_bytes(case.shape, **params))


def required_bytes(spec: MechanismSpec, case: Case) -> float:
    """Bytes a point needs, for the guard: q, k, v plus the spec's forward peak. Forward+backward: autograd keeps the
    forward's intermediates, the backward builds their gradients (about as large again) and q, k, v's gradients
    and the output's gradient, so 3 × the forward peak + 2 × the inputs. Mechanism state (projections) is small
    and not counted."""
    forward = theory(spec, case)[1]
    inputs = case.shape.input_bytes
    if case.mode == "forward+backward":
        return inputs + 3 * forward + 2 * inputs
    return inputs + forward


def guard(spec: MechanismSpec, case: Case, settings: Settings) -> str | None:
    """A reason to skip the point when its predicted need, with the safety margin, exceeds the free memory."""
    need = required_bytes(spec, case) * (1 + settings.memory_margin)
    free = env.free_memory_bytes(case.device)
    limited = settings.memory_limit_bytes is not None and settings.memory_limit_bytes < free
    if limited:
        free = settings.memory_limit_bytes
    if need <= free:
        return None
    note = " under the memory limit set for this sweep" if limited else ""
    return (f"would need {format_bytes(need)} (with a {settings.memory_margin:.0%} safety margin), "
            f"{format_bytes(free)} free{note}")


def is_oom(error: BaseException) -> bool:
    """True for an allocator failure on any device (CUDA/MPS OutOfMemoryError, CPU 'can't allocate memory')."""
    if isinstance(error, (torch.OutOfMemoryError, MemoryError)):
        return True
    text = str(error).lower()
    return isinstance(error, RuntimeError) and ("out of memory" in text or "can't allocate memory" in text)


def make_row(spec: MechanismSpec, case: Case, status: str, reason: str = "", **measured: Any) -> dict:
    """One result row: the case, the spec's theory, and whatever was measured (NaN where nothing was)."""
    flops, predicted = theory(spec, case)
    nan = float("nan")
    row = {"mechanism": case.mechanism, "label": spec.label, "exact": spec.exact,
           "params": json.dumps(spec.resolved(dict(case.params)), sort_keys=True), "n": case.n,
           "batch": case.batch, "heads": case.heads, "d_model": case.d_model, "head_dim": case.head_dim,
           "dtype": case.dtype, "device": case.device, "mode": case.mode, "causal": case.causal,
           "status": status, "reason": reason, "time_median_s": nan, "time_iqr_s": nan, "time_samples": [],
           "repeats": 0, "peak_bytes": nan, "memory_method": "", "predicted_bytes": predicted,
           "theory_flops": flops, "gflops": nan, "device_gflops": nan, "pct_of_device": nan, "sdpa_backend": "",
           "threads": nan}
    row.update(measured)
    assert set(row) == set(COLUMNS), set(row) ^ set(COLUMNS)
    return row


def median_iqr(samples: list[float]) -> tuple[float, float]:
    """Median and interquartile range (linear interpolation between order statistics)."""
    t = torch.tensor(samples, dtype=torch.float64)
    q = torch.quantile(t, torch.tensor([0.25, 0.5, 0.75], dtype=torch.float64)).tolist()
    return q[1], q[2] - q[0]


def make_inputs(case: Case) -> tuple[torch.Tensor, ...]:
    """Seeded q, k, v (B, H, n, D) on the case's device and dtype."""
    g = torch.Generator().manual_seed(case.seed)
    dtype = getattr(torch, case.dtype)
    return tuple(torch.randn(case.batch, case.heads, case.n, case.head_dim, generator=g).to(case.device, dtype)
                 for _ in range(3))


def make_state(spec: MechanismSpec, case: Case) -> dict:
    """The mechanism's seeded random state, built outside the timed region (attn_core.make_state, by spec)."""
    if spec.init_state is None:
        return {}
    return spec.init_state(case.shape, case.device, getattr(torch, case.dtype), seed=case.seed,
                           **spec.resolved(dict(case.params)))


def call_of(spec: MechanismSpec, case: Case, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
            state: dict) -> Callable[[], Any]:
    """The thunk that is timed: the forward call, or forward then the gradients of q, k and v."""
    kwargs = {**dict(case.params), **state}
    if case.mode == "forward":
        return lambda: spec.fn(q, k, v, causal=case.causal, **kwargs)
    q, k, v = (t.requires_grad_(True) for t in (q, k, v))
    grad_out = torch.randn_like(q)  # the output has q's shape
    return lambda: torch.autograd.grad(spec.fn(q, k, v, causal=case.causal, **kwargs), (q, k, v), grad_out)


def time_samples(thunk: Callable[[], Any], device: str, settings: Settings,
                 cancelled: Callable[[], bool] = lambda: False) -> tuple[list[float], float]:
    """Seconds per call, one sample per block of back-to-back calls: `warmup` untimed calls, then samples until
    both `min_repeats` samples and `min_time_s` are reached, or the point's `budget_s` is spent (≥ 1 sample).
    Returns (samples, seconds spent in all). Raises Cancelled when `cancelled()` turns true."""
    timed = env.device_timer(device)
    start, one = time.perf_counter(), 0.0
    for _ in range(settings.warmup):
        if cancelled():
            raise Cancelled
        one = timed(thunk, 1)
    calls = max(1, min(MAX_CALLS_PER_SAMPLE, math.ceil(MIN_SAMPLE_S / max(one, 1e-9))))
    samples: list[float] = []
    spent = 0.0
    while len(samples) < MAX_SAMPLES:
        if cancelled():
            raise Cancelled
        t = timed(thunk, calls)
        samples.append(t / calls)
        spent += t
        over = time.perf_counter() - start > settings.budget_s
        if over or (len(samples) >= settings.min_repeats and spent >= settings.min_time_s):
            break
    return samples, time.perf_counter() - start


def measure_case(spec: MechanismSpec, case: Case, settings: Settings,
                 cancelled: Callable[[], bool] = lambda: False) -> tuple[dict, float]:
    """Measure one point; (row, seconds it took). Statuses: ok; skipped by the memory guard; oom on an allocator
    failure; failed on any other exception (its message is the reason); cancelled. Time and memory come from
    separate runs, so profiling never inflates a time."""
    start = time.perf_counter()
    try:
        spec.check(case.shape, dict(case.params))
        reason = guard(spec, case, settings)
        if reason:
            return make_row(spec, case, "skipped", reason, threads=torch.get_num_threads()), 0.0
        return _measured(spec, case, settings, cancelled), time.perf_counter() - start
    except Cancelled:
        return make_row(spec, case, "cancelled", "cancelled while this point was measured"), 0.0
    except Exception as e:  # a mechanism's failure is a result, not a crash of the sweep
        status = "oom" if is_oom(e) else "failed"
        message = str(e).strip().splitlines()[0] if str(e).strip() else ""
        reason = f"out of memory: {message}" if status == "oom" else f"{type(e).__name__}: {message}"
        return make_row(spec, case, status, reason[:500]), time.perf_counter() - start
    finally:
        env.release_cached_memory(case.device)


def _measured(spec: MechanismSpec, case: Case, settings: Settings, cancelled: Callable[[], bool]) -> dict:
    q, k, v = make_inputs(case)
    state = make_state(spec, case)
    thunk = call_of(spec, case, q, k, v, state)
    with torch.inference_mode(case.mode == "forward"):
        samples, spent = time_samples(thunk, case.device, settings, cancelled)
        peak, method = float("nan"), ""
        if settings.measure_memory and spent <= settings.budget_s:
            if cancelled():
                raise Cancelled
            env.release_cached_memory(case.device)
            method, probe = env.peak_memory_probe(case.device)
            peak = float(probe(thunk))
        elif settings.measure_memory:
            method = "not measured: the point's time budget was spent on timing"
    median, iqr = median_iqr(samples)
    flops = theory(spec, case)[0]
    device_gflops = env.matmul_gflops(case.device, case.dtype)
    gflops = flops / median / 1e9
    backend = sdpa_backend(q.detach(), k.detach(), v.detach(), causal=case.causal) if spec.key == "sdpa" else ""
    return make_row(spec, case, "ok", time_median_s=median, time_iqr_s=iqr, time_samples=samples,
                    repeats=len(samples), peak_bytes=peak, memory_method=method, gflops=gflops,
                    device_gflops=device_gflops, pct_of_device=100.0 * gflops / device_gflops,
                    sdpa_backend=backend, threads=float(torch.get_num_threads()))

