"""When a live page redraws while a job measures: the browser's drawing competes with the timed samples, so the page
draws new points at once only while the charts are empty, then at most every `redraw_s` and never more than a
`1 / share` of the time (each redraw waits `share` × the last one's cost). Pure bookkeeping: no Streamlit here."""
from __future__ import annotations

from dataclasses import dataclass

FIRST_DRAW_GRACE_S = 5.0  # a tick inside a full run must not ask for another; after this, it may


@dataclass
class Pacing:
    """The live page's clock. A full run calls `begin` before drawing and `end` after; the progress ticks between
    full runs ask `wants_redraw`, and tick every `tick_every()` seconds."""

    redraw_s: float = 2.0  # at most this often the charts are redrawn while a job measures
    tick_s: float = 2.0  # the progress bar's pace once points are drawn ...
    first_tick_s: float = 0.25  # ... and before, so the first point shows quickly
    share: float = 3.0  # a redraw waits this many times the previous one's cost: drawing takes ≤ 1/(1+share)
    job: int | None = None  # the job drawn last (its id), and how many of its points
    points: int = 0
    started: float = 0.0
    ready_at: float = 0.0

    def begin(self, job: int, points: int, now: float) -> None:
        """A full run starts drawing `points` points of `job`."""
        self.job, self.points, self.started = job, points, now
        self.ready_at = now + FIRST_DRAW_GRACE_S

    def end(self, now: float) -> None:
        """The full run has sent its charts: the next one at once while nothing was drawn, else after
        max(redraw_s, share × this one's cost)."""
        wait = max(self.redraw_s, self.share * (now - self.started)) if self.points else 0.0
        self.ready_at = now + wait

    def tick_every(self, points_per_s: float | None = None) -> float:
        """Seconds between progress ticks: a replay's own pace (its points are drawn by full runs), else the
        first-point pace until points are drawn."""
        if points_per_s:
            return max(1 / points_per_s, self.first_tick_s)
        return self.tick_s if self.points else self.first_tick_s

    def wants_redraw(self, job: int, done: int, now: float) -> bool:
        """Whether a tick should ask for a full run: another job, or points not drawn yet, and the wait is over."""
        return (job != self.job or done > self.points) and now >= self.ready_at
