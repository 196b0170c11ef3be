"""What measured points say: log-log slopes with the n range they were fitted on, theory curves scaled to the points
by least squares in log space, the hardware limit of the device's matmul throughput, crossover lengths n* against
softmax and SDPA, a summary table, and the sentences that say what the data cannot support."""
from __future__ import annotations

import json
import math
from typing import Callable

import numpy as np
import pandas as pd

from ..mechanisms import MEASURED
from ..spec import MechanismSpec, Shape
from .positions import NAMES
from .problem import sharing

METRICS = {"time_median_s": "time", "peak_bytes": "memory"}
# one line of a chart: a mechanism with one setting of its parameters and of its key/value heads
SERIES = ["mechanism", "params", "kv_heads"]
IMPLEMENTED_BY = {"flex": "compiled Flex", "dense-mask": "dense-mask SDPA"}  # series names; "ours" says nothing
MIN_FIT_POINTS = 3  # two points give a slope whatever their noise: a sweep stopped after two once gave n^-4.36
ABOVE_DEVICE = ("above the device's measured matmul throughput: the matmul figure or this point was disturbed, or "
                "the kernel takes a faster path than a dense matmul")


def _check_metric(metric: str) -> None:
    if metric not in METRICS:
        raise ValueError(f"metric {metric!r} is unknown; choose {' or '.join(METRICS)}")


def ok_points(df: pd.DataFrame, metric: str) -> pd.DataFrame:
    """Rows with status ok and a positive, finite value of the metric (the only ones a fit may use)."""
    _check_metric(metric)
    keep = (df["status"] == "ok") & np.isfinite(df[metric].astype(float)) & (df[metric].astype(float) > 0)
    return df.loc[keep]


def clean_points(df: pd.DataFrame, metric: str) -> pd.DataFrame:
    """ok_points less, for time, the disturbed ones (timed while other programs kept taking CPU): the points fits,
    theory curves, n* and speed-ups use. A peak allocation does not depend on contention: memory keeps them."""
    ok = ok_points(df, metric)
    return ok.loc[_undisturbed(ok, metric)]


def _undisturbed(ok: pd.DataFrame, metric: str) -> np.ndarray:
    """Which of these ok points are clean for `metric` (see clean_points)."""
    if metric != "time_median_s" or "disturbed" not in ok:
        return np.ones(len(ok), bool)
    return ~ok["disturbed"].to_numpy(bool)


def _too_few(clean: int, disturbed: int) -> str:
    """Why there is no exponent: 'needs 3 clean points, has 2 (1 disturbed left out)'."""
    left_out = f" ({disturbed} disturbed left out)" if disturbed else ""
    return f"needs {MIN_FIT_POINTS} clean points, has {clean}{left_out}"


def series_name(mechanism: str, label: str, params: str, heads: int | None = None,
                kv_heads: int | None = None, positions: str = "none", implementation: str = "ours",
                sinks: bool = False, keep_first: int = 0) -> str:
    """'Sliding window (window=128)': the label, plus the parameters that differ from the spec's defaults, ' + RoPE'
    or ' + ALiBi' with positions, 'GQA-2' or 'MQA' where the key/value heads are shared ('Softmax (fused SDPA) ·
    GQA-2'), ' · sinks' and ' · keeps first 4' (Problem.sinks, keep_first), and who ran it when not our kernel
    ('Sliding window · compiled Flex')."""
    values = json.loads(params or "{}")
    spec = MEASURED.get(mechanism)
    defaults = spec.defaults if spec is not None else {}
    changed = {k: v for k, v in values.items() if defaults.get(k) != v}
    name = f"{label} ({', '.join(f'{k}={v}' for k, v in changed.items())})" if changed else label
    name += f" + {NAMES[positions]}" if positions in ("rope", "alibi") else ""
    shared = heads is not None and kv_heads is not None and int(kv_heads) != int(heads)
    name = f"{name} · {sharing(int(heads), int(kv_heads))}" if shared else name
    name += " · sinks" if sinks else ""
    name += f" · keeps first {int(keep_first)}" if keep_first else ""
    return f"{name} · {IMPLEMENTED_BY[implementation]}" if implementation in IMPLEMENTED_BY else name


def row_series_name(row: pd.Series) -> str:
    """series_name of a result row."""
    return series_name(row["mechanism"], row["label"], row["params"], row["heads"], row["kv_heads"],
                       row.get("positions", "none"), row.get("implementation", "ours"), row.get("sinks", False),
                       row.get("keep_first", 0))


def _series(df: pd.DataFrame) -> list[str]:
    """The columns that tell series apart: SERIES, and the positions, implementation, sinks and kept first tokens
    where the frame has them."""
    return SERIES + [c for c in ("positions", "implementation", "sinks", "keep_first") if c in df.columns]


def _groups(df: pd.DataFrame):
    for key, g in df.groupby(_series(df), sort=False):
        yield *key[:3], row_series_name(g.iloc[0]), g.sort_values("n")


def loglog_slope(n, y) -> float:
    """The exponent b of y ∝ n^b: the least-squares slope of log y against log n (NaN with fewer than 2 distinct n).
    The one place such a slope is computed: fit_slopes and the benchmark scripts use it."""
    n, y = np.asarray(n, float), np.asarray(y, float)
    if len(set(n.tolist())) < 2:
        return math.nan
    return float(np.polyfit(np.log(n), np.log(y), 1)[0])


def fit_slopes(df: pd.DataFrame, metric: str = "time_median_s", n_min: int | None = None) -> pd.DataFrame:
    """Per series, the slope of log(metric) against log(n) by least squares over the clean points with n ≥ n_min:
    DataFrame[mechanism, metric, slope, n_min, n_max, points, disturbed, why, params, series]. slope is NaN, and
    `why` says so, below MIN_FIT_POINTS distinct n; `disturbed` counts the ok points left out."""
    _check_metric(metric)
    rows = []
    for mechanism, params, kv_heads, name, g in _groups(df):
        ok = ok_points(g[g["n"] >= n_min] if n_min else g, metric)
        clean = ok.loc[_undisturbed(ok, metric)]
        n, y = clean["n"].to_numpy(float), clean[metric].to_numpy(float)
        enough = len(set(n)) >= MIN_FIT_POINTS
        slope = loglog_slope(n, y) if enough else math.nan
        rows.append({"mechanism": mechanism, "metric": metric, "slope": slope,
                     "n_min": int(n.min()) if len(n) else 0, "n_max": int(n.max()) if len(n) else 0,
                     "points": len(n), "disturbed": len(ok) - len(clean),
                     "why": "" if enough else _too_few(len(set(n)), len(ok) - len(clean)),
                     "params": params, "kv_heads": kv_heads, "series": name,
                     "positions": g.iloc[0].get("positions", "none"),
                     "implementation": g.iloc[0].get("implementation", "ours"),
                     "sinks": g.iloc[0].get("sinks", False), "keep_first": g.iloc[0].get("keep_first", 0)})
    return pd.DataFrame(rows, columns=["mechanism", "metric", "slope", "n_min", "n_max", "points", "disturbed",
                                       "why", "params", "kv_heads", "series", "positions", "implementation",
                                       "sinks", "keep_first"])


def _own_curve(spec: MechanismSpec, metric: str, row: pd.Series) -> tuple[str, Callable[[int], float]]:
    """The spec's own cost as a function of n at this row's shape and parameters, with its big-O label: the
    forward call's FLOPs or peak memory, or, generating, a step's FLOPs or the cache's bytes after n tokens."""
    params = spec.resolved(json.loads(row["params"] or "{}"))
    time = metric == "time_median_s"
    if row["mode"] == "generate" and spec.supports.generation is not None:
        gen = spec.supports.generation
        params |= {"keep_first": int(row["keep_first"])} if row.get("keep_first", 0) else {}  # StreamingLLM
        cost, big_o = (gen.flops, gen.step_big_o) if time else (gen.cache_bytes, gen.cache_big_o)
    else:
        memory = spec.cost.sinks_memory if row.get("sinks", False) else spec.cost.memory_bytes
        cost = spec.cost.flops if time else memory
        big_o = spec.cost.time_big_o if time else spec.cost.memory_big_o

    def at(n: int) -> float:
        shape = Shape(int(row["batch"]), int(row["heads"]), n, n, int(row["head_dim"]), dtype=row["dtype"],
                      causal=bool(row["causal"]), Hk=int(row["kv_heads"]), device=str(row["device"]))
        return float(cost(shape, **params))
    return big_o, at


def _grid(measured: np.ndarray, points: int) -> np.ndarray:
    """The measured n and `points` log-spaced integers between the smallest and the largest of them."""
    spread = np.round(np.geomspace(measured.min(), measured.max(), points))
    return np.unique(np.concatenate([spread, measured]).astype(int))


def theory_curves(df: pd.DataFrame, metric: str = "time_median_s", points: int = 32,
                  registry: dict[str, MechanismSpec] | None = None) -> pd.DataFrame:
    """Per series, c·n², c·n and c·(the spec's own cost at n) on the measured n and `points` log-spaced n between
    them, each c fitted to the clean points by least squares in log space (log c = mean(log y − log f(n))); a series
    without clean points gets no curve (see unfitted).
    DataFrame[mechanism, curve, n, value, kind ('n²' | 'n' | 'spec'), params, series, metric]; curve labels read
    'O(n²) fit', 'O(n) fit' and the spec's big-O, e.g. 'O(n·w·d) fit'."""
    registry = MEASURED if registry is None else registry
    out = []
    for mechanism, params, _, name, ok in _groups(ok_points(df, metric)):
        g = ok.loc[_undisturbed(ok, metric)]
        if g.empty:
            continue
        n, y = g["n"].to_numpy(float), g[metric].to_numpy(float)
        grid = _grid(ok["n"].to_numpy(float), points)  # under the disturbed points too
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


def unfitted(df: pd.DataFrame, metric: str = "time_median_s") -> list[str]:
    """The series that have ok points but no clean one, so no fitted curve: their names."""
    ok = ok_points(df, metric)
    return [name for *_, name, g in _groups(ok) if clean_points(g, metric).empty]


def device_gflops(df: pd.DataFrame) -> float:
    """The sweep's one figure for this device's dense matmul throughput (GFLOP/s): the median of its rows' finite,
    positive device_gflops; NaN when none was measured."""
    values = pd.to_numeric(df["device_gflops"], errors="coerce") if "device_gflops" in df else pd.Series([], float)
    values = values[np.isfinite(values) & (values > 0)]
    return float(values.median()) if len(values) else math.nan


def roofline(df: pd.DataFrame, gflops: float | None = None) -> pd.DataFrame:
    """Per series, the hardware limit on time: executed_flops / (gflops · 1e9) at each measured n, one device figure
    for every series (by default device_gflops(df)). Rows as theory_curves' with kind 'roofline'; empty without a
    figure."""
    gflops = device_gflops(df) if gflops is None else gflops
    label = f"hardware limit at {gflops:,.3g} GFLOP/s (matmul, measured)"
    out = []
    if math.isfinite(gflops):
        for mechanism, params, _, name, g in _groups(ok_points(df, "time_median_s")):
            flops = g.drop_duplicates("n")[["n", "executed_flops"]]
            out += [{"mechanism": mechanism, "curve": label, "n": int(n), "value": f / (gflops * 1e9),
                     "kind": "roofline", "params": params, "series": name, "metric": "time_median_s"}
                    for n, f in flops.itertuples(index=False) if np.isfinite(f) and f > 0]
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
    ok = clean_points(df, metric)
    word = "faster" if metric == "time_median_s" else "smaller"
    base = ok[ok["mechanism"] == baseline]
    base = first_series(base)
    base_by_n = base.groupby("n")[metric].median()
    rows = []
    for mechanism, params, _, name, g in _groups(ok[ok["mechanism"] != baseline]):
        mine = g.groupby("n")[metric].median()
        common = mine.index.intersection(base_by_n.index).sort_values()
        n_star, note = math.nan, ""
        if base_by_n.empty:
            measured = not ok_points(df[df["mechanism"] == baseline], metric).empty
            note = f"{baseline} has no {'clean ' if measured else ''}measured points to compare with"
        elif len(common) == 0:
            note = f"no n measured for both this mechanism and {baseline}"
        else:
            ns, ratio = common.to_numpy(float), (mine[common] / base_by_n[common]).to_numpy(float)
            n_star = _crossing(ns, ratio) if len(ns) >= 2 else math.nan
            if not math.isnan(n_star):
                i = int(np.searchsorted(ns, n_star))
                note = (f"{word} than {baseline} from n ≈ {rounded_n(n_star)} (between n = {ns[max(i - 1, 0)]:.0f} "
                        f"and {ns[min(i, len(ns) - 1)]:.0f})")
            elif ratio[-1] < 1:
                note = (f"not within the measured range: already {word} than {baseline} at the smallest "
                        f"common n = {ns[0]:.0f}")
            else:
                note = f"not within the measured range: not {word} than {baseline} up to n = {ns[-1]:.0f}"
        rows.append({"mechanism": mechanism, "baseline": baseline, "metric": metric, "n_star": n_star,
                     "note": note, "params": params, "series": name})
    return pd.DataFrame(rows, columns=["mechanism", "baseline", "metric", "n_star", "note", "params", "series"])


def rounded_n(n_star: float) -> int:
    """n* to two significant figures: what interpolating between a sweep's log-spaced lengths can tell (identical
    runs on one machine gave 215 to 218, and 280 when it was busy)."""
    return int(float(f"{n_star:.2g}"))


def first_series(rows: pd.DataFrame) -> pd.DataFrame:
    """The rows of the first series among `rows` (a baseline's: its first parameters and key/value heads)."""
    if rows.empty:
        return rows
    first = rows.iloc[0]
    return rows[(rows["params"] == first["params"]) & (rows["kv_heads"] == first["kv_heads"])]


def _ratio_at_largest_common(g: pd.DataFrame, base: pd.DataFrame, metric: str) -> tuple[float, float]:
    """(baseline / mechanism at the largest n both measured, that n); NaNs without a common n."""
    mine, theirs = g.groupby("n")[metric].median(), base.groupby("n")[metric].median()
    common = mine.index.intersection(theirs.index)
    if len(common) == 0:
        return math.nan, math.nan
    n = common.max()
    return float(theirs[n] / mine[n]), float(n)


def summary(df: pd.DataFrame) -> pd.DataFrame:
    """One row per series: fitted time and memory exponents (NaN below MIN_FIT_POINTS clean points), speed-up and
    memory saving (baseline ÷ mechanism, > 1 is better) against softmax and SDPA, each at the largest n both measured
    clean and with the n it was taken at (at_n_vs_*: the speed-up's, memory_at_n_vs_*: the saving's; a disturbed
    time leaves the speed-up at a smaller n than the saving), GFLOP/s on executed and on useful FLOPs and % of the
    device's matmul throughput at the largest clean n, the memory method, how many points are ok, and a note saying
    why a figure is missing or above 100 %."""
    fits = {metric: fit_slopes(df, metric).set_index(_series(df)) for metric in METRICS}
    clean = {metric: clean_points(df, metric) for metric in METRICS}
    rows = []
    for key, g in df.groupby(_series(df), sort=False):
        mechanism, params, *_ = key
        row = {"mechanism": mechanism, "series": row_series_name(g.iloc[0]),
               "params": params, "time_exponent": fits["time_median_s"]["slope"].get(key, math.nan),
               "memory_exponent": fits["peak_bytes"]["slope"].get(key, math.nan)}
        for baseline in ("softmax", "sdpa"):
            for metric, name in (("time_median_s", "speedup"), ("peak_bytes", "memory_saving")):
                base = first_series(clean[metric][clean[metric]["mechanism"] == baseline])
                ratio, n = _ratio_at_largest_common(clean_points(g, metric), base, metric)
                row[f"{name}_vs_{baseline}"] = ratio
                row[f"{'at_n' if metric == 'time_median_s' else 'memory_at_n'}_vs_{baseline}"] = n
        timed = clean_points(g, "time_median_s").sort_values("n")
        last = timed.iloc[-1] if len(timed) else None
        row.update({"gflops": float(last["gflops"]) if last is not None else math.nan,
                    "useful_gflops": float(last["theory_flops"] / last["time_median_s"] / 1e9)
                    if last is not None else math.nan,
                    "pct_of_device": float(last["pct_of_device"]) if last is not None else math.nan,
                    "memory_method": next(iter(ok_points(g, "peak_bytes")["memory_method"]), "not measured"),
                    "ok_points": int((g["status"] == "ok").sum()), "points": len(g)})
        row["note"] = _row_note(fits, key, row["pct_of_device"])
        rows.append(row)
    return pd.DataFrame(rows, columns=[
        "mechanism", "series", "params", "time_exponent", "memory_exponent", "speedup_vs_softmax", "at_n_vs_softmax",
        "memory_saving_vs_softmax", "memory_at_n_vs_softmax", "speedup_vs_sdpa", "at_n_vs_sdpa",
        "memory_saving_vs_sdpa", "memory_at_n_vs_sdpa",
        "gflops", "useful_gflops", "pct_of_device", "memory_method", "ok_points", "points", "note"])


def _row_note(fits: dict[str, pd.DataFrame], key: tuple, pct: float) -> str:
    """'time and memory k: needs 3 clean points, has 2'; and ABOVE_DEVICE where % of device exceeds 100."""
    why = {METRICS[m]: fit["why"].get(key, "") for m, fit in fits.items()}
    if why["time"] and why["time"] == why["memory"]:
        notes = [f"time and memory k: {why['time']}"]
    else:
        notes = [f"{what} k: {text}" for what, text in why.items() if text]
    if pct > 100:
        notes.append(f"{pct:.0f} % of device: {ABOVE_DEVICE}")
    return "; ".join(notes)


def contention_summary(df: pd.DataFrame) -> str:
    """The line a page shows when other programs disturbed a sweep: how many points stayed disturbed and how many
    cores others took (the mean over those points), and how many were re-measured clean; '' when none was."""
    ok = df[df["status"] == "ok"]
    disturbed = ok[ok["disturbed"].astype(bool)]
    retaken = ok[~ok["disturbed"].astype(bool) & (ok["retaken"] > 0)]
    lines = []
    if len(disturbed):
        cores = disturbed["foreign_cpu"].astype(float).mean()  # NaN-skipping; NaN when none was recorded
        used = f" (they used about {cores:.1f} processor cores)" if math.isfinite(cores) else ""
        lines.append(f"The computer was busy with other programs while {len(disturbed)} of {len(ok)} points were "
                     f"timed{used}: those points are drawn hollow on the time chart and left out of the dashed "
                     "curves and n*.")
    if len(retaken):
        samples = int(retaken["retaken"].sum())
        lines.append(f"{len(retaken)} {'point was' if len(retaken) == 1 else 'points were'} slowed by other "
                     f"programs and timed again: {samples} slow {'run was' if samples == 1 else 'runs were'} "
                     "repeated until clean.")
    return " ".join(lines)


def matmul_note(stamp: dict) -> str:
    """The sentence for a run whose device matmul figure (the basis of % of device) was measured while other
    programs kept taking CPU from every sample of it; '' otherwise."""
    if not stamp.get("device_gflops_disturbed"):
        return ""
    return ("The device's matmul figure was measured while other programs were busy, so it reads low and every % of "
            "device reads high; measure again on a quiet machine.")


PRECISION_NOTE = ("Measured in float32 on a CUDA GPU, where PyTorch by default keeps float32 matrix products off the "
                  "tensor cores (TF32 off): the GPU kernels that bfloat16 and float16 run there use them, so a model "
                  "in those dtypes sees far shorter times. Choose bfloat16 for figures that match one.")


def precision_note(df: pd.DataFrame) -> str:
    """PRECISION_NOTE for a run with float32 points on a CUDA device (an H200 here read 51 TFLOP/s in float32
    products), else ''."""
    if not len(df) or not {"device", "dtype"} <= set(df.columns):
        return ""
    return PRECISION_NOTE if bool((df["device"].eq("cuda") & df["dtype"].eq("float32")).any()) else ""


def stopped_note(df: pd.DataFrame) -> str:
    """'Stopped after 7 of 40 points; …' for a sweep with cancelled points; '' otherwise."""
    cancelled = int((df["status"] == "cancelled").sum())
    if not cancelled:
        return ""
    return f"Stopped after {len(df) - cancelled} of {len(df)} points; the table covers the measured ones."


def baseline_note(df: pd.DataFrame, baseline: str, metric: str = "time_median_s") -> str:
    """Why no crossover against `baseline` can be marked at all (not measured, or no clean point); '' when it
    can."""
    mine = df[df["mechanism"] == baseline]
    spec = MEASURED.get(baseline)
    label = spec.label if spec is not None else baseline
    if ok_points(mine, metric).empty:
        where = "Exact" if spec is None or spec.exact else "Approximate"
        return (f"No crossover against {label}: this sweep did not measure it. Add {label} under {where} "
                "mechanisms in Settings and press Run.")
    if clean_points(mine, metric).empty:
        return f"No crossover against {label}: every point of it was disturbed by other programs."
    return ""


def crossover_asked(look_for: str | None, baseline: str = "softmax") -> bool:
    """Whether a sweep asks for a crossover, so that baseline_note's notice is worth showing: a sweep of the reader's
    own (`look_for` None), a baseline other than the default softmax picked, or a preset whose sentence talks of n*
    ("One cache, four sizes" measures no softmax and asks for no crossover: a notice about one misleads)."""
    return look_for is None or baseline != "softmax" or any(w in look_for for w in ("n*", "crossover", "overtake"))


def summary_notes(df: pd.DataFrame) -> list[str]:
    """The lines under a summary table: the comparisons it leaves out and why."""
    notes = []
    for baseline in ("softmax", "sdpa"):
        if clean_points(df[df["mechanism"] == baseline], "time_median_s").empty:
            label = MEASURED[baseline].label
            measured = not ok_points(df[df["mechanism"] == baseline], "time_median_s").empty
            notes.append(f"No speed-up vs {label}: every timed point of it was disturbed." if measured else
                         f"No comparison with {label}: this sweep did not measure it.")
    return notes


GENERATE_NOTE = ("Generating: each point times one new token's step against the cache of n tokens (the cache is "
                 "rewound after each timed step, so every one sees exactly n), and its memory is the bytes the cache "
                 "holds, read from its tensors. A key-value cache is read whole for every token, so its step grows "
                 "with n; a bounded ring or a fixed-size state does not.")


def generating(df: pd.DataFrame) -> bool:
    """Whether a results frame measured generation steps (every row in mode "generate")."""
    return bool(len(df)) and "mode" in df and bool(df["mode"].eq("generate").all())


def mode_note(df: pd.DataFrame) -> str:
    """What a run's points measure when that is not one forward call: the sentence for generate mode, else ''."""
    return GENERATE_NOTE if generating(df) else ""


# One kernel's problem, whoever runs it: the rows that ours, compiled Flex and the dense mask share at each n.
SAME_PROBLEM = ["mechanism", "params", "kv_heads", "causal", "padding"]
ONCE_COLUMNS = ("compile_s", "mask_s")  # attn_core.mechanisms.flex.OneTime: paid once before timing, never in the time


def one_time_costs(df: pd.DataFrame) -> pd.DataFrame:
    """The ok points run by an implementation other than ours, with the costs paid once before their timing beside
    their time per call: DataFrame[series, mechanism, implementation, n, compile_s, mask_s, time_median_s]
    (compile_s NaN: nothing compiled at that point, the graph came from the process's cache). Empty for a run of
    our kernels alone."""
    columns = ["series", "mechanism", "implementation", "n", *ONCE_COLUMNS, "time_median_s"]
    if "implementation" not in df:
        return pd.DataFrame(columns=columns)
    ok = ok_points(df[df["implementation"] != "ours"], "time_median_s")
    out = ok.assign(series=[row_series_name(r) for _, r in ok.iterrows()])
    return out[columns].sort_values(["series", "n"], kind="stable").reset_index(drop=True)


def flex_faster(df: pd.DataFrame) -> str:
    """The sentence saying where compiled Flex's median time per call is below our kernel's on the same problem and
    n (ok points, disturbed ones too: the faster way is never hidden); '' where it nowhere is."""
    if "implementation" not in df:
        return ""
    ok = ok_points(df, "time_median_s")
    flex = ok[ok["implementation"] == "flex"]
    ours = ok[ok["implementation"] == "ours"]
    both = flex.merge(ours, on=[*SAME_PROBLEM, "n"], suffixes=("", "_ours"))
    faster = both[both["time_median_s"] < both["time_median_s_ours"]].sort_values("n", kind="stable")
    if faster.empty:
        return ""
    where = "; ".join(
        f"{row_series_name(r).removesuffix(' · compiled Flex')} at n = {int(r['n']):,} "
        f"({r['time_median_s'] * 1e3:.3g} ms against ours {r['time_median_s_ours'] * 1e3:.3g} ms, "
        f"{r['time_median_s_ours'] / r['time_median_s']:.2f}× faster)" for _, r in faster.iterrows())
    return (f"Compiled FlexAttention is faster per call than our kernel here: {where}. Medians; its compile and "
            "block mask are paid once, apart (see when compiling pays off).")
