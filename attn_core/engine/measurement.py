"""One measured point as data: its Problem, the raw samples and what was derived from them, memory and its method,
the spec's theory, the conditions it ran in, and its status. `to_row` / `from_row` are the only place the saved row
schema is written: COLUMNS and each column's kind are declared once, here."""
from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from typing import Any, Mapping

import torch

from . import positions
from attn_core.mechanisms.flex import OneTime, cost_of
from .problem import Problem
from ..spec import MechanismSpec

NAN = math.nan
STATUSES = ("ok", "skipped", "oom", "failed", "cancelled")

# The saved row, in order: (column, kind). kind: text, bool, int, float (NaN where not measured), samples (a list).
SCHEMA = (
    ("mechanism", "text"), ("label", "text"), ("exact", "bool"), ("params", "text"), ("n", "int"),
    ("batch", "int"), ("heads", "int"), ("kv_heads", "int"), ("d_model", "int"), ("head_dim", "int"),
    ("dtype", "text"), ("device", "text"), ("mode", "text"), ("causal", "bool"), ("padding", "int"),
    ("status", "text"), ("reason", "text"),
    ("time_median_s", "float"), ("time_iqr_s", "float"), ("time_samples", "samples"), ("repeats", "int"),
    ("peak_bytes", "float"), ("memory_method", "text"), ("predicted_bytes", "float"), ("theory_flops", "float"),
    ("executed_flops", "float"), ("gflops", "float"), ("device_gflops", "float"), ("pct_of_device", "float"),
    ("sdpa_backend", "text"), ("threads", "float"), ("foreign_cpu", "float"), ("load_average", "float"),
    ("disturbed", "bool"), ("retaken", "int"), ("positions", "text"),
    ("implementation", "text"), ("compile_s", "float"), ("mask_s", "float"),
    ("sinks", "bool"), ("keep_first", "int"),
)
# theory_flops: the pattern's useful FLOPs; executed_flops: what the kernel computes (padding, masked halves), the
# figure gflops and pct_of_device use. foreign_cpu: cores other processes used during the kept timed samples;
# disturbed: the point stayed contended after its bounded retakes (retaken: samples taken again for contention).
# threads is a float so that an unknown count can be NaN. kv_heads: key/value heads (= heads in multi-head attention);
# padding: the padded keys at the end of each sequence. positions: none, rope or alibi (engine/positions.py).
# implementation: who ran a mechanism defined by a mask (ours, flex, dense-mask); compile_s and mask_s: its one-time
# costs (attn_core.mechanisms.flex.OneTime), never part of the time. A file saved before a column existed reads it as its
# default (results.OPTIONAL). sinks: a sink logit a head passed (gpt-oss); keep_first: the first tokens a windowed
# generation cache kept (StreamingLLM); older files read them as off and 0. A column added later goes last (the
# store appends it by a migration: store.py).
COLUMNS = tuple(name for name, _ in SCHEMA)
KINDS = {kind: tuple(name for name, k in SCHEMA if k == kind) for kind in ("text", "bool", "int", "float")}


@dataclass(frozen=True)
class Theory:
    """What the spec says of the problem: its label, exact or not, its parameters with defaults filled in, useful and
    executed FLOPs of the measured call (×3 with backward; a step's when generating), and the predicted bytes (the
    forward peak; the cache's bytes when generating)."""

    label: str
    exact: bool
    params: dict = field(default_factory=dict)
    flops: float = NAN
    executed_flops: float = NAN
    predicted_bytes: float = NAN


@dataclass(frozen=True)
class Summary:
    """What the samples say: median and interquartile range of the seconds per call, how many samples, and the
    speed they imply (executed FLOPs ÷ median; and as a % of the device's measured matmul throughput)."""

    median_s: float = NAN
    iqr_s: float = NAN
    repeats: int = 0
    gflops: float = NAN
    pct_of_device: float = NAN

    @classmethod
    def of(cls, samples: list[float], executed_flops: float, device_gflops: float) -> "Summary":
        median, iqr = median_iqr(samples)
        gflops = executed_flops / median / 1e9
        return cls(median, iqr, len(samples), gflops, 100.0 * gflops / device_gflops)


@dataclass(frozen=True)
class Conditions:
    """What the point ran in: torch threads, the device's measured matmul GFLOP/s, SDPA's backend, the cores other
    programs used during the kept samples, the load average, and whether contention stayed after `retaken` retakes."""

    threads: float = NAN
    device_gflops: float = NAN
    sdpa_backend: str = ""
    foreign_cpu: float = NAN
    load_average: float = NAN
    disturbed: bool = False
    retaken: int = 0


@dataclass(frozen=True)
class Measurement:
    """One point: what was measured (`problem`), how it ended (`status`, and `reason` unless ok), the raw seconds
    per call (`samples`) and their `summary`, the peak bytes and the method behind them, the spec's `theory` and the
    `conditions`; `one_time`: the costs paid once before timing (Flex's compile and block mask, a dense mask)."""

    problem: Problem
    theory: Theory
    status: str = "ok"
    reason: str = ""
    samples: tuple[float, ...] = ()
    summary: Summary = Summary()
    peak_bytes: float = NAN
    memory_method: str = ""
    conditions: Conditions = Conditions()
    one_time: OneTime = OneTime()

    @property
    def ok(self) -> bool:
        return self.status == "ok"

    def to_row(self) -> dict:
        """The saved row: one value per column of SCHEMA, in its order."""
        p, t, s, c = self.problem, self.theory, self.summary, self.conditions
        return {"mechanism": p.mechanism, "label": t.label, "exact": t.exact,
                "params": json.dumps(t.params, sort_keys=True), "n": p.n, "batch": p.batch, "heads": p.heads,
                "kv_heads": p.key_heads, "d_model": p.d_model, "head_dim": p.head_dim, "dtype": p.dtype,
                "device": p.device, "mode": p.mode, "causal": p.is_causal, "padding": p.padding,
                "status": self.status, "reason": self.reason, "time_median_s": s.median_s,
                "time_iqr_s": s.iqr_s, "time_samples": list(self.samples), "repeats": s.repeats,
                "peak_bytes": self.peak_bytes, "memory_method": self.memory_method,
                "predicted_bytes": t.predicted_bytes, "theory_flops": t.flops, "executed_flops": t.executed_flops,
                "gflops": s.gflops, "device_gflops": c.device_gflops, "pct_of_device": s.pct_of_device,
                "sdpa_backend": c.sdpa_backend, "threads": c.threads, "foreign_cpu": c.foreign_cpu,
                "load_average": c.load_average, "disturbed": c.disturbed, "retaken": c.retaken,
                "positions": p.positions, "implementation": p.implementation,
                "compile_s": self.one_time.compile_s, "mask_s": self.one_time.mask_s, "sinks": p.sinks,
                "keep_first": p.keep_first}

    @classmethod
    def from_row(cls, row: Mapping[str, Any]) -> "Measurement":
        """Inverse of to_row for a typed row (results.frame_from_rows has checked and typed it)."""
        params = json.loads(row["params"] or "{}")
        problem = Problem(mechanism=row["mechanism"], params=tuple(sorted(params.items())), batch=row["batch"],
                          heads=row["heads"], kv_heads=None if row["kv_heads"] == row["heads"] else row["kv_heads"],
                          n=row["n"], d_model=row["d_model"], dtype=row["dtype"], device=row["device"],
                          mode=row["mode"], causal=bool(row["causal"]), padding=row["padding"],
                          positions=row.get("positions") or "none",
                          implementation=row.get("implementation") or "ours", sinks=bool(row.get("sinks", False)),
                          keep_first=int(row.get("keep_first", 0) or 0))
        return cls(problem=problem,
                   theory=Theory(row["label"], bool(row["exact"]), params, row["theory_flops"],
                                 row["executed_flops"], row["predicted_bytes"]),
                   status=row["status"], reason=row["reason"], samples=tuple(row["time_samples"]),
                   summary=Summary(row["time_median_s"], row["time_iqr_s"], row["repeats"], row["gflops"],
                                   row["pct_of_device"]),
                   peak_bytes=row["peak_bytes"], memory_method=row["memory_method"],
                   conditions=Conditions(row["threads"], row["device_gflops"], row["sdpa_backend"],
                                         row["foreign_cpu"], row["load_average"], bool(row["disturbed"]),
                                         row["retaken"]),
                   one_time=OneTime(row["mask_s"], row["compile_s"]))


BACKWARD_FLOP_FACTOR = 3  # backward ≈ 2× forward (a product for each operand's gradient): 3× in all


def theory_of(spec: MechanismSpec, problem: Problem) -> Theory:
    """The spec's figures for `problem`: FLOPs ×3 for forward+backward; generating, a step's FLOPs (both) and the
    bytes of the cache of n tokens (NaN where the mechanism cannot generate)."""
    params = spec.resolved(problem.kwargs)
    shape, cost = problem.shape, spec.cost
    if problem.mode == "generate":
        gen = spec.supports.generation
        if gen is None:
            return Theory(spec.label, spec.exact, params)
        kept = {**params, "keep_first": problem.keep_first} if problem.keep_first else params  # StreamingLLM
        step = gen.flops(shape, **kept) + positions.step_flops(shape, problem.positions)
        return Theory(spec.label, spec.exact, params, step, step, float(gen.cache_bytes(shape, **kept)))
    factor = BACKWARD_FLOP_FACTOR if problem.mode == "forward+backward" else 1
    if problem.implementation != "ours":  # another kernel's work and memory under the same pattern (no positions)
        flops = float(cost.flops(shape, **params))
        executed, peak = cost_of(problem.implementation, shape, flops)
        return Theory(spec.label, spec.exact, params, factor * flops, factor * executed, peak)
    added = positions.added_flops(shape, problem.positions)  # with positions: their work too (positions.py)
    # sinks: the spec's peak with them (Problem refuses sinks beside positions in these modes)
    peak = (float(cost.sinks_memory(shape, **params)) if problem.sinks
            else positions.peak_bytes(spec, shape, problem.positions, **params))
    return Theory(spec.label, spec.exact, params, factor * (float(cost.flops(shape, **params)) + added),
                  factor * (float(cost.executed(shape, **params)) + added), peak)


def unmeasured(spec: MechanismSpec, problem: Problem, status: str, reason: str = "", **conditions: Any) -> Measurement:
    """A point with nothing measured: skipped, failed, cancelled (NaN where nothing was)."""
    return Measurement(problem, theory_of(spec, problem), status, reason, conditions=Conditions(**conditions))


def median_iqr(samples: list[float]) -> tuple[float, float]:
    """Median and interquartile range (linear interpolation between order statistics)."""
    t = torch.tensor(samples, dtype=torch.float64)
    q = torch.quantile(t, torch.tensor([0.25, 0.5, 0.75], dtype=torch.float64)).tolist()
    return q[1], q[2] - q[0]
