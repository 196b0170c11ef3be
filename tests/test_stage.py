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


def stage_with(alive: set[str]) -> tuple[Stage, Clock, dict]:
    clock, jobs = Clock(), {}
    desk = Stage(lambda s: s in alive, orphan_s=5.0, clock=clock, thread=False)
    return desk, clock, jobs


def submit(desk: Stage, jobs: dict, session: str, name: str) -> FakeJob:
    return desk.submit(FakeJob(name, jobs), session)


def test_sweeps_run_one_at_a_time_in_the_order_asked():
    desk, _, jobs = stage_with({"a", "b"})
    first = submit(desk, jobs, "a", "first")
    second = submit(desk, jobs, "b", "second")
    third = submit(desk, jobs, "a", "third")
    assert list(jobs) == ["first"] and desk.running() is first
    assert [desk.place(e) for e in (first, second, third)] == [0, 1, 2]
    jobs["first"].finish()
    desk.check()
    assert list(jobs) == ["first", "second"] and desk.place(third) == 1


def test_a_queued_sweep_can_be_withdrawn_and_says_so():
    desk, _, jobs = stage_with({"a", "b"})
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


def test_a_sweep_whose_watchers_have_all_gone_is_cancelled_after_the_grace_time():
    alive = {"a", "b"}
    desk, clock, jobs = stage_with(alive)
    job = submit(desk, jobs, "a", "sweep")
    desk.watch("b", job)  # a second tab
    alive.discard("a")  # the first tab reloaded: its session is gone, the second still watches
    clock.now = 60.0
    desk.check()
    assert not jobs["sweep"].cancelled
    alive.discard("b")
    desk.check()  # gone now: the grace time starts
    clock.now = 64.0
    desk.check()
    assert not jobs["sweep"].cancelled  # a network blip reconnects within it
    clock.now = 65.5
    desk.check()
    assert jobs["sweep"].cancelled


def test_a_watcher_back_within_the_grace_time_keeps_the_sweep():
    alive = {"a"}
    desk, clock, jobs = stage_with(alive)
    submit(desk, jobs, "a", "sweep")
    alive.clear()
    desk.check()
    clock.now = 4.0
    alive.add("a")
    desk.check()
    alive.clear()
    clock.now = 8.0
    desk.check()  # the grace time starts again from here
    assert not jobs["sweep"].cancelled


def test_an_orphaned_queued_sweep_is_dropped_and_the_next_one_starts():
    alive = {"a", "b"}
    desk, clock, jobs = stage_with(alive)
    submit(desk, jobs, "a", "first")
    gone = submit(desk, jobs, "b", "second")
    kept = submit(desk, jobs, "a", "third")
    alive.discard("b")
    desk.check()
    clock.now = 6.0
    desk.check()
    assert gone.withdrawn and gone.done and desk.queue == [kept]
    jobs["first"].finish()
    desk.check()
    assert list(jobs) == ["first", "third"]


def test_a_sweep_that_cannot_start_does_not_block_the_queue():
    desk, _, jobs = stage_with({"a"})
    bad = submit(desk, jobs, "a", "bad")
    submit(desk, jobs, "a", "good")
    assert bad.done and bad.error == "Heads must be at least 1." and list(jobs) == ["good"]


def test_a_jobs_poll_moves_its_stage_on():
    """A page polling its queued job is what starts it once the machine is free (the stage's thread does too)."""
    desk, _, jobs = stage_with({"a"})
    first = submit(desk, jobs, "a", "first")
    second = submit(desk, jobs, "a", "second")
    first.finish()
    assert second.queued and second.poll() == [] and second.started and desk.running() is second


def test_ordinals():
    assert [ordinal(k) for k in (1, 2, 3, 4, 11, 12, 13, 21, 22, 101, 111)] == [
        "1st", "2nd", "3rd", "4th", "11th", "12th", "13th", "21st", "22nd", "101st", "111th"]
