"""Published reference tables: shipped with the package, tidy, cited, and relative figures as printed."""
from __future__ import annotations

from importlib import resources

import pytest

from attn_core.insight import published as ref


def test_data_files_ship_inside_the_package():
    data = resources.files("attn_core.insight").joinpath("data")
    for source in ref.SOURCES:
        assert data.joinpath(source["file"]).is_file()


def test_lra_table_is_tidy_and_cited():
    lra = ref.lra_efficiency()
    assert len(lra) == 36 and lra["n"].tolist()[:4] == [1024, 2048, 3072, 4096]
    row = lra[(lra["method"] == "Performer") & (lra["n"] == 4096)].iloc[0]
    assert (row["steps_per_sec"], row["speedup_vs_transformer"], row["peak_memory_gb"]) == (8.0, 5.7, 1.06)
    assert row["mechanism"] == "performer" and "arXiv 2011.04006" in row["citation"]
    assert row["hardware"] == "4x4 TPU v3"


def test_flash_tables_drop_empty_cells():
    times = ref.flash_forward_ms()
    assert times[times["method"] == "PyTorch Attention"]["n"].max() == 8192  # out of memory beyond
    assert times[times["method"] == "FlashAttention"]["n"].max() == 65536
    row = times[(times["method"] == "Linformer") & (times["n"] == 4096)].iloc[0]
    assert row["time_ms"] == 2.09 and "arXiv 2205.14135" in row["citation"]
    memory = ref.flash_memory_mb()
    assert memory["memory_mb"].notna().all() and set(memory.columns) >= {"source", "citation", "hardware", "setup"}


def test_relative_figures_against_each_papers_standard_attention():
    speed = ref.relative("speed")
    flash = speed[speed["source"] == ref.FLASH_TIME["source"]].set_index(["method", "n"])["value"]
    assert flash["Linformer", 4096] == pytest.approx(16.47 / 2.09)
    assert flash["PyTorch Attention", 1024] == 1.0
    assert ("Linformer", 16384) not in flash.index  # no PyTorch figure there to compare against
    lra = speed[speed["source"] == ref.LRA["source"]].set_index(["method", "n"])["value"]
    assert lra["Linformer", 2048] == 1.9  # as printed
    memory = ref.relative("memory").set_index(["source", "method", "n"])["value"]
    assert memory[ref.LRA["source"], "Performer", 4096] == pytest.approx(1.06 / 9.48)
    assert memory[ref.FLASH_MEMORY["source"], "FlashAttention", 1024] == pytest.approx(209 / 1184)
    assert (ref.relative("memory")["label"] == ref.PUBLISHED).all()
    with pytest.raises(ValueError, match="'speed' or 'memory'"):
        ref.relative("flops")


def test_citations_name_papers_and_arxiv_ids():
    lines = ref.citations()
    assert len(lines) == 3 and all("arXiv" in line for line in lines)


def _run(device: str, rows: list[tuple[str, int, float, float]], status: str = "ok"):
    """A Run from (mechanism, n, time, peak bytes) tuples with every other column filled in."""
    from attn_core import MECHANISMS
    from attn_core.engine import results

    full = [dict(mechanism=m, label=MECHANISMS[m].label, exact=MECHANISMS[m].exact, params="{}", n=n, batch=1,
                 heads=2, d_model=64, head_dim=32, dtype="float32", device="cpu", mode="forward", causal=False,
                 status=status, reason="", time_median_s=t, time_iqr_s=0.0, time_samples=[t], repeats=1,
                 peak_bytes=b, memory_method="test", predicted_bytes=b, theory_flops=1.0, gflops=1.0,
                 device_gflops=1.0, pct_of_device=1.0, sdpa_backend="math", threads=1.0) for m, n, t, b in rows]
    return results.Run(results.frame_from_rows(full), {"device_name": device}, {})


def test_runs_frame_relative_figures_and_ratio_by_hand():
    a = _run("Laptop", [("softmax", 512, 4.0, 100.0), ("linear", 512, 1.0, 10.0), ("linear", 1024, 2.0, 20.0)])
    b = _run("Server", [("softmax", 512, 2.0, 100.0), ("linear", 512, 0.25, 10.0)])
    frame = ref.runs_frame({"a.json": a, "b.csv": b})
    assert set(frame["source"]) == {"a.json · Laptop", "b.csv · Server"} and len(frame) == 5
    speed = ref.relative_to_baseline(frame, "time_median_s").set_index(["run", "mechanism", "n"])["value"]
    assert speed["a.json", "linear", 512] == 4.0 and speed["b.csv", "linear", 512] == 8.0
    assert ("a.json", "linear", 1024) not in speed.index  # no softmax at 1024 to compare against
    memory = ref.relative_to_baseline(frame, "peak_bytes").set_index(["run", "mechanism", "n"])["value"]
    assert memory["a.json", "linear", 512] == 0.1
    ratio = ref.run_ratio(a.frame, b.frame, "time_median_s").set_index(["mechanism", "n"])["ratio"]
    assert ratio.to_dict() == {("softmax", 512): 0.5, ("linear", 512): 0.25}  # only the shared points
    with pytest.raises(ValueError, match="time_median_s"):
        ref.relative_to_baseline(frame, "gflops")


def test_runs_frame_leaves_out_unmeasured_points():
    skipped = _run("Laptop", [("softmax", 512, float("nan"), float("nan"))], status="oom")
    assert ref.runs_frame({"x.json": skipped}).empty
    assert ref.machine({}) == "unknown machine" and ref.machine({"device": "cuda"}) == "cuda"
