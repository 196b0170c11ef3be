"""One point of a sweep: time (warm-up, repeats, raw samples) and peak memory of one mechanism at one size, guarded
against running out of memory; failures become statuses, never crashes."""
from __future__ import annotations

import functools
import json
import math
import os
import time
from dataclasses import dataclass
from typing import Any, Callable

import torch

from . import env
from ..mechanisms import MECHANISMS, load
from ..mechanisms._common import checked_shape, validated
from ..mechanisms.sdpa import sdpa_backend
from .results import COLUMNS, MAX_COUNT
from ..spec import DTYPE_BYTES, MechanismSpec, Shape

MODES = ("forward", "forward+backward", "generate")
BACKWARD_FLOP_FACTOR = 3  # backward ≈ 2× forward (a product for each operand's gradient): 3× in all
MIN_SAMPLE_S = 1e-3  # a sample times back-to-back calls adding up to ≥ 1 ms, so timer overhead stays small
MAX_CALLS_PER_SAMPLE = 100
MAX_SAMPLES = 1000
MAX_THREADS = 4 * (os.cpu_count() or 1)  # far more torch threads than cores only thrash; 10,000 crash the worker
MAX_SEED = 2**63 - 1  # torch's generator takes a 64-bit seed


class Cancelled(Exception):
    """The sweep was cancelled while this point was being measured."""


@dataclass(frozen=True, kw_only=True)
class Problem:
    """The attention problem every point of a sweep shares: inputs (batch, heads, n, d_model / heads) of `dtype` on
    `device`, drawn from `seed`; bidirectional or causal. `mode`: the forward pass, forward and backward, or
    "generate": one new token's step against the cache of n tokens (generation.step; causal whatever `causal`
    says)."""

    batch: int = 1
    heads: int = 8
    d_model: int = 512
    dtype: str = "float32"
    device: str = "cpu"
    mode: str = "forward"
    causal: bool = False
    seed: int = 0

    @property
    def head_dim(self) -> int:
        return self.d_model // self.heads

    @property
    def is_causal(self) -> bool:
        """Whether each token sees only those before it: `causal`, or generating (a new token has no future)."""
        return self.causal or self.mode == "generate"

    def shape(self, n: int) -> Shape:
        """The Shape of one self-attention call over n tokens (generating: the context of n tokens)."""
        return Shape(self.batch, self.heads, n, n, self.head_dim, dtype=self.dtype, causal=self.is_causal)

    def problems(self) -> list[str]:
        """Every reason these inputs cannot be built, each a sentence saying what to change; [] when they can."""
        found = [f"{name} must be a positive integer below 2**40, got {getattr(self, name)!r}"
                 for name in ("batch", "heads", "d_model") if not _is_count(getattr(self, name))]
        if not found and self.d_model % self.heads:
            found.append(f"d_model {self.d_model} is not divisible by {self.heads} heads; choose a multiple of "
                         f"{self.heads}")
        if self.mode not in MODES:
            found.append(f"mode {self.mode!r} is unknown; choose {' or '.join(MODES)}")
        try:
            device = env.resolve_device(self.device)
        except ValueError as e:
            return found + [str(e)]
        if self.dtype not in DTYPE_BYTES or self.dtype not in env.supported_dtypes(device):
            choices = ", ".join(env.supported_dtypes(device))
            found.append(f"dtype {self.dtype!r} is not supported on {device}; choose {choices}")
        if not (_is_int(self.seed) and 0 <= self.seed <= MAX_SEED):
            found.append(f"seed must be an integer from 0 to 2**63 - 1, got {self.seed!r}")
        return found


@dataclass(frozen=True, kw_only=True)
class Case:
    """What is measured: one mechanism with its parameters at one length n of a problem."""

    mechanism: str
    params: tuple[tuple[str, Any], ...]
    n: int
    problem: Problem

    @property
    def shape(self) -> Shape:
        return self.problem.shape(self.n)

    def describe(self) -> str:
        extra = "".join(f", {k}={v}" for k, v in self.params)
        return f"{self.mechanism}{extra} at n = {self.n}"


@dataclass(frozen=True, kw_only=True)
class Settings:
    """How a point is measured. Timing: `warmup` untimed calls, then samples until `min_repeats` and `min_time_s` are
    both reached; a point that takes longer than `point_budget_s` ends its mechanism's sweep (larger n are skipped).
    Memory: a separate profiled call (`measure_memory`); a point whose predicted need × (1 + `memory_margin`)
    exceeds the free memory (capped at `memory_limit_bytes` when set) is skipped. `threads`: torch CPU threads
    (None: torch's default)."""

    warmup: int = 1
    min_repeats: int = 5
    min_time_s: float = 0.2
    point_budget_s: float = 30.0
    measure_memory: bool = True
    memory_margin: float = 0.2
    memory_limit_bytes: int | None = None
    threads: int | None = None

    def problems(self) -> list[str]:
        """Every setting that cannot be used, each a sentence saying what to change; [] when all can."""
        rules = (
            (_is_int(self.warmup) and self.warmup >= 1,
             f"warmup must be at least 1 (the first call is cold), got {self.warmup!r}"),
            (_is_int(self.min_repeats) and self.min_repeats >= 1,
             f"min_repeats must be at least 1, got {self.min_repeats!r}"),
            (_is_number(self.min_time_s) and self.min_time_s >= 0,
             f"min_time_s must be 0 or more seconds, got {self.min_time_s!r}"),
            (_is_number(self.point_budget_s) and self.point_budget_s > 0,
             f"point_budget_s must be a positive number of seconds, got {self.point_budget_s!r}"),
            (_is_number(self.memory_margin) and 0 <= self.memory_margin <= 10,
             f"memory_margin must be between 0 and 10 (a fraction: 0.2 = 20%), got {self.memory_margin!r}"),
            (self.threads is None or (_is_int(self.threads) and 1 <= self.threads <= MAX_THREADS),
             f"threads must be from 1 to {MAX_THREADS} (4 × this machine's {os.cpu_count() or 1} cores) or empty "
             f"for torch's default, got {self.threads!r}"),
            (self.memory_limit_bytes is None or (_is_int(self.memory_limit_bytes)
                                                 and 0 < self.memory_limit_bytes < 2**63),
             f"memory_limit_bytes must be a positive integer below 2**63 or empty, got {self.memory_limit_bytes!r}"),
        )
        return [message for ok, message in rules if not ok]


def _is_int(x: Any) -> bool:
    return isinstance(x, int) and not isinstance(x, bool)


def _is_count(x: Any) -> bool:
    return _is_int(x) and 1 <= x < MAX_COUNT


def _is_number(x: Any) -> bool:
    """A finite int or float (not a bool): infinity or NaN as a time or margin would never end or never compare."""
    return isinstance(x, (int, float)) and not isinstance(x, bool) and math.isfinite(x)


def resolve_mechanisms(extra: tuple[str, ...] = ()) -> dict[str, MechanismSpec]:
    """The catalogue as it is now plus mechanisms of your own, named as importable 'module:attribute' references to
    a MechanismSpec or to a dict or list of them (mechanisms.load, remembered per reference). ValueError with a
    sentence for a reference that does not resolve."""
    return {**MECHANISMS, **_loaded(extra)}


@functools.lru_cache(maxsize=32)
def _loaded(extra: tuple[str, ...]) -> dict[str, MechanismSpec]:
    return load(extra)


def format_bytes(n: float) -> str:
    """'34.0 GiB', '512.0 MiB', '3.0 KiB', '12 B'."""
    for unit, size in (("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if abs(n) >= size:
            return f"{n / size:.1f} {unit}"
    return f"{n:.0f} B"


def generation_problem(spec: MechanismSpec) -> str | None:
    """Why mechanism `spec` cannot be measured generating (a sentence saying what to change), or None when it can."""
    if spec.supports.generation is not None:
        return None
    why = spec.supports.no_generation or "Its spec gives no generation form."
    return f"{spec.label} cannot generate token by token. {why} Leave it out, or choose the forward mode."


def theory(spec: MechanismSpec, case: Case) -> tuple[float, float, float]:
    """(useful FLOPs of the measured call, executed FLOPs, the spec's predicted forward peak bytes); FLOPs ×3 for
    forward+backward. Generating: a step's FLOPs (both) and the bytes of the cache of n tokens (NaN where the
    mechanism cannot generate)."""
    params = spec.resolved(dict(case.params))
    if case.problem.mode == "generate":
        gen = spec.supports.generation
        if gen is None:
            return math.nan, math.nan, math.nan
        step = gen.flops(case.shape, **params)
        return step, step, float(gen.cache_bytes(case.shape, **params))
    factor = BACKWARD_FLOP_FACTOR if case.problem.mode == "forward+backward" else 1
    return (factor * float(spec.cost.flops(case.shape, **params)),
            factor * float(spec.cost.executed(case.shape, **params)),
            float(spec.cost.memory_bytes(case.shape, **params)))


def required_bytes(spec: MechanismSpec, case: Case) -> float:
    """Bytes a point needs, for the guard: q, k, v plus the spec's forward peak. Forward+backward: autograd keeps the
    forward's intermediates, the backward builds their gradients (about as large again) and q, k, v's gradients
    and the output's gradient, so 3 × the forward peak + 2 × the inputs. Generating: the prompt's q, k, v and the
    cache built from them. Mechanism state (projections) is small and not counted."""
    forward = theory(spec, case)[2]
    inputs = case.shape.input_bytes
    if case.problem.mode == "forward+backward":
        return inputs + 3 * forward + 2 * inputs
    return inputs + forward


def guard(spec: MechanismSpec, case: Case, settings: Settings) -> str | None:
    """A reason to skip the point when its predicted need, with the safety margin, exceeds the free memory."""
    need = required_bytes(spec, case) * (1 + settings.memory_margin)
    free = env.free_memory_bytes(case.problem.device)
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
    flops, executed, predicted = theory(spec, case)
    nan, p = float("nan"), case.problem
    row = {"mechanism": case.mechanism, "label": spec.label, "exact": spec.exact,
           "params": json.dumps(spec.resolved(dict(case.params)), sort_keys=True), "n": case.n,
           "batch": p.batch, "heads": p.heads, "d_model": p.d_model, "head_dim": p.head_dim, "dtype": p.dtype,
           "device": p.device, "mode": p.mode, "causal": p.is_causal,
           "status": status, "reason": reason, "time_median_s": nan, "time_iqr_s": nan, "time_samples": [],
           "repeats": 0, "peak_bytes": nan, "memory_method": "", "predicted_bytes": predicted,
           "theory_flops": flops, "executed_flops": executed, "gflops": nan, "device_gflops": nan,
           "pct_of_device": nan, "sdpa_backend": "", "threads": nan, "foreign_cpu": nan,
           "load_average": nan, "disturbed": False, "retaken": 0}
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
    p = case.problem
    g = torch.Generator().manual_seed(p.seed)
    return tuple(torch.randn(p.batch, p.heads, case.n, p.head_dim, generator=g).to(p.device, getattr(torch, p.dtype))
                 for _ in range(3))


def make_state(spec: MechanismSpec, case: Case) -> dict:
    """The mechanism's seeded random state, built outside the timed region (attn_core.make_state, by spec)."""
    if spec.state.init is None:
        return {}
    p = case.problem
    return spec.state.init(case.shape, p.device, getattr(torch, p.dtype), seed=p.seed,
                           **spec.resolved(dict(case.params)))


def call_of(spec: MechanismSpec, case: Case, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
            state: dict) -> Callable[[], Any]:
    """The thunk that is timed: the forward call, or forward then the gradients of q, k and v."""
    kwargs = {**dict(case.params), **state}
    if case.problem.mode == "forward":
        return lambda: spec.fn(q, k, v, causal=case.problem.causal, **kwargs)
    q, k, v = (t.requires_grad_(True) for t in (q, k, v))
    grad_out = torch.randn_like(q)  # the output has q's shape
    return lambda: torch.autograd.grad(spec.fn(q, k, v, causal=case.problem.causal, **kwargs), (q, k, v), grad_out)


@dataclass(frozen=True)
class Timing:
    """The timed samples of one point: `samples` (seconds per call) that the median is taken from, the seconds
    spent in all, what other programs did during those samples (`contention`), how many samples were taken again
    because another program took CPU from them (`retaken`), whether the point stayed disturbed after the
    bounded retakes (then `samples` holds every sample, disturbed ones included), and the seconds it waited for its
    turn or for quiet (`waited_s`, part of `spent_s`; not counted against the point's budget)."""

    samples: list[float]
    spent_s: float
    contention: env.Contention = env.Contention()
    retaken: int = 0
    disturbed: bool = False
    waited_s: float = 0.0


MAX_RETAKES = 20  # disturbed samples taken again per point, at most ...
RETAKE_S = 1.0  # ... and at most this many seconds (or the clean samples' own time, if longer) spent on them
QUIET_STEP_S, QUIET_WAIT_S = 0.025, 0.5  # after two disturbed samples in a row: a quiet 25 ms, waited 0.5 s at most
HOLD_MAX_S = 3.0  # the longest a hold (a page is drawing) keeps one sample waiting ...
AFTER_HOLD_QUIET_S, AFTER_HOLD_WAIT_S = 0.1, 1.0  # ... then 0.1 s of quiet (the browser drew), waited 1 s at most
BUSY_OTHERS = 0.5  # threads or cores of other programs beyond the spare ones that make a moment not quiet


def wait_for_quiet(probe: env.ContentionProbe, threads: int, quiet_s: float = QUIET_STEP_S,
                   max_s: float = QUIET_WAIT_S) -> None:
    """Sleep until other programs have kept fewer than half a thread running beyond the spare cores for `quiet_s`
    in a row (checked every QUIET_STEP_S; env.ContentionProbe.others_runnable, else CPU times), at most `max_s`: a
    browser drawing a chart, a page's script run."""
    deadline, calm = time.perf_counter() + max_s, 0.0
    while time.perf_counter() < deadline and calm < quiet_s:
        began, mark = time.perf_counter(), probe.mark()
        others = probe.others_runnable(QUIET_STEP_S)
        if others is None:
            others = probe.since(mark).foreign_cores
        calm = 0.0 if busy(others, threads) else calm + time.perf_counter() - began


def busy(others: float, threads: int) -> bool:
    """Whether other programs, keeping `others` threads running (or using that many cores), leave this process's
    `threads` less than the machine: half a core or more beyond the spare ones."""
    return others >= env.spare_cores(threads) + BUSY_OTHERS


@dataclass(frozen=True)
class Turns:
    """How timed samples take turns with a page drawing beside them (worker.hold). `claim()` before a sample: True
    when it may start now, False while the page holds the machine; `release()` after it, so a page waiting for the
    sample in flight to end may go on."""

    claim: Callable[[], bool] = lambda: True
    release: Callable[[], None] = lambda: None


def take_turn(probe: env.ContentionProbe, threads: int, crowded: bool, turns: Turns,
              cancelled: Callable[[], bool]) -> float:
    """Wait until a timed sample may start, and claim it: while the page holds the machine (HOLD_MAX_S at most, so
    a page that never lets go cannot stall a sweep), then for AFTER_HOLD_QUIET_S of quiet (the browser draws what
    it was sent); when other programs `crowded` it just before, for a short quiet moment. The seconds waited."""
    began, drew = time.perf_counter(), False
    while time.perf_counter() - began < HOLD_MAX_S and not cancelled():
        if not turns.claim():
            drew = True
            time.sleep(QUIET_STEP_S / 5)
            continue
        if not (drew or crowded):
            break
        turns.release()  # the page may draw while this waits for quiet
        wait_for_quiet(probe, threads, *((AFTER_HOLD_QUIET_S, AFTER_HOLD_WAIT_S) if drew else (QUIET_STEP_S,
                                                                                             QUIET_WAIT_S)))
        drew = crowded = False
    return time.perf_counter() - began


def time_samples(thunk: Callable[[], Any], device: str, settings: Settings,
                 cancelled: Callable[[], bool] = lambda: False, probe: env.ContentionProbe | None = None,
                 first_call_s: float | None = None, turns: Turns = Turns()) -> Timing:
    """Seconds per call, one sample per block of back-to-back calls: `warmup` untimed calls, then samples until
    both `min_repeats` clean samples and `min_time_s` of them are reached, or the point's `point_budget_s` is spent
    (≥ 1 sample). Each sample takes its turn (take_turn): none starts while the caller's page draws, and after a
    busy warm-up or two disturbed samples in a row it waits for a quiet moment. A sample during which another
    program took CPU from this process anyway (env.Contention.disturbed) is set aside and taken again, at most
    MAX_RETAKES times and RETAKE_S seconds; a point still short of clean samples then is `disturbed`.
    `first_call_s`: the thunk already ran once, taking that long (it counts as a warm-up call). Waits do not count
    towards the budget. Raises Cancelled when `cancelled()` turns true."""
    timed, threads = env.device_timer(device), torch.get_num_threads()
    probe = probe or env.ContentionProbe()
    start, one, warm = time.perf_counter(), first_call_s or 0.0, probe.mark()
    for _ in range(settings.warmup - (first_call_s is not None)):
        if cancelled():
            raise Cancelled
        one = timed(thunk, 1)
    crowded = busy(probe.since(warm).foreign_cores, threads)
    probe.refresh()  # the warm-up may have started the thread pool
    calls = max(1, min(MAX_CALLS_PER_SAMPLE, math.ceil(MIN_SAMPLE_S / max(one, 1e-9))))
    kept: list[tuple[float, env.Contention]] = []
    set_aside: list[tuple[float, env.Contention]] = []
    spent = retake_s = waited = 0.0
    last_hit = False
    while len(kept) + len(set_aside) < MAX_SAMPLES:
        if cancelled():
            raise Cancelled
        waited += take_turn(probe, threads, crowded, turns, cancelled)
        try:
            mark = probe.mark()
            t = timed(thunk, calls)
            seen = probe.since(mark)
        finally:
            turns.release()
        over = time.perf_counter() - start - waited > settings.point_budget_s
        may_retake = len(set_aside) < MAX_RETAKES and retake_s < max(RETAKE_S, spent) and not over
        hit = seen.disturbed(threads)
        crowded, last_hit = hit and last_hit, hit  # a blip passes by itself; after two in a row, wait for quiet
        if hit and may_retake:
            set_aside.append((t / calls, seen))
            retake_s += t
            continue
        kept.append((t / calls, seen))
        spent += t
        if over or (len(kept) >= settings.min_repeats and spent >= settings.min_time_s):
            break
    clean = [(t, c) for t, c in kept if not c.disturbed(threads)]
    disturbed = len(clean) < min(settings.min_repeats, len(kept))
    used = kept + set_aside if disturbed else kept
    total = sum((c for _, c in used), env.Contention(0.0, 0.0, 0.0))
    return Timing([t for t, _ in used], time.perf_counter() - start, total, len(set_aside), disturbed, waited)


def measure_case(spec: MechanismSpec, case: Case, settings: Settings, cancelled: Callable[[], bool] = lambda: False,
                 turns: Turns = Turns()) -> tuple[dict, float]:
    """Measure one point; (row, seconds it took). Statuses: ok; skipped by the memory guard; oom on an allocator
    failure; failed on any other exception (its message is the reason); cancelled. Time and memory come from
    separate runs, so profiling never inflates a time."""
    start = time.perf_counter()
    try:
        if case.problem.mode == "generate" and (why := generation_problem(spec)):
            return make_row(spec, case, "skipped", why), 0.0
        spec.check(case.shape, dict(case.params))
        reason = guard(spec, case, settings)
        if reason:
            return make_row(spec, case, "skipped", reason, threads=torch.get_num_threads()), 0.0
        row, waited = _measured(spec, case, settings, cancelled, turns)
        return row, time.perf_counter() - start - waited  # waits for quiet do not count against the budget
    except Cancelled:
        return make_row(spec, case, "cancelled", "cancelled while this point was measured"), 0.0
    except Exception as e:  # a mechanism's failure is a result, not a crash of the sweep
        status = "oom" if is_oom(e) else "failed"
        message = str(e).strip().splitlines()[0] if str(e).strip() else ""
        reason = f"out of memory: {message}" if status == "oom" else f"{type(e).__name__}: {message}"
        return make_row(spec, case, status, reason[:500]), time.perf_counter() - start
    finally:
        env.release_cached_memory(case.problem.device)


def step_call(spec: MechanismSpec, case: Case, state: dict) -> tuple[Callable[[], Any], Any]:
    """(the thunk that is timed when generating, the cache it steps): the cache of n seeded prompt tokens
    (generation.remember: the prompt's own attention is not the point, and would cost O(n²) for softmax), with room
    for one more; the thunk takes one seeded new token's step against it and rewinds it to n tokens, so every timed
    step sees a context of exactly n (Cache.rewind: positions only)."""
    p, gen = case.problem, spec.supports.generation
    _, k, v = make_inputs(case)
    cache = gen.remember(k, v, max_len=case.n + 1, **spec.resolved(dict(case.params)), **state)
    del k, v
    g = torch.Generator().manual_seed((p.seed + 1) % (MAX_SEED + 1))
    token = [torch.randn(p.batch, p.heads, 1, p.head_dim, generator=g).to(p.device, getattr(torch, p.dtype))
             for _ in range(3)]
    mark = cache.mark()

    def one_step() -> torch.Tensor:
        out, _ = gen.step(*token, cache)
        cache.rewind(mark)
        return out
    return one_step, cache


def _measured(spec: MechanismSpec, case: Case, settings: Settings, cancelled: Callable[[], bool],
              turns: Turns) -> tuple[dict, float]:
    state = make_state(spec, case)
    peak, method, first_call_s = float("nan"), "", None
    generating = case.problem.mode == "generate"
    if not generating:
        q, k, v = make_inputs(case)
        checked_shape(spec, q, k, v, case.problem.causal, **dict(case.params))  # once: no timed call checks again
        thunk = call_of(spec, case, q, k, v, state)
    with torch.inference_mode(case.problem.mode != "forward+backward"), validated():
        if generating:  # checked by spec.check in measure_case; the cache's tensors made in inference mode
            thunk, cache = step_call(spec, case, state)
            if settings.measure_memory:  # what the cache holds, read from its tensors: exact, no profiler needed
                method, peak = "cache tensors held (exact)", float(cache.used_bytes)
        if settings.measure_memory and case.problem.device == "cpu" and not generating:
            # On CPU the profiled call is the first warm-up: the allocator sees the same blocks in every call, and
            # a call of ≥ 50 ms needs no second warm-up (the profiler's own cost is then small beside it).
            began = time.perf_counter()
            method, peak = _peak(thunk, case.problem.device, cancelled)
            took = time.perf_counter() - began
            first_call_s = took if took >= 0.05 else None
        timing = time_samples(thunk, case.problem.device, settings, cancelled, first_call_s=first_call_s,
                              turns=turns)
        if settings.measure_memory and case.problem.device != "cpu" and not generating:  # GPUs: after timing
            if timing.spent_s - timing.waited_s <= settings.point_budget_s:
                method, peak = _peak(thunk, case.problem.device, cancelled)
            else:
                method = "not measured: the point's time budget was spent on timing"
    median, iqr = median_iqr(timing.samples)
    executed = theory(spec, case)[1]
    device_gflops = env.matmul_gflops(case.problem.device, case.problem.dtype)
    gflops = executed / median / 1e9
    backend = (sdpa_backend(q.detach(), k.detach(), v.detach(), causal=case.problem.causal)
               if spec.key == "sdpa" and not generating else "")
    seen = timing.contention
    return make_row(spec, case, "ok", time_median_s=median, time_iqr_s=iqr, time_samples=timing.samples,
                    repeats=len(timing.samples), peak_bytes=peak, memory_method=method, gflops=gflops,
                    device_gflops=device_gflops, pct_of_device=100.0 * gflops / device_gflops,
                    sdpa_backend=backend, threads=float(torch.get_num_threads()), foreign_cpu=seen.foreign_cores,
                    load_average=env.load_average() or float("nan"), disturbed=timing.disturbed,
                    retaken=timing.retaken), timing.waited_s


def _peak(thunk: Callable[[], Any], device: str, cancelled: Callable[[], bool]) -> tuple[str, float]:
    """(method, peak bytes of one call above what existed before it), from a clean allocator."""
    if cancelled():
        raise Cancelled
    env.release_cached_memory(device)
    method, probe = env.peak_memory_probe(device)
    return method, float(probe(thunk))
