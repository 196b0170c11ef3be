"""The Learn page's last three steps through AppTest: positions, the lookup and what the weights explain, each
drawn from attn_core.insight.further with its controls."""
from __future__ import annotations

from pathlib import Path

import pytest
from streamlit.testing.v1 import AppTest

from attn_core.insight import further, lesson
from tests.apptest_helpers import chart_specs

ROOT = Path(__file__).resolve().parents[2]
SENTENCE = "the cat sat on the mat"


def page(**state) -> AppTest:
    """The Learn page run once with widget values preset by key."""
    at = AppTest.from_file(str(ROOT / "pages" / "learn.py"), default_timeout=60)
    for key, value in state.items():
        at.session_state[key] = value
    return at.run()


def rows(spec: dict, column: str) -> list[dict]:
    return [r for data in spec["datasets"].values() for r in data if column in r]


def titles(at: AppTest) -> list[str]:
    """The last three charts' titles: the three steps'."""
    return [s["title"]["text"] for s in chart_specs(at)[-3:]]


def test_the_three_steps_follow_the_walk_each_with_its_chart_and_exports():
    at = page(learn_pos_perm="reversed")
    assert not at.exception and not at.error
    assert [h.value for h in at.subheader][-3:] == [
        "11. Where words stand: positions", "12. Attention as a soft dictionary lookup",
        "13. What the weights do and do not explain"]
    drawn = titles(at)
    assert drawn[0].startswith("Permuted (reversed)") and drawn[1].startswith("The lookup of “0 the”")
    assert drawn[2] == "Raw weights of a 2-layer stack"
    exports = {b.key for b in at.get("download_button")}
    for stem in ("learn-11-permutation", "learn-12-lookup", "learn-13-layers"):
        assert {f"learn_dl_{stem}_{fmt}" for fmt in ("png", "svg", "csv")} <= exports
    step = further.permutation_step(SENTENCE, lesson.Setup(), "reversed")
    shown = {(r["query"], r["key"]): r["change"] for r in rows(chart_specs(at)[-3], "change")}
    for i, encoding in enumerate(step.rows):
        for j, word in enumerate(step.columns):
            assert shown[(encoding, word)] == pytest.approx(float(step.matrix[0, i, j]))
    assert all(shown[("none", w)] < 1e-12 and shown[("ALiBi", w)] < 1e-12 for w in step.columns)  # mirror-blind
    assert all(shown[("relative", w)] > 1e-3 for w in step.columns)


def test_alibi_the_cold_lookup_and_rollout():
    at = page(learn_pos_view="ALiBi per head", learn_lookup_q=2, learn_lookup_t=0.01, learn_explain_layers=3,
              learn_explain_view="rollout")
    assert not at.exception
    alibi, looked, rolled = titles(at)
    assert alibi.startswith("ALiBi: a linear penalty") and looked == "The lookup of “2 sat”: hard and soft side by side"
    assert rolled.startswith("Attention rollout") and "after layer 3" in chart_specs(at)[-1]["facet"]["column"][
        "header"]["labelExpr"]
    shown = {m.label: m.value for m in at.metric}
    expected = further.lookup(lesson.walk(SENTENCE, lesson.Setup()), 2, 0.01)
    assert shown["Soft vs hard output (relative distance)"] == f"{expected.gap:.3g}"
    assert shown["Weight on the best-matching key"] == f"{float(expected.soft.max()):.3f}"
    assert float(expected.soft.max()) > 0.85  # scores 0.02 apart, divided by 0.01: nearly the hard lookup


def test_rope_words_the_jain_wallace_numbers_then_a_click_to_each_next_view():
    at = page(learn_pos_view="RoPE by offset", learn_rope_k=3, learn_explain_view="Jain–Wallace check")
    assert not at.exception
    spec = chart_specs(at)[-3]
    assert "“0 the” and “3 on”" in spec["title"]["text"]
    by_row = {}
    for r in rows(spec, "score"):
        by_row.setdefault(r["query"], []).append(r["score"])
    assert len(by_row) == len(further.ABSOLUTE)
    assert all(v == pytest.approx(by_row["key at p = 0"]) for v in by_row.values())
    moved = further.reweight(lesson.walk(SENTENCE, lesson.Setup()))
    shown = {m.label: m.value for m in at.metric}
    assert shown["Weights moved (total variation, mean over words)"] == f"{moved.weight_change:.2f}"
    assert shown["Output moved (relative)"] == f"{moved.output_change:.1%}"
    assert titles(at)[2].startswith("Different weights, nearly the same output")
    at.radio(key="learn_pos_view").set_value("sinusoidal table")  # two clicks, one rerun
    at.radio(key="learn_explain_view").set_value("one word, four answers").run()
    assert titles(at)[0].startswith("Sinusoidal positions")
    assert titles(at)[2] == "Which words made “0 the”? Four answers"
