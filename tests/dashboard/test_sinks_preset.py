"""The Benchmark page's preset "Sinks keep a window stable" (issue 46) through streamlit's AppTest: one click sets
generate mode and starts the sweep whose series carry their own sinks and kept first tokens."""
from attn_core.engine import presets
# the fixtures apply here too: a private sweep lock, a fresh stage, routed pages
from tests.dashboard.test_app import (benchmark, fresh_stage, private_sweep_lock, routed, run_to_end,  # noqa: F401
                                      widget)


def test_the_sinks_preset_sets_generate_mode_and_runs_its_own_series_in_one_click():
    at = benchmark()
    at.button(key="bench_preset_sinks_keep_a_window_stable").click().run()
    assert widget(at, "bench_mode").value == "generate"
    assert widget(at, "bench_exact").value == ["sdpa", "sliding_window"]
    job = at.session_state["bench"].job
    (config,) = presets.PRESETS["Sinks keep a window stable"].for_device("cpu")
    assert [s.mechanisms for s in job.sweeps] == [config.mechanisms]  # the series' own fields reach the sweep
    at.button(key="bench_stop").click().run()
    run_to_end(at)
    frame = job.frame()
    assert set(frame["mode"]) <= {"generate"} and not at.exception
    wanted = {(key, params.get("keep_first", 0), params.get("sinks", False)) for key, params in config.mechanisms}
    assert {(r["mechanism"], r["keep_first"], r["sinks"]) for _, r in frame.iterrows()} <= wanted
