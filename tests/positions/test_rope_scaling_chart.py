"""The Learn page's RoPE scaling figure: its binned scores against the decay written out here, its published
examples, and the chart's encodings through to_dict()."""
from __future__ import annotations

import math

import pytest

from attn_core.positions import chart, scaling


def score(m: int, freqs: list[float], d: int) -> float:
    """⟨R(m)·1, 1⟩/d for the all-ones head: Σ_i 2·cos(m·θ_i) / d."""
    return sum(2 * math.cos(m * t) for t in freqs) / d


def test_each_bin_is_the_mean_score_of_its_offsets():
    example = chart.Example(8, 10000.0, {"rope_type": "linear", "factor": 4.0}, 16, "a small case")
    frame = chart.decay_frame(example, past=4, samples=10_000, bins=12)
    plain = [10000.0 ** (-2 * i / 8) for i in range(4)]
    for label, freqs in (("unscaled", plain), ("linear ×4", [t / 4 for t in plain])):
        rows = frame[frame.scaling == label]
        starts = list(rows.offset)
        assert starts[0] == 1 and starts == sorted(set(starts)) and starts[-1] <= 64
        for a, b, got in zip(starts, starts[1:] + [65], rows.score):
            assert got == pytest.approx(sum(score(m, freqs, 8) for m in range(a, b)) / (b - a), abs=1e-12)


def test_the_published_examples_compute_and_each_draws_two_curves():
    for name, example in chart.EXAMPLES.items():
        assert scaling.rope_scaling_problem(example.rope_scaling) is None, name
        assert scaling.trained_length(example.rope_scaling, max_position_embeddings=example.trained) == example.trained
    frame = chart.example_frame("Llama 3.1 (llama3 ×8)")
    assert list(dict.fromkeys(frame.scaling)) == ["unscaled", "llama3 ×8"]
    assert frame.offset.max() <= chart.PAST * 8192 and frame.offset.min() == 1
    with pytest.raises(KeyError, match="no example"):
        chart.example_frame("Llama 5")


def test_the_chart_draws_the_curves_on_a_log_axis_with_the_trained_length():
    frame = chart.decay_frame(chart.Example(8, 10000.0, {"rope_type": "linear", "factor": 2.0}, 16, "s"), bins=8)
    spec = chart.decay_chart(frame, 16, subtitle="s").to_dict()
    lines, rule, text = spec["layer"]
    assert lines["mark"]["type"] == "line" and lines["encoding"]["x"]["scale"]["type"] == "log"
    assert lines["encoding"]["color"]["scale"]["domain"] == ["unscaled", "linear ×2"]
    assert rule["mark"]["type"] == "rule"
    marks = [r for data in spec["datasets"].values() for r in data if "label" in r]
    assert marks == [{"offset": 16, "label": "trained length 16"}]
    assert spec["title"]["text"] == "RoPE's scores past the trained length"
