"""One rank of a distributed run, in its own process: it joins the process group, runs and times each task's
scheme, reports its shard and counts to the launcher, and dies with the launcher (`_lifeline`)."""
from __future__ import annotations

import contextlib
import datetime
import os
import signal
import sys
import threading
import time
import traceback

import torch
import torch.distributed as dist

from attn_core.studies.parallel.schemes import Link, compute
from attn_core.studies.parallel.task import Task, inputs

PR_SET_PDEATHSIG = 1  # Linux's prctl option: a signal for this process when its parent ends (<linux/prctl.h>)
ORPHANED = 70  # the exit code of a rank that outlived its launcher (EX_SOFTWARE); nobody is left to read it


def worker(rank: int, tasks: tuple[Task, ...], procs: int, port: int, timeout_s: float, device: str,
           warmup: int, memory: bool, fail_rank: int | None, failure: str, results, parent: int) -> None:
    """One rank: join the group, run each task (after `warmup` untimed calls), report shards and counts. Ctrl-C
    and a hangup reach the whole process group: they are the launcher's to handle (it stops every rank). It dies
    with its parent process `parent` and with the launcher (`_lifeline`)."""
    _rank_start(parent)
    try:
        backend = "nccl" if device == "cuda" else "gloo"
        if device == "cuda":
            torch.cuda.set_device(rank % torch.cuda.device_count())
        timeout = datetime.timedelta(seconds=timeout_s)
        dist.init_process_group(backend, init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=procs,
                                timeout=timeout)
        torch.set_num_threads(max(1, (os.cpu_count() or 1) // procs))
        for index, task in enumerate(tasks):
            results.put(("done", rank, index, *_measured(task, rank, timeout, device, warmup, memory,
                                                       1 if rank == fail_rank else None, failure)))
        dist.barrier()
        dist.destroy_process_group()
    except BaseException as e:  # reported to the launcher, which ends the run with this sentence
        results.put(("error", rank, f"{type(e).__name__}: {str(e).strip().splitlines()[0] if str(e).strip() else ''}",
                     traceback.format_exc(limit=3)))
        raise SystemExit(1)


def _measured(task: Task, rank: int, timeout, device: str, warmup: int, memory: bool, die_at: int | None,
              failure: str):
    """One task on this rank: `warmup` untimed calls, one timed call (its bytes and waits counted), then its peak
    memory if asked: (shard as numpy, seconds, seconds waiting, peak bytes or None, bytes sent)."""
    from attn_core.engine.env import peak_memory_probe

    q, k, v = inputs(task, device)
    link = Link(rank, task.procs, timeout)
    for _ in range(warmup):
        compute(task, link, q, k, v)
    link = Link(rank, task.procs, timeout, die_at, failure)  # counts of the timed call only
    dist.barrier()
    start = time.perf_counter()
    out = compute(task, link, q, k, v)
    if device == "cuda":
        torch.cuda.synchronize()
    elapsed = time.perf_counter() - start
    peak = None
    if memory:
        dist.barrier()
        peak = peak_memory_probe(device)[1](lambda: compute(task, Link(rank, task.procs, timeout), q, k, v))
    return out.cpu().numpy(), elapsed, link.comm_s, peak, link.bytes_sent


def probe_worker(rank: int, procs: int, port: int, timeout_s: float, results, parent: int) -> None:
    """One bare rank of `check_launch`: join a gloo group on localhost and all-reduce a one, nothing else."""
    _rank_start(parent)
    try:
        dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=procs,
                                timeout=datetime.timedelta(seconds=timeout_s))
        one = torch.ones(1)
        dist.all_reduce(one)
        dist.destroy_process_group()
        results.put(("done", rank, float(one)))
    except BaseException as e:  # reported to check_launch, which raises it as a sentence
        results.put(("error", rank, f"{type(e).__name__}: {str(e).strip()[:200]}"))
        raise SystemExit(1)


def _rank_start(parent: int) -> None:
    """A rank's first act: its life tied to the launcher's (`_lifeline`), then Ctrl-C and hangups ignored: they reach
    the whole process group, but are the launcher's to handle (it stops every rank)."""
    _lifeline(parent)
    for name in ("SIGINT", "SIGHUP"):
        if hasattr(signal, name):
            signal.signal(getattr(signal, name), signal.SIG_IGN)


def _lifeline(parent: int) -> None:
    """Tie this rank's life to the launcher's, so that a launcher killed outright (SIGKILL, the OOM killer), whose
    `finally` never runs, leaves no rank behind holding its memory, nor the forkserver behind them: (1) the
    forkserver's 'alive' pipe, whose write end every client inherits, is closed here, so that the server ends as
    soon as the launcher does (it reads EOF once no process holds that end; a rank holding it kept the server
    alive as long as the rank); (2) on Linux the kernel kills this rank when its parent, the forkserver, ends
    (`_die_with_parent`); (3) everywhere, a thread watches the pipe the launcher holds open for this rank
    (multiprocessing's parent sentinel) and ends the process at its EOF: the launcher is gone."""
    from multiprocessing import parent_process

    server = getattr(sys.modules.get("multiprocessing.forkserver"), "_forkserver", None)  # a forkserver's child
    if server is not None and server._forkserver_alive_fd is not None:  # CPython's client state (private)
        with contextlib.suppress(OSError):
            os.close(server._forkserver_alive_fd)
        server._forkserver_alive_fd = None
    _die_with_parent(parent)
    launcher = parent_process()
    if launcher is not None and launcher.sentinel is not None:
        threading.Thread(target=_end_with, args=(launcher.sentinel,), daemon=True, name="launcher-watch").start()


def _end_with(sentinel) -> None:
    """Wait for the launcher's pipe to this rank to close (its end is held until the launcher ends), then end."""
    from multiprocessing import connection

    connection.wait([sentinel])
    os._exit(ORPHANED)


def _die_with_parent(parent: int) -> None:
    """Linux: ask the kernel for SIGKILL when the parent ends (prctl PR_SET_PDEATHSIG; the parent is the thread
    that forked this process: the forkserver's only thread, or the launch's, which waits for its ranks), then end
    at once if `parent` (0: unknown) has ended already, before the request was in place (this process was then
    handed to another). A no-op elsewhere, where the launcher's pipe alone tells."""
    if not sys.platform.startswith("linux"):
        return
    import ctypes

    prctl = ctypes.CDLL(None, use_errno=True).prctl
    prctl.argtypes, prctl.restype = [ctypes.c_int] + [ctypes.c_ulong] * 4, ctypes.c_int
    if prctl(PR_SET_PDEATHSIG, int(signal.SIGKILL), 0, 0, 0) == 0 and parent and os.getppid() != parent:
        os._exit(ORPHANED)
