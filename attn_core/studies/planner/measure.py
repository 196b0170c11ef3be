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
"""
from __future__ import annotations

import contextlib
import dataclasses
import math
import time
from dataclasses import dataclass
from typing import Any, Callable, Sequence

import pandas as pd
import torch

from attn_core.engine import env, measure
from attn_core.engine.measurement import median_iqr, theory_of
from attn_core.engine.problem import MAX_THREADS, Problem, Settings
from attn_core.mechanisms import MEASURED
from attn_core.mechanisms._common import validated
from attn_core.studies.planner.model import Layer, Model, Plan, plan

PREFILL_NS = (512, 1024, 2048, 4096)  # prompt lengths a kind's causal prefill is timed at, while its budget lasts
DECODE_NS = (4096, 8192, 16384, 32768)  # contexts a decode step is timed at
MEASURED_HEADS = 4  # query heads a kind is timed with (a whole group of key/value heads at least)
STACK_LAYERS = 8  # layers of the check's scaled-down stack, the model's kinds in its proportions
MAX_BUDGET_S = 600.0
FIT_POINTS = 2  # a kind's line runs through its longest points: shorter ones sit in faster caches, not the regime
# a longer context reaches (a 256-token prefill ran at twice the FLOP rate of 512 to 2048 here)
REPEATS = 5  # timed samples of a point (after one warm-up call); the median is kept
GUARD = Settings()  # the engine's memory guard and its safety margin
MODES = ("prefill", "decode")


@dataclass(frozen=True)
class Point:
    """One timed point of a kind: `mode` ('prefill' or 'decode'), its length `n` (the prompt, or the context a step
    reads), the FLOPs the kernel executes (`flops`) and the median seconds of a call (`seconds`)."""

    mode: str
    n: int
    flops: float
    seconds: float


@dataclass(frozen=True)
class Fit:
    """t = overhead_s + s_per_flop · F, and how it was made (`how`, a few words)."""

    overhead_s: float
    s_per_flop: float
    how: str

    def at(self, flops: float) -> float:
        return self.overhead_s + self.s_per_flop * flops


def fit(points: Sequence[Point]) -> Fit:
    """The least-squares line t = a + b·F through the points, a ≥ 0 and b > 0. Points of (nearly) one F (a decode
    step of a fixed-size state) or a line with a < 0 or b ≤ 0 give the line through the origin, b = Σ F·t / Σ F²
    (the time taken as proportional to the FLOPs). O(points). ValueError without a point."""
    if not points:
        raise ValueError("a fit needs at least one measured point")
    xs, ts = [p.flops for p in points], [p.seconds for p in points]
    through_origin = Fit(0.0, sum(x * t for x, t in zip(xs, ts)) / sum(x * x for x in xs), "proportional")
    if len(points) < 2 or max(xs) < 1.05 * min(xs):
        return through_origin
    mx, mt = sum(xs) / len(xs), sum(ts) / len(ts)
    b = sum((x - mx) * (t - mt) for x, t in zip(xs, ts)) / sum((x - mx) ** 2 for x in xs)
    a = mt - b * mx
    return Fit(a, b, "line") if a >= 0 and b > 0 else through_origin


@dataclass(frozen=True)
class KindTiming:
    """A kind of the model (`layer`) as it was timed: `measured`, the same layer on fewer heads where scaled down;
    its prefill and decode points, and sentences on what was scaled or skipped."""

    layer: Layer
    measured: Layer
    prefill: tuple[Point, ...] = ()
    decode: tuple[Point, ...] = ()
    notes: tuple[str, ...] = ()

    def points(self, mode: str) -> tuple[Point, ...]:
        return self.prefill if mode == "prefill" else self.decode

    def fit(self, mode: str) -> Fit | None:
        """The line through the FIT_POINTS longest points of `mode` (`fit`); None without a point."""
        found = self.points(mode)
        return fit(sorted(found, key=lambda p: p.n)[-FIT_POINTS:]) if found else None


@dataclass(frozen=True)
class Timings:
    """Every kind of `model` timed on `device` in `dtype` with `threads` CPU threads; `spent_s` in all, the load
    average at the end."""

    model: Model
    device: str
    dtype: str
    kinds: tuple[KindTiming, ...]
    spent_s: float = 0.0
    load_average: float | None = None
    threads: int = 1

    def of(self, layer: Layer) -> KindTiming:
        """The timing of `layer`'s kind (same mechanism, heads, sizes; the count may differ)."""
        for kind in self.kinds:
            if _same_kind(kind.layer, layer) or _same_kind(kind.measured, layer):
                return kind
        raise ValueError(f"the layer kind {layer.name[:40]!r} was not measured; measure this model first")


def joined(timings: Timings, more: Timings) -> Timings:
    """`timings` with the kinds of `more` beside its own, to predict a model that mixes kinds timed apart (a hybrid
    of the model and another kind); its model stays `timings.model` (a stack check runs that one). ValueError when
    the two were timed on another device, dtype or number of threads."""
    if (more.device, more.dtype, more.threads) != (timings.device, timings.dtype, timings.threads):
        raise ValueError(f"the kinds were timed apart on {more.device} in {more.dtype} ({_threads(more.threads)}) "
                         f"and on {timings.device} in {timings.dtype} ({_threads(timings.threads)}); time them alike")
    return dataclasses.replace(timings, kinds=timings.kinds + more.kinds, spent_s=timings.spent_s + more.spent_s)


def measure_hybrid(model: Model, hybrid: Model, *, budget_s: float = 10.0,
                   **options: Any) -> tuple[Timings, Timings]:
    """`model`'s kinds timed (`measure_kinds`, `options` passed on) and the kinds of `hybrid` that `model` lacks (the
    kind its layers turn into) timed apart, `budget_s` shared by all the kinds: (the model's timings, those joined
    with the new kinds', to predict the hybrid at any share; the model's own when it adds no kind)."""
    if isinstance(budget_s, bool) or not isinstance(budget_s, (int, float)):
        raise ValueError(f"budget_s must be a number of seconds above 0 and at most {MAX_BUDGET_S:g}, got "
                         f"{budget_s!r}")
    new = tuple(layer for layer in hybrid.layers if not any(_same_kind(layer, k) for k in model.layers))
    share = budget_s / (len(model.layers) + len(new))
    timings = measure_kinds(model, budget_s=share * len(model.layers), **options)
    if not new:
        return timings, timings
    more = measure_kinds(dataclasses.replace(hybrid, name=f"{hybrid.name[:50]}, its new kinds", layers=new),
                         budget_s=share * len(new), **options)
    return timings, joined(timings, more)


def scaled(layer: Layer, heads: int = MEASURED_HEADS) -> Layer:
    """`layer` on fewer query heads, about `heads` (at least one group: Llama 3's 32 heads over 8 key/value heads
    become 4 over 1), its key/value heads cut by the same factor, so the group, head dim and window stay; the layer
    itself where it has no more heads than that."""
    group = layer.heads // layer.kv_heads if layer.kv_heads else 1
    kv = layer.kv_heads or layer.heads
    shared = max([m for m in range(1, kv + 1) if kv % m == 0 and group * m <= max(group, heads)])
    if group * shared >= layer.heads:
        return layer
    return dataclasses.replace(layer, heads=group * shared, kv_heads=shared if layer.kv_heads else None)


def problem_of(layer: Layer, mode: str, n: int, *, device: str = "cpu", dtype: str = "float32",
               seed: int = 0) -> Problem:
    """The engine's Problem for one layer of `layer`'s kind: a causal prefill of n tokens ('prefill', the layer's
    prefill mechanism) or one step against a context of n ('decode'), batch 1."""
    mechanism = layer.prefill_mechanism or layer.mechanism if mode == "prefill" else layer.mechanism
    return Problem(mechanism=mechanism, params=tuple(sorted(layer.params.items())), heads=layer.heads,
                   kv_heads=layer.kv_heads if layer.kv_heads != layer.heads else None, n=n,
                   d_model=layer.heads * layer.head_dim, dtype=dtype, device=device,
                   mode="forward" if mode == "prefill" else "generate", causal=True, seed=seed)


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
    with cpu_threads(threads if device == "cpu" else None):
        kinds = [_kind(layer, heads, prefill_ns, decode_ns, share, device, dtype, repeats, progress)
                 for layer in model.layers]
    return Timings(model, device, dtype, tuple(kinds), time.perf_counter() - began, env.load_average(),
                   torch.get_num_threads() if threads is None or device != "cpu" else threads)


@contextlib.contextmanager
def cpu_threads(count: int | None):
    """torch's CPU threads set to `count` inside, as they were after (None: left alone). One by default: on a
    shared machine a second thread of every call waits for a busy core, and the times spread by ×10 or more."""
    before = torch.get_num_threads()
    if count is not None:
        torch.set_num_threads(count)
    try:
        yield
    finally:
        torch.set_num_threads(before)


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


def _threads(count: int) -> str:
    return f"{count} thread{'s' * (count != 1)}"


def _same_kind(a: Layer, b: Layer) -> bool:
    return dataclasses.replace(a, count=1, name="") == dataclasses.replace(b, count=1, name="")


# -- the prediction --

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
    where = f"{timings.device}, {timings.dtype}" + (f", {_threads(timings.threads)}" if timings.device == "cpu" else "")
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
    with cpu_threads(timings.threads if timings.device == "cpu" else None):
        for m in MODES:
            seconds, why = timed([p for p in problems if (p.mode == "generate") == (m == "decode")], repeats)
            if why:
                raise RuntimeError(f"the scaled-down stack's {m} did not run: {why}")
            measured[m] = seconds
    note = (f"{small.layer_count} layers ({', '.join(f'{k.count} × {k.name}' for k in small.layers)}) on "
            f"{timings.device} ({_threads(timings.threads)}) in {timings.dtype}; attention cores only, each layer on "
            "its own seeded inputs")
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


def timed(problems: Sequence[Problem], repeats: int = REPEATS) -> tuple[float, str]:
    """(median seconds of one call running every problem's call in order, ''), or (NaN, why not: a sentence). The
    calls are the engine's own (`measure.call_of`, `measure.step_call`: a step against a cache of n tokens, rewound
    after it) on its seeded inputs, checked and guarded as the engine does, all built before the clock starts; one
    warm-up call, then `repeats` samples of back-to-back calls of at least 1 ms (env.device_timer). No retakes for
    contention, unlike a sweep's points: the caller's budget is wall time."""
    device = problems[0].device
    try:
        for problem in problems:
            spec = MEASURED[problem.mechanism]
            if why := problem.problems(spec) or measure.guard(spec, problem, GUARD):
                return math.nan, why[0] if isinstance(why, list) else f"skipped: it {why}"
        with torch.inference_mode(), validated():
            calls = [_call(MEASURED[p.mechanism], p) for p in problems]

            def run() -> None:
                for call in calls:
                    call()
            clock = env.device_timer(device)
            first = clock(run, 1)
            times = max(1, min(100, math.ceil(1e-3 / max(first, 1e-9))))
            samples = [clock(run, times) / times for _ in range(repeats)]
        return median_iqr(samples)[0], ""
    except Exception as e:  # a kernel's failure is a sentence in the notes, never a crash of the page
        message = str(e).strip().splitlines()[0][:160] if str(e).strip() else ""
        return math.nan, f"{'out of memory' if measure.is_oom(e) else type(e).__name__}: {message}"
    finally:
        env.release_cached_memory(device)


def _call(spec, problem: Problem) -> Callable[[], Any]:
    state = measure.make_state(spec, problem)
    if problem.mode == "generate":
        return measure.step_call(spec, problem, state)[0]
    return measure.call_of(spec, problem, *measure.operands(spec, problem), state=state)
