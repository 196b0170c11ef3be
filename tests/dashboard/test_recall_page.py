"""The Associative recall page: the shipped reference before anyone trains, a tiny training run's curves and
scatters, bad settings refused with a sentence, and curves kept when training is stopped."""
from __future__ import annotations

from streamlit.testing.v1 import AppTest

from attn_core.studies.recall import mqar as recall
from tests.apptest_helpers import chart_specs
from tests.dashboard.test_app import APP, routed  # noqa: F401


def recall_page(**settings) -> AppTest:
    at = AppTest.from_file(APP, default_timeout=90).run()
    at.switch_page("pages/recall.py").run()
    for key, value in settings.items():
        for kind in ("multiselect", "select_slider", "number_input"):
            found = [w for w in at.get(kind) if w.key == key]
            if found:
                found[0].set_value(value)
    return at.run() if settings else at


def drawn(spec: dict, column: str = "mechanism") -> set:
    return {r[column] for data in spec["datasets"].values() for r in data if column in r}


def test_the_reference_shows_before_anyone_trains():
    at = recall_page()
    assert not at.exception and [t.value for t in at.title] == ["Associative recall"]
    (spec,) = chart_specs(at)
    assert drawn(spec) >= {r["mechanism"] for r in recall.reference()["results"] if r["state_bytes"]}
    assert any(recall.reference()["command"] in c.value.replace("\\", "") for c in at.caption)


def test_a_tiny_run_draws_curves_and_both_scatters():
    at = recall_page(rc_mechs=["softmax", "sliding_window"], rc_seq=16, rc_pairs=2, rc_vocab=16, rc_width=16,
                     rc_steps=10)
    at.button(key="rc_train").click().run()
    assert not at.exception, [e.value for e in at.exception]
    specs = chart_specs(at)
    assert len(specs) == 4  # the reference, the curves, recall against state and against time
    assert drawn(specs[1]) == drawn(specs[2]) == {"softmax", "sliding_window:window=4"}
    table = at.dataframe[-1].value
    assert list(table["mechanism"]) == ["softmax", "sliding_window:window=4"]
    assert table["state_bytes"].iloc[0] == 2 * 16 * 16 * 4  # keys and values of 16 tokens, width 16, float32


def test_pairs_that_do_not_fit_are_refused_with_a_sentence():
    at = recall_page(rc_seq=16, rc_pairs=5)
    assert not at.exception and "choose at most 4 pairs" in at.info[0].value
    assert not [b for b in at.button if b.key == "rc_train"]


def test_curves_so_far_stay_after_a_stop():
    at = recall_page()
    at.session_state["recall"] = {"results": [], "setup": None, "points": [
        {"mechanism": "softmax", "key": "softmax", "lr": 0.01, "step": s, "loss": 1.0, "accuracy": 0.1 * s}
        for s in (1, 2)]}
    at.button(key="rc_stop").click().run()
    assert not at.exception
    assert drawn(chart_specs(at)[1]) == {"softmax"}
    assert any("Stopped" in c.value for c in at.caption)


def test_a_run_trained_here_downloads_as_the_file_recall_out_writes_and_opens_again(monkeypatch):
    import json
    import shlex

    from streamlit.runtime.media_file_manager import MediaFileManager

    from attn_core import cli

    made, original = {}, MediaFileManager.add_deferred

    def record(self, data, mimetype, coordinates, file_name=None, **kwargs):
        made[file_name] = data
        return original(self, data, mimetype, coordinates, file_name=file_name, **kwargs)

    monkeypatch.setattr(MediaFileManager, "add_deferred", record)
    at = recall_page(rc_mechs=["softmax", "sliding_window"], rc_seq=16, rc_pairs=2, rc_vocab=16, rc_width=16,
                     rc_steps=3)
    at.button(key="rc_train").click().run()
    assert not at.exception, [e.value for e in at.exception]
    shown = at.dataframe[-1].value
    text = made["recall-run.json"]().decode()
    back = recall.read_saved(text)
    assert [r["mechanism"] for r in back["results"]] == list(shown["mechanism"])
    assert [r["accuracy"] for r in back["results"]] == list(shown["accuracy"])
    assert [r["state_bytes"] for r in back["results"]] == list(shown["state_bytes"])
    assert (back["setup"]["seq"], back["setup"]["pairs"], back["setup"]["d_model"], back["setup"]["steps"]) == \
        (16, 2, 16, 3)
    assert json.loads(text)["results"][0]["stopped"] is False and back["machine"] and back["versions"]["torch"]
    # its command makes the same run again: the CLI reads it back to the page's settings
    args = cli.build_parser().parse_args(shlex.split(back["command"])[3:])
    assert (args.seq, args.pairs, args.vocab, args.d_model, args.steps) == (16, 2, 16, 16, 3)
    assert args.mechanisms == (("softmax", {}), ("sliding_window", {"window": 4}))
    # and the file opens on the page, in place of the reference
    at.file_uploader(key="rc_upload").set_value([("recall-run.json", text.encode(), "application/json")]).run()
    assert not at.exception and not at.error
    assert list(at.dataframe[0].value["mechanism"]) == list(shown["mechanism"])
