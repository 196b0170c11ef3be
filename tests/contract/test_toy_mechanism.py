"""A mechanism from outside the catalogue's folder, selected on every page and in the command line: everything the
product knows of it comes from its spec (issue: one source of truth per mechanism)."""
import io
import json

import pytest
from streamlit.testing.v1 import AppTest

from attn_core import cli, MECHANISMS, mechanisms
from attn_core.insight import accuracy
from attn_core.engine import results, worker
from tests import toy_mechanism
from tests.apptest_helpers import chart_specs
from tests.dashboard.test_app import (APP, TINY, benchmark, fresh_stage, private_sweep_lock, routed,  # noqa: F401
                            run_to_end)
from tests.dashboard.test_pages_insight import FAST_ACCURACY, errors, page

TOY = toy_mechanism.TOY


@pytest.fixture(scope="module")
def toy():
    """The toy in this process's catalogue and, through the environment, in the measuring worker's."""
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv(mechanisms.ENV, toy_mechanism.REF)
        mp.setitem(MECHANISMS, TOY.key, TOY)
        worker.shutdown()  # the next one starts with the environment above
        yield TOY
    worker.shutdown()


def test_the_environment_adds_a_mechanism_to_the_catalogue(toy):
    assert mechanisms.load(mechanisms.refs(f" {toy_mechanism.REF} , ")) == {"toy": TOY}
    with pytest.raises(ValueError, match="cannot be imported"):
        mechanisms.load(["tests.no_such_module:X"])


def test_the_benchmark_page_measures_it(toy):
    at = benchmark(**{**TINY, "bench_approx": ["toy"]})
    assert not at.exception
    at.button(key="bench_run").click().run()
    run_to_end(at)
    job = at.session_state["bench"].job
    frame = job.frame()
    assert job.error is None, job.error
    assert set(frame["mechanism"]) == {"softmax", "toy"} and (frame["status"] == "ok").all(), frame["reason"]
    assert any(r["mechanism"] == "toy" for spec in chart_specs(at) for r in spec["datasets"]["points"])
    assert not at.exception


def test_the_patterns_page_draws_it(toy):
    at = page("patterns", pat_mechanisms=["toy"])
    assert errors(at) == []
    assert any(spec.get("title", {}).get("text") == TOY.label for spec in chart_specs(at))


def test_the_accuracy_page_sweeps_it_and_places_it_on_the_scatter(toy):
    at = page("accuracy", **{**FAST_ACCURACY, "acc_mechanism": "toy", "acc_scatter": True})
    assert errors(at) == []
    assert at.selectbox(key="acc_inputs_toy").value == "gentle"  # its regime, from its spec
    swept = [f"features={v}" for v in accuracy.sweep_values("toy", "features", FAST_ACCURACY["acc_n"])]
    assert list(at.dataframe[0].value["parameters"]) == swept
    assert TOY.label in set(at.dataframe[1].value["mechanism"])  # timed beside the catalogue's own


def test_the_theory_page_counts_it(toy):
    at = page("theory", th_mechanisms=["softmax", "toy"])
    assert errors(at) == []
    assert any(TOY.label in json.dumps(spec) for spec in chart_specs(at))


def test_the_command_line_measures_and_shows_it(toy, tmp_path):
    out = tmp_path / "toy.json"
    args = ["sweep", "--mechanisms", "toy:features=8", "--n", "32:64:2", "--d-model", "32", "--heads", "2",
            "--device", "cpu", "--causal", "--out", str(out), "--quiet"]
    assert cli.main(args, out=io.StringIO(), err=io.StringIO()) == 0
    run = results.load_run(out.read_bytes(), name=out.name)
    assert set(run.frame["mechanism"]) == {"toy"} and (run.frame["status"] == "ok").all()
    shown = io.StringIO()
    assert cli.main(["show", str(out)], out=shown, err=io.StringIO()) == 0
    assert TOY.label in shown.getvalue()
