"""What an approximate or sparse mechanism gives up: its errors against exact softmax attention on the same inputs."""
from __future__ import annotations

import inspect
import math
from typing import Any, Iterable, Sequence

import pandas as pd
import torch

from ..api import attention, get, make_state
from ..engine import env
from .effective import KEYS, effective_attention
from ..spec import Shape

INPUTS = ("gaussian", "peaky", "local", "gentle")
INPUT_HELP = {
    "gaussian": "q, k, v with independent N(0, 1) entries: q·k/√D has unit variance, attention is diffuse.",
    "peaky": "the same with q and k scaled by 2, so q·k/√D has standard deviation 4: each query attends to a few keys.",
    "local": "q, k and v vary slowly along the sequence (AR(1), neighbour correlation 0.9), q and k from one shared "
             "sequence: nearby tokens score highest, as in text or audio.",
    "gentle": "q and k scaled by 1/√8, so q·k/√D has standard deviation 1/8: every query spreads its attention "
              "widely, as with small query and key norms.",
}
GENTLE_SCALE = 8 ** -0.5
PEAKY_SCALE = 2.0
LOCAL_RHO = 0.9
# The KL needs both (Nq, Nk) weight matrices per head; above this n only the output errors are computed.
KL_MAX_N = 1024
METRICS = ("rel_fro", "max_abs", "cosine", "kl", "dropped_mass")
METRIC_LABELS = {"rel_fro": "relative Frobenius error", "max_abs": "max absolute error",
                 "cosine": "mean cosine similarity", "kl": "KL(softmax ‖ mechanism), mean over rows",
                 "dropped_mass": "softmax mass on cells the mechanism ignores"}


# ---- metrics: approx and exact of one shape, errors over the whole tensor or per row (last dim) ----

def relative_frobenius(approx: torch.Tensor, exact: torch.Tensor) -> float:
    """‖A − E‖_F / ‖E‖_F over the whole tensor (0 for identical tensors)."""
    return float(torch.linalg.vector_norm((approx - exact).double()) / torch.linalg.vector_norm(exact.double()))


def max_abs_error(approx: torch.Tensor, exact: torch.Tensor) -> float:
    """max |A − E| over all entries."""
    return float((approx.double() - exact.double()).abs().max())


def mean_cosine(approx: torch.Tensor, exact: torch.Tensor) -> float:
    """Mean over rows (last dim) of a·e / (|a|·|e|); a zero row scores 1 against a zero row and 0 against any other."""
    a, e = approx.double().flatten(0, -2), exact.double().flatten(0, -2)
    na, ne = a.norm(dim=-1), e.norm(dim=-1)
    cos = (a * e).sum(-1) / (na * ne).clamp_min(torch.finfo(torch.float64).tiny)
    cos = torch.where((na == 0) & (ne == 0), torch.ones_like(cos), cos)
    return float(cos.mean())


def kl_rows(p: torch.Tensor, q: torch.Tensor) -> float:
    """Mean over rows of KL(p ‖ q) = Σ_j p_j·log(p_j / q_j), in nats, rows (last dim) summing to 1.

    Zero entries: a cell with p_j = 0 adds 0 (0·log 0 = 0), whatever q_j; a cell with p_j > 0 and q_j = 0 makes
    that row's KL +∞ (q rules out something p allows), and then the mean is +∞: see `dropped_mass` for how much.
    """
    p, q = p.double(), q.double()
    terms = torch.where(p > 0, p * (torch.log(p) - torch.log(q)), torch.zeros_like(p))
    return float(terms.sum(-1).mean())


def dropped_mass(p: torch.Tensor, q: torch.Tensor) -> float:
    """Mean over rows of Σ_{j: q_j = 0} p_j: the share of exact attention that lands on cells the mechanism ignores."""
    return float(torch.where(q == 0, p.double(), torch.zeros_like(p, dtype=torch.float64)).sum(-1).mean())


# ---- inputs ----

def make_inputs(kind: str, batch: int, heads: int, n: int, head_dim: int, *, seed: int = 0,
                dtype: torch.dtype = torch.float32) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Seeded q, k, v (batch, heads, n, head_dim) drawn from one of INPUTS (see INPUT_HELP)."""
    if kind not in INPUTS:
        raise ValueError(f"unknown input distribution {kind!r}; choose one of {', '.join(INPUTS)}")
    g = torch.Generator().manual_seed(seed)
    size = (batch, heads, n, head_dim)
    if kind == "local":
        shared = _ar1(size, g)
        noisy = [(shared + 0.5 * torch.randn(size, generator=g)) / math.sqrt(1.25) for _ in range(2)]
        q, k, v = noisy[0], noisy[1], _ar1(size, g)
    else:
        q, k, v = (torch.randn(size, generator=g) for _ in range(3))
        if kind in ("peaky", "gentle"):
            scale = PEAKY_SCALE if kind == "peaky" else GENTLE_SCALE
            q, k = q * scale, k * scale
    return q.to(dtype), k.to(dtype), v.to(dtype)


def _ar1(size: tuple[int, ...], g: torch.Generator, rho: float = LOCAL_RHO) -> torch.Tensor:
    """x_t = ρ·x_{t−1} + √(1 − ρ²)·ε_t along the sequence (dim −2): unit variance, corr(x_s, x_t) = ρ^|s−t|."""
    eps = torch.randn(size, generator=g)
    x = torch.empty(size)
    x[..., 0, :] = eps[..., 0, :]
    for t in range(1, size[-2]):
        x[..., t, :] = rho * x[..., t - 1, :] + math.sqrt(1 - rho * rho) * eps[..., t, :]
    return x


# ---- one evaluation, sweeps, speed–accuracy ----

def problems(key: str, *, n: int, d_model: int, heads: int, causal: bool = False, **params: Any) -> list[str]:
    """Sentences saying what to change before these settings can be evaluated ([] when they can)."""
    spec = get(key)
    found = [f"{name} must be a positive integer, got {value!r}" for name, value in
             (("n", n), ("d_model", d_model), ("heads", heads)) if isinstance(value, bool) or not isinstance(value, int)
             or value < 1]
    if found:
        return found
    if d_model % heads:
        return [f"d_model {d_model} is not divisible by {heads} heads; choose a multiple of {heads}"]
    try:
        spec.check(Shape(1, heads, n, n, d_model // heads, causal=causal), params)
    except ValueError as e:
        return [str(e)]
    return []


def exact_reference(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, causal: bool = False,
                    rows: int = 256) -> torch.Tensor:
    """softmax(QKᵀ/√D)V in float64, in slabs of `rows` queries so memory stays O(rows·Nk) per head."""
    q, k, v = q.double(), k.double(), v.double()
    out = torch.empty_like(q)
    for start in range(0, q.shape[-2], rows):
        s = (q[:, :, start:start + rows] / math.sqrt(q.shape[-1])) @ k.transpose(-2, -1)
        if causal:
            i = torch.arange(start, start + s.shape[-2])[:, None]
            s = s.masked_fill(torch.arange(k.shape[-2])[None, :] > i, float("-inf"))
        out[:, :, start:start + rows] = torch.softmax(s, dim=-1) @ v
    return out


def _median_time(fn, repeats: int, device: str = "cpu", min_total_s: float = 0.03, max_samples: int = 50) -> float:
    """Median seconds per call: one warm-up call (allocation, dispatch caches), then at least `repeats` calls and
    at least `min_total_s` of them, so a millisecond call is not one noisy sample; each timed as the engine times a
    call on `device` (env.device_timer: synchronized, CUDA events on a GPU)."""
    timed = env.device_timer(device)
    fn()
    samples: list[float] = []
    while len(samples) < repeats or (sum(samples) < min_total_s and len(samples) < max_samples):
        samples.append(timed(fn, 1))
    return sorted(samples)[len(samples) // 2]


def _weight_errors(key: str, q, k, v, causal: bool, state: dict, params: dict) -> dict[str, float]:
    """KL and dropped mass of the mechanism's weights against softmax's, both in float64 (the mechanism's maths,
    not its float32 rounding). NaN for Linformer, whose weights are over projected keys, not the n keys."""
    q, k, v = q.double(), k.double(), v.double()
    state64 = {name: t.double() if t.is_floating_point() else t for name, t in state.items()}  # indices stay
    eff = effective_attention(key, q, k, v, causal=causal, state=state64, **params)
    if eff.columns != KEYS:
        return {"kl": math.nan, "dropped_mass": math.nan}
    exact = effective_attention("softmax", q, k, v, causal=causal).weights
    return {"kl": kl_rows(exact, eff.weights), "dropped_mass": dropped_mass(exact, eff.weights)}


def evaluate(key: str, params: dict[str, Any] | None = None, *, n: int = 512, d_model: int = 256, heads: int = 4,
             batch: int = 1, inputs: str = "gaussian", seed: int = 0, causal: bool = False, dtype: str = "float32",
             repeats: int = 3, kl_max_n: int = KL_MAX_N) -> dict[str, Any]:
    """Errors of mechanism `key` (with `params`) against float64 exact softmax on one seeded input.

    The mechanism runs in `dtype` with its random state drawn from `seed`; the row holds the errors (METRICS),
    a quick in-process time (median of ≥ `repeats` calls and ≥ 30 ms of them after one warm-up, state built
    outside) and the spec's predicted peak bytes. KL and dropped mass need dense weights: NaN above `kl_max_n`.
    """
    spec = get(key)
    resolved = spec.resolved(params or {})
    found = problems(key, n=n, d_model=d_model, heads=heads, causal=causal, **resolved)
    if found:
        raise ValueError(found[0])
    torch_dtype = getattr(torch, dtype)
    q, k, v = make_inputs(inputs, batch, heads, n, d_model // heads, seed=seed, dtype=torch_dtype)
    shape = Shape.of(q, k, causal)
    state = make_state(key, shape, dtype=torch_dtype, seed=seed, **resolved)
    with torch.no_grad():
        out = attention(key, q, k, v, causal=causal, **resolved, **state)
        exact = exact_reference(q, k, v, causal)
        weights = (_weight_errors(key, q, k, v, causal, state, resolved) if n <= kl_max_n
                   else {"kl": math.nan, "dropped_mass": math.nan})
        seconds = _median_time(lambda: attention(key, q, k, v, causal=causal, **resolved, **state), repeats,
                               q.device.type)
    return {"mechanism": key, "label": spec.label, "exact": spec.exact, "params": _params_text(resolved),
            "n": n, "batch": batch, "heads": heads, "d_model": d_model, "head_dim": d_model // heads,
            "inputs": inputs, "seed": seed, "causal": causal, "dtype": dtype,
            "rel_fro": relative_frobenius(out, exact), "max_abs": max_abs_error(out, exact),
            "cosine": mean_cosine(out, exact), **weights,
            "time_s": seconds, "predicted_bytes": float(spec.cost.memory_bytes(shape, **resolved))}


def _params_text(params: dict[str, Any]) -> str:
    return ", ".join(f"{k}={v}" for k, v in params.items())


def parameter_sweep(key: str, param: str | None, values: Sequence[int | float], **settings: Any) -> pd.DataFrame:
    """One `evaluate` row per value of `param` (the others at their defaults, or `settings['params']`): a tidy
    frame with columns `param` and `value` added; param None gives the one row at the defaults (value NaN).
    ValueError with a sentence if any value cannot run."""
    base = dict(settings.pop("params", None) or {})
    if param is None:
        return pd.DataFrame([{**evaluate(key, base, **settings), "param": "", "value": math.nan}])
    get(key).param(param)  # KeyError for a parameter the mechanism does not have
    shape_settings = {name: settings.get(name, default) for name, default in
                      (("n", 512), ("d_model", 256), ("heads", 4), ("causal", False))}
    for value in values:
        found = problems(key, **shape_settings, **{**base, param: value})
        if found:
            raise ValueError(found[0])
    rows = [{**evaluate(key, {**base, param: value}, **settings), "param": param, "value": value} for value in values]
    return pd.DataFrame(rows)


def sweep_values(key: str, param: str, n: int, steps: int = 5) -> list[int]:
    """A sensible default sweep: up to `steps` log-spaced powers of two from 4 for `param`, within its range and
    a token count (Param.tokens: rank, window, block, stride) within n, others up to 1024; consecutive values for a non-log count."""
    p = get(key).param(param)
    if not p.log:  # a small count (lookback, lookahead): consecutive values
        return list(range(int(p.low), int(min(p.high, p.low + steps - 1)) + 1))
    top = min(p.high, n if p.tokens else 1024)
    low = max(p.low, 4)  # 1 and 2 are degenerate (a block of one token, a stride of one) and slow to show
    powers = [2 ** e for e in range(int(math.log2(low)), int(math.log2(top)) + 1) if low <= 2 ** e <= top]
    if len(powers) <= steps:
        return powers
    idx = [round(i * (len(powers) - 1) / (steps - 1)) for i in range(steps)]
    return [powers[i] for i in sorted(set(idx))]


def pareto_front(frame: pd.DataFrame, x: str = "time_s", y: str = "rel_fro", floor: float = 0.0) -> pd.Series:
    """True for the rows no other row beats on both x and y (lower is better on both; ties on both are kept).

    y values below `floor` count as equal (errors at the level of rounding: every exact mechanism is exact), so
    among those the fastest alone is on the front. Rows with NaN in x or y are never on the front.
    """
    xs, ys = frame[x].to_numpy(dtype=float), frame[y].to_numpy(dtype=float).clip(min=floor)
    flags = []
    for xi, yi in zip(xs, ys):
        if math.isnan(xi) or math.isnan(yi):
            flags.append(False)
            continue
        beaten = ((xs <= xi) & (ys <= yi) & ((xs < xi) | (ys < yi))).any()
        flags.append(not bool(beaten))
    return pd.Series(flags, index=frame.index, name="pareto")


def rounding_floor(dtype: str) -> float:
    """Relative error that rounding alone produces in `dtype` (100 × machine epsilon): below it, 'exact'."""
    return 100 * torch.finfo(getattr(torch, dtype)).eps


def speed_accuracy(configs: Iterable[tuple[str, dict[str, Any]]], **settings: Any) -> pd.DataFrame:
    """`evaluate` for each (mechanism, params) with a `pareto` column: fastest for its error (time_s vs rel_fro),
    errors below `rounding_floor(dtype)` counting as exact. Configurations these settings cannot run (`problems`: a
    causal Linformer, a causal-only recurrence without the mask) are left out."""
    size = _sizes(settings)
    frame = pd.DataFrame([evaluate(key, params, **settings) for key, params in configs
                          if not problems(key, **size, **params)])
    frame["pareto"] = pareto_front(frame, floor=rounding_floor(settings.get("dtype", "float32")))
    return frame


def left_out(configs: Iterable[tuple[str, dict[str, Any]]], **settings: Any) -> dict[str, str]:
    """The mechanisms `speed_accuracy` leaves out wholly at these settings, each with the first reason (a
    sentence): none of their configurations can run."""
    size, reasons, runs = _sizes(settings), {}, set()
    for key, params in configs:
        if found := problems(key, **size, **params):
            reasons.setdefault(key, found[0])
        else:
            runs.add(key)
    return {key: why for key, why in reasons.items() if key not in runs}


def _sizes(settings: dict[str, Any]) -> dict[str, Any]:
    """The settings `problems` reads, `evaluate`'s defaults where not given."""
    return {name: settings.get(name, p.default) for name, p in inspect.signature(evaluate).parameters.items()
            if name in ("n", "d_model", "heads", "causal")}


def default_configs(n: int, keys: Iterable[str] | None = None, steps: int = 3) -> list[tuple[str, dict[str, Any]]]:
    """Each mechanism at its defaults when it has no parameter, else at `steps` values of its first parameter
    (clipped to n): the points of a speed–accuracy scatter."""
    from ..mechanisms import MECHANISMS

    configs: list[tuple[str, dict[str, Any]]] = []
    for key in keys or MECHANISMS:
        spec = get(key)
        if not spec.params:
            configs.append((key, {}))
            continue
        name = spec.params[0].name
        configs += [(key, {name: value}) for value in sweep_values(key, name, n, steps)]
    return configs
