"""Sinks and StreamingLLM's kept first tokens as problem fields a sweep's series sets (issue 46): the problem's sink
logits reach the mechanism, what cannot take them is refused with a sentence, the memory model stays exact, the
fields survive the results frame, run files and the run store, and the preset "Sinks keep a window stable" runs."""
from __future__ import annotations

import contextlib
import dataclasses
import json
import math
import sqlite3

import pandas as pd
import pytest
import torch

from attn_core.engine import measure, presets, results, store
from attn_core.engine.analysis import row_series_name
from attn_core.engine.config import SweepConfig, plan
from attn_core.engine.measurement import unmeasured
from attn_core.engine.problem import SERIES_FIELDS, Problem, Settings
from attn_core.mechanisms import MEASURED

TINY = Settings(warmup=1, min_repeats=1, min_time_s=0.0, point_budget_s=10.0)
# measure(..., wall_s=0.0): a point past its share of a budget at once, so no test waits for a quiet machine
PRESET = "Sinks keep a window stable"


def sink_reference(q, k, v, sinks, causal: bool) -> torch.Tensor:
    """softmax over the scores and one more column per head holding its sink logit, whose value is zero: float64."""
    q, k, v = (t.double() for t in (q, k, v))
    B, H, n, D = q.shape
    s = q @ k.transpose(-1, -2) / math.sqrt(D)
    if causal:
        s = s.masked_fill(torch.ones(n, k.shape[2], dtype=torch.bool).triu(1), float("-inf"))
    column = sinks.double().view(1, H, 1, 1).expand(B, H, n, 1)
    p = torch.softmax(torch.cat([s, column], -1), -1)
    zero = torch.zeros(B, H, 1, D, dtype=torch.float64)
    return p @ torch.cat([v, zero], -2)


def test_sinks_and_keep_first_are_series_fields():
    assert {"sinks", "keep_first"} <= set(SERIES_FIELDS)
    point = Problem(mode="generate").at("sliding_window", {"window": 8, "keep_first": 4, "sinks": True}, 32)
    assert point.params == (("window", 8),) and point.keep_first == 4 and point.sinks is True


@pytest.mark.parametrize("key, causal", [("sdpa", False), ("softmax", True), ("sliding_window", True)])
def test_the_problem_s_sink_logits_reach_the_measured_call(key, causal):
    problem = Problem(mechanism=key, n=7, heads=2, d_model=8, causal=causal, sinks=True, seed=3,
                      params=(("window", 16),) if key == "sliding_window" else ())
    sinks = problem.sink_logits()
    assert sinks.shape == (2,) and sinks.dtype == torch.float32
    torch.testing.assert_close(sinks, problem.sink_logits(), rtol=0, atol=0)  # drawn from the seed, every time
    assert Problem(sinks=False).sink_logits() is None
    q, k, v = problem.inputs()
    with torch.inference_mode():
        out = measure.call_of(MEASURED[key], problem, q, k, v, state={})()
    torch.testing.assert_close(out.double(), sink_reference(q, k, v, sinks, causal), rtol=1e-5, atol=1e-6)


def test_a_generated_step_reads_the_sinks_too():
    problem = Problem(mechanism="sdpa", n=6, heads=2, d_model=8, mode="generate", sinks=True)
    _, k, v = problem.inputs()
    new = Problem(n=1, heads=2, d_model=8, seed=1).inputs()  # the step's token: seed + 1 (measure.step_call)
    with torch.inference_mode():
        step, _ = measure.step_call(MEASURED["sdpa"], problem, {})
        out = step()
    expected = sink_reference(new[0], torch.cat([k, new[1]], 2), torch.cat([v, new[2]], 2), problem.sink_logits(),
                              causal=False)  # the new token sees every cached key and itself
    torch.testing.assert_close(out.double(), expected, rtol=1e-5, atol=1e-6)


REFUSED = [
    (Problem(mechanism="linear", sinks=True), "Linear (elu+1) cannot take attention sinks",
     "Turn sinks off, or choose a mechanism that takes them: "),
    (Problem(mechanism="softmax", mode="generate", keep_first=4), "Softmax (materialized) cannot keep the first tokens",
     "Set keep_first to 0, or choose Sliding window."),
    (Problem(mechanism="sliding_window", keep_first=4), "keep_first keeps the first tokens in a generation cache",
     "choose the mode generate, or set keep_first to 0"),
    (Problem(mechanism="sliding_window", mode="generate", keep_first=-1), "keep_first must be a whole number",
     "0 or more"),
    (Problem(mechanism="sliding_window", mode="generate", keep_first=2.5), "keep_first must be a whole number",
     "got 2.5"),
    (Problem(mechanism="sdpa", sinks="yes"), "sinks must be true or false", "got 'yes'"),
    (Problem(mechanism="sliding_window", sinks=True, implementation="flex"), "sinks are passed to our own kernels",
     "choose the implementation 'ours'"),
    (Problem(mechanism="sdpa", sinks=True, positions="rope"), "sinks with positions (rope)", "set positions to none"),
]


@pytest.mark.parametrize("problem, starts, says", REFUSED)
def test_what_cannot_take_sinks_or_first_tokens_is_refused_with_a_sentence(problem, starts, says):
    found = problem.problems(MEASURED[problem.mechanism])
    assert any(starts in text and says in text for text in found), found


def test_the_refusal_names_every_mechanism_whose_spec_takes_sinks():
    (text,) = Problem(mechanism="linear", sinks=True).problems(MEASURED["linear"])
    takers = [s.label for s in MEASURED.values() if s.supports.sinks]
    assert len(takers) >= 8 and all(label in text for label in takers)  # softmax … nsa (issue 46)
    config = SweepConfig(mechanisms=(("linear", {"sinks": True}),), ns=(64,))
    assert config.problems() == [text]  # a series' own sinks are checked as its own key/value heads are


def test_the_predicted_peak_with_sinks_is_the_spec_s_and_the_allocator_s():
    problem = Problem(mechanism="sliding_window", params=(("window", 32),), n=512, heads=4, d_model=128,
                      causal=True, sinks=True)
    row = measure.measure(MEASURED["sliding_window"], problem, TINY, wall_s=0.0)[0].to_row()
    spec = MEASURED["sliding_window"]
    assert row["status"] == "ok" and row["sinks"] is True
    assert row["predicted_bytes"] == spec.cost.sinks_memory_bytes(problem.shape, window=32)
    assert row["peak_bytes"] == row["predicted_bytes"]  # a steady call's peak, to the byte
    skipped = unmeasured(MEASURED["sdpa"], Problem(mechanism="sdpa", n=512, sinks=True), "skipped").to_row()
    assert skipped["predicted_bytes"] == MEASURED["sdpa"].cost.sinks_memory_bytes(Problem(n=512).shape)


def test_a_window_of_8_keeping_the_first_4_holds_13_tokens_at_n_32():
    problem = Problem(mechanism="sliding_window", params=(("window", 8),), n=32, heads=2, d_model=32,
                      mode="generate", keep_first=4)
    row = measure.measure(MEASURED["sliding_window"], problem, TINY, wall_s=0.0)[0].to_row()
    # keys and values of 8 + 1 + 4 tokens: 2 tensors × batch 1 × 2 heads × 13 tokens × 16 dims × 4 bytes = 3,328
    assert row["status"] == "ok" and row["keep_first"] == 4
    assert row["peak_bytes"] == row["predicted_bytes"] == 2 * 1 * 2 * 13 * 16 * 4
    plain = measure.measure(MEASURED["sliding_window"], dataclasses.replace(problem, keep_first=0), TINY,
                            wall_s=0.0)[0]
    assert plain.peak_bytes == 2 * 1 * 2 * 9 * 16 * 4  # the window and the new token alone


def _frame() -> pd.DataFrame:
    rows = [unmeasured(MEASURED["sliding_window"], problem, "skipped", "by hand").to_row() for problem in (
        Problem(mechanism="sliding_window", n=64, mode="generate", keep_first=4),
        Problem(mechanism="sliding_window", n=64, mode="generate", sinks=True),
        Problem(mechanism="sliding_window", n=64, mode="generate"))]
    return results.frame_from_rows(rows)


def test_the_fields_survive_run_files_and_the_run_store(tmp_path):
    frame = _frame()
    assert frame["sinks"].tolist() == [False, True, False] and frame["keep_first"].tolist() == [4, 0, 0]
    for save in (results.to_json_bytes, results.to_csv_bytes):
        again = results.load_run(save(results.Run(frame)))
        pd.testing.assert_frame_equal(again.frame, frame)
    with store.Store(tmp_path / "runs.sqlite3") as kept:
        run_id = kept.import_run(results.Run(frame), "by hand")
    with store.Store(tmp_path / "runs.sqlite3", readonly=True) as reader:
        pd.testing.assert_frame_equal(reader.run(run_id).frame, frame)
    names = [row_series_name(r) for _, r in frame.iterrows()]
    assert names == ["Sliding window · keeps first 4", "Sliding window · sinks", "Sliding window"]


def test_a_run_stored_or_saved_before_the_columns_reads_with_sinks_off(tmp_path):
    row = {c: v for c, v in _frame().iloc[2].to_dict().items() if c not in ("sinks", "keep_first")}
    loaded = results.load_run(json.dumps({"format": results.FORMAT, "schema_version": 3, "rows": [row]},
                                         default=lambda x: x.item()).encode())
    assert loaded.frame["sinks"].tolist() == [False] and loaded.frame["keep_first"].tolist() == [0]
    path = tmp_path / "runs.sqlite3"
    with contextlib.closing(sqlite3.connect(path)) as db:  # a store of version 3, before the columns existed
        for migration in store.MIGRATIONS[:3]:
            for statement in migration:
                db.execute(statement)
        db.execute("PRAGMA user_version = 3")
        db.execute("INSERT INTO runs (created, status, env, config, row_schema) VALUES ('2026', 'complete', '{}', "
                   "'{}', 3)")
        db.execute(f"INSERT INTO points (run_id, seq, {', '.join(row)}) VALUES (1, 1, {', '.join('?' * len(row))})",
                   [store._cell(v) for v in row.values()])
        db.commit()
    with store.Store(path, readonly=True) as reader:
        assert reader.run(1).frame["sinks"].tolist() == [False]
    with store.Store(path) as writer:  # migrated on writing
        assert writer.run(1).frame[["sinks", "keep_first"]].values.tolist() == [[False, 0]]


def test_a_frame_rebuilds_the_config_with_each_series_fields():
    config, left = presets.config_of(_frame())
    window = {"window": 256}  # the spec's default, as the rows hold it
    assert left == [] and config.mechanisms == (("sliding_window", {**window, "keep_first": 4}),
                                                ("sliding_window", {**window, "sinks": True}),
                                                ("sliding_window", window))
    assert SweepConfig.from_dict(json.loads(json.dumps(config.to_dict()))) == config


def test_the_preset_names_its_four_caches_and_validates():
    (config,) = presets.PRESETS[PRESET].for_device("cpu")
    assert presets.PRESETS[PRESET].metric == "peak_bytes" and config.problem.mode == "generate"
    assert config.ns == (1024, 2048, 4096, 8192, 16384, 32768) and config.problems() == []
    assert config.mechanisms == (("sdpa", {}), ("sliding_window", {"window": 256}),
                                 ("sliding_window", {"window": 256, "keep_first": 4}),
                                 ("sliding_window", {"window": 128, "sinks": True}))


def test_the_preset_runs_when_made_tiny_and_its_caches_are_what_it_says():
    (config,) = presets.PRESETS[PRESET].configs
    tiny = config.replaced(ns=(300, 600), d_model=32, heads=2)
    rows = [measure.measure(MEASURED[p.mechanism], p, TINY, wall_s=0.0)[0].to_row() for p in plan(tiny)]
    assert all(r["status"] == "ok" for r in rows), [r["reason"] for r in rows]
    token = 2 * 2 * 16 * 4  # keys and values of one token: 2 × 2 heads × 16 dims × 4 bytes
    held = {(r["mechanism"], json.loads(r["params"]).get("window"), r["keep_first"], r["sinks"], r["n"]):
            r["peak_bytes"] / token for r in rows}
    assert held[("sdpa", None, 0, False, 600)] == 600  # the full cache grows with n
    for n in (300, 600):  # the windows stay flat: 257, 257 + 4 and 129 tokens (the sink is no token)
        assert held[("sliding_window", 256, 0, False, n)] == 257
        assert held[("sliding_window", 256, 4, False, n)] == 261
        assert held[("sliding_window", 128, 0, True, n)] == 129


def test_resuming_tells_a_series_keeping_first_tokens_from_the_same_window_without(tmp_path):
    config = SweepConfig(mechanisms=(("sliding_window", {"window": 8}), ("sliding_window", {"window": 8,
                                                                                            "keep_first": 4})),
                         ns=(16, 32), problem=Problem(heads=2, d_model=16, mode="generate", device="cpu"))
    measured = [unmeasured(MEASURED["sliding_window"], p, "skipped", "by hand").to_row() for p in plan(config)
                if not p.keep_first]  # the plain window's points alone were measured before the interruption
    with store.Store(tmp_path / "runs.sqlite3") as kept:
        run_id = kept.begin({}, config.to_dict())
        kept.add_points(run_id, measured)
        kept.finish(run_id, "interrupted")
        resumed = store.resume_plan(kept, run_id)
    assert resumed.missing == 2
    assert [(s.mechanisms, s.ns) for s in resumed.sweeps] == [((("sliding_window", {"window": 8, "keep_first": 4}),),
                                                               (16, 32))]


def test_the_command_line_sets_a_series_sinks_and_first_tokens(tmp_path):
    import io

    from attn_core import cli
    path = tmp_path / "run.json"
    args = ["sweep", "--mechanisms", "sliding_window:window=8:keep_first=4,sliding_window:window=8:sinks=1",
            "--n", "32", "--mode", "generate", "--d-model", "32", "--heads", "2", "--device", "cpu",
            "--min-repeats", "1", "--min-time", "0", "--out", str(path), "--no-store", "--quiet"]
    out, err = io.StringIO(), io.StringIO()
    assert cli.main(args, out, err) == 0, err.getvalue()
    frame = results.load_run(path).frame
    assert frame[["keep_first", "sinks"]].values.tolist() == [[4, False], [0, True]]
    assert frame["peak_bytes"].tolist() == [2 * 2 * 13 * 16 * 4, 2 * 2 * 9 * 16 * 4]  # 8 + 1 + 4 tokens; 8 + 1


def test_a_series_own_sinks_are_refused_beside_positions_before_anything_runs():
    config = SweepConfig(mechanisms=(("sdpa", {"sinks": True}),), ns=(64,), problem=Problem(positions="rope"))
    assert any("sinks with positions (rope)" in text for text in config.problems())
