"""One point: the memory guard, the seeded inputs and state, the timed call, and its peak memory, measured into a
Measurement; a failure becomes a status, never a crash (the timing loop: timing.py)."""
from __future__ import annotations

import dataclasses
import functools
import math
import time
from typing import Any, Callable

import torch

from . import env, positions
from attn_core.mechanisms import flex
from attn_core.mechanisms.flex import OneTime
from ..mechanisms import MEASURED, load
from attn_core.positions.rope import rotate as rope
from ..mechanisms._common import checked_shape, validated
from ..mechanisms.sdpa import sdpa_backend
from .measurement import Conditions, Measurement, Summary, theory_of, unmeasured
from .problem import MAX_SEED, Problem, Settings
from .timing import Cancelled, Turns, time_samples
from ..spec import MechanismSpec


def resolve_mechanisms(extra: tuple[str, ...] = ()) -> dict[str, MechanismSpec]:
    """The catalogue as it is now (multi-head latent attention's cores included) plus mechanisms of your own, named
    as importable 'module:attribute' references to a MechanismSpec or to a dict or list of them (mechanisms.load,
    remembered per reference). ValueError with a sentence for a reference that does not resolve."""
    return {**MEASURED, **_loaded(extra)}


@functools.lru_cache(maxsize=32)
def _loaded(extra: tuple[str, ...]) -> dict[str, MechanismSpec]:
    return load(extra)


def format_bytes(n: float) -> str:
    """'34.0 GiB', '512.0 MiB', '3.0 KiB', '12 B'."""
    for unit, size in (("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if abs(n) >= size:
            return f"{n / size:.1f} {unit}"
    return f"{n:.0f} B"


def required_bytes(spec: MechanismSpec, problem: Problem) -> float:
    """Bytes a point needs, for the guard: q, k, v plus the spec's forward peak. Forward+backward: autograd keeps the
    forward's intermediates, the backward builds their gradients (about as large again) and q, k, v's gradients
    and the output's gradient, so 3 × the forward peak + 2 × the inputs. Generating: the prompt's q, k, v and the
    cache built from them. Mechanism state (projections) is small and not counted."""
    forward = theory_of(spec, problem).predicted_bytes
    inputs = input_bytes(spec, problem)
    if problem.mode == "forward+backward":
        return inputs + 3 * forward + 2 * inputs
    return inputs + forward


def guard(spec: MechanismSpec, problem: Problem, settings: Settings) -> str | None:
    """A reason to skip the point when its predicted need, with the safety margin, exceeds the free memory."""
    need = required_bytes(spec, problem) * (1 + settings.memory_margin)
    free = env.free_memory_bytes(problem.device)
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


def operands(spec: MechanismSpec, problem: Problem) -> tuple[torch.Tensor, ...]:
    """The seeded tensors of one call: q, k and v (Problem.inputs), or those of a spec with its own operands."""
    if spec.operands is None:
        return problem.inputs()
    return spec.operands.draw(problem.shape, problem.device, getattr(torch, problem.dtype), seed=problem.seed,
                              **spec.resolved(problem.kwargs))


def input_bytes(spec: MechanismSpec, problem: Problem) -> float:
    """Bytes of those tensors, and of ALiBi's bias (built outside the call)."""
    if spec.operands is None:
        return problem.shape.input_bytes + positions.input_bytes(problem.shape, problem.positions)
    return spec.operands.nbytes(problem.shape, **spec.resolved(problem.kwargs))


def make_state(spec: MechanismSpec, problem: Problem) -> dict:
    """The mechanism's seeded random state, built outside the timed region (attn_core.make_state, by spec)."""
    if spec.state.init is None:
        return {}
    return spec.state.init(problem.shape, problem.device, getattr(torch, problem.dtype), seed=problem.seed,
                                 **spec.resolved(problem.kwargs))


def call_of(spec: MechanismSpec, problem: Problem, *tensors: torch.Tensor, state: dict) -> Callable[[], Any]:
    """The thunk that is timed: the forward call on `tensors` (q, k, v, or the spec's operands), or forward then
    the gradients of every one of them. With RoPE, q and k are turned inside it; ALiBi's bias is passed to it
    (both built here, outside: positions.METHOD)."""
    kwargs = {**problem.kwargs, **state}
    if (mask := problem.key_padding_mask()) is not None:
        kwargs["key_padding_mask"] = mask
    if (sinks := problem.sink_logits()) is not None:  # built outside the timed call, as a layer holds its own
        kwargs["sinks"] = sinks
    device, dtype = problem.device, getattr(torch, problem.dtype)
    if problem.positions == "alibi":
        kwargs["score_bias"] = positions.alibi(problem.heads, problem.n, problem.keys, device=device, dtype=dtype)
    turn = (positions.turner(problem.n, problem.keys, problem.head_dim, device=device, dtype=dtype)
            if problem.positions == "rope" else lambda *t: t)
    return _timed(lambda *t: spec.fn(*turn(*t), causal=problem.causal, **kwargs), problem, tensors)


def implemented_call(spec: MechanismSpec, problem: Problem, *tensors: torch.Tensor,
                     state: dict) -> tuple[Callable[[], Any], float]:
    """(the thunk that is timed, seconds spent building its mask once) of a mechanism defined by a mask, run by
    the problem's implementation (compiled Flex, SDPA with a dense mask) under the mechanism's own pattern."""
    masking = flex.masking_of(spec.key, problem.causal, problem.kwargs, state, problem.key_padding_mask())
    forward, mask_s = flex.forward_of(problem.implementation, masking, problem.n, problem.keys, problem.batch,
                                      problem.device)
    return _timed(forward, problem, tensors), mask_s


def _timed(fn: Callable[..., torch.Tensor], problem: Problem, tensors: tuple[torch.Tensor, ...]) -> Callable[[], Any]:
    """fn on `tensors`, or fn then the gradients of every one of them."""
    if problem.mode == "forward":
        return lambda: fn(*tensors)
    tensors = tuple(t.requires_grad_(True) for t in tensors)
    grad_out = torch.randn_like(tensors[0])  # the output has q's shape
    # allow_unused: a mechanism may not read every operand (Reformer's keys are its queries)
    return lambda: torch.autograd.grad(fn(*tensors), tensors, grad_out, allow_unused=True)


def measure(spec: MechanismSpec, problem: Problem, settings: Settings, cancelled: Callable[[], bool] = lambda: False,
            turns: Turns = Turns(), wall_s: float = math.inf) -> tuple[Measurement, float]:
    """Measure one point; (its Measurement, seconds it took). Statuses: ok; skipped (the problem cannot run, or the
    memory guard); oom on an allocator failure; failed on any other exception (its message is the reason);
    cancelled. Time and memory come from separate runs, so profiling never inflates a time. `wall_s`: the point's
    share of a demo's wall-clock budget, waits included; past it its samples are kept as they are (time_samples)."""
    start = time.perf_counter()
    try:
        if why := problem.spec_problems(spec):  # a generation it has no form for is skipped; the rest fail
            if problem.mode == "generate" and spec.supports.generation is None:
                return unmeasured(spec, problem, "skipped", why[0]), 0.0
            raise ValueError(why[0])
        reason = guard(spec, problem, settings)
        if reason:
            return unmeasured(spec, problem, "skipped", reason, threads=torch.get_num_threads()), 0.0
        point, waited = _measured(spec, problem, settings, cancelled, turns, start + wall_s)
        once = sum(s for s in (point.one_time.compile_s, point.one_time.mask_s) if not math.isnan(s))
        # neither waits for quiet nor one-time costs (a compile, a block mask) count against the budget
        return point, time.perf_counter() - start - waited - once
    except Cancelled:
        return unmeasured(spec, problem, "cancelled", "cancelled while this point was measured"), 0.0
    except Exception as e:  # a mechanism's failure is a result, not a crash of the sweep
        status = "oom" if is_oom(e) else "failed"
        message = str(e).strip().splitlines()[0] if str(e).strip() else ""
        reason = f"out of memory: {message}" if status == "oom" else f"{type(e).__name__}: {message}"
        return unmeasured(spec, problem, status, reason[:500]), time.perf_counter() - start
    finally:
        env.release_cached_memory(problem.device)


def step_call(spec: MechanismSpec, problem: Problem, state: dict) -> tuple[Callable[[], Any], Any]:
    """(the thunk that is timed when generating, the cache it steps): the cache of n seeded prompt tokens
    (generation.remember: the prompt's own attention is not the point, and would cost O(n²) for softmax), with room
    for one more; the thunk takes one seeded new token's step against it and rewinds it to n tokens, so every timed
    step sees a context of exactly n (Cache.rewind: positions only). RoPE: positions.METHOD."""
    gen = spec.supports.generation
    queries = 1 if spec.operands is None else spec.operands.queries
    kept = operands(spec, problem)[queries:]  # k and v, or what the spec's cache holds
    turn = lambda *t: t  # noqa: E731
    if problem.positions == "rope":  # the cache holds keys turned at 0 … n − 1; the step turns its token at n
        kept = (rope(kept[0], torch.arange(problem.n, device=problem.device)), *kept[1:])
        turn = positions.turner(1, 1, problem.head_dim, device=problem.device, dtype=getattr(torch, problem.dtype),
                                first=problem.n)
    series = {"sinks": problem.sink_logits()} if problem.sinks else {}
    series |= {"keep_first": problem.keep_first} if problem.keep_first else {}  # StreamingLLM's first tokens
    cache = gen.remember(*kept, max_len=problem.n + 1, **spec.resolved(problem.kwargs), **state, **series)
    del kept
    token = operands(spec, dataclasses.replace(problem, n=1, n_kv=None, seed=(problem.seed + 1) % (MAX_SEED + 1)))
    mark = cache.mark()

    def one_step() -> torch.Tensor:
        out, _ = gen.step(*turn(*token), cache)
        cache.rewind(mark)
        return out
    return one_step, cache


def _measured(spec: MechanismSpec, problem: Problem, settings: Settings, cancelled: Callable[[], bool],
              turns: Turns, until: float = math.inf) -> tuple[Measurement, float]:
    state = make_state(spec, problem)
    peak, method, first_call_s = float("nan"), "", None
    generating, device = problem.mode == "generate", problem.device
    if not generating:
        tensors = operands(spec, problem)
        if spec.operands is None:
            checked_shape(spec, *tensors, problem.causal, **problem.kwargs)  # once: no timed call checks again
        if problem.implementation == "ours":
            thunk = call_of(spec, problem, *tensors, state=state)
        else:
            thunk, mask_s = implemented_call(spec, problem, *tensors, state=state)
    one_time = OneTime()
    with torch.inference_mode(problem.mode != "forward+backward"), validated():
        if problem.implementation != "ours" and not generating:  # paid once, before timing, and kept apart
            compile_s = flex.first_call(thunk)[1].compile_s if problem.implementation == "flex" else math.nan
            one_time = OneTime(mask_s, compile_s)
        if generating:  # checked by spec_problems in measure; the cache's tensors made in inference mode
            thunk, cache = step_call(spec, problem, state)
            if settings.measure_memory:  # what the cache holds, read from its tensors: exact, no profiler needed
                method, peak = "cache tensors held (exact)", float(cache.used_bytes)
        if settings.measure_memory and device == "cpu" and not generating:
            # On CPU the profiled call is the first warm-up: the allocator sees the same blocks in every call, and
            # a call of ≥ 50 ms needs no second warm-up (the profiler's own cost is then small beside it). A first
            # call that keeps memory once its result is dropped built something for every later call (a band's
            # (block, S) bias: 5% of block-local's peak at n = 1024), which is no call's steady state: the next
            # call is profiled instead.
            began = time.perf_counter()
            method, (peak, held) = env.MEMORY_METHODS["cpu"], _cpu_peak(thunk, cancelled)
            took = time.perf_counter() - began
            if held > 0:
                peak, _ = _cpu_peak(thunk, cancelled)
            first_call_s = took if took >= 0.05 else None
        timing = time_samples(thunk, device, settings, cancelled, first_call_s=first_call_s, turns=turns,
                              until=until)
        if settings.measure_memory and device != "cpu" and not generating:  # GPUs: after timing
            if timing.spent_s - timing.waited_s <= settings.point_budget_s:
                method, peak = _peak(thunk, device, cancelled)
            else:
                method = "not measured: the point's time budget was spent on timing"
    theory = theory_of(spec, problem)
    device_gflops = env.matmul_gflops(device, problem.dtype)
    backend = (sdpa_backend(*(t.detach() for t in tensors), causal=problem.causal)
               if spec.key == "sdpa" and not generating else "")
    seen = timing.contention
    conditions = Conditions(float(torch.get_num_threads()), device_gflops, backend, seen.foreign_cores,
                            env.load_average() or float("nan"), timing.disturbed, timing.retaken)
    return Measurement(problem, theory, "ok", samples=tuple(timing.samples),
                       summary=Summary.of(timing.samples, theory.executed_flops, device_gflops),
                       peak_bytes=peak, memory_method=method, conditions=conditions, one_time=one_time), timing.waited_s


def _cpu_peak(thunk: Callable[[], Any], cancelled: Callable[[], bool]) -> tuple[float, float]:
    """(peak bytes of one call above what existed before it, bytes it still holds after), from a clean allocator."""
    if cancelled():
        raise Cancelled
    env.release_cached_memory("cpu")
    peak, held = env.profiled_peak_held(thunk)
    return float(peak), float(held)


def _peak(thunk: Callable[[], Any], device: str, cancelled: Callable[[], bool]) -> tuple[str, float]:
    """(method, peak bytes of one call above what existed before it), from a clean allocator."""
    if cancelled():
        raise Cancelled
    env.release_cached_memory(device)
    method, probe = env.peak_memory_probe(device)
    return method, float(probe(thunk))
