"""Sequence parallelism over 2 processes on CPU (gloo): ring, Ulysses and state passing against baselines written
here in float64, the counted bytes against the cost model, the guards (refusals, memory, the sweep lock), a stop
mid-run (a cancel, SIGTERM on the CLI), and a rank that dies or stalls; NCCL where there are 2 GPUs. One launch runs
every correctness task; the ranks fork from one preloaded server, so each further launch costs well under a second.
A launcher killed outright, and a rank's lifeline: tests/studies/test_distributed_lifeline.py."""
from __future__ import annotations

import contextlib
import io
import json
import os
import signal
import threading
import time

import numpy as np
import psutil
import pytest
import torch
import torch.distributed as dist

from attn_core import cli
from attn_core.studies import parallel as D
from attn_core.studies.parallel import launch
from attn_core.engine.lock import sweep_lock

pytestmark = pytest.mark.skipif(not (dist.is_available() and dist.is_gloo_available()),
                                reason="torch.distributed with the gloo backend is not in this torch build")

SHAPE = dict(batch=1, heads=4, head_dim=16)
TASKS = (D.Task("ring", n=64, **SHAPE), D.Task("ring", n=72, causal=True, **SHAPE),
         D.Task("ulysses", n=64, causal=True, **SHAPE), D.Task("ulysses", "sliding_window", n=64, **SHAPE),
         D.Task("state", "linear", n=200, causal=True, **SHAPE), D.Task("state", "mamba2", n=96, causal=True, **SHAPE),
         D.Task("state", "gated_deltanet", n=72, causal=True, **SHAPE))
SMALL = D.small_case()  # what the Theory page runs
LAUNCH_FAILURES = (D.DistributedError, OSError, RuntimeError)


def launch_or_skip(check=D.check_launch) -> None:
    """Skip, with the cause, where 2 ranks cannot start and meet on localhost (no loopback, no second process): a
    start-up failure only, so that a failure of the schemes once a launch works still fails its test."""
    try:
        check(2)
    except LAUNCH_FAILURES as e:
        pytest.skip(f"2 processes cannot be launched here to meet over gloo on localhost: {e}")


@pytest.fixture(scope="module", autouse=True)
def launchable():
    """One tiny 2-rank gloo launch, probed once before any test of this file starts processes."""
    launch_or_skip()


@pytest.fixture(scope="module")
def results():
    """One process group of 2 ranks runs every task, the Theory page's small case among them."""
    tasks = TASKS + SMALL
    return dict(zip(tasks, D.run_tasks(tasks, memory=False, warmup=0, timeout_s=30)))


def descendants() -> set[int]:
    """What a launch may leave: this process's children and the ranks' server's (the ranks). Not the children of
    other children: a page's measuring worker may be compiling kernels meanwhile, whose compilers come and go."""
    children = psutil.Process().children()
    ranks = set()
    for p in children:
        with contextlib.suppress(psutil.NoSuchProcess):
            if "multiprocessing.forkserver" in " ".join(p.cmdline()):
                ranks |= {rank.pid for rank in p.children()}
    return {p.pid for p in children} | ranks


def stalled(**options):
    """D.run of a ring whose rank 1 stalls, alive and silent, at its first transfer: mid-run until stopped."""
    return D.run("ring", n=64, memory=False, warmup=0, fail_rank=1, failure="stall", **options)


def softmax64(q, k, v, causal):
    """softmax(q·kᵀ/√D) v, row by row in numpy float64; causal: key j ≤ query i."""
    q, k, v = (x.double().numpy() for x in (q, k, v))
    out = np.zeros_like(q)
    for b, h, i in np.ndindex(*q.shape[:3]):
        s = k[b, h] @ q[b, h, i] / np.sqrt(q.shape[-1])
        if causal:
            s[i + 1:] = -np.inf
        w = np.exp(s - s.max())
        out[b, h, i] = w @ v[b, h] / w.sum()
    return out


def linear64(q, k, v):
    """Causal linear attention, the explicit O(n²) form: out_i = Σ_{j≤i} (φq_i·φk_j) v_j / Σ_{j≤i} φq_i·φk_j."""
    phi = lambda x: np.where(x > 0, x + 1, np.exp(x))  # elu(x) + 1
    q, k, v = (x.double().numpy() for x in (q, k, v))
    a = np.tril(phi(q) @ np.swapaxes(phi(k), -1, -2))
    return (a @ v) / a.sum(-1, keepdims=True)


def mamba2_64(q, k, v, dt, A):
    """The recurrence h_t = exp(dt_t·A)·h_{t−1} + dt_t·k_t v_tᵀ, y_t = q_tᵀ h_t, token by token in float64."""
    q, k, v, dt, A = (x.double().numpy() for x in (q, k, v, dt, A))
    out = np.zeros_like(v)
    for b, h in np.ndindex(*q.shape[:2]):
        state = np.zeros((k.shape[-1], v.shape[-1]))
        for t in range(q.shape[2]):
            state = np.exp(dt[b, h, t] * A[h]) * state + dt[b, h, t] * np.outer(k[b, h, t], v[b, h, t])
            out[b, h, t] = q[b, h, t] @ state
    return out


def deltanet64(q, k, v, alpha, beta):
    """S_t = α_t S_{t−1}(I − β_t k̂_t k̂_tᵀ) + β_t v_t k̂_tᵀ, o_t = S_t q̂_t, k̂ = k/‖k‖, q̂ = q/(‖q‖·√d); float64."""
    q, k, v, alpha, beta = (x.double().numpy() for x in (q, k, v, alpha, beta))
    d = q.shape[-1]
    out = np.zeros_like(v)
    for b, h in np.ndindex(*q.shape[:2]):
        S = np.zeros((v.shape[-1], d))
        for t in range(q.shape[2]):
            kh = k[b, h, t] / np.linalg.norm(k[b, h, t])
            qh = q[b, h, t] / (np.linalg.norm(q[b, h, t]) * np.sqrt(d))
            S = alpha[b, h, t] * S @ (np.eye(d) - beta[b, h, t] * np.outer(kh, kh)) + beta[b, h, t] * np.outer(
                v[b, h, t], kh)
            out[b, h, t] = S @ qh
    return out


@pytest.mark.parametrize("index", [0, 1])
def test_ring_equals_softmax(results, index):
    task = TASKS[index]
    got = results[task]
    expected = softmax64(*D.inputs(task), task.causal)
    assert np.abs(got.output.double().numpy() - expected).max() < 1e-5
    assert got.max_abs_diff < 1e-5


def test_ulysses_equals_the_single_process_mechanism(results):
    causal = results[TASKS[2]]
    assert np.abs(causal.output.double().numpy() - softmax64(*D.inputs(TASKS[2]), True)).max() < 1e-5
    assert results[TASKS[3]].max_abs_diff < 1e-5 and results[TASKS[3]].task.mechanism == "sliding_window"


def test_state_passing_equals_causal_linear_attention(results):
    task = TASKS[4]
    assert np.abs(results[task].output.double().numpy() - linear64(*D.inputs(task))).max() < 1e-5
    assert results[task].max_abs_diff < 1e-5


def test_state_passing_equals_the_recurrences_of_mamba2_and_gated_deltanet(results):
    for task, reference in ((TASKS[5], mamba2_64), (TASKS[6], deltanet64)):
        expected = reference(*D.inputs(task), **D.mechanism_state(task))
        assert np.abs(results[task].output.double().numpy() - expected).max() < 1e-5, task.mechanism
        assert results[task].max_abs_diff < 1e-5


def test_counted_bytes_equal_the_cost_model(results):
    for task, got in results.items():
        assert got.bytes_sent == got.bytes_predicted, task
    # by hand, float32, B = 1, H = 4, D = 16, P = 2: one K and one V block of n/2 positions; four all-to-alls of
    # half a shard; one 16 × 17 state per head, from rank 0 only
    assert results[TASKS[0]].bytes_sent == (2 * 4 * 32 * 16 * 4,) * 2
    assert results[TASKS[1]].bytes_sent == (2 * 4 * 36 * 16 * 4,) * 2
    assert results[TASKS[2]].bytes_sent == (4 * 2 * 32 * 16 * 4,) * 2
    assert results[TASKS[4]].bytes_sent == (4 * 16 * 17 * 4, 0)
    assert results[TASKS[5]].bytes_sent == results[TASKS[6]].bytes_sent == (4 * 16 * 16 * 4, 0)
    assert D.bytes_predicted("ring", (1, 8, 1024, 64), 4) == (2 * 3 * 8 * 256 * 64 * 4,) * 4
    assert D.bytes_predicted("state", (1, 8, 1 << 20, 64), 4) == D.bytes_predicted("state", (1, 8, 64, 64), 4)


def test_zig_zag_balances_causal_work():
    """Each rank of a causal ring holds blocks r and 2P − 1 − r: the same number of (query, key ≤ query) pairs."""
    task = D.Task("ring", procs=4, n=64, causal=True)
    held = [D.positions(task, r) for r in range(4)]
    assert sorted(torch.cat(held).tolist()) == list(range(64))
    assert len({int((p + 1).sum()) for p in held}) == 1


@pytest.mark.parametrize("task, words", [
    (D.Task("ring", n=66, causal=True), "not a multiple of 4"),
    (D.Task("ring", n=65), "not a multiple of 2"),
    (D.Task("ulysses", heads=3), "heads do not divide"),
    (D.Task("ulysses", "performer"), "random state"),
    (D.Task("state", "linear"), "add --causal"),
    (D.Task("state", "softmax", causal=True), "state passing is built for"),
    (D.Task("ring", "linear"), "give --mechanism softmax"),
    (D.Task("ulysses", "sliding_window", params=(("window", -1),)), "window = -1 is not allowed"),
    (D.Task("ring", params=(("window", 4),)), "has no parameter window"),
    (D.Task("ring", seed=1 << 64), "seed must be a whole number from 0 to 2\\*\\*63 - 1"),
])
def test_refused_with_a_sentence(task, words):
    with pytest.raises(ValueError, match=words):
        D.run_tasks([task])


def test_a_rank_that_dies_ends_the_run_with_a_sentence(results):
    others = descendants()  # the ranks' server, and what other tests started (a page's measuring worker)
    with pytest.raises(D.DistributedError, match="rank 1 died"):
        D.run("ring", n=64, memory=False, warmup=0, timeout_s=10, fail_rank=1)
    assert descendants() <= others  # every rank ended and reaped: none left behind


def test_cli_prints_the_counts_beside_the_model(results):
    out, err = io.StringIO(), io.StringIO()
    # three processes: the ring takes two steps, each block passing through a rank that did not make it
    code = cli.main(["distributed", "--scheme", "ring", "--procs", "3", "--n", "96", "--causal", "--heads", "4",
                     "--head-dim", "8", "--no-memory", "--json"], out, err)
    assert code == cli.EXIT_OK, err.getvalue()
    got = json.loads(out.getvalue())
    assert got["bytes_sent"] == got["bytes_predicted"] == [2 * 2 * 4 * 32 * 8 * 4] * 3 and got["max_abs_diff"] < 1e-5
    assert got["peak_bytes"] == [None] * 3 and got["device"] == "cpu" and got["time_s"][0] > 0
    assert cli.main(["distributed", "--scheme", "ring", "--n", "66", "--causal"], out, err) == cli.EXIT_USAGE
    assert "multiple of 4" in err.getvalue()


def test_the_schemes_table_follows_the_cost_model():
    # Llama-3-8B-like attention at 1M tokens over 8 H100s on NVLink: 32 heads of 128, bf16, 989 TFLOP/s a device
    rate, _ = D.LINKS["NVLink 4 (H100 SXM)"]
    table = D.schemes_table(1 << 20, 32, 128, 8, elem=2, link_bytes_per_s=rate, flops_per_s=989e12).set_index("scheme")
    assert table.loc["ring", "bytes_sent_per_layer"] == 2 * 7 * 32 * (1 << 17) * 128 * 2  # 14 GiB
    assert table.loc["ulysses", "bytes_sent_per_layer"] == 4 * 7 * 4 * (1 << 17) * 128 * 2
    assert table.loc["state", "bytes_sent_per_layer"] == 32 * (128 * 128 + 128) * 4
    assert table.loc["ring", "block_to_hide_transfer"] == pytest.approx(989e12 * 2 / (2 * 450e9))
    assert table.loc["ring", "transfer_s"] == pytest.approx(table.loc["ring", "bytes_sent_per_layer"] / 450e9)
    refused = D.schemes_table(4096, 6, 64, 4).set_index("scheme")
    assert "do not divide" in refused.loc["ulysses", "reason"] and refused.loc["ring", "reason"] == ""


def test_the_small_case_beside_the_model(results):
    table = D.measured_beside_model([results[t] for t in SMALL], flops_per_s=1e9).set_index("scheme")
    assert list(table.index) == ["ring", "ulysses", "state"] and (table["max_abs_diff"] < 1e-5).all()
    assert (table["bytes_sent"] == table["bytes_predicted"]).all()
    # causal softmax: 2·B·H·n²·D FLOPs, linear attention's state 4·B·H·n·D², each process at 1e9 / P FLOP/s
    assert table.loc["ring", "model_compute_ms"] == pytest.approx(2 * 8 * 1024**2 * 64 / 2 / (1e9 / 2) * 1e3)
    assert table.loc["state", "model_compute_ms"] == pytest.approx(4 * 8 * 1024 * 64**2 / 1e9 * 1e3)
    slow = max(results[SMALL[0]].time_s)
    assert table.loc["ring", "time_ms"] == slow * 1e3 and table.loc["ring", "reason"] == ""
    assert 0 <= table.loc["ring", "waiting_share"] <= 1
    skipped = D.measured_beside_model([D.run_tasks([SMALL[0]], memory_limit_bytes=1)[0]], 1e9)
    assert skipped["reason"][0].startswith("would need") and "bytes_sent" not in skipped


def test_the_theory_page_shows_the_schemes_and_runs_the_small_case(results):
    from streamlit.testing.v1 import AppTest, app_test

    from tests.dashboard.test_app import APP, Routed, widget

    def launched(tasks, **options):  # the page's launch, answered by the one this file made of the same tasks
        assert tuple(tasks) == SMALL and options["lock_wait_s"] == 0
        return [results[t] for t in tasks]

    def busy(tasks, **options):
        raise D.DistributedError("another sweep is running on this machine (pid 1, started 10:00:00)")

    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(app_test, "PagesManager", Routed)
        at = AppTest.from_file(APP, default_timeout=120).run()
        at.switch_page("pages/theory.py").run()
        widget(at, "th_sp_procs").set_value(4)
        at.run()
        tables = [t.value for t in at.dataframe if "bytes_sent_per_layer" in t.value.columns]
        assert len(tables) == 1 and list(tables[0]["scheme"]) == ["ring", "ulysses", "state"]
        assert any("NVLink 4 (H100 SXM): 450 GB/s" in c.value for c in at.caption)
        mp.setattr(D, "run_tasks", launched)
        at.button(key="th_sp_run").click().run()
        measured = [t.value for t in at.dataframe if "bytes_predicted" in t.value.columns]
        assert len(measured) == 1 and list(measured[0]["bytes_sent"]) == list(measured[0]["bytes_predicted"])
        mp.setattr(D, "run_tasks", busy)
        at.button(key="th_sp_run").click().run()
    assert not at.exception, [e.value for e in at.exception]
    assert any(w.value.startswith("The small case could not run: another sweep is running") for w in at.warning)


def test_a_rank_that_stalls_ends_the_run_at_the_timeout(results):
    """Rank 1 stalls for ten timeouts; rank 0's collective gives up at one, and its failure ends the run."""
    others = descendants()
    with pytest.raises(D.DistributedError, match="rank 0 failed"):
        stalled(timeout_s=2)
    assert descendants() <= others


def test_a_stop_mid_run_ends_every_process_within_seconds(results):
    """A cancel (the dashboard's) while rank 1 stalls and rank 0 waits on it, 30 s from their timeout: Cancelled,
    not the timeout's DistributedError, so the stop, not the timeout, ended it; and no process is left."""
    others, stop = descendants(), threading.Event()
    timer = threading.Timer(1.5, stop.set)
    timer.start()
    with pytest.raises(D.Cancelled, match="cancelled; its 2 processes were stopped"):
        stalled(timeout_s=30, cancel=stop)
    assert descendants() <= others


def test_sigterm_stops_the_cli_and_every_process(results, monkeypatch):
    """SIGTERM (`timeout`, `kill`) reaches the CLI mid-run: every rank ended, a sentence, exit code 128 + 15."""
    run = D.run
    monkeypatch.setattr(D, "run", lambda *a, **k: run(*a, **k, fail_rank=1, failure="stall"))
    others, out, err = descendants(), io.StringIO(), io.StringIO()
    timer = threading.Timer(1.5, os.kill, (os.getpid(), signal.SIGTERM))
    timer.start()
    try:
        code = cli.main(["distributed", "--scheme", "ring", "--n", "64", "--heads", "2", "--head-dim", "8",
                         "--timeout", "30", "--no-memory"], out, err)
    finally:
        timer.cancel()
    assert code == cli.EXIT_SIGNALLED + signal.SIGTERM and "SIGTERM: stopped; all 2 processes were ended" in \
        err.getvalue()
    assert descendants() <= others


def test_a_stop_while_the_ranks_start_is_raised_once_they_have():
    got = []
    old = signal.signal(signal.SIGTERM, lambda signum, frame: got.append(signum))
    try:
        with launch._stops_held():
            os.kill(os.getpid(), signal.SIGTERM)
            time.sleep(0.05)
            assert got == []  # held: a start is never cut in two
        assert got == [signal.SIGTERM]  # then raised to the handler that was there
    finally:
        signal.signal(signal.SIGTERM, old)


def test_memory_that_would_not_fit_is_skipped_with_the_reason_and_nothing_starts():
    others = descendants()
    got = D.run_tasks([D.Task("ring", n=64, **SHAPE)], memory_limit_bytes=10 * 1024)[0]
    assert got.status == "skipped" and got.max_abs_diff is None and got.time_s == ()
    assert got.reason.startswith("would need") and "10.0 KiB free under the memory limit set" in got.reason
    assert got.bytes_predicted == (2 * 4 * 32 * 16 * 4,) * 2  # the model still says what it would send
    out, err = io.StringIO(), io.StringIO()
    assert cli.main(["distributed", "--scheme", "state", "--mechanism", "linear", "--causal", "--n", "1024",
                     "--memory-limit", "1MiB"], out, err) == cli.EXIT_OK
    assert "skipped, would need" in out.getvalue()
    assert descendants() <= others


def test_the_memory_model_by_hand():
    # ring, B = 1, H = 4, n = 64, D = 16, P = 2, float32: whole = 4096 values, local 2048, blocks of 32 positions
    rank, launcher = D.required_bytes(D.Task("ring", n=64, **SHAPE))
    assert rank == 4 * (3 * 4096 + 5 * 2048 + 4 * 2048 + 3 * 4 * 32 * 32)
    assert launcher >= 4 * (4 * 64 * 64 + 2 * 4096)  # the reference's n × n scores a head, and the output twice
    causal, _ = D.required_bytes(D.Task("ring", n=64, causal=True, **SHAPE))
    assert rank - causal == 4 * 3 * 4 * (32 * 32 - 16 * 16)  # zig-zag blocks of n/(2P)


def test_a_sweep_holding_the_machine_refuses_the_run_with_a_sentence():
    with sweep_lock():
        with pytest.raises(D.DistributedError, match="another sweep is running.*as a sweep does"):
            D.run("ring", n=64, memory=False, lock_wait_s=0)


def test_a_launch_that_cannot_start_skips_with_the_cause(monkeypatch):
    def no_loopback():
        raise OSError(99, "Cannot assign requested address")

    monkeypatch.setattr(launch, "free_port", no_loopback)
    with pytest.raises(D.DistributedError, match="cannot start and meet on localhost here.*Cannot assign"):
        D.check_launch()
    with pytest.raises(pytest.skip.Exception, match="cannot be launched here.*Cannot assign requested address"):
        launch_or_skip()
    monkeypatch.undo()
    D.check_launch()  # here it can: the probe itself passes
    launch_or_skip()


@pytest.mark.parametrize("options, words", [
    (dict(timeout_s=0), "timeout_s = 0"), (dict(warmup=-1), "warmup = -1"),
    (dict(memory_margin=-0.5), "memory_margin"), (dict(memory_limit_bytes=0), "memory_limit_bytes"),
    (dict(device="mps"), "cpu \\(gloo\\) or cuda"), (dict(failure="hang"), "'exit' and 'stall'"),
])
def test_launch_options_refused_with_a_sentence(options, words):
    with pytest.raises(ValueError, match=words):
        D.run_tasks([D.Task("ring", n=64)], **options)
    with pytest.raises(ValueError, match="no task is given"):
        D.run_tasks([])


def test_nccl_is_the_default_where_each_process_has_a_gpu(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 2)
    assert D.default_device(2) == "cuda" and D.default_device(3) == "cpu"
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 1)
    assert D.default_device(2) == "cpu"


@pytest.mark.skipif(torch.cuda.device_count() < 2, reason=f"NCCL takes a GPU a process: 2 needed, "
                                                          f"{torch.cuda.device_count()} here")
def test_ring_over_nccl_equals_softmax():
    got = D.run("ring", n=128, causal=True, memory=False, timeout_s=60, **SHAPE)
    assert got.backend == "nccl" and got.device == "cuda" and got.max_abs_diff < 1e-4
    assert got.bytes_sent == got.bytes_predicted
