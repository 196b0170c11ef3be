"""compare.py: a model's designs (GQA, MQA, MLA, hybrids) and what each holds, reads and runs at by the roofline,
against hand arithmetic; speed_curves' crossover rows; the Theory page's cache-only speed as the roofline's memory
term."""
from __future__ import annotations

import pytest

from attn_core.insight import theory
from attn_core.studies.planner import compare, model as planner
from attn_core.studies.planner.roofline import roofline

LLAMA = planner.find("llama-3-8b")  # 32 layers, 32 heads of 128, 8 key/value heads, bf16
H100_BANDWIDTH, H100_FLOPS = 3.35e12, 989e12  # NVIDIA H100 SXM data sheet: 3.35 TB/s, 989 dense bf16 TFLOP/s
# What a decode step reads of Llama 3 8B's weights: the published 8.03B less its untied input embedding table, of
# which a token reads one row (128,256 · 4,096 = 525,336,576, vocabulary · width from its config.json):
# 7,504,663,424 parameters, 15,009,326,848 bytes in bf16
LLAMA_ACTIVE = 8.03e9 - 128_256 * 4096
LLAMA_WEIGHTS = LLAMA_ACTIVE * 2


def rows(model=LLAMA, context=8192, **kw):
    table, notes = compare.compare(model, "H100 SXM", context, **kw)
    return table.set_index("design"), notes


def test_cache_a_token_of_each_design_is_the_hand_count():
    table, notes = rows(designs=compare.Designs(kv_groups=4))
    per_token = table["cache_per_token"]
    assert per_token["as is"] == 2 * 32 * 8 * 128 * 2 == 128 * 1024  # K and V · layers · kv heads · head_dim · bf16
    assert per_token["MHA"] == 2 * 32 * 32 * 128 * 2  # 512 KiB
    assert per_token["GQA (4 kv heads)"] == 2 * 32 * 4 * 128 * 2  # 64 KiB
    assert per_token["MQA"] == 2 * 32 * 1 * 128 * 2 == 16 * 1024  # 16 KiB
    assert per_token["MLA"] == 32 * (4 * 128 + 128 // 2) * 2  # latent 512 + rotary 64 a layer: 36 KiB
    # 8 full layers of 4 KiB a token over 8,192 tokens, 24 windowed ones over their 4,096
    window = 8 * 4096 * 8192 + 24 * 4096 * 4096
    assert table.loc["hybrid: window 4,096 (75%)", "cache_bytes"] == window
    state = 8 * 4096 * 8192 + 24 * 8 * 128 * 128 * 4  # 24 Gated DeltaNet layers: a 128 × 128 fp32 state a kv head
    assert table.loc["hybrid: gated_deltanet (75%)", "cache_bytes"] == state
    assert any("reads Llama-3-8B's weights" in n for n in notes)


def test_decode_and_prefill_follow_the_roofline_by_hand():
    table, _ = rows()
    # as is: 15,009,326,848 + 131,072 · 8192 = 16,083,068,672 B → 3.35e12 / that = 208.29 tokens a second;
    # MQA: 15,009,326,848 + 16,384 · 8192 = 15,143,544,576 B → 221.22 tokens a second
    for design, per_token, speed in (("as is", 131072, 208.29), ("MQA", 16384, 221.22)):
        read = LLAMA_WEIGHTS + per_token * 8192
        assert table.loc[design, "read_bytes"] == pytest.approx(read)
        assert table.loc[design, "decode_tokens_per_s"] == pytest.approx(H100_BANDWIDTH / read, rel=1e-4)
        assert table.loc[design, "decode_tokens_per_s"] == pytest.approx(speed, abs=0.01)
        assert table.loc[design, "decode_bound"].startswith("memory-bound")
    # prefill of 8,192: 2 FLOPs an active weight a token (2 · 7,504,663,424 · 8192 = 122,956,405,538,816) plus causal
    # attention, 4·H·d per (i, j ≤ i) pair, 32 layers (17,594,333,528,064): 140,550,739,066,880 / 989e12 = 0.1421 s
    attention = 32 * 4 * 32 * 128 * 8192 * 8193 / 2
    want = (2 * LLAMA_ACTIVE * 8192 + attention) / H100_FLOPS
    assert want == pytest.approx(0.14211, abs=1e-5)
    assert table.loc["as is", "prefill_seconds"] == pytest.approx(want, rel=1e-3)
    assert table.loc["as is", "prefill_bound"].startswith("compute-bound")


def test_a_model_without_key_value_layers_says_which_designs_it_cannot_take():
    table, notes = rows(planner.find("deepseek-v3"))
    assert list(table.index) == ["as is", "hybrid: window 4,096 (75%)", "hybrid: gated_deltanet (75%)"]
    assert "MQA: the model has no key/value layers to change" in notes


def test_turned_reaches_every_kind_and_refuses_by_name():
    half = compare.turned(LLAMA, 0.5, "sliding_window", window=1024)
    assert [(k.mechanism, k.count, k.window) for k in half.layers] == [("sdpa", 16, None), ("sliding_window", 16, 1024)]
    latent = compare.turned(LLAMA, 1.0, "mla")
    assert [(k.mechanism, k.count, k.kv_rank, k.rope_dim) for k in latent.layers] == [("mla", 32, 512, 64)]
    assert compare.turned(LLAMA, 0.75, "mamba2") == planner.hybrid(LLAMA, 0.75, "mamba2")  # the model's own helper
    gemma = compare.turned(planner.find("gemma-3-27b"), 0.5, "kda")
    assert [k.name for k in gemma.layers] == ["global", "Kimi Delta Attention", "local (sliding window)"]
    assert [k.count for k in gemma.layers] == [5, 5, 52]  # the full kind turned, not the windowed one
    with pytest.raises(ValueError, match="share must be a fraction"):
        compare.turned(LLAMA, 1.5, "kda")
    with pytest.raises(ValueError, match="is not a kind that can generate here; choose one of"):
        compare.turned(LLAMA, 0.5, "linformer")
    with pytest.raises(ValueError, match="kv_heads 5 does not divide the 32 heads"):
        compare.shared_kv(LLAMA, 5, "GQA")


def test_speed_curves_add_each_line_s_crossover_where_the_cache_read_passes_the_weights():
    frame = compare.speed_curves([LLAMA], "H100 SXM", [1024, 1 << 20])
    crossing = frame[frame["crossover"]]
    # the first context whose 128 KiB a token reach 15,009,326,848 bytes: 15,009,326,848 / 131,072 = 114,512.08, so
    # 114,513 (114,512 · 131,072 = 15,009,316,864 falls short)
    n = -(-LLAMA_WEIGHTS // 131072)
    assert n == 114_513
    assert list(crossing["context"]) == [n] and list(frame["context"]) == [1024, n, 1 << 20]
    assert crossing["decode_tokens_per_s"].iloc[0] == pytest.approx(
        H100_BANDWIDTH / (LLAMA_WEIGHTS + 131072 * n), rel=1e-6)


def test_the_theory_page_s_cache_only_speed_is_the_roofline_s_memory_term_without_weights():
    """The Theory page's tokens/s (generation_costs) and Plan a model's (roofline) use the same cache bytes: the
    first is bandwidth ÷ cache, the second bandwidth ÷ (weights + cache) where bytes bound the step."""
    line = roofline(LLAMA, "H100 SXM", 8192)
    cache = theory.generation_costs(["sdpa"], [8192], layers=32, heads=32, head_dim=128, kv_heads=8,
                                    dtype="bfloat16", bandwidth=H100_BANDWIDTH)
    assert cache["cache_bytes"].iloc[0] == line.cache_bytes == 131072 * 8192
    assert cache["tokens_per_s"].iloc[0] == pytest.approx(H100_BANDWIDTH / line.cache_bytes)
    # what the Theory page's caption quotes beside its own figures (pages/theory.py calls this same roofline)
    assert line.decode_tokens_per_s == pytest.approx(H100_BANDWIDTH / (LLAMA_WEIGHTS + 131072 * 8192), rel=1e-4)
    # 3.35e12 / (15,009,326,848 + 1,073,741,824 = 16,083,068,672) = 208.29; the cache alone 3.35e12 / 1 GiB = 3,120
    assert f"{line.decode_tokens_per_s:,.1f}" == "208.3"
    assert f"{line.bandwidth_bytes_per_s / line.cache_bytes:,.0f}" == "3,120"
