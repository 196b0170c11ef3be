"""The live page's pacing: first points drawn at once, then redraws spaced by their own cost."""
from attn_core.engine.pacing import FIRST_DRAW_GRACE_S, Pacing


def test_nothing_drawn_yet_the_next_points_are_drawn_at_once_and_ticks_are_quick():
    clock = Pacing()
    clock.begin(job=1, points=0, now=100.0)
    assert clock.tick_every() == clock.first_tick_s
    clock.end(now=100.4)
    assert clock.wants_redraw(1, done=1, now=100.4)
    assert not clock.wants_redraw(1, done=0, now=100.4)  # nothing new


def test_once_points_are_drawn_a_redraw_waits_for_the_larger_of_the_period_and_its_share_of_the_cost():
    clock = Pacing(redraw_s=2.0, share=3.0)
    clock.begin(job=1, points=5, now=0.0)
    assert clock.tick_every() == clock.tick_s
    clock.end(now=0.1)  # a cheap draw: the period rules
    assert not clock.wants_redraw(1, done=6, now=2.0) and clock.wants_redraw(1, done=6, now=2.11)
    clock.begin(job=1, points=6, now=10.0)
    clock.end(now=11.0)  # a 1 s draw: 3 s must pass
    assert not clock.wants_redraw(1, done=7, now=13.9) and clock.wants_redraw(1, done=7, now=14.0)


def test_a_tick_inside_a_full_run_does_not_ask_for_another_and_a_new_job_is_drawn():
    clock = Pacing()
    clock.begin(job=1, points=3, now=0.0)
    assert not clock.wants_redraw(1, done=9, now=FIRST_DRAW_GRACE_S - 0.01)  # the run has not ended
    assert clock.wants_redraw(2, done=0, now=FIRST_DRAW_GRACE_S)


def test_a_replay_ticks_at_its_own_pace_but_never_faster_than_the_first_tick():
    clock = Pacing(first_tick_s=0.25)
    assert clock.tick_every(points_per_s=2.0) == 0.5 and clock.tick_every(points_per_s=20.0) == 0.25
