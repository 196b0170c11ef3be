"""A rank's lifeline: a launcher killed outright (SIGKILL, the OOM killer) leaves no forkserver, rank or resource
tracker behind; the kernel's parent-death signal ends a rank whose parent ends, and where there is none the
launcher's pipe closing does (the rest of sequence parallelism: tests/studies/test_distributed.py)."""
from __future__ import annotations

import contextlib
import os
import select
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest
import torch.distributed as dist

from attn_core.studies.parallel import rank
from tests.studies.test_distributed import launch_or_skip

pytestmark = pytest.mark.skipif(not (dist.is_available() and dist.is_gloo_available()),
                                reason="torch.distributed with the gloo backend is not in this torch build")

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module", autouse=True)
def launchable():
    """One tiny 2-rank gloo launch, probed once before any test of this file starts processes."""
    launch_or_skip()


# -- a launcher killed outright (SIGKILL, the OOM killer) leaves nothing behind --------------------------------------

WITHIN_S = 60.0  # a bound for a failure to show, not a measure: each wait ends as soon as its state is reached
LINUX = pytest.mark.skipif(not sys.platform.startswith("linux"),
                           reason="PR_SET_PDEATHSIG is Linux's (elsewhere the launcher's pipe alone tells a rank)")


def wait_for(what: str, reached, within_s: float = WITHIN_S):
    """Poll `reached()` until it returns something true, and return that; fail naming `what` past `within_s`."""
    end = time.monotonic() + within_s
    while not (got := reached()):
        if time.monotonic() > end:
            pytest.fail(f"{what}: not within {within_s:g} s")
        time.sleep(0.05)
    return got


def alive(process: psutil.Process) -> bool:
    """Running, and not a zombie (an orphan's reaper, a container's init, may never reap it)."""
    try:
        return process.status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


def in_group(process: psutil.Process) -> bool:
    """A rank that joined the process group: gloo's TCP connection to the other rank is established."""
    try:
        return any(c.status == psutil.CONN_ESTABLISHED for c in process.net_connections(kind="tcp"))
    except (psutil.NoSuchProcess, psutil.AccessDenied):
        return False


def first_line(process: subprocess.Popen, within_s: float = WITHIN_S) -> str:
    """The process's first line of output, waited for at most `within_s` ('' if none came)."""
    ready, _, _ = select.select([process.stdout], [], [], within_s)
    return process.stdout.readline().strip() if ready else ""


@contextlib.contextmanager
def killed_after(processes: list):
    """Whatever of `processes` (psutil) is still alive at the end is killed, so a failing test leaves none."""
    try:
        yield processes
    finally:
        for p in processes:
            with contextlib.suppress(psutil.NoSuchProcess):
                p.kill()


LAUNCHER = """
from attn_core.studies import parallel as D
said = []
def cancel():  # asked every 0.2 s once every rank has started: says so once, never cancels
    if not said:
        said.append(print("started", flush=True))
    return False
D.run("ring", n=64, memory=False, warmup=0, fail_rank=1, failure="stall", timeout_s=600, cancel=cancel)
"""


def test_a_launcher_killed_outright_takes_its_forkserver_and_ranks_with_it():
    """Mid-run (rank 1 stalled for ten timeouts of 600 s, rank 0 waiting on it) the launcher is SIGKILLed, so its
    `finally` never runs: the forkserver, both ranks and the resource tracker end with it, not at a timeout."""
    launcher = subprocess.Popen([sys.executable, "-c", LAUNCHER], stdout=subprocess.PIPE, text=True, cwd=ROOT)
    with killed_after([]) as left:
        try:
            assert first_line(launcher) == "started"
            tree = psutil.Process(launcher.pid)
            server = wait_for("the launcher's forkserver", lambda: next(
                (p for p in tree.children() if "forkserver" in " ".join(p.cmdline())), None))
            wait_for("two ranks in one process group", lambda: len(ranks := server.children()) == 2
                     and all(map(in_group, ranks)))
            left += tree.children(recursive=True)
        finally:
            launcher.kill()
            launcher.wait()
        assert len(left) == 4  # the forkserver, its two ranks and multiprocessing's resource tracker
        wait_for("every process below the killed launcher ending", lambda: not any(map(alive, left)))


ORPHAN = """
import os, subprocess, sys
child = subprocess.Popen([sys.executable, "-c", "import os, time; from attn_core.studies.parallel import rank as D; "
                          "D._die_with_parent(os.getppid()); print('ready', os.getpid(), flush=True); time.sleep(600)"])
child.wait()
"""


@LINUX
def test_the_kernel_ends_a_rank_whose_parent_ends():
    """The parent-death signal alone: a process that asked for it, its parent SIGKILLed (the forkserver, for a
    rank); nothing else watches the parent."""
    parent = subprocess.Popen([sys.executable, "-c", ORPHAN], stdout=subprocess.PIPE, text=True, cwd=ROOT)
    with killed_after([]) as left:
        try:
            said = first_line(parent).split()
            assert said[:1] == ["ready"], said
            left.append(psutil.Process(int(said[1])))
        finally:
            parent.kill()
            parent.wait()
        wait_for("the child of the killed parent ending", lambda: not alive(left[0]))


@LINUX
def test_a_rank_whose_parent_ended_before_it_asked_ends_at_once():
    """A parent gone before the request was in place cannot signal: the rank sees another parent and ends."""
    script = "import os, sys; from attn_core.studies.parallel import rank as D; D._die_with_parent({}); print('alive')"
    gone = subprocess.run([sys.executable, "-c", script.format("os.getppid() + 1")], capture_output=True, text=True,
                          cwd=ROOT)
    assert gone.returncode == rank.ORPHANED and gone.stdout == "", gone.stderr
    here = subprocess.run([sys.executable, "-c", script.format("os.getppid()")], capture_output=True, text=True,
                          cwd=ROOT)
    assert here.returncode == 0 and here.stdout == "alive\n", here.stderr


def watching_rank() -> None:
    """A rank's lifeline without the kernel's signal, as where there is none: the launcher's pipe alone."""
    rank._die_with_parent = lambda parent: None
    rank._lifeline(os.getppid())
    print("ready", os.getpid(), flush=True)
    time.sleep(600)


SPAWNER = """
import multiprocessing
from tests.studies.test_distributed_lifeline import watching_rank
if __name__ == "__main__":
    child = multiprocessing.get_context("spawn").Process(target=watching_rank)
    child.start()
    child.join()
"""


def test_a_rank_ends_when_the_launchers_pipe_closes():
    """The portable fallback: a spawned rank whose launcher is SIGKILLed sees its pipe close, and ends."""
    launcher = subprocess.Popen([sys.executable, "-c", SPAWNER], stdout=subprocess.PIPE, text=True, cwd=ROOT)
    with killed_after([]) as left:
        try:
            said = first_line(launcher).split()
            assert said[:1] == ["ready"], said
            left.append(psutil.Process(int(said[1])))
        finally:
            launcher.kill()
            launcher.wait()
        wait_for("the rank of the killed launcher ending", lambda: not alive(left[0]))

