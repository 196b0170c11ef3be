"""The C++ kernels' cache (attn_core/native/cache.py) against another user: a library planted where the loader looks,
whose constructor would leave a marker file if it ever ran, is never loaded, and the refusal says why (a folder or
file owned by another user or writable by others, a symbolic link); where no safe cache exists the build goes to a
private folder of the process (mode 0700), never a shared temporary one. And the build's compiler runs in a session
of its own, killed whole at its time limit. Owners are changed with os.chown to uid 65534 (nobody), which needs root
(as the tests run here and in CI)."""
from __future__ import annotations

import os
import shutil
import stat
import subprocess
import tempfile
import time
from pathlib import Path

import pytest
import torch

from attn_core import native
from attn_core.native import cache, loader, toolchain
from tests.native.test_native import stable_top

OTHER = 65534  # another user: nobody
PLANTED = ('#include <cstdio>\n__attribute__((constructor)) static void planted() {\n'
           '  if (FILE* f = std::fopen(MARKER, "w")) { std::fputs("ran", f); std::fclose(f); }\n}\n')


def needs_compiler() -> str:
    cxx = native.compiler()
    if cxx is None:
        pytest.skip("no C++ compiler here (set CXX to one) to build a planted library with")
    return cxx


def needs_root() -> None:
    if os.geteuid() != 0:
        pytest.skip("giving a file to another user (os.chown) needs root")


def plant(path: Path, marker: Path) -> None:
    """A library at `path` whose constructor writes `marker` when it is loaded."""
    done = subprocess.run([native.compiler(), "-shared", "-fPIC", f'-DMARKER="{marker}"', "-x", "c++", "-", "-o",
                           str(path)], input=PLANTED, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr


@pytest.fixture
def compiled_once(monkeypatch):
    """The build's compiler step answered by a copy of the library this session built already under the same name
    (the name a hash of the sources, declarations, compiler, flags and CPU: the same inputs), placed as the compiler
    step places its own (mode 0755, renamed into the target); a name the session has not built is compiled. These
    tests check where a build goes and what is loaded; a compile each was 4 s quiet, 35 s of the suite's CPU.
    (tests/native/test_native.py's kept-build test and the session's own build run the compiler.)"""
    built, compile_ = cache.cache_dir(), toolchain._compile

    def copied(cxx, flags, target, seconds=toolchain.BUILD_SECONDS):
        if not (built / target.name).is_file():
            return compile_(cxx, flags, target, seconds)
        part = target.parent / f".copy-{os.getpid()}-{target.name}"
        shutil.copyfile(built / target.name, part)
        os.chmod(part, 0o755)
        os.replace(part, target)
        return None

    monkeypatch.setattr(toolchain, "_compile", copied)


@pytest.fixture
def fresh(tmp_path, monkeypatch, compiled_once):
    """This process with no library loaded, no private folder made, and the cache under tmp_path/cache/native (the
    state put back after)."""
    monkeypatch.setattr(loader, "_loaded", {})
    monkeypatch.setattr(cache, "_private", [])
    monkeypatch.setenv(native.CACHE, str(tmp_path / "cache"))
    return tmp_path / "cache" / "native"


def test_the_planted_library_runs_when_loaded(tmp_path):
    """The check's own check: loading the planted library does write its marker (so a missing marker below means it
    was never loaded)."""
    needs_compiler()
    marker = tmp_path / "ran"
    plant(tmp_path / "planted.so", marker)
    subprocess.run(["python3", "-c", f"import ctypes; ctypes.CDLL({str(tmp_path / 'planted.so')!r})"], check=True)
    assert marker.read_text() == "ran"


def arrange(case: str, folder: Path, marker: Path, names: list[str]) -> None:
    """The cache folder and, under each library name the loader looks for, a planted library, as `case` says."""
    elsewhere = folder.parent.parent / "elsewhere"
    elsewhere.mkdir(mode=0o700)
    plant(elsewhere / "planted.so", marker)
    if case == "the folder a symbolic link":  # to a folder of this user's holding the planted library
        for name in names:
            os.link(elsewhere / "planted.so", elsewhere / name)
        folder.parent.mkdir()
        folder.symlink_to(elsewhere, target_is_directory=True)
        return
    folder.mkdir(parents=True, mode=0o700)
    for name in names:
        if case == "the library a symbolic link":
            (folder / name).symlink_to(elsewhere / "planted.so")
            continue
        (folder / name).write_bytes((elsewhere / "planted.so").read_bytes())
        if case == "a library others can write":
            os.chmod(folder / name, 0o757)
        elif case != "a library of ours in a folder others can write":
            os.chown(folder / name, OTHER, OTHER)
    if case.startswith("a world-writable folder"):
        os.chmod(folder, 0o1777 if "sticky" in case else 0o777)
    if case == "a world-writable folder of another user's":
        os.chown(folder, OTHER, OTHER)
    if case == "a group-writable folder":
        os.chmod(folder, 0o770)
    if case == "a library of ours in a folder others can write":
        os.chmod(folder, 0o777)


CASES = {  # the case: what the refusal says; whether the whole folder is refused (the build then goes elsewhere)
    "a world-writable folder of another user's": ("is owned by uid 65534", True),
    "a world-writable folder, sticky": ("can be written by other users (mode 1777", True),
    "a group-writable folder": ("can be written by other users (mode 0770", True),
    "the folder a symbolic link": ("is a symbolic link", True),
    "a library of ours in a folder others can write": ("can be written by other users (mode 0777", True),
    "a library of another user's": ("is owned by uid 65534", False),
    "a library others can write": ("can be written by other users (mode 0757", False),
    "the library a symbolic link": ("is a symbolic link", False),
}


@pytest.mark.parametrize("case", list(CASES))
def test_a_planted_library_is_never_loaded(case, fresh, tmp_path):
    """A library planted under every name the loader looks for: a forward call's lookup refuses it with the reason
    and runs the torch form; `build` then builds the kernels where it is safe (a folder that is refused: a private
    folder of the process, mode 0700, not the shared temporary folder; a file that is refused, in a folder that is
    not: replaced by a build of our own) and they answer; the planted constructor never ran."""
    cxx = needs_compiler()
    needs_root()
    why, whole_folder = CASES[case]
    marker = tmp_path / "planted-code-ran"
    arrange(case, fresh, marker, [name for _, name in native.targets(cxx)])
    assert native.library() is None
    said = native.describe()
    assert said.startswith("torch ops: ") and why in said, said
    assert ("cache folder" if whole_folder else "library") in said
    assert native.build().startswith("C++ (")
    said = native.describe()
    if whole_folder:
        private = cache._private[0]
        assert "built for this process only, as no cache is safe" in said and why in said
        assert private.parent == Path(tempfile.gettempdir()) and private.name.startswith("attention-lab-native-")
        st = private.stat()
        assert stat.S_IMODE(st.st_mode) == 0o700 and st.st_uid == os.geteuid()
    else:
        assert "built for this process only" not in said
        first = fresh / native.targets(cxx)[0][1]  # the first try's, built: the planted file replaced
        assert not first.is_symlink() and first.stat().st_uid == os.geteuid()
    scores = torch.randn(2, 400, generator=torch.Generator().manual_seed(1))
    assert torch.equal(native.select(scores, 30)[0], stable_top(scores, 30)[0])
    assert not marker.exists()


def test_with_no_cache_to_make_the_build_goes_to_a_private_folder(tmp_path, monkeypatch, compiled_once):
    """No $ATTN_LAB_CACHE and a cache home that cannot hold a folder (here a file; a read-only home, a service
    account): the build goes to a folder made for this process (mkdtemp, mode 0700, ours), never to a shared
    attention-lab folder in the temporary directory, and `describe` says so."""
    needs_compiler()
    monkeypatch.setattr(loader, "_loaded", {})
    monkeypatch.setattr(cache, "_private", [])
    monkeypatch.delenv(native.CACHE, raising=False)
    (tmp_path / "not-a-folder").write_text("")
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "not-a-folder"))
    shared = Path(tempfile.gettempdir()) / "attention-lab"
    before = shared.exists()
    assert native.library() is None and native.describe().startswith("torch ops: not built")
    said = native.build()
    assert "built for this process only, as no cache is safe" in said
    private = cache._private[0]
    st = private.stat()
    assert stat.S_IMODE(st.st_mode) == 0o700 and st.st_uid == os.geteuid()
    assert [p.name for p in private.iterdir()] == [native.targets(native.compiler())[0][1]]
    assert shared.exists() == before


def alive(pid: int) -> bool:
    """Whether process `pid` runs (a zombie, killed and waiting to be reaped by whoever adopted it, does not)."""
    try:
        with open(f"/proc/{pid}/stat", encoding="utf-8") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


def test_a_compiler_past_its_time_limit_is_killed_with_its_children(tmp_path, monkeypatch):
    """A compiler (here a script named by $CXX) that starts a child and then hangs: at the time limit the whole
    session is killed, the child with it, and `build` refuses with a sentence saying the compiler was stopped."""
    if not Path("/proc/self/stat").exists():
        pytest.skip("telling whether a process runs needs /proc")
    pids = tmp_path / "children"
    script = tmp_path / "hanging-compiler"
    script.write_text('#!/bin/sh\nif [ "$1" = --version ]; then echo "hanging 1.0"; exit 0; fi\n'
                      f'sleep 600 &\necho $! >> "{pids}"\nsleep 600\n')
    script.chmod(0o755)
    monkeypatch.setattr(loader, "_loaded", {})
    monkeypatch.setattr(toolchain, "TRIES", ((),))
    monkeypatch.setenv(native.CACHE, str(tmp_path / "cache"))
    monkeypatch.setenv("CXX", str(script))
    with pytest.raises(RuntimeError, match="the compiler ran past 1 s and was stopped"):
        native.build(seconds=1)
    children = [int(line) for line in pids.read_text().split()]
    end = time.monotonic() + 30  # SIGKILL is delivered at once but a busy kernel may take a moment to end the child
    while any(alive(pid) for pid in children) and time.monotonic() < end:
        time.sleep(0.05)
    assert children and not any(alive(pid) for pid in children)
    assert not [p for p in (tmp_path / "cache").rglob("*") if p.is_file()]


@pytest.mark.parametrize("files", ["SOURCES", "HEADERS"])
def test_the_library_s_name_follows_every_source_and_the_shared_header(files, tmp_path, monkeypatch):
    """An edit to any file the build reads, the vector header the kernels include among them, names a new library:
    with the header left out of the key, an edited header would load the library built before it, whose
    declarations (and so its checked hash) are the same."""
    cxx = native.compiler() or "c++"
    before = [name for _, name in native.targets(cxx)]
    for i, path in enumerate(getattr(toolchain, files)):
        edited = tmp_path / f"{i}-{path.name}"
        edited.write_bytes(path.read_bytes() + b"\n// edited\n")
        listed = list(getattr(toolchain, files))
        listed[i] = edited
        with monkeypatch.context() as m:
            m.setattr(toolchain, files, tuple(listed))
            after = [name for _, name in native.targets(cxx)]
        assert all(a != b for a, b in zip(before, after)), path.name
    assert [name for _, name in native.targets(cxx)] == before  # and back, the files as they are
