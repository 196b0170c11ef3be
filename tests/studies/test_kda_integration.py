"""Kimi Delta Attention in the studies and on the Accuracy page: recall trains it (tiny), state passing over 2
processes equals its recurrence written here in float64, the bytes it sends worked by hand, and the Accuracy page
shows it as its own model, causal as it must be."""
from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch.distributed as dist
from streamlit.testing.v1 import AppTest

from attn_core.studies import parallel as D
from attn_core.studies.recall import mqar as recall
from attn_core.studies.recall.mqar import Setup, Task

ROOT = Path(__file__).resolve().parents[2]
TINY = Setup(task=Task(vocab=16, seq=16, pairs=2), d_model=32, steps=2, batch=8, lrs=(1e-2,), eval_sequences=16,
             eval_every=1)


def kda64(q, k, v, alpha, beta):
    """S_t = S_{t−1} Diag(α_t) (I − β_t k̂_t k̂_tᵀ) + β_t v_t k̂_tᵀ, o_t = S_t q̂_t, k̂ = k/‖k‖, q̂ = q/(‖q‖·√d),
    S (d_v × d_k), a decay α_t a key channel: float64, token by token (Kimi Linear, arXiv 2510.26692, eq. 1)."""
    q, k, v, alpha, beta = (x.double().numpy() for x in (q, k, v, alpha, beta))
    d = q.shape[-1]
    out = np.zeros_like(v)
    for b, h in np.ndindex(*q.shape[:2]):
        S = np.zeros((v.shape[-1], d))
        for t in range(q.shape[2]):
            kh = k[b, h, t] / np.linalg.norm(k[b, h, t])
            qh = q[b, h, t] / (np.linalg.norm(q[b, h, t]) * np.sqrt(d))
            S = S @ np.diag(alpha[b, h, t]) @ (np.eye(d) - beta[b, h, t] * np.outer(kh, kh)) \
                + beta[b, h, t] * np.outer(v[b, h, t], kh)
            out[b, h, t] = S @ qh
    return out


# ---- recall ----

def test_kda_trains_on_recall_and_its_state_is_a_d_by_d_matrix_a_head():
    result = recall.train("kda", {}, TINY)
    assert 0.0 <= result.accuracy <= 1.0 and [p.step for p in result.curve] == [1, 2]
    assert all(np.isfinite(p.loss) for p in result.curve)
    # 2 heads of 32/2 = 16 dims, one 16 × 16 float32 state each: 2·16·16·4 bytes, whatever the sequence length
    assert result.state_bytes == 2 * 16 * 16 * 4 and result.state_note == ""
    longer = recall.with_setup(TINY, seq=64)
    assert recall.state_bytes("kda", {}, longer) == (2 * 16 * 16 * 4, "")
    assert recall.state_bytes("kda", {"kv_heads": 1}, longer)[0] == 16 * 16 * 4  # one state for both heads


def test_the_memory_estimate_covers_what_training_kda_allocates():
    from tests.contract.test_mechanisms import profiled_peak

    estimate = recall.peak_bytes(recall.required_bytes("kda", recall.check_mechanism("kda", {}, TINY), TINY))
    peak = profiled_peak(lambda: recall.train("kda", {}, TINY))
    assert peak <= estimate <= 3 * peak


# ---- state passing across processes ----

def test_kda_passes_its_state_as_gated_deltanet_does():
    if not (dist.is_available() and dist.is_gloo_available()):
        pytest.skip("torch.distributed with the gloo backend is not in this torch build")
    try:
        D.check_launch(2)
    except (D.DistributedError, OSError, RuntimeError) as e:
        pytest.skip(f"2 processes cannot be launched here to meet over gloo on localhost: {e}")
    task = D.Task("state", "kda", n=72, causal=True, batch=1, heads=4, head_dim=16, params=(("chunk", 8),))
    (got,) = D.run_tasks((task,), memory=False, warmup=0, timeout_s=30)
    expected = kda64(*D.inputs(task), **D.mechanism_state(task))
    assert np.abs(got.output.double().numpy() - expected).max() < 1e-5
    assert got.max_abs_diff < 1e-5
    # by hand: rank 0 sends one 16 × 16 float32 state a head, 4 heads; the last rank sends nothing
    assert got.bytes_sent == got.bytes_predicted == (4 * 16 * 16 * 4, 0)


def test_state_passing_takes_kda_and_says_it_is_causal():
    assert "kda" in D.STATE_MECHANISMS
    assert D.bytes_predicted("state", (2, 8, 1 << 20, 64), 4, mechanism="kda") == (2 * 8 * 64 * 64 * 4,) * 3 + (0,)
    with pytest.raises(ValueError, match="add --causal"):
        D.Task("state", "kda").check()


# ---- the Accuracy page ----

def test_the_accuracy_page_shows_kda_as_its_own_model_causal_as_it_must_be():
    at = AppTest.from_file(str(ROOT / "pages" / "accuracy.py"), default_timeout=60)
    for key, value in {"acc_n": 32, "acc_d_model": 32, "acc_heads": 2, "acc_scatter": False,
                       "acc_mechanism": "kda", "acc_values_kda_chunk": "4, 32"}.items():
        at.session_state[key] = value
    at.run()
    assert not at.exception and [e.value for e in at.error] == []
    (toggle,) = [t for t in at.toggle if t.label == "Causal mask"]
    assert toggle.value is True and toggle.disabled
    assert any("not an approximation of softmax" in i.value for i in at.info)
    assert at.dataframe[0].value["parameters"].tolist() == ["chunk=4", "chunk=32"]
    errors = at.dataframe[0].value["relative Frobenius error"]
    assert errors.iloc[0] == pytest.approx(errors.iloc[1], rel=1e-4)  # the chunk changes the work, not the output
