"""Llama 4's query temperature (attn_temperature_tuning on its NoPE layers) against the published rule written out
here: s(p) = ln(⌊(p + 1)/floor_scale⌋ + 1)·attn_scale + 1, floor_scale 8192 and attn_scale 0.1 in
meta-llama/Llama-4-Scout-17B-16E's config.json."""
from __future__ import annotations

import math

import pytest
import torch

import attn_core
from attn_core.positions import temperature


def rule(p: int, floor_scale: int = 8192, attn_scale: float = 0.1) -> float:
    return math.log(math.floor((p + 1) / floor_scale) + 1) * attn_scale + 1


def test_the_scale_follows_the_published_rule():
    at = [0, 1, 8190, 8191, 8192, 16383, 65535, 131071, 10_000_000]
    got = temperature.query_scale(torch.tensor(at, dtype=torch.float64))
    torch.testing.assert_close(got, torch.tensor([rule(p) for p in at], dtype=torch.float64), rtol=1e-15, atol=0)
    assert got[2] == 1.0 and got[3] == pytest.approx(1 + 0.1 * math.log(2))  # the first step: p + 1 = 8192
    assert got[6] == pytest.approx(1 + 0.1 * math.log(9))  # p = 65535: ⌊65536/8192⌋ = 8
    small = temperature.query_scale(torch.arange(10), floor_scale=4, attn_scale=0.5)
    assert small.tolist() == pytest.approx([rule(p, 4, 0.5) for p in range(10)])
    assert attn_core.positional.query_scale is temperature.query_scale


def test_tempered_queries_scale_each_row_and_so_each_row_of_scores():
    g = torch.Generator().manual_seed(0)
    q, k = torch.randn(2, 3, 20, 8, generator=g, dtype=torch.float64).unbind(0)
    positions = torch.arange(20) * 1000  # rows from 0 to 19,000: three steps of the scale
    got = temperature.temper_queries(q, positions)
    for i, p in enumerate(positions.tolist()):
        torch.testing.assert_close(got[:, i], q[:, i] * rule(p), rtol=1e-15, atol=0)
    scores, tempered = q @ k.transpose(-1, -2), got @ k.transpose(-1, -2)
    torch.testing.assert_close(tempered[:, 17], scores[:, 17] * rule(17000), rtol=1e-12, atol=1e-12)
    half = temperature.temper_queries(q.half(), positions)
    assert half.dtype == torch.float16


@pytest.mark.parametrize("kw,field", [
    ({"floor_scale": 0}, "floor_scale"), ({"floor_scale": 8192.0}, "floor_scale"),
    ({"floor_scale": True}, "floor_scale"),
    ({"attn_scale": -0.1}, "attn_scale"), ({"attn_scale": float("nan")}, "attn_scale"),
])
def test_bad_settings_are_refused_with_a_sentence(kw, field):
    with pytest.raises(ValueError, match=field):
        temperature.query_scale(torch.arange(4), **kw)


def test_bad_positions_and_queries_are_refused():
    with pytest.raises(ValueError, match="positions"):
        temperature.query_scale(torch.tensor([True, False]))
    with pytest.raises(ValueError, match="≥ 0"):
        temperature.query_scale(torch.tensor([-1, 0]))
    with pytest.raises(ValueError, match="one position a query"):
        temperature.temper_queries(torch.randn(1, 5, 8), torch.arange(4))
    with pytest.raises(ValueError, match="floating-point"):
        temperature.temper_queries(torch.ones(5, 8, dtype=torch.long), torch.arange(5))
