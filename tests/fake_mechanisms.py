"""Test doubles for the engine: mechanisms that misbehave on purpose, and a private sweep lock. The worker imports
the mechanisms through the `extra_mechanisms` reference "tests.fake_mechanisms:FAKES", the same door a user's own
mechanism comes through."""
from __future__ import annotations

import functools
import os
import signal
import tempfile
import time
from pathlib import Path

import pytest
import torch

from attn_core.engine import job as sweep_module
from attn_core.spec import Cost, MechanismSpec, Shape, Supports

REF = "tests.fake_mechanisms:FAKES"


def raises(q, k, v, *, causal=False):
    raise RuntimeError("deliberate failure for the tests")


def fake_oom(q, k, v, *, causal=False):
    raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 34.00 GiB (a fake, for the tests)")


def exits(q, k, v, *, causal=False):
    os._exit(3)  # the worker dies without a word, like a crash in native code


def sigkill(q, k, v, *, causal=False):
    os.kill(os.getpid(), signal.SIGKILL)  # what the kernel's out-of-memory killer does


def slow(q, k, v, *, causal=False):
    """Sleeps n/1000 s per call: n = 64 takes 64 ms, n = 256 a quarter of a second."""
    time.sleep(q.shape[-2] / 1000)
    return v.clone()


def hangs_started(caller: int) -> Path:
    """The file `hangs` makes as its call begins, named by the pid of the process that started the measuring worker
    (its parent): a test that means to cancel the call itself, not the point before it, waits for it."""
    return Path(tempfile.gettempdir()) / f"attn-lab-test-hangs-{caller}"


def hangs(q, k, v, *, causal=False):
    hangs_started(os.getppid()).touch()
    time.sleep(600)  # only a kill stops it
    return v.clone()


def _flops(s: Shape) -> float:
    return 4.0 * s.bh * s.Nq * s.Nk * s.D


def _memory(s: Shape) -> float:
    return s.output_bytes


def _spec(key: str, fn) -> MechanismSpec:
    return MechanismSpec(key=key, label=f"Fake ({key})", fn=fn, description="misbehaves for the tests", paper="none",
                         params=(), exact=False, supports=Supports(causal=True, cross=True),
                         cost=Cost(flops=_flops, memory_bytes=_memory, time_big_o="O(n²·d)", memory_big_o="O(n·d)"))


FAKES = {s.key: s for s in (_spec("raises", raises), _spec("fake_oom", fake_oom), _spec("exits", exits),
                            _spec("sigkill", sigkill), _spec("slow", slow), _spec("hangs", hangs))}


@pytest.fixture(autouse=True, scope="module")
def private_sweep_lock(tmp_path_factory):
    """The machine's lock on a private path (import this into a test module to use it): a sweep running elsewhere
    on this machine must not make the tests wait, and the tests' own lock checks still see a real flock."""
    path = str(tmp_path_factory.mktemp("lock") / "sweep.lock")
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(sweep_module, "sweep_lock", functools.partial(sweep_module.sweep_lock, path=path))
        yield
