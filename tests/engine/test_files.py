"""Every file the product writes is written whole or not at all (`write_atomic`): a write that fails midway leaves
the file there before byte for byte, and no temporary file beside it."""
from __future__ import annotations

import errno
import os
import re
from pathlib import Path

import pytest

from attn_core.engine import files
from attn_core.engine.results import Run, frame_from_rows, load_run, save_run
from tests.engine.test_hardening_files import point

ROOT = Path(__file__).resolve().parent.parent.parent


def fail_midway(monkeypatch, folder: Path, after: int = 1) -> None:
    """os.write into a file in `folder` writes half its bytes `after` times, then raises ENOSPC (a full disk)."""
    real, calls = os.write, []

    def write(fd, data):
        if not os.readlink(f"/proc/self/fd/{fd}").startswith(str(folder)):
            return real(fd, data)
        calls.append(fd)
        if len(calls) > after:
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        return real(fd, bytes(data)[:max(1, len(data) // 2)])

    monkeypatch.setattr(os, "write", write)


def run(n: int = 16) -> Run:
    return Run(frame_from_rows([point(n), point(2 * n)]), {"torch": "2.x"}, {"ns": [n, 2 * n]})


def test_a_new_file_is_written_whole_with_the_usual_mode(tmp_path):
    path = tmp_path / "a.bin"
    files.write_atomic(path, b"x" * 100_000)
    assert path.read_bytes() == b"x" * 100_000 and os.listdir(tmp_path) == ["a.bin"]
    mask = os.umask(0o022)
    os.umask(mask)
    assert os.stat(path).st_mode & 0o777 == 0o666 & ~mask


def test_a_replaced_file_keeps_its_mode(tmp_path):
    path = tmp_path / "a.bin"
    path.write_bytes(b"old")
    os.chmod(path, 0o600)
    files.write_atomic(path, b"new")
    assert path.read_bytes() == b"new" and os.stat(path).st_mode & 0o777 == 0o600


@pytest.mark.skipif(not os.path.exists("/proc/self/fd"), reason="finds the written file through /proc")
@pytest.mark.parametrize("name", ["run.json", "run.csv"])
def test_a_save_that_fails_midway_leaves_the_old_run_byte_identical(tmp_path, monkeypatch, name):
    path = tmp_path / name
    save_run(run(16), path)
    before = path.read_bytes()
    fail_midway(monkeypatch, tmp_path)
    with pytest.raises(OSError) as caught:
        save_run(run(64), path)
    assert caught.value.errno == errno.ENOSPC
    assert path.read_bytes() == before and os.listdir(tmp_path) == [name]
    monkeypatch.undo()
    assert load_run(path).frame["n"].tolist() == [16, 32]


@pytest.mark.parametrize("step", ["fsync", "replace"])
def test_a_failure_after_writing_leaves_the_old_file_too(tmp_path, monkeypatch, step):
    path = tmp_path / "a.bin"
    path.write_bytes(b"old")

    def boom(*args):
        raise OSError(errno.EIO, os.strerror(errno.EIO))

    monkeypatch.setattr(os, step, boom)
    with pytest.raises(OSError):
        files.write_atomic(path, b"new bytes")
    monkeypatch.undo()
    assert path.read_bytes() == b"old" and os.listdir(tmp_path) == ["a.bin"]


def test_a_link_to_a_file_is_written_through_and_kept(tmp_path):
    target, link = tmp_path / "target.json", tmp_path / "link.json"
    target.write_bytes(b"old")
    link.symlink_to(target)
    files.write_atomic(link, b"new")
    assert link.is_symlink() and target.read_bytes() == b"new"


def test_a_dangling_link_a_folder_and_a_pipe_are_refused_and_nothing_is_created(tmp_path):
    link = tmp_path / "link.json"
    link.symlink_to(tmp_path / "nowhere.json")
    with pytest.raises(OSError, match="is a link to no file"):
        files.write_atomic(link, b"new")
    (tmp_path / "dir.json").mkdir()
    os.mkfifo(tmp_path / "pipe.json")
    for name in ("dir.json", "pipe.json"):
        with pytest.raises(OSError, match="is not a regular file"):
            files.write_atomic(tmp_path / name, b"new")
    assert sorted(os.listdir(tmp_path)) == ["dir.json", "link.json", "pipe.json"]


# open(…, 'w'/'wb'/'a'/'x') but not of os.devnull; .save(…) but not into io.BytesIO; to_csv/to_json given a path
WRITES = re.compile(r"""open\((?!os\.devnull)[^)]*["'][wax]b?\+?["']|\.write_bytes\(|\.write_text\(|"""
                    r"""\.save\((?!\w+ := io\.BytesIO\(\))|"""  # an image saved into memory is not a file
                    r"""\.to_(csv|json)\((?!\)|\w+=)|savefig\(""")


def test_every_file_the_product_writes_goes_through_write_atomic():
    """No writer of its own in the package or the pages: open(…, 'w'), write_bytes, to_csv(path), .save(…)."""
    found = [f"{path.relative_to(ROOT)}:{i}: {line.strip()}"
             for path in [*(ROOT / "attn_core").rglob("*.py"), *(ROOT / "pages").rglob("*.py"), ROOT / "app.py"]
             for i, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1)
             if WRITES.search(line) and path.name != "files.py"]
    assert not found, "write these through attn_core.engine.files.write_atomic:\n" + "\n".join(found)
