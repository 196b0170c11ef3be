"""The README is a newcomer's door: its example runs as printed, and its commands are the ones CI runs."""
from __future__ import annotations

import contextlib
import io
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
README = (ROOT / "README.md").read_text(encoding="utf-8")


def test_the_readme_fits_one_screen():
    assert len(README.splitlines()) <= 150


def test_the_ten_line_example_runs_and_prints_what_its_comments_say():
    block = re.search(r"## Ten lines of the library\s+```python\n(.*?)```", README, re.S).group(1)
    assert len(block.strip().splitlines()) <= 12
    printed = io.StringIO()
    with contextlib.redirect_stdout(printed):
        exec(compile(block, "README.md", "exec"), {})  # our own file's example, run as a reader would paste it
    lines = printed.getvalue().splitlines()
    assert lines[0] == "Sliding window O(n·w·d) O(n·d)"
    # Llama 3 8B at 128k in bf16: 32 layers × 2 (K, V) × 8 heads × 128 × 131,072 tokens × 2 bytes = 16 GiB
    assert float(lines[1].split()[0]) == 32 * 2 * 8 * 128 * 131072 * 2 / 2**30 == 16.0


def test_the_test_command_is_the_one_ci_runs():
    ci = (ROOT / ".ci" / "run").read_text(encoding="utf-8")
    assert "python3 -m pip install -r requirements.txt && python3 -m pytest -q" in README
    assert "python3 -m pip install -q -r requirements.txt" in ci and "python3 -m pytest -q" in ci
    assert "streamlit run app.py" in README


def test_every_doc_the_readme_points_to_exists():
    for target in re.findall(r"\]\((docs/[^)]+)\)", README):
        assert (ROOT / target).is_file(), target
