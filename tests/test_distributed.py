"""Sequence parallelism over 2 processes on CPU (gloo): ring, Ulysses and state passing against baselines written
here in float64, the counted bytes against the cost model, refusals, and a rank that dies mid-run."""
from __future__ import annotations

import multiprocessing
import time

import numpy as np
import pytest
import torch
import torch.distributed as dist

from attn_core import distributed as D

pytestmark = pytest.mark.skipif(not (dist.is_available() and dist.is_gloo_available()),
                                reason="torch.distributed with the gloo backend is not in this torch build")

SHAPE = dict(batch=1, heads=4, head_dim=16)
TASKS = (D.Task("ring", n=64, **SHAPE), D.Task("ring", n=72, causal=True, **SHAPE),
         D.Task("ulysses", n=64, causal=True, **SHAPE), D.Task("ulysses", "sliding_window", n=64, **SHAPE),
         D.Task("state", "linear", n=200, causal=True, **SHAPE), D.Task("state", "mamba2", n=96, causal=True, **SHAPE),
         D.Task("state", "gated_deltanet", n=72, causal=True, **SHAPE))


@pytest.fixture(scope="module")
def results():
    """One process group of 2 ranks runs every task (a spawn costs seconds; one for them all)."""
    return dict(zip(TASKS, D.run_tasks(TASKS, memory=False, warmup=0, timeout_s=30)))


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
])
def test_refused_with_a_sentence(task, words):
    with pytest.raises(ValueError, match=words):
        D.run_tasks([task])


def test_a_rank_that_dies_ends_the_run_with_a_sentence():
    others = set(multiprocessing.active_children())  # started by other tests (a page's measuring worker)
    start = time.monotonic()
    with pytest.raises(D.DistributedError, match="rank 1 died"):
        D.run("ring", n=64, memory=False, warmup=0, timeout_s=10, fail_rank=1)
    assert time.monotonic() - start < 25
    assert set(multiprocessing.active_children()) <= others  # every worker joined: none left behind


def test_cli_prints_the_counts_beside_the_model():
    import io
    import json

    from attn_core import cli

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


def test_the_theory_page_shows_the_schemes_across_devices():
    from streamlit.testing.v1 import AppTest, app_test

    from tests.test_app import APP, Routed, widget

    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(app_test, "PagesManager", Routed)
        at = AppTest.from_file(APP, default_timeout=120).run()
        at.switch_page("pages/theory.py").run()
        widget(at, "th_sp_procs").set_value(4)
        at.run()
    assert not at.exception, [e.value for e in at.exception]
    tables = [t.value for t in at.dataframe if "bytes_sent_per_layer" in t.value.columns]
    assert len(tables) == 1 and list(tables[0]["scheme"]) == ["ring", "ulysses", "state"]
    assert any("NVLink 4 (H100 SXM): 450 GB/s" in c.value for c in at.caption)


def test_a_rank_that_stalls_ends_the_run_at_the_timeout():
    others = set(multiprocessing.active_children())
    start = time.monotonic()
    with pytest.raises(D.DistributedError, match="rank 0 failed"):
        D.run("ring", n=64, memory=False, warmup=0, timeout_s=2, fail_rank=1, failure="stall")
    assert time.monotonic() - start < 20
    assert set(multiprocessing.active_children()) <= others
