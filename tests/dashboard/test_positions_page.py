"""Positions on the Benchmark and Theory pages: the form's control reaches the sweep and its rows, refuses what a
mechanism cannot take, travels in the link; the Theory page draws what they add."""
from __future__ import annotations

from streamlit.testing.v1 import AppTest

from tests.dashboard.test_app import APP, TINY, benchmark, routed, run_to_end, widget  # noqa: F401 (routed: the router)


def test_a_link_sets_the_positions_and_an_unknown_one_is_ignored_with_a_sentence():
    at = AppTest.from_file(APP, default_timeout=60)
    at.switch_page("pages/benchmark.py")
    at.query_params["bench_positions"] = "ALiBi"
    assert widget(at.run(), "bench_positions").value == "alibi"
    at = AppTest.from_file(APP, default_timeout=60)
    at.switch_page("pages/benchmark.py")
    at.query_params["bench_positions"] = "sinusoidal"
    at.run()
    assert widget(at, "bench_positions").value == "none" and not at.exception


def test_rope_from_the_form_reaches_every_measured_row():
    at = benchmark(**TINY, bench_positions="rope")
    assert any("Linear (elu+1) runs on RoPE-turned q and k" in c.value for c in at.caption)
    widget(at, "bench_approx").set_value([])  # softmax alone: one quick series
    at.run().button(key="bench_run").click().run()
    frame = run_to_end(at, deadline_s=600).session_state["bench"].job.frame()  # a busy machine: minutes
    assert set(frame["positions"]) == {"rope"} and set(frame["status"]) == {"ok"}, list(frame["reason"])
    assert any(c.value.startswith("Positions: RoPE. RoPE: the cos and sin tables are built once outside the timed")
               for c in at.caption)  # How this was measured
    assert not at.exception


def test_alibi_on_a_mechanism_without_a_score_bias_says_so_and_disables_run():
    at = benchmark(**TINY, bench_positions="alibi")
    assert any("Linear (elu+1) takes no additive score bias" in w.value for w in at.warning)
    assert at.button(key="bench_run").disabled
    widget(at, "bench_approx").set_value([])
    at.run()
    assert not at.button(key="bench_run").disabled


def test_the_theory_page_adds_alibi_where_it_can_and_says_where_not():
    at = AppTest.from_file(APP, default_timeout=60).run()
    at.switch_page("pages/theory.py").run()
    widget(at, "th_mechanisms").set_value(["softmax", "sdpa", "linear"])
    at.run()
    widget(at, "th_positions").set_value("alibi")
    at.run()
    assert not at.exception
    assert any(w.value.startswith("Not drawn with ALiBi: Linear (elu+1).") for w in at.warning)
    widget(at, "th_positions").set_value("rope")
    at.run()
    assert not at.exception and any("loses RoPE's relative property" in c.value for c in at.caption)
