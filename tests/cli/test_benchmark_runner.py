"""The benchmark runner: the shared machine options parsed and bad ones refused with a sentence, the figures written
as data (the machine's stamp, the method, the figures) whole or not at all, every script registered with it, and a
few real scripts at tiny sizes writing their figures. No timing is asserted."""
from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

from attn_core.benchmarks import __main__ as catalogue
from attn_core.benchmarks import runner
from attn_core.benchmarks.runner import Benchmark, Figure, Machine

FOLDER = Path(runner.__file__).parent


def fake(seen: dict, figures=None, machine: Machine = Machine(), settle=lambda args: None) -> Benchmark:
    """A benchmark that keeps the args it was given in `seen` and returns `figures`."""
    def options(parser):
        parser.add_argument("--size", type=int, default=8)

    def body(args):
        seen["args"] = args
        print(f"measured at size {args.size}")
        return figures if figures is not None else [Figure.of("seconds per call", [1.0, 2.0, 3.0]),
                                                    Figure.judged("speed-up", [4.0, 5.0, 6.0], 4.0, at_most=False)]
    return Benchmark("fake", "Nothing real.", body, options, settle, lambda args: f"size {args.size}.", machine)


def test_the_shared_options_take_the_benchmarks_defaults_and_what_is_given(capsys):
    seen = {}
    assert runner.run(fake(seen, machine=Machine(threads=1, rounds=4)), []) == 0
    args = seen["args"]
    assert (args.threads, args.device, args.dtype, args.rounds, args.clock, args.size) == (1, "cpu", "float32", 4,
                                                                                          "wall", 8)
    assert runner.run(fake(seen), ["--threads", "1", "--rounds", "2", "--clock", "cpu", "--size", "3"]) == 0
    args = seen["args"]
    assert (args.threads, args.rounds, args.clock, args.size) == (1, 2, "cpu", 3)
    out = capsys.readouterr().out
    assert "1 threads, torch" in out and "size 3." in out and "cores" in out and "load average at the end" in out


@pytest.mark.parametrize("argv,machine,sentence", [
    (["--threads", "0"], Machine(), "--threads must be at least 1 (got 0)"),
    (["--rounds", "0"], Machine(), "--rounds must be at least 1 (got 0)"),
    (["--rounds", "3"], Machine(rounds=None), "--rounds: fake has no rounds of its own"),
    (["--device", "cuda"], Machine(devices=("cpu",)), "--device cuda: fake measures on cpu only"),
    (["--device", "tpu"], Machine(devices=("cpu", "tpu")), "--device: device 'tpu' is unknown"),
    (["--dtype", "bfloat16"], Machine(), "--dtype bfloat16: fake measures float32 only"),
    (["--clock", "cpu"], Machine(clocks=("wall",)), "--clock cpu: fake reads the wall clock only"),
    (["--json-out", "/no/such/x.json"], Machine(), "--json-out /no/such/x.json: its folder does not exist"),
])
def test_a_bad_machine_option_is_refused_with_a_sentence(argv, machine, sentence, capsys):
    seen = {}
    with pytest.raises(SystemExit) as stop:
        runner.run(fake(seen, machine=machine), argv)
    assert stop.value.code == 2 and "args" not in seen  # refused before anything ran
    assert sentence in capsys.readouterr().err


def test_the_benchmarks_own_refusal_is_said_as_the_machines_are(capsys):
    def settle(args):
        if args.size < 1:
            raise ValueError(f"--size must be at least 1 (got {args.size})")
    with pytest.raises(SystemExit) as stop:
        runner.run(fake({}, settle=settle), ["--size", "0"])
    assert stop.value.code == 2 and "--size must be at least 1 (got 0)" in capsys.readouterr().err


def test_json_out_and_figures_are_one_or_the_other(tmp_path, capsys):
    with pytest.raises(SystemExit):
        runner.run(fake({}), ["--figures", "--json-out", str(tmp_path / "x.json")])
    assert "not allowed with" in capsys.readouterr().err


def test_the_figures_file_holds_the_machine_the_method_and_the_figures(tmp_path, monkeypatch):
    writes = []
    real = runner.write_atomic
    monkeypatch.setattr(runner, "write_atomic", lambda path, data: (writes.append(path), real(path, data)))
    out = tmp_path / "fake.json"
    runner.run(fake({}), ["--threads", "1", "--size", "5", "--json-out", str(out)])
    assert writes == [str(out)]  # through the engine's write_atomic: whole or not at all
    report = json.loads(out.read_text())
    assert set(report) == {"benchmark", "command", "when", "machine", "method", "options", "figures"}
    assert report["benchmark"] == "fake"
    assert report["command"] == f"python -m attn_core.benchmarks.fake --threads 1 --size 5 --json-out {out}"
    machine = report["machine"]
    assert {"torch", "cpu", "device_name", "threads", "cpu_count", "cores_usable", "caches_bytes", "load_averages",
            "native_kernels", "timestamp"} <= set(machine)
    assert machine["threads"] == 1 and machine["dtype"] == "float32" and set(machine["load_averages"]) == {"start",
                                                                                                            "end"}
    assert "Nothing real. size 5. Machine options: 1 threads" in report["method"]
    assert report["options"]["size"] == 5 and report["options"]["rounds"] == 5
    seconds, speed_up = report["figures"]
    assert seconds == {"name": "seconds per call", "value": 2.0, "unit": "s", "iqr": 1.0, "min": 1.0, "max": 3.0,
                       "n": 3, "target": None, "meets": None}
    assert (speed_up["value"], speed_up["unit"], speed_up["target"], speed_up["meets"]) == (5.0, "×", "≥ 4", True)


def test_a_second_run_replaces_the_file_and_a_failed_one_leaves_it(tmp_path, monkeypatch):
    figures_folder = tmp_path / "docs" / "figures"  # not there yet: --figures makes it
    monkeypatch.setattr(runner, "FIGURES", figures_folder)
    runner.run(fake({}), ["--figures"])
    first = json.loads((figures_folder / "fake.json").read_text())
    runner.run(fake({}, figures=[Figure("a ratio", 0.5, "×")]), ["--figures", "--size", "9"])
    second = json.loads((figures_folder / "fake.json").read_text())
    assert len(first["figures"]) == 2 and [f["name"] for f in second["figures"]] == ["a ratio"]
    assert second["options"]["size"] == 9
    repeated = [Figure("twice", 1.0, "s"), Figure("twice", 2.0, "s")]  # a figure the docs could not name
    with pytest.raises(ValueError, match="figure names repeat"):
        runner.run(fake({}, figures=repeated), ["--figures"])
    assert json.loads((figures_folder / "fake.json").read_text()) == second
    assert [p.name for p in figures_folder.iterdir()] == ["fake.json"]  # no temporary file left beside it


def test_a_figure_that_is_no_number_is_written_as_null():
    assert Figure.slope("a slope", math.nan, 1.15).to_dict()["value"] is None
    assert Figure.slope("flat", -0.05, 0.1, absolute=True).to_dict() == {
        "name": "flat", "value": -0.05, "unit": "slope", "iqr": None, "min": None, "max": None, "n": 1,
        "target": "|slope| ≤ 0.1", "meets": True}


def test_every_script_in_the_folder_is_in_the_catalogue_and_declares_itself():
    scripts = {p.stem for p in FOLDER.glob("*.py")} - {"__init__", "__main__", "runner"}
    assert scripts == set(catalogue.NAMES)
    for name in catalogue.NAMES:
        found = catalogue.benchmark(name)
        assert isinstance(found, Benchmark) and found.name == name and found.measures


def test_the_catalogue_lists_them_and_refuses_an_unknown_name(capsys):
    assert catalogue.main([]) == 0
    out = capsys.readouterr().out
    assert all(f"  {name} " in out for name in catalogue.NAMES)
    assert catalogue.main(["run", "nope"]) == 2 and "no benchmark 'nope'" in capsys.readouterr().err
    assert catalogue.main(["walk"]) == 2


TINY = ["--rounds", "1", "--threads", "1"]


@pytest.mark.parametrize("argv", [
    ["run", "kda", "--n", "64,128", "--heads", "2", "--head-dim", "8", *TINY],
    ["run", "sparse_select", "--compare-n", "64", "--top-k", "8", "--heads", "2", "--head-dim", "8", "--mask",
     "causal", *TINY],
    ["run", "store", "--points", "200", "--runs", "2", *TINY],
])
def test_a_real_script_at_a_tiny_size_writes_its_figures(argv, tmp_path, capsys):
    out = tmp_path / f"{argv[1]}.json"
    assert catalogue.main([*argv, "--json-out", str(out)]) == 0
    assert f"figures written to {out}" in capsys.readouterr().out
    report = json.loads(out.read_text())
    assert report["benchmark"] == argv[1] and report["command"].startswith(f"python -m attn_core.benchmarks.{argv[1]}")
    names = [f["name"] for f in report["figures"]]
    assert names and len(set(names)) == len(names)
    assert all(f["unit"] and (f["value"] is None or isinstance(f["value"], (int, float))) for f in report["figures"])
