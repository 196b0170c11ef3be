"""Theory at scale from the specs alone: FLOPs, memory, what fits in a budget, and time extrapolated from a
device's matmul throughput. Nothing here runs a mechanism, so n may be a million tokens."""
from __future__ import annotations

import math
from typing import Any, Callable, Iterable, Mapping

import pandas as pd

from attn_core.nn import generation, latent
from ..api import get
from ..engine import positions as _positions
from ..mechanisms import MECHANISMS
from ..mechanisms._common import divisors
from ..spec import DTYPE_BYTES, Shape

GIB = 1 << 30
# Common accelerator sizes, in GiB as the vendors' "GB" are (an "80 GB" A100 has 80 GiB).
BUDGETS = {"24 GB GPU": 24 * GIB, "80 GB GPU": 80 * GIB}
MODES = {"forward": 1.0, "forward+backward": 3.0}  # backward ≈ 2× forward FLOPs
EXTRAPOLATION = "an extrapolation, not a measurement: FLOPs ÷ the device's matmul throughput"


def shape_for(n: int, *, d_model: int, heads: int, batch: int = 1, dtype: str = "float32",
              causal: bool = False, kv_heads: int | None = None) -> Shape:
    """The self-attention Shape of one layer: q (batch, heads, n, d_model / heads), k and v with `kv_heads` heads
    (None: heads)."""
    if d_model % heads:
        raise ValueError(f"d_model {d_model} is not divisible by {heads} heads; choose a multiple of {heads}")
    if kv_heads is not None and heads % kv_heads:
        raise ValueError(f"{kv_heads} key/value heads do not divide the {heads} query heads; choose "
                         f"{divisors(heads)}")
    return Shape(batch, heads, n, n, d_model // heads, dtype=dtype, causal=causal, Hk=kv_heads)


def costs(keys: Iterable[str], ns: Iterable[int], *, d_model: int = 512, heads: int = 8, batch: int = 1,
          dtype: str = "float32", causal: bool = False, kv_heads: int | None = None, mode: str = "forward",
          params: Mapping[str, Mapping[str, Any]] | None = None, gflops: float | None = None,
          positions: str = "none") -> pd.DataFrame:
    """One row per (mechanism, n): theory FLOPs and memory from the specs, with what `positions` ("rope",
    "alibi") adds (engine/positions.py; a mechanism that cannot take them gives 'invalid' rows with the sentence).

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
            shape = shape_for(int(n), d_model=d_model, heads=heads, batch=batch, dtype=dtype, causal=causal,
                              kv_heads=kv_heads)
            row = {"mechanism": key, "label": spec.label, "n": int(n), "status": "ok", "reason": ""}
            try:
                spec.check(shape, resolved)
                if why := _positions.spec_problem(spec, positions, head_dim=shape.D, generating=False):
                    raise ValueError(why)
            except ValueError as e:
                rows.append({**row, "status": "invalid", "reason": str(e), "flops": math.nan,
                             "memory_bytes": math.nan, "input_bytes": math.nan, "total_bytes": math.nan,
                             "predicted_time_s": math.nan})
                continue
            flops = (spec.cost.flops(shape, **resolved) + _positions.added_flops(shape, positions)) * MODES[mode]
            memory = _positions.peak_bytes(spec, shape, positions, **resolved)
            inputs = shape.input_bytes + _positions.input_bytes(shape, positions)
            rows.append({**row, "flops": flops, "memory_bytes": memory, "input_bytes": inputs,
                         "total_bytes": memory + inputs,
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
              dtype: str = "float32", causal: bool = False, kv_heads: int | None = None,
              params: Mapping[str, Any] | None = None, n_max: int = 1 << 24, positions: str = "none") -> int:
    """The largest n ≤ n_max whose inputs plus predicted peak (with `positions`) fit in `budget_bytes` (0 if none
    does, or the mechanism cannot take them), searched from the shortest n these settings can run at
    (`largest_within`: Nyström's 64 landmarks need n ≥ 64)."""
    spec = get(key)
    resolved = spec.resolved(params or {})

    def total(n: int) -> float | None:
        shape = shape_for(n, d_model=d_model, heads=heads, batch=batch, dtype=dtype, causal=causal,
                          kv_heads=kv_heads)
        try:
            spec.check(shape, resolved)
        except ValueError:
            return None
        if _positions.spec_problem(spec, positions, head_dim=shape.D, generating=False):
            return None
        return (_positions.peak_bytes(spec, shape, positions, **resolved) + shape.input_bytes
                + _positions.input_bytes(shape, positions))

    return largest_within(total, budget_bytes, n_max)


def largest_within(size: Callable[[int], float | None], budget_bytes: float, n_max: int) -> int:
    """The largest n ≤ n_max with size(n) ≤ budget_bytes, 0 if none; size(n) is None where the settings cannot run
    at n. First the shortest n they run at (`first_true`), assuming that what runs at n runs at every longer n (a
    parameter tied to n is a lower bound on it, Param.at_most). Then, for each power of two s, the last multiple of
    s from there that fits, by bisection, assuming that size never falls from one multiple of s to the next; the
    largest of these. Size can fall as n grows, so one bisection over every n would miss lengths: a blocked kernel
    pads a length that is not a whole number of blocks, and copies (sparse's stride 128 fits n = 4992 in 64 MiB,
    no n from 2935 to 4991 does); along the multiples of a power-of-two block there is no padding. O(log² n_max)
    calls."""
    def fits(n: int) -> bool:
        found = size(n)
        return found is not None and found <= budget_bytes

    low = first_true(lambda n: size(n) is not None, 1, n_max)
    best, step = 0, 1
    while low is not None and step <= n_max:
        first, last = -(-low // step), n_max // step  # the multiples of step from low to n_max
        if first <= last and fits(first * step):
            beyond = first_true(lambda j: not fits(j * step), first + 1, last)
            best = max(best, step * (last if beyond is None else beyond - 1))
        step *= 2
    return best


def first_true(test: Callable[[int], bool], low: int, high: int) -> int | None:
    """The smallest n in [low, high] with test(n), for a test that stays true once true; None if test(high) fails.
    Doubles the step from `low` until a true, then bisects back: O(log(answer − low)) calls."""
    if low > high:
        return None
    step, last_false, n = 1, low - 1, low
    while not test(n):
        if n >= high:
            return None
        last_false, n, step = n, min(n + step, high), 2 * step
    while n - last_false > 1:  # invariant: test(n), not test(last_false) (or last_false below low)
        mid = (last_false + n) // 2
        last_false, n = (last_false, mid) if test(mid) else (mid, n)
    return n


def fit_table(keys: Iterable[str], named_budgets: Mapping[str, float], **settings: Any) -> pd.DataFrame:
    """One row per (mechanism, budget): the largest n that fits (`largest_n`), tidy."""
    params = settings.pop("params", None) or {}
    return pd.DataFrame([{"mechanism": key, "label": get(key).label, "budget": name, "budget_bytes": float(b),
                          "largest_n": largest_n(key, b, params=params.get(key, {}), **settings)}
                         for key in keys for name, b in named_budgets.items()])


def _sharing(spec) -> str:
    """How a mechanism takes key/value heads shared by groups of query heads: in place, repeated, or not at all."""
    if not spec.supports.shared_kv:
        return "no"
    return "yes, repeated per query head" if spec.supports.repeats_kv else "yes, read in place"


def big_o_table() -> pd.DataFrame:
    """Every mechanism's declared complexity and support, from its spec."""
    return pd.DataFrame([{"mechanism": s.key, "label": s.label, "exact": s.exact, "time": s.cost.time_big_o,
                          "memory": s.cost.memory_big_o, "causal": s.supports.causal,
                          "cross-attention": s.supports.cross, "shared key/value heads": _sharing(s),
                          "parameters": ", ".join(f"{p.name} (default {p.default})" for p in s.params) or "none",
                          "paper": s.paper} for s in MECHANISMS.values()])


# Generation at the scale of a whole model: what each layer's attention remembers, times the layers.
DECODE_EXTRAPOLATION = ("an extrapolation, not a measurement: each generated token reads the whole cache once, at the "
                        "device's measured memory bandwidth; the model's weights, its other layers and the compute "
                        "are not counted, so real decoding is slower. Plan a model counts them (the weights read "
                        "once a step, and the step's FLOPs against the device's, by one roofline, and times the "
                        "layer kinds here): where compute sets the pace, as MLA's absorbed step on a CPU, its "
                        "figures can order the designs differently from these")


def model_problems(*, layers: int, heads: int, head_dim: int, batch: int, kv_heads: int | None = None) -> list[str]:
    """Sizes a model's cache cannot be computed for, each a sentence saying what to change; [] when all can."""
    sizes = {"layers": layers, "heads": heads, "head_dim": head_dim, "batch": batch,
             **({} if kv_heads is None else {"kv_heads": kv_heads})}
    found = [f"{name} must be a whole number of at least 1, got {value!r}" for name, value in sizes.items()
             if not (isinstance(value, int) and not isinstance(value, bool) and value >= 1)]
    if not found and kv_heads is not None and heads % kv_heads:
        found.append(f"{kv_heads} key/value heads do not divide the {heads} query heads; choose {divisors(heads)}")
    return found


def model_cache_bytes(key: str, n: int, *, layers: int, heads: int, head_dim: int, batch: int = 1,
                      kv_heads: int | None = None, dtype: str = "float16",
                      params: Mapping[str, Any] | None = None) -> float:
    """Bytes a whole model's attention remembers after a context of n tokens: layers × the mechanism's cache of one
    layer (generation.cache_bytes: softmax's keys and values, 2·batch·kv_heads·n·head_dim elements; a window's last
    w + 1 tokens; linear attention's (d × d) state per key/value head). `heads`: query heads; `kv_heads`: the
    key/value heads they share (None: as many, multi-head attention). ValueError with the sentence for a mechanism
    that cannot generate or settings it cannot take."""
    problems = model_problems(layers=layers, heads=heads, head_dim=head_dim, batch=batch, kv_heads=kv_heads)
    if problems:
        raise ValueError(problems[0])
    spec = get(key)
    shape = Shape(batch, heads, n, n, head_dim, dtype=dtype, causal=True, Hk=kv_heads)
    resolved = spec.resolved(params or {})
    one_layer = generation.cache_bytes(key, shape, **resolved)  # refuses a mechanism without a form, with its reason
    spec.check(shape, resolved)
    return layers * float(one_layer)


STEP_CONTEXTS = (8192, 16384, 32768, 65536)  # the contexts of NSA's Table 4 (arXiv 2502.11089)


def step_reads(keys: Iterable[str], ns: Iterable[int] = STEP_CONTEXTS, *,
               params: Mapping[str, Mapping[str, Any]] | None = None) -> pd.DataFrame:
    """For each of `keys` whose decode step reads a bounded part of its cache (spec Generation.step_tokens), one row
    per context n: the tokens a step reads ('tokens_read', each branch's reads counted), their share of the context
    and the branches ('compressed 511 + selected 1,024 + window 512'). Empty when none of them bounds its read."""
    rows = []
    for key in keys:
        spec = get(key)
        form = spec.supports.generation
        if form is None or form.step_tokens is None:
            continue
        resolved = spec.resolved((params or {}).get(key) or {})
        for n in ns:
            counts = form.step_tokens(int(n), **resolved)
            parts = " + ".join(f"{branch} {count:,}" for branch, count in counts.items() if branch != "total")
            rows.append({"mechanism": spec.label, "context": int(n), "tokens_read": int(counts["total"]),
                         "of_context": counts["total"] / n, "branches": parts})
    return pd.DataFrame(rows, columns=["mechanism", "context", "tokens_read", "of_context", "branches"])


def cannot_generate(keys: Iterable[str]) -> list[str]:
    """For each of `keys` that has no generation form, the sentence saying why ('Linformer: Its projections …')."""
    return [f"{get(key).label}: {get(key).supports.no_generation}" for key in keys
            if get(key).supports.generation is None]


def generation_costs(keys: Iterable[str], ns: Iterable[int], *, layers: int, heads: int, head_dim: int,
                     batch: int = 1, kv_heads: int | None = None, dtype: str = "float16",
                     params: Mapping[str, Mapping[str, Any]] | None = None,
                     bandwidth: float | None = None) -> pd.DataFrame:
    """One row per (mechanism, n) for the mechanisms that can generate: cache_bytes (model_cache_bytes) and, with a
    `bandwidth` in bytes/s, time_per_token_s = cache_bytes / bandwidth and tokens_per_s = batch / that (memory-bound
    decoding: DECODE_EXTRAPOLATION), NaN without. status 'ok' or 'invalid' (a setting the mechanism cannot take at
    that n, with its sentence in `reason`)."""
    rows = []
    for key in keys:
        spec = get(key)
        if spec.supports.generation is None:
            continue
        for n in ns:
            row = {"mechanism": key, "label": spec.label, "n": int(n), "status": "ok", "reason": ""}
            try:
                nbytes = model_cache_bytes(key, int(n), layers=layers, heads=heads, head_dim=head_dim, batch=batch,
                                           kv_heads=kv_heads, dtype=dtype, params=(params or {}).get(key))
            except ValueError as e:
                rows.append({**row, "status": "invalid", "reason": str(e), "cache_bytes": math.nan,
                             "time_per_token_s": math.nan, "tokens_per_s": math.nan})
                continue
            step = nbytes / bandwidth if bandwidth else math.nan
            rows.append({**row, "cache_bytes": nbytes, "time_per_token_s": step,
                         "tokens_per_s": batch / step if bandwidth else math.nan})
    return pd.DataFrame(rows, columns=["mechanism", "label", "n", "status", "reason", "cache_bytes",
                                       "time_per_token_s", "tokens_per_s"])


LATENT_KEY, LATENT_LABEL = "mla", "Multi-head latent (MLA)"


def latent_costs(ns: Iterable[int], *, layers: int, heads: int, head_dim: int, batch: int = 1,
                 dtype: str = "float16", bandwidth: float | None = None, **_: Any) -> pd.DataFrame:
    """Rows as generation_costs' for multi-head latent attention (attn_core.MultiLatentAttention, DeepSeek-V2,
    arXiv 2405.04434) at DeepSeek's proportions scaled to `heads` × `head_dim` (latent.deepseek_proportions:
    kv_rank = 4·head_dim, rope_dim = head_dim/2): each layer caches kv_rank + rope_dim values a token, whatever the
    heads (DeepSeek-V3's 128 heads × 128: 576 values, where multi-head attention caches 32,768). Not a catalogue
    mechanism: a layer whose keys and values come from its latent. Empty for a head_dim that is no multiple of 4."""
    columns = ["mechanism", "label", "n", "status", "reason", "cache_bytes", "time_per_token_s", "tokens_per_s"]
    if model_problems(layers=layers, heads=heads, head_dim=head_dim, batch=batch) or head_dim % 4:
        return pd.DataFrame([], columns=columns)
    sizes = latent.deepseek_proportions(heads, head_dim)
    rows = []
    for n in ns:
        nbytes = float(layers * latent.cache_bytes(batch, int(n), sizes["kv_rank"], sizes["rope_dim"],
                                                   DTYPE_BYTES[dtype]))
        step = nbytes / bandwidth if bandwidth else math.nan
        rows.append({"mechanism": LATENT_KEY, "label": LATENT_LABEL, "n": int(n), "status": "ok", "reason": "",
                     "cache_bytes": nbytes, "time_per_token_s": step,
                     "tokens_per_s": batch / step if bandwidth else math.nan})
    return pd.DataFrame(rows, columns=columns)


def latent_context(named_budgets: Mapping[str, float], *, layers: int, heads: int, head_dim: int, batch: int = 1,
                   dtype: str = "float16", **_: Any) -> dict[str, str]:
    """context_table's row for latent attention at DeepSeek's proportions (latent_costs): the longest context whose
    cache fits each budget."""
    sizes = latent.deepseek_proportions(heads, head_dim)
    per_token = layers * latent.cache_bytes(batch, 1, sizes["kv_rank"], sizes["rope_dim"], DTYPE_BYTES[dtype])
    return {"mechanism": LATENT_LABEL, **{name: f"{int(b // per_token):,} tokens" if b >= per_token else "none"
                                          for name, b in named_budgets.items()}}


def longest_context(key: str, budget_bytes: float, *, n_max: int = 1 << 30, **model: Any) -> int | None:
    """The longest context n ≤ n_max whose cache (model_cache_bytes) fits in `budget_bytes`: 0 if no context's
    does, None if it fits at n_max (a cache of fixed size fits at any length). Searched as `largest_within`: from the
    shortest context the settings run at (a parameter tied to n only allows longer ones), a cache never shrinking
    as n grows."""
    def cache(n: int) -> float | None:
        try:
            return model_cache_bytes(key, n, **model)
        except ValueError:  # settings this context cannot take, or a mechanism that cannot generate
            return None

    found = largest_within(cache, budget_bytes, n_max)
    return None if found == n_max else found


def context_table(keys: Iterable[str], named_budgets: Mapping[str, float], *,
                  params: Mapping[str, Mapping[str, Any]] | None = None, **model: Any) -> pd.DataFrame:
    """One row per mechanism that can generate, one column per budget: the longest context whose cache fits
    (longest_context), written out: '49,152 tokens', 'any length' for a cache of fixed size, 'none' when not even
    one token's fits. `params`: each mechanism's parameters, by key."""
    def said(n: int | None) -> str:
        return "any length" if n is None else "none" if n == 0 else f"{n:,} tokens"

    shared = model.get("kv_heads") not in (None, model.get("heads"))
    return pd.DataFrame([{"mechanism": get(key).label,
                          **{name: said(longest_context(key, b, params=(params or {}).get(key), **model))
                             if get(key).supports.shared_kv or not shared else "cannot share key/value heads"
                             for name, b in named_budgets.items()}}
                         for key in keys if get(key).supports.generation is not None])
