"""Threads from the free cores at call time (`mechanisms._cpu.free_core_threads`): the count read from the OS's
instantaneous counters, the threads cut inside and set back after, the results unchanged."""
import functools
import os
import threading
import time

import pytest
import torch

from attn_core import attention
from attn_core.mechanisms import _cpu


@pytest.mark.parametrize("threads,cores,others,expected", [
    (2, 2, 0, 2),  # quiet: torch's own count
    (2, 2, 1, 1),  # one core taken by another program
    (2, 2, 5, 1),  # a crowded machine: still one thread
    (8, 16, 4, 8),  # enough free cores: unchanged
    (8, 8, 3, 5),
    (1, 2, 0, 1),
])
def test_fitted_threads(threads, cores, others, expected):
    assert _cpu.fitted(threads, cores, others) == expected


@pytest.mark.parametrize("threads,cores,others,expected", [
    (2, 2, 0, 2), (2, 2, 1, 1),  # a free core: the free ones, as any call
    (2, 2, 2, 2), (2, 2, 5, 2), (8, 8, 8, 8),  # none free: every core shared alike, torch's count
    (8, 16, 4, 8), (8, 8, 3, 5),
])
def test_fused_calls_keep_their_threads_where_no_core_is_free(threads, cores, others, expected):
    assert _cpu.fitted(threads, cores, others, fused=True) == expected


@pytest.mark.parametrize("cores,others", [(2, 0), (2, 1), (2, 2), (2, 6), (8, 3)])
def test_calls_whose_threads_share_blocks_keep_them_at_any_load(cores, others):
    assert _cpu.fitted(2, cores, others, fused=_cpu.ALWAYS) == 2


@pytest.fixture
def two_threads():
    before = torch.get_num_threads()
    torch.set_num_threads(2)
    yield
    torch.set_num_threads(before)


def test_threads_are_cut_inside_and_set_back_after(monkeypatch, two_threads):
    monkeypatch.setattr(_cpu, "others_running", lambda: 1)
    monkeypatch.setattr(_cpu, "usable_cores_now", lambda: 2)
    with _cpu.free_core_threads(_cpu.FIT_WORK):
        assert torch.get_num_threads() == 1
    assert torch.get_num_threads() == 2
    with pytest.raises(RuntimeError):
        with _cpu.free_core_threads(_cpu.FIT_WORK):
            raise RuntimeError("a failing call")
    assert torch.get_num_threads() == 2


def test_small_calls_and_a_quiet_machine_are_left_alone(monkeypatch, two_threads):
    monkeypatch.setattr(_cpu, "others_running", lambda: 1)
    with _cpu.free_core_threads(_cpu.FIT_WORK - 1):
        assert torch.get_num_threads() == 2
    monkeypatch.setattr(_cpu, "others_running", lambda: 0)
    monkeypatch.setattr(_cpu, "usable_cores_now", lambda: 2)
    with _cpu.free_core_threads(_cpu.FIT_WORK):
        assert torch.get_num_threads() == 2


def test_attention_runs_on_the_free_cores_with_the_same_result(monkeypatch, two_threads):
    seen = []
    real = _cpu.fitted
    monkeypatch.setattr(_cpu, "fitted", lambda *a, **kw: seen.append(a) or real(*a, **kw))
    g = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(1, 8, 2048, 64, generator=g, dtype=torch.float64) for _ in range(3))  # 2^20 numbers
    quiet = attention("linear", q, k, v)
    monkeypatch.setattr(_cpu, "others_running", lambda: 1)
    monkeypatch.setattr(_cpu, "usable_cores_now", lambda: 2)
    busy = attention("linear", q, k, v)
    assert seen and seen[-1] == (2, 2, 1) and torch.get_num_threads() == 2
    torch.testing.assert_close(busy, quiet, atol=1e-12, rtol=1e-12)


@pytest.mark.skipif(not os.path.exists("/proc/loadavg"), reason="needs Linux's /proc/loadavg")
def test_the_counters_are_read_from_proc():
    assert _cpu._running_now() >= 1  # this process's own thread is running as it reads
    assert _cpu._own_running() >= 1
    assert _cpu.others_running() >= 0


def test_a_mechanism_of_fused_kernels_keeps_torch_s_threads_on_a_busy_machine(monkeypatch, two_threads):
    """`Cost.keeps_threads`: where it says the call is fused kernels (top-k with its C++ library), a machine whose
    every core another program holds does not cut the threads inside the call; where it does not (no library), they
    are cut as for every other call."""
    from attn_core.mechanisms import topk

    seen = []
    real = topk.select  # called inside the call: the threads it runs on
    monkeypatch.setattr(topk, "select", lambda *a, **kw: seen.append(torch.get_num_threads()) or real(*a, **kw))
    monkeypatch.setattr(_cpu, "others_running", lambda: 2)
    monkeypatch.setattr(_cpu, "usable_cores_now", lambda: 2)
    g = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(1, 8, 2048, 64, generator=g) for _ in range(3))  # 2^20 numbers
    for fused in (True, False):
        monkeypatch.setattr(topk.native, "expected", lambda: fused)
        attention("topk", q, k, v, top_k=64)
    assert set(seen[:len(seen) // 2]) == {2} and set(seen[len(seen) // 2:]) == {1} and torch.get_num_threads() == 2


@pytest.mark.parametrize("key,params,kept", [
    ("sliding_window", {"window": 64}, True),  # the fused path: the flash kernel's few long calls
    ("local", {"block": 64}, True),
    ("sliding_window", {"window": 64, "padded": True}, False),  # padding: the chunked form's many operations
    ("longformer", {"window": 64}, False),  # its global rows and joins: many operations
])
def test_the_band_keeps_torch_s_threads_on_a_busy_machine_only_on_its_fused_path(monkeypatch, two_threads, key,
                                                                                 params, kept):
    """Where every core is another program's, a sliding-window or block-local call without padding runs its
    band's kernels on torch's two threads; with padding, or Longformer's global rows, on one."""
    from attn_core.mechanisms import _banded

    seen = []
    for where, name in ((_banded, "_fused"), (_banded, "_chunk"), (_banded.native, "band")):  # the fused path's
        real = getattr(where, name)  # calls (the flash kernel's, our band kernel's), and the chunked form's
        monkeypatch.setattr(where, name, lambda *a, real=real, **kw: seen.append(torch.get_num_threads())
                            or real(*a, **kw))
    monkeypatch.setattr(_cpu, "others_running", lambda: 2)
    monkeypatch.setattr(_cpu, "usable_cores_now", lambda: 2)
    g = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(1, 8, 2048, 64, generator=g) for _ in range(3))  # 2^20 numbers
    params = dict(params)
    if params.pop("padded", False):
        params["key_padding_mask"] = torch.zeros(1, 2048, dtype=torch.bool)
    attention(key, q, k, v, **params)
    assert seen and set(seen) == {2 if kept else 1} and torch.get_num_threads() == 2


@pytest.mark.parametrize("causal,padded,kept", [(True, False, True), (False, False, False), (True, True, False)])
def test_linear_keeps_torch_s_threads_on_a_busy_machine_only_in_its_fused_causal_call(monkeypatch, two_threads,
                                                                                       causal, padded, kept):
    """Where every core is another program's, causal linear attention in the fused kernel (a key/value head a task)
    runs on torch's two threads; not causal (a first pass of a task a head), or with padding (the chunked form), on
    one. Where the library has no vector form the causal call is the torch form's segments: fitted, one thread."""
    from attn_core import native
    from attn_core.mechanisms import _linear_core

    seen = []
    for name in ("linear_attention_core", "mapped", "elu_attention"):
        real = getattr(_linear_core, name)
        monkeypatch.setattr(_linear_core, name, lambda *a, real=real, **kw: seen.append(torch.get_num_threads())
                            or real(*a, **kw))
    from attn_core.mechanisms import linear
    for name in ("elu_attention", "mapped"):
        monkeypatch.setattr(linear, name, getattr(_linear_core, name))
    monkeypatch.setattr(_cpu, "others_running", lambda: 2)
    monkeypatch.setattr(_cpu, "usable_cores_now", lambda: 2)
    g = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(1, 8, 2048, 64, generator=g) for _ in range(3))  # 2^20 numbers
    padding = {"key_padding_mask": torch.zeros(1, 2048, dtype=torch.bool)} if padded else {}
    attention("linear", q, k, v, causal=causal, **padding)
    assert seen and set(seen) == {2 if kept and native.linear_expected() else 1} and torch.get_num_threads() == 2
    if kept:
        seen.clear()
        monkeypatch.setattr(native.ops, "linear_lanes", lambda: 0)  # no vector form: the torch form, fitted
        attention("linear", q, k, v, causal=causal)
        assert set(seen) == {1}


@pytest.mark.parametrize("mode", ["grad", "no_grad", "inference"])
def test_run_blocks_runs_every_task_once_on_one_torch_thread_each_and_sets_the_count_back(two_threads, mode):
    """Each task runs once, on one of the pool's threads (two here), whose torch operations take one thread each;
    the caller's grad or inference mode is theirs; the caller's count (and torch's default for threads to come,
    which the workers write) is 2 again after."""
    seen, lock, both = [], threading.Lock(), threading.Barrier(2)

    def task(i):
        with lock:
            seen.append((i, threading.get_ident(), torch.get_num_threads(), torch.is_grad_enabled(),
                         torch.is_inference_mode_enabled()))
        if i < 2:  # the first two tasks wait for each other: each pool thread takes one, however busy the machine
            both.wait(timeout=60)

    context = {"grad": torch.enable_grad, "no_grad": torch.no_grad, "inference": torch.inference_mode}[mode]
    with context():
        _cpu.run_blocks([functools.partial(task, i) for i in range(40)], 2)
    assert sorted(i for i, *_ in seen) == list(range(40))
    assert len({ident for _, ident, *_ in seen} - {threading.get_ident()}) == 2  # the pool's two, not the caller
    assert {(n, g, inf) for _, _, n, g, inf in seen} == {(1, mode == "grad", mode == "inference")}
    assert torch.get_num_threads() == 2
    assert torch.zeros(3).add_(1).sum().item() == 3  # torch still works in the caller


def test_run_blocks_raises_a_task_s_error_once_every_thread_has_stopped(two_threads):
    ran = []

    def task(i):
        if i == 0:
            raise ValueError("block 0 failed")
        time.sleep(0.005)
        ran.append(i)

    with pytest.raises(ValueError, match="block 0 failed"):
        _cpu.run_blocks([functools.partial(task, i) for i in range(50)], 2)
    count = len(ran)
    time.sleep(0.05)
    assert count == len(ran) < 10  # the other thread stopped at its next task, and nothing ran after the raise


def test_run_blocks_with_one_worker_runs_the_tasks_in_order_in_the_caller():
    seen = []
    _cpu.run_blocks([functools.partial(lambda i: seen.append((i, threading.get_ident())), i) for i in range(5)], 1)
    assert seen == [(i, threading.get_ident()) for i in range(5)]


@pytest.mark.skipif(not hasattr(os, "fork"), reason="needs fork")
def test_run_blocks_in_a_child_forked_after_the_pool_started(two_threads):
    """A process forked after the pool's threads started has the pool's object but not its threads: its own pool
    runs the tasks (the parent's would wait forever)."""
    import multiprocessing

    _cpu.run_blocks([functools.partial(time.sleep, 0.005)] * 8, 2)  # the parent's pool, both threads started
    assert len(_cpu._pool(2)._threads) == 2
    child = multiprocessing.get_context("fork").Process(target=_blocks_in_a_child)
    child.start()
    child.join(30)
    alive = child.is_alive()
    if alive:
        child.kill()
    assert not alive and child.exitcode == 0


def _blocks_in_a_child() -> None:
    seen = []
    _cpu.run_blocks([functools.partial(seen.append, i) for i in range(8)], 2)
    os._exit(0 if sorted(seen) == list(range(8)) else 1)
