"""The rest of the lesson (attn_core.insight.further): positions on the page's layer, the lookup, rollout, saliency,
erasure and the Jain–Wallace check, against cases whose answers are known or written out here."""
from __future__ import annotations

import math

import pytest
import torch

from attn_core.insight import further, lesson

SENTENCE = "the cat sat on the mat"


def test_the_layer_without_positions_is_the_walks_layer():
    for setup in (lesson.Setup(), lesson.Setup(d_k=8, heads=3, scaled=False, seed=2)):
        walk = lesson.walk(SENTENCE, setup)
        out, attn = further.attend(walk.x, lesson.weights(setup), setup)
        assert torch.allclose(out, walk.output, atol=1e-12) and torch.allclose(attn, walk.weights, atol=1e-12)


@pytest.mark.parametrize("kind", further.PERMUTATIONS)
def test_outputs_follow_a_permutation_until_positions_are_added(kind):
    step = further.permutation_step(SENTENCE, lesson.Setup(d_k=4, heads=2), kind)
    rows = dict(zip(step.rows, step.matrix[0]))
    assert step.rows == list(further.ENCODINGS) and float(rows["none"].max()) < 1e-12
    for encoding in ("sinusoidal", "learned", "relative", "RoPE"):
        assert float(rows[encoding].max()) > 1e-3, encoding
    # ALiBi's penalty |i − j| is the same for a sentence and its mirror image; other orders change distances
    assert (float(rows["ALiBi"].max()) < 1e-12) == (kind == "reversed")


def test_the_permuted_columns_name_the_moved_words():
    assert further.permutation(4, "rotated by one") == [1, 2, 3, 0]
    assert further.permutation(4, "first and last swapped") == [3, 1, 2, 0]
    step = further.permutation_step("a b c", lesson.Setup(), "reversed")
    assert step.columns == ["0 c", "1 b", "2 a"]


def test_rope_scores_are_the_same_at_every_absolute_position():
    step = further.rope_step(SENTENCE, lesson.Setup(d_k=8), query=1, key=2)
    m = step.matrix[0]
    assert m.shape == (len(further.ABSOLUTE), 11)
    assert torch.allclose(m, m[0].expand_as(m), atol=1e-9) and float(m[0].std()) > 1e-3


def test_the_sinusoidal_and_alibi_figures_hold_the_formulas():
    pe = further.sinusoidal_step(5, 4).matrix[0]
    assert float(pe[3, 2]) == pytest.approx(math.sin(3 / 100)) and float(pe[3, 1]) == pytest.approx(math.cos(3))
    alibi = further.alibi_step(4).matrix[0]
    assert alibi[0].tolist() == [0, -0.5, -1, -1.5] and alibi[7].tolist() == [0, -1 / 256, -2 / 256, -3 / 256]


def test_the_lookup_goes_from_soft_to_hard_as_the_temperature_falls():
    walk = lesson.walk(SENTENCE, lesson.Setup(d_k=8))
    scores = walk.scores[0, 2]
    cold, warm, hot = (further.lookup(walk, 2, t) for t in (0.01, 1.0, 100.0))
    assert torch.equal(cold.hard, torch.nn.functional.one_hot(scores.argmax(), 6).double())
    assert cold.gap < 1e-6 < warm.gap
    assert torch.allclose(warm.soft, torch.softmax(scores, -1)) and torch.allclose(warm.soft_out,
                                                                                    warm.soft @ walk.v[0])
    uniform = torch.full((6,), 1 / 6, dtype=torch.float64)
    assert torch.allclose(hot.soft, uniform, atol=0.01)  # nearly the mean of the values
    with pytest.raises(ValueError, match="temperature"):
        further.lookup(walk, 0, 0.0)


def test_rollout_of_one_layer_is_its_residual_mixed_weights():
    x = lesson.embed(lesson.words(SENTENCE), 8, 0)
    setup = lesson.Setup(d_k=4, heads=2)
    weights = [a.mean(0) for a in further.run_stack(x, further.stack(setup, 2), setup)[1]]
    first = 0.5 * weights[0] + 0.5 * torch.eye(6, dtype=torch.float64)
    assert torch.allclose(further.rollout(weights[:1]), first, atol=1e-12)
    second = 0.5 * weights[1] + 0.5 * torch.eye(6, dtype=torch.float64)
    assert torch.allclose(further.rollout(weights), second @ first, atol=1e-12)
    assert torch.allclose(further.rollout(weights).sum(-1), torch.ones(6, dtype=torch.float64))


def copy_previous(n: int, sharpness: float = 40.0) -> tuple[torch.Tensor, list[dict], lesson.Setup]:
    """One-hot words and one layer in which word i attends only to word i − 1 (score sharpness·[j = i − 1]) and
    copies it: y_i = x_i + x_{i−1}. So word i's output depends on words i and i − 1 only."""
    setup = lesson.Setup(d_k=n, heads=1)
    shift = torch.roll(torch.eye(n, dtype=torch.float64), 1, dims=0)  # key j → e_{j+1}
    eye = torch.eye(n, dtype=torch.float64)
    w = {"w_q": (sharpness * math.sqrt(n) * eye)[None], "w_k": shift.T[None], "w_v": eye[None], "w_o": eye}
    return eye, [w], setup


def test_erasure_and_saliency_find_the_word_that_was_copied():
    x, ws, setup = copy_previous(6)
    y, attn = further.run_stack(x, ws, setup)
    assert float(attn[0][0, 3, 2]) > 0.999 and torch.allclose(y[3], x[3] + x[2], atol=1e-6)
    erased = further.erasure(x, ws, setup, token=3)
    assert int(erased.argmax()) == 2 and float(erased[2]) > 0.2
    assert float(torch.cat((erased[:2], erased[3:])).max()) < 1e-6
    salient = further.saliency(x, ws, setup, token=3)
    assert torch.allclose(salient[2:4], torch.ones(2, dtype=torch.float64), atol=1e-4)
    assert float(torch.cat((salient[:2], salient[4:])).max()) < 1e-6


def test_the_four_answers_are_shares_of_one_word():
    setup = lesson.Setup(d_k=4, heads=2)
    steps = {view: further.explain_step(view, SENTENCE, setup, layers=3, token=2) for view in further.EXPLAIN_VIEWS[:3]}
    assert steps["weights per layer"].matrix.shape == (3, 6, 6) and steps["rollout"].panels[-1] == "after layer 3"
    x = lesson.embed(lesson.words(SENTENCE), 8, 0)
    layers = [a.mean(0) for a in further.run_stack(x, further.stack(setup, 3), setup)[1]]
    assert torch.allclose(steps["rollout"].matrix[2], further.rollout(layers))
    answers = steps["one word, four answers"].matrix[0]
    assert answers.shape == (4, 6) and torch.allclose(answers.sum(-1), torch.ones(4, dtype=torch.float64))
    assert torch.allclose(answers[0], layers[-1][2] / layers[-1][2].sum())
    with pytest.raises(ValueError, match="layers = 5"):
        further.explain_step("rollout", SENTENCE, lesson.Setup(), layers=5)


def test_jain_wallace_finds_other_weights_for_nearly_the_same_output():
    walk = lesson.walk(SENTENCE, lesson.Setup(d_k=4, seed=3))
    found = further.reweight(walk)
    assert torch.allclose(found.found.sum(-1), torch.ones(1, 6, dtype=torch.float64))
    tv = 0.5 * (found.found - walk.weights).abs().sum(-1)
    assert found.weight_change == pytest.approx(float(tv.mean())) and found.largest_row_change == float(tv.max())
    y = (found.found @ walk.v).transpose(0, 1).reshape(6, -1) @ walk.w_o
    assert found.output_change == pytest.approx(float((y - walk.output).norm() / walk.output.norm()))
    assert found.weight_change > 0.15 and found.output_change < 0.05  # moved far, output barely
    masked = further.reweight(lesson.walk(SENTENCE, lesson.Setup(causal=True)), steps=10)
    assert torch.all(masked.found[0].triu(1) == 0)


def test_the_searchs_gradient_is_autograds():
    walk = lesson.walk(SENTENCE, lesson.Setup(d_k=4, heads=2, causal=True))
    z = (walk.masked + torch.randn(walk.masked.shape, generator=torch.Generator().manual_seed(1),
                                   dtype=torch.float64)).requires_grad_(True)
    loss, grad = further.reweight_loss(z, walk, penalty=7.0)
    loss.backward()
    live = torch.isfinite(walk.masked)
    assert torch.allclose(grad[live], z.grad[live], atol=1e-10) and torch.all(grad[~live] == 0)
