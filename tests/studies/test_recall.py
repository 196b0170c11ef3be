"""Multi-query associative recall: the generator against its definition, the model, the window's blindness argued
from the mask, softmax learning a tiny case, and the refusals."""
import io
import json
import math
import os
import signal
import subprocess
import sys

import pytest
import torch

from attn_core.studies.recall import mqar as recall
from attn_core.studies.recall import chart as recall_charts
from attn_core.studies.recall import training as recall_training
from attn_core.cli import main
from attn_core.studies.recall.mqar import IGNORE, RecallModel, Setup, Task, mqar

TINY = Setup(task=Task(vocab=16, seq=16, pairs=2), d_model=32, steps=100, batch=16, lrs=(1e-2,), eval_sequences=128,
             eval_every=20)


@pytest.mark.parametrize("task", [Task(16, 16, 2), Task(32, 32, 4), Task(64, 33, 8), Task(20, 40, 9)])
def test_every_query_asks_an_earlier_key_and_only_answers_are_scored(task):
    inputs, targets = mqar(task, 12, seed=3)
    half = task.vocab // 2
    assert inputs.shape == targets.shape == (12, task.seq)
    for x, y in zip(inputs.tolist(), targets.tolist()):
        keys, values = x[0:2 * task.pairs:2], x[1:2 * task.pairs:2]
        assert len(set(keys)) == task.pairs and all(1 <= k < half for k in keys)
        assert len(set(values)) == task.pairs and all(half <= v < task.vocab for v in values)
        answered = [p for p, t in enumerate(y) if t != IGNORE]
        assert sorted(x[p] for p in answered) == sorted(keys)  # each key queried once
        for p in answered:
            assert p >= 2 * task.pairs and (p - 2 * task.pairs) % 2 == 0
            assert y[p] == values[keys.index(x[p])]  # the value paired with the key earlier
            assert p + 1 >= task.seq or x[p + 1] == y[p]  # the answer is the next input
        others = [t for p, t in enumerate(x) if p >= 2 * task.pairs and p not in answered and p - 1 not in answered]
        assert set(others) <= {0}


def test_the_generator_and_the_forward_are_deterministic_with_a_seed():
    task = Task(32, 32, 4)
    assert torch.equal(mqar(task, 4, 1)[0], mqar(task, 4, 1)[0])
    assert not torch.equal(mqar(task, 4, 1)[0], mqar(task, 4, 2)[0])
    x = mqar(task, 4, 1)[0]
    one, two, other = (RecallModel("performer", 32, 32, d_model=32, seed=s)(x) for s in (5, 5, 6))
    assert torch.equal(one, two) and not torch.equal(one, other)


@pytest.mark.parametrize("seed", [0, 1])
def test_a_window_narrower_than_the_distance_to_the_pair_is_at_chance(seed):
    """Query i at position p sees key j iff 0 ≤ p − j ≤ w; two layers and the previous-token embedding reach back
    2w + 1 tokens. A pair farther than that cannot change the query's logits, so its prediction is the same whatever
    the value: of the equally likely values exactly one (or none) is right, accuracy at most chance."""
    task, w, layers = Task(16, 32, 4), 4, 2
    x = mqar(task, 1, seed)[0][0]
    x[0], x[1] = 3, 12  # pair 0: key 3, value 12 at positions 0 and 1
    x[30], x[31] = 3, 12  # the query of key 3 at position 30, far beyond 2w + 1 = 9 tokens
    window = RecallModel("sliding_window", 16, 32, d_model=32, layers=layers, params={"window": w}, seed=seed)
    softmax = RecallModel("softmax", 16, 32, d_model=32, layers=layers, seed=seed)
    values = range(task.vocab // 2, task.vocab)
    with torch.no_grad():
        seen = {name: [] for name in ("window", "softmax")}
        for v in values:
            y = x.clone()
            y[1] = v
            seen["window"].append(window(y[None])[0, 30])
            seen["softmax"].append(softmax(y[None])[0, 30])
    assert all(torch.equal(seen["window"][0], logits) for logits in seen["window"])
    assert not all(torch.equal(seen["softmax"][0], logits) for logits in seen["softmax"])  # the check can fail
    guesses = [int(logits.argmax()) for logits in seen["window"]]
    right = sum(g == v for g, v in zip(guesses, values))
    assert right / len(values) <= task.chance


def test_softmax_learns_a_tiny_case():
    result = recall.train("softmax", {}, TINY)
    assert result.accuracy >= 0.9, result.by_lr
    assert result.curve and result.curve[-1].step == TINY.steps and result.train_s > 0


def test_progress_arrives_and_a_stop_keeps_the_curve_so_far():
    seen = []
    setup = recall.with_setup(TINY, steps=50, eval_every=5, lrs=(1e-2, 3e-3))
    result = recall.train("linear", {}, setup, progress=seen.append, stop=lambda: len(seen) >= 3)
    assert result.stopped and [p.step for p in seen] == [5, 10, 15]
    assert result.curve == seen and list(result.by_lr) == [1e-2]  # the second rate never started
    assert 0 <= result.accuracy <= 1


def test_state_bytes_per_layer_for_one_sequence():
    setup = recall.with_setup(TINY, seq=32, d_model=32)  # heads 2 of 16 dims, float32
    assert recall.state_bytes("softmax", {}, setup) == (2 * 32 * 32 * 4, "")  # keys and values of 32 tokens
    assert recall.state_bytes("sliding_window", {"window": 4}, setup)[0] == 2 * 5 * 32 * 4  # the last w + 1
    assert recall.state_bytes("sdpa", {"kv_heads": 1}, setup)[0] == 32 * 32 * 4  # one of the two heads
    assert recall.state_bytes("linear", {}, setup)[0] < 2 * 32 * 32 * 4
    nbytes, why = recall.state_bytes("bigbird", {}, setup)
    assert math.isnan(nbytes) and why


def test_shared_key_value_heads_train():
    result = recall.train("sdpa", {"kv_heads": 1}, recall.with_setup(TINY, steps=2, eval_sequences=16))
    assert result.params["kv_heads"] == 1 and result.name == "sdpa:kv_heads=1"


@pytest.mark.parametrize("changes, words", [
    ({"pairs": 5}, "choose at most 4 pairs"),
    ({"vocab": 8, "seq": 32, "pairs": 4}, "vocabulary of at least 10 tokens"),
    ({"steps": 0}, "give at least 1 step"),
    ({"lrs": ()}, "learning rates"),
    ({"d_model": 30, "heads": 4}, "multiple of 4"),
])
def test_bad_settings_are_refused_with_a_sentence(changes, words):
    with pytest.raises(ValueError, match=words):
        recall.with_setup(TINY, **changes)


def test_mechanisms_that_cannot_run_causal_or_bad_parameters_are_refused():
    with pytest.raises(ValueError, match="cannot be causal.*choose another mechanism"):
        recall.train("linformer", {}, TINY)
    with pytest.raises(ValueError, match="window"):
        recall.train("sliding_window", {"window": 0}, TINY)
    with pytest.raises(ValueError, match="does not divide the 2 heads"):
        recall.train("sdpa", {"kv_heads": 3}, TINY)
    with pytest.raises(ValueError):
        recall.train("no_such_mechanism", {}, TINY)


def test_the_cli_prints_one_object_per_mechanism():
    out, err = io.StringIO(), io.StringIO()
    code = main(["recall", "--mechanisms", "softmax,sliding_window:window=4,bigbird:block=8", "--steps", "2",
                 "--lrs", "1e-2", "--eval", "16", "--json"], out, err)
    assert code == 0, err.getvalue()
    rows = json.loads(out.getvalue())
    assert [r["mechanism"] for r in rows][:2] == ["softmax", "sliding_window:window=4"]
    assert {"mechanism", "accuracy", "state_bytes", "train_s"} <= set(rows[0])
    assert rows[0]["state_bytes"] == 2 * 32 * 32 * 4 and rows[2]["state_bytes"] is None  # defaults: n 32, d 32
    assert all(0 <= r["accuracy"] <= 1 and r["train_s"] > 0 for r in rows)


@pytest.mark.parametrize("argv, words", [(["--pairs", "9"], "at most 8 pairs"),
                                          (["--mechanisms", "linformer"], "cannot be causal"),
                                          (["--steps", "0"], "at least 1 step")])
def test_the_cli_refuses_bad_settings_before_training(argv, words):
    out, err = io.StringIO(), io.StringIO()
    assert main(["recall", *argv], out, err) == 2 and words in err.getvalue() and not out.getvalue()


@pytest.mark.parametrize("changes, words", [
    ({"vocab": 1 << 40}, "vocab must be a whole number from 4 to 1,048,576"),
    ({"seq": 1 << 30}, "seq must be a whole number from 4 to 65,536"),
    ({"d_model": 1 << 20, "heads": 1}, "d_model must be a whole number from 1 to 16,384"),
    ({"layers": 1000}, "layers must be a whole number from 1 to 64"),
    ({"heads": 1 << 20}, "heads must be a whole number from 1 to 1,024"),
    ({"batch": 1 << 30}, "batch must be a whole number from 1 to 65,536"),
    ({"steps": 10**9}, "steps must be a whole number from 1 to 1,000,000"),
    ({"eval_sequences": 1 << 40}, "eval_sequences must be a whole number from 1 to 1,048,576"),
    ({"eval_every": 0}, "eval_every must be a whole number from 1"),
    ({"seed": -1}, "seed must be a whole number from 0 to 4,294,967,295"),
    ({"seed": 1 << 63}, "seed must be a whole number from 0 to 4,294,967,295"),
    ({"threads": 10**5}, "threads must be a whole number from 1 to"),
    ({"lrs": (1e-3,) * 100}, "learning rates must be 1 to 16 numbers"),
])
def test_every_setting_has_a_range_refused_with_a_sentence(changes, words):
    with pytest.raises(ValueError, match=words):
        recall.with_setup(TINY, **changes)


@pytest.mark.parametrize("count, seed, words", [(10**12, 0, "count must be a whole number of sequences from 1 to"),
                                                 (0, 0, "count must be"), (4, -1, "seed must be a whole number"),
                                                 (4, 1 << 64, "seed must be a whole number")])
def test_drawing_sequences_is_bounded_before_it_allocates(count, seed, words):
    with pytest.raises(ValueError, match=words):
        mqar(Task(), count, seed)


@pytest.mark.parametrize("device, available, words", [
    ("meta", True, "device 'meta' is not a device recall trains on; choose cpu"),
    ("cuda", False, "device 'cuda' is not available on this machine; choose cpu"),
])
def test_a_device_this_machine_has_not_is_refused_with_a_sentence(device, available, words, monkeypatch):
    if not available:
        monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    out, err = io.StringIO(), io.StringIO()
    assert main(["recall", "--device", device, *TINY_ARGS], out, err) == 2, err.getvalue()
    assert words in err.getvalue() and not out.getvalue()


def test_settings_in_range_that_would_not_fit_are_refused_before_training():
    """Each in its range, together 100 TB: the sentence names the part that needs the most and what shrinks it."""
    out, err = io.StringIO(), io.StringIO()
    code = main(["recall", "--mechanisms", "softmax", "--vocab", "1048576", "--seq", "65536", "--eval", "1048576"],
                out, err)
    assert code == 2 and not out.getvalue()
    assert err.getvalue().startswith("error: training Softmax (materialized) at these settings would need ")
    assert "(the evaluation pass" in err.getvalue() and "choose a smaller seq, vocab or batch" in err.getvalue()


@pytest.mark.parametrize("changes, part, advice", [
    ({}, "evaluation pass", "a smaller seq, vocab or batch"),
    ({"d_model": 2048, "layers": 16, "heads": 8}, "model and optimizer", "a smaller vocab or d_model"),
    ({"batch": 1024}, "training step", "a smaller batch, seq or d_model"),
    ({"eval_sequences": 1 << 20, "vocab": 4096}, "held-out sequences", "fewer held-out sequences (eval)"),
])
def test_the_memory_guard_names_the_part_that_needs_the_most(changes, part, advice, monkeypatch):
    from attn_core.engine import env

    setup = recall.with_setup(recall.Setup(), **changes)
    parts = recall.required_bytes("softmax", {}, setup)
    assert max(parts, key=parts.get) == part
    why = recall.memory_problem("softmax", {}, setup, limit=1024)
    assert f"(the {part} " in why and "1.0 KiB free on cpu under the limit set; choose " + advice in why
    monkeypatch.setattr(env, "free_memory_bytes", lambda device: 1 << 50)  # a machine of 1 PiB
    assert recall.memory_problem("softmax", {}, setup) == ""


def test_nothing_is_allocated_when_memory_would_not_fit(monkeypatch):
    from attn_core.engine import env

    built = []
    monkeypatch.setattr(env, "free_memory_bytes", lambda device: 1 << 20)  # 1 MiB free
    monkeypatch.setattr(recall_training, "mqar", lambda *a, **k: built.append("data"))
    monkeypatch.setattr(recall_training, "RecallModel", lambda *a, **k: built.append("model"))
    with pytest.raises(ValueError, match=r"would need .* 1\.0 MiB free on cpu; choose"):
        recall.train("softmax", {}, recall.Setup())
    assert built == []


@pytest.mark.parametrize("key", ["softmax", "gated_deltanet"])
def test_the_estimate_covers_what_training_allocates(key):
    """The guard's estimate against the peak the profiler sees over a whole (short) training: at least it, and not
    so far above that a run which fits is refused (within 3×)."""
    from tests.contract.test_mechanisms import profiled_peak

    setup = recall.with_setup(TINY, steps=2, eval_sequences=64)
    estimate = recall.peak_bytes(recall.required_bytes(key, recall.check_mechanism(key, {}, setup), setup))
    peak = profiled_peak(lambda: recall.train(key, {}, setup))
    assert peak <= estimate <= 3 * peak


def test_the_scatter_draws_each_mechanism_on_a_log_axis_and_names_those_without_a_state():
    table = recall.frame([{"mechanism": "softmax", "accuracy": 1.0, "state_bytes": 8192.0, "train_s": 3.0},
                          {"mechanism": "sliding_window:window=4", "accuracy": 0.1, "state_bytes": 1280.0,
                           "train_s": 2.0},
                          {"mechanism": "bigbird", "accuracy": 0.2, "state_bytes": None, "train_s": 4.0}])
    spec = recall_charts.recall_scatter(table, chance=0.0625).to_dict()
    dots = spec["layer"][0]
    assert dots["encoding"]["x"]["scale"]["type"] == "log"
    rows = [r for data in spec["datasets"].values() for r in data if "state_bytes" in r]
    assert {r["mechanism"] for r in rows} == {"softmax", "sliding_window:window=4"}
    assert "BigBird (block sparse)" in " ".join(spec["title"]["subtitle"])  # the name every page gives it
    by_time = recall_charts.recall_scatter(table, "train_s").to_dict()
    assert {r["mechanism"] for data in by_time["datasets"].values() for r in data if "train_s" in r} >= {"bigbird"}


def test_a_saved_file_reads_back_and_a_bad_one_is_refused_with_a_sentence():
    result = recall.Result("softmax", {}, accuracy=0.5, state_bytes=8192.0, train_s=1.0, best_lr=0.01)
    made = recall.provenance([result], recall.Setup(), command="python -m attn_core recall", stamp={}, note="x" * 5000)
    back = recall.read_saved(json.dumps(made))
    assert back["results"][0]["accuracy"] == 0.5 and back["setup"]["seq"] == 32 and len(back["note"]) == 600
    assert back["setup"]["chance"] == recall.Task().chance
    for bad, words in ((made | {"results": [{"mechanism": "softmax", "accuracy": 7}]}, "accuracy = 7"),
                       ({"results": []}, "not a recall results file"), ("[1", "not a recall results file")):
        with pytest.raises(ValueError, match=words):
            recall.read_saved(bad if isinstance(bad, str) else json.dumps(bad))
    shipped = recall.reference()
    assert shipped["command"].startswith("python -m attn_core recall") and shipped["results"]


TINY_ARGS = ["--seq", "16", "--pairs", "2", "--vocab", "16", "--d-model", "32", "--batch", "16", "--lrs", "1e-2",
             "--eval", "16"]


@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGINT])
def test_a_stop_keeps_the_mechanisms_finished_and_marks_the_one_in_flight(signum, monkeypatch, tmp_path):
    train, started = recall.train, []

    def stopped_in_the_second(key, params, setup, **options):  # the stop arrives as the second one starts
        started.append(key)
        if len(started) == 2:
            os.kill(os.getpid(), signum)
        return train(key, params, setup, **options)

    monkeypatch.setattr(recall, "train", stopped_in_the_second)
    out, err, path = io.StringIO(), io.StringIO(), tmp_path / "recall.json"
    code = main(["recall", "--mechanisms", "softmax,linear,sdpa", "--steps", "5", *TINY_ARGS, "--out", str(path)],
                out, err)
    assert code == 128 + signum and started == ["softmax", "linear"]
    assert f"{signal.Signals(signum).name}: stopped; 1 mechanism finished is kept, the one in flight marked" \
        in err.getvalue()
    saved = json.loads(path.read_text())
    assert [(r["mechanism"], r["stopped"]) for r in saved["results"]] == [("softmax", False), ("linear", True)]
    assert recall.read_saved(path.read_text())["results"][0]["mechanism"] == "softmax"
    assert "linear" in out.getvalue() and "(stopped)" in out.getvalue().splitlines()[2]


def test_sigterm_to_the_cli_process_saves_what_finished(tmp_path):
    """A real process, stopped by SIGTERM once its first mechanism has printed its accuracy."""
    path = tmp_path / "recall.json"
    names = ["softmax", "linear", "sliding_window:window=4"]
    process = subprocess.Popen([sys.executable, "-m", "attn_core", "recall", "--mechanisms", ",".join(names),
                                "--steps", "60", *TINY_ARGS, "--out", str(path)],
                               stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        first = process.stderr.readline()  # blocks until softmax has finished (or the process ended)
        assert first.startswith("softmax: accuracy"), first + process.stderr.read()
        process.send_signal(signal.SIGTERM)
        _, rest = process.communicate(timeout=120)
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()
    assert process.returncode == 128 + signal.SIGTERM, rest
    assert "SIGTERM: stopped" in rest
    results = json.loads(path.read_text())["results"]
    assert results[0]["mechanism"] == "softmax" and results[0]["stopped"] is False and results[0]["accuracy"] > 0
    assert [r["mechanism"] for r in results] == names[:len(results)]
    assert len(results) < len(names) or results[-1]["stopped"]  # the stop came before the last one finished
    assert not any(r["stopped"] for r in results[:-1])  # only the one in flight, if one was, is marked


def test_a_saved_file_s_texts_come_back_as_printable_text():
    """Mechanism names and notes from a results file reach a table and a terminal: control characters and lone
    surrogates (which pandas, Arrow and a terminal would choke on or obey) come back as visible escapes."""
    data = {"setup": {name: 8 for name in recall.SETUP_KEYS}, "note": "a\x1b[2Jb", "machine": "m\ud800",
            "results": [{"mechanism": "softmax\x07"}]}
    got = recall.read_saved(json.dumps(data))
    assert got["note"] == "a\\x1b[2Jb" and got["machine"] == "m\\ud800"
    assert got["results"][0]["mechanism"] == "softmax\\x07"


def test_a_machine_named_at_length_is_cut_where_charts_show_it():
    from attn_core.insight.published import machine

    assert machine({"device_name": "x" * 1_000_000}) == "x" * 119 + "…"
    assert machine({"device_name": "cpu\x1b]0;t\x07"}) == "cpu\\x1b]0;t\\x07"
