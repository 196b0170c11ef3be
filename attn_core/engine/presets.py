"""Talk presets as sweep configurations (one or several sweeps each), and the config a saved run was measured with."""
from __future__ import annotations

import json
from dataclasses import dataclass

import pandas as pd

from attn_core.mechanisms.flex import IMPLEMENTATIONS
from ..mechanisms import MEASURED
from .config import DEFAULT_SWEEP, SweepConfig, log_spaced

# Accelerators are far faster than a laptop CPU: presets reach this many times longer sequences there.
ACCELERATOR_REACH = 4


@dataclass(frozen=True)
class Preset:
    """One click on stage: the sweeps to run, what to look at, and how to draw it."""

    name: str
    look_for: str  # one sentence the speaker can read out
    configs: tuple[SweepConfig, ...]
    metric: str = "time_median_s"  # the chart to show first
    log: bool = True
    # The seconds it announces and keeps to (the job's wall-clock budget): a figure attn_core/benchmarks/dashboard.py
    # --demos measured through the dashboard's job with a process spinning on one core; None: not measured, no promise.
    seconds: float | None = None

    def for_device(self, device: str, dtype: str | None = None) -> tuple[SweepConfig, ...]:
        """The configs on `device`, with longer sequences on an accelerator."""
        reach = 1 if device == "cpu" else ACCELERATOR_REACH
        return tuple(c.replaced(device=device, dtype=dtype or c.problem.dtype,
                                ns=log_spaced(c.ns[0] * reach, c.ns[-1] * reach, len(c.ns))) for c in self.configs)


def _config(mechanisms: tuple[str, ...], n_min: int, n_max: int, steps: int, **settings) -> SweepConfig:
    """The dashboard's default sweep (its short timing) with these mechanisms, lengths and settings."""
    return DEFAULT_SWEEP.replaced(mechanisms=tuple((key, {}) for key in mechanisms),
                                  ns=log_spaced(n_min, n_max, steps), **settings)


PRESETS: dict[str, Preset] = {p.name: p for p in (
    Preset("The quadratic wall",
           "Softmax's time and memory bend up as n² while the window and linear attention grow as n.",
           (_config(("softmax", "sliding_window", "linear"), 256, 4096, 5),), metric="peak_bytes",
           # attn_core/benchmarks/dashboard.py --demos, 2026-11-28: 52.7 s on 2 cores at load 13–15, one core spinning
           seconds=53.0),
    Preset("Where linear attention wins",
           "Below n* the plain softmax is faster; past the marked crossover the linear mechanisms win.",
           (_config(("softmax", "linear", "performer"), 128, 4096, 6, d_model=256, heads=4),),
           # attn_core/benchmarks/dashboard.py --demos --try-s 60, 2026-11-28: 60.5 s on 2 cores, one core spinning
           seconds=60.0),
    Preset("Materialized vs fused softmax",
           "Same arithmetic, same answer: the fused kernel never stores the n×n scores, so its memory grows as n.",
           (_config(("softmax", "sdpa"), 256, 4096, 5),), metric="peak_bytes",
           # attn_core/benchmarks/dashboard.py --demos --try-s 60, 2026-11-28: 39.2 s on 2 cores, one core spinning
           seconds=40.0),
    Preset("Causal vs bidirectional",
           "A causal mask halves the useful work; only kernels that skip the masked half get faster.",
           tuple(_config(("softmax", "sdpa", "linear"), 256, 2048, 4, causal=causal) for causal in (False, True)),
           # attn_core/benchmarks/dashboard.py --demos --try-s 60, 2026-11-28: 60.3 s on 2 cores, one core spinning
           seconds=60.0),
    Preset("The O(n log n) middle",
           "Reformer hashes similar tokens into buckets: a sort, n·log n, between softmax's n² and linear's n.",
           (_config(("softmax", "reformer", "linear"), 256, 4096, 5),),
           # attn_core/benchmarks/dashboard.py --demos --try-s 60, 2026-11-28: 58.1 s on 2 cores, one core spinning
           seconds=60.0),
    Preset("Long documents",
           "Longformer's global tokens and BigBird's random blocks cost little on top of the window; the fused "
           "exact kernel still grows as n².",
           (_config(("sdpa", "sliding_window", "longformer", "bigbird"), 512, 8192, 5),),
           # attn_core/benchmarks/dashboard.py --demos --try-s 60, 2026-11-28: 61.1 s on 2 cores, one core spinning
           seconds=60.0),
    Preset("Why the KV cache hurts",
           "Each new token reads the whole key-value cache: softmax's time per token and its cache grow as the "
           "context n, a sliding window's stay flat once n passes the window.",
           (_config(("softmax", "sdpa", "sliding_window"), 1024, 32768, 6, mode="generate"),),
           # attn_core/benchmarks/dashboard.py --demos --try-s 60, 2026-11-28: 60.4 s on 2 cores, one core spinning
           seconds=60.0),
    Preset("Constant-memory generation",
           "Linear attention and Performer carry a fixed-size state, the same bytes at any context, while softmax's "
           "key-value cache grows as n; past the marked crossover their tokens are cheaper too.",
           (_config(("softmax", "linear", "performer"), 1024, 32768, 6, mode="generate"),), metric="peak_bytes",
           # attn_core/benchmarks/dashboard.py --demos --try-s 60, 2026-11-28: 60.4 s on 2 cores, one core spinning
           seconds=60.0),
)}
PRESETS.update({p.name: p for p in (
    Preset("Heads that share keys",
           "One model width, three caches: multi-head attention (MHA) keeps the keys and values of all 32 heads, "
           "grouped-query (GQA-8) of 8, multi-query (MQA) of 1; a new token reads 4× and 32× less, and its time "
           "falls with that read.",
           (DEFAULT_SWEEP.replaced(mechanisms=(("sdpa", {}), ("sdpa", {"kv_heads": 8}), ("sdpa", {"kv_heads": 1})),
                                   ns=log_spaced(1024, 32768, 6), mode="generate", heads=32, d_model=2048),),
           metric="peak_bytes",
           # attn_core/benchmarks/dashboard.py --demos --try-s 60, 2026-11-28: 60.4 s on 2 cores, one core spinning
           seconds=60.0),
    Preset("Linear attention grew gates",
           "Linear attention's fixed-size state learned to forget (Mamba-2's decay per head) and to overwrite what "
           "it stored (Gated DeltaNet's delta rule): all three grow as n, in chunks, while softmax bends up as n².",
           (_config(("softmax", "linear", "mamba2", "gated_deltanet"), 256, 4096, 5, causal=True),),
           # attn_core/benchmarks/dashboard.py --demos --try-s 60, 2026-11-28: 60.8 s on 2 cores, one core spinning
           seconds=60.0),
    Preset("Learned sparsity",
           "Each query reads a few thousand chosen keys: a window of 256, the top 256 keys of DeepSeek's indexer "
           "(a cheap n² pass picks them), NSA's compressed blocks, 16 selected blocks and a window of 512. Their "
           "time grows near n while softmax bends up as n².",
           (DEFAULT_SWEEP.replaced(mechanisms=(("softmax", {}), ("sliding_window", {}), ("topk", {"top_k": 256}),
                                               ("nsa", {})),
                                   ns=log_spaced(1024, 8192, 4), causal=True),),
           # attn_core/benchmarks/dashboard.py --demos --try-s 60, 2026-11-28: 66.1 s on 2 cores, one core spinning
           seconds=60.0),
    # Llama 3 8B's attention width (Meta's config: hidden size 4096, 32 heads of 128, 8 key/value heads) with
    # DeepSeek-V2/V3's latent of 512 + 64 values a token (arXiv 2405.04434, 2412.19437), the MLA specs' defaults
    Preset("One cache, four sizes",
           "One model width (32 heads of 128), four caches a token and layer: MHA keeps 8,192 values, GQA-8 2,048, "
           "MLA's latent 576, MQA 256. Absorbed MLA reads its latent as it is; naive MLA rebuilds every head's keys "
           "and values from it at each step, and its time per token climbs far above the others'.",
           (DEFAULT_SWEEP.replaced(mechanisms=(("sdpa", {}), ("sdpa", {"kv_heads": 8}), ("sdpa", {"kv_heads": 1}),
                                               ("mla", {}), ("mla_naive", {})),
                                   ns=log_spaced(512, 16384, 6), mode="generate", heads=32, d_model=4096),),
           metric="peak_bytes",
           # attn_core/benchmarks/dashboard.py --demos, 2026-11-28: 104.8 s on 2 cores at load 13–15, one core
           # spinning
           seconds=105.0),
)})
PRESETS.update({p.name: p for p in (
    Preset("One mask, three kernels",
           "One sliding window of 256, three implementations with the same answer: our banded kernel, PyTorch's "
           "compiled FlexAttention and SDPA with a dense boolean mask. The dense mask grows as n²; Flex's compile "
           "and block mask are paid once, before timing, and shown apart.",
           tuple(DEFAULT_SWEEP.replaced(mechanisms=(("sliding_window", {"window": 256}),),
                                        ns=log_spaced(1024, 8192, 4), implementation=implementation)
                 for implementation in IMPLEMENTATIONS),
           # attn_core/benchmarks/dashboard.py --demos --try-s 60, 2026-11-28: 63.8 s on 2 cores, one core spinning
           seconds=60.0),
)})
PRESETS.update({p.name: p for p in (
    # Kimi Linear (arXiv 2510.26692) runs three KDA layers to one MLA layer; KDA is Gated DeltaNet (arXiv 2412.06464)
    # with a decay for each key channel
    Preset("Kimi Linear vs Gated DeltaNet vs softmax",
           "Each new token: softmax reads a key-value cache that grows with the context n, Gated DeltaNet and Kimi "
           "Linear's KDA update a d × d state a head, the same size at any context, so their time per token stays "
           "flat; KDA's decay for each key channel changes what a step multiplies, not how much.",
           (_config(("softmax", "gated_deltanet", "kda"), 1024, 16384, 5, mode="generate"),)),
    # RetNet (arXiv 2307.08621), simple GLA (arXiv 2312.06635) and lightning attention (arXiv 2501.08313) are
    # mamba2's kernel at other gates (attn_core/mechanisms/retention.py), so mamba2's line is what they cost
    Preset("The retention family",
           "RetNet's retention, simple GLA and MiniMax's lightning attention are one kernel, Mamba-2's chunked SSD, "
           "with a decay a head (fixed, or one a token): the Mamba-2 line is what each costs. It grows as n, like "
           "linear attention, which forgets nothing; the decay is what lets them keep recent tokens sharp.",
           (_config(("linear", "mamba2"), 256, 4096, 5, causal=True),)),
)})
PRESETS.update({p.name: p for p in (
    # StreamingLLM keeps the first 4 tokens beside the window (arXiv 2309.17453, §3.2: four initial tokens suffice);
    # gpt-oss gives each head a learned sink logit on its 128-token sliding-window layers (arXiv 2508.10925)
    Preset("Sinks keep a window stable",
           "Each new token: the full cache grows with the context n, while a window of 256 keeps 257 tokens' keys "
           "and values at any n, and StreamingLLM's 4 first tokens beside it 261. gpt-oss's learned sink is one "
           "logit a head in the softmax, not a token: its window of 128 keeps 129 tokens and the sink costs no cache.",
           (DEFAULT_SWEEP.replaced(mechanisms=(("sdpa", {}), ("sliding_window", {"window": 256}),
                                               ("sliding_window", {"window": 256, "keep_first": 4}),
                                               ("sliding_window", {"window": 128, "sinks": True})),
                                   ns=log_spaced(1024, 32768, 6), mode="generate"),),
           metric="peak_bytes",
           # attn_core/benchmarks/dashboard.py --demos, 2026-11-28: 60.3 s on 2 cores at load 2.9–3.8, one core
           # spinning (the machine busy: 18 of 24 points kept disturbed, drawn hollow)
           seconds=60.0),
)})
QUICK_DEMO = Preset("Quick demo", "Softmax against linear attention on short sequences.",
                    (_config(("softmax", "linear"), 128, 2048, 5, d_model=256, heads=4),),
                    # attn_core/benchmarks/dashboard.py --demos, 2026-11-28: 29.9 s (16.1 s of it starting a fresh
                    # worker) on 2 cores at load 13–15, one core spinning
                    seconds=30.0)


def config_of(frame: pd.DataFrame) -> tuple[SweepConfig, list[str]]:
    """The sweep a results frame was measured with, read from its rows (the file's own config is not trusted), and
    what of the frame that one config cannot hold: a second mask, a second shape, mechanisms this build lacks."""
    first = frame.iloc[0]
    own = [c for c in ("sinks", "keep_first") if c in frame]  # a series' own sinks and first tokens kept
    seen = frame.drop_duplicates(["mechanism", "params", "kv_heads", *own])
    shared = frame["kv_heads"].nunique() > 1  # then each series says its own key/value heads
    mechanisms = tuple((row["mechanism"], _series_params(row, shared)) for row in seen.to_dict("records")
                       if row["mechanism"] in MEASURED)
    kv_heads = None if shared or int(first["kv_heads"]) == int(first["heads"]) else int(first["kv_heads"])
    ns = tuple(sorted({int(n) for n in frame["n"]}))
    config = DEFAULT_SWEEP.replaced(mechanisms=mechanisms, ns=ns, batch=int(first["batch"]),
                                    heads=int(first["heads"]), kv_heads=kv_heads, d_model=int(first["d_model"]),
                                    padding=int(first["padding"]), positions=str(first["positions"]),
                                    dtype=str(first["dtype"]), device=str(first["device"]), mode=str(first["mode"]),
                                    causal=bool(first["causal"]), implementation=str(first["implementation"]))
    left = [f"{column} {', '.join(map(str, frame[column].unique()))}" for column in
            ("batch", "heads", "d_model", "dtype", "device", "mode", "padding", "positions", "implementation")
            if frame[column].nunique() > 1]
    left += ["both masks (causal and bidirectional)"] if frame["causal"].nunique() > 1 else []
    left += [f"{key} (not in this build)" for key in dict.fromkeys(seen["mechanism"]) if key not in MEASURED]
    return config, left


def _series_params(row: dict, shared: bool) -> dict:
    """A series' parameters as a sweep gives them, from one of its rows: the mechanism's, its own key/value heads
    when the frame's series differ in them, its sinks and its kept first tokens when on (Problem.SERIES_FIELDS)."""
    own = {"kv_heads": int(row["kv_heads"])} if shared else {}
    own |= {"sinks": True} if row.get("sinks", False) else {}
    own |= {"keep_first": int(row["keep_first"])} if row.get("keep_first", 0) else {}
    return {**json.loads(row["params"]), **own}


def announced_s(name: str) -> float | None:
    """The seconds the preset or quick demo called `name` announces (its measured Preset.seconds); None for any
    other sweep."""
    demo = PRESETS.get(name) or (QUICK_DEMO if name == QUICK_DEMO.name else None)
    return None if demo is None else demo.seconds
