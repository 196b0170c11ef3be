"""Positions in a measured call (attn_core/engine/positions.py): the engine's own call path against RoPE and ALiBi
written out here, the refusals, the relative-property notes against behaviour, run files and the memory model
against the allocator."""
from __future__ import annotations

import dataclasses
import json

import pytest
import torch

from attn_core import MECHANISMS
from attn_core.cli import build_parser, config_from_args
from attn_core.engine import analysis, env, measure, positions, results
from attn_core.engine.config import SweepConfig
from attn_core.engine.measurement import Measurement, Theory, theory_of
from attn_core.engine.problem import Problem, Settings
from attn_core.mechanisms import MEASURED
from attn_core.spec import Shape
from tests.baselines import masked_softmax, runs, trace_peak_bytes


def turned(x: torch.Tensor, at: torch.Tensor) -> torch.Tensor:
    """RoPE as RoFormer writes it (Su et al. 2021, eq. 34), float64: feature pair (2i, 2i+1) of the token at
    position p rotated by p·10000^(−2i/d)."""
    x, d = x.double(), x.shape[-1]
    theta = 10000.0 ** (-torch.arange(0, d, 2, dtype=torch.float64) / d)
    angle = at.double()[:, None] * theta  # (n, d/2)
    even, odd = x[..., 0::2], x[..., 1::2]
    out = torch.empty_like(x)
    out[..., 0::2] = even * angle.cos() - odd * angle.sin()
    out[..., 1::2] = even * angle.sin() + odd * angle.cos()
    return out


def alibi_softmax(q, k, v, causal: bool) -> torch.Tensor:
    """softmax(q·k/√d − m_h·|i − j|) v in float64, slopes m_h = 2^(−8(h+1)/H) (Press et al. 2021, §3)."""
    H, n = q.shape[1], q.shape[2]
    slopes = torch.tensor([2.0 ** (-8 * (h + 1) / H) for h in range(H)], dtype=torch.float64)
    distance = (torch.arange(n)[:, None] - torch.arange(n)[None, :]).abs().double()
    logits = torch.einsum("bhid,bhjd->bhij", q.double(), k.double()) / q.shape[-1] ** 0.5
    logits = logits - slopes[:, None, None] * distance
    if causal:
        logits = logits.masked_fill(torch.ones(n, n, dtype=torch.bool).triu(1), float("-inf"))
    return torch.softmax(logits, -1) @ v.double()


def engine_output(problem: Problem) -> tuple[torch.Tensor, tuple[torch.Tensor, ...]]:
    """The output of the engine's timed call for `problem` (measure.call_of), and the inputs it drew."""
    spec = MEASURED[problem.mechanism]
    tensors = problem.inputs()
    state = measure.make_state(spec, problem)
    with torch.inference_mode():
        return measure.call_of(spec, problem, *tensors, state=state)(), tensors


@pytest.mark.parametrize("key,causal", [("softmax", False), ("sdpa", True), ("sliding_window", True),
                                        ("linear", False), ("mamba2", True)])
def test_a_measured_point_with_rope_is_the_mechanism_on_turned_q_and_k(key, causal):
    problem = Problem(mechanism=key, n=48, heads=2, d_model=32, dtype="float64", causal=causal, positions="rope")
    out, (q, k, v) = engine_output(problem)
    at = torch.arange(48)
    state = measure.make_state(MEASURED[key], problem)
    expected = MEASURED[key].fn(turned(q, at), turned(k, at), v, causal=causal, **state)
    torch.testing.assert_close(out, expected, rtol=1e-9, atol=1e-9)
    plain, _ = engine_output(dataclasses.replace(problem, positions="none"))
    assert not torch.allclose(out, plain, atol=1e-3)  # the positions did act


def test_cross_attention_places_the_queries_at_the_last_positions_of_the_keys():
    problem = Problem(mechanism="softmax", n=5, n_kv=12, heads=2, d_model=16, dtype="float64", positions="rope")
    out, (q, k, v) = engine_output(problem)
    expected = masked_softmax(turned(q, torch.arange(7, 12)), turned(k, torch.arange(12)), v)
    torch.testing.assert_close(out, expected, rtol=1e-9, atol=1e-9)


@pytest.mark.parametrize("key", ["softmax", "sdpa"])
@pytest.mark.parametrize("causal", [False, True])
def test_a_measured_point_with_alibi_is_softmax_with_its_penalty(key, causal):
    problem = Problem(mechanism=key, n=40, heads=8, d_model=64, dtype="float64", causal=causal, positions="alibi")
    out, (q, k, v) = engine_output(problem)
    torch.testing.assert_close(out, alibi_softmax(q, k, v, causal), rtol=1e-9, atol=1e-9)


@pytest.mark.parametrize("key", ["softmax", "sdpa", "linear"])
def test_a_generating_step_with_rope_turns_the_new_token_at_position_n(key):
    """The step's output is the last row of causal attention over the n + 1 tokens, each turned at its position."""
    n = 20
    problem = Problem(mechanism=key, n=n, heads=2, d_model=16, dtype="float64", mode="generate", positions="rope")
    spec = MEASURED[key]
    with torch.inference_mode():
        step, _ = measure.step_call(spec, problem, {})
        out = step()
    _, k, v = problem.inputs()
    tq, tk, tv = dataclasses.replace(problem, n=1, seed=1).inputs()
    at = torch.arange(n + 1)
    keys, values = torch.cat([k, tk], 2), torch.cat([v, tv], 2)
    full = spec.fn(turned(torch.cat([k, tq], 2), at), turned(keys, at), values, causal=True)  # row n: the token
    torch.testing.assert_close(out, full[:, :, -1:], rtol=1e-9, atol=1e-9)


@pytest.mark.parametrize("problem,words", [
    (Problem(mechanism="linear", positions="alibi"), "Linear (elu+1) takes no additive score bias"),
    (Problem(mechanism="softmax", positions="alibi", mode="generate"), "measure ALiBi in the forward modes"),
    (Problem(mechanism="softmax", positions="rope", d_model=68, heads=4), "head dimension must be even; it is 17"),
    (Problem(mechanism="mla", positions="rope", d_model=256, heads=2), "carries its own rotary key"),
])
def test_positions_a_mechanism_cannot_take_are_refused_with_a_sentence(problem, words):
    found = problem.problems(MEASURED[problem.mechanism])
    assert len(found) == 1 and words in found[0]
    if problem.positions == "alibi" and problem.mode == "forward":
        assert "Softmax (materialized), Softmax (fused SDPA)" in found[0]  # it names those that can


def test_an_unknown_positions_value_and_a_sweep_that_cannot_take_it_are_refused():
    assert Problem(positions="sinusoidal").problems() == [
        "positions 'sinusoidal' is unknown; choose none, rope (rotary) or alibi (linear biases)"]
    config = SweepConfig(mechanisms=(("softmax", {}), ("linear", {})), ns=(64,)).replaced(positions="alibi")
    (found,) = config.problems()
    assert found.startswith("Linear (elu+1) takes no additive score bias")
    with pytest.raises(SystemExit):
        build_parser().parse_args(["sweep", "--positions", "sinusoidal"])


def test_the_cli_carries_positions_into_the_sweep_and_the_series_name():
    args = build_parser().parse_args(["sweep", "--mechanisms", "softmax", "--n", "64", "--positions", "rope"])
    assert config_from_args(args).problem.positions == "rope"
    named = analysis.series_name("softmax", "Softmax (materialized)", "{}", 8, 8, "rope")
    assert named == "Softmax (materialized) + RoPE"
    assert analysis.series_name("sdpa", "Softmax (fused SDPA)", "{}", 8, 2, "alibi") == (
        "Softmax (fused SDPA) + ALiBi · GQA-2")


@pytest.mark.parametrize("key", list(MECHANISMS))
def test_the_rope_note_is_given_exactly_where_a_common_shift_moves_the_output(key):
    """RoPE's relative property, as behaviour: outputs with every position shifted by 1000 equal the unshifted ones
    (float64) unless the spec says why not."""
    spec = MECHANISMS[key]
    causal = not runs(spec, False)
    shape = Shape(1, 2, 64, 64, 16, dtype="float64", causal=causal)
    params = {p.name: p.small_value(64) for p in spec.params}
    state = (spec.state.init(shape, "cpu", torch.float64, seed=0, **params) if spec.state.init else {})
    g = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(1, 2, 64, 16, generator=g, dtype=torch.float64) for _ in range(3))
    at = torch.arange(64)
    a, b = (spec.fn(turned(q, at + s), turned(k, at + s), v, causal=causal, **params, **state) for s in (0, 1000))
    relative = torch.allclose(a, b, atol=1e-9)
    assert relative == (positions.note(spec, "rope") == ""), positions.note(spec, "rope") or key


@pytest.fixture
def fast_stamp(monkeypatch):
    """The device's matmul throughput (measured once a process, seconds on a busy machine) as a fixed figure."""
    monkeypatch.setattr(env, "matmul_gflops", lambda device, dtype: 100.0)


def test_run_files_keep_positions_and_read_files_without_them_as_none(tmp_path, fast_stamp):
    problem = Problem(mechanism="softmax", n=32, heads=2, d_model=16, positions="rope")
    quick = Settings(min_repeats=1, min_time_s=0, measure_memory=False)
    point, _ = measure.measure(MEASURED["softmax"], problem, quick)
    config = SweepConfig(mechanisms=(("softmax", {}),), ns=(32,), problem=problem)
    run = results.Run(results.frame_from_rows([point.to_row()]), {}, config.to_dict())
    for fmt in ("json", "csv"):
        path = tmp_path / f"run.{fmt}"
        results.save_run(run, path)
        back = results.load_run(path)
        assert list(back.frame["positions"]) == ["rope"]
        assert SweepConfig.from_dict(back.config).problem.positions == "rope"
    doc = json.loads(results.to_json_bytes(run))
    for row in doc["rows"]:
        del row["positions"]
    del doc["config"]["positions"]
    old = results.load_run(json.dumps(doc).encode())
    assert list(old.frame["positions"]) == ["none"]
    assert SweepConfig.from_dict(old.config).problem.positions == "none"
    doc["rows"][0]["positions"] = "<b>nope</b>"
    with pytest.raises(results.RunFileError, match="positions must be none, rope, alibi"):
        results.load_run(json.dumps(doc).encode())


def test_a_measured_point_says_what_the_positions_add(fast_stamp):
    base = Problem(mechanism="softmax", n=64, heads=2, d_model=32)
    spec = MEASURED["softmax"]
    plain, rope, alibi = (theory_of(spec, dataclasses.replace(base, positions=p)) for p in positions.POSITIONS)
    assert rope.flops - plain.flops == 3 * (2 * 64 + 2 * 64) * 16  # 6 FLOPs a feature pair of q and k
    assert alibi.flops - plain.flops == 2 * 64 * 64  # one addition a score
    assert rope.predicted_bytes == plain.predicted_bytes + 2 * 2 * 64 * 16 * 4  # the turned q and k held
    point, _ = measure.measure(spec, dataclasses.replace(base, positions="alibi"),
                               Settings(min_repeats=1, min_time_s=0, measure_memory=False))
    row = point.to_row()
    assert row["status"] == "ok" and row["positions"] == "alibi" and row["theory_flops"] == alibi.flops


# The allocator check of tests/contract/test_mechanisms.py, through the engine's call with positions, at a smaller shape of
# no power of two (B=2, H=3, n=700, D=40): RoPE on a quadratic, a fused and a linear-memory mechanism, ALiBi on the
# two that take it; bfloat16 where the path changes with it (RoPE's upcast copy, SDPA's math fallback upcasting), and
# one key/value head shared by the three (the fallback repeats it).
MEMORY_CASES = [("softmax", "rope", "float32", None), ("softmax", "rope", "bfloat16", None),
                ("sdpa", "rope", "float32", 1), ("sliding_window", "rope", "float32", None),
                ("softmax", "alibi", "float32", None), ("sdpa", "alibi", "float32", None),
                ("sdpa", "alibi", "bfloat16", None), ("sdpa", "alibi", "bfloat16", 1)]


@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("key,where,dtype,kv_heads", MEMORY_CASES)
def test_the_predicted_peak_with_positions_matches_the_allocator(key, where, dtype, kv_heads, causal):
    problem = Problem(mechanism=key, n=700, batch=2, heads=3, kv_heads=kv_heads, d_model=120, dtype=dtype,
                      causal=causal, positions=where)
    spec = MEASURED[key]
    tensors = problem.inputs()
    with torch.inference_mode():
        call = measure.call_of(spec, problem, *tensors, state={})
        call()  # first-call workspaces are not the mechanism's
        measured = trace_peak_bytes(call)
    assert theory_of(spec, problem).predicted_bytes == pytest.approx(measured, rel=0.02)


def test_a_store_made_before_positions_is_migrated_and_read_only_reads_them_as_none(tmp_path):
    """Schema version 1 of the store (its first migration, as it was) with one point: a read-only open reads its
    positions as none and leaves the file as it is; a writing open adds the column."""
    import sqlite3

    from attn_core.engine import store
    path = tmp_path / "runs.sqlite3"
    with sqlite3.connect(path) as db:
        for statement in store.MIGRATIONS[0]:
            db.execute(statement)
        db.execute("PRAGMA user_version = 1")
    row = {c: v for c, v in Measurement(Problem(n=16), Theory("Softmax (materialized)", True)).to_row().items()
           if c not in store._LATER}  # the columns a store of version 1 lacks
    with sqlite3.connect(path) as db:
        db.execute("INSERT INTO runs (created, status, env, config, row_schema) VALUES ('now', 'complete', '{}', "
                   "'{}', 3)")
        db.execute(f"INSERT INTO points (run_id, seq, {', '.join(row)}) VALUES (1, 0, {', '.join('?' * len(row))})",
                   [json.dumps(v) if isinstance(v, list) else v for v in row.values()])
    before = path.read_bytes()
    with store.Store(path, readonly=True) as reader:
        assert list(reader.run(1).frame["positions"]) == ["none"]
    assert path.read_bytes() == before
    with store.Store(path) as writer:
        assert list(writer.run(1).frame["positions"]) == ["none"]
    with sqlite3.connect(path) as db:
        assert db.execute("PRAGMA user_version").fetchone()[0] == store.SCHEMA_VERSION == len(store.MIGRATIONS)
