"""The planner's prediction from measured kinds: each kind's fitted line read at the full layer's FLOPs, times its
count, summed; and the prediction's own check, a scaled-down stack of the model's kinds run for real."""
from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass
from typing import Any, Sequence

import pandas as pd

from attn_core.engine import env, measure
from attn_core.engine.measurement import theory_of
from attn_core.mechanisms import MEASURED
from attn_core.studies.planner.model import Layer, Model, Plan, plan
from attn_core.studies.planner.timing import (FIT_POINTS, GUARD, MAX_BUDGET_S, MODES, REPEATS, STACK_LAYERS, Fit,
                                              KindTiming, Timings, problem_of, threads_text, timed)

@dataclass(frozen=True)
class KindPrediction:
    """One kind's predicted seconds: a layer's causal prefill of the context and decode step at it, and how."""

    layer: Layer
    prefill_s: float
    decode_s: float
    prefill_method: str
    decode_method: str


@dataclass(frozen=True)
class Prediction:
    """The whole model's attention at `context` tokens of `batch` sequences, predicted from measured kinds: the
    prefill of the prompt (`prefill_s`), a decode step of every layer (`decode_s`), each with its method."""

    context: int
    batch: int
    kinds: tuple[KindPrediction, ...]
    prefill_method: str
    decode_method: str
    notes: tuple[str, ...] = ()

    @property
    def prefill_s(self) -> float:
        return sum(k.layer.count * k.prefill_s for k in self.kinds)

    @property
    def decode_s(self) -> float:
        """Seconds of one decode step through every layer (a new token for each of the batch's sequences)."""
        return sum(k.layer.count * k.decode_s for k in self.kinds)

    @property
    def tokens_per_s(self) -> float:
        return self.batch / self.decode_s if self.decode_s > 0 else math.inf

    def as_dict(self) -> dict[str, Any]:
        return {"predicted": True, "context": self.context, "batch": self.batch,
                "prefill_s": self.prefill_s, "prefill_method": self.prefill_method,
                "decode_s_per_step": self.decode_s, "decode_tokens_per_s": self.tokens_per_s,
                "decode_method": self.decode_method,
                "layers": [{"name": k.layer.name, "count": k.layer.count, "prefill_s_a_layer": k.prefill_s,
                            "decode_s_a_layer": k.decode_s, "prefill_method": k.prefill_method,
                            "decode_method": k.decode_method} for k in self.kinds],
                "notes": list(self.notes)}


def full_flops(layer: Layer, mode: str, context: int, batch: int, dtype: str) -> float:
    """The FLOPs one layer of `layer`'s kind executes, all its heads: a causal prefill of `context` tokens, or a
    decode step against a context of `context` (as the engine counts them for its Problem)."""
    problem = dataclasses.replace(problem_of(layer, mode, context, dtype=dtype), batch=batch)
    spec = MEASURED[problem.mechanism]
    return theory_of(spec, problem).executed_flops


def predict(made: Plan, timings: Timings) -> Prediction:
    """`made`'s model at its context and batch from `timings` of its kinds: each kind's fitted line (`fit`) at the
    full layer's FLOPs, times its layer count, summed. ValueError when a kind or a mode was not measured."""
    kinds, missing = [], []
    for layer in made.model.layers:
        kind = timings.of(layer)
        figures, methods = {}, {}
        for mode in MODES:
            line = kind.fit(mode)
            if line is None:
                missing.append(f"{layer.name} ({mode})")
                continue
            figures[mode] = line.at(full_flops(layer, mode, made.context, made.batch, made.dtype))
            methods[mode] = _method(layer, kind, mode, line, made.context)
        if len(figures) == 2:
            kinds.append(KindPrediction(layer, figures["prefill"], figures["decode"], methods["prefill"],
                                        methods["decode"]))
    if missing:
        raise ValueError(f"no measured point for {', '.join(missing)}; measure with a larger budget")
    cpu = f", {threads_text(timings.threads)}" if timings.device == "cpu" else ""
    where = f"{timings.device}, {timings.dtype}{cpu}"
    total = (f"predicted, not measured: each kind's measured times ({where}) fitted as t = a + b·FLOPs, read at the "
             f"full layer's FLOPs at {made.context:,} tokens × {made.batch}, times its layer count, summed over "
             f"{made.model.layer_count} layers; attention only")
    notes = [n for k in timings.kinds for n in k.notes]
    if made.dtype != timings.dtype:
        notes.append(f"timed in {timings.dtype}, not the plan's {made.dtype}: a kernel reading half the bytes may "
                     "run faster than predicted")
    return Prediction(made.context, made.batch, tuple(kinds), total, total, tuple(notes))


def _method(layer: Layer, kind: KindTiming, mode: str, line: Fit, context: int) -> str:
    """'decode step measured at 1,024–16,384 tokens on 4 of 32 heads, fitted t = a + b·FLOPs, extrapolated along the
    spec's FLOPs to 32 heads at 131,072 tokens, × 32 layers'."""
    ns = [p.n for p in kind.points(mode)]
    span = f"{ns[0]:,}" if len(ns) == 1 else f"{ns[0]:,}–{ns[-1]:,}"
    heads = "" if kind.measured.heads == layer.heads else f" on {kind.measured.heads} of {layer.heads} heads"
    used = min(len(ns), FIT_POINTS)
    through = "" if used == len(ns) else f" (the longest {used})"
    form = (f"fitted t = a + b·FLOPs{through}" if line.how == "line"
            else f"taken as proportional to the FLOPs{through}")
    within = ns[0] <= context <= ns[-1] and not heads
    how = "read" if within else "extrapolated along the spec's FLOPs"
    what = "causal prefill" if mode == "prefill" else "decode step"
    return (f"{what} measured at {span} tokens{heads}, {form}, {how} at {layer.heads} heads and {context:,} tokens, "
            f"× {layer.count} layer{'s' * (layer.count != 1)}")


def decode_curves(model: Model, timings: Timings, contexts: Sequence[int], *, batch: int = 1,
                  dtype: str | None = None) -> pd.DataFrame:
    """The predicted decode tokens per second of `model` at each context, for a chart (charts.insight.theory_chart
    'tokens_per_s'): DataFrame[mechanism, label, n, tokens_per_s, decode_s, status]."""
    rows = []
    for n in contexts:
        got = predict(plan(model, n, batch=batch, dtype=dtype), timings)
        rows.append({"mechanism": model.name.lower(), "label": f"{model.name} (predicted)", "n": n,
                     "tokens_per_s": got.tokens_per_s, "decode_s": got.decode_s, "status": "ok"})
    return pd.DataFrame(rows)


# -- the check: a scaled-down stack run for real --

def stack_model(timings: Timings, layers: int = STACK_LAYERS) -> Model:
    """The timed model scaled down: about `layers` layers, each kind's count in proportion (at least one), each on
    the heads it was timed with; named as such."""
    model = timings.model
    kinds = tuple(dataclasses.replace(k.measured, count=max(1, round(k.layer.count * layers / model.layer_count)))
                  for k in timings.kinds)
    made = dataclasses.replace(model, name=f"{model.name[:50]}, scaled down", layers=kinds)
    if found := made.problems():
        raise ValueError("; ".join(found))
    return made


def stack_order(model: Model) -> list[Layer]:
    """The model's layers one by one, each kind spread evenly through the stack (Gemma 3's 5 local to 1 global:
    the global ones between runs of local ones), as a decoder stacks them."""
    spread = [((i + 0.5) / k.count, j, k) for j, k in enumerate(model.layers) for i in range(k.count)]
    return [k for _, _, k in sorted(spread, key=lambda s: (s[0], s[1]))]


@dataclass(frozen=True)
class StackCheck:
    """A scaled-down stack (`stack`) run for real at `prefill_n` and `decode_n` tokens, against the prediction for
    it from the same timings: seconds measured (median) and predicted, for the prefill and a decode
    step through every layer."""

    stack: Model
    prefill_n: int
    decode_n: int
    prefill_predicted_s: float
    prefill_measured_s: float
    decode_predicted_s: float
    decode_measured_s: float
    notes: tuple[str, ...] = ()

    @property
    def prefill_ratio(self) -> float:
        """Measured ÷ predicted: 1 is a perfect prediction; the target is within ×1.5 either way."""
        return self.prefill_measured_s / self.prefill_predicted_s

    @property
    def decode_ratio(self) -> float:
        return self.decode_measured_s / self.decode_predicted_s

    def as_dict(self) -> dict[str, Any]:
        return {"stack": self.stack.name, "layers": self.stack.layer_count, "prefill_n": self.prefill_n,
                "decode_n": self.decode_n, "prefill_predicted_s": self.prefill_predicted_s,
                "prefill_measured_s": self.prefill_measured_s, "prefill_ratio": self.prefill_ratio,
                "decode_predicted_s": self.decode_predicted_s, "decode_measured_s": self.decode_measured_s,
                "decode_ratio": self.decode_ratio, "notes": list(self.notes)}


def check_stack(timings: Timings, *, prefill_n: int | None = None, decode_n: int | None = None,
                layers: int = STACK_LAYERS, repeats: int = REPEATS, budget_s: float = 10.0) -> StackCheck:
    """Run `stack_model(timings)` for real: every layer's causal prefill of `prefill_n` tokens, one after
    another in `stack_order`, as one timed call; then one decode step through every layer against caches of
    `decode_n` tokens (each rewound after the step, as the engine times a step). Each layer has its own seeded
    inputs (the engine's operands) and its caches stay held together, as a model's do. The prediction for the stack
    comes from `timings` like any plan's (`predict`). None lengths: twice the longest measured (an extrapolation,
    as the full model's is), halved while the stack's predicted time would overrun half of `budget_s`. ValueError
    when a kind lacks points, RuntimeError (a sentence) when the stack cannot run."""
    small = stack_model(timings, layers)
    longest = {m: max((p.n for k in timings.kinds for p in k.points(m)), default=0) for m in MODES}
    if not longest["prefill"] or not longest["decode"]:
        raise ValueError("the timings lack prefill or decode points; measure with a larger budget")
    if isinstance(budget_s, bool) or not isinstance(budget_s, (int, float)) or not 0 < budget_s <= MAX_BUDGET_S:
        raise ValueError(f"budget_s must be a number of seconds above 0 and at most {MAX_BUDGET_S:g}, got "
                         f"{budget_s!r}")
    predicted = {m: _within(small, timings, m, given, 2 * longest[m], (budget_s / 2) / (repeats + 2))
                 for m, given in (("prefill", prefill_n), ("decode", decode_n))}
    prefill_n, decode_n = predicted["prefill"].context, predicted["decode"].context
    order = stack_order(small)
    problems = [problem_of(layer, m, n, device=timings.device, dtype=timings.dtype, seed=i)
                for m, n in (("prefill", prefill_n), ("decode", decode_n)) for i, layer in enumerate(order)]
    need = sum(measure.required_bytes(MEASURED[p.mechanism], p) for p in problems)
    if need * (1 + GUARD.memory_margin) > env.free_memory_bytes(timings.device):
        raise RuntimeError(f"the scaled-down stack would need {measure.format_bytes(need)}, more than this machine "
                           "has free; check at shorter lengths")
    measured = {}
    with env.cpu_threads(timings.threads if timings.device == "cpu" else None):
        for m in MODES:
            seconds, why = timed([p for p in problems if (p.mode == "generate") == (m == "decode")], repeats)
            if why:
                raise RuntimeError(f"the scaled-down stack's {m} did not run: {why}")
            measured[m] = seconds
    note = (f"{small.layer_count} layers ({', '.join(f'{k.count} × {k.name}' for k in small.layers)}) on "
            f"{timings.device} ({threads_text(timings.threads)}) in {timings.dtype}; attention cores only, each layer "
            "on its own seeded inputs")
    return StackCheck(small, prefill_n, decode_n, predicted["prefill"].prefill_s, measured["prefill"],
                      predicted["decode"].decode_s, measured["decode"], (note,))


def _within(stack: Model, timings: Timings, mode: str, given: int | None, longest: int,
            call_s: float) -> Prediction:
    """The prediction for `stack` at `given` tokens, or at `longest` halved until one call of `mode` is predicted to
    take at most `call_s` (64 tokens at least)."""
    n = given or longest
    while True:
        got = predict(plan(stack, n, dtype=timings.dtype), timings)
        if given or (got.prefill_s if mode == "prefill" else got.decode_s) <= call_s or n <= 64:
            return got
        n //= 2
