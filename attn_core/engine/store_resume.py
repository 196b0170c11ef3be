"""Resuming a stored run: the sweeps that measure the points an interrupted or failed run lacks, and what differs
from the environment it was measured in."""
from __future__ import annotations

import dataclasses
import json
import socket
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Mapping

from attn_core.engine.store_file import StoreError

if TYPE_CHECKING:
    from attn_core.engine.store import Store

HAD = ("ok", "skipped", "oom")  # a point of these statuses is measured (or deliberately not); failed or cancelled
# points, and those never reached, are what a resume measures
_JSON_KINDS = {list: "list", str: "string", int: "number", float: "number", bool: "boolean", type(None): "null"}
_SAME_ENV = ("device_name", "cpu", "torch", "python", "os", "cuda", "dtype")


@dataclass(frozen=True)
class Resume:
    """What measuring the rest of run `run_id` takes: `sweeps`, one per series with the lengths it lacks (empty
    when nothing is missing), `missing` points in all, and `notes`: sentences on what differs from the run's own
    environment (another host, device, torch...)."""

    run_id: int
    sweeps: tuple
    missing: int
    notes: tuple[str, ...] = ()


def _point_key(mechanism: str, n: int, kv_heads: int, params: Mapping, sinks: bool = False,
               keep_first: int = 0) -> tuple:
    return mechanism, int(n), int(kv_heads), json.dumps(dict(params), sort_keys=True), bool(sinks), int(keep_first)


def resumable(source: Store, run_id: int) -> list[dict]:
    """The sweeps (as run files hold them) that run `run_id` was measured with: its config's "sweeps" list, or the
    config itself for a run of one sweep. StoreError for a run that is not interrupted or failed, or whose config
    holds no sweep (an empty list, a list, text)."""
    return _sweeps_of(run_id, source.info(run_id)["status"], source.run(run_id).config)


def _sweeps_of(run_id: int, status: str, config: Any) -> list[dict]:
    if status not in ("interrupted", "failed"):
        raise StoreError(f"run {run_id} is {status}; only an interrupted or failed run can be resumed")
    sweeps = config.get("sweeps", [config]) if isinstance(config, dict) else None
    if not isinstance(sweeps, list) or not sweeps or not all(isinstance(s, dict) for s in sweeps):
        held = ("an empty list of sweeps" if sweeps == [] else "'sweeps' that are not a list of sweeps"
                if isinstance(config, dict) else f"a JSON {_JSON_KINDS.get(type(config), 'value')}, not a sweep")
        raise StoreError(f"run {run_id}'s config holds {held}, so what it lacks cannot be known; measure it again as "
                         "a new sweep")
    return sweeps


def resume_plan(source: Store, run_id: int, environment: Mapping | None = None) -> Resume:
    """The sweeps that measure the points run `run_id` lacks: each planned point (of its config, one sweep or
    several) without a stored point of status in HAD, grouped by series. `environment`: the stamp to compare with
    the run's (env.environment of the device and dtype); the notes say what differs. StoreError for a run that is
    complete or running, or whose config cannot be read back."""
    from attn_core.engine.config import SweepConfig
    from attn_core.engine.measurement import theory_of
    from attn_core.mechanisms import MEASURED

    info, run = source.info(run_id), source.run(run_id)
    try:
        configs = [SweepConfig.from_dict(c) for c in _sweeps_of(run_id, info["status"], run.config)]
    except (ValueError, TypeError) as e:
        raise StoreError(f"run {run_id}'s config cannot be read back ({e}); measure it again as a new sweep") from None
    had = {_point_key(r["mechanism"], r["n"], r["kv_heads"], json.loads(r["params"] or "{}"), r["sinks"],
                      r["keep_first"])
           for r in run.frame.to_dict("records") if r["status"] in HAD}
    sweeps, missing = [], 0
    for config in configs:
        lacking: dict[tuple, list] = {}  # the lengths a series lacks → the series lacking them: one sweep each
        for key, series_params in config.mechanisms:
            ns = []
            for n in sorted(set(config.ns)):
                problem = config.problem.at(key, series_params, n)
                spec = MEASURED.get(key)
                params = theory_of(spec, problem).params if spec is not None else dict(problem.params)
                if _point_key(key, n, problem.key_heads, params, problem.sinks, problem.keep_first) not in had:
                    ns.append(n)
            if ns:
                lacking.setdefault(tuple(ns), []).append((key, series_params))
                missing += len(ns)
        sweeps += [dataclasses.replace(config, mechanisms=tuple(series), ns=ns) for ns, series in lacking.items()]
    return Resume(run_id, tuple(sweeps), missing, _differences(run.env, info, environment))


def _differences(stamp: Mapping, info: Mapping, environment: Mapping | None) -> tuple[str, ...]:
    notes = []
    if info.get("host") and info["host"] != socket.gethostname():
        notes.append(f"run {info['id']} was measured on another host ({info['host']}); its points and the new ones "
                     "will not be comparable")
    if environment:
        changed = [f"{k} {stamp.get(k)!s} → {environment.get(k)!s}" for k in _SAME_ENV
                   if k in stamp and stamp.get(k) != environment.get(k)]
        if changed:
            notes.append("the environment changed since the run was measured: " + "; ".join(changed))
    return tuple(notes)
