"""Figures measured elsewhere, in tidy frames for overlays: published tables (with their citations) and saved runs
from other machines. Neither is ever mixed into this machine's measurements."""
from __future__ import annotations

from importlib import resources
from io import StringIO
from typing import Mapping

import pandas as pd

from attn_core.engine.untrusted import clipped, printable

PUBLISHED = "published, different hardware"
LRA = {
    "file": "lra_efficiency.csv",
    "source": "LRA (Tay et al. 2021)",
    "citation": "Tay et al., 'Long Range Arena: A Benchmark for Efficient Transformers', ICLR 2021, arXiv 2011.04006, "
                "Table 2",
    "hardware": "4x4 TPU v3",
    "short": "LRA · TPU v3",
    "setup": "byte-level text classification, batch 32; training steps per second and peak memory per TPU device. "
             "Sparse Transformer and Longformer were not benchmarked for speed; the Synthesizer 3K row is printed "
             "this way in the paper and breaks its row's trend.",
    "baseline": "Transformer",
}
_FLASH = {
    "source": "FlashAttention (Dao et al. 2022)",
    "citation": "Dao et al., 'FlashAttention: Fast and Memory-Efficient Exact Attention with IO-Awareness', "
                "NeurIPS 2022, arXiv 2205.14135, Appendix E.6",
    "hardware": "A100 40 GB",
    "short": "FlashAttention paper · A100",
    "baseline": "PyTorch Attention",
}
FLASH_TIME = {**_FLASH, "file": "flashattention_a100_forward_ms.csv",
              "setup": "forward pass, no dropout, no masking; batch 16, 8 heads, head dim 64, fp16 (Local Attention "
                       "fp32); milliseconds"}
FLASH_MEMORY = {**_FLASH, "file": "flashattention_a100_memory_mb.csv",
                "setup": "memory of forward + backward; batch 16, 8 heads, head dim 64, fp16 (Local Attention "
                         "fp32); MB"}
SOURCES = (LRA, FLASH_TIME, FLASH_MEMORY)
# The mechanism of this catalogue closest to a published method (absent: no counterpart here). Longformer adds
# global tokens to its sliding window; Block Sparse is the Sparse Transformer pattern in blocks.
CLOSEST = {"Transformer": "softmax", "PyTorch Attention": "softmax",
           "FlashAttention": "sdpa", "Local Attention": "local", "Linformer": "linformer", "Performer": "performer",
           "Linear Trans.": "linear", "Longformer": "sliding_window", "Block Sparse": "sparse"}


def _read(source: Mapping[str, str]) -> pd.DataFrame:
    """A shipped CSV, read through importlib.resources so it works from the repo and from an installed package."""
    text = resources.files(__package__).joinpath("data", source["file"]).read_text(encoding="utf-8")
    return pd.read_csv(StringIO(text))


def _stamped(frame: pd.DataFrame, source: Mapping[str, str]) -> pd.DataFrame:
    out = frame.copy()
    out["mechanism"] = out["method"].map(CLOSEST).fillna("")
    for column in ("source", "short", "citation", "hardware", "setup"):
        out[column] = source[column]
    return out


def lra_efficiency() -> pd.DataFrame:
    """LRA Table 2, one row per (method, n): steps_per_sec, speedup_vs_transformer, peak_memory_gb, with the
    closest `mechanism` here and source, citation, hardware, setup columns."""
    frame = _read(LRA).rename(columns={"model": "method", "seq_len": "n"})
    return _stamped(frame, LRA)


def _wide_by_n(source: Mapping[str, str], value: str) -> pd.DataFrame:
    """A table with one column per sequence length → one row per (method, n); empty cells (OOM, not run) dropped."""
    long = _read(source).melt(id_vars="method", var_name="n", value_name=value).dropna(subset=[value])
    long["n"] = long["n"].astype(int)
    return _stamped(long.reset_index(drop=True), source)


def flash_forward_ms() -> pd.DataFrame:
    """FlashAttention paper, A100 forward time in ms, one row per (method, n) with citation columns."""
    return _wide_by_n(FLASH_TIME, "time_ms")


def flash_memory_mb() -> pd.DataFrame:
    """FlashAttention paper, A100 forward + backward memory in MB, one row per (method, n) with citation columns."""
    return _wide_by_n(FLASH_MEMORY, "memory_mb")


def _relative_to(frame: pd.DataFrame, value: str, baseline: str, invert: bool) -> pd.Series:
    """value / baseline's value at the same n (baseline / value when `invert`, i.e. a speed-up from times)."""
    base = frame[frame["method"] == baseline].set_index("n")[value]
    ref = frame["n"].map(base)
    return ref / frame[value] if invert else frame[value] / ref


def relative(metric: str) -> pd.DataFrame:
    """Published figures relative to each paper's standard attention, one row per (source, method, n).

    metric 'speed': speed-up (LRA: training steps/s ratio as printed; FlashAttention: forward time of PyTorch
    Attention ÷ the method's). metric 'memory': the method's memory ÷ standard attention's. Rows where the
    standard attention has no figure (out of memory) are dropped. Columns: source, short (source and hardware in
    a few words), method, mechanism (closest here, '' if none), n, value, baseline, hardware, setup, citation,
    label (PUBLISHED).
    """
    if metric == "speed":
        lra = lra_efficiency().assign(value=lambda f: f["speedup_vs_transformer"])
        flash = flash_forward_ms()
        flash["value"] = _relative_to(flash, "time_ms", FLASH_TIME["baseline"], invert=True)
    elif metric == "memory":
        lra = lra_efficiency()
        lra["value"] = _relative_to(lra, "peak_memory_gb", LRA["baseline"], invert=False)
        flash = flash_memory_mb()
        flash["value"] = _relative_to(flash, "memory_mb", FLASH_MEMORY["baseline"], invert=False)
    else:
        raise ValueError(f"metric must be 'speed' or 'memory', got {metric!r}")
    lra["baseline"], flash["baseline"] = LRA["baseline"], _FLASH["baseline"]
    columns = ["source", "short", "method", "mechanism", "n", "value", "baseline", "hardware", "setup", "citation"]
    out = pd.concat([lra[columns], flash[columns]], ignore_index=True).dropna(subset=["value"])
    return out.assign(label=PUBLISHED).reset_index(drop=True)


def citations() -> list[str]:
    """One line per shipped table: source, citation, hardware."""
    return [f"{s['source']}: {s['citation']} ({s['hardware']}; {s['setup']})" for s in SOURCES]


# ---- saved runs from several machines (attn_core.results.Run objects) ----

RUN_KEYS = ["mechanism", "params", "n", "mode", "dtype", "causal", "batch", "heads", "d_model"]
SETTINGS = ["mode", "dtype", "causal", "batch", "heads", "d_model"]


def machine(env: Mapping) -> str:
    """A run's machine in words, from its environment stamp (device name, else device, else 'unknown machine')."""
    return clipped(printable(str(env.get("device_name") or env.get("device") or "unknown machine")), 120)


def runs_frame(runs: Mapping[str, object]) -> pd.DataFrame:
    """The measured rows of several named runs in one frame, with `run` (its name), `machine` and `source`
    ('name · machine') columns; rows that were not measured (status ≠ 'ok') are left out."""
    frames = []
    for name, run in runs.items():
        f = run.frame[run.frame["status"] == "ok"].copy()
        f["run"], f["machine"] = name, machine(run.env)
        f["source"] = f"{name} · {f['machine'].iloc[0]}" if len(f) else name
        frames.append(f)
    return pd.concat(frames, ignore_index=True) if frames else pd.DataFrame(columns=RUN_KEYS + ["run", "source"])


def relative_to_baseline(frame: pd.DataFrame, metric: str, baseline: str = "softmax") -> pd.DataFrame:
    """Per run, each mechanism against `baseline` at the same n and settings, in the published tables' terms.

    metric 'time_median_s': speed-up = baseline time ÷ mechanism time; 'peak_bytes': mechanism memory ÷ baseline
    memory. Columns: run, machine, source, mechanism, label, n, value. Points without a baseline are dropped.
    """
    if metric not in ("time_median_s", "peak_bytes"):
        raise ValueError(f"metric must be 'time_median_s' or 'peak_bytes', got {metric!r}")
    keys = ["run", "n"] + SETTINGS
    base = frame[frame["mechanism"] == baseline][keys + [metric]].rename(columns={metric: "base"})
    merged = frame.merge(base.drop_duplicates(keys), on=keys, how="inner")
    value = merged["base"] / merged[metric] if metric == "time_median_s" else merged[metric] / merged["base"]
    out = merged.assign(value=value)[["run", "machine", "source", "mechanism", "label", "n", "value"]]
    return out[out["value"].map(lambda x: 0 < x < float("inf"))].reset_index(drop=True)


def run_ratio(a: pd.DataFrame, b: pd.DataFrame, metric: str = "time_median_s") -> pd.DataFrame:
    """Run B ÷ run A for each point both measured with the same mechanism, parameters, n and settings.

    Columns: mechanism, label, params, n, a, b, ratio (> 1: B took longer / more memory). Empty when the runs
    share no point.
    """
    ok_a, ok_b = (f[f["status"] == "ok"][RUN_KEYS + ["label", metric]] for f in (a, b))
    merged = ok_a.merge(ok_b.drop(columns="label"), on=RUN_KEYS, suffixes=("_a", "_b"))
    merged = merged.rename(columns={f"{metric}_a": "a", f"{metric}_b": "b"})
    merged["ratio"] = merged["b"] / merged["a"]
    return merged[["mechanism", "label", "params", "n", "a", "b", "ratio"] + SETTINGS].reset_index(drop=True)
