"""One point measured in this process: timing loop, derived statistics, peak memory, guard and statuses."""
from __future__ import annotations

import collections
import json
import math
import os
import resource
import subprocess
import sys
import threading
import time

import pytest
import torch

import attn_core as ac
from attn_core.engine import env, measure, timing as loop
from attn_core.engine.measure import format_bytes, guard, is_oom, required_bytes, resolve_mechanisms
from attn_core.engine.measurement import COLUMNS, median_iqr
from attn_core.engine.problem import Problem, Settings
from attn_core.engine.timing import Cancelled, time_samples
from tests.fake_mechanisms import FAKES, REF

QUICK = Settings(warmup=1, min_repeats=3, min_time_s=0.0, point_budget_s=30.0)


def case(mechanism="softmax", n=64, mode="forward", params=(), heads=2, d_model=16, **kw) -> Problem:
    return Problem(mechanism=mechanism, params=params, n=n, batch=1, heads=heads, d_model=d_model, device="cpu",
                   mode=mode, **kw)


def measure_case(spec, problem, settings):
    """One point measured here, as its saved row (Measurement.to_row), and the seconds it took."""
    point, elapsed = measure.measure(spec, problem, settings)
    assert point.problem == problem  # the same problem comes back on its measurement
    return point.to_row(), elapsed


@pytest.fixture
def retaking(monkeypatch):
    """The timing loop as a user meets it, retakes on (the suite turns them off: tests/conftest.py), for the tests of
    retaking, whose probes are scripted. Not for the tests that measure real calls: among the suite's processes
    every sample is disturbed, and each point waited for quiet (the file took 80 s with one core busy, 14 s alone)."""
    monkeypatch.delenv(loop.RETAKES, raising=False)


def test_median_and_iqr_are_derived_from_the_samples():
    assert median_iqr([3.0, 1.0, 2.0, 4.0, 5.0]) == (3.0, 2.0)
    assert median_iqr([7.0]) == (7.0, 0.0)


class FakeProbe(env.ContentionProbe):
    """A contention probe whose samples are disturbed as a script says: True = another program took 1.5 cores
    (and this process's threads waited half the time), False = a quiet machine."""

    def __init__(self, script):
        self.script, self.marks = list(script), 0
        super().__init__()

    def mark(self):
        self.marks += 1
        return (time.perf_counter(), 0.0, 0.0, 0)

    def since(self, mark):
        wall = time.perf_counter() - mark[0]
        busy = self.script.pop(0) if self.script else False
        return env.Contention(wall, 1.5 * wall if busy else 0.0, 0.5 * wall * 2 if busy else 0.0)


def test_time_samples_reaches_both_minimum_count_and_minimum_time():
    calls = []
    timing = time_samples(lambda: calls.append(1), "cpu", Settings(warmup=2, min_repeats=4, min_time_s=0.0))
    assert len(timing.samples) >= 4 and all(s > 0 for s in timing.samples)
    assert len(calls) >= 2 + 4  # warm-up calls are made but not kept


def test_time_samples_stops_at_the_budget_with_at_least_one_sample():
    timing = time_samples(lambda: None, "cpu", Settings(min_repeats=10**6, min_time_s=1e9, point_budget_s=0.0))
    assert len(timing.samples) == 1 and timing.spent_s > 0


def test_a_disturbed_sample_is_set_aside_and_taken_again(monkeypatch, retaking):
    monkeypatch.setattr(loop, "wait_for_quiet", lambda *args: None)
    probe = FakeProbe([False, True, True, False, False])
    timing = time_samples(lambda: None, "cpu", Settings(warmup=1, min_repeats=3, min_time_s=0.0), probe=probe)
    assert timing.retaken == 2 and len(timing.samples) == 3 and not timing.disturbed
    assert timing.contention.foreign_s == 0.0  # only the clean samples are described


def test_a_point_that_stays_disturbed_is_kept_and_flagged(monkeypatch, retaking):
    monkeypatch.setattr(loop, "wait_for_quiet", lambda *args: None)
    probe = FakeProbe([True] * 100)
    timing = time_samples(lambda: None, "cpu", Settings(warmup=1, min_repeats=3, min_time_s=0.0), probe=probe)
    assert timing.disturbed and timing.retaken == loop.MAX_RETAKES  # bounded: the point still ends
    assert len(timing.samples) == loop.MAX_RETAKES + 3  # every sample, the disturbed ones included
    assert timing.contention.foreign_cores == pytest.approx(1.5)


def test_contention_reads_waits_where_the_os_gives_them_and_foreign_cores_elsewhere():
    quiet, busy = env.Contention(1.0, 0.02, 0.001), env.Contention(1.0, 0.9, 0.3)
    assert not quiet.disturbed(2) and busy.disturbed(2)
    assert busy.foreign_cores == pytest.approx(0.9) and (quiet + busy).wall_s == 2.0
    no_waits = env.Contention(1.0, 0.9 + max(os.cpu_count() - 2, 0), None)
    assert no_waits.disturbed(2) and not env.Contention(1.0, 0.0, None).disturbed(2)


class FakeClock:
    """`time` for attn_core.engine.timing whose clock moves only when the code sleeps: a wait lasts what it asked for,
    whatever else the machine does meanwhile."""

    def __init__(self) -> None:
        self.now = 0.0

    def perf_counter(self) -> float:
        return self.now

    def sleep(self, seconds: float) -> None:
        self.now += seconds


Times = collections.namedtuple("Times", "user system idle")  # psutil.cpu_times' fields the probe reads


def test_the_probe_leaves_out_this_process_s_own_threads(monkeypatch):
    """On a machine that runs this process alone (the system's busy time made this process's CPU time, read from
    getrusage, not the clock the probe takes its own share from), this thread spinning and torch products in
    another use CPU, and none of it is foreign."""
    def this_process_only(percpu=False):
        used = resource.getrusage(resource.RUSAGE_SELF)
        return Times(used.ru_utime, used.ru_stime, 0.0)

    monkeypatch.setattr(env.psutil, "cpu_times", this_process_only)
    probe, a = env.ContentionProbe(), torch.randn(256, 256)
    before, mark = this_process_only(), probe.mark()
    other = threading.Thread(target=lambda: [a @ a for _ in range(50)])
    other.start()
    began = time.process_time()
    while time.process_time() - began < 0.2:  # 0.2 s of this process's CPU, however long the machine takes
        pass
    other.join()
    seen, after = probe.since(mark), this_process_only()
    assert sum(after) - sum(before) >= 0.2  # this process did use the CPU
    assert abs(seen.foreign_s) < 0.01  # two readings of one counter, a few µs apart


def test_the_real_probe_counts_a_neighbour_s_cpu_time_as_foreign():
    """A child process burns 0.5 s of CPU time by its own clock (however long a busy machine takes to give it) and
    says how much it used: the system's busy time less this process's holds at least that. Other programs only add
    to it; the OS counts it in ticks of 10 ms, a few of which the bound leaves."""
    probe = env.ContentionProbe()
    mark = probe.mark()
    child = subprocess.run([sys.executable, "-c", "import time\nwhile time.process_time() < 0.5: pass\n"
                            "print(time.process_time())"], capture_output=True, text=True, check=True)
    seen, burned = probe.since(mark), float(child.stdout)
    assert burned >= 0.5 and seen.foreign_s >= burned - 0.15


def test_time_samples_raises_cancelled():
    with pytest.raises(Cancelled):
        time_samples(lambda: None, "cpu", QUICK, cancelled=lambda: True)


def test_ok_row_has_every_column_raw_samples_and_theory():
    row, elapsed = measure_case(ac.get("softmax"), case(), QUICK)
    assert row["status"] == "ok" and row["reason"] == "" and set(row) == set(COLUMNS)
    assert row["repeats"] == len(row["time_samples"]) >= 3
    assert row["time_median_s"] == pytest.approx(median_iqr(row["time_samples"])[0])
    spec_flops, executed = ac.get("softmax").cost.flops(case().shape), ac.get("softmax").cost.executed(case().shape)
    assert row["theory_flops"] == spec_flops and row["executed_flops"] == executed
    assert row["gflops"] == pytest.approx(executed / row["time_median_s"] / 1e9)  # the device does what it executes
    assert row["foreign_cpu"] >= 0 and row["retaken"] >= 0 and row["disturbed"] in (True, False)
    assert row["pct_of_device"] == pytest.approx(100 * row["gflops"] / row["device_gflops"])
    assert row["memory_method"] == "torch.profiler (CPU allocator)"
    assert row["threads"] == torch.get_num_threads() and json.loads(row["params"]) == {}
    assert elapsed > 0


def test_cpu_peak_of_softmax_is_scores_plus_probabilities():
    """The profiler's running sum gives 2·B·H·n²·4 bytes above the inputs for fp32 softmax, exactly."""
    row, _ = measure_case(ac.get("softmax"), case(n=128, heads=4, d_model=32), QUICK)
    assert row["peak_bytes"] == 2 * 1 * 4 * 128 * 128 * 4 == row["predicted_bytes"]


def test_forward_backward_counts_three_forward_flops_and_takes_gradients():
    fwd, _ = measure_case(ac.get("sdpa"), case(mode="forward"), QUICK)
    both, _ = measure_case(ac.get("sdpa"), case(mode="forward+backward"), QUICK)
    assert both["status"] == "ok" and both["theory_flops"] == 3 * fwd["theory_flops"]
    assert both["peak_bytes"] > fwd["peak_bytes"]  # the gradients of q, k and v are allocated too


@pytest.mark.parametrize("key", list(resolve_mechanisms()))
def test_every_mechanism_measures_its_forward_and_backward(key):
    """Every mechanism's gradients are timed, Reformer's too, whose keys are its queries (k is never read)."""
    spec = resolve_mechanisms()[key]
    small = tuple((p.name, p.small_value(64)) for p in spec.params)
    problem = case(key, n=64, mode="forward+backward", causal=bool(spec.supports.causal_only), params=small)
    row, _ = measure_case(spec, problem, Settings(warmup=0, min_repeats=1, min_time_s=0.0, measure_memory=False))
    assert row["status"] == "ok", row["reason"]


def test_state_is_built_outside_and_params_are_recorded():
    row, _ = measure_case(ac.get("linformer"), case(n=64, params=(("rank", 16),)), QUICK)
    assert row["status"] == "ok" and json.loads(row["params"]) == {"rank": 16}


def test_sdpa_rows_name_their_backend():
    row, _ = measure_case(ac.get("sdpa"), case(), QUICK)
    assert row["sdpa_backend"] not in ("", None)
    other, _ = measure_case(ac.get("linear"), case(), QUICK)
    assert other["sdpa_backend"] == ""


def test_mechanism_exception_is_a_failed_row_with_the_message():
    row, _ = measure_case(FAKES["raises"], case("raises"), QUICK)
    assert row["status"] == "failed" and "deliberate failure" in row["reason"]
    assert math.isnan(row["time_median_s"]) and row["time_samples"] == [] and math.isnan(row["peak_bytes"])


def test_out_of_memory_error_is_an_oom_row():
    row, _ = measure_case(FAKES["fake_oom"], case("fake_oom"), QUICK)
    assert row["status"] == "oom" and row["reason"].startswith("out of memory")


def test_cpu_allocator_failure_counts_as_oom():
    try:
        torch.empty(1 << 60, dtype=torch.uint8)
    except RuntimeError as e:
        assert is_oom(e)
    assert not is_oom(RuntimeError("shape mismatch")) and not is_oom(ValueError("out of memory"))


def test_guard_skips_a_point_that_does_not_fit_a_small_memory_limit():
    settings = Settings(memory_limit_bytes=1 << 20, memory_margin=0.5)
    big = case(n=1024, heads=4, d_model=64)
    reason = guard(ac.get("softmax"), big, settings)
    need = required_bytes(ac.get("softmax"), big) * 1.5
    assert reason == f"would need {format_bytes(need)} (with a 50% safety margin), 1.0 MiB free under the memory " \
                     "limit set for this sweep"
    row, _ = measure_case(ac.get("softmax"), big, settings)
    assert row["status"] == "skipped" and row["reason"] == reason and math.isnan(row["time_median_s"])
    assert row["predicted_bytes"] == ac.get("softmax").cost.memory_bytes(big.shape)  # theory stays on skipped rows
    assert guard(ac.get("softmax"), case(n=16), settings) is None


def test_guard_counts_backward_as_three_forward_peaks_and_the_gradients():
    spec, c = ac.get("softmax"), case(n=256, mode="forward+backward")
    forward = spec.cost.memory_bytes(c.shape)
    assert required_bytes(spec, c) == c.shape.input_bytes * 3 + 3 * forward


def test_invalid_parameters_fail_with_the_spec_sentence():
    row, _ = measure_case(ac.get("linformer"), case(n=32, params=(("rank", 64),)), QUICK)
    assert row["status"] == "failed" and "rank" in row["reason"]


def test_format_bytes():
    assert format_bytes(34 * 2**30) == "34.0 GiB"
    assert format_bytes(1536) == "1.5 KiB" and format_bytes(12) == "12 B"


def test_extra_mechanisms_resolve_and_bad_references_say_so():
    registry = resolve_mechanisms((REF,))
    assert set(FAKES) <= set(registry) and set(ac.MECHANISMS) <= set(registry)
    with pytest.raises(ValueError, match="cannot be imported"):
        resolve_mechanisms(("tests.no_such_module:X",))
    with pytest.raises(ValueError, match="not a MechanismSpec"):
        resolve_mechanisms(("tests.fake_mechanisms:REF",))


def test_devices_dtypes_and_environment_stamp():
    assert env.available_devices()[0] == "cpu"
    assert env.resolve_device("auto") in env.available_devices()
    with pytest.raises(ValueError, match="unknown"):
        env.resolve_device("tpu")
    if "cuda" not in env.available_devices():
        with pytest.raises(ValueError, match="not available"):
            env.resolve_device("cuda")
    assert env.supported_dtypes("cpu")[0] == "float32" and "float64" not in env.supported_dtypes("mps")
    info = env.device_info("cpu")
    assert set(info) == {"name", "total_memory_bytes", "free_memory_bytes", "threads", "dtypes"}
    assert 0 < info["free_memory_bytes"] <= info["total_memory_bytes"]
    stamp = env.environment("cpu", "float32", 2)
    assert {"torch", "python", "os", "device_name", "total_memory_bytes", "threads", "dtype", "timestamp"} <= set(stamp)
    assert stamp["threads"] == 2 and not any("host" in key for key in stamp)


def test_a_first_product_that_loads_the_library_does_not_end_the_matmul_doubling(monkeypatch):
    """A fresh CUDA context's first product took ≥ 50 ms, so m stayed 256, where launches dominate: here a first call
    of 1 s, then 20 µs a product plus 1 TFLOP/s, must still read near 1 TFLOP/s (m = 1024), not 0.63 (m = 256)."""
    calls_seen = []

    def timer(device):
        def timed(thunk, calls):
            m = thunk().shape[0]
            calls_seen.append(m)
            return 1.0 if len(calls_seen) == 1 else calls * (20e-6 + 2 * m ** 3 / 1e12)
        return timed

    monkeypatch.setattr(env, "device_timer", timer)
    gflops, _ = env.measure_matmul("cpu", "float32")
    assert max(calls_seen) == 1024 and gflops > 950


def test_matmul_throughput_is_measured_once_and_cached():
    first = env.matmul_gflops("cpu", "float32")
    assert first > 0 and env.matmul_gflops("cpu", "float32") == first


@pytest.mark.parametrize("value, retakes", [("0", False), (" 0\n", False), ("Off", False), ("no", False),
                                            ("1", True), ("", True), ("yes", True)])
def test_retakes_off_keep_every_sample_as_measured_and_never_wait_for_quiet(monkeypatch, value, retakes):
    """ATTN_LAB_RETAKES=0: the same disturbed samples are kept, none set aside, no wait for quiet, and after a page's
    hold no quiet moment is waited for either; the point ends at min_repeats and says it is disturbed."""
    monkeypatch.setenv(loop.RETAKES, value)
    waits = []
    monkeypatch.setattr(loop, "wait_for_quiet", lambda *args: waits.append(args))
    held = iter([False, True, True, True, True, True, True, True] + [True] * 100)  # the page holds the first claim
    timing = time_samples(lambda: None, "cpu", Settings(warmup=1, min_repeats=3, min_time_s=0.0),
                          probe=FakeProbe([True] * 100), turns=loop.Turns(lambda: next(held)))
    assert timing.disturbed
    if retakes:
        assert timing.retaken == loop.MAX_RETAKES and waits
    else:
        assert (timing.retaken, len(timing.samples), waits) == (0, 3, [])


def test_a_retakes_value_that_means_neither_is_refused_with_a_sentence(monkeypatch):
    monkeypatch.setenv(loop.RETAKES, "sometimes")
    with pytest.raises(ValueError, match="ATTN_LAB_RETAKES must be 0 .* or 1 .*, got 'sometimes'; set it"):
        time_samples(lambda: None, "cpu", Settings(warmup=1, min_repeats=1, min_time_s=0.0), probe=FakeProbe([]))


def test_cpu_peak_counts_buffers_an_op_allocates_and_frees_itself():
    """sdpa allocates its log-sum-exp and per-thread scratch inside one op and frees them before it returns: the
    engine's reading must see them, as the allocator's own records (tests.baselines.trace_peak_bytes) do."""
    from tests.baselines import trace_peak_bytes

    q, k, v = (torch.randn(1, 5, 1000, 24) for _ in range(3))
    call = lambda: ac.attention("sdpa", q, k, v)  # noqa: E731
    with torch.inference_mode():
        call()
        engine = env.peak_memory_probe("cpu")[1](call)
        assert engine == trace_peak_bytes(call) > q.numel() * 4  # more than the output alone


def test_no_timed_sample_starts_while_the_page_holds_the_worker(monkeypatch, retaking):
    """The hold (a page drawing) lifts 0.15 s in, on the loop's clock (FakeClock: it moves as the loop waits): every
    call after the warm-up comes after it, each sample is released when it ends, and the wait, longer than the
    point's 0.1 s budget, does not eat it (its samples are still taken)."""
    monkeypatch.setattr(loop, "wait_for_quiet", lambda *args: None)
    clock, lifted = FakeClock(), 0.15
    monkeypatch.setattr(loop, "time", clock)
    calls, claims, releases = [], [], []
    turns = loop.Turns(lambda: claims.append(1) or clock.now >= lifted, lambda: releases.append(1))
    timing = time_samples(lambda: calls.append(clock.now), "cpu",
                          Settings(warmup=1, min_repeats=3, min_time_s=0.0, point_budget_s=0.1), probe=FakeProbe([]),
                          turns=turns)
    assert calls[0] < lifted <= min(calls[1:])  # the warm-up ran under the hold, no timed call did
    assert len(timing.samples) >= 3 and len(claims) > len(timing.samples) and len(releases) >= len(timing.samples)
    assert timing.waited_s >= lifted


def test_a_hold_is_bounded_so_a_page_that_never_lets_go_cannot_stall_a_sweep(monkeypatch, retaking):
    """A page that never lets go: the sample waits HOLD_MAX_S on the loop's clock, asking every QUIET_STEP_S / 5,
    then goes on."""
    clock, claims = FakeClock(), []
    monkeypatch.setattr(loop, "time", clock)
    waited = loop.take_turn(FakeProbe([]), 1, False, loop.Turns(lambda: claims.append(clock.now) or False),
                            lambda: False)
    step = loop.QUIET_STEP_S / 5
    assert loop.HOLD_MAX_S <= waited < loop.HOLD_MAX_S + step and waited == clock.now
    assert abs(len(claims) - loop.HOLD_MAX_S / step) <= 1


def test_worker_hold_reaches_the_worker_waits_for_its_sample_and_lapses():
    from attn_core.engine import worker

    w = worker.prestart()
    w.in_sample.value = 1  # as if a sample were in flight: hold(True) waits for it, PARK_WAIT_S at most
    began, wall = time.monotonic(), time.time()
    worker.hold(True)
    waited, after = time.monotonic() - began, time.time()
    assert waited >= worker.PARK_WAIT_S * 0.999  # it waited its full bound for the sample that never ended
    assert wall + worker.HOLD_S <= w.held_until.value <= after + worker.HOLD_S  # set during the call; lapses alone
    w.in_sample.value = 0
    worker.hold(False)
    assert w.held_until.value == 0.0
    turns = worker._turns(w.held_until, w.in_sample)  # the worker's side, on the same shared values
    assert turns.claim() and w.in_sample.value == 1
    turns.release()
    worker.hold(True)
    assert not turns.claim() and w.in_sample.value == 0
    worker.hold(False)


def test_others_runnable_sees_a_busy_neighbour_that_cpu_times_are_too_coarse_for():
    """A neighbour that says it is spinning before the probe looks: it is runnable throughout (other programs only
    add to the count)."""
    probe = env.ContentionProbe()
    spinner = subprocess.Popen([sys.executable, "-c", "print('spinning', flush=True)\nwhile True: pass"],
                               stdout=subprocess.PIPE, text=True)
    try:
        assert spinner.stdout.readline() == "spinning\n"
        seen = probe.others_runnable(0.1)
        assert seen is None or seen >= 0.5  # None off Linux: CPU times are used there
    finally:
        spinner.kill()
        spinner.wait()


def test_steady_allocator_reuses_every_block_once_warm_whatever_ran_before():
    """Under env.steady_allocator (the worker's), a tensor made again costs no page faults once warm, 8 MiB or 64 MiB
    (past glibc's 32 MiB mmap threshold, where it came fresh or not by what the heap held); after the heap is
    trimmed (release_cached_memory, between points) the first call pays them again. The heap settles within a few
    calls: a small request can split a freed block while a live one lies above it, so that the second or third call
    pays for part of its block once more (seen in about half the runs, never in two calls of one run, never after
    the third), so the median call pays nothing. The default allocator, in a process of its own, faults a 64 MiB
    block in on every call."""
    code = """
import resource, statistics, sys, torch
from attn_core.engine import env
def faults(mib, calls):  # page faults of each call, as a share of the block's pages
    shares = []
    for _ in range(calls):
        before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
        torch.ones(mib * 2**18)
        shares.append((resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before) / (mib * 256))
    return shares
if sys.argv[1] == "default":
    shares = faults(64, 11)[1:]
    assert statistics.median(shares) > 0.9, shares
    raise SystemExit
env.steady_allocator()
assert env.allocator_note().startswith("glibc, mmap off"), env.allocator_note()
def settled(shares):
    return statistics.median(shares) < 0.05 and max(shares[4:]) < 0.05
for mib in (8, 64):
    shares = faults(mib, 12)
    assert settled(shares), (mib, shares)
env.release_cached_memory("cpu")
shares = faults(64, 12)
assert shares[0] > 0.9 and settled(shares), shares
"""
    if not sys.platform.startswith("linux"):
        pytest.skip("glibc's allocator")
    root = os.path.dirname(os.path.dirname(os.path.dirname(__file__)))
    for mode in ("default", "steady"):
        subprocess.run([sys.executable, "-c", code, mode], check=True, cwd=root)


def test_a_case_is_checked_once_before_it_is_measured_and_never_inside_a_timed_call(monkeypatch):
    from attn_core.mechanisms import _common

    checks = []
    real = _common.check_qkv
    monkeypatch.setattr(_common, "check_qkv", lambda *a: checks.append(1) or real(*a))
    row, _ = measure_case(ac.get("softmax"), case(), QUICK)
    assert row["status"] == "ok" and row["repeats"] >= 3 and len(checks) == 1
    q = k = v = torch.randn(1, 1, 4, 2)
    with _common.validated():  # trusted inside: the engine checked before
        assert _common.checked_shape(ac.get("softmax"), q, k, v, "no") == ac.Shape(1, 1, 4, 4, 2, causal=True)
    with pytest.raises(ValueError, match="causal must be True or False"):
        _common.checked_shape(ac.get("softmax"), q, k, v, "no")


@pytest.mark.parametrize("key", ["local", "sliding_window"])
def test_a_band_s_first_point_in_a_process_measures_its_steady_peak_not_the_bias_it_keeps(key):
    """A band's first call builds the (block, S) bias every later call reuses (`_banded.window_bias`, kept): the
    point's peak is a steady call's, which the spec predicts to the byte (5% above it when the first call's
    allocation was taken)."""
    from attn_core.mechanisms import _banded

    _banded.window_bias.cache_clear()
    problem = Problem(mechanism=key, n=1024, heads=8, d_model=512, causal=True)
    row = measure.measure(ac.get(key), problem, QUICK, wall_s=0.0)[0].to_row()
    assert row["status"] == "ok" and row["peak_bytes"] == row["predicted_bytes"]
