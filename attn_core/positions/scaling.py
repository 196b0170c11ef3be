"""RoPE scaling: the frequencies and attention factor a config's `rope_scaling` asks for, for a model run past the
length it was trained on. Linear position interpolation (Chen et al. 2023, arXiv 2306.15595), dynamic NTK (bloc97 and
emozilla 2023, as Hugging Face transformers' "dynamic"), YaRN (Peng et al. 2023, arXiv 2309.00071), Llama 3.1's band
(Llama 3 herd, arXiv 2407.21783, §3.1.2 / its released code); and partial rotary (GPT-NeoX, Phi, GLM: only the first
head_dim·partial_rotary_factor channels turn). Field names and their meaning are Hugging Face's (`rope_scaling`, or
`rope_parameters` in transformers ≥ 5, which also carries `rope_theta`); the code is written here."""
from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

import torch

from attn_core.positions import rope

if TYPE_CHECKING:
    import pandas as pd

TYPES = ("default", "linear", "dynamic", "yarn", "llama3")
_COMMON = frozenset({"rope_type", "type", "partial_rotary_factor", "rope_theta"})
_FIELDS = {
    "default": frozenset(),
    "linear": frozenset({"factor", "original_max_position_embeddings"}),
    "dynamic": frozenset({"factor", "original_max_position_embeddings"}),
    "yarn": frozenset({"factor", "original_max_position_embeddings", "beta_fast", "beta_slow", "attention_factor",
                       "mscale", "mscale_all_dim", "truncate"}),
    "llama3": frozenset({"factor", "original_max_position_embeddings", "low_freq_factor", "high_freq_factor"}),
}
_REQUIRED = {"default": (), "linear": ("factor",), "dynamic": ("factor",), "yarn": ("factor",),
             "llama3": ("factor", "low_freq_factor", "high_freq_factor", "original_max_position_embeddings")}
# Checked when present; a None value counts as absent, as HF's `.get(...)` reads it.
_POSITIVE = ("factor", "low_freq_factor", "high_freq_factor", "beta_fast", "beta_slow", "attention_factor")
_NON_NEGATIVE = ("mscale", "mscale_all_dim")


# -- reading and checking the dict --
def _real(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


def _whole(value: Any) -> bool:
    return _real(value) and float(value).is_integer()


def kind(scaling: Any) -> str | None:
    """The rope type `scaling` names under `rope_type` or the older `type` ("default" for None, None for a
    non-dict); unchecked."""
    if scaling is None:
        return "default"
    return scaling.get("rope_type", scaling.get("type")) if isinstance(scaling, Mapping) else None


def _type_problem(scaling: Mapping[str, Any]) -> str | None:
    given = {key: scaling[key] for key in ("rope_type", "type") if key in scaling}
    if not given:
        return f"rope_scaling names no rope_type (or type); give one of {', '.join(TYPES)}"
    if len(set(map(repr, given.values()))) > 1:
        return (f"rope_scaling's rope_type {given['rope_type']!r} and type {given['type']!r} disagree; a config "
                "writes one of them")
    name, value = next(iter(given.items()))
    if value not in TYPES:
        return f"rope_scaling's {name} {value!r} is not one this library computes; choose one of {', '.join(TYPES)}"
    return None


def _field_problem(name: str, value: Any) -> str | None:
    if name == "original_max_position_embeddings" and not (_whole(value) and value >= 1):
        return f"rope_scaling's {name} (the trained context length) must be a whole number ≥ 1, got {value!r}"
    if name == "partial_rotary_factor" and not (_real(value) and 0 < value <= 1):
        return f"partial_rotary_factor (the share of each head's channels that rotate) must be in (0, 1], got {value!r}"
    if name == "rope_theta" and not (_real(value) and value > 1):
        return f"rope_scaling's rope_theta (the RoPE base) must be a finite number above 1, got {value!r}"
    if name in _POSITIVE and not (_real(value) and value > 0):
        return f"rope_scaling's {name} must be a finite number above 0, got {value!r}"
    if name in _NON_NEGATIVE and not (_real(value) and value >= 0):
        return f"rope_scaling's {name} must be a finite number ≥ 0, got {value!r}"
    if name == "truncate" and not isinstance(value, bool):
        return f"rope_scaling's truncate (round YaRN's ramp ends to whole pairs) must be true or false, got {value!r}"
    return None


def rope_scaling_problem(scaling: Any, *, max_position_embeddings: int | None = None) -> str | None:
    """Why `scaling` (a config's `rope_scaling` dict, or None) cannot be computed, as a sentence naming the field; or
    None. `max_position_embeddings` stands in for a missing original_max_position_embeddings in dynamic and yarn (as
    HF reads the config's own field); linear, dynamic, yarn and llama3 need `factor`, llama3 its band fields."""
    if scaling is None:
        return None
    if not isinstance(scaling, Mapping):
        return (f"rope_scaling must be a dict of the config's fields, e.g. {{'rope_type': 'linear', 'factor': 2.0}}, "
                f"or None; got {type(scaling).__name__}")
    problem = _type_problem(scaling)
    if problem:
        return problem
    name = kind(scaling)
    for key in scaling:
        if key not in _COMMON | _FIELDS[name]:
            known = ", ".join(sorted(_FIELDS[name] | _COMMON - {"type"}))
            return f"rope_scaling's field {key!r} is not one {name} RoPE takes ({known})"
    for key in _REQUIRED[name]:
        if scaling.get(key) is None:
            return f"{name} RoPE needs rope_scaling's {key}"
    for key, value in scaling.items():
        problem = None if value is None or key in ("rope_type", "type") else _field_problem(key, value)
        if problem:
            return problem
    return _relation_problem(name, scaling, max_position_embeddings)


def _relation_problem(name: str, scaling: Mapping[str, Any], max_position_embeddings: int | None) -> str | None:
    if max_position_embeddings is not None and not (_whole(max_position_embeddings) and max_position_embeddings >= 1):
        return f"max_position_embeddings must be a whole number ≥ 1, got {max_position_embeddings!r}"
    if name in ("dynamic", "yarn") and scaling.get("original_max_position_embeddings") is None \
            and max_position_embeddings is None:
        return (f"{name} RoPE needs rope_scaling's original_max_position_embeddings (the trained length), or the "
                "config's max_position_embeddings passed beside it")
    if name == "llama3" and scaling["low_freq_factor"] >= scaling["high_freq_factor"]:
        return (f"llama3 RoPE's low_freq_factor ({scaling['low_freq_factor']}) must be below its high_freq_factor "
                f"({scaling['high_freq_factor']}): the band runs from wavelength original/low down to original/high")
    fast, slow = scaling.get("beta_fast") or 32, scaling.get("beta_slow") or 1
    if name == "yarn" and fast <= slow:
        return (f"yarn RoPE's beta_fast ({fast}) must exceed its beta_slow ({slow}): they are the rotations within "
                "the trained length where the ramp from extrapolation to interpolation starts and ends")
    return None


def _call_problem(head_dim: Any, base: Any, scaling: Mapping[str, Any] | None, seq_len: Any,
                  partial_rotary_factor: Any) -> str | None:
    if isinstance(head_dim, bool) or not isinstance(head_dim, int) or head_dim < 2 or head_dim % 2:
        return f"head_dim must be an even whole number ≥ 2 (RoPE turns channels in pairs), got {head_dim!r}"
    if not (_real(base) and base > 1):
        return f"base (rope_theta) must be a finite number above 1, got {base!r}"
    theta = (scaling or {}).get("rope_theta")
    if theta is not None and theta != base:
        return f"rope_scaling's rope_theta {theta} differs from base {base}; pass base=rope_theta"
    if seq_len is not None and not (isinstance(seq_len, int) and not isinstance(seq_len, bool) and seq_len >= 1):
        return f"seq_len must be a whole number ≥ 1 (the tokens in the sequence), got {seq_len!r}"
    if kind(scaling) == "dynamic" and seq_len is None:
        return ("dynamic RoPE's frequencies depend on the sequence: pass seq_len (up to the trained length they are "
                "the unscaled ones)")
    if partial_rotary_factor is not None:
        problem = _field_problem("partial_rotary_factor", partial_rotary_factor)
        inner = (scaling or {}).get("partial_rotary_factor")
        if problem or (inner is not None and inner != partial_rotary_factor):
            return problem or (f"partial_rotary_factor {partial_rotary_factor} disagrees with rope_scaling's "
                               f"partial_rotary_factor {inner}; give it once")
    return None


def rotary_dim(head_dim: int, scaling: Mapping[str, Any] | None = None, *,
               partial_rotary_factor: float | None = None) -> int:
    """The channels that rotate: int(head_dim · partial_rotary_factor) (HF's rule; 1.0 when neither the config nor
    the dict gives one). ValueError unless it is even and ≥ 2, or ≥ 4 for dynamic (its exponent d/(d − 2))."""
    share = partial_rotary_factor if partial_rotary_factor is not None else \
        (scaling or {}).get("partial_rotary_factor") or 1.0
    r = int(head_dim * share)
    if r < 2 or r % 2:
        raise ValueError(f"partial_rotary_factor {share} of head_dim {head_dim} turns {r} channels; RoPE turns "
                         "channels in pairs, so head_dim·partial_rotary_factor must be an even whole number ≥ 2")
    if kind(scaling) == "dynamic" and r == 2:
        raise ValueError("dynamic RoPE raises its base to the power d/(d − 2), so it needs ≥ 4 rotating channels; "
                         f"head_dim {head_dim} with partial_rotary_factor {share} turns 2")
    return r


def trained_length(scaling: Mapping[str, Any] | None, *, max_position_embeddings: int | None = None) -> int | None:
    """The context length the model was trained on, where scaling starts to matter: rope_scaling's
    original_max_position_embeddings, else `max_position_embeddings`, else None. Dynamic is the exception, as HF
    reads it: the config's max_position_embeddings first (its dict rarely carries the original)."""
    inner = (scaling or {}).get("original_max_position_embeddings")
    first, second = (max_position_embeddings, inner) if kind(scaling) == "dynamic" else (inner, max_position_embeddings)
    value = first if first is not None else second
    return None if value is None else int(value)


# -- one function a rope type --
def default_inv_freq(r: int, base: float) -> torch.Tensor:
    """θ_i = base^(−2i/r), i = 0 … r/2 − 1, float64 (RoFormer; r the rotating channels). Wavelength 2π/θ_i."""
    return base ** (-torch.arange(0, r, 2, dtype=torch.float64) / r)


def dynamic_base(base: float, r: int, factor: float, seq_len: int, trained: int) -> float:
    """Dynamic NTK's base for a sequence of seq_len tokens: base·((factor·seq_len/trained) − (factor − 1))^(r/(r−2))
    past the trained length, `base` up to it (HF's "dynamic": the base grows so the lowest frequency's period
    stretches with the sequence while θ_0 = 1 stays)."""
    if seq_len <= trained:
        return float(base)
    return base * ((factor * seq_len / trained) - (factor - 1)) ** (r / (r - 2))


def yarn_ramp(r: int, base: float, trained: int, beta_fast: float, beta_slow: float, *,
              truncate: bool = True) -> torch.Tensor:
    """YaRN's share of interpolation for each pair i (Peng et al. 2023, §3.2, "NTK-by-parts"), float64 (r/2,):
    clamp((i − lo)/(hi − lo), 0, 1), lo and hi the channel at which the trained length holds beta_fast and beta_slow
    turns, c(b) = r·ln(trained/(2π·b)) / (2·ln base); with `truncate` (HF's default) lo = ⌊c(beta_fast)⌋,
    hi = ⌈c(beta_slow)⌉; then lo ≥ 0, hi ≤ r − 1, and hi = lo + 0.001 if they meet."""
    def channel(turns: float) -> float:
        return r * math.log(trained / (2 * math.pi * turns)) / (2 * math.log(base))
    lo, hi = channel(beta_fast), channel(beta_slow)
    if truncate:
        lo, hi = math.floor(lo), math.ceil(hi)
    lo, hi = max(lo, 0), min(hi, r - 1)
    hi = hi + 0.001 if hi == lo else hi
    return ((torch.arange(r // 2, dtype=torch.float64) - lo) / (hi - lo)).clamp(0, 1)


def yarn_mscale(factor: float, mscale: float = 1.0) -> float:
    """YaRN's attention temperature √(1/t) = 0.1·mscale·ln(factor) + 1 for factor > 1, else 1 (Peng et al. 2023,
    eq. 22 with mscale = 1; DeepSeek-V2/V3 weight it by mscale)."""
    return 1.0 if factor <= 1 else 0.1 * mscale * math.log(factor) + 1.0


def yarn_attention_factor(scaling: Mapping[str, Any]) -> float:
    """The factor HF multiplies yarn's cos and sin by (so q·k by its square): `attention_factor` when given; else,
    with both mscale and mscale_all_dim nonzero, yarn_mscale(factor, mscale)/yarn_mscale(factor, mscale_all_dim)
    (1 for DeepSeek-V3's 1.0 and 1.0, whose attention code instead multiplies its softmax scale by
    yarn_mscale(factor, mscale_all_dim)², outside rope_scaling); else yarn_mscale(factor)."""
    if scaling.get("attention_factor") is not None:
        return float(scaling["attention_factor"])
    factor, mscale, mscale_all_dim = scaling["factor"], scaling.get("mscale"), scaling.get("mscale_all_dim")
    if mscale and mscale_all_dim:
        return yarn_mscale(factor, mscale) / yarn_mscale(factor, mscale_all_dim)
    return yarn_mscale(factor)


def llama3_inv_freq(inv_freq: torch.Tensor, factor: float, low_freq_factor: float, high_freq_factor: float,
                    trained: int) -> torch.Tensor:
    """Llama 3.1's band on wavelengths λ = 2π/θ: λ > trained/low_freq_factor → θ/factor; λ < trained/high_freq_factor
    → θ; between, (1 − s)·θ/factor + s·θ with s = (trained/λ − low_freq_factor)/(high_freq_factor − low_freq_factor)
    (continuous at both ends)."""
    wavelength = 2 * math.pi / inv_freq
    s = ((trained / wavelength - low_freq_factor) / (high_freq_factor - low_freq_factor)).clamp(0, 1)
    return (1 - s) * inv_freq / factor + s * inv_freq


def rope_inv_freq(head_dim: int, base: float = 10000.0, scaling: Mapping[str, Any] | None = None, *,
                  seq_len: int | None = None, max_position_embeddings: int | None = None,
                  partial_rotary_factor: float | None = None,
                  dtype: torch.dtype = torch.float64) -> tuple[torch.Tensor, float]:
    """(θ, attention factor): the (r/2,) inverse frequencies in `dtype` for the r = rotary_dim(...) rotating channels
    under a config's `rope_scaling` dict, and the factor cos and sin are multiplied by (1 but for yarn). By type:
    default (None) θ_i = base^(−2i/r); linear θ/factor; dynamic θ from dynamic_base(...) for `seq_len` tokens;
    yarn (1 − ramp)·θ + ramp·θ/factor (yarn_ramp), factor yarn_attention_factor; llama3 llama3_inv_freq.
    `max_position_embeddings`: the config's, standing in for a missing original_max_position_embeddings;
    `partial_rotary_factor`: the config's top-level field (or give it in the dict). ValueError naming the field for
    anything it cannot compute. O(head_dim)."""
    problem = rope_scaling_problem(scaling, max_position_embeddings=max_position_embeddings) or \
        _call_problem(head_dim, base, scaling, seq_len, partial_rotary_factor)
    if problem:
        raise ValueError(problem)
    r = rotary_dim(head_dim, scaling, partial_rotary_factor=partial_rotary_factor)
    name, s = kind(scaling), scaling or {}
    trained = trained_length(scaling, max_position_embeddings=max_position_embeddings)
    theta, gain = default_inv_freq(r, base), 1.0
    if name == "linear":
        theta = theta / s["factor"]
    elif name == "dynamic":
        theta = default_inv_freq(r, dynamic_base(base, r, s["factor"], seq_len, trained))
    elif name == "yarn":
        ramp = yarn_ramp(r, base, trained, s.get("beta_fast") or 32, s.get("beta_slow") or 1,
                         truncate=s.get("truncate", True) is not False)
        theta, gain = (1 - ramp) * theta + ramp * theta / s["factor"], yarn_attention_factor(s)
    elif name == "llama3":
        theta = llama3_inv_freq(theta, s["factor"], s["low_freq_factor"], s["high_freq_factor"], trained)
    return theta.to(dtype), gain


# -- the tables `rope.apply` takes, and partial rotary --
def scaled_angles(positions: torch.Tensor, head_dim: int, base: float = 10000.0,
                  scaling: Mapping[str, Any] | None = None, *, seq_len: int | None = None,
                  max_position_embeddings: int | None = None, partial_rotary_factor: float | None = None,
                  dtype: torch.dtype = torch.float32) -> tuple[torch.Tensor, torch.Tensor]:
    """a·cos(p·θ_i) and a·sin(p·θ_i), two (..., N, r/2) tables in `dtype` for positions (..., N), θ and a from
    rope_inv_freq (angles in float64); the layout of rope.angles, for rope.apply on r channels or apply_partial on
    all head_dim. Dynamic's seq_len defaults to the largest position + 1. With a ≠ 1 both q and k carry it, so
    scores are multiplied by a². O(N·r)."""
    if not isinstance(positions, torch.Tensor) or positions.dtype == torch.bool or positions.is_complex():
        got = positions.dtype if isinstance(positions, torch.Tensor) else type(positions).__name__
        raise ValueError(f"positions must be a tensor of token positions, e.g. torch.arange(n); got {got}")
    if seq_len is None and kind(scaling) == "dynamic" and positions.numel():
        seq_len = int(positions.max()) + 1
    theta, gain = rope_inv_freq(head_dim, base, scaling, seq_len=seq_len, partial_rotary_factor=partial_rotary_factor,
                                max_position_embeddings=max_position_embeddings)
    turn = positions.to(torch.float64)[..., None] * theta.to(positions.device)  # (..., N, r/2)
    return (gain * turn.cos()).to(dtype), (gain * turn.sin()).to(dtype)


def apply_partial(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """x (..., N, d) with its first r = 2·cos.shape[-1] channels turned by rope.apply and the other d − r passed
    through unchanged (partial rotary; r = d is plain RoPE). Result in x's dtype. O(N·d)."""
    r = 2 * cos.shape[-1]
    if not isinstance(x, torch.Tensor) or x.dim() < 2 or r > x.shape[-1]:
        got = tuple(x.shape) if isinstance(x, torch.Tensor) else type(x).__name__
        raise ValueError(f"x must be a tensor (..., tokens, channels) with at least the tables' {r} rotating "
                         f"channels, got {got}")
    if r == x.shape[-1]:
        return rope.apply(x, cos, sin)
    return torch.cat((rope.apply(x[..., :r], cos, sin), x[..., r:]), dim=-1)


# -- the Learn page's figure --
def label(scaling: Mapping[str, Any] | None) -> str:
    """A curve's name: "unscaled", or the type and factor, e.g. "yarn ×40"."""
    name = kind(scaling)
    return "unscaled" if name == "default" else f"{name} ×{scaling['factor']:g}"


def _decay(at: torch.Tensor, head_dim: int, base: float, scaling: Mapping[str, Any] | None,
           **config: Any) -> torch.Tensor:
    """⟨R(m)·1, R(0)·1⟩ / head_dim for each offset m in `at` (float64), through scaled_angles and apply_partial."""
    ones = torch.ones(len(at), head_dim, dtype=torch.float64)
    seq_len = int(at.max()) + 1
    turned = [apply_partial(ones, *scaled_angles(p, head_dim, base, scaling, seq_len=seq_len, dtype=torch.float64,
                                                 **config)) for p in (at, torch.zeros_like(at))]
    return (turned[0] * turned[1]).sum(-1) / head_dim


def scores_by_offset(head_dim: int, base: float, scaling: Mapping[str, Any] | None, offsets: Sequence[int], *,
                     max_position_embeddings: int | None = None,
                     partial_rotary_factor: float | None = None) -> pd.DataFrame:
    """RoPE's long-term decay, unscaled and under `scaling`: score(m) = ⟨R(m)·1, R(0)·1⟩ / head_dim for q = k = the
    all-ones head (the usual decay plot; also the expected score of q = k with N(0, 1) channels, so no seed), i.e.
    (a²·2·Σ_i cos(m·θ_i) + head_dim − r) / head_dim, 1 at m = 0 unscaled. The unscaled curve keeps
    partial_rotary_factor; dynamic's frequencies are those for a sequence of max(offsets) + 1 tokens. One row an
    offset and curve: columns offset, score, scaling (label(...)). O(len(offsets)·head_dim)."""
    problem = rope_scaling_problem(scaling, max_position_embeddings=max_position_embeddings)
    if problem:
        raise ValueError(problem)
    if isinstance(offsets, (str, bytes)) or not isinstance(offsets, Sequence) or not offsets or \
            not all(_whole(m) and m >= 0 for m in offsets):
        raise ValueError(f"offsets must be a non-empty list of whole numbers ≥ 0 (token distances), got {offsets!r}")
    at = torch.tensor([int(m) for m in offsets], dtype=torch.float64)
    share = (scaling or {}).get("partial_rotary_factor")
    curves = [None if share is None else {"rope_type": "default", "partial_rotary_factor": share}]
    curves += [scaling] if kind(scaling) != "default" else []
    config = {"max_position_embeddings": max_position_embeddings, "partial_rotary_factor": partial_rotary_factor}
    import pandas as pd  # here, not at the top: a measuring worker imports this module and needs no pandas

    return pd.concat([pd.DataFrame({"offset": at.long().tolist(), "scaling": label(curve),
                                    "score": _decay(at, head_dim, base, curve, **config).tolist()})
                      for curve in curves], ignore_index=True)[["offset", "score", "scaling"]]
