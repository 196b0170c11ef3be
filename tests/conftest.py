"""Fixtures every test shares: the run store kept in a private folder, never the user's own."""
from __future__ import annotations

import pytest

from attn_core import native, store


@pytest.fixture(autouse=True, scope="session")
def private_run_store(tmp_path_factory):
    """ATTN_LAB_HOME set to a temporary folder for the whole session, so that sweeps (and the worker and CLI
    processes the tests start, which inherit it) keep their runs there; ATTN_LAB_CACHE too, for the C++ kernels
    the session builds."""
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv(store.HOME_VARIABLE, str(tmp_path_factory.mktemp("attention-lab-home")))
        mp.setenv(native.CACHE, str(tmp_path_factory.mktemp("attention-lab-cache")))
        yield
