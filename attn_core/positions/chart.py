"""The Learn page's figure of RoPE scaling: RoPE's scores by offset out to four times the trained length, unscaled and
under a published config's `rope_scaling` (positions.scaling.scores_by_offset), averaged over bins of offsets, and
the pure Altair chart of it."""
from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import Any, Mapping

import altair as alt
import numpy as np
import pandas as pd

from attn_core.charts.style import PALETTE, REFERENCE_GREY, styled
from attn_core.positions import scaling

PAST = 4  # the figure runs to PAST × the trained length
SAMPLES = 8192  # offsets computed at most (a stride past that): the tables are SAMPLES × head_dim/2 numbers
BINS = 120  # geometric bins of offsets, each drawn as its mean score


@dataclass(frozen=True)
class Example:
    """A published config's RoPE: head_dim, base (rope_theta), its rope_scaling dict, the trained length and where
    the numbers come from."""

    head_dim: int
    base: float
    rope_scaling: Mapping[str, Any]
    trained: int
    source: str


EXAMPLES = {
    "Llama 3.1 (llama3 ×8)": Example(128, 500000.0, {
        "rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
        "original_max_position_embeddings": 8192}, 8192, "meta-llama/Llama-3.1-8B config.json"),
    "Qwen3 with YaRN (×4)": Example(128, 1000000.0, {
        "rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 32768}, 32768,
        "Qwen/Qwen3-8B model card, 'Processing long texts'"),
    "Position interpolation (linear ×4)": Example(128, 10000.0, {"rope_type": "linear", "factor": 4.0}, 4096,
                                                  "Chen et al. 2023, arXiv 2306.15595, on Llama 2 (4,096 tokens)"),
    "Dynamic NTK (×2)": Example(128, 10000.0, {"rope_type": "dynamic", "factor": 2.0,
                                               "original_max_position_embeddings": 4096}, 4096,
                                "Hugging Face's 'dynamic' rope_type, on Llama 2 (4,096 tokens)"),
}


def decay_frame(example: Example, *, past: int = PAST, samples: int = SAMPLES, bins: int = BINS) -> pd.DataFrame:
    """scores_by_offset(...) at offsets 0 … past·trained (each below samples/2, then every stride-th, about
    `samples` in all), averaged over `bins` geometric bins of offsets: one row a bin and curve, columns offset (the
    bin's first offset, ≥ 1), score (the mean over the bin's offsets), scaling (the curve's label). Dynamic's
    frequencies are those for the whole range. O(samples·head_dim) time and memory."""
    last, every = past * example.trained, samples // 2  # every offset below `every`, then a stride
    stride = max(1, -(-(last - every) // (samples - every)))
    offsets = list(range(0, min(every, last + 1))) + list(range(every, last + 1, stride))
    scores = scaling.scores_by_offset(example.head_dim, example.base, example.rope_scaling, offsets)
    scores = scores[scores["offset"] >= 1].copy()  # offset 0 (score 1, or a² for yarn) has no place on a log axis
    edges = np.unique(np.geomspace(1, last + 1, bins + 1).round().astype(int))
    scores["offset"] = edges[np.searchsorted(edges, scores["offset"], side="right") - 1]  # each bin's first offset
    return scores.groupby(["scaling", "offset"], sort=False, as_index=False)["score"].mean()[
        ["offset", "score", "scaling"]]


def decay_chart(frame: pd.DataFrame, trained: int, *, title: str = "RoPE's scores past the trained length",
                subtitle: str | list[str] = "") -> alt.TopLevelMixin:
    """decay_frame's curves on a log offset axis, one colour a curve (unscaled first), and a grey rule at the
    trained length. Pure: DataFrame in, chart out."""
    curves = list(dict.fromkeys(frame["scaling"]))
    colour = alt.Scale(domain=curves, range=[PALETTE[0], PALETTE[3], *PALETTE[5:]][:len(curves)])
    lines = alt.Chart(frame).mark_line(strokeWidth=2).encode(
        x=alt.X("offset:Q", scale=alt.Scale(type="log"), title="offset i − j (tokens)"),
        y=alt.Y("score:Q", title="mean score over the bin"),
        color=alt.Color("scaling:N", scale=colour, title=None),
        tooltip=[alt.Tooltip("scaling:N"), alt.Tooltip("offset:Q", format=","), alt.Tooltip("score:Q", format=".3f")])
    marks = pd.DataFrame({"offset": [trained], "label": [f"trained length {trained:,}"]})
    rule = alt.Chart(marks).mark_rule(color=REFERENCE_GREY, strokeDash=[4, 4]).encode(x="offset:Q")
    text = alt.Chart(marks).mark_text(align="left", dx=4, dy=-6, color=REFERENCE_GREY, baseline="bottom").encode(
        x="offset:Q", y=alt.value(12), text="label:N")
    return styled(alt.layer(lines, rule, text).properties(
        width="container", height=300, title=alt.TitleParams(title, subtitle=subtitle, anchor="start")))


CAPTION = ("The score of a query and key that are the same vector, by how far apart they stand, averaged over bins "
           "of offsets. Past the trained length (grey) unscaled RoPE turns its slowest pairs by angles training "
           "never showed; each scaling slows those pairs so the longer range reuses angles seen in training (linear: "
           "the whole curve stretched by the factor; llama3 and YaRN: only the slow pairs, so short offsets keep "
           "their sharp detail; YaRN also multiplies every score by its attention factor squared).")


@functools.lru_cache(maxsize=len(EXAMPLES))
def example_frame(name: str) -> pd.DataFrame:
    """decay_frame of EXAMPLES[name], computed once a process (about a second); KeyError naming them otherwise.
    Treat as read-only."""
    if name not in EXAMPLES:
        raise KeyError(f"no example {name!r}; there are {', '.join(EXAMPLES)}")
    return decay_frame(EXAMPLES[name])
