"""Process launch of a distributed run: P worker processes on this machine (gloo on CPU, NCCL on CUDA with a GPU a
process), each a rank of one process group whose every collective carries a timeout, timed and counted in the rank.

It is guarded as a sweep is: a task refused with a sentence, one whose predicted memory would not fit skipped with
the reason, the machine's sweep lock held while it runs, and a stop (`cancel`, Ctrl-C, SIGTERM) that ends every rank
within seconds. A rank that dies or stalls ends the run with a `DistributedError`, and no process outlives the launch,
nor a launcher killed outright (SIGKILL, the OOM killer): its ranks and their forkserver end with it (`rank._lifeline`).
"""
from __future__ import annotations

import contextlib
import multiprocessing
import os
import queue
import signal
import socket
import threading
import time
from typing import Callable, Sequence

import torch
import torch.distributed as dist

from attn_core.engine.spawning import without_main
from attn_core.studies.parallel.cost import bytes_predicted, memory_guard
from attn_core.studies.parallel.rank import probe_worker, worker
from attn_core.studies.parallel.task import Result, Task, inputs, mechanism_state, positions

DEFAULT_TIMEOUT_S = 60.0
STOP_GRACE_S = 2.0  # a rank that has not ended this long after SIGTERM is killed


class DistributedError(RuntimeError):
    """A distributed run that could not finish: a rank died, raised or outlived the timeout, another sweep held the
    machine, or it was stopped (the sentence says which)."""


class Cancelled(DistributedError):
    """The run was stopped by its caller (`cancel`); every rank was ended."""


def run(scheme: str, mechanism: str = "softmax", procs: int = 2, n: int = 256, **kwargs) -> Result:
    """One distributed run (see `run_tasks`): Task(scheme, mechanism, procs, n, **task fields), and the launcher's
    options by name."""
    options = {key: kwargs.pop(key) for key in LAUNCH_OPTIONS if key in kwargs}
    params = tuple(sorted((kwargs.pop("params", None) or {}).items()))
    return run_tasks([Task(scheme, mechanism, procs, n, params=params, **kwargs)], **options)[0]


LAUNCH_OPTIONS = ("timeout_s", "device", "warmup", "memory", "cancel", "lock_wait_s", "memory_margin",
                  "memory_limit_bytes", "fail_rank", "failure")


def default_device(procs: int) -> str:
    """cuda (NCCL) where there is a GPU for each of the `procs` processes, else cpu (gloo)."""
    return "cuda" if torch.cuda.is_available() and torch.cuda.device_count() >= procs else "cpu"


def run_tasks(tasks: Sequence[Task], *, timeout_s: float = DEFAULT_TIMEOUT_S, device: str | None = None,
              warmup: int = 1, memory: bool = True, cancel: Callable[[], bool] | threading.Event | None = None,
              lock_wait_s: float | None = None, memory_margin: float = 0.2, memory_limit_bytes: int | None = None,
              fail_rank: int | None = None, failure: str = "exit") -> list[Result]:
    """Start P processes (one process group for all `tasks`, which share P), run each task on them and compare the
    gathered output with the single-process mechanism on the same seeded inputs; guarded as a sweep is.

    Guards, before anything starts: a task or option that cannot run is refused (ValueError, a sentence); a task
    whose predicted memory × (1 + memory_margin) exceeds the free memory (or `memory_limit_bytes`) comes back
    `skipped` with the reason (memory_guard); the machine's sweep lock is held while the ranks run (waiting up to
    `lock_wait_s`, default the sweep's, then DistributedError saying who holds it). `timeout_s` bounds every
    collective and the launch's wait for each result. Stop: `cancel()` (or a set Event) turning true, Ctrl-C or
    another exception in the caller ends every rank within seconds (Cancelled for `cancel`); every process is
    joined or killed before this returns or raises. `fail_rank` is a test hook: that rank exits abruptly at its
    first transfer of the timed call (`failure` "exit"), or stalls there, alive and silent ("stall")."""
    tasks, device = _checked(tasks, timeout_s, device, warmup, memory_margin, memory_limit_bytes, failure)
    procs = tasks[0].procs
    skipped = {i: why for i, t in enumerate(tasks)
               if (why := memory_guard(t, device, memory_margin, memory_limit_bytes))}
    runnable = [t for i, t in enumerate(tasks) if i not in skipped]
    stopped = cancel.is_set if isinstance(cancel, threading.Event) else cancel or (lambda: False)
    shards = (_locked(runnable, lock_wait_s, stopped, procs, timeout_s, device, warmup, memory, fail_rank, failure)
              if runnable else {})
    references: dict[Task, torch.Tensor] = {}  # a task repeated (timing rounds) is compared with one reference
    results, index = [], 0
    for i, task in enumerate(tasks):
        if i in skipped:
            results.append(_skipped(task, device, skipped[i]))
            continue
        results.append(_result(task, device, [shards[(r, index)] for r in range(procs)], references))
        index += 1
    return results


def _checked(tasks: Sequence[Task], timeout_s, device: str | None, warmup, memory_margin, memory_limit_bytes,
             failure: str) -> tuple[list[Task], str]:
    """(the tasks checked, the device resolved); ValueError with a sentence for a task or option that cannot run,
    DistributedError where this torch build lacks the backend."""
    tasks = [t.check() for t in tasks]
    if not tasks:
        raise ValueError("no task is given; give at least one")
    if failure not in ("exit", "stall"):
        raise ValueError(f"failure {failure!r}: the test hook's failures are 'exit' and 'stall'")
    if len({t.procs for t in tasks}) != 1:
        raise ValueError("tasks of one launch share their number of processes; launch each number apart")
    if not (isinstance(timeout_s, (int, float)) and 0 < timeout_s <= 86400):
        raise ValueError(f"timeout_s = {timeout_s!r}: give a number of seconds above 0 (at most a day)")
    if not (isinstance(warmup, int) and 0 <= warmup <= 100):
        raise ValueError(f"warmup = {warmup!r}: give 0 to 100 untimed calls")
    if not (isinstance(memory_margin, (int, float)) and 0 <= memory_margin <= 10):
        raise ValueError(f"memory_margin = {memory_margin!r}: give a fraction from 0 to 10 (0.2 = 20%)")
    if memory_limit_bytes is not None and not (isinstance(memory_limit_bytes, int) and memory_limit_bytes > 0):
        raise ValueError(f"memory_limit_bytes = {memory_limit_bytes!r}: give a positive number of bytes, or None")
    procs = tasks[0].procs
    device = device or default_device(procs)
    if device not in ("cpu", "cuda"):
        raise ValueError(f"device {device!r}: distributed runs take cpu (gloo) or cuda (NCCL)")
    if device == "cuda" and procs > torch.cuda.device_count():
        raise ValueError(f"NCCL takes one GPU a process: {procs} processes, {torch.cuda.device_count()} GPU(s) here; "
                         "give fewer processes or device='cpu' (gloo)")
    if not dist.is_available() or not (dist.is_nccl_available() if device == "cuda" else dist.is_gloo_available()):
        raise DistributedError(f"torch.distributed with the {'nccl' if device == 'cuda' else 'gloo'} backend is not "
                               "available in this torch build")
    return tasks, device


def check_launch(procs: int = 2, timeout_s: float = 20.0) -> None:
    """Start `procs` bare ranks (the launch's start method) that meet on localhost over gloo and all-reduce a one:
    returns when they did, raises DistributedError with the cause where this machine cannot (no loopback
    networking, no second process, no rendezvous within `timeout_s`). Runs none of the schemes; every rank ends."""
    try:
        port = free_port()
        ctx = _context()
        results = ctx.Queue()
    except OSError as e:
        raise DistributedError(f"{procs} processes cannot start and meet on localhost here ({e})") from None
    workers = [ctx.Process(target=probe_worker, args=(r, procs, port, timeout_s, results, _parent_of_ranks(ctx)),
                           daemon=True) for r in range(procs)]
    try:
        try:
            _start(workers)
        except OSError as e:
            raise DistributedError(f"{procs} processes cannot start here ({e})") from None
        sums = []
        for message in _messages(results, workers, procs, time.monotonic() + timeout_s + 30, timeout_s):
            if message[0] == "error":  # the start (imports), then the rendezvous
                raise DistributedError(f"rank {message[1]} could not join a gloo group on localhost: {message[2]}")
            sums.append(message[2])
        if sums != [float(procs)] * procs:
            raise DistributedError(f"the {procs} ranks' all-reduce of ones gave {sums}, not {procs}")
    finally:
        _stop(workers)
        results.close()


def free_port() -> int:
    """A TCP port free on localhost now (the OS picks it)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


# -- the launcher --------------------------------------------------------------------------------------------------

def _context():
    """forkserver where the platform has it: one server process imports torch and this module once (the preload)
    and every launch forks its ranks from it in milliseconds, where spawn has each rank import torch afresh
    (seconds, P at once on the same cores). spawn elsewhere (Windows). The server lives as long as the caller. It
    starts with Ctrl-C and hangups ignored (a disposition kept through exec, which Python honours): they reach the
    whole process group but are the launcher's to handle, and one during its seconds of imports would otherwise end
    it with a traceback."""
    if "forkserver" not in multiprocessing.get_all_start_methods():
        return torch.multiprocessing.get_context("spawn")
    from multiprocessing import forkserver

    ctx = torch.multiprocessing.get_context("forkserver")
    ctx.set_forkserver_preload([__name__])
    main = threading.current_thread() is threading.main_thread()  # elsewhere Python cannot set handlers
    quiet = [getattr(signal, name) for name in ("SIGINT", "SIGHUP") if hasattr(signal, name)] if main else []
    held = {signum: signal.signal(signum, signal.SIG_IGN) for signum in quiet}  # for the fork and exec alone
    try:
        with without_main():
            forkserver.ensure_running()
    finally:
        for signum, handler in held.items():
            signal.signal(signum, handler)
    return ctx


def _locked(tasks, lock_wait_s: float | None, stopped, *launch) -> dict:
    """`_launch(tasks, *launch, stopped)` with the machine's sweep lock held (waited for up to `lock_wait_s`, None:
    the sweep's wait); DistributedError saying who holds it, Cancelled for a stop before the ranks start."""
    from attn_core.engine.lock import LOCK_WAIT_S, SweepBusyError, SweepLockError, sweep_lock

    try:
        with sweep_lock(LOCK_WAIT_S if lock_wait_s is None else lock_wait_s, stopped):
            if stopped():
                raise Cancelled("the run was cancelled before it started")
            return _launch(tasks, *launch, stopped)
    except (SweepBusyError, SweepLockError) as e:
        if stopped():
            raise Cancelled("the run was cancelled while it waited for another sweep") from None
        raise DistributedError(f"{e} (a distributed run takes the machine as a sweep does)") from None


def _launch(tasks, procs, timeout_s, device, warmup, memory, fail_rank, failure, stopped) -> dict:
    """Start the ranks of `tasks` and collect each rank's (shard, seconds, waiting seconds, peak, bytes sent) by
    (rank, task index); every rank is ended before this returns or raises."""
    ctx = _context()
    results = ctx.Queue()
    port = free_port()
    workers = [ctx.Process(target=worker, args=(r, tuple(tasks), procs, port, timeout_s, device, warmup, memory,
                                                 fail_rank, failure, results, _parent_of_ranks(ctx)), daemon=True)
               for r in range(procs)]
    got: dict = {}
    try:
        _start(workers, stopped)
        deadline = time.monotonic() + timeout_s * (1 + len(tasks)) + 30  # the start (imports) and each task
        for message in _messages(results, workers, procs * len(tasks), deadline, timeout_s, stopped):
            if message[0] == "error":
                raise DistributedError(_failure(workers, message[1], message[2]))
            got[(message[1], message[2])] = message[3:]
        for w in workers:
            w.join(timeout_s)
            if w.exitcode not in (0, None):
                raise DistributedError(f"rank {workers.index(w)} ended with exit code {w.exitcode} after its work")
        return got
    finally:
        _stop(workers)
        results.close()


def _start(workers, stopped=lambda: False) -> None:
    """Start each worker, the caller's __main__ hidden and stops held meanwhile (`without_main`, `_stops_held`); none
    more once `stopped()`."""
    with without_main(), _stops_held():
        for w in workers:
            if stopped():
                break
            w.start()


def _messages(results, workers, count: int, deadline: float, timeout_s: float, stopped=lambda: False):
    """The ranks' first `count` messages as they arrive ("error" ones end the count: the caller raises), polled in
    turns of 0.2 s, between which a stop (`stopped()`: Cancelled), a rank found dead or the `deadline` passed
    (DistributedError) ends the wait."""
    received = 0
    while received < count:
        if stopped():
            raise Cancelled(f"the run was cancelled; its {len(workers)} processes were stopped")
        try:
            message = results.get(timeout=0.2)
        except queue.Empty:
            _check_alive(workers, deadline, timeout_s)
            continue
        received += 1
        yield message


def _parent_of_ranks(ctx) -> int:
    """The pid of the process the ranks of context `ctx` are forked from: the forkserver (`_context` started it),
    or this one (spawn); 0 where unknown, which a rank does not check."""
    if ctx.get_start_method() != "forkserver":
        return os.getpid()
    from multiprocessing import forkserver

    return forkserver._forkserver._forkserver_pid or 0  # CPython's one forkserver client (private, no accessor)


@contextlib.contextmanager
def _stops_held():
    """Ctrl-C, SIGTERM and hangups noted, not acted on, while the ranks start, then raised again once they have (to
    the handlers that were there): a stop that interrupted a start could leave a rank started but unrecorded, or a
    start request queued at the forkserver (the first launch waits there for its imports) to run on unstopped. A
    second stop acts at once (a start that never ends). In the main thread only, where Python runs its handlers."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    noted: list[int] = []

    def note(signum: int, frame) -> None:
        noted.append(signum)
        if len(noted) > 1:
            raise KeyboardInterrupt(signal.Signals(signum).name)

    held = [getattr(signal, name) for name in ("SIGINT", "SIGTERM", "SIGHUP") if hasattr(signal, name)]
    before = {signum: signal.signal(signum, note) for signum in held}
    try:
        yield
    finally:
        for signum, handler in before.items():
            signal.signal(signum, handler)
        if len(noted) == 1:
            signal.raise_signal(noted[0])


def _failure(workers, rank: int, text: str) -> str:
    """The sentence for rank `rank` raising `text`: a rank found dead within a second is named first, as the cause."""
    end = time.monotonic() + 1.0
    while time.monotonic() < end:
        dead = [r for r, w in enumerate(workers) if r != rank and w.exitcode not in (None, 0, 1)]
        if dead:
            return (f"rank {dead[0]} died (exit code {workers[dead[0]].exitcode}) mid-run, and rank {rank} then failed "
                    f"({text[:160]}); the run was stopped")
        time.sleep(0.05)
    return f"rank {rank} failed: {text[:300]}; the run was stopped"


def _check_alive(workers, deadline: float, timeout_s: float) -> None:
    for rank, w in enumerate(workers):
        if w.exitcode not in (None, 0):
            raise DistributedError(f"rank {rank} died (exit code {w.exitcode}) before it finished; the other ranks "
                                   "were stopped")
    if time.monotonic() > deadline:
        raise DistributedError(f"no result within the timeout ({timeout_s:g} s a collective); the ranks were stopped")


def _stop(workers) -> None:
    """Terminate (SIGTERM) every worker still alive, kill (SIGKILL) any left after STOP_GRACE_S, and reap them
    all: no stray process."""
    workers = [w for w in workers if w.pid is not None]  # started ones
    for w in workers:
        if w.is_alive():
            w.terminate()
    deadline = time.monotonic() + STOP_GRACE_S
    for w in workers:
        w.join(max(0.0, deadline - time.monotonic()))
    for w in workers:
        if w.is_alive():
            w.kill()
            w.join(5)


def _skipped(task: Task, device: str, reason: str) -> Result:
    from attn_core.engine.env import peak_memory_probe

    shape = (task.batch, task.heads, task.n, task.head_dim)
    return Result(task=task, backend="nccl" if device == "cuda" else "gloo", device=device, max_abs_diff=None,
                  time_s=(), comm_s=(), peak_bytes=(), memory_method=peak_memory_probe(device)[0], bytes_sent=(),
                  bytes_predicted=bytes_predicted(task.scheme, shape, task.procs, task.causal, task.elem,
                                                  task.mechanism), status="skipped", reason=reason)


def _result(task: Task, device: str, shards: list, references: dict) -> Result:
    from attn_core.api import attention
    from attn_core.engine.env import peak_memory_probe

    if task not in references:
        with torch.inference_mode():
            state = mechanism_state(task) if task.scheme == "state" else {}
            references[task] = attention(task.mechanism, *inputs(task), causal=task.causal, **dict(task.params),
                                         **state)
    reference = references[task]
    output = torch.empty_like(reference)
    for rank, (shard, *_rest) in enumerate(shards):
        output[:, :, positions(task, rank)] = torch.from_numpy(shard)
    shape = (task.batch, task.heads, task.n, task.head_dim)
    return Result(
        task=task, backend="nccl" if device == "cuda" else "gloo", device=device,
        max_abs_diff=float((output - reference).abs().max()),
        time_s=tuple(s[1] for s in shards), comm_s=tuple(s[2] for s in shards),
        peak_bytes=tuple(s[3] for s in shards), memory_method=peak_memory_probe(device)[0] + " (each rank)",
        bytes_sent=tuple(int(s[4]) for s in shards),
        bytes_predicted=bytes_predicted(task.scheme, shape, task.procs, task.causal, task.elem, task.mechanism),
        output=output)
