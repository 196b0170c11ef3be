"""Theory at scale from the specs alone: FLOPs, memory, what fits in a budget, and time extrapolated from a
device's matmul throughput. Nothing here runs a mechanism, so n may be a million tokens."""
from __future__ import annotations

import math
from typing import Any, Iterable, Mapping

import pandas as pd

from ..api import get
from ..mechanisms import MECHANISMS
from ..spec import Shape

GIB = 1 << 30
# Common accelerator sizes, in GiB as the vendors' "GB" are (an "80 GB" A100 has 80 GiB).
BUDGETS = {"24 GB GPU": 24 * GIB, "80 GB GPU": 80 * GIB}
MODES = {"forward": 1.0, "forward+backward": 3.0}  # backward ≈ 2× forward FLOPs
EXTRAPOLATION = "an extrapolation, not a measurement: FLOPs ÷ the device's matmul throughput"


def shape_for(n: int, *, d_model: int, heads: int, batch: int = 1, dtype: str = "float32",
              causal: bool = False) -> Shape:
    """The self-attention Shape of one layer: q, k, v (batch, heads, n, d_model / heads)."""
    if d_model % heads:
        raise ValueError(f"d_model {d_model} is not divisible by {heads} heads; choose a multiple of {heads}")
    return Shape(batch, heads, n, n, d_model // heads, dtype=dtype, causal=causal)


def costs(keys: Iterable[str], ns: Iterable[int], *, d_model: int = 512, heads: int = 8, batch: int = 1,
          dtype: str = "float32", causal: bool = False, mode: str = "forward",
          params: Mapping[str, Mapping[str, Any]] | None = None, gflops: float | None = None) -> pd.DataFrame:
    """One row per (mechanism, n): theory FLOPs and memory from the specs.

    Columns: mechanism, label, n, flops (forward, ×3 for forward+backward), memory_bytes (predicted peak above
    the inputs, forward), input_bytes (q, k, v), total_bytes (their sum), predicted_time_s (flops / gflops when
    `gflops` is given: an extrapolation, NaN otherwise), status ('ok' or 'invalid'), reason. Settings a mechanism
    cannot take at that n (e.g. Linformer rank > n, causal Linformer) give an 'invalid' row with the sentence.
    """
    if mode not in MODES:
        raise ValueError(f"mode must be one of {', '.join(MODES)}, got {mode!r}")
    rows = []
    for key in keys:
        spec = get(key)
        resolved = spec.resolved((params or {}).get(key, {}))
        for n in ns:
            shape = shape_for(int(n), d_model=d_model, heads=heads, batch=batch, dtype=dtype, causal=causal)
            row = {"mechanism": key, "label": spec.label, "n": int(n), "status": "ok", "reason": ""}
            try:
                spec.check(shape, resolved)
            except ValueError as e:
                rows.append({**row, "status": "invalid", "reason": str(e), "flops": math.nan,
                             "memory_bytes": math.nan, "input_bytes": math.nan, "total_bytes": math.nan,
                             "predicted_time_s": math.nan})
                continue
            flops = spec.flops(shape, **resolved) * MODES[mode]
            memory = float(spec.memory_bytes(shape, **resolved))
            rows.append({**row, "flops": flops, "memory_bytes": memory, "input_bytes": float(shape.input_bytes),
                         "total_bytes": memory + shape.input_bytes,
                         "predicted_time_s": flops / (gflops * 1e9) if gflops else math.nan})
    return pd.DataFrame(rows)


def log_ns(n_min: int, n_max: int, per_octave: int = 1) -> list[int]:
    """Powers of two (and `per_octave` − 1 points between each) from n_min to n_max inclusive."""
    if not 1 <= n_min <= n_max:
        raise ValueError(f"need 1 ≤ n_min ≤ n_max, got {n_min} and {n_max}")
    steps = max(1, round(math.log2(n_max / n_min) * per_octave))
    return sorted({round(n_min * (n_max / n_min) ** (i / steps)) for i in range(steps + 1)})


def budgets(this_device_bytes: float | None = None, custom_bytes: float | None = None) -> dict[str, float]:
    """Named memory budgets: 'this device' (when known), 24 GB, 80 GB and 'custom' (when given), in bytes."""
    named = {"this device": this_device_bytes} if this_device_bytes else {}
    named.update(BUDGETS)
    if custom_bytes:
        named["custom"] = custom_bytes
    return named


def largest_n(key: str, budget_bytes: float, *, d_model: int = 512, heads: int = 8, batch: int = 1,
              dtype: str = "float32", causal: bool = False, params: Mapping[str, Any] | None = None,
              n_max: int = 1 << 24) -> int:
    """The largest n ≤ n_max whose inputs plus predicted peak fit in `budget_bytes` (0 if none does).

    Bisection: memory grows with n for every spec. A parameter tied to n (Linformer's rank) only allows n ≥ rank.
    """
    spec = get(key)
    resolved = spec.resolved(params or {})

    def fits(n: int) -> bool:
        shape = shape_for(n, d_model=d_model, heads=heads, batch=batch, dtype=dtype, causal=causal)
        try:
            spec.check(shape, resolved)
        except ValueError:
            return False
        return spec.memory_bytes(shape, **resolved) + shape.input_bytes <= budget_bytes

    low = next((n for n in (1, resolved.get(spec.projected, 1)) if fits(n)), 0)  # n ≥ projected keys (rank)
    if not low:
        return 0
    high = n_max
    if fits(high):
        return high
    while high - low > 1:  # invariant: fits(low), not fits(high)
        mid = (low + high) // 2
        low, high = (mid, high) if fits(mid) else (low, mid)
    return low


def fit_table(keys: Iterable[str], named_budgets: Mapping[str, float], **settings: Any) -> pd.DataFrame:
    """One row per (mechanism, budget): the largest n that fits (`largest_n`), tidy."""
    params = settings.pop("params", None) or {}
    return pd.DataFrame([{"mechanism": key, "label": get(key).label, "budget": name, "budget_bytes": float(b),
                          "largest_n": largest_n(key, b, params=params.get(key, {}), **settings)}
                         for key in keys for name, b in named_budgets.items()])


def big_o_table() -> pd.DataFrame:
    """Every mechanism's declared complexity and support, from its spec."""
    return pd.DataFrame([{"mechanism": s.key, "label": s.label, "exact": s.exact, "time": s.time_big_o,
                          "memory": s.memory_big_o, "causal": s.supports_causal, "cross-attention": s.supports_cross,
                          "parameters": ", ".join(f"{p.name} (default {p.default})" for p in s.params) or "none",
                          "paper": s.paper} for s in MECHANISMS.values()])
