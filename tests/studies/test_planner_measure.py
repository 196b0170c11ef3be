"""The measured planner: the fit and the prediction's arithmetic against figures computed here by hand from fake
timings (no clock read), how a kind is scaled down and a stack is made of the kinds, a tiny real measurement and
stack check end to end (figures finite, no timing asserted), and bad inputs refused with a sentence."""
from __future__ import annotations

import dataclasses
import io
import json
import math

import pytest

from attn_core import cli
from attn_core.studies.planner import model as planner
from attn_core.studies.planner import measure as pm
from attn_core.studies.planner.model import Layer, Model

SOFTMAX = Layer(name="softmax", mechanism="softmax", count=10, heads=8, head_dim=64)
TINY = Model(name="tiny", max_context=4096, dtype="float32",
             layers=(Layer(name="full", mechanism="sdpa", count=2, heads=2, kv_heads=1, head_dim=16),
                     Layer(name="delta", mechanism="gated_deltanet", count=2, heads=2, head_dim=16)))


def point(mode: str, n: int, flops: float, seconds: float) -> pm.Point:
    return pm.Point(mode, n, flops, seconds)


# -- the fit --

def test_two_points_give_the_line_through_them():
    line = pm.fit([point("prefill", 1, 1e9, 0.011), point("prefill", 2, 3e9, 0.031)])
    assert line.how == "line"
    assert line.s_per_flop == pytest.approx(1e-11) and line.overhead_s == pytest.approx(0.001)
    assert line.at(5e9) == pytest.approx(0.051)


def test_a_negative_overhead_or_one_flop_count_falls_back_to_proportional():
    # t = −0.01 + 2e-11·F would give a negative time at small F: through the origin instead, b = ΣF·t / ΣF²
    pts = [point("prefill", 1, 1e9, 0.01), point("prefill", 2, 2e9, 0.03)]
    line = pm.fit(pts)
    assert line.how == "proportional" and line.overhead_s == 0
    assert line.s_per_flop == pytest.approx((1e9 * 0.01 + 2e9 * 0.03) / (1e18 + 4e18))
    flat = pm.fit([point("decode", 4096, 1e6, 0.002), point("decode", 8192, 1e6, 0.004)])  # a fixed-size state
    assert flat.how == "proportional" and flat.at(1e6) == pytest.approx(0.003)
    assert pm.fit([point("decode", 1, 4e6, 0.008)]).at(1e6) == pytest.approx(0.002)
    with pytest.raises(ValueError, match="at least one measured point"):
        pm.fit([])


def test_a_kind_is_fitted_through_its_longest_points():
    timed = pm.KindTiming(SOFTMAX, SOFTMAX, prefill=(point("prefill", 256, 1e9, 0.005),
                                                     point("prefill", 512, 2e9, 0.020),
                                                     point("prefill", 1024, 4e9, 0.040)))
    assert timed.fit("prefill").at(3e9) == pytest.approx(0.030)  # the 256 point (cache-fast) is left out
    assert timed.fit("decode") is None


# -- the prediction, from fake timings --

def fake_timings(model: Model, measured: Layer, a: float, b: float, *, decode_a: float, decode_b: float) -> pm.Timings:
    """Points exactly on t = a + b·F (prefill) and t = decode_a + decode_b·F (decode), F by hand for softmax:
    a causal prefill of n executes 4·H·n²·D (every score, the mask applied after), a step 4·H·n·D (2 per cached
    number of K and V)."""
    H, D = measured.heads, measured.head_dim
    prefill = tuple(point("prefill", n, 4 * H * n * n * D, a + b * 4 * H * n * n * D) for n in (512, 1024))
    decode = tuple(point("decode", n, 4 * H * n * D, decode_a + decode_b * 4 * H * n * D) for n in (4096, 8192))
    kinds = tuple(pm.KindTiming(layer, measured, prefill, decode) for layer in model.layers)
    return pm.Timings(model, "cpu", "float32", kinds)


def test_the_whole_model_is_each_kind_s_line_at_the_full_layer_times_its_count():
    model = Model(name="fake", layers=(SOFTMAX,), dtype="float32", max_context=1 << 20)
    small = Layer(name="softmax", mechanism="softmax", count=10, heads=2, head_dim=64)
    timings = fake_timings(model, small, 0.002, 1e-10, decode_a=1e-4, decode_b=5e-10)
    made = planner.plan(model, 16384, batch=2)
    got = pm.predict(made, timings)
    prefill_layer = 0.002 + 1e-10 * (4 * 2 * 8 * 16384 * 16384 * 64)  # batch 2, 8 heads, all of them
    decode_layer = 1e-4 + 5e-10 * (4 * 2 * 8 * 16384 * 64)
    assert got.prefill_s == pytest.approx(10 * prefill_layer)
    assert got.decode_s == pytest.approx(10 * decode_layer)
    assert got.tokens_per_s == pytest.approx(2 / (10 * decode_layer))  # a step makes a token for each sequence
    kind = got.kinds[0]
    assert "measured at 4,096–8,192 tokens on 2 of 8 heads" in kind.decode_method
    assert "extrapolated along the spec's FLOPs" in kind.prefill_method and "× 10 layers" in kind.prefill_method
    assert got.prefill_method.startswith("predicted, not measured")
    data = got.as_dict()
    assert data["predicted"] is True and data["decode_tokens_per_s"] == pytest.approx(got.tokens_per_s)
    assert data["layers"][0]["decode_method"] == kind.decode_method


def test_a_context_inside_the_measured_span_on_all_heads_is_read_not_extrapolated():
    model = Model(name="fake", layers=(SOFTMAX,), dtype="float32")
    got = pm.predict(planner.plan(model, 6000), fake_timings(model, SOFTMAX, 0.0, 1e-10, decode_a=0.0,
                                                             decode_b=1e-9))
    assert "read at 8 heads and 6,000 tokens" in got.kinds[0].decode_method
    assert got.decode_s == pytest.approx(10 * 1e-9 * 4 * 8 * 6000 * 64)


def test_a_kind_without_points_or_not_measured_is_refused_with_a_sentence():
    model = Model(name="fake", layers=(SOFTMAX,), dtype="float32")
    bare = pm.Timings(model, "cpu", "float32", (pm.KindTiming(SOFTMAX, SOFTMAX),))
    with pytest.raises(ValueError, match=r"no measured point for softmax \(prefill\), softmax \(decode\)"):
        pm.predict(planner.plan(model, 1024), bare)
    with pytest.raises(ValueError, match="was not measured; measure this model first"):
        pm.predict(planner.plan(planner.find("llama-3-8b"), 1024), bare)


def test_the_decode_curve_is_the_prediction_at_each_context():
    model = Model(name="fake", layers=(SOFTMAX,), dtype="float32", max_context=1 << 20)
    timings = fake_timings(model, SOFTMAX, 0.0, 1e-10, decode_a=1e-3, decode_b=1e-9)
    frame = pm.decode_curves(model, timings, [1024, 4096])
    assert list(frame["label"]) == ["fake (predicted)"] * 2 and set(frame["status"]) == {"ok"}
    want = [1 / (10 * (1e-3 + 1e-9 * 4 * 8 * n * 64)) for n in (1024, 4096)]
    assert list(frame["tokens_per_s"]) == pytest.approx(want)


def test_a_plan_in_another_dtype_than_the_timing_says_so():
    model = Model(name="fake", layers=(SOFTMAX,), dtype="bfloat16")
    got = pm.predict(planner.plan(model, 1024), fake_timings(model, SOFTMAX, 0, 1e-10, decode_a=0, decode_b=1e-9))
    assert any("timed in float32, not the plan's bfloat16" in n for n in got.notes)


# -- scaling down, and the stack --

@pytest.mark.parametrize("name, kind, heads, kv_heads", [
    ("llama-3-8b", 0, 4, 1),  # 32 over 8: a group of 4 query heads to a key/value head, kept
    ("gemma-3-27b", 0, 4, 2),  # 32 over 16: groups of 2
    ("qwen3-next-80b-a3b", 1, 8, 1),  # 16 over 2: one whole group of 8
    ("qwen3-next-80b-a3b", 0, 4, None),
    ("deepseek-v3", 0, 4, None),
])
def test_a_kind_is_timed_on_fewer_heads_keeping_its_group(name, kind, heads, kv_heads):
    layer = planner.find(name).layers[kind]
    small = pm.scaled(layer)
    assert (small.heads, small.kv_heads) == (heads, kv_heads)
    assert (small.head_dim, small.window, small.kv_rank, small.mechanism) == (layer.head_dim, layer.window,
                                                                              layer.kv_rank, layer.mechanism)
    assert pm.scaled(TINY.layers[0]) == TINY.layers[0]  # 2 heads: nothing to cut


def test_the_stack_keeps_the_model_s_proportions_and_spreads_each_kind():
    qwen = planner.find("qwen3-next-80b-a3b")
    timings = pm.Timings(qwen, "cpu", "float32", tuple(pm.KindTiming(k, pm.scaled(k)) for k in qwen.layers))
    stack = pm.stack_model(timings)
    assert [k.count for k in stack.layers] == [6, 2]  # 36 : 12 in 8 layers
    assert [k.heads for k in stack.layers] == [4, 8]
    order = [k.name for k in pm.stack_order(stack)]
    assert order == ["Gated DeltaNet"] * 2 + ["gated attention"] + ["Gated DeltaNet"] * 3 + ["gated attention"] \
        + ["Gated DeltaNet"]
    gemma = planner.find("gemma-3-27b")
    stack = pm.stack_model(pm.Timings(gemma, "cpu", "float32", tuple(pm.KindTiming(k, k) for k in gemma.layers)))
    assert [k.count for k in stack.layers] == [7, 1]  # 52 : 10 → 6.7 : 1.3


# -- a tiny real run --

def test_a_tiny_model_is_timed_predicted_and_checked_end_to_end():
    timings = pm.measure_kinds(TINY, budget_s=3, prefill_ns=(64, 128), decode_ns=(64, 128))
    assert [k.measured for k in timings.kinds] == list(TINY.layers)
    for kind in timings.kinds:
        assert kind.prefill and kind.decode
        assert all(p.seconds > 0 and p.flops > 0 for p in kind.prefill + kind.decode)
    got = pm.predict(planner.plan(TINY, 1024), timings)
    assert 0 < got.prefill_s < math.inf and 0 < got.tokens_per_s < math.inf
    check = pm.check_stack(timings, prefill_n=128, decode_n=256, budget_s=2)
    assert check.stack.layer_count == 8 and (check.prefill_n, check.decode_n) == (128, 256)
    assert check.prefill_measured_s > 0 and check.decode_predicted_s > 0 and math.isfinite(check.decode_ratio)
    assert json.loads(json.dumps(check.as_dict()))["layers"] == 8


def test_a_wider_state_than_the_kernel_keeps_is_timed_at_the_kernel_s_own_and_said_so():
    mamba = Model(name="mamba", max_context=4096, dtype="float32",
                  layers=(Layer(name="Mamba-2", mechanism="mamba2", count=3, heads=2, head_dim=16, state_dim=32),))
    timings = pm.measure_kinds(mamba, budget_s=2, prefill_ns=(64,), decode_ns=(64,), repeats=1)
    said = " ".join(timings.kinds[0].notes)
    assert "timed at the mamba2 kernel's own state, 16 × 16 a head, not the model's 16 × 32" in said
    got = pm.predict(planner.plan(mamba, 1024), timings)
    assert 0 < got.tokens_per_s < math.inf and any("not the model's 16 × 32" in n for n in got.notes)
    plain = pm.measure_kinds(TINY, budget_s=1, prefill_ns=(64,), decode_ns=(64,), repeats=1)
    assert not any("kernel's own state" in n for k in plain.kinds for n in k.notes)


def test_a_hybrid_s_new_kind_is_timed_apart_and_predicts_the_hybrid_at_any_share():
    turned = planner.hybrid(TINY, 1.0, "mamba2")  # TINY's 2 full layers become Mamba-2 ones
    timings, both = pm.measure_hybrid(TINY, turned, budget_s=2, prefill_ns=(64,), decode_ns=(64,), repeats=1)
    assert [k.layer.mechanism for k in timings.kinds] == ["sdpa", "gated_deltanet"]
    assert [k.layer.mechanism for k in both.kinds] == ["sdpa", "gated_deltanet", "mamba2"] and both.model == TINY
    half = planner.plan(planner.hybrid(TINY, 0.5, "mamba2"), 1024)
    assert 0 < pm.predict(half, both).tokens_per_s < math.inf
    with pytest.raises(ValueError, match="'Mamba-2 \\(SSD\\)' was not measured"):
        pm.predict(half, timings)
    same, again = pm.measure_hybrid(TINY, planner.hybrid(TINY, 1.0, "sdpa"), budget_s=1,
                                    prefill_ns=(64,), decode_ns=(64,), repeats=1)
    assert again is same  # the full layers turned into full layers of the same heads: no new kind to time
    with pytest.raises(ValueError, match="time them alike"):
        pm.joined(timings, dataclasses.replace(timings, dtype="float64"))
    with pytest.raises(ValueError, match="budget_s must be a number of seconds"):
        pm.measure_hybrid(TINY, turned, budget_s="10")


def test_the_cli_measures_a_model_file_and_adds_the_predicted_figures(tmp_path):
    path = tmp_path / "tiny.json"
    path.write_text(TINY.to_json())
    out, err = io.StringIO(), io.StringIO()
    code = cli.main(["plan", str(path), "--context", "512", "--measure", "--budget", "2", "--json"], out, err)
    # the CLI times at its own lengths (512–4096 prefill, 4k–32k decode): tiny at 2 heads of 16
    assert code == 0, err.getvalue()
    predicted = json.loads(out.getvalue())["predicted"]
    assert predicted["predicted"] is True and predicted["decode_tokens_per_s"] > 0
    assert predicted["prefill_method"].startswith("predicted, not measured")
    assert [k["name"] for k in predicted["layers"]] == ["full", "delta"]
    assert all("decode step measured at 4,096" in k["decode_method"] for k in predicted["layers"])
    code = cli.main(["plan", str(path), "--measure", "--budget", "0"], io.StringIO(), err := io.StringIO())
    assert code == 2 and "budget_s must be a number of seconds above 0" in err.getvalue()


# -- refused --

@pytest.mark.parametrize("kwargs, sentence", [
    ({"budget_s": 0}, "budget_s must be a number of seconds above 0"),
    ({"budget_s": "10"}, "budget_s must be a number of seconds"),
    ({"budget_s": 1e9}, "at most 600"),
    ({"heads": 0}, "heads must be a whole number from 1"),
    ({"prefill_ns": ()}, "prefill_ns must list lengths"),
    ({"decode_ns": (0,)}, "decode_ns must list lengths"),
    ({"device": "tpu"}, "device 'tpu' is unknown"),
    ({"dtype": "int8"}, "dtype 'int8' is not one cpu runs"),
    ({"repeats": 0}, "repeats must be a whole number from 1 to 100"),
    ({"threads": 10**6}, "threads must be a whole number from 1 to"),
])
def test_bad_measurement_inputs_are_refused_with_a_sentence(kwargs, sentence):
    with pytest.raises(ValueError, match=sentence):
        pm.measure_kinds(TINY, **kwargs)


def test_a_bad_model_or_check_budget_is_refused_before_anything_is_timed():
    bad = Model(name="bad", layers=(Layer(name="x", mechanism="sdpa", count=0, heads=2, head_dim=16),))
    with pytest.raises(ValueError, match="count must be a whole number"):
        pm.measure_kinds(bad)
    timings = pm.Timings(TINY, "cpu", "float32", tuple(pm.KindTiming(k, k) for k in TINY.layers))
    with pytest.raises(ValueError, match="lack prefill or decode points"):
        pm.check_stack(timings)
