"""The chunked-attention benchmark at a tiny size: it runs from the catalogue, writes its three figures, judges the
speed-up against ≥ 5 and refuses a chunk longer than the sequence (no timing is asserted)."""
from __future__ import annotations

import json

import pytest

from attn_core.benchmarks import __main__ as catalogue


def test_it_writes_its_figures_at_a_tiny_size(tmp_path, capsys):
    out = tmp_path / "chunked.json"
    argv = ["run", "chunked", "--n", "256", "--chunk", "64", "--head-dim", "8", "--rounds", "1", "--threads", "1"]
    assert catalogue.main([*argv, "--json-out", str(out)]) == 0
    report = json.loads(out.read_text())
    names = [f["name"] for f in report["figures"]]
    assert names == ["chunked seconds per call, n = 256, C = 64", "sdpa causal seconds per call, n = 256, C = 64",
                     "sdpa causal / chunked, n = 256, C = 64"]
    assert report["figures"][2]["target"] == "≥ 5" and report["figures"][2]["unit"] == "×"
    assert "sdpa / chunked, round by round" in capsys.readouterr().out


def test_a_chunk_longer_than_the_sequence_is_refused(capsys):
    with pytest.raises(SystemExit) as stopped:  # argparse's refusal, status 2
        catalogue.main(["run", "chunked", "--n", "64", "--chunk", "128"])
    assert stopped.value.code == 2 and "--chunk must be" in capsys.readouterr().err
