"""Spawned children never run the caller's __main__, even when another thread installs a page as __main__ while
they start (Streamlit's script runner does so at the start of every run)."""
import sys
import threading
import types
from multiprocessing import get_context, spawn

from attn_core.engine.spawning import without_main


def page(tmp_path, code="raise SystemExit(7)\n"):
    script = tmp_path / "page.py"
    script.write_text(code)
    module = types.ModuleType("__main__")
    module.__file__ = str(script)
    return module


def test_the_description_leaves_out_a_page_installed_inside_the_block(tmp_path, monkeypatch):
    monkeypatch.setitem(sys.modules, "__main__", types.ModuleType("__main__"))
    with without_main():
        monkeypatch.setitem(sys.modules, "__main__", page(tmp_path))  # a script run beginning meanwhile
        inside = spawn.get_preparation_data("child")
    outside = spawn.get_preparation_data("child")
    assert "init_main_from_path" not in inside and "init_main_from_name" not in inside
    assert outside["init_main_from_path"] == str(tmp_path / "page.py")
    assert inside["sys_path"] == outside["sys_path"]


def test_other_threads_keep_their_main(tmp_path, monkeypatch):
    monkeypatch.setitem(sys.modules, "__main__", page(tmp_path))
    seen = {}
    with without_main():
        thread = threading.Thread(target=lambda: seen.update(spawn.get_preparation_data("other")))
        thread.start()
        thread.join()
        mine = spawn.get_preparation_data("mine")
    assert seen["init_main_from_path"] == str(tmp_path / "page.py") and "init_main_from_path" not in mine


def test_a_child_started_inside_the_block_skips_a_page_that_would_end_it(tmp_path, monkeypatch):
    marker = tmp_path / "ran"
    monkeypatch.setitem(sys.modules, "__main__", page(tmp_path, f"open({str(marker)!r}, 'w').close()\n"
                                                               "raise SystemExit(7)\n"))
    child = get_context("spawn").Process(target=sys.exit, args=(0,))
    with without_main():
        child.start()
    child.join(60)
    assert child.exitcode == 0 and not marker.exists()
