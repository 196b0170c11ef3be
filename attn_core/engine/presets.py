"""Talk presets as sweep configurations, and the two playbacks a talk needs: several sweeps seen as one, and the
replay of a saved run point by point. Both playbacks answer like a SweepRun (poll, frame, progress, cancel, done)."""
from __future__ import annotations

import json
import time
from dataclasses import dataclass, field
from typing import Callable

import pandas as pd

from ..mechanisms import MECHANISMS
from .results import SCHEMA_VERSION, Run
from .config import DEFAULT_SWEEP, SweepConfig, log_spaced
from .sweep import SweepRun

# Accelerators are far faster than a laptop CPU: presets reach this many times longer sequences there.
ACCELERATOR_REACH = 4


@dataclass(frozen=True)
class Preset:
    """One click on stage: the sweeps to run, what to look at, and how to draw it."""

    name: str
    look_for: str  # one sentence the speaker can read out
    configs: tuple[SweepConfig, ...]
    metric: str = "time_median_s"  # the chart to show first
    log: bool = True

    def for_device(self, device: str, dtype: str | None = None) -> tuple[SweepConfig, ...]:
        """The configs on `device`, with longer sequences on an accelerator."""
        reach = 1 if device == "cpu" else ACCELERATOR_REACH
        return tuple(c.replaced(device=device, dtype=dtype or c.problem.dtype,
                                ns=log_spaced(c.ns[0] * reach, c.ns[-1] * reach, len(c.ns))) for c in self.configs)


def _config(mechanisms: tuple[str, ...], n_min: int, n_max: int, steps: int, **settings) -> SweepConfig:
    """The dashboard's default sweep (its short timing) with these mechanisms, lengths and settings."""
    return DEFAULT_SWEEP.replaced(mechanisms=tuple((key, {}) for key in mechanisms),
                                  ns=log_spaced(n_min, n_max, steps), **settings)


PRESETS: dict[str, Preset] = {p.name: p for p in (
    Preset("The quadratic wall",
           "Softmax's time and memory bend up as n² while the window and linear attention grow as n.",
           (_config(("softmax", "sliding_window", "linear"), 256, 4096, 5),), metric="peak_bytes"),
    Preset("Where linear attention wins",
           "Below n* the plain softmax is faster; past the marked crossover the linear mechanisms win.",
           (_config(("softmax", "linear", "performer"), 128, 4096, 6, d_model=256, heads=4),)),
    Preset("Materialized vs fused softmax",
           "Same arithmetic, same answer: the fused kernel never stores the n×n scores, so its memory grows as n.",
           (_config(("softmax", "sdpa"), 256, 4096, 5),), metric="peak_bytes"),
    Preset("Causal vs bidirectional",
           "A causal mask halves the useful work; only kernels that skip the masked half get faster.",
           tuple(_config(("softmax", "sdpa", "linear"), 256, 2048, 4, causal=causal) for causal in (False, True))),
)}
QUICK_DEMO = Preset("Quick demo", "Softmax against linear attention on short sequences.",
                    (_config(("softmax", "linear"), 128, 2048, 5, d_model=256, heads=4),))


def config_of(frame: pd.DataFrame) -> tuple[SweepConfig, list[str]]:
    """The sweep a results frame was measured with, read from its rows (the file's own config is not trusted), and
    what of the frame that one config cannot hold: a second mask, a second shape, mechanisms this build lacks."""
    first = frame.iloc[0]
    seen = frame.drop_duplicates(["mechanism", "params"])
    mechanisms = tuple((key, json.loads(params)) for key, params in zip(seen["mechanism"], seen["params"])
                       if key in MECHANISMS)
    ns = tuple(sorted({int(n) for n in frame["n"]}))
    config = DEFAULT_SWEEP.replaced(mechanisms=mechanisms, ns=ns, batch=int(first["batch"]),
                                    heads=int(first["heads"]), d_model=int(first["d_model"]),
                                    dtype=str(first["dtype"]), device=str(first["device"]), mode=str(first["mode"]),
                                    causal=bool(first["causal"]))
    left = [f"{column} {', '.join(map(str, frame[column].unique()))}" for column in
            ("batch", "heads", "d_model", "dtype", "device", "mode") if frame[column].nunique() > 1]
    left += ["both masks (causal and bidirectional)"] if frame["causal"].nunique() > 1 else []
    left += [f"{key} (not in this build)" for key in dict.fromkeys(seen["mechanism"]) if key not in MECHANISMS]
    return config, left


@dataclass
class SweepSequence:
    """Sweeps run one after another and seen as one run (the causal preset measures both masks)."""

    configs: tuple[SweepConfig, ...]
    start_run: Callable[[SweepConfig], SweepRun] = SweepRun.start
    runs: list = field(default_factory=list)
    cancelled: bool = False

    def __post_init__(self) -> None:
        self.runs.append(self.start_run(self.configs[0]))

    def poll(self) -> list[dict]:
        new = self.runs[-1].poll()
        current = self.runs[-1]
        if current.done and current.error is None and not self.cancelled and len(self.runs) < len(self.configs):
            self.runs.append(self.start_run(self.configs[len(self.runs)]))
        return new

    @property
    def rows(self) -> list[dict]:
        return [row for run in self.runs for row in run.rows]

    def frame(self) -> pd.DataFrame:
        frames = [run.frame() for run in self.runs]
        return pd.concat(frames, ignore_index=True) if len(frames) > 1 else frames[0]

    def progress(self) -> dict:
        states = [run.progress() for run in self.runs]
        waiting = sum(len(c.mechanisms) * len(c.ns) for c in self.configs[len(self.runs):])
        return {"done": sum(s["done"] for s in states), "total": sum(s["total"] for s in states) + waiting,
                "eta_s": states[-1]["eta_s"], "current": states[-1]["current"]}

    def cancel(self) -> None:
        self.cancelled = True
        self.runs[-1].cancel()

    @property
    def done(self) -> bool:
        last = self.runs[-1]
        return last.done and (self.cancelled or last.error is not None or len(self.runs) == len(self.configs))

    @property
    def error(self) -> str | None:
        return next((run.error for run in self.runs if run.error), None)

    def result(self) -> Run:
        """All points as one Run: the first sweep's stamp, and the config (a list of them for several sweeps)."""
        first = self.runs[0].result()
        if len(self.configs) == 1:
            return first
        return Run(self.frame(), first.env, {"sweeps": [run.config.to_dict() for run in self.runs]}, SCHEMA_VERSION)


@dataclass
class Replay:
    """A saved run played back at `points_per_s`, as if it were being measured now."""

    run: Run
    points_per_s: float = 3.0
    clock: Callable[[], float] = time.monotonic
    shown: int = 0
    stopped: bool = False
    error: str | None = None

    def __post_init__(self) -> None:
        self.started = self.clock()

    @property
    def total(self) -> int:
        return len(self.run.frame)

    @property
    def due(self) -> int:
        """How many points the pace has reached by now (shown once a poll takes them)."""
        return self.shown if self.stopped else min(self.total, 1 + int((self.clock() - self.started) *
                                                                        self.points_per_s))

    def poll(self) -> list[dict]:
        due = self.due
        new, self.shown = self.run.frame.iloc[self.shown:due], max(self.shown, due)
        return new.to_dict("records")

    @property
    def rows(self) -> list[dict]:
        return self.frame().to_dict("records")

    def frame(self) -> pd.DataFrame:
        return self.run.frame.iloc[:self.shown].reset_index(drop=True)

    def progress(self) -> dict:
        row = self.run.frame.iloc[max(self.shown - 1, 0)] if self.total else None
        current = f"replaying {row['label']} at n = {row['n']:,}" if row is not None else "nothing to replay"
        return {"done": self.shown, "total": self.total, "eta_s": (self.total - self.shown) / self.points_per_s,
                "current": current}

    def cancel(self) -> None:
        self.stopped = True

    def result(self) -> Run:
        return Run(self.frame(), self.run.env, self.run.config, SCHEMA_VERSION)

    @property
    def done(self) -> bool:
        return self.stopped or self.shown >= self.total
