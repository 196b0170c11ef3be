"""RoPE scaling where RoPE is applied: `attn_core.positional.rope_inv_freq` under the package's name, `rope.rotate`
and the measured call's tables (engine.positions.turner) with a config's `rope_scaling`, each rope_type checked against
its published rule written out here, and the refusals."""
from __future__ import annotations

import math

import pytest
import torch

import attn_core
from attn_core.engine import positions as measured
from attn_core.positions import rope, scaling


def thetas(r: int, base: float) -> list[float]:
    return [base ** (-2 * i / r) for i in range(r // 2)]


def llama3_rule(r: int, base: float) -> list[float]:
    """Llama 3.1 (meta-llama/Llama-3.1-8B config.json rope_scaling: factor 8, low_freq_factor 1, high_freq_factor 4,
    original_max_position_embeddings 8192): wavelength λ = 2π/θ; λ < 8192/4 kept, λ > 8192/1 divided by 8, between
    (1 − s)·θ/8 + s·θ with s = (8192/λ − 1)/(4 − 1)."""
    out = []
    for t in thetas(r, base):
        lam = 2 * math.pi / t
        s = (8192 / lam - 1) / 3
        out.append(t if lam < 2048 else t / 8 if lam > 8192 else (1 - s) * t / 8 + s * t)
    return out


def yarn_rule(r: int, base: float, s: float, trained: int) -> tuple[list[float], float]:
    """YaRN (Peng et al. 2023, arXiv 2309.00071, §3.2 and eq. 22; α = 1, β = 32): pair d rotates L·θ_d/2π times in
    the trained length L; the pair index where that is b turns is r·ln(L/(2π·b))/(2·ln base); from β's index
    (floored) to α's (ceiled) the share γ of interpolation rises linearly in the index (the paper's code, and Hugging
    Face's), θ' = (1 − γ)·θ + γ·θ/s; the attention factor √(1/t) = 0.1·ln s + 1 multiplies cos and sin."""
    def index(b: float) -> float:
        return r * math.log(trained / (2 * math.pi * b)) / (2 * math.log(base))
    lo, hi = max(math.floor(index(32)), 0), min(math.ceil(index(1)), r - 1)
    out = []
    for d, t in enumerate(thetas(r, base)):
        gamma = min(max((d - lo) / (hi - lo), 0.0), 1.0)
        out.append((1 - gamma) * t + gamma * t / s)
    return out, 0.1 * math.log(s) + 1


def turned(x: torch.Tensor, p: int, freqs: list[float], gain: float = 1.0) -> torch.Tensor:
    """x (d,) float64, pair i = (2i, 2i + 1) turned by p·θ_i and scaled by gain; channels past the pairs untouched."""
    out = x.clone()
    for i, t in enumerate(freqs):
        c, s = gain * math.cos(p * t), gain * math.sin(p * t)
        out[2 * i], out[2 * i + 1] = c * x[2 * i] - s * x[2 * i + 1], s * x[2 * i] + c * x[2 * i + 1]
    return out


LLAMA31 = {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
           "original_max_position_embeddings": 8192}
YARN = {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 4096}
CASES = [  # (rope_scaling, head_dim, base, θ by the rule, attention factor)
    (None, 16, 10000.0, thetas(16, 10000.0), 1.0),
    ({"rope_type": "linear", "factor": 4.0}, 16, 10000.0, [t / 4 for t in thetas(16, 10000.0)], 1.0),
    (LLAMA31, 16, 500000.0, llama3_rule(16, 500000.0), 1.0),
    (YARN, 16, 10000.0, *yarn_rule(16, 10000.0, 4.0, 4096)),
    # dynamic NTK (HF "dynamic") for a sequence of 64 tokens trained on 32: base·(2·64/32 − 1)^(16/14)
    ({"rope_type": "dynamic", "factor": 2.0, "original_max_position_embeddings": 32}, 16, 10000.0,
     thetas(16, 10000.0 * 3 ** (16 / 14)), 1.0),
    ({"rope_type": "linear", "factor": 2.0, "partial_rotary_factor": 0.5}, 16, 10000.0,
     [t / 2 for t in thetas(8, 10000.0)], 1.0),
]


def test_the_package_exposes_rope_inv_freq_under_positional():
    assert attn_core.positional.rope_inv_freq is scaling.rope_inv_freq
    assert callable(attn_core.positional.alibi_bias) and callable(attn_core.positional.sinusoidal)  # still there
    theta, gain = attn_core.positional.rope_inv_freq(16, 500000.0, LLAMA31)
    torch.testing.assert_close(theta, torch.tensor(llama3_rule(16, 500000.0), dtype=torch.float64), rtol=1e-12, atol=0)
    assert gain == 1.0


def test_llama31_band_has_all_three_regimes_at_these_settings():
    kept, blended, divided = [], [], []
    for i, (t, want) in enumerate(zip(thetas(16, 500000.0), llama3_rule(16, 500000.0))):
        (kept if want == t else divided if want == pytest.approx(t / 8) else blended).append(i)
    assert kept and blended and divided  # wavelengths 6.3 … 880 kept, 4,574 blended, 23,000 and up divided


@pytest.mark.parametrize("config,d,base,freqs,gain", CASES)
def test_rotate_and_the_measured_tables_follow_the_rule(config, d, base, freqs, gain):
    g = torch.Generator().manual_seed(0)
    x = torch.randn(1, 2, 64, d, generator=g, dtype=torch.float64)
    want = torch.stack([turned(x[0, h, p], p, freqs, gain) for h in range(2) for p in range(64)]).view_as(x)
    got = rope.rotate(x, torch.arange(64), base=base, rope_scaling=config)
    torch.testing.assert_close(got, want, rtol=1e-10, atol=1e-10)
    turn = measured.turner(64, 64, d, device="cpu", dtype=torch.float64, rope_scaling=config, base=base)
    q, k = turn(x, x.flip(-2))
    torch.testing.assert_close(q, want, rtol=1e-10, atol=1e-10)
    step = measured.turner(1, 1, d, device="cpu", dtype=torch.float64, first=63, rope_scaling=config, base=base)
    torch.testing.assert_close(step(x[..., 63:, :], x[..., 63:, :])[0], want[..., 63:, :], rtol=1e-10, atol=1e-10)


def test_without_scaling_the_measured_tables_are_unchanged():
    x = torch.randn(1, 1, 9, 8, dtype=torch.float64)
    plain = measured.turner(9, 9, 8, device="cpu", dtype=torch.float64)(x, x)[0]
    torch.testing.assert_close(plain, rope.rotate(x, torch.arange(9)), rtol=0, atol=0)


@pytest.mark.parametrize("positions,config,d,field", [
    ("rope", {"rope_type": "longrope", "factor": 4.0}, 64, "rope_type"),
    ("rope", {"rope_type": "su"}, 64, "rope_type"),
    ("rope", {"factor": 4.0}, 64, "rope_type"),
    ("rope", {"rope_type": "linear"}, 64, "factor"),
    ("rope", {"rope_type": "yarn", "factor": 4.0}, 64, "original_max_position_embeddings"),
    ("rope", {"rope_type": "linear", "factor": 2.0, "partial_rotary_factor": 0.25}, 4, "partial_rotary_factor"),
    ("alibi", {"rope_type": "linear", "factor": 2.0}, 64, "positions rope"),
    ("none", {"rope_type": "linear", "factor": 2.0}, 64, "positions rope"),
])
def test_what_cannot_be_scaled_is_refused_with_a_sentence(positions, config, d, field):
    why = measured.scaling_problem(positions, config, head_dim=d)
    assert why and field in why
    if positions == "rope":
        with pytest.raises(ValueError, match=field):
            measured.turner(4, 4, d, device="cpu", dtype=torch.float32, rope_scaling=config)
        with pytest.raises(ValueError, match=field):
            rope.rotate(torch.randn(4, d), torch.arange(4), rope_scaling=config)
    assert measured.scaling_problem(positions, None, head_dim=d) is None
