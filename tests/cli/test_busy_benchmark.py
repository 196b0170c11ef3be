"""The busy-machine benchmark's own machinery (no timing asserted): its neighbours start and are gone after, its
targets read as the issue sets them, its refusals are sentences."""
import multiprocessing
import os

import pytest

from attn_core.benchmarks import busy


def test_neighbours_spin_inside_and_are_gone_after():
    with busy.neighbours(2, limit_s=60) as started:
        assert len(started) == 2 and set(started) <= set(multiprocessing.active_children())
        # each is running (state R) or runnable: read from /proc, not from our own bookkeeping
        if os.path.exists(f"/proc/{started[0].pid}/stat"):
            states = {open(f"/proc/{p.pid}/stat").read().split(") ")[1][0] for p in started}
            assert states <= {"R", "S"}  # S only if descheduled in the instant we looked
    assert all(not p.is_alive() for p in started)


def test_a_neighbour_stops_by_itself_at_its_limit():
    with busy.neighbours(1, limit_s=0.2) as (child,):
        child.join(timeout=30)  # the spin loop ends by its own deadline, long before the 30 s bound
        assert not child.is_alive() and child.exitcode == 0  # ended by itself, not killed (−9)


def test_neighbours_are_killed_when_the_body_fails():
    with pytest.raises(RuntimeError):
        with busy.neighbours(1, limit_s=60) as (child,):
            raise RuntimeError("a failing measurement")
    assert not child.is_alive()


def test_targets_as_the_issue_sets_them():
    assert busy.target("linear", 0)[0] == 1.0 and busy.target("linear", 2)[0] == 1.5
    # the sliding window at least 20× sdpa quiet, 10× with two neighbours: ours ÷ sdpa at most 1/20 and 1/10
    assert busy.target("sliding_window-sdpa", 0)[0] == pytest.approx(1 / 20)
    assert busy.target("sliding_window-sdpa", 2)[0] == pytest.approx(1 / 10)


@pytest.mark.parametrize("argv,words", [(["--neighbours", "9"], "from 0 to 8"), (["--n", "100"], "256 to 131072")])
def test_bad_settings_are_refused_with_a_sentence(argv, words, capsys):
    with pytest.raises(SystemExit) as e:
        busy.main(argv)
    assert e.value.code == 2 and words in capsys.readouterr().err


def test_a_missing_peer_is_skipped_with_how_to_get_it(monkeypatch, capsys):
    def missing(n, causal):
        raise busy.Missing("pip install some-peer")
    monkeypatch.setitem(busy.PAIRS, "local", (missing, False, None))
    figures = busy.main(["--pairs", "local", "--neighbours", "0", "--n", "256", "--rounds", "1"])
    assert figures == 0 and "skipped: pip install some-peer" in capsys.readouterr().out
