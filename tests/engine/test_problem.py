"""One problem, one measurement, one job: the Problem validated in one place, the Measurement's row written and read
in one place, and one Job that measures several sweeps by itself."""
from __future__ import annotations

import dataclasses

import pandas as pd
import pytest
import torch

import attn_core as ac
from attn_core.engine import measure
from attn_core.mechanisms._common import GPU_WORKSPACE
from attn_core.engine.config import SweepConfig
from attn_core.engine.job import Job
from attn_core.engine.measurement import COLUMNS, Measurement
from attn_core.engine.problem import Problem, Settings
from attn_core.engine.results import frame_from_rows
from attn_core.mechanisms import _linear_core as linear_core, additive, gated_deltanet, nsa, sigmoid, topk
from attn_core.mechanisms._common import GPU_WORKSPACE
from tests.fake_mechanisms import private_sweep_lock  # noqa: F401 (an autouse fixture)

QUICK = Settings(warmup=1, min_repeats=2, min_time_s=0.0)
TINY = dict(batch=2, heads=2, d_model=16, n=32)


def test_a_problems_invalid_states_are_sentences_saying_what_to_change():
    assert Problem(**TINY).problems(ac.get("softmax")) == []
    assert Problem(**TINY, kv_heads=3).problems() == [
        "key/value heads must divide the 2 query heads, got 3; choose 1 or 2"]
    assert Problem(**TINY, padding=32).problems() == [
        "padding must be a whole number of keys from 0 to n − 1, got 32"]
    assert Problem(**{**TINY, "n": 0}).problems()[0].startswith("sequence lengths must be positive integers")
    (shared,) = Problem(**TINY, kv_heads=1).problems(ac.get("reformer"))
    assert shared.startswith("Reformer") and "cannot share key/value heads" in shared and "equal to heads" in shared
    (padded,) = Problem(**TINY, padding=4).problems(ac.get("reformer"))
    assert "cannot take padding" in padded and "Set padding to 0" in padded


def test_a_padded_problem_reaches_the_kernel_with_its_mask():
    problem = Problem(**TINY, mechanism="softmax", padding=5)
    mask = problem.key_padding_mask()
    assert mask.shape == (2, 32) and mask[:, -5:].all() and not mask[:, :-5].any()
    q, k, v = problem.inputs()
    out = measure.call_of(ac.get("softmax"), problem, q, k, v, state={})()
    scores = (q @ k.transpose(-1, -2)) / 8**0.5  # written out: the last five keys get no weight
    expected = torch.softmax(scores.masked_fill(mask[:, None, None, :], float("-inf")), -1) @ v
    torch.testing.assert_close(out, expected)
    point, _ = measure.measure(ac.get("softmax"), problem, QUICK)
    assert point.ok and point.problem == problem


def test_a_measurement_round_trips_through_its_row():
    point, _ = measure.measure(ac.get("sliding_window"), Problem(**TINY, mechanism="sliding_window",
                                                                 params=(("window", 8),), causal=True), QUICK)
    row = point.to_row()
    assert list(row) == list(COLUMNS)
    typed = frame_from_rows([row]).to_dict("records")[0]
    back = Measurement.from_row(typed)
    assert back.to_row() == typed
    assert back.problem.mechanism == "sliding_window" and back.problem.params == (("window", 8),)
    assert back.problem.is_causal and back.summary == point.summary and back.conditions == point.conditions


def test_a_job_measures_its_sweeps_one_after_another_with_nobody_polling():
    """A preset of two sweeps (both masks): the job moves from the first to the second by itself."""
    base = SweepConfig(mechanisms=(("softmax", {}),), ns=(16, 32)).replaced(heads=2, d_model=16, min_repeats=2,
                                                                             min_time_s=0.0)
    job = Job.measure("both masks", (base, base.replaced(causal=True)))
    assert job.progress.total == 4
    assert job.wait(120) and job.error is None
    frame = job.frame()
    assert list(zip(frame["n"], frame["causal"])) == [(16, False), (32, False), (16, True), (32, True)]
    assert set(frame["status"]) == {"ok"} and len(job.poll()) == 4 and job.poll() == []
    assert job.result().config == {"sweeps": [base.to_dict(), base.replaced(causal=True).to_dict()]}


def test_a_replay_is_the_same_job_fed_from_a_file():
    rows = [dataclasses.replace(measure.measure(ac.get("softmax"), Problem(**TINY), QUICK)[0]).to_row()]
    run = ac.Run(frame_from_rows(rows * 3), {"device": "cpu"}, {"ns": [32]})
    clock = [0.0]
    job = Job.replay(run, points_per_s=2.0, clock=lambda: clock[0])
    assert len(job.poll()) == 1 and not job.done and job.progress.eta_s == 1.0
    clock[0] = 1.0
    assert len(job.poll()) == 2 and job.done
    pd.testing.assert_frame_equal(job.frame(), run.frame)
    assert job.result().env == {"device": "cpu"}


def test_old_run_configs_without_the_new_problem_fields_still_read():
    old = {"mechanisms": [["softmax", {}]], "ns": [256], "batch": 1, "heads": 8, "d_model": 512, "dtype": "float32",
           "device": "cpu", "mode": "forward", "causal": False, "seed": 0, **dataclasses.asdict(Settings())}
    config = SweepConfig.from_dict(old)
    assert config.problem.kv_heads is None and config.problem.padding == 0 and config.problems() == []
    with pytest.raises(ValueError, match="unknown sweep settings"):
        SweepConfig.from_dict({**old, "n": 4})  # a point's own field is not a sweep's


def test_sweeps_that_cannot_run_give_a_job_that_ended_with_the_sentences():
    bad = SweepConfig(mechanisms=(("linformer", {}),), ns=(64,)).replaced(causal=True)
    with pytest.raises(ValueError, match="Linformer cannot be causal"):
        Job.measure("bad", (bad,))
    refused = Job.refused("bad", "Linformer cannot be causal.")
    assert refused.done and refused.error == "Linformer cannot be causal." and refused.frame().empty


N = 2048


@pytest.mark.parametrize("key,rows", [("sigmoid", lambda d: sigmoid.chunk_rows(8, N, N, d)),
                                      ("additive", lambda d: additive.chunk_rows(8, N, N, 64, d)),
                                      ("performer", lambda d: linear_core.chunk_rows(8, N, 256, 64, False, d))])
def test_a_shape_carries_its_device_and_a_gpu_chunk_holds_more_rows(key, rows):
    """A chunk on a GPU holds GPU_WORKSPACE times a CPU's rows (up to n), and the spec's memory model follows."""
    q = torch.zeros(1, 8, 64, 8)
    assert ac.Shape.of(q, q).device == "cpu" and Problem(device="cpu").shape.device == "cpu"
    assert rows("cuda") == min(N, GPU_WORKSPACE * rows("cpu")) > rows("cpu")
    cpu, gpu = (ac.Shape(1, 8, N, N, 64, device=d) for d in ("cpu", "cuda"))
    assert ac.get(key).cost.memory_bytes(gpu) > ac.get(key).cost.memory_bytes(cpu)


def test_top_k_and_nsa_blocks_on_a_gpu_hold_more_rows_and_their_memory_models_follow():
    """Top-k's query blocks (up to n), indexer steps and key tiles, and NSA's query blocks: GPU_WORKSPACE times a
    CPU's on a GPU, where the launches, not a cache, set the size; NSA's fewer as a row's compressed blocks grow,
    so that a million tokens still fit a GPU."""
    cpu, gpu = (ac.Shape(1, 8, 16384, 16384, 64, causal=True, device=d) for d in ("cpu", "cuda"))
    # The documented budgets, each 64 times as large on a GPU: a block's selection 16 Mi numbers, at 2·H + 8 = 24 a
    # selected key, top_k = 2048 keys a row, one batch element: 2**24 // (2048·24) = 341 rows on a CPU, and
    # 64·2**24 // 49152 = 21845, capped at n = 16384, on a GPU.
    assert topk.rows(cpu, 2048, 4) == 2**24 // (2048 * (2 * 8 + 8)) == 341
    assert topk.rows(gpu, 2048, 4) == min(16384, 64 * 2**24 // (2048 * (2 * 8 + 8))) == 16384
    # An indexer step's scores 8 Mi numbers, (index_heads + 1)·m = 5·16384 a row: 2**23 // 81920 = 102 rows on a
    # CPU, 64·2**23 // 81920 = 6553 on a GPU.
    assert topk.index_rows(1, 4, 16384) == 2**23 // (5 * 16384) == 102
    assert topk.index_rows(1, 4, 16384, "cuda") == 64 * 2**23 // (5 * 16384) == 6553
    # An indexer product 1 MiB of float32, 2**18 numbers, batch·heads·rows = 1·4·102 = 408 a key: 642 keys a tile on
    # a CPU, 64·2**18 // 408 = 41120 on a GPU.
    assert topk.key_tile(1, 4, 102) == 2**18 // (1 * 4 * 102) == 642
    assert topk.key_tile(1, 4, 102, "cuda") == 64 * 2**18 // (1 * 4 * 102) == 41120
    # NSA: 128 rows on a CPU; on a GPU, 2**27 numbers over bh = 8 heads and the keys a last row sees: the compressed
    # blocks of 32 every 16 ending by t = n − 1, (n − 32) // 16 + 1, then 16 selected blocks of 64 and a window of
    # 512; between 64 and 64·64 rows. n = 16384: 1023 + 1024 + 512 = 2559 keys, 2**27 // (8·2559) = 6556 → 4096;
    # n = 2**20: 65535 + 1536 = 67071 keys, 2**27 // (8·67071) = 250.
    assert nsa.block_rows("cpu", 8, 16384) == nsa.block_rows("cpu", 8, 1 << 20) == 128
    assert nsa.block_rows("cuda", 8, 16384) == min(64 * 64, 2**27 // (8 * ((16384 - 32) // 16 + 1 + 16 * 64 + 512)))
    assert nsa.block_rows("cuda", 8, 16384) == 4096
    assert nsa.block_rows("cuda", 8, 1 << 20) == 2**27 // (8 * ((2**20 - 32) // 16 + 1 + 16 * 64 + 512)) == 250
    for key in ("topk", "nsa"):
        assert ac.get(key).cost.memory_bytes(gpu) > ac.get(key).cost.memory_bytes(cpu)
        assert ac.get(key).cost.executed(gpu) >= ac.get(key).cost.executed(cpu)
    million = ac.Shape(1, 8, 1 << 20, 1 << 20, 64, causal=True, device="cuda")  # a block's workspace bounded in n
    assert all(ac.get(key).cost.memory_bytes(million) < 8 << 30 for key in ("topk", "nsa"))


def test_a_gated_delta_segment_on_a_gpu_holds_more_chunks_and_its_memory_model_follows():
    cpu, gpu = gated_deltanet.segment_rows(8, 64, 32), gated_deltanet.segment_rows(8, 64, 32, "cuda")
    per_token = 4 * 8 * (7 * 64 + 3 * 32)  # float32: k̂, v, the two right sides, q̂ (7·d) and the C-wide terms (3·C)
    room = GPU_WORKSPACE * gated_deltanet.SEGMENT_BYTES  # a GPU's workspace: GPU_WORKSPACE times a CPU's
    assert gpu % 32 == 0 and gpu * per_token <= room < (gpu + 32) * per_token  # filled, in whole chunks of 32
    assert cpu == max(gated_deltanet.SEGMENT_BYTES // per_token // 32, 8) * 32 < gpu  # at least 8 chunks on a CPU
    shapes = [ac.Shape(1, 8, 16384, 16384, 64, causal=True, device=d) for d in ("cpu", "cuda")]
    assert ac.get("gated_deltanet").cost.memory_bytes(shapes[1]) > ac.get("gated_deltanet").cost.memory_bytes(shapes[0])
