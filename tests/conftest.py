"""Fixtures every test shares: the run store kept in a private folder, never the user's own."""
from __future__ import annotations

import pytest

from attn_core import native
from attn_core.engine import store


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
