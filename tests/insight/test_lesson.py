"""The Learn page's walk through one attention layer, checked step by step against numpy written here."""
import dataclasses
import math

import numpy as np
import pytest
import torch

from attn_core import MECHANISMS
from attn_core.insight import lesson
from attn_core.spec import Shape

SENTENCE = "the cat sat on the mat"


def softmax_rows(s: np.ndarray) -> np.ndarray:
    e = np.exp(s - s.max(axis=-1, keepdims=True))
    return e / e.sum(axis=-1, keepdims=True)


def by_hand(sentence: str, setup: lesson.Setup, source: str | None = None) -> dict[str, np.ndarray]:
    """The same layer in numpy, from the same embeddings and weights (they are inputs, not results)."""
    queries = [f"{i} {w}" for i, w in enumerate(sentence.split())]
    keys = [f"{i} {w}" for i, w in enumerate((source or sentence).split())]
    keys += [f"{len(keys) + i} <pad>" for i in range(setup.pad)]
    x = lesson.embed(queries, setup.d_model, setup.seed).numpy()
    src = lesson.embed(keys, setup.d_model, setup.seed).numpy()
    w = {name: t.numpy() for name, t in lesson.weights(setup).items()}
    n, m = len(queries), len(keys)
    allowed = np.ones((n, m), dtype=bool)
    allowed[:, [j for j, key in enumerate(keys) if key.endswith("<pad>")]] = False
    if setup.causal:
        allowed &= np.tril(np.ones((n, m), dtype=bool))
    outs, all_weights, all_scores = [], [], []
    for h in range(setup.heads):
        q, k, v = x @ w["w_q"][h], src @ w["w_k"][h], src @ w["w_v"][h]
        if setup.score == "additive":
            s = np.array([[w["v_a"][h] @ np.tanh(q[i] @ w["w_a"][h] + k[j] @ w["u_a"][h]) for j in range(m)]
                          for i in range(n)])
        else:
            s = q @ k.T / (math.sqrt(setup.d_k) if setup.scaled else 1.0)
        a = softmax_rows(np.where(allowed, s, -np.inf))
        all_scores.append(s)
        all_weights.append(a)
        outs.append(a @ v)
    concat = np.concatenate(outs, axis=1)
    return {"scores": np.stack(all_scores), "weights": np.stack(all_weights), "heads_out": np.stack(outs),
            "concat": concat, "output": concat @ w["w_o"], "allowed": allowed}


@pytest.mark.parametrize("setup, source", [
    (lesson.Setup(), None), (lesson.Setup(d_k=8, heads=3), None), (lesson.Setup(causal=True, pad=2), None),
    (lesson.Setup(scaled=False, d_k=16), None), (lesson.Setup(score="additive", heads=2), None),
    (lesson.Setup(d_k=4, heads=2), "le chat était assis"), (lesson.Setup(pad=1, seed=5), "a b")])
def test_every_step_matches_numpy(setup, source):
    walk = lesson.walk(SENTENCE, setup, source)
    expected = by_hand(SENTENCE, setup, source)
    assert np.array_equal(walk.allowed.numpy(), expected["allowed"])
    for name in ("scores", "weights", "heads_out", "concat", "output"):
        assert np.allclose(getattr(walk, name).numpy(), expected[name], rtol=1e-10, atol=1e-12), name
    assert np.allclose(walk.weights.sum(-1).numpy(), 1.0)
    assert torch.all(walk.weights[:, ~walk.allowed] == 0)


def test_the_readout_is_the_spread_and_the_largest_weight():
    walk = lesson.walk(SENTENCE, lesson.Setup(d_k=16, scaled=False, causal=True))
    allowed = walk.allowed.numpy()
    raw = walk.raw.numpy()[0][allowed]
    read = walk.readout()
    assert read["raw_std"] == pytest.approx(np.std(raw)) and read["scores_std"] == pytest.approx(np.std(raw))
    # causal: row 0 sees only its own key (weight 1 whatever the scores), so it is left out of the saturation measure
    choosing = allowed.sum(1) >= 2
    assert not choosing[0] and choosing[1:].all()
    assert read["max_weight"] == pytest.approx(walk.weights.numpy()[:, choosing].max())
    assert read["max_weight"] < 1.0 and read["rows_counted"] == int(choosing.sum()) * walk.weights.shape[0]


def test_a_walk_where_no_row_chooses_has_no_largest_weight():
    walk = lesson.walk("alone", lesson.Setup(d_k=4, causal=True))
    assert np.isnan(walk.readout()["max_weight"]) and walk.readout()["rows_counted"] == 0


@pytest.mark.parametrize("scaled", [True, False])
def test_the_scores_captions_state_the_walk_s_own_spread(scaled):
    """Captions that describe a value are computed from it: the spread the page's metric shows, not a textbook 1."""
    walk = lesson.walk(SENTENCE, lesson.Setup(d_k=4, scaled=scaled))
    raw_std = float(np.std(walk.raw.numpy()[walk.allowed.numpy()[None].repeat(walk.raw.shape[0], 0)]))
    says = {s.key: s.says for s in lesson.steps(walk)}
    assert f"standard deviation of {raw_std:.3g}" in says["raw"]
    if scaled:
        scores_std = float(np.std(walk.scores.numpy()))
        assert f"from {raw_std:.3g} to {scores_std:.3g}" in says["scaled"]
    else:
        assert f"spread of {raw_std:.3g}" in says["scaled"]


def test_without_the_scale_large_d_k_saturates_the_softmax():
    """q·k of unit-variance entries has standard deviation √d_k (≈ 22.6 at 512): the issue's teaching point."""
    sentence = "one two three four five six seven eight nine ten eleven twelve"
    unscaled = [lesson.walk(sentence, lesson.Setup(d_k=512, scaled=False, seed=s)).readout() for s in range(4)]
    scaled = [lesson.walk(sentence, lesson.Setup(d_k=512, seed=s)).readout() for s in range(4)]
    assert 15 < np.mean([r["raw_std"] for r in unscaled]) < 30
    assert 0.6 < np.mean([r["scores_std"] for r in scaled]) < 1.5
    assert min(r["max_weight"] for r in unscaled) > 0.99 > max(r["max_weight"] for r in scaled)


def test_a_word_keeps_its_embedding_wherever_it_stands():
    x = lesson.embed(["0 the", "1 cat", "2 the"], 8, seed=0)
    assert torch.equal(x[0], x[2]) and not torch.equal(x[0], x[1])
    assert not torch.equal(x[0], lesson.embed(["0 the"], 8, seed=1)[0])


def test_the_dot_product_output_comes_from_the_benchmarked_softmax_kernel(monkeypatch):
    spec, calls = MECHANISMS["softmax"], []

    def kernel(*args, **kwargs):
        calls.append(kwargs)
        return spec.fn(*args, **kwargs)

    monkeypatch.setattr(lesson, "MECHANISMS", {"softmax": dataclasses.replace(spec, fn=kernel)})
    lesson.walk(SENTENCE, lesson.Setup(causal=True))
    assert len(calls) == 1 and calls[0]["mask"].dtype == torch.bool
    lesson.walk(SENTENCE, lesson.Setup(score="additive"))  # not a dot product: computed here, not by the kernel
    assert len(calls) == 1


@pytest.mark.parametrize("sentence, setup, source, sentence_part", [
    ("", lesson.Setup(), None, "the sentence is empty"),
    (" ".join(["w"] * 13), lesson.Setup(), None, "use at most 12"),
    (SENTENCE, lesson.Setup(causal=True), "a b", "a causal mask needs self-attention"),
    (SENTENCE, lesson.Setup(d_k=0), None, "d_k = 0 is not allowed"),
    (SENTENCE, lesson.Setup(heads=9), None, "heads = 9"),
    (SENTENCE, lesson.Setup(score="cosine"), None, "is not one of dot-product, additive"),
    (SENTENCE, lesson.Setup(), "  ", "the source sentence is empty")])
def test_bad_settings_are_refused_with_a_sentence(sentence, setup, source, sentence_part):
    with pytest.raises(ValueError, match=sentence_part):
        lesson.walk(sentence, setup, source)


def test_the_cost_table_counts_cells_and_bytes():
    setup = lesson.Setup(d_k=64, heads=8)
    for n in (6, 1024, 32768, 1048576):
        row = lesson.cost(n, setup)
        assert row["cells"] == 8 * n * n and row["bytes"] == 4 * 8 * n * n
        assert row["peak_bytes"] == MECHANISMS["softmax"].cost.memory_bytes(Shape(1, 8, n, n, 64))
    assert lesson.cost(1048576, setup)["bytes"] == 32 * 2**40  # 32 TiB of scores for a million tokens


def test_the_steps_say_their_shapes_and_show_the_mask_only_when_there_is_one():
    walk = lesson.walk(SENTENCE, lesson.Setup(d_k=4, heads=2, causal=True))
    steps = {s.key: s for s in lesson.steps(walk)}
    assert list(steps) == ["x", "q", "k", "v", "raw", "scaled", "masked", "weights", "heads_out", "concat", "output"]
    assert steps["raw"].shape == "S: 6 × 6 = n × m" and steps["concat"].shape == "concat: 6 × 8 = n × h·d_k"
    assert torch.isinf(steps["masked"].matrix).sum() == 2 * 15  # the upper triangle of each head
    plain = [s.key for s in lesson.steps(lesson.walk(SENTENCE, lesson.Setup(score="additive")))]
    assert "masked" not in plain and "scaled" not in plain
    wide = lesson.steps(lesson.walk(SENTENCE, lesson.Setup(d_k=64)))[1]
    assert wide.matrix.shape[-1] == lesson.SHOWN_DIMS and "first 16 of 64" in wide.says


def test_a_step_s_digest_follows_everything_its_figure_shows():
    """Equal steps (made apart) share a digest; a change to one number, one label, a text, the panels or the type
    changes it (the Learn page reuses a chart by it)."""
    step = lesson.steps(lesson.walk("the cat sat", lesson.Setup()))[-1]
    again = lesson.steps(lesson.walk("the cat sat", lesson.Setup()))[-1]
    assert step.matrix is not again.matrix and lesson.step_digest(step) == lesson.step_digest(again)
    nudged = step.matrix.clone()
    nudged.view(-1)[0] = math.nextafter(float(nudged.view(-1)[0]), math.inf)
    changed = [dataclasses.replace(step, matrix=nudged), dataclasses.replace(step, rows=["a", *step.rows[1:]]),
               dataclasses.replace(step, says=step.says + "."), dataclasses.replace(step, panels=("one",)),
               dataclasses.replace(step, matrix=step.matrix.to(
                   torch.float32 if step.matrix.dtype == torch.float64 else torch.float64))]
    digests = {lesson.step_digest(s) for s in changed}
    assert len(digests) == len(changed) and lesson.step_digest(step) not in digests
