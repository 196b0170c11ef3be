"""The Benchmark page's runs through streamlit's AppTest: saved runs replayed or shown, sequences, busy and full
runs, a second session queued behind a running sweep, parameters refused, generate mode and its presets, MLA, and
Flex's one-time costs."""
import io
import json
import time

import pytest
from streamlit.testing.v1 import AppTest

from attn_core import cli
from attn_core.engine import presets, results, server
from attn_core.engine.job import Job
from tests.apptest_helpers import chart_specs, displayed
# the fixtures apply here too: a private sweep lock, a fresh stage, routed pages, and a swept run of this module's own
from tests.dashboard.test_app import (APP, TINY, benchmark, fresh_stage, private_sweep_lock, routed, run_to_end,  # noqa: F401
                            RERUN_S, swept, warnings, widget)


def replaying(swept: AppTest, speed: float) -> AppTest:
    """A fresh Benchmark page replaying the swept run at `speed` points per second."""
    saved = results.to_json_bytes(swept.session_state["bench"].job.result())
    at = benchmark()
    at.file_uploader(key="bench_upload").upload("run.json", saved, "application/json")
    at.run()
    at.slider(key="bench_speed").set_value(speed).run()
    return at.button(key="bench_replay").click().run()


def test_a_saved_run_replays_point_by_point(swept, monkeypatch):
    """The replay's pace read from a clock the test moves (a real one let a slow rerun, 5 s on a busy machine, take
    all four points at once): a point a step of 1/speed, each drawn by the next rerun."""
    now = [0.0]
    monkeypatch.setattr(server, "replay", lambda run, points_per_s, *, at_once: Job.replay(
        run, points_per_s, shown=at_once, clock=lambda: now[0]))
    at = replaying(swept, 2.0)
    job = at.session_state["bench"].job
    assert job.replaying and job.progress.done == 1 and not job.done
    for due in (2, 3, 4):
        now[0] += 0.5  # 1 / (2 points a second)
        at.run()
        assert job.progress.done == due and len(job.frame()) == due
    assert job.done and len(chart_specs(at)) == 2 and not at.exception


def test_a_run_saved_by_the_command_line_is_shown_at_once(tmp_path):
    path = tmp_path / "cli-run.csv"
    args = ["sweep", "--mechanisms", "softmax,linear", "--n", "64:128:2", "--d-model", "64", "--heads", "2",
            "--device", "cpu", "--out", str(path), "--quiet"]
    assert cli.main(args, out=io.StringIO(), err=io.StringIO()) == 0
    at = benchmark()
    at.file_uploader(key="bench_upload").upload(path.name, path.read_bytes(), "text/csv")
    at.run()
    at.button(key="bench_show").click().run()
    assert at.session_state["bench"].job.replaying and at.session_state["bench"].job.done
    assert len(chart_specs(at)) == 2 and list(at.dataframe[0].value["points measured"]) == [2, 2]
    for spec in chart_specs(at):  # a reason for a point not measured never reaches an axis title
        assert not any("not measured" in t for layer in spec["layer"] for t in
                       layer.get("encoding", {}).get("y", {}).get("title", []))
    assert not at.exception


def test_a_file_that_is_not_a_run_is_refused_with_a_sentence():
    at = benchmark()
    at.file_uploader(key="bench_upload").upload("notes.json", b'{"hello": 1}', "application/json")
    at.run()
    at.button(key="bench_show").click().run()
    assert any("not an Attention Lab run" in e.value for e in at.error)
    assert at.session_state["bench"].job is None and not at.exception


def test_talk_mode_folds_the_settings_away_and_enlarges_the_charts(swept):
    swept.sidebar.toggle(key="talk").set_value(True).run()
    settings = next(e for e in swept.expander if e.label.startswith("Settings"))
    assert "folded away" in settings.label and not settings.proto.expanded
    spec = chart_specs(swept)[0]
    assert spec["config"]["axis"]["labelFontSize"] > 12
    assert any("font-size" in h.proto.body for h in swept.get("html"))
    swept.sidebar.toggle(key="talk").set_value(False).run()


def test_a_sequence_runs_its_sweeps_one_after_another_as_one_run():
    tiny = presets._config(("softmax", "linear"), 64, 128, 2, d_model=64, heads=2)
    both = Job.measure("both masks", tuple(tiny.replaced(device="cpu", causal=c) for c in (False, True)))
    end = time.monotonic() + 120
    while not both.done:
        assert time.monotonic() < end, "the sweeps did not finish"
        both.poll()
        time.sleep(0.05)
    assert both.progress.done == both.progress.total == 8
    frame = both.frame()
    assert list(frame["causal"]) == [False] * 4 + [True] * 4 and (frame["status"] == "ok").all()
    assert [c["causal"] for c in both.result().config["sweeps"]] == [False, True]


def test_replay_reveals_points_at_its_pace_and_stops_on_cancel():
    saved = results.Run(results.frame_from_rows([]), {"torch": "x"}, {})
    rows = [dict(mechanism="softmax", label="Softmax", exact=True, params="{}", n=n, batch=1, heads=1, d_model=8,
                 head_dim=8, dtype="float32", device="cpu", mode="forward", causal=False, status="ok", reason="",
                 time_median_s=1e-3, time_iqr_s=0.0, time_samples=[1e-3], repeats=1, peak_bytes=1.0,
                 memory_method="m", predicted_bytes=1.0, theory_flops=1.0, executed_flops=1.0, gflops=1.0,
                 device_gflops=1.0, pct_of_device=1.0, sdpa_backend="", threads=1, foreign_cpu=0.0,
                 load_average=0.0, disturbed=False, retaken=0) for n in (8, 16, 32, 64)]
    saved.frame = results.frame_from_rows(rows)
    now = [0.0]
    replay = Job.replay(saved, points_per_s=2.0, clock=lambda: now[0])
    assert [m.problem.n for m in replay.poll()] == [8]
    now[0] = 1.0
    assert [m.problem.n for m in replay.poll()] == [16, 32] and not replay.done
    p = replay.progress
    assert (p.done, p.total, p.eta_s, p.current) == (3, 4, 0.5, "replaying Softmax at n = 32")
    replay.cancel()
    now[0] = 9.0
    assert replay.poll() == [] and replay.done and len(replay.frame()) == 3


def test_a_busy_run_says_so_and_sdpa_as_baseline_says_it_was_not_measured():
    from tests.charts.test_charts import results_frame
    frame = results_frame(ns=(64, 128, 256, 512), skip_last=False)
    frame.loc[frame["n"] == 512, ["disturbed", "foreign_cpu", "retaken"]] = [True, 0.9, 3]
    saved = results.to_json_bytes(results.Run(frame, {"torch": "x"}, {}))
    at = benchmark()
    at.file_uploader(key="bench_upload").upload("busy.json", saved, "application/json")
    at.run()
    at.button(key="bench_show").click().run()
    assert warnings(at) == []  # said in plain words behind "How this was measured", not above the chart
    (how,) = [e for e in at.expander if e.label.startswith("How this was measured (the computer was busy")]
    assert any(c.value.startswith("The computer was busy with other programs while 2 of 8 points were timed (they "
                                  "used about 0.9 processor cores)") for c in how.caption)
    at.pills(key="bench_curves").set_value(["spec", "roofline"]).run()
    time_spec = chart_specs(at)[0]
    assert {r["kind"] for rows in time_spec["datasets"].values() for r in rows if "kind" in r} >= {"roofline"}
    at.segmented_control(key="bench_baseline").set_value("sdpa").run()
    assert any(i.value.startswith("No crossover against Softmax (fused SDPA): this sweep did not measure it")
               for i in at.info)
    assert not at.exception


def test_a_full_run_during_a_sweep_holds_the_worker_and_lets_go_at_its_end(monkeypatch):
    """No timed sample may compete with the page drawing: each full run while a sweep measures holds the worker
    first and releases it last (worker.hold, which measure.take_turn obeys)."""
    from attn_core.engine import worker

    at = benchmark(**{**TINY, "bench_steps": 3, "bench_n": (64, 256)})
    calls = []
    monkeypatch.setattr(worker, "hold", calls.append)
    at.button(key="bench_run").click().run()
    if at.session_state["bench"].job.done:
        pytest.skip("the sweep ended within one script run")
    assert calls == [True, False]  # held from the start of the run to its end (the tick inside it lets go of nothing)
    calls.clear()
    run_to_end(at)
    assert not at.exception


def drawn_points(at: AppTest) -> int:
    """Points on the first chart (filled, hollow and crosses)."""
    datasets = chart_specs(at)[0]["datasets"] if chart_specs(at) else {}
    return sum(len(datasets.get(name, [])) for name in ("points", "disturbed", "missing"))


def test_a_shown_run_sets_the_settings_panel_to_it_and_says_so(tmp_path):
    path = tmp_path / "cli-run.json"
    args = ["sweep", "--mechanisms", "sdpa,performer:features=16", "--n", "32:128:3", "--d-model", "32", "--heads",
            "2", "--batch", "3", "--causal", "--device", "cpu", "--out", str(path), "--quiet"]
    assert cli.main(args, out=io.StringIO(), err=io.StringIO()) == 0
    at = benchmark()
    at.file_uploader(key="bench_upload").upload(path.name, path.read_bytes(), "application/json")
    at.run()
    at.button(key="bench_show").click().run()
    assert not at.exception
    assert widget(at, "bench_exact").value == ["sdpa"] and widget(at, "bench_approx").value == ["performer"]
    assert widget(at, "bench_n").value == (32, 128) and widget(at, "bench_steps").value == 3
    assert (widget(at, "bench_d_model").value, widget(at, "bench_heads").value, widget(at, "bench_batch").value) == \
        (32, 2, 3)
    assert widget(at, "bench_causal").value is True and widget(at, "bench_p_performer_features").value == 16
    said = [i.value for i in at.info if "Showing the saved run" in i.value]
    assert len(said) == 1 and "cli\\-run\\.json" in said[0] and "Run measures them again" in said[0]
    assert "cannot hold" not in said[0]


def test_a_replay_counts_only_the_points_its_charts_show(swept):
    # the slowest pace (8 s for the four points): at 2 points a second a page run on a busy machine took the whole
    # replay, and the test saw one count
    at = replaying(swept, 0.5)
    job, seen = at.session_state["bench"].job, []
    while not job.done:
        counted = int(next(p for p in at.get("progress")).proto.text.split(" of ")[0])
        seen.append((counted, drawn_points(at)))
        time.sleep(0.2)
        at.run()
    assert all(counted == drawn for counted, drawn in seen) and len({c for c, _ in seen}) > 1


def test_a_second_session_finds_the_running_sweep_and_its_own_run_queues_behind_it():
    first = benchmark(**{**TINY, "bench_steps": 4})
    first.button(key="bench_run").click().run()
    second = AppTest.from_file(APP, default_timeout=60).run()  # a reload or another tab
    second.switch_page("pages/benchmark.py").run()
    shared = second.session_state["bench"].job
    assert shared is first.session_state["bench"].job
    assert any("started before this page opened" in i.value for i in second.info)
    assert widget(second, "bench_steps").value == 4 and widget(second, "bench_d_model").value == 64
    assert not second.button(key="bench_stop").disabled and not second.button(key="bench_run").disabled
    second.button(key="bench_run").click().run()
    queued = second.session_state["bench"].job
    assert second.session_state["bench"].own and queued is not shared
    if not first.session_state["bench"].job.done:  # the tiny sweep may have ended already
        assert queued.queued and "queued, next after" in queued.progress.current
    end = time.monotonic() + 240  # both tabs rerun, as their timers do: a tab that stops asking is a tab closed
    while not (shared.done and queued.done):  # (the stage withdraws a queued job nobody watches)
        assert time.monotonic() < end, "the sweeps did not finish"
        (shared if not shared.done else queued).wait(RERUN_S)
        first.run()
        second.run()
    assert not queued.queued and len(queued.frame()) > 0 and not second.exception


def test_a_runs_parameter_its_mechanism_does_not_take_is_refused_with_a_sentence():
    """A window of 0 from a file: load_run refuses it (the row, the parameter and what is allowed), and the page
    says so instead of showing the run; a window out of range once reached the panel, and text there a traceback."""
    from tests.charts.test_charts import results_frame

    frame = results_frame().assign(mechanism="sliding_window", label="Sliding window",
                                   params=json.dumps({"window": 0}))
    at = benchmark()
    at.file_uploader(key="bench_upload").upload("w0.json", results.to_json_bytes(results.Run(frame)),
                                                "application/json")
    at.run()
    at.button(key="bench_show").click().run()
    assert not at.exception
    said = [e.value for e in at.error]  # escaped by untrusted.literal: punctuation carries a backslash
    assert any("row 1" in e and "is not allowed" in e and "choose an integer between 1 and 1048576" in e
               for e in said), said
    assert at.session_state["bench"].job is None


def test_a_generate_sweep_draws_time_per_token_and_cache_memory_and_refuses_what_cannot_generate():
    at = benchmark(**{**TINY, "bench_mode": "generate"})
    assert widget(at, "bench_causal").disabled  # generating is causal whatever the toggle says
    assert widget(at, "bench_n").label == "Context lengths n"
    assert warnings(at) == []
    widget(at, "bench_approx").set_value(["linear", "linformer"])
    at.run()
    assert any(w.startswith("Linformer cannot generate token by token.") for w in warnings(at))
    assert at.button(key="bench_run").disabled
    widget(at, "bench_approx").set_value(["linear"])
    at.run()
    at.button(key="bench_run").click().run()
    run_to_end(at)
    specs = chart_specs(at)
    assert [s["title"]["text"] for s in specs] == ["Time per generated token vs context length",
                                                   "Cache memory vs context length"]
    frame = at.session_state["bench"].job.frame()
    assert set(frame["mode"]) == {"generate"} and set(frame["status"]) == {"ok"}
    assert any(c.value.startswith("Generating: each point times one new token's step") for c in at.caption)
    assert (frame["peak_bytes"] == frame["predicted_bytes"]).all() and not at.exception


def test_the_kv_cache_preset_sets_generate_mode_in_one_click():
    at = benchmark()
    at.button(key="bench_preset_why_the_kv_cache_hurts").click().run()
    assert widget(at, "bench_mode").value == "generate"
    assert widget(at, "bench_exact").value == ["softmax", "sdpa", "sliding_window"]
    assert any("key-value cache" in m.value for m in at.markdown)
    at.button(key="bench_stop").click().run()
    run_to_end(at)
    assert not at.exception


def test_mla_is_offered_measured_generating_and_refused_with_shared_heads():
    at = benchmark(**{**TINY, "bench_exact": ["mla", "mla_naive"], "bench_approx": [], "bench_mode": "generate"})
    assert warnings(at) == []
    widget(at, "bench_kv_heads").set_value(1)
    at.run()
    assert any(w.startswith("MLA absorbed cannot share key/value heads between query heads. Its heads already share "
                            "one cached latent per token") for w in warnings(at))
    assert at.button(key="bench_run").disabled
    widget(at, "bench_kv_heads").set_value(0)  # one per query head again
    at.run()
    at.button(key="bench_run").click().run()
    run_to_end(at)
    frame = at.session_state["bench"].job.frame()
    assert set(frame["mechanism"]) == {"mla", "mla_naive"} and set(frame["status"]) == {"ok"}
    latent = frame[frame["mechanism"] == "mla"]
    assert (latent["peak_bytes"] == latent["n"] * (512 + 64) * 4).all()  # the latent cache, exact
    assert not at.exception


def test_the_one_cache_four_sizes_preset_sets_four_caches_in_one_click():
    at = benchmark()
    at.button(key="bench_preset_one_cache,_four_sizes").click().run()
    assert widget(at, "bench_mode").value == "generate"
    assert widget(at, "bench_exact").value == ["sdpa", "mla", "mla_naive"]
    at.button(key="bench_stop").click().run()
    run_to_end(at)
    assert not at.exception


def test_a_run_with_flex_points_shows_its_one_time_costs_when_compiling_pays_off_and_that_flex_is_faster():
    from tests.charts.test_payoff import frame
    at = benchmark()
    at.file_uploader(key="bench_upload").upload("flex.json", results.to_json_bytes(results.Run(frame())),
                                                "application/json")
    at.run()
    at.button(key="bench_show").click().run()
    assert not at.exception
    assert any("Compiled FlexAttention is faster per call than our kernel here: Sliding window at n = 4,096"
               in displayed(i.value) for i in at.info)
    once = next(d.value for d in at.dataframe if "compile (s, once, not in the time)" in d.value)
    assert once["compile (s, once, not in the time)"].dropna().tolist() == [10.0, 12.0]
    assert at.selectbox(key="bench_payoff_n").value == 4096
    assert any("compiled Flex: pays off after k ≈ 3,100 calls" in displayed(c.value) for c in at.caption)
    at.selectbox(key="bench_payoff_n").set_value(1024).run()
    assert not any("pays off after" in displayed(c.value) for c in at.caption)
    assert any("never pays off" in displayed(c.value) for c in at.caption) and not at.exception
