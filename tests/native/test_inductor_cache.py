"""Where torch's Inductor keeps what it compiles for Flex (attn_core/native/cache.py: inductor_folder): in our
per-user cache, checked as our kernels' folder is, never torch's default in the shared temporary folder, which
another user can make first; a folder the user named is kept. (tests/mechanisms/test_flex.py: a compile of Flex goes
there and builds no precompiled header.)"""
from __future__ import annotations

import os
import stat

import pytest

from attn_core import native
from attn_core.mechanisms import flex
from attn_core.native import cache

OTHER = 65534  # another user: nobody


@pytest.fixture
def cache_root(tmp_path, monkeypatch):
    """No Inductor folder named by us yet, the variable holding torch's default (torch writes it there once it has
    run), the per-user cache under tmp_path/cache (made 0700)."""
    from torch._inductor.runtime.cache_dir_utils import default_cache_dir

    monkeypatch.setattr(cache, "_inductor", [])
    monkeypatch.setattr(cache, "_private", [])
    monkeypatch.setenv(native.CACHE, str(tmp_path / "cache"))
    monkeypatch.setenv(cache.INDUCTOR, default_cache_dir())
    (tmp_path / "cache").mkdir(mode=0o700)
    return tmp_path / "cache"


def private_to_this_user(folder) -> bool:
    st = folder.stat()
    return stat.S_IMODE(st.st_mode) == 0o700 and st.st_uid == os.geteuid()


def test_inductor_compiles_into_our_cache_not_the_shared_temporary_folder(cache_root):
    folder = cache.inductor_folder()
    assert folder == cache_root / "inductor" and os.environ[cache.INDUCTOR] == str(folder)
    assert private_to_this_user(folder)
    assert cache.inductor_folder() == folder and cache._private == []


def test_flex_compiles_with_our_folder_and_without_precompiled_headers(cache_root, monkeypatch):
    import torch._inductor.config as inductor

    monkeypatch.setattr(inductor, "cpp_cache_precompile_headers", True)  # torch's default, put back after
    monkeypatch.setattr(flex, "_COMPILED", {})  # Flex not compiled yet in this process
    flex._compiled(dynamic=True)
    assert os.environ[cache.INDUCTOR] == str(cache_root / "inductor")
    assert inductor.cpp_cache_precompile_headers is False


def test_a_folder_the_user_named_is_kept(cache_root, tmp_path, monkeypatch):
    monkeypatch.setenv(cache.INDUCTOR, str(tmp_path / "mine"))
    assert cache.inductor_folder() == tmp_path / "mine"
    assert os.environ[cache.INDUCTOR] == str(tmp_path / "mine") and not (cache_root / "inductor").exists()


@pytest.mark.parametrize("case", ["others can write the folder", "others can write its parent",
                                  "another user owns the folder", "the folder a symbolic link"])
def test_an_unsafe_cache_sends_inductor_to_the_process_s_private_folder(case, cache_root, tmp_path):
    """Inductor opens what it loads by path: a folder another user owns or can write, or can replace (its parent
    writable by others, not sticky), is refused, and the compile goes to a folder of the process's own."""
    folder = cache_root / "inductor"
    if case == "the folder a symbolic link":
        (tmp_path / "elsewhere").mkdir(mode=0o700)
        folder.symlink_to(tmp_path / "elsewhere", target_is_directory=True)
    else:
        folder.mkdir(mode=0o700)
    if case == "others can write the folder":
        os.chmod(folder, 0o777)
    elif case == "others can write its parent":
        os.chmod(cache_root, 0o777)
    elif case == "another user owns the folder":
        if os.geteuid() != 0:
            pytest.skip("giving a folder to another user (os.chown) needs root")
        os.chown(folder, OTHER, OTHER)
    chosen = cache.inductor_folder()
    assert chosen == cache._private[0] / "inductor" and os.environ[cache.INDUCTOR] == str(chosen)
    assert private_to_this_user(chosen) and private_to_this_user(cache._private[0])


def test_a_sticky_parent_others_can_write_is_kept_as_the_temporary_folder_is(cache_root):
    """A sticky folder (as /tmp is) lets no other user rename or remove what this user made in it."""
    os.chmod(cache_root, 0o1777)
    assert cache.inductor_folder() == cache_root / "inductor" and cache._private == []
