"""The server's stage: one sweep at a time, a queue in order of asking, orphans cancelled, sessions watching."""
from attn_core.engine.job import Job, ordinal
from attn_core.engine.stage import Stage


class FakeJob(Job):
    """A Job that measures nothing: it starts when the stage says so, and is done after cancel or finish()."""

    def __init__(self, name: str, started: dict):
        super().__init__(name)
        self.cancelled, self._started = False, started

    def start(self):
        if self.name == "bad":
            raise ValueError("Heads must be at least 1.")
        self.started = True
        self._started[self.name] = self

    def cancel(self):
        if self.queued:
            return super().cancel()  # withdrawn from the queue
        self.cancelled = True
        self._finished.set()

    def finish(self):
        self._finished.set()


class Clock:
    def __init__(self):
        self.now = 0.0

    def __call__(self):
        return self.now


def stage_with() -> tuple[Stage, Clock, dict]:
    clock, jobs = Clock(), {}
    desk = Stage(orphan_s=5.0, clock=clock, thread=False)
    return desk, clock, jobs


def submit(desk: Stage, jobs: dict, session: str, name: str) -> FakeJob:
    return desk.submit(FakeJob(name, jobs), session)


def test_sweeps_run_one_at_a_time_in_the_order_asked():
    desk, _, jobs = stage_with()
    first = submit(desk, jobs, "a", "first")
    second = submit(desk, jobs, "b", "second")
    third = submit(desk, jobs, "a", "third")
    assert list(jobs) == ["first"] and desk.running() is first
    assert [desk.place(e) for e in (first, second, third)] == [0, 1, 2]
    jobs["first"].finish()
    desk.check()
    assert list(jobs) == ["first", "second"] and desk.place(third) == 1


def test_a_queued_sweep_can_be_withdrawn_and_says_so():
    desk, _, jobs = stage_with()
    submit(desk, jobs, "a", "first")
    later = submit(desk, jobs, "a", "zero")
    assert later.progress.current == "queued, next after “first”"
    later.cancel()
    queued = submit(desk, jobs, "b", "second")
    queued.problems = [None] * 6  # six points asked for
    assert queued.queued and queued.frame().empty
    assert queued.progress.current == "queued, next after “first”" and queued.progress.total == 6
    queued.cancel()
    assert queued.done and "taken out of the queue" in queued.error and desk.queue == []
    jobs["first"].finish()
    desk.check()
    assert "second" not in jobs


def test_a_sweep_no_watcher_has_shown_for_the_orphan_time_is_cancelled_once():
    desk, clock, jobs = stage_with()
    job = submit(desk, jobs, "a", "sweep")  # asking counts as being seen
    desk.watch("b", job)  # a second tab
    clock.now = 3.0
    desk.seen("b")  # the first tab has gone quiet (a reload), the second still ticks
    clock.now = 7.0
    desk.check()
    assert not jobs["sweep"].cancelled  # "a" unseen for 7 s, but "b" for 4 s only
    clock.now = 7.9
    desk.check()
    assert not jobs["sweep"].cancelled
    clock.now = 8.0
    desk.check()
    assert jobs["sweep"].cancelled
    jobs["sweep"].cancelled = False  # still ending: it is not cancelled a second time
    desk.check()
    assert not jobs["sweep"].cancelled


def test_a_page_that_keeps_ticking_keeps_its_sweep_however_long_it_runs():
    desk, clock, jobs = stage_with()
    submit(desk, jobs, "a", "sweep")
    for tick in range(1, 200):  # every 2 s, as the progress ticker does (engine.pacing), for 400 s
        clock.now = 2.0 * tick
        desk.seen("a")
        desk.check()
    assert not jobs["sweep"].cancelled and desk.running() is jobs["sweep"]


def test_a_session_back_within_the_orphan_time_keeps_the_sweep():
    desk, clock, jobs = stage_with()
    submit(desk, jobs, "a", "sweep")
    clock.now = 4.9
    desk.seen("a")  # a network blip: back before the orphan time ran out
    clock.now = 9.0
    desk.check()  # the orphan time counts again from the last time it was seen
    assert not jobs["sweep"].cancelled


def test_an_orphaned_queued_sweep_is_dropped_and_the_next_one_starts():
    desk, clock, jobs = stage_with()
    submit(desk, jobs, "a", "first")
    gone = submit(desk, jobs, "b", "second")
    kept = submit(desk, jobs, "a", "third")
    clock.now = 4.0
    desk.seen("a")  # "b" closed its tab
    clock.now = 6.0
    desk.check()
    assert gone.withdrawn and gone.done and desk.queue == [kept]
    jobs["first"].finish()
    desk.check()
    assert list(jobs) == ["first", "third"]


def test_a_sweep_that_cannot_start_does_not_block_the_queue():
    desk, _, jobs = stage_with()
    bad = submit(desk, jobs, "a", "bad")
    submit(desk, jobs, "a", "good")
    assert bad.done and bad.error == "Heads must be at least 1." and list(jobs) == ["good"]


def test_a_jobs_poll_moves_its_stage_on():
    """A page polling its queued job is what starts it once the machine is free (the stage's thread does too)."""
    desk, _, jobs = stage_with()
    first = submit(desk, jobs, "a", "first")
    second = submit(desk, jobs, "a", "second")
    first.finish()
    assert second.queued and second.poll() == [] and second.started and desk.running() is second


def test_ordinals():
    assert [ordinal(k) for k in (1, 2, 3, 4, 11, 12, 13, 21, 22, 101, 111)] == [
        "1st", "2nd", "3rd", "4th", "11th", "12th", "13th", "21st", "22nd", "101st", "111th"]
