"""The roofline's own check: the MLP of a model's shape read from its config (by hand from the published sizes), the
stack scaled down with it, the roofline's seconds for the stack on a device worked out by hand, and a tiny stack run
for real end to end (figures finite and positive; no timing asserted), bad arguments refused with a sentence."""
from __future__ import annotations

import io
import json

import pytest

from attn_core import cli
from attn_core.studies.planner import roofline_check as rc
from attn_core.studies.planner.builtin import CONFIG
from attn_core.studies.planner.devices import Device
from attn_core.studies.planner.model import Layer, Model, find
from tests.hf_configs import DEEPSEEK_V3, LLAMA3_8B

TINY = Model(name="tiny", max_context=4096, dtype="float32",
             layers=(Layer(name="full", mechanism="sdpa", count=2, heads=2, kv_heads=1, head_dim=16),))
DEVICE = Device(name="fake", bandwidth_bytes_per_s=1e10, flops_per_s=1e11, memory_bytes=1 << 34, source="by hand")


@pytest.mark.parametrize("name, config, hidden, width, gated, count", [
    ("llama-3-8b", LLAMA3_8B, 4096, 14336, True, 32),  # dense SwiGLU in every layer
    ("gpt-oss-20b", CONFIG["gpt-oss-20b"], 2880, 4 * 2880, True, 24),  # 4 experts of 2880 a token
    # 3 dense layers of 18,432 and 58 MoE layers of 8 experts of 2048 and one shared: 18,432 a token either way
    ("deepseek-v3", DEEPSEEK_V3, 7168, 18432, True, 61),
    ("nemotron-h-8b", CONFIG["nemotron-h-8b"], 4096, 21504, False, 24),  # squared ReLU in the 24 '-' layers
    ("qwen3-next-80b-a3b", None, 2048, 10 * 512 + 512, True, 48),  # written by hand: its sizes beside it
    ("tiny", None, 32, round(3.5 * 32), True, 2),  # neither: Llama 3 8B's ratio, 3.5 × heads · head_dim
])
def test_the_mlp_is_the_one_a_token_runs_through(name, config, hidden, width, gated, count):
    mlp = rc.mlp_shape(TINY if name == "tiny" else find(name), config)
    assert (mlp.hidden, mlp.width, mlp.gated, mlp.count) == (hidden, width, gated, count)
    assert mlp.params == (3 if gated else 2) * hidden * width


def test_the_stack_narrows_the_mlp_by_the_heads_factor():
    stack, mlp = rc.scaled_stack(find("llama-3-8b"), rc.mlp_shape(find("llama-3-8b"), LLAMA3_8B))
    # 32 heads over 8 become 4 over 1 (a factor of 8): hidden 4096 / 8 = 512, width 14,336 / 8 = 1792; 8 layers
    assert [(k.heads, k.kv_heads, k.count) for k in stack.layers] == [(4, 1, 8)]
    assert (mlp.hidden, mlp.width, mlp.count) == (512, 1792, 8) and stack.dtype == "float32"


def test_the_roofline_of_the_stack_by_hand():
    mlp = rc.MlpShape(hidden=32, width=64, gated=True, count=2, source="by hand")
    weights = 2 * 3 * 32 * 64  # 2 MLPs of gate, up and down: 12,288 parameters, float32
    cache = 2 * 2 * 1 * 16 * 1024 * 4  # K and V · 2 layers · 1 key/value head · 16 · 1024 tokens · 4 bytes
    step = 2 * 4 * 2 * 1024 * 16  # q·k and p·v, 4·L·d a query head: 2 heads, 2 layers
    seconds, bound = rc.predicted(TINY, mlp, DEVICE, "decode", 1024)
    assert bound.startswith("memory") and seconds == pytest.approx((weights * 4 + cache) / 1e10)
    assert (2 * weights + step) / 1e11 < seconds
    # prefill of 1024: 2 FLOPs a weight a token, and causal attention 4 · H · d · n(n + 1)/2 a layer
    flops = 2 * weights * 1024 + 2 * 4 * 2 * 16 * 1024 * 1025 / 2
    seconds, bound = rc.predicted(TINY, mlp, DEVICE, "prefill", 1024)
    assert bound.startswith("compute") and seconds == pytest.approx(flops / 1e11)


def test_a_tiny_stack_runs_here_and_gives_finite_ratios(monkeypatch):
    monkeypatch.setattr(rc, "this_machine", lambda *a, **k: DEVICE)  # the data-sheet figures above, not measured
    got = rc.check_roofline(TINY, prefill_n=64, decode_n=128, budget_s=1, repeats=1)
    assert got.prefill_n == 64 and got.decode_n == 128 and got.mlp.count == 2
    for ratio, measured in ((got.prefill_ratio, got.prefill_measured_s), (got.decode_ratio, got.decode_measured_s)):
        assert 0 < ratio < float("inf") and measured > 0
    data = got.as_dict()
    assert data["decode_predicted_over_measured"] == pytest.approx(got.decode_predicted_s / got.decode_measured_s)
    assert "projections and the norms left out" in data["notes"][0]


def test_the_cli_prints_the_check_and_its_json(monkeypatch, tmp_path):
    monkeypatch.setattr(rc, "this_machine", lambda *a, **k: DEVICE)
    path = tmp_path / "tiny.json"
    path.write_text(TINY.to_json())
    out, err = io.StringIO(), io.StringIO()
    assert cli.main(["plan", str(path), "--context", "64", "--check", "--budget", "0.5", "--json"], out, err) == 0
    assert json.loads(out.getvalue())["roofline_check"]["decode_predicted_over_measured"] > 0


@pytest.mark.parametrize("kwargs, words", [
    ({"budget_s": 0}, "budget_s must be a number of seconds above 0"),
    ({"budget_s": True}, "budget_s must be"),
    ({"repeats": 0}, "repeats must be a whole number"),
])
def test_bad_arguments_are_refused_with_a_sentence(kwargs, words):
    with pytest.raises(ValueError, match=words):
        rc.check_roofline(TINY, **kwargs)
