"""The server's stage: one sweep at a time, a queue in order of asking, orphans cancelled, sessions watching."""
from attn_core.engine.stage import Stage, Ticket, ordinal


class FakeJob:
    """Answers like a SweepRun: done after cancel or finish()."""

    def __init__(self, name: str):
        self.name, self.done, self.cancelled, self.error, self.polls = name, False, False, None, 0

    def poll(self):
        self.polls += 1
        return []

    def cancel(self):
        self.cancelled = self.done = True

    def progress(self):
        return {"done": 1, "total": 4, "eta_s": 1.0, "current": self.name, "elapsed_s": 0.0}


class Clock:
    def __init__(self):
        self.now = 0.0

    def __call__(self):
        return self.now


def stage_with(alive: set[str]) -> tuple[Stage, Clock, dict]:
    clock, jobs = Clock(), {}
    desk = Stage(lambda s: s in alive, orphan_s=5.0, clock=clock, thread=False)
    return desk, clock, jobs


def make(jobs: dict, name: str):
    def start():
        jobs[name] = FakeJob(name)
        return jobs[name]
    return start


def test_sweeps_run_one_at_a_time_in_the_order_asked():
    desk, _, jobs = stage_with({"a", "b"})
    first = desk.submit("a", "first", make(jobs, "first"))
    second = desk.submit("b", "second", make(jobs, "second"))
    third = desk.submit("a", "third", make(jobs, "third"))
    assert list(jobs) == ["first"] and desk.running() is first
    assert [desk.place(e) for e in (first, second, third)] == [0, 1, 2]
    jobs["first"].done = True
    desk.check()
    assert list(jobs) == ["first", "second"] and desk.place(third) == 1


def test_a_queued_sweep_can_be_withdrawn_and_says_so():
    desk, _, jobs = stage_with({"a", "b"})
    desk.submit("a", "first", make(jobs, "first"))
    later = Ticket(desk, desk.submit("a", "zero", make(jobs, "zero")))
    assert later.progress()["current"] == "queued, next after “first”"
    later.cancel()
    queued = Ticket(desk, desk.submit("b", "second", make(jobs, "second")), total=6)
    assert queued.queued and queued.frame().empty
    assert queued.progress()["current"] == "queued, next after “first”" and queued.progress()["total"] == 6
    queued.cancel()
    assert queued.done and "taken out of the queue" in queued.error and desk.queue == []
    jobs["first"].done = True
    desk.check()
    assert "second" not in jobs


def test_a_sweep_whose_watchers_have_all_gone_is_cancelled_after_the_grace_time():
    alive = {"a", "b"}
    desk, clock, jobs = stage_with(alive)
    entry = desk.submit("a", "sweep", make(jobs, "sweep"))
    desk.watch("b", entry)  # a second tab
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
    desk.submit("a", "sweep", make(jobs, "sweep"))
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
    desk.submit("a", "first", make(jobs, "first"))
    gone = desk.submit("b", "second", make(jobs, "second"))
    kept = desk.submit("a", "third", make(jobs, "third"))
    alive.discard("b")
    desk.check()
    clock.now = 6.0
    desk.check()
    assert gone.withdrawn and desk.queue == [kept]
    jobs["first"].done = True
    desk.check()
    assert list(jobs) == ["first", "third"]


def test_a_sweep_that_cannot_start_does_not_block_the_queue():
    desk, _, jobs = stage_with({"a"})

    def broken():
        raise ValueError("Heads must be at least 1.")

    bad = Ticket(desk, desk.submit("a", "bad", broken))
    desk.submit("a", "good", make(jobs, "good"))
    assert bad.done and bad.error == "Heads must be at least 1." and list(jobs) == ["good"]


def test_the_stage_polls_the_running_job_so_a_sequence_moves_on_unwatched():
    desk, _, jobs = stage_with({"a"})
    desk.submit("a", "seq", make(jobs, "seq"))
    desk.check()
    desk.check()
    assert jobs["seq"].polls == 2


def test_ordinals():
    assert [ordinal(k) for k in (1, 2, 3, 4, 11, 12, 13, 21, 22, 101, 111)] == [
        "1st", "2nd", "3rd", "4th", "11th", "12th", "13th", "21st", "22nd", "101st", "111th"]


def test_sessions_polling_one_sequence_at_once_never_poll_it_together():
    """Tickets poll through the stage's lock: a page's tick and the stage's own check never run a sequence's poll
    at the same time (two could both see its first sweep done and start the second twice)."""
    import threading

    inside, most = [0], [0]
    guard = threading.Lock()

    class Sequence(FakeJob):
        def poll(self):
            with guard:
                inside[0] += 1
                most[0] = max(most[0], inside[0])
            threading.Event().wait(0.005)
            with guard:
                inside[0] -= 1
            return []

    desk, _, _ = stage_with({"a", "b"})
    entry = desk.submit("a", "seq", lambda: Sequence("seq"))
    tickets = [Ticket(desk, entry), Ticket(desk, entry, own=False)]
    work = [t.poll for t in tickets] + [desk.check]
    threads = [threading.Thread(target=lambda f=f: [f() for _ in range(10)]) for f in work]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert most[0] == 1
