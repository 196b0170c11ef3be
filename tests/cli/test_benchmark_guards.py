"""The top-k and NSA benchmark scripts at tiny sizes: they judge the speed-up over softmax against the ≥ 4× target,
and skip a contestant the free memory cannot hold with the reason instead of dying. No timing is asserted."""
from __future__ import annotations

import pytest

from attn_core import benchmarks
from attn_core.benchmarks import nsa as nsa_bench
from attn_core.benchmarks import sparse_select
from attn_core.engine import env
from attn_core.spec import Shape

TINY = ["--rounds", "1", "--heads", "2", "--head-dim", "8", "--threads", "1"]


def test_room_is_the_spec_peak_plus_the_inputs_against_the_free_memory_less_the_headroom(monkeypatch):
    shape = Shape(1, 8, 16384, 16384, 64, dtype="float32", causal=False)
    need = shape.input_bytes + 2 * 8 * 16384 ** 2 * 4  # two n × n fp32 matrices of 8 heads, 16 GiB: softmax's peak
    monkeypatch.setattr(env, "free_memory_bytes", lambda device: 24 << 30)  # a 24 GiB machine, all of it free
    assert benchmarks.room("softmax", shape, "cpu") == ""
    monkeypatch.setattr(env, "free_memory_bytes", lambda device: need + benchmarks.HEADROOM - 1)
    why = benchmarks.room("softmax", shape, "cpu")
    assert why.startswith("skipped: its spec's peak at n = 16384, not causal, is 16.") and "lower --compare-n" in why
    monkeypatch.setattr(env, "free_memory_bytes", lambda device: need + benchmarks.HEADROOM + (1 << 20))
    assert benchmarks.room("softmax", shape, "cpu") == ""


def test_sparse_select_judges_topk_over_softmax_causal_and_not(capsys):
    assert sparse_select.main(["--compare-n", "64", "--top-k", "8", *TINY]) == 0
    out = capsys.readouterr().out
    assert "topk against softmax at n = 64, not causal:" in out and "topk against softmax at n = 64, causal:" in out
    verdicts = [line for line in out.splitlines() if "speed-up of topk over softmax:" in line]
    assert len(verdicts) == 2 and all("≥ 4" in v and "the target is set at n = 16384 with top_k = 2048" in v
                                      for v in verdicts)


@pytest.mark.parametrize("script,argv,skipped", [
    (sparse_select, ["--compare-n", "64", "--top-k", "8", "--mask", "full"], "softmax  skipped: no room"),
    (nsa_bench, ["--compare-n", "128"], "softmax: skipped: no room"),
])
def test_a_softmax_the_memory_cannot_hold_is_skipped_with_the_reason(script, argv, skipped, capsys, monkeypatch):
    monkeypatch.setattr(script, "room", lambda key, shape, device, params=None:
                        "skipped: no room" if key == "softmax" else "")
    assert script.main([*argv, *TINY]) == 0
    out = capsys.readouterr().out
    assert skipped in out and "not judged (target ≥ 4×)" in out
    assert "over softmax:" not in out  # no verdict without the baseline it is set against


def test_nsa_judges_its_speed_up_over_softmax_at_the_papers_settings(capsys):
    assert nsa_bench.main(["--compare-n", "128", *TINY]) == 0
    out = capsys.readouterr().out
    assert "nsa: block=32, stride=16, select_block=64, select_blocks=16, window=512" in out
    verdict = next(line for line in out.splitlines() if "speed-up of nsa over softmax:" in line)
    assert "≥ 4" in verdict and "the target is set at n = 16384" in verdict
    assert "n =  16384:  1023 +  1024 +  512 =  2559   paper 2560" in out
