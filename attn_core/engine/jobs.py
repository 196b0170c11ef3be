"""Jobs: what the dashboard runs and shows while it runs. A SweepRun measures one sweep; a SweepSequence runs several
one after another and is seen as one run; a Replay plays a saved run back point by point. Each answers as a Job."""
from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Callable, Protocol

import pandas as pd

from .config import SweepConfig
from .results import SCHEMA_VERSION, Run
from .sweep import SweepRun


class Job(Protocol):
    """What a page reads of a running job: new rows (`poll`), all rows so far (`frame`), `progress()` (done, total,
    eta_s, current), `cancel()`, `done`, `error` (a sentence, or None) and the `result()` to save."""

    error: str | None

    def poll(self) -> list[dict]: ...
    def frame(self) -> pd.DataFrame: ...
    def progress(self) -> dict: ...
    def cancel(self) -> None: ...
    def result(self) -> Run: ...

    @property
    def done(self) -> bool: ...


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
