"""RoPE scaling against per-frequency loops written here from the published rules and the published configs (Llama
3.1, DeepSeek-V3, Qwen3, gpt-oss), RoPE's relative property under every scaling, partial rotary, and the refusals."""
from __future__ import annotations

import math

import pytest
import torch

from attn_core.positions import rope
from attn_core.positions import scaling as rs

# Published rope_scaling dicts (each model's config.json on the Hugging Face Hub):
# meta-llama/Llama-3.1-8B: rope_theta 500000, head_dim 4096/32 = 128.
LLAMA31 = {"factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
           "original_max_position_embeddings": 8192, "rope_type": "llama3"}
# deepseek-ai/DeepSeek-V3: rope_theta 10000, qk_rope_head_dim 64 (the rotating part of MLA's key).
DEEPSEEK_V3 = {"beta_fast": 32, "beta_slow": 1, "factor": 40, "mscale": 1.0, "mscale_all_dim": 1.0,
               "original_max_position_embeddings": 4096, "type": "yarn"}
# Qwen/Qwen3-8B model card, "Processing long texts": rope_theta 1000000, head_dim 128.
QWEN3 = {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 32768}
# openai/gpt-oss-120b: rope_theta 150000, head_dim 64.
GPT_OSS = {"beta_fast": 32.0, "beta_slow": 1.0, "factor": 32.0, "original_max_position_embeddings": 4096,
           "rope_type": "yarn", "truncate": False}


def plain(r: int, base: float) -> list[float]:
    """θ_i = base^(−2i/r), RoFormer's frequencies."""
    return [base ** (-2 * i / r) for i in range(r // 2)]


def llama3_by_hand(r: int, base: float, factor: float, low: float, high: float, old: int) -> list[float]:
    """Llama 3.1's rule per frequency: wavelength below old/high kept, above old/low divided by factor, between a
    blend by smooth = (old/wavelength − low)/(high − low)."""
    out = []
    for theta in plain(r, base):
        wavelength = 2 * math.pi / theta
        if wavelength < old / high:
            out.append(theta)
        elif wavelength > old / low:
            out.append(theta / factor)
        else:
            smooth = (old / wavelength - low) / (high - low)
            out.append((1 - smooth) * theta / factor + smooth * theta)
    return out


def yarn_by_hand(r: int, base: float, factor: float, old: int, fast: float, slow: float, truncate: bool) -> list[float]:
    """YaRN's NTK-by-parts (Peng et al. 2023, §3.2): the pair index at which the trained length holds b turns is
    r·ln(old/(2π·b))/(2·ln base); below beta_fast's pair θ is kept, past beta_slow's θ/factor, a linear ramp between."""
    lo = r * math.log(old / (2 * math.pi * fast)) / (2 * math.log(base))
    hi = r * math.log(old / (2 * math.pi * slow)) / (2 * math.log(base))
    if truncate:
        lo, hi = math.floor(lo), math.ceil(hi)
    lo, hi = max(lo, 0), min(hi, r - 1)
    out = []
    for i, theta in enumerate(plain(r, base)):
        ramp = min(max((i - lo) / (hi - lo), 0.0), 1.0)
        out.append(theta * (1 - ramp) + theta / factor * ramp)
    return out


def close(got: torch.Tensor, want: list[float]) -> None:
    torch.testing.assert_close(got, torch.tensor(want, dtype=torch.float64), rtol=1e-12, atol=0)


@pytest.mark.parametrize("head_dim,base", [(2, 10000.0), (64, 10000.0), (128, 500000.0)])
def test_default_is_roformers_frequencies(head_dim, base):
    for scaling in (None, {"rope_type": "default"}, {"type": "default"}):
        theta, gain = rs.rope_inv_freq(head_dim, base, scaling)
        close(theta, plain(head_dim, base))
        assert gain == 1.0 and theta.dtype == torch.float64


def test_linear_divides_every_frequency_by_the_factor():
    for key in ("rope_type", "type"):
        theta, gain = rs.rope_inv_freq(128, 10000.0, {key: "linear", "factor": 8.0})  # Gemma 3's global layers
        close(theta, [t / 8 for t in plain(128, 10000.0)])
        assert gain == 1.0


def test_llama3_follows_the_published_band():
    theta, gain = rs.rope_inv_freq(128, 500000.0, LLAMA31)
    want = llama3_by_hand(128, 500000.0, 8.0, 1.0, 4.0, 8192)
    close(theta, want)
    base_theta = plain(128, 500000.0)
    wavelengths = [2 * math.pi / t for t in base_theta]
    kept = [i for i, w in enumerate(wavelengths) if w < 2048]
    divided = [i for i, w in enumerate(wavelengths) if w > 8192]
    blended = [i for i, w in enumerate(wavelengths) if 2048 <= w <= 8192]
    assert kept[:1] == [0] and divided[-1:] == [63] and blended  # all three regimes occur at these settings
    assert all(theta[i] == base_theta[i] for i in kept)
    assert all(theta[i] == pytest.approx(base_theta[i] / 8, rel=1e-12) for i in divided)
    assert all(base_theta[i] / 8 < theta[i] < base_theta[i] for i in blended)
    assert bool((theta[1:] < theta[:-1]).all()) and gain == 1.0  # still strictly decreasing


@pytest.mark.parametrize("config,r,base,gain", [
    (DEEPSEEK_V3, 64, 10000.0, 1.0),  # mscale/mscale_all_dim = 1: DeepSeek folds its mscale into the softmax scale
    (QWEN3, 128, 1000000.0, 0.1 * math.log(4.0) + 1),
    (GPT_OSS, 64, 150000.0, 0.1 * math.log(32.0) + 1),
])
def test_yarn_follows_ntk_by_parts_and_its_attention_factor(config, r, base, gain):
    theta, got_gain = rs.rope_inv_freq(r, base, config)
    factor, old = config["factor"], config["original_max_position_embeddings"]
    close(theta, yarn_by_hand(r, base, factor, old, 32, 1, config.get("truncate", True)))
    assert got_gain == pytest.approx(gain, rel=1e-15)
    for i, t in enumerate(plain(r, base)):
        turns = old * t / (2 * math.pi)  # turns of pair i within the trained length
        if turns > 32:
            assert theta[i] == t  # fast pairs extrapolate untouched
        elif turns < 1:
            assert theta[i] == pytest.approx(t / factor, rel=1e-12)  # slow pairs are interpolated


def test_yarn_attention_factor_variants():
    def gain(**fields):
        return rs.rope_inv_freq(64, 10000.0, {"rope_type": "yarn", "factor": 16.0,
                                              "original_max_position_embeddings": 4096, **fields})[1]
    m = 0.1 * math.log(16.0)
    assert gain() == pytest.approx(m + 1)
    assert gain(attention_factor=0.8) == 0.8
    assert gain(mscale=0.707, mscale_all_dim=0.707) == pytest.approx(1.0)  # DeepSeek-V2's settings
    assert gain(mscale=1.0, mscale_all_dim=0.707) == pytest.approx((m + 1) / (0.707 * m + 1))
    assert gain(mscale=1.0) == pytest.approx(m + 1)  # mscale alone is not read
    assert gain(mscale=1.0, mscale_all_dim=0.0) == pytest.approx(m + 1)  # GLM's 0.0 switches the ratio off
    assert rs.rope_inv_freq(64, 10000.0, {"rope_type": "yarn", "factor": 1.0,
                                          "original_max_position_embeddings": 4096})[1] == 1.0


def test_dynamic_is_unscaled_up_to_the_trained_length_and_grows_its_base_past_it():
    config = {"rope_type": "dynamic", "factor": 2.0}
    for n in (1, 1000, 4096):
        close(rs.rope_inv_freq(128, 10000.0, config, seq_len=n, max_position_embeddings=4096)[0], plain(128, 10000.0))
    longer = rs.rope_inv_freq(128, 10000.0, config, seq_len=8192, max_position_embeddings=4096)[0]
    close(longer, plain(128, 10000.0 * (2 * 8192 / 4096 - 1) ** (128 / 126)))
    longest = rs.rope_inv_freq(128, 10000.0, config, seq_len=16384, max_position_embeddings=4096)[0]
    assert longer[0] == longest[0] == 1.0
    assert bool((longest[1:] < longer[1:]).all()) and bool((longer[1:] < torch.tensor(plain(128, 1e4)[1:])).all())
    with_original = {**config, "original_max_position_embeddings": 4096}
    torch.testing.assert_close(rs.rope_inv_freq(128, 10000.0, with_original, seq_len=8192)[0], longer)


def turn_by_hand(x: torch.Tensor, p: float, thetas: list[float], gain: float = 1.0) -> torch.Tensor:
    """x (d,) float64 with pair i (channels 2i, 2i+1) turned by p·θ_i and scaled by gain, the rest left alone."""
    out = x.clone()
    for i, t in enumerate(thetas):
        c, s = math.cos(p * t) * gain, math.sin(p * t) * gain
        out[2 * i], out[2 * i + 1] = c * x[2 * i] - s * x[2 * i + 1], s * x[2 * i] + c * x[2 * i + 1]
    return out


@pytest.mark.parametrize("share", [0.25, 0.5])
def test_partial_rotary_turns_only_its_share(share):
    torch.manual_seed(0)
    x = torch.randn(5, 64, dtype=torch.float64)
    positions = [0, 1, 9, 300, 5000]
    r = int(64 * share)
    for given in ({"scaling": {"rope_type": "default", "partial_rotary_factor": share}},
                  {"partial_rotary_factor": share}):
        cos, sin = rs.scaled_angles(torch.tensor(positions), 64, 10000.0, dtype=torch.float64, **given)
        assert cos.shape == (5, r // 2) and rs.rope_inv_freq(64, 10000.0, **given)[0].shape == (r // 2,)
        out = rs.apply_partial(x, cos, sin)
        assert torch.equal(out[:, r:], x[:, r:])
        want = torch.stack([turn_by_hand(x[n], p, plain(r, 10000.0)) for n, p in enumerate(positions)])
        torch.testing.assert_close(out, want, rtol=1e-12, atol=1e-12)
    yarn = {**QWEN3, "partial_rotary_factor": share}
    close(rs.rope_inv_freq(64, 1e6, yarn)[0], yarn_by_hand(r, 1e6, 4.0, 32768, 32, 1, True))


def test_tables_fit_rope_apply_and_carry_the_attention_factor():
    at = torch.arange(0, 50)
    for want, got in zip(rope.angles(at, 32, dtype=torch.float64), rs.scaled_angles(at, 32, dtype=torch.float64)):
        torch.testing.assert_close(got, want, rtol=1e-12, atol=1e-12)
    torch.manual_seed(1)
    x = torch.randn(3, 50, 128, dtype=torch.float64)
    cos, sin = rs.scaled_angles(at, 128, 1e6, QWEN3, dtype=torch.float64)
    a = 0.1 * math.log(4.0) + 1
    torch.testing.assert_close(cos[0], torch.full((64,), a, dtype=torch.float64))
    theta = yarn_by_hand(128, 1e6, 4.0, 32768, 32, 1, True)
    torch.testing.assert_close(rope.apply(x, cos, sin)[1, 17], turn_by_hand(x[1, 17], 17, theta, a),
                               rtol=1e-12, atol=1e-12)
    assert rs.scaled_angles(at, 128, 1e6, QWEN3)[0].dtype == torch.float32


@pytest.mark.parametrize("base,config,kw", [
    (10000.0, None, {}), (10000.0, {"rope_type": "linear", "factor": 4.0}, {}),
    (10000.0, {"rope_type": "dynamic", "factor": 2.0, "original_max_position_embeddings": 64}, {"seq_len": 1000}),
    (10000.0, DEEPSEEK_V3, {}), (1e6, QWEN3, {}), (150000.0, GPT_OSS, {}), (500000.0, LLAMA31, {}),
    (10000.0, {**GPT_OSS, "partial_rotary_factor": 0.5}, {}),
])
def test_the_rotation_stays_relative_under_every_scaling(base, config, kw):
    torch.manual_seed(2)
    q, k = torch.randn(2, 1, 64, dtype=torch.float64).unbind(0)

    def score(i: int, j: int) -> float:
        turned = [rs.apply_partial(v, *rs.scaled_angles(torch.tensor([p]), 64, base, config, dtype=torch.float64,
                                                        **kw)) for v, p in ((q, i), (k, j))]
        return float((turned[0] * turned[1]).sum())
    for i, j in ((5, 2), (700, 0), (30000, 29000)):
        for shift in (1, 12345):
            assert score(i + shift, j + shift) == pytest.approx(score(i, j), rel=1e-8, abs=1e-8)


def test_scores_by_offset_draws_the_decay_with_and_without_scaling():
    offsets = [0, 1, 3, 10, 100, 1000, 5000]
    frame = rs.scores_by_offset(64, 10000.0, {"rope_type": "linear", "factor": 4.0}, offsets)
    assert list(frame.columns) == ["offset", "score", "scaling"] and len(frame) == 14
    unscaled = frame[frame.scaling == "unscaled"].set_index("offset").score
    scaled = frame[frame.scaling == "linear ×4"].set_index("offset").score
    for m in offsets:
        want = sum(2 * math.cos(m * t) for t in plain(64, 10000.0)) / 64
        assert unscaled[m] == pytest.approx(want, abs=1e-12)
    for m in (0, 10, 1000):  # position interpolation: offset 4m scaled scores as m unscaled does
        scaled_at = rs.scores_by_offset(64, 10000.0, {"rope_type": "linear", "factor": 4.0}, [4 * m])
        assert scaled_at.score.iloc[-1] == pytest.approx(unscaled[m], abs=1e-12)
    assert scaled[0] == unscaled[0] == pytest.approx(1.0)
    yarn = rs.scores_by_offset(128, 1e6, QWEN3, [0, 40000])
    assert yarn.score.iloc[2] == pytest.approx((0.1 * math.log(4.0) + 1) ** 2)  # a² at offset 0
    half = rs.scores_by_offset(64, 10000.0, {"rope_type": "default", "partial_rotary_factor": 0.5}, [0, 77])
    assert list(half.scaling) == ["unscaled"] * 2
    assert half.score[1] == pytest.approx((sum(2 * math.cos(77 * t) for t in plain(32, 1e4)) + 32) / 64, abs=1e-12)
    for bad in ([], [-1], [1.5], "12", [True]):
        with pytest.raises(ValueError, match="offsets"):
            rs.scores_by_offset(64, 10000.0, None, bad)


YARN = {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 4096}
BAD_SCALINGS = [
    (["linear", 2.0], "rope_scaling"),
    ({"factor": 2.0}, "rope_type"),
    ({"rope_type": "longrope", "factor": 2.0}, "rope_type"),
    ({"rope_type": 3}, "rope_type"),
    ({"rope_type": "linear", "type": "yarn", "factor": 2.0}, "type"),
    ({"rope_type": "linear"}, "factor"),
    ({"rope_type": "linear", "factor": 0}, "factor"),
    ({"rope_type": "linear", "factor": -2.0}, "factor"),
    ({"rope_type": "linear", "factor": float("nan")}, "factor"),
    ({"rope_type": "linear", "factor": float("inf")}, "factor"),
    ({"rope_type": "linear", "factor": True}, "factor"),
    ({"rope_type": "linear", "factor": "8"}, "factor"),
    ({"rope_type": "linear", "factor": 2.0, "beta_fast": 32}, "beta_fast"),
    ({**LLAMA31, "low_freq_factor": None}, "low_freq_factor"),
    ({k: v for k, v in LLAMA31.items() if k != "original_max_position_embeddings"}, "original_max_position_embeddings"),
    ({**LLAMA31, "low_freq_factor": 4.0, "high_freq_factor": 1.0}, "low_freq_factor"),
    ({**LLAMA31, "high_freq_factor": 0.0}, "high_freq_factor"),
    ({**LLAMA31, "low_freq_factr": 1.0}, "low_freq_factr"),
    ({**YARN, "original_max_position_embeddings": 0}, "original_max_position_embeddings"),
    ({**YARN, "original_max_position_embeddings": 4096.5}, "original_max_position_embeddings"),
    ({"rope_type": "yarn", "factor": 4.0}, "original_max_position_embeddings"),
    ({"rope_type": "dynamic", "factor": 2.0}, "original_max_position_embeddings"),
    ({**YARN, "beta_fast": 1, "beta_slow": 32}, "beta_fast"),
    ({**YARN, "beta_slow": -1}, "beta_slow"),
    ({**YARN, "attention_factor": 0.0}, "attention_factor"),
    ({**YARN, "mscale": float("nan")}, "mscale"),
    ({**YARN, "mscale_all_dim": -1.0}, "mscale_all_dim"),
    ({**YARN, "truncate": "no"}, "truncate"),
    ({"rope_type": "default", "partial_rotary_factor": 1.5}, "partial_rotary_factor"),
    ({"rope_type": "default", "partial_rotary_factor": 0}, "partial_rotary_factor"),
    ({"rope_type": "default", "rope_theta": 0.5}, "rope_theta"),
]


@pytest.mark.parametrize("scaling,field", BAD_SCALINGS)
def test_bad_scaling_dicts_are_refused_naming_the_field(scaling, field):
    problem = rs.rope_scaling_problem(scaling)
    assert problem and field in problem
    with pytest.raises(ValueError, match=field):
        rs.rope_inv_freq(64, 10000.0, scaling, seq_len=100)
    with pytest.raises(ValueError, match=field):
        rs.scaled_angles(torch.arange(4), 64, 10000.0, scaling)


@pytest.mark.parametrize("args,kw,field", [
    ((63,), {}, "head_dim"), ((True,), {}, "head_dim"), ((64, 1.0), {}, "base"),
    ((64, 10000.0, {"rope_type": "default", "rope_theta": 500000.0}), {}, "rope_theta"),
    ((64, 10000.0, {"rope_type": "dynamic", "factor": 2.0, "original_max_position_embeddings": 64}), {}, "seq_len"),
    ((64, 10000.0, None), {"seq_len": 0}, "seq_len"),
    ((64, 10000.0, None), {"partial_rotary_factor": 0.3}, "partial_rotary_factor"),  # 19 channels: odd
    ((64, 10000.0, {"rope_type": "default", "partial_rotary_factor": 0.5}), {"partial_rotary_factor": 0.25},
     "partial_rotary_factor"),
    ((4, 10000.0, {"rope_type": "dynamic", "factor": 2.0}), {"seq_len": 9, "partial_rotary_factor": 0.5,
                                                             "max_position_embeddings": 8}, "dynamic"),
    ((64, 10000.0, {"rope_type": "yarn", "factor": 2.0}), {"max_position_embeddings": -3}, "max_position_embeddings"),
])
def test_bad_calls_are_refused_naming_the_argument(args, kw, field):
    with pytest.raises(ValueError, match=field):
        rs.rope_inv_freq(*args, **kw)


def test_published_configs_pass_and_read_the_same_under_either_type_key():
    assert all(rs.rope_scaling_problem(c) is None for c in (LLAMA31, DEEPSEEK_V3, QWEN3, GPT_OSS, None))
    renamed = {("rope_type" if k == "type" else k): v for k, v in DEEPSEEK_V3.items()}
    torch.testing.assert_close(rs.rope_inv_freq(64, 1e4, renamed)[0], rs.rope_inv_freq(64, 1e4, DEEPSEEK_V3)[0])
    v5 = {**LLAMA31, "rope_theta": 500000.0}  # transformers ≥ 5 writes rope_parameters with the base inside
    torch.testing.assert_close(rs.rope_inv_freq(128, 500000.0, v5)[0], rs.rope_inv_freq(128, 500000.0, LLAMA31)[0])
    assert rs.trained_length(LLAMA31) == 8192 and rs.trained_length(None, max_position_embeddings=4096) == 4096
    assert rs.label(DEEPSEEK_V3) == "yarn ×40" and rs.label(None) == "unscaled"
