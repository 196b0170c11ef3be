"""A sweep as data: the mechanisms with their parameters, the lengths, the problem every point shares and the
measurement settings, each a value held once; its validation before anything runs, the default sweep, and its plan:
one Problem per point."""
from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass
from typing import Any, Mapping

from . import env
from ..mechanisms import MEASURED
from ..spec import MechanismSpec
from .problem import FIELDS, MAX_COUNT, Problem, Settings

# The problem's fields a sweep's points share, flat in a run file's config; mechanism, params and n are the points'.
_SHARED = FIELDS - {"mechanism", "params", "n", "n_kv"}
_SETTINGS = frozenset(f.name for f in dataclasses.fields(Settings))
MAX_POINTS = 1000  # mechanisms × lengths: a sweep of more is a typo (`--n` with thousands of values), not a plan


@dataclass(frozen=True, kw_only=True)
class SweepConfig:
    """Each (mechanism key, its parameters) measured at each n of `ns`, on `problem` (the fields every point shares;
    its own mechanism and n are replaced by each point's), with one set of `settings` (how each point is timed and
    guarded)."""

    mechanisms: tuple[tuple[str, dict], ...]
    ns: tuple[int, ...]
    problem: Problem = Problem()
    settings: Settings = Settings()

    def problems(self, registry: Mapping[str, MechanismSpec] | None = None) -> list[str]:
        """Every reason this sweep cannot run, each a sentence saying what to change; [] when it can: the problem of
        each mechanism at the shortest n (Problem.problems, the one place a problem is validated) and the settings."""
        registry = MEASURED if registry is None else registry
        lengths = self._length_problems()
        shortest = min(self.ns) if not lengths else 1
        found = lengths + dataclasses.replace(self.problem, n=shortest).problems() + self.settings.problems()
        if not self.mechanisms:
            found.append("no mechanism is selected; choose at least one")
        if not lengths and self.points > MAX_POINTS:
            found.append(self._too_many())
        if found:
            return list(dict.fromkeys(found))
        for key, params in self.mechanisms:
            if key not in registry:
                found.append(f"mechanism {key!r} is unknown; choose one of {', '.join(registry)}")
                continue
            point = self.problem.at(key, params, shortest)  # a series' own key/value heads are checked here too
            found += [text.replace("the sequence length", "the shortest sequence length")
                      for text in (point.size_problems() or point.spec_problems(registry[key]))]
        return list(dict.fromkeys(found))

    @property
    def points(self) -> int:
        """How many points the sweep measures: each mechanism at each distinct length."""
        return len(set(self.ns)) * len(self.mechanisms)

    def _too_many(self) -> str:
        lengths, mechanisms = len(set(self.ns)), len(self.mechanisms)
        most = MAX_POINTS // mechanisms
        fewer = (f"give fewer lengths (at most {most:,} with {mechanisms:,} mechanisms, e.g. 256:65536:9) or fewer "
                 "mechanisms" if most else f"choose at most {MAX_POINTS:,} mechanisms")
        return (f"the sweep has {lengths:,} lengths × {mechanisms:,} mechanisms = {self.points:,} points, more than "
                f"the {MAX_POINTS:,} a sweep may have; {fewer}")

    def _length_problems(self) -> list[str]:
        if not self.ns:
            return ["no sequence length is given; give at least one n"]
        bad = [n for n in self.ns if not (isinstance(n, int) and not isinstance(n, bool) and 1 <= n < MAX_COUNT)]
        if bad:
            shown = ", ".join(map(str, bad[:5])) + (f" and {len(bad) - 5:,} more" if len(bad) > 5 else "")
            return [f"sequence lengths must be positive integers below 2**40, got {shown}"]
        return []

    def replaced(self, **changes: Any) -> "SweepConfig":
        """A copy with some fields changed, each named as in a run file (`device`, `warmup`, `ns`, ...): a name goes
        to the value that holds it; TypeError for a name no part has."""
        unknown = set(changes) - _SHARED - _SETTINGS - {"mechanisms", "ns"}
        if unknown:
            raise TypeError(f"a sweep has no setting {', '.join(sorted(unknown))}")
        return dataclasses.replace(
            self, **{k: v for k, v in changes.items() if k in ("mechanisms", "ns")},
            problem=dataclasses.replace(self.problem, **{k: v for k, v in changes.items() if k in _SHARED}),
            settings=dataclasses.replace(self.settings, **{k: v for k, v in changes.items() if k in _SETTINGS}))

    def to_dict(self) -> dict:
        """Plain JSON-ready data, flat as run files hold it: mechanisms as [[key, params], ...], ns as a list, then
        the shared problem's and the settings' fields."""
        shared = {k: v for k, v in dataclasses.asdict(self.problem).items() if k in _SHARED}
        return {"mechanisms": [[key, dict(params)] for key, params in self.mechanisms], "ns": list(self.ns),
                **shared, **dataclasses.asdict(self.settings)}

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> "SweepConfig":
        """Inverse of to_dict (a file saved before key/value heads and padding were settings reads as without
        them); ValueError naming any unknown or malformed setting."""
        names = _SHARED | _SETTINGS | {"mechanisms", "ns"}
        unknown = set(d) - names
        if unknown:
            raise ValueError(f"unknown sweep settings {', '.join(sorted(unknown))}; known: {', '.join(sorted(names))}")
        try:
            mechanisms = tuple((str(key), dict(params)) for key, params in d["mechanisms"])
            ns = tuple(int(n) for n in d["ns"])
        except (KeyError, TypeError, ValueError) as e:
            raise ValueError(f"a sweep needs 'mechanisms' as [[key, params], ...] and 'ns' as numbers ({e})") from None
        return cls(mechanisms=mechanisms, ns=ns, problem=Problem(**{k: v for k, v in d.items() if k in _SHARED}),
                   settings=Settings(**{k: v for k, v in d.items() if k in _SETTINGS}))


def log_spaced(n_min: int, n_max: int, steps: int) -> tuple[int, ...]:
    """`steps` integers from n_min to n_max, evenly spaced in log n (duplicates after rounding dropped):
    log_spaced(256, 4096, 5) = (256, 512, 1024, 2048, 4096)."""
    if not (1 <= n_min <= n_max) or steps < 1:
        raise ValueError(f"need 1 ≤ n_min ≤ n_max and steps ≥ 1, got {n_min}, {n_max}, {steps}")
    if steps == 1 or n_min == n_max:
        return (n_min,) if n_min == n_max or steps == 1 else (n_min, n_max)
    ratio = math.log(n_max / n_min) / (steps - 1)
    return tuple(dict.fromkeys(round(n_min * math.exp(i * ratio)) for i in range(steps)))


# The dashboard's first chart tells one story in four lines: the quadratic wall (softmax) and the three ways
# around it: a fused exact kernel (same arithmetic, memory O(n)), a sparse pattern (the window), a kernel feature
# map (linear). The other mechanisms are one click away; eight lines and their curves on one chart were a tangle.
DEFAULT_MECHANISMS = ("softmax", "sdpa", "sliding_window", "linear")
DEFAULT_SWEEP = SweepConfig(
    mechanisms=tuple((key, {}) for key in DEFAULT_MECHANISMS), ns=log_spaced(256, 4096, 5),
    problem=Problem(batch=1, heads=8, d_model=512, dtype="float32", device="auto", mode="forward"),
    settings=Settings(warmup=1, min_repeats=3, min_time_s=0.05, point_budget_s=10.0),
)
"""The dashboard's default: DEFAULT_MECHANISMS at their defaults, n = 256 … 4096, short timing (~6 s, 2 idle
cores)."""


def plan(config: SweepConfig) -> list[Problem]:
    """The points in the order they run, each a whole Problem: n ascending, the mechanisms in their order at each n
    (so a chart fills from the left and a time budget can skip the larger n of one mechanism)."""
    problem = dataclasses.replace(config.problem, device=env.resolve_device(config.problem.device))
    return [problem.at(key, params, n) for n in sorted(set(config.ns)) for key, params in config.mechanisms]
