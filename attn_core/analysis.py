"""What measured points say: log-log slopes with the n range they were fitted on, theory curves scaled to the points
by least squares in log space, crossover lengths n* against softmax and SDPA, and a summary table."""
from __future__ import annotations

import json
import math
from typing import Callable

import numpy as np
import pandas as pd

from .mechanisms import MECHANISMS
from .spec import MechanismSpec, Shape

METRICS = {"time_median_s": "time", "peak_bytes": "memory"}
SERIES = ["mechanism", "params"]  # one line of a chart: a mechanism with one setting of its parameters


def _check_metric(metric: str) -> None:
    if metric not in METRICS:
        raise ValueError(f"metric {metric!r} is unknown; choose {' or '.join(METRICS)}")


def ok_points(df: pd.DataFrame, metric: str) -> pd.DataFrame:
    """Rows with status ok and a positive, finite value of the metric (the only ones a fit may use)."""
    _check_metric(metric)
    keep = (df["status"] == "ok") & np.isfinite(df[metric].astype(float)) & (df[metric].astype(float) > 0)
    return df.loc[keep]


def series_name(mechanism: str, label: str, params: str) -> str:
    """'Sliding window (window=128)': the label, plus the parameters that differ from the spec's defaults."""
    values = json.loads(params or "{}")
    spec = MECHANISMS.get(mechanism)
    defaults = spec.defaults if spec is not None else {}
    changed = {k: v for k, v in values.items() if defaults.get(k) != v}
    return f"{label} ({', '.join(f'{k}={v}' for k, v in changed.items())})" if changed else label


def _groups(df: pd.DataFrame):
    for (mechanism, params), g in df.groupby(SERIES, sort=False):
        yield mechanism, params, series_name(mechanism, g["label"].iloc[0], params), g.sort_values("n")


def fit_slopes(df: pd.DataFrame, metric: str = "time_median_s", n_min: int | None = None) -> pd.DataFrame:
    """Per series, the slope of log(metric) against log(n) by least squares over the ok points with n ≥ n_min:
    DataFrame[mechanism, metric, slope, n_min, n_max, points, params, series]. slope is NaN below 2 points."""
    rows = []
    for mechanism, params, name, g in _groups(ok_points(df, metric)):
        g = g[g["n"] >= n_min] if n_min else g
        n, y = g["n"].to_numpy(float), g[metric].to_numpy(float)
        slope = float(np.polyfit(np.log(n), np.log(y), 1)[0]) if len(set(n)) >= 2 else math.nan
        rows.append({"mechanism": mechanism, "metric": metric, "slope": slope,
                     "n_min": int(n.min()) if len(n) else 0, "n_max": int(n.max()) if len(n) else 0,
                     "points": len(n), "params": params, "series": name})
    return pd.DataFrame(rows, columns=["mechanism", "metric", "slope", "n_min", "n_max", "points", "params",
                                       "series"])


def _own_curve(spec: MechanismSpec, metric: str, row: pd.Series) -> tuple[str, Callable[[int], float]]:
    """The spec's own cost as a function of n at this row's shape and parameters, with its big-O label."""
    params = spec.resolved(json.loads(row["params"] or "{}"))
    cost = spec.flops if metric == "time_median_s" else spec.memory_bytes
    big_o = spec.time_big_o if metric == "time_median_s" else spec.memory_big_o

    def at(n: int) -> float:
        shape = Shape(int(row["batch"]), int(row["heads"]), n, n, int(row["head_dim"]), row["dtype"],
                      bool(row["causal"]))
        return float(cost(shape, **params))
    return big_o, at


def _grid(measured: np.ndarray, points: int) -> np.ndarray:
    """The measured n and `points` log-spaced integers between the smallest and the largest of them."""
    spread = np.round(np.geomspace(measured.min(), measured.max(), points))
    return np.unique(np.concatenate([spread, measured]).astype(int))


def theory_curves(df: pd.DataFrame, metric: str = "time_median_s", points: int = 32,
                  registry: dict[str, MechanismSpec] | None = None) -> pd.DataFrame:
    """Per series, c·n², c·n and c·(the spec's own cost at n) on the measured n and `points` log-spaced n between
    them, each c fitted to the ok
    points by least squares in log space (log c = mean(log y − log f(n))).
    DataFrame[mechanism, curve, n, value, kind ('n²' | 'n' | 'spec'), params, series, metric]; curve labels read
    'O(n²) fit', 'O(n) fit' and the spec's big-O, e.g. 'O(n·w·d) fit'."""
    registry = MECHANISMS if registry is None else registry
    out = []
    for mechanism, params, name, g in _groups(ok_points(df, metric)):
        n, y = g["n"].to_numpy(float), g[metric].to_numpy(float)
        grid = _grid(n, points)
        curves = [("O(n²) fit", "n²", lambda x: float(x) ** 2), ("O(n) fit", "n", float)]
        spec = registry.get(mechanism)
        if spec is not None:
            big_o, at = _own_curve(spec, metric, g.iloc[0])
            label = f"{big_o} fit"
            curves.append((label if label not in ("O(n²) fit", "O(n) fit") else f"{label} (spec)", "spec", at))
        for label, kind, f in curves:
            base = np.array([f(int(v)) for v in n])
            if not np.all(base > 0):
                continue
            c = math.exp(float(np.mean(np.log(y) - np.log(base))))
            out += [{"mechanism": mechanism, "curve": label, "n": int(v), "value": c * f(int(v)), "kind": kind,
                     "params": params, "series": name, "metric": metric} for v in grid]
    return pd.DataFrame(out, columns=["mechanism", "curve", "n", "value", "kind", "params", "series", "metric"])


def _crossing(ns: np.ndarray, ratio: np.ndarray) -> float:
    """log-log interpolated n where ratio (mechanism / baseline) falls below 1 for good; NaN when it does not."""
    below = ratio < 1
    if not below[-1] or below.all():
        return math.nan
    i = int(np.flatnonzero(~below)[-1])  # last point at or above the baseline; all after it are below
    lr0, lr1 = math.log(ratio[i]), math.log(ratio[i + 1])
    ln0, ln1 = math.log(ns[i]), math.log(ns[i + 1])
    return math.exp(ln0 + (ln1 - ln0) * (0 - lr0) / (lr1 - lr0)) if lr1 != lr0 else float(ns[i])


def crossovers(df: pd.DataFrame, metric: str = "time_median_s", baseline: str = "softmax") -> pd.DataFrame:
    """For every series but the baseline's: the n* above which it is faster (time) or smaller (memory) than the
    baseline and stays so, interpolated in log-log space between the measured n around the crossing.
    DataFrame[mechanism, baseline, metric, n_star, note, params, series]; n_star is NaN with a note when the
    crossing is not within the measured range."""
    ok = ok_points(df, metric)
    word = "faster" if metric == "time_median_s" else "smaller"
    base = ok[ok["mechanism"] == baseline]
    if not base.empty:
        base = base[base["params"] == base["params"].iloc[0]]
    base_by_n = base.groupby("n")[metric].median()
    rows = []
    for mechanism, params, name, g in _groups(ok[ok["mechanism"] != baseline]):
        mine = g.groupby("n")[metric].median()
        common = mine.index.intersection(base_by_n.index).sort_values()
        n_star, note = math.nan, ""
        if base_by_n.empty:
            note = f"{baseline} has no measured points to compare with"
        elif len(common) == 0:
            note = f"no n measured for both this mechanism and {baseline}"
        else:
            ns, ratio = common.to_numpy(float), (mine[common] / base_by_n[common]).to_numpy(float)
            n_star = _crossing(ns, ratio) if len(ns) >= 2 else math.nan
            if not math.isnan(n_star):
                i = int(np.searchsorted(ns, n_star))
                note = (f"{word} than {baseline} from n ≈ {n_star:.0f} (between n = {ns[max(i - 1, 0)]:.0f} "
                        f"and {ns[min(i, len(ns) - 1)]:.0f})")
            elif ratio[-1] < 1:
                note = (f"not within the measured range: already {word} than {baseline} at the smallest "
                        f"common n = {ns[0]:.0f}")
            else:
                note = f"not within the measured range: not {word} than {baseline} up to n = {ns[-1]:.0f}"
        rows.append({"mechanism": mechanism, "baseline": baseline, "metric": metric, "n_star": n_star,
                     "note": note, "params": params, "series": name})
    return pd.DataFrame(rows, columns=["mechanism", "baseline", "metric", "n_star", "note", "params", "series"])


def _ratio_at_largest_common(g: pd.DataFrame, base: pd.DataFrame, metric: str) -> tuple[float, float]:
    """(baseline / mechanism at the largest n both measured, that n); NaNs without a common n."""
    mine, theirs = g.groupby("n")[metric].median(), base.groupby("n")[metric].median()
    common = mine.index.intersection(theirs.index)
    if len(common) == 0:
        return math.nan, math.nan
    n = common.max()
    return float(theirs[n] / mine[n]), float(n)


def summary(df: pd.DataFrame) -> pd.DataFrame:
    """One row per series: fitted time and memory exponents, speed-up and memory saving (baseline ÷ mechanism,
    > 1 is better) against softmax and SDPA at the largest n both measured, achieved GFLOP/s and % of the device's
    matmul throughput at the largest measured n, the memory method, and how many points are ok."""
    slopes_t = fit_slopes(df, "time_median_s").set_index(SERIES)["slope"]
    slopes_m = fit_slopes(df, "peak_bytes").set_index(SERIES)["slope"]
    rows = []
    for (mechanism, params), g in df.groupby(SERIES, sort=False):
        row = {"mechanism": mechanism, "series": series_name(mechanism, g["label"].iloc[0], params),
               "params": params, "time_exponent": slopes_t.get((mechanism, params), math.nan),
               "memory_exponent": slopes_m.get((mechanism, params), math.nan)}
        for baseline in ("softmax", "sdpa"):
            for metric, name in (("time_median_s", "speedup"), ("peak_bytes", "memory_saving")):
                ok = ok_points(df, metric)
                base = ok[ok["mechanism"] == baseline]
                ratio, n = _ratio_at_largest_common(ok_points(g, metric), base, metric)
                row[f"{name}_vs_{baseline}"] = ratio
                if metric == "time_median_s":
                    row[f"at_n_vs_{baseline}"] = n
        timed = ok_points(g, "time_median_s").sort_values("n")
        last = timed.iloc[-1] if len(timed) else None
        row.update({"gflops": float(last["gflops"]) if last is not None else math.nan,
                    "pct_of_device": float(last["pct_of_device"]) if last is not None else math.nan,
                    "memory_method": next((m for m in g["memory_method"] if m), ""),
                    "ok_points": int((g["status"] == "ok").sum()), "points": len(g)})
        rows.append(row)
    return pd.DataFrame(rows, columns=[
        "mechanism", "series", "params", "time_exponent", "memory_exponent", "speedup_vs_softmax",
        "memory_saving_vs_softmax", "at_n_vs_softmax", "speedup_vs_sdpa", "memory_saving_vs_sdpa", "at_n_vs_sdpa",
        "gflops", "pct_of_device", "memory_method", "ok_points", "points"])
