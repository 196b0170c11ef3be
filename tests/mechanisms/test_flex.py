"""One mask, three implementations (attn_core.mechanisms.flex): ours, compiled FlexAttention and SDPA with a dense mask against
a float64 masked softmax written here, over masks built cell by cell (tests/baselines.allowed); Flex's mask_mod
against the same masks; the refusals; the implementation carried by the engine's problem, row, run file and CLI."""
from __future__ import annotations

import dataclasses
import math
import os
import warnings

import numpy as np
import pytest
import torch

from attn_core.mechanisms import flex
from attn_core import masks
from attn_core.charts.scaling import with_series
from attn_core.engine import analysis
from attn_core.engine.config import SweepConfig
from attn_core.engine.measure import measure
from attn_core.engine.measurement import Measurement, unmeasured
from attn_core.engine.problem import Problem, Settings
from attn_core.engine.results import frame_from_rows
from attn_core.insight.effective import make_state
from attn_core.mechanisms import MECHANISMS
from attn_core.native import cache
from attn_core.spec import Shape
from tests.baselines import allowed

B, H, N, D = 2, 2, 200, 16  # N: not a multiple of Flex's 128-token blocks, and more than one of them
PARAMS = {"softmax": {}, "sliding_window": {"window": 20}, "local": {"block": 32, "lookback": 1, "lookahead": 1},
          "sparse": {"stride": 16}, "longformer": {"window": 16, "global_tokens": 3},
          "bigbird": {"block": 16, "window_blocks": 3, "global_blocks": 2, "random_blocks": 2}}
KIND = {"softmax": "full"}  # baselines.allowed's name where it differs from the key


def reference(q, k, v, keep: np.ndarray) -> torch.Tensor:
    """softmax(q kᵀ/√d) v in float64 over the kept cells, keep (B or 1, nq, nk); a row that keeps nothing gives 0."""
    keep = torch.as_tensor(keep)[:, None]  # (B, 1, nq, nk)
    s = (q.double() @ k.double().transpose(-1, -2)) / math.sqrt(q.shape[-1])
    w = torch.where(keep, torch.exp(s - s.amax(-1, keepdim=True)), 0.0)
    total = w.sum(-1, keepdim=True)
    return torch.where(total > 0, w / total.clamp_min(1e-300), 0.0) @ v.double()


def inputs(seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    return tuple(torch.randn(B, H, N, D, generator=g) for _ in range(3))


def padding() -> torch.Tensor:
    """(B, N) True on padding: the last 30 keys of the first sequence, the last 150 of the second."""
    return torch.arange(N)[None, :] >= torch.tensor([N - 30, N - 150])[:, None]


def case(key: str, causal: bool, padded: bool):
    """(state, key_padding_mask, the kept cells (B, N, N) built without attn_core)."""
    state = (make_state(key, Shape(B, H, N, N, D, causal=causal), seed=0, **PARAMS[key])
             if MECHANISMS[key].state.init else {})
    cells = allowed(KIND.get(key, key), N, N, causal, **PARAMS[key], **state)[None].repeat(B, 0)
    pad = padding() if padded else None
    if padded:
        cells &= ~pad.numpy()[:, None, :]
    return state, pad, cells


@pytest.fixture(scope="module")
def compiled_flex():
    """One compiled FlexAttention call for the whole module (a compile takes seconds): packed documents with key
    padding, its output and its one-time costs; the module's compiled tests skip, naming what is missing, only where
    the machine cannot compile (FlexUnavailable: no C++ compiler, an unsupported platform); any other error fails."""
    from torch._inductor import codecache

    q, k, v = inputs(1)
    pattern = masks.document([50, 70, 80])
    headers = []  # Inductor's precompiled headers, which torch 2.13 keeps in the shared temporary folder
    try:
        with pytest.MonkeyPatch.context() as mp:
            mp.setattr(codecache, "_precompile_header", lambda *args, **kwargs: headers.append(args))
            forward, mask_s = flex.forward_of("flex", flex.Masking(pattern, padding()), N, N, B, "cpu")
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                out, once = flex.first_call(lambda: forward(q, k, v))
    except flex.FlexUnavailable as e:
        pytest.skip(str(e))
    assert headers == [] and os.environ[cache.INDUCTOR] == str(cache.cache_dir("inductor"))  # our folder, checked
    return q, k, v, pattern, forward, out, dataclasses.replace(once, mask_s=mask_s)


@pytest.mark.parametrize("key", flex.MASKED)
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("padded", [False, True])
def test_ours_and_the_dense_mask_match_masked_softmax_and_flex_s_mask_mod_keeps_the_same_cells(key, causal, padded):
    from torch.nn.attention.flex_attention import create_mask
    q, k, v = inputs()
    state, pad, cells = case(key, causal, padded)
    expected = reference(q, k, v, cells)
    for implementation in ("ours", "dense-mask"):
        got = flex.masked_attention(q, k, v, key, implementation=implementation, causal=causal,
                                    key_padding_mask=pad, state=state, **PARAMS[key])
        torch.testing.assert_close(got.double(), expected, atol=2e-6, rtol=0, msg=implementation)
    mask_mod = flex.masking_of(key, causal, PARAMS[key], state, pad).mask_mod()
    assert torch.equal(create_mask(mask_mod, B, 1, N, N, device="cpu")[:, 0], torch.as_tensor(cells))


def test_the_document_mask_keeps_each_packed_sequence_to_itself():
    doc = np.repeat([0, 1, 2], [50, 70, 80])
    expected = doc[:, None] == doc[None, :]
    assert torch.equal(masks.dense_mask(masks.document([50, 70, 80]), N, N), torch.as_tensor(expected))
    q, k, v = inputs()
    for implementation in ("ours", "dense-mask"):
        got = flex.pattern_attention(q, k, v, masks.document([50, 70, 80]), implementation=implementation)
        torch.testing.assert_close(got.double(), reference(q, k, v, expected[None]), atol=2e-6, rtol=0)
    with pytest.raises(ValueError, match="positive integers"):
        masks.document([50, 0])


def test_compiled_flex_matches_masked_softmax_and_keeps_its_one_time_costs_apart(compiled_flex):
    q, k, v, pattern, forward, out, once = compiled_flex
    doc = np.repeat([0, 1, 2], [50, 70, 80])
    cells = (doc[:, None] == doc[None, :])[None] & ~padding().numpy()[:, None, :]
    torch.testing.assert_close(out.double(), reference(q, k, v, cells), atol=2e-6, rtol=0)
    assert once.mask_s > 0 and (math.isnan(once.compile_s) or once.compile_s > 0)
    again, later = flex.first_call(lambda: forward(q, k, v))  # the graph is built: nothing compiles again
    assert torch.equal(again, out) and math.isnan(later.compile_s)


def test_a_flex_call_run_outside_the_compiler_is_refused_as_an_eager_fallback():
    q, k, v = inputs()
    with pytest.raises(flex.EagerFallback, match="not Flex's time"):
        flex._flex_call(q, k, v, None, False)  # what Dynamo does after its recompile limit: run the frame as Python


def failing_compile(inner: Exception):
    """A first call that fails as Inductor fails: InductorError ← LoweringException ← `inner`."""
    from torch._inductor import exc

    def call():
        lowering = exc.LoweringException(inner, "flex_attention", [], {})
        lowering.__cause__ = inner
        raise exc.InductorError(lowering, None)
    return call


def test_only_a_missing_capability_is_flex_unavailable_and_any_other_failure_is_raised():
    """No working C++ compiler is a capability the machine lacks: FlexUnavailable, and the compiled tests above skip
    naming it. A code generator's bug or a wrong kernel is raised as it is, so those tests fail, never skip."""
    from torch._inductor import exc

    with pytest.raises(flex.FlexUnavailable, match=r"cannot run here .*No working C\+\+ compiler"):
        flex.first_call(failing_compile(exc.InvalidCxxCompiler()))
    with pytest.raises(flex.FlexUnavailable, match="cannot run here"):
        flex.first_call(failing_compile(exc.TritonMissing(None)))
    for error in (AssertionError("an index out of range in the generated kernel"), ValueError("a bad block mask")):
        with pytest.raises(exc.InductorError) as raised:
            flex.first_call(failing_compile(error))
        assert not isinstance(raised.value, flex.FlexUnavailable)

    def wrong_kernel():
        raise RuntimeError("shape mismatch in the compiled kernel")
    with pytest.raises(RuntimeError, match="shape mismatch") as raised:
        flex.first_call(wrong_kernel)
    assert type(raised.value) is RuntimeError


def test_refusals_say_what_to_change():
    q, k, v = inputs()
    with pytest.raises(ValueError, match="only our kernel runs it"):
        flex.masked_attention(q, k, v, "linear", implementation="flex")
    with pytest.raises(ValueError, match="no backward on CPU"):
        flex.masked_attention(q.requires_grad_(), k, v, "sliding_window", implementation="flex")
    with pytest.raises(ValueError, match="choose ours or flex or dense-mask"):
        flex.pattern_attention(q, k, v, masks.causal, implementation="triton")
    linear = Problem(mechanism="linear", implementation="dense-mask")
    assert "only our kernel runs it" in linear.problems(MECHANISMS["linear"])[0]
    backward = Problem(mechanism="local", implementation="flex", mode="forward+backward", device="cpu")
    assert backward.problems(MECHANISMS["local"]) == [flex.implementation_problem("flex", "local", "forward+backward",
                                                                                  "cpu")]
    generating = Problem(mechanism="softmax", implementation="flex", mode="generate")
    assert any("token by token" in why for why in generating.problems(MECHANISMS["softmax"]))
    assert "implementation 'x' is unknown" in Problem(implementation="x").problems()[0]
    assert Problem(mechanism="local", implementation="dense-mask").problems(MECHANISMS["local"]) == []


def test_the_implementation_travels_through_the_sweep_config_and_the_saved_row():
    config = SweepConfig(mechanisms=(("sliding_window", {"window": 8}),), ns=(64,),
                         problem=Problem(implementation="dense-mask"))
    data = config.to_dict()
    assert data["implementation"] == "dense-mask" and SweepConfig.from_dict(data) == config
    data.pop("implementation")  # a file saved before implementations were a setting
    assert SweepConfig.from_dict(data).problem.implementation == "ours"
    point = Problem(mechanism="sliding_window", params=(("window", 8),), n=64, heads=2, d_model=16,
                    implementation="dense-mask", padding=5)
    measured, _ = measure(MECHANISMS["sliding_window"], point, Settings(min_repeats=1, min_time_s=0.0,
                                                                       measure_memory=False))
    assert measured.ok and measured.one_time.mask_s > 0 and math.isnan(measured.one_time.compile_s)
    row = measured.to_row()
    assert row["implementation"] == "dense-mask" and "by dense-mask" in point.describe()
    back = Measurement.from_row(frame_from_rows([row]).iloc[0].to_dict())
    assert back.problem == point and back.one_time.mask_s == measured.one_time.mask_s
    assert math.isnan(back.one_time.compile_s)
    old = {c: v for c, v in row.items() if c not in ("implementation", "compile_s", "mask_s")}
    assert frame_from_rows([old]).iloc[0]["implementation"] == "ours"
    both = frame_from_rows([row, old])  # one mechanism, two implementations: two series, named apart
    assert analysis.summary(both)["series"].tolist() == ["Sliding window (window=8) · dense-mask SDPA",
                                                         "Sliding window (window=8)"]
    assert sorted(with_series(both)["line"]) == sorted(analysis.summary(both)["series"])


def test_the_preset_runs_one_mask_by_each_implementation():
    from attn_core.engine import presets
    configs = presets.PRESETS["One mask, three kernels"].for_device("cpu")
    assert [c.problem.implementation for c in configs] == list(flex.IMPLEMENTATIONS)
    assert all(c.problems() == [] and c.mechanisms == configs[0].mechanisms for c in configs)


def test_score_mods_are_alibi_s_bias_and_a_tanh_cap_cell_by_cell():
    h, i, j = torch.arange(4)[:, None, None], torch.arange(6)[None, :, None], torch.arange(9)[None, None, :]
    alibi = flex.alibi_score_mod(4, 6, 9)(torch.zeros(()), 0, h, i, j)
    slopes = torch.tensor([2.0 ** (-2 * (k + 1)) for k in range(4)])  # 2^(−8(h+1)/H), H = 4 (arXiv 2108.12409)
    expected = -slopes[:, None, None] * (i + 3 - j).abs()  # the 6 queries are the last 6 of the 9 positions
    torch.testing.assert_close(alibi, expected.expand(4, 6, 9))
    scores = torch.tensor([-1e4, -3.0, 0.0, 3.0, 1e4])
    capped = flex.softcap_score_mod(50.0)(scores, 0, 0, 0, 0)
    assert capped.abs().max() <= 50.0
    torch.testing.assert_close(capped, torch.tensor([50.0 * math.tanh(x / 50.0) for x in scores.tolist()]))
    with pytest.raises(ValueError, match="positive number"):
        flex.softcap_score_mod(0)
    with pytest.raises(ValueError, match="score_mod is Flex's"):
        flex.forward_of("dense-mask", flex.Masking(masks.causal), 8, 8, 1, "cpu", score_mod=flex.softcap_score_mod(5))


def test_a_store_of_the_first_version_reads_as_ours_and_migrates_on_writing(tmp_path):
    import contextlib
    import sqlite3

    from attn_core.engine import store
    path = tmp_path / "runs.sqlite3"
    with contextlib.closing(sqlite3.connect(path)) as db:  # as the first version of the store left it
        for statement in store.MIGRATIONS[0]:
            db.execute(statement)
        db.execute("PRAGMA user_version = 1")
        db.execute("INSERT INTO runs (created, status, env, config, row_schema) VALUES ('2026', 'complete', '{}', "
                   "'{}', 3)")
        row = {c: v for c, v in unmeasured(MECHANISMS["softmax"], Problem(n=16), "skipped", "by hand").to_row().items()
               if c not in store._LATER}  # the columns a store of version 1 lacks
        db.execute(f"INSERT INTO points (run_id, seq, {', '.join(row)}) VALUES (1, 1, {', '.join('?' * len(row))})",
                   [store._cell(v) for v in row.values()])
        db.commit()
    with store.Store(path, readonly=True) as reader:
        assert reader.run(1).frame["implementation"].tolist() == ["ours"]
    with store.Store(path) as writer:
        assert writer.run(1).frame["implementation"].tolist() == ["ours"]
    with contextlib.closing(sqlite3.connect(path)) as db:
        assert {"implementation", "compile_s", "mask_s"} <= {r[1] for r in db.execute("PRAGMA table_info(points)")}


def sigmoid_reference(q, k, v, causal: bool, bias: float, pad: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(weights (B, H, N, N), output) of sigmoid attention in float64, written here: w_ij = σ(q_i·k_j/√D + bias −
    ln m_i) on the kept cells, m_i the unpadded keys query i sees (j ≤ i when causal), at least 1; 0 elsewhere."""
    keep = ~pad.numpy()[:, None, :].repeat(N, 1)  # (B, N, N)
    if causal:
        keep &= np.tril(np.ones((N, N), bool))[None]
    m = np.maximum(keep.sum(-1), 1)  # (B, N)
    s = (q.double() @ k.double().transpose(-1, -2)) / math.sqrt(D)
    w = torch.sigmoid(s + bias - torch.as_tensor(np.log(m))[:, None, :, None])
    w = torch.where(torch.as_tensor(keep)[:, None], w, 0.0)
    return w, w @ v.double()


@pytest.mark.parametrize("causal", [False, True])
def test_the_sigmoid_score_mod_gives_our_sigmoid_weights_cell_by_cell_and_the_sink_weight_1(causal):
    from attn_core.mechanisms.sigmoid import offsets, sigmoid_weights
    q, k, v = inputs(2)
    pad = padding()
    expected, _ = sigmoid_reference(q, k, v, causal, 0.5, pad)
    score_mod = flex.sigmoid_score_mod(offsets(N, N, causal, 0.5, q, pad), N)
    b, h = torch.arange(B)[:, None, None, None], torch.arange(H)[None, :, None, None]
    i, j = torch.arange(N)[:, None], torch.arange(N)[None, :]
    weights = score_mod((q @ k.transpose(-1, -2)) / math.sqrt(D), b, h, i, j).exp()  # what Flex's exp makes
    kept = expected > 0
    torch.testing.assert_close(weights.double()[kept], expected[kept], atol=1e-6, rtol=1e-5)
    sink = score_mod(torch.tensor(7.0), *map(torch.tensor, (0, 0, 3, N)))
    assert torch.equal(sink, torch.tensor(0.0))  # the sink scores 0: a weight e⁰ = 1
    if not causal:  # our mechanism's own weights, without padding: the same cells
        ours = sigmoid_weights(q, k, causal, 0.5)
        unpadded = flex.sigmoid_score_mod(offsets(N, N, causal, 0.5, q), N)
        torch.testing.assert_close(unpadded((q @ k.transpose(-1, -2)) / math.sqrt(D), b, h, i, j).exp(), ours)


@pytest.mark.parametrize("causal", [False, True])
def test_flex_on_the_sigmoid_inputs_gives_our_sigmoid_attention_not_a_softmax(causal):
    from torch.nn.attention.flex_attention import flex_attention

    from attn_core.mechanisms.sigmoid import sigmoid_attention
    q, k, v = inputs(3)
    pad = padding()
    k2, v2, block_mask, score_mod = flex.sigmoid_flex_inputs(q, k, v, causal=causal, bias=0.5,
                                                             key_padding_mask=pad)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # Flex's unfused path: the arithmetic the compiled kernel fuses
        normalised = flex_attention(q, k2, v2, score_mod=score_mod, block_mask=block_mask)
    got = flex.sigmoid_from_flex(normalised)
    _, expected = sigmoid_reference(q, k, v, causal, 0.5, pad)
    torch.testing.assert_close(got.double(), expected, atol=2e-6, rtol=0)
    ours = sigmoid_attention(q, k, v, causal=causal, bias=0.5, key_padding_mask=pad)
    torch.testing.assert_close(got, ours, atol=2e-6, rtol=0)
    assert (normalised[..., :-1] - got).abs().max() > 0.1  # Flex's own division, undone: not the same numbers
    with pytest.raises(ValueError, match="no backward on CPU"):
        flex.sigmoid_attention_flex(q.requires_grad_(), k, v)


def test_equal_packed_documents_are_the_engine_s_block_local_mask_with_no_neighbours():
    """What the README says of masks.document: packing equal documents of L tokens is `local` with block L,
    lookback 0 and lookahead 0, which every implementation runs; unequal lengths are the library's alone."""
    local = {"block": 50, "lookback": 0, "lookahead": 0}
    pattern = MECHANISMS["local"].insight.pattern(False, **local)
    assert torch.equal(masks.dense_mask(masks.document([50] * 4), N, N), masks.dense_mask(pattern, N, N))
    for implementation in flex.IMPLEMENTATIONS:
        problem = Problem(mechanism="local", params=tuple(local.items()), n=N, implementation=implementation)
        assert problem.problems(MECHANISMS["local"]) == []
