"""Fixtures every test shares: the run store kept in a private folder, never the user's own; one torch thread a
process."""
from __future__ import annotations

import os

# One thread a process, this one and every process the tests start (the measuring worker, the dashboard's server, the
# CLI), set before torch is imported. The suite must pass in minutes on two cores with one of them kept busy, as a
# laptop is; there a two-thread parallel region waits for the busy core's time slice at every operation, and
# tests/contract took 466 s instead of 83 (with one thread: 104 s for its three slowest tests, 223 s before). Tests
# of the thread choices set the threads they need themselves; the benchmark scripts, not the tests, measure speed.
os.environ["OMP_NUM_THREADS"] = "1"

import pytest  # noqa: E402
import torch  # noqa: E402

from attn_core import native  # noqa: E402
from attn_core.engine import store


torch.set_num_threads(1)  # where torch was imported before this file (a plugin): the variable came too late


@pytest.fixture(autouse=True, scope="session")
def private_run_store(tmp_path_factory):
    """ATTN_LAB_HOME set to a temporary folder for the whole session, so that sweeps (and the worker and CLI
    processes the tests start, which inherit it) keep their runs there; ATTN_LAB_CACHE too, for the C++ kernels
    the session builds. The kernels are built once here, as the dashboard's start and `native build` do (a forward
    call never builds), so every test sees the form a user would; where they cannot be built, the torch forms run
    and the kernels' own tests skip with the reason."""
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv(store.HOME_VARIABLE, str(tmp_path_factory.mktemp("attention-lab-home")))
        cache = tmp_path_factory.mktemp("attention-lab-cache")
        cache.chmod(0o700)
        mp.setenv(native.CACHE, str(cache))
        try:
            native.build()
        except RuntimeError:
            pass
        yield
