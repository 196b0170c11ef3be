"""`python -m attn_core`: argument parsing, help, exit codes, and a tiny sweep end to end."""
from __future__ import annotations

import argparse
import io
import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from attn_core import cli
from attn_core.engine import job as sweep_module
from attn_core.engine.results import load_run
from tests.fake_mechanisms import REF, private_sweep_lock  # noqa: F401 (an autouse fixture)

ROOT = Path(__file__).resolve().parents[2]
TINY = ["--heads", "2", "--d-model", "16", "--min-repeats", "2", "--min-time", "0", "--quiet"]


def run_main(*argv: str) -> tuple[int, str, str]:
    out, err = io.StringIO(), io.StringIO()
    code = cli.main(list(argv), out, err)
    return code, out.getvalue(), err.getvalue()


def test_n_ranges_and_mechanism_lists_parse():
    assert cli.parse_ns("1024:16384") == (1024, 2048, 4096, 8192, 16384)
    assert cli.parse_ns("256:4096:3") == (256, 1024, 4096)
    assert cli.parse_ns("256,512") == (256, 512)
    with pytest.raises(argparse.ArgumentTypeError, match="MIN:MAX"):
        cli.parse_ns("4096:256")
    assert cli.parse_mechanisms("softmax,sliding_window:window=128") == (("softmax", {}),
                                                                          ("sliding_window", {"window": 128}))
    with pytest.raises(argparse.ArgumentTypeError, match="name=value"):
        cli.parse_mechanisms("sliding_window:128")
    assert cli._size("8GiB") == 8 * 2**30 and cli._size("512MiB") == 512 * 2**20 and cli._size("1000") == 1000


def test_help_documents_every_flag_and_the_exit_codes(capsys):
    assert cli.main(["sweep", "--help"]) == 0
    text = capsys.readouterr().out
    for flag in ("--mechanisms", "--n", "--batch", "--heads", "--d-model", "--dtype", "--device", "--mode",
                 "--causal", "--threads", "--warmup", "--min-repeats", "--min-time", "--point-budget",
                 "--no-memory", "--memory-margin", "--memory-limit", "--seed", "--extra-mechanisms", "--wait",
                 "--out", "--quiet"):
        assert flag in text
    assert "exit codes:" in text and "130" in text


def test_bad_arguments_exit_2_with_what_to_change():
    code, _, err = run_main("sweep", "--d-model", "500", "--heads", "6")
    assert code == 2 and "choose a multiple of 6" in err
    code, _, err = run_main("sweep", "--mechanisms", "linformer", "--causal")
    assert code == 2 and "Linformer cannot be causal" in err
    code, _, err = run_main("sweep", "--out", "run.txt")
    assert code == 2 and ".json or .csv" in err
    assert cli.main(["sweep", "--n", "x"], io.StringIO(), io.StringIO()) == 2


def test_tiny_sweep_end_to_end_in_a_fresh_process(tmp_path):
    out = tmp_path / "run.csv"
    proc = subprocess.run(
        [sys.executable, "-m", "attn_core", "sweep", "--mechanisms", "softmax,linear", "--n", "16:32",
         *TINY[:-1], "--wait", "600", "--out", str(out)],
        cwd=ROOT, capture_output=True, text=True, timeout=300, env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert proc.returncode == 0, proc.stderr
    assert "softmax n=16:" in proc.stderr and "saved to" in proc.stderr  # progress goes to stderr
    assert "Softmax (materialized)" in proc.stdout and "time ~n^" in proc.stdout  # the summary to stdout
    run = load_run(out)
    assert len(run.frame) == 4 and set(run.frame["status"]) == {"ok"}
    assert run.env["device"] == "cpu" and run.config["ns"] == [16, 32]


def test_failed_points_exit_1_and_are_saved(tmp_path):
    out = tmp_path / "run.json"
    code, stdout, _ = run_main("sweep", "--mechanisms", "softmax,raises", "--n", "16", *TINY,
                               "--extra-mechanisms", REF, "--out", str(out))
    assert code == 1 and "raises n=16: failed: RuntimeError: deliberate failure" in stdout
    assert load_run(out).frame["status"].tolist() == ["ok", "failed"]


def test_another_sweep_running_exits_3():
    with sweep_module.sweep_lock():
        code, _, err = run_main("sweep", "--mechanisms", "softmax", "--n", "16", *TINY, "--wait", "0.2")
    assert code == 3 and "another sweep is running" in err


def test_show_prints_a_saved_run_and_refuses_a_bad_file(tmp_path):
    code, _, _ = run_main("sweep", "--mechanisms", "softmax,sdpa", "--n", "16,32", *TINY,
                          "--out", str(tmp_path / "run.json"))
    assert code == 0
    code, stdout, _ = run_main("show", str(tmp_path / "run.json"))
    assert code == 0 and "Softmax (fused SDPA)" in stdout and "torch" in stdout
    (tmp_path / "bad.json").write_text("{oops")
    code, _, err = run_main("show", str(tmp_path / "bad.json"))
    assert code == 2 and "not valid JSON" in err


def test_show_says_what_the_page_says_of_a_busy_stopped_run(tmp_path):
    """The command line's summary carries the same sentences as the dashboard: disturbed points, a stopped sweep,
    a missing baseline."""
    from attn_core.engine import results
    from tests.charts.test_charts import results_frame

    frame = results_frame(ns=(64, 128, 256, 512), skip_last=False)
    frame.loc[frame["n"] == 512, ["disturbed", "foreign_cpu", "retaken"]] = [True, 0.9, 3]
    frame.loc[frame["n"] == 64, ["status", "reason"]] = ["cancelled", "cancelled before it was measured"]
    stamp = {"torch": "x", "device_gflops_disturbed": True}
    (tmp_path / "busy.json").write_bytes(results.to_json_bytes(results.Run(frame, stamp, {})))
    code, stdout, _ = run_main("show", str(tmp_path / "busy.json"))
    assert code == 0
    assert "busy with other programs while 2 of 6 points were timed (they used about 0.9 processor" in stdout
    assert "Stopped after 6 of 8 points" in stdout
    assert "No comparison with Softmax (fused SDPA): this sweep did not measure it." in stdout
    assert "matmul figure was measured while other programs were busy" in stdout


@pytest.mark.parametrize("points_to", ["missing.json", "kept.json"])
def test_an_out_that_is_a_symbolic_link_is_refused_and_nothing_is_created(tmp_path, points_to):
    """Before: a dangling link's target was created (empty) by the probe, even though the sweep was refused."""
    (tmp_path / "kept.json").write_text("earlier run")
    link = tmp_path / "run.json"
    link.symlink_to(tmp_path / points_to)
    code, _, err = run_main("sweep", "--mechanisms", "softmax", "--n", "16", *TINY, "--out", str(link))
    assert code == 2 and err.startswith(f"error: --out {str(link)!r} is a symbolic link") and "points in" not in err
    assert "name the file itself, or remove the link" in err
    assert sorted(os.listdir(tmp_path)) == ["kept.json", "run.json"] and link.is_symlink()
    assert (tmp_path / "kept.json").read_text() == "earlier run"


def test_a_sweep_refused_for_another_reason_creates_no_out_file(tmp_path):
    out = tmp_path / "run.json"
    code, _, err = run_main("sweep", "--mechanisms", "linformer", "--causal", "--n", "16", *TINY, "--out", str(out))
    assert code == 2 and "Linformer cannot be causal" in err and os.listdir(tmp_path) == []


def _wait_for_line(stream, prefix: str, deadline_s: float) -> list[str]:
    """The lines of `stream` up to the first starting with `prefix`, read in a thread (a pipe read blocks);
    AssertionError with what was read if none comes within `deadline_s`."""
    import queue
    import threading

    lines: queue.Queue = queue.Queue()
    threading.Thread(target=lambda: [lines.put(line) for line in stream], daemon=True).start()
    seen, deadline = [], time.monotonic() + deadline_s
    while not any(line.startswith(prefix) for line in seen):
        try:
            seen.append(lines.get(timeout=max(deadline - time.monotonic(), 0.01)))
        except queue.Empty:
            raise AssertionError(f"no line starting {prefix!r} within {deadline_s} s: {''.join(seen)}") from None
    return seen


@pytest.mark.parametrize("name, code", [("SIGTERM", 143), ("SIGHUP", 129)])
def test_a_stop_signal_cancels_the_sweep_and_saves_the_points_finished(tmp_path, name, code):
    """Before, only Ctrl-C saved the partial run: `timeout`, a closed terminal or a container stop left nothing.
    The second point hangs until the signal; the first has finished by then."""
    out = tmp_path / "run.json"
    proc = subprocess.Popen(
        [sys.executable, "-m", "attn_core", "sweep", "--mechanisms", "softmax,hangs", "--n", "16,32",
         *TINY[:-1], "--extra-mechanisms", REF, "--wait", "0", "--out", str(out)],
        cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        env={**os.environ, "PYTHONPATH": str(ROOT), "TMPDIR": str(tmp_path)})  # TMPDIR: a private sweep lock
    try:
        _wait_for_line(proc.stderr, "softmax n=16: ", deadline_s=20)
        proc.send_signal(getattr(signal, name))
        assert proc.wait(timeout=20) == code
    finally:
        proc.kill()
        proc.wait()
    run = load_run(out)
    assert run.frame["status"].tolist() == ["ok", "cancelled", "cancelled", "cancelled"]
    assert run.frame["mechanism"].tolist() == ["softmax", "hangs", "softmax", "hangs"]


def test_the_point_count_is_said_before_measuring_and_a_sweep_of_thousands_is_refused(tmp_path):
    """Before, `--n` with 10,000 values started a sweep of 20,000 points without a word."""
    code, _, err = run_main("sweep", "--mechanisms", "softmax,linear", "--n", "16,32", *TINY)
    assert code == 0 and err.startswith("measuring 4 points: 2 mechanisms × 2 lengths; estimated ")
    many = ",".join(str(n) for n in range(16, 10_016))
    out = tmp_path / "run.json"
    code, _, err = run_main("sweep", "--mechanisms", "softmax,linear", "--n", many, *TINY, "--out", str(out))
    assert code == 2 and err == ("error: the sweep has 10,000 lengths × 2 mechanisms = 20,000 points, more than the "
                                 "1,000 a sweep may have; give fewer lengths (at most 500 with 2 mechanisms, e.g. "
                                 "256:65536:9) or fewer mechanisms\n")
    assert not out.exists()


def test_the_estimate_is_each_points_calls_at_its_spec_flops_over_the_matmul_rate():
    """Two points of softmax, timed as 1 warm-up + 1 memory call + 3 samples of one call each (no time floor): the
    estimate at 50 GFLOP/s is 5 calls of each point's executed FLOPs, and 10× that at a tenth of the rate."""
    import dataclasses

    from attn_core import MECHANISMS
    from attn_core.engine.config import DEFAULT_SWEEP, plan
    from attn_core.engine.problem import Settings

    settings = Settings(warmup=1, min_repeats=3, min_time_s=0.0, point_budget_s=1e9, measure_memory=True)
    config = dataclasses.replace(DEFAULT_SWEEP.replaced(mechanisms=(("softmax", {}),), ns=(1024, 2048), device="cpu"),
                                 settings=settings)
    spec = MECHANISMS["softmax"]
    calls = [spec.cost.executed(p.shape, **spec.defaults) / 50e9 for p in plan(config)]
    assert min(calls) > 1e-3  # each call past the 1 ms a sample is made of: 5 calls a point, nothing else
    fast, slow = sweep_module.estimate_s(config, 50.0, MECHANISMS)
    assert fast == pytest.approx(5 * sum(calls)) and slow == pytest.approx(50 * sum(calls))


def test_a_sweep_says_its_estimated_time_and_how_before_measuring():
    code, _, err = run_main("sweep", "--mechanisms", "softmax,linear", "--n", "16,32", *TINY)
    first = err.splitlines()[0]
    assert code == 0 and first.startswith("measuring 4 points: 2 mechanisms × 2 lengths; estimated "), first
    assert re.search(r"; estimated (under 1 s|\d+ s)(–\d+ s)? on a quiet machine \(from the specs' FLOPs at this "
                     r"machine's measured matmul rate, [\d,]+ GFLOP/s, down to a tenth of it\)", first), first


# -- the verbs: one module each behind one protocol ------------------------------------------------------------------

def test_every_verb_is_a_module_with_a_name_a_parser_and_a_run():
    names = [verb.NAME for verb in cli.verbs()]
    assert names == ["sweep", "show", "plan", "runs", "recall", "distributed", "native"]
    assert all(callable(verb.add_parser) and callable(verb.run) for verb in cli.verbs())
    sub = next(a for a in cli.build_parser()._actions if isinstance(a, argparse._SubParsersAction))
    assert list(sub.choices) == names
    assert cli.verbs()[2].__name__ == "attn_core.studies.planner.cli"  # a study's verb lives in its study's folder


def test_native_status_says_the_kernels_form_and_build_says_why_it_cannot(monkeypatch):
    from attn_core import native

    code, out, _ = run_main("native", "status")
    assert code == 0 and out == native.describe() + "\n"
    monkeypatch.setattr(native, "build", lambda: "C++ (c++ 12, -O3)")
    assert run_main("native", "build") == (0, "C++ (c++ 12, -O3)\n", "")

    def cannot() -> str:
        raise RuntimeError("the C++ kernels cannot be built: no C++ compiler on the PATH (set CXX)")

    monkeypatch.setattr(native, "build", cannot)
    assert run_main("native", "build") == (1, "", "error: the C++ kernels cannot be built: no C++ compiler on the "
                                                  "PATH (set CXX)\n")
    assert run_main("native")[0] == 2


# meta-llama/Meta-Llama-3-8B, config.json (the fields the planner and the weight count read)
LLAMA3_8B = {"vocab_size": 128256, "hidden_size": 4096, "intermediate_size": 14336, "num_hidden_layers": 32,
             "num_attention_heads": 32, "num_key_value_heads": 8, "max_position_embeddings": 8192,
             "rope_theta": 500000.0, "tie_word_embeddings": False, "torch_dtype": "bfloat16", "model_type": "llama"}


def write_config(tmp_path: Path, config: dict) -> str:
    import json

    path = tmp_path / "config.json"
    path.write_text(json.dumps(config))
    return str(path)


def test_plan_reads_a_hugging_face_config_and_counts_its_weights(tmp_path):
    import json

    path = write_config(tmp_path, LLAMA3_8B)
    code, out, err = run_main("plan", path, "--context", "128k", "--json")
    assert code == 0 and err == ""
    made = json.loads(out)
    assert made["kv_cache_bytes"] == 32 * 2 * 8 * 128 * 131072 * 2 == 16 * 2**30  # layers, k and v, heads, dims, B
    assert abs(made["parameters"] - 8.03e9) <= 0.005 * 8.03e9  # Meta's model card: 8.03B
    assert made["weights_bytes"] == 2 * made["parameters"]  # bfloat16
    assert made["active_parameters"] == made["parameters"] - 128256 * 4096  # a token reads one embedding row
    assert made["active_weights_bytes"] == 2 * made["active_parameters"]
    code, out, err = run_main("plan", path, "--context", "128k")
    assert code == 0 and "KV cache 16.0 GiB" in out
    weights = next(line for line in out.splitlines() if "weights:" in line)
    assert re.search(r"weights: 8,0\d\d,\d{3},\d{3} parameters, 15\.0 GiB in bfloat16; active a token: "
                     r"7,\d{3},\d{3},\d{3} parameters, 14\.0 GiB", weights)


def test_a_configs_notes_are_printed_escaped(tmp_path):
    path = write_config(tmp_path, {**LLAMA3_8B, "frob\x1b[2Jnicate": 1, "_name_or_path": "meta/\x1b]0;x\x07Llama"})
    code, out, _ = run_main("plan", path, "--context", "4096")
    assert code == 0 and "\x1b" not in out and "\x07" not in out
    assert r"note: fields this reader does not use, left out of the plan: frob\x1b[2Jnicate" in out
    assert out.startswith(r"\x1b]0;x\x07Llama at 4,096 tokens")
    code, _, err = run_main("plan", write_config(tmp_path, {**LLAMA3_8B, "num_key_value_heads": 5}))
    assert code == 2 and err.startswith("error: ") and "num_key_value_heads" in err


def test_plan_on_a_gpu_gives_the_roofline_with_its_method_and_sources():
    """Llama-3-8B on an H100 SXM at 8k, batch 1, bf16. A step reads its 8.03e9 weights less the untied input
    embedding table, of which a token reads one row (128,256 × 4,096 = 525,336,576): 7,504,663,424 in bf16,
    15,009,326,848 B; and the cache: 32 layers × 2 × 8 heads × 128 × 2 B = 128 KiB a token, × 8,192 = 1 GiB; at
    3.35e12 B/s that is (15,009,326,848 + 1,073,741,824) / 3.35e12 s = 4.80 ms, 208.29 tokens/s, memory-bound (FLOPs
    are ~2 × 7.5e9, far below 989e12 × that)."""
    code, out, err = run_main("plan", "llama-3-8b", "--context", "8k", "--gpu", "h100-sxm", "--json")
    assert code == 0, err
    got = json.loads(out)
    step = (2 * (8.03e9 - 128_256 * 4096) + 32 * 2 * 8 * 128 * 2 * 8192) / 3.35e12
    assert got["decode_tokens_per_s"] == pytest.approx(1 / step, rel=1e-3)
    assert got["bandwidth_bytes_per_s"] == 3.35e12 and got["flops_per_s"] == pytest.approx(989e12, rel=0.01)
    assert got["roofline"]["decode_bound"].startswith("memory-bound")
    assert "not measured" in got["roofline"]["method"] and "datasheet" in got["roofline"]["device_source"]
    code, text, err = run_main("plan", "llama-3-8b", "--context", "8k", "--gpu", "h100-sxm")
    assert code == 0 and "decode 208.3 tokens/s (memory-bound" in text and "a roofline prediction" in text


def test_plan_as_an_engine_holds_it_and_bad_choices_refused():
    # Gemma-3-27B at 128k: vLLM's uniform pages hold every layer at full size, more than the window formula
    code, out, err = run_main("plan", "gemma-3-27b", "--context", "128k", "--engine", "vllm-uniform", "--json")
    assert code == 0, err
    held = json.loads(out)["engine_cache"]
    assert held["engine"] == "vllm-uniform" and held["bytes"] > json.loads(out)["kv_cache_bytes"]
    code, out, err = run_main("plan", "llama-3-8b", "--gpu", "a-toaster")
    assert code == 2 and "a-toaster" in err and "h100" in err.lower()
    code, out, err = run_main("plan", "llama-3-8b", "--cache-dtype", "int3")
    assert code == 2 and "int3" in err
