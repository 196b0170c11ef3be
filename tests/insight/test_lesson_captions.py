"""Learn's captions read back against the walk's own tensors (float64 loops written here), and its heatmaps sized
to the page's column, two heads and padding included."""
import math
import re

import pytest

from attn_core.insight import lesson

SENTENCE = "the cat sat on the mat"


def std(values: list[float]) -> float:
    mean = sum(values) / len(values)
    return math.sqrt(sum((v - mean) ** 2 for v in values) / len(values))


def entries(tensor) -> list[float]:
    return [float(v) for v in tensor.reshape(-1).tolist()]


@pytest.mark.parametrize("causal, pad, heads", [(False, 0, 1), (True, 2, 2), (False, 3, 2)])
def test_every_figure_in_the_scores_captions_is_the_walk_s_own(causal, pad, heads):
    walk = lesson.walk(SENTENCE, lesson.Setup(d_k=4, causal=causal, pad=pad, heads=heads))
    says = {s.key: s.says for s in lesson.steps(walk)}
    allowed = walk.allowed.tolist()
    n, m = len(allowed), len(allowed[0])
    raw = [float(walk.raw[h, i, j]) for h in range(heads) for i in range(n) for j in range(m) if allowed[i][j]]
    scores = [float(walk.scores[h, i, j]) for h in range(heads) for i in range(n) for j in range(m) if allowed[i][j]]
    assert f"standard deviation of {std(raw):.3g} (Q's entries {std(entries(walk.q)):.3g}, K's " \
           f"{std(entries(walk.k)):.3g})" in says["raw"]
    assert f"from {std(raw):.3g} to {std(scores):.3g}." in says["scaled"]
    # the largest weight among rows that see two keys or more, and an even split of that row's keys
    best, keys = max((float(walk.weights[h, i, j]), sum(allowed[i])) for h in range(heads) for i in range(n)
                     for j in range(m) if sum(allowed[i]) >= 2)
    assert f"largest weight of a row with a choice is {best:.3f}, where an even split of its {keys} keys gives " \
           f"{1 / keys:.3f}." in says["scaled"]
    assert "whatever d_k is" not in says["scaled"]  # a claim no number on the page backed


def test_a_walk_where_no_row_chooses_says_nothing_of_its_largest_weight():
    walk = lesson.walk("alone", lesson.Setup(d_k=4, causal=True))
    scaled = {s.key: s.says for s in lesson.steps(walk)}["scaled"]
    assert "largest weight" not in scaled and re.search(r"from [\d.]+ to [\d.]+\.$", scaled)


@pytest.mark.parametrize("heads, words, pad, talk", [(2, 6, 4, False), (1, 6, 0, False), (2, 6, 4, True),
                                                     (4, 6, 2, False), (2, 12, 4, False)])
def test_a_heatmap_with_heads_and_padding_fits_the_column(heads, words, pad, talk):
    columns = words + pad  # the padded keys are the last columns: a spill cut them off first
    cell = lesson.cell_px(heads, words, columns, talk=talk)
    # width: the words down the left and the legend (170 px, 240 in talk mode), the cells, 20 px between panels
    width = (240 if talk else 170) + heads * columns * cell + 20 * (heads - 1)
    assert width <= (1150 if talk else 800) and cell >= 12
    assert cell <= (64 if talk else 48) and words * cell <= 640


def test_a_small_heatmap_keeps_cells_that_hold_their_numbers():
    assert lesson.cell_px(1, 6, 6) == 48 and lesson.cell_px(1, 6, 6, talk=True) == 64
