"""`benchmarks.mechanisms --rounds`: each line's sizes measured in turn, round after round (a drift of the machine
falls on every size alike), each size's figure the row of its median round, and a size past the budget skipping
the larger ones of its line from then on. The engine's points are stood in for by rows of set times; no timing is
asserted."""
from __future__ import annotations

import argparse
import math

from attn_core.benchmarks import mechanisms as bench

TIMES = {  # (n, round) → the point's median seconds
    (64, 0): 0.3, (128, 0): 0.9, (64, 1): 0.1, (128, 1): 0.5, (64, 2): 0.2, (128, 2): 0.7}


def args(**changes) -> argparse.Namespace:
    base = dict(n_min=64, n_max=128, heads=2, head_dim=8, repeats=1, min_time=0.0, budget=60.0, threads=1,
                mechanisms="linear", rounds=3)
    return argparse.Namespace(**{**base, **changes})


def stand_in(calls: list, times: dict, took=lambda n: 0.01):
    seen: dict[tuple, int] = {}

    def point(problem, settings):
        line = (problem.mechanism, problem.causal)
        turn = seen.get((line, problem.n), 0)
        seen[(line, problem.n)] = turn + 1
        calls.append((problem.causal, problem.n, turn))
        row = {"mechanism": problem.mechanism, "n": problem.n, "causal": problem.causal, "status": "ok",
               "time_median_s": times[(problem.n, turn)], "peak_bytes": 1024.0, "reason": f"round {turn}"}
        return row, took(problem.n)
    return point


def test_the_sizes_are_measured_in_turn_each_round_and_each_keeps_its_median_round(monkeypatch):
    calls: list = []
    monkeypatch.setattr(bench, "point", stand_in(calls, TIMES))
    monkeypatch.setattr(bench, "frame_from_rows", lambda rows: rows)
    rows = bench.measure(args())
    for causal in (False, True):  # 64, 128, 64, 128, 64, 128: interleaved, not each size's rounds together
        assert [(n, turn) for c, n, turn in calls if c == causal] == [(64, 0), (128, 0), (64, 1), (128, 1),
                                                                      (64, 2), (128, 2)]
    picked = {(r["causal"], r["n"]): r for r in rows}
    assert len(rows) == 4
    assert picked[(False, 64)]["time_median_s"] == 0.2 and picked[(True, 128)]["time_median_s"] == 0.7
    assert picked[(False, 64)]["reason"] == "round 2"  # the median round's own row, its other fields with it


def test_one_round_is_the_single_pass_and_a_size_past_the_budget_skips_the_larger_ones(monkeypatch):
    calls: list = []
    monkeypatch.setattr(bench, "point", stand_in(calls, TIMES, took=lambda n: 100.0 if n == 64 else 0.01))
    monkeypatch.setattr(bench, "frame_from_rows", lambda rows: rows)
    rows = bench.measure(args(rounds=1, mechanisms="linear"))
    assert [(n, turn) for c, n, turn in calls] == [(64, 0), (64, 0)]  # each line: 64 took past the budget; 128 never
    skipped = [r for r in rows if r["n"] == 128]
    assert len(skipped) == 2 and all(r["status"] == "skipped" and "took longer than the 60 s budget" in r["reason"]
                                     for r in skipped)
    assert all(math.isnan(r["time_median_s"]) for r in skipped)
