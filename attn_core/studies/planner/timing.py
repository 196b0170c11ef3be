"""What one layer kind's timing is made of: its timed points (the engine's own calls, `timed`), the line
t = a + b·FLOPs fitted through them (`fit`), the kinds of a model as timed (`Timings`), and the Problem of a kind."""
from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass
from typing import Any, Callable, Sequence

import torch

from attn_core.engine import env, measure
from attn_core.engine.measurement import median_iqr
from attn_core.engine.problem import Problem, Settings
from attn_core.mechanisms import MEASURED
from attn_core.mechanisms._common import validated
from attn_core.studies.planner.model import Layer, Model

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
            if same_kind(kind.layer, layer) or same_kind(kind.measured, layer):
                return kind
        raise ValueError(f"the layer kind {layer.name[:40]!r} was not measured; measure this model first")


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


def threads_text(count: int) -> str:
    """'1 thread', '4 threads'."""
    return f"{count} thread{'s' * (count != 1)}"


def same_kind(a: Layer, b: Layer) -> bool:
    """The same kind of layer: equal but for the count and the name."""
    return dataclasses.replace(a, count=1, name="") == dataclasses.replace(b, count=1, name="")
