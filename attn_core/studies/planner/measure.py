"""The planner measured, not only computed: each layer kind of a model timed here with the engine (a causal prefill
at a few n, one decode step at a few contexts) on about 4 heads (a whole layer of 32 or 128 would fit neither the
budget nor, at long contexts, the machine), and the whole model's prefill time and decode tokens per second
predicted from those times; then the prediction's own check, a scaled-down stack of the model's kinds run for real
against what was predicted for it.

A kind's time is read as t = a + b · F: F the FLOPs the kernel executes (the spec's `cost.executed` of a causal
prefill, `Generation.flops` of a decode step), a ≥ 0 a fixed cost per call, b seconds per FLOP, fitted by least
squares to the kind's longest measured points. The full layer's time is that line at the full layer's F (all its
heads, the batch, the plan's context): "extrapolated along the spec's FLOPs". Attention only, as in the plan:
projections, MLPs and weights are left out.

    timings = measure_kinds(find("llama-3-8b"), budget_s=10)
    predict(plan(find("llama-3-8b"), 32768), timings).tokens_per_s

The roofline's own check (roofline_check.py): the scaled-down stack with an MLP of the model's shape beside each
layer, run here, against the roofline on this machine as measured, as predicted ÷ measured (`check_roofline`).

Here: a model's kinds measured. timing.py: a kind's points, their fit and the timed calls; predict.py: the
prediction and the stack check; roofline_check.py: the roofline's. Their public names are re-exported here.
"""
from __future__ import annotations

import dataclasses
import time
from typing import Any, Callable, Sequence

import torch

from attn_core.engine import env
from attn_core.engine.measurement import theory_of
from attn_core.engine.problem import MAX_THREADS
from attn_core.mechanisms import MEASURED
from attn_core.studies.planner.model import Layer, Model
from attn_core.studies.planner.predict import (KindPrediction, Prediction, StackCheck, check_stack,  # noqa: F401
                                               decode_curves, full_flops, predict, stack_model, stack_order)
from attn_core.studies.planner.roofline_check import (MlpShape, RooflineCheck, check_roofline,  # noqa: F401
                                                      mlp_shape, scaled_stack)
from attn_core.studies.planner.timing import (DECODE_NS, FIT_POINTS, GUARD, MAX_BUDGET_S, MEASURED_HEADS,  # noqa: F401
                                              MODES, PREFILL_NS, REPEATS, STACK_LAYERS, Fit, KindTiming, Point,
                                              Timings, fit, problem_of, same_kind, scaled, threads_text, timed)


def joined(timings: Timings, more: Timings) -> Timings:
    """`timings` with the kinds of `more` beside its own, to predict a model that mixes kinds timed apart (a hybrid
    of the model and another kind); its model stays `timings.model` (a stack check runs that one). ValueError when
    the two were timed on another device, dtype or number of threads."""
    if (more.device, more.dtype, more.threads) != (timings.device, timings.dtype, timings.threads):
        raise ValueError(f"the kinds were timed apart on {more.device} in {more.dtype} "
                         f"({threads_text(more.threads)}) and on {timings.device} in {timings.dtype} "
                         f"({threads_text(timings.threads)}); time them alike")
    return dataclasses.replace(timings, kinds=timings.kinds + more.kinds, spent_s=timings.spent_s + more.spent_s)


def measure_hybrid(model: Model, hybrid: Model, *, budget_s: float = 10.0,
                   **options: Any) -> tuple[Timings, Timings]:
    """`model`'s kinds timed (`measure_kinds`, `options` passed on) and the kinds of `hybrid` that `model` lacks (the
    kind its layers turn into) timed apart, `budget_s` shared by all the kinds: (the model's timings, those joined
    with the new kinds', to predict the hybrid at any share; the model's own when it adds no kind)."""
    if isinstance(budget_s, bool) or not isinstance(budget_s, (int, float)):
        raise ValueError(f"budget_s must be a number of seconds above 0 and at most {MAX_BUDGET_S:g}, got "
                         f"{budget_s!r}")
    new = tuple(layer for layer in hybrid.layers if not any(same_kind(layer, k) for k in model.layers))
    share = budget_s / (len(model.layers) + len(new))
    timings = measure_kinds(model, budget_s=share * len(model.layers), **options)
    if not new:
        return timings, timings
    more = measure_kinds(dataclasses.replace(hybrid, name=f"{hybrid.name[:50]}, its new kinds", layers=new),
                         budget_s=share * len(new), **options)
    return timings, joined(timings, more)


def measure_kinds(model: Model, *, budget_s: float = 10.0, device: str = "cpu", dtype: str | None = None,
                  heads: int = MEASURED_HEADS, prefill_ns: Sequence[int] = PREFILL_NS,
                  decode_ns: Sequence[int] = DECODE_NS, repeats: int = REPEATS, threads: int | None = 1,
                  progress: Callable[[str], None] | None = None) -> Timings:
    """Time each kind of `model` here (in this process, the engine's own calls: `timed`): a causal prefill at each
    of `prefill_ns` and a decode step at each context of `decode_ns`, ascending, on `scaled(layer, heads)`. Each
    kind and mode gets an equal share of `budget_s`; a series stops when its next point, as the points so far
    predict it, would overrun that share (one point is always taken), or when a point is skipped or fails (said in
    the kind's notes). `dtype`: None takes float32 on CPU (the dtype every kernel runs fast in there), the model's
    elsewhere. `threads`: torch's CPU threads while timing (None: as they are); `repeats`: samples a point.
    ValueError with a sentence for a budget, device or size that cannot be used."""
    device, dtype = _checked(model, budget_s, device, dtype, heads, prefill_ns, decode_ns)
    for name, value, high in (("repeats", repeats, 100), ("threads", threads, MAX_THREADS)):
        if (value is not None or name == "repeats") and (isinstance(value, bool) or not isinstance(value, int)
                                                         or not 1 <= value <= high):
            raise ValueError(f"{name} must be a whole number from 1 to {high}, got {value!r}")
    began, share = time.perf_counter(), budget_s / (2 * len(model.layers))
    with env.cpu_threads(threads if device == "cpu" else None):
        kinds = [_kind(layer, heads, prefill_ns, decode_ns, share, device, dtype, repeats, progress)
                 for layer in model.layers]
    return Timings(model, device, dtype, tuple(kinds), time.perf_counter() - began, env.load_average(),
                   torch.get_numthreads_text() if threads is None or device != "cpu" else threads)


def _kind(layer: Layer, heads: int, prefill_ns: Sequence[int], decode_ns: Sequence[int], share: float, device: str,
          dtype: str, repeats: int, progress: Callable[[str], None] | None) -> KindTiming:
    """One kind timed: its prefill and decode series on `scaled(layer, heads)`."""
    small = scaled(layer, heads)
    notes = [] if small == layer else [f"{layer.name}: timed on {small.heads} of its {layer.heads} heads"
                                       + (f" ({small.kv_heads} of {layer.kv_heads} key/value heads)"
                                          if layer.kv_heads else "")]
    if layer.state_width != layer.head_dim:
        notes.append(f"{layer.name}: timed at the {layer.mechanism} kernel's own state, {layer.head_dim} × "
                     f"{layer.head_dim} a head, not the model's {layer.head_dim} × {layer.state_width}, and predicted "
                     "along that kernel's FLOPs")
    series = {}
    for mode, ns in (("prefill", prefill_ns), ("decode", decode_ns)):
        if progress:
            progress(f"{layer.name}: {mode}")
        series[mode], said = _series(small, mode, sorted(set(ns)), share, device, dtype, repeats)
        notes += [f"{layer.name}, {mode}: {s}" for s in said]
    return KindTiming(layer, small, series["prefill"], series["decode"], tuple(notes))


def _series(layer: Layer, mode: str, ns: list[int], share_s: float, device: str, dtype: str,
            repeats: int) -> tuple[tuple[Point, ...], list[str]]:
    spec = MEASURED[layer.prefill_mechanism or layer.mechanism if mode == "prefill" else layer.mechanism]
    points, said, spent = [], [], 0.0
    for n in ns:
        problem = problem_of(layer, mode, n, device=device, dtype=dtype)
        flops = theory_of(spec, problem).executed_flops
        if points:  # the next point's cost: warm-up and samples, at the time the points so far predict
            if spent + (2 + repeats) * fit(points).at(flops) > share_s:
                said.append(f"stopped before n = {n:,}: its budget share of {share_s:.1f} s would be spent")
                break
        began = time.perf_counter()
        seconds, why = timed([problem], repeats)
        spent += time.perf_counter() - began
        if why:
            said.append(f"n = {n:,} not timed: {why}")
            break
        points.append(Point(mode, n, flops, seconds))
    return tuple(points), said


def _checked(model: Model, budget_s: Any, device: str, dtype: str | None, heads: Any, prefill_ns: Sequence[int],
             decode_ns: Sequence[int]) -> tuple[str, str]:
    """(the device resolved, the dtype to time in); ValueError with a sentence per argument that cannot be used."""
    found = list(model.problems())
    if isinstance(budget_s, bool) or not isinstance(budget_s, (int, float)) or not 0 < budget_s <= MAX_BUDGET_S:
        found.append(f"budget_s must be a number of seconds above 0 and at most {MAX_BUDGET_S:g}, got {budget_s!r}")
    if isinstance(heads, bool) or not isinstance(heads, int) or not 1 <= heads <= 1024:
        found.append(f"heads must be a whole number from 1 to 1,024, got {heads!r}")
    for name, ns in (("prefill_ns", prefill_ns), ("decode_ns", decode_ns)):
        if not ns or any(isinstance(n, bool) or not isinstance(n, int) or not 1 <= n <= 1 << 20 for n in ns):
            found.append(f"{name} must list lengths, each a whole number from 1 to 1,048,576")
    try:
        device = env.resolve_device(device)
    except ValueError as e:
        raise ValueError("; ".join([*found, str(e)])) from None
    dtype = ("float32" if device == "cpu" else model.dtype) if dtype is None else dtype
    if dtype not in env.supported_dtypes(device):
        found.append(f"dtype {str(dtype)[:20]!r} is not one {device} runs; choose "
                     f"{', '.join(env.supported_dtypes(device))}")
    if found:
        raise ValueError("; ".join(found))
    return device, dtype
