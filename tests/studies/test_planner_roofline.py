"""The roofline and the device table: decode and prefill of built-in models worked out by hand from the data sheets'
figures, the crossover where the cache read passes the weights read, the batch multiplying the cache and not the
weights, and refusals that name the field."""
from __future__ import annotations

import pytest

from attn_core.studies.planner import devices, roofline as rl
from attn_core.studies.planner.model import MODELS, Layer, Model
from attn_core.studies.planner.weights import Weights

LLAMA, MHA, MISTRAL = MODELS["llama-3-8b"], MODELS["mha-8b"], MODELS["mistral-7b"]
H100 = devices.find_device("H100 SXM")
WEIGHTS_8B = 8.03e9 * 2  # 16.06e9 bytes in bf16
# A token reads one row of the untied input embedding table, not the table: 128,256 · 4,096 = 525,336,576 parameters
# left out (vocabulary · width, from Llama 3 8B's config.json), as count_weights leaves them out of a config.json.
ACTIVE_8B = 8.03e9 - 128_256 * 4096  # 8,030,000,000 − 525,336,576 = 7,504,663,424 parameters
ACTIVE_BYTES_8B = 2 * ACTIVE_8B  # 15,009,326,848 bytes in bf16
TOKEN_8B = 32 * 2 * 8 * 128 * 2  # 32 layers · (k, v) · 8 key/value heads · 128 · 2 bytes = 131,072 B = 128 KiB


def test_llama_3_8b_on_an_h100_at_8k_is_memory_bound():
    made = rl.roofline(LLAMA, "H100 SXM", 8192)
    # bytes: 15,009,326,848 of active weights + 8192 · 131,072 = 1,073,741,824 of cache = 16,083,068,672
    assert made.decode_bytes == ACTIVE_BYTES_8B + 8192 * TOKEN_8B == 16_083_068_672
    # FLOPs: 2 · 7,504,663,424 = 15,009,326,848 + 32 layers · 4 · 8192 tokens · 128 · 32 query heads = 4,294,967,296:
    # 19,304,294,144
    assert made.decode_flops == pytest.approx(15_009_326_848 + 4_294_967_296)
    # 16,083,068,672 / 3.35e12 = 4.8009 ms ≫ 19.30e9 / 989e12 = 0.0195 ms: 3.35e12 / 16,083,068,672 = 208.29 tokens
    # a second (the whole 8.03e9 read made it 3.35e12 / 17,133,741,824 = 195.52)
    assert made.decode_bound == "memory-bound: bytes"
    assert made.decode_seconds == pytest.approx(16_083_068_672 / 3.35e12)
    assert made.decode_tokens_per_s == pytest.approx(208.29, abs=0.01)
    assert made.cache_bytes == 8192 * TOKEN_8B and made.weights_bytes == WEIGHTS_8B
    assert made.active_weights_bytes == ACTIVE_BYTES_8B


def test_a_batch_of_8_multiplies_the_cache_read_not_the_weights():
    made = rl.roofline(LLAMA, H100, 8192, batch=8)
    # 15,009,326,848 + 8 · 1,073,741,824 = 8,589,934,592 → 23,599,261,440 B in 7.0446 ms for 8 tokens: 1,135.63 a second
    assert made.decode_bytes == ACTIVE_BYTES_8B + 8 * 8192 * TOKEN_8B == 23_599_261_440
    assert made.decode_tokens_per_s == pytest.approx(8 / (23_599_261_440 / 3.35e12))
    assert made.decode_tokens_per_s == pytest.approx(1135.63, abs=0.01)
    assert not any("mixture of experts" in n for n in made.notes)  # a dense model: every token reads the same weights


def test_a_large_batch_at_a_short_context_turns_decode_compute_bound():
    made = rl.roofline(LLAMA, H100, 1, batch=1024)
    # FLOPs: 1024 · (2 · 7,504,663,424 + 32 · 4 · 1 · 128 · 32) = 1024 · (15,009,326,848 + 524,288)
    # = 1024 · 15,009,851,136 → 15.54 ms on 989e12; bytes: 15,009,326,848 + 1024 · 131,072 = 15,143,544,576 → 4.52 ms
    assert made.decode_bound == "compute-bound: FLOPs"
    assert made.decode_seconds == pytest.approx(1024 * 15_009_851_136 / 989e12)


def test_prefill_of_8k_tokens_is_compute_bound():
    made = rl.roofline(LLAMA, H100, 8192)
    # FLOPs: 2 · 7,504,663,424 · 8192 = 122,956,405,538,816 of weights (a prompt token multiplies by the active
    # weights; its embedding is a row looked up) + 32 layers · 2 · 8192 · 8193 · 128 · 32 (causal attention, q·k and
    # p·v over the kept half) = 17,594,333,528,064: 140,550,739,066,880 → 0.1421 s on 989e12
    assert made.prefill_flops == pytest.approx(122_956_405_538_816 + 17_594_333_528_064)
    assert made.prefill_bound == "compute-bound: FLOPs"
    assert made.prefill_seconds == pytest.approx(140_550_739_066_880 / 989e12)
    assert made.prefill_bytes == WEIGHTS_8B + 8192 * TOKEN_8B  # every weight read once (the table too), the cache out


def test_the_cache_read_passes_the_weights_read_at_114_513_tokens():
    # 131,072 · n ≥ 15,009,326,848 → n ≥ 114,512.08: 114,512 · 131,072 = 15,009,316,864 < 15,009,326,848 ≤
    # 114,513 · 131,072 = 15,009,447,936
    assert rl.crossover_context(LLAMA) == 114_513
    # a batch of 8 reads 8 caches: 8 · 131,072 · n ≥ 15,009,326,848 → n ≥ 14,314.01 (14,314 · 1,048,576 =
    # 15,009,316,864, short by 9,984)
    assert rl.crossover_context(LLAMA, batch=8) == 14_315
    # fp8 halves the cache: 65,536 · n ≥ 15,009,326,848 → n ≥ 229,024.15 (229,024 · 65,536 = 15,009,316,864)
    assert rl.crossover_context(LLAMA, cache_dtype="fp8") == 229_025


def test_a_window_keeps_the_cache_below_the_weights_so_there_is_no_crossover():
    # Mistral's window holds 4096 tokens: 4096 · 131,072 = 0.5 GiB, never 2 · (7.24e9 − 32,000 · 4096) = 14.22e9 of
    # active weights
    assert rl.crossover_context(MISTRAL) is None


def test_grouped_query_attention_reads_less_but_computes_as_much_as_multi_head():
    # q·k and p·v run once per query head: 4 · 8192 · 128 · 32 heads · 32 layers = 4,294,967,296 for both
    assert rl.decode_attention_flops(LLAMA, 8192) == rl.decode_attention_flops(MHA, 8192) == 4_294_967_296
    # MHA-8B reads 4× the cache (32 key/value heads, not 8) and 805,306,368 more weights (the same embedding table
    # left out of both)
    gqa, mha = rl.roofline(LLAMA, H100, 8192), rl.roofline(MHA, H100, 8192)
    assert mha.cache_bytes == 4 * gqa.cache_bytes
    assert mha.weights_bytes - gqa.weights_bytes == pytest.approx(2 * 805_306_368)
    assert mha.active_weights_bytes - gqa.active_weights_bytes == pytest.approx(2 * 805_306_368)


def test_weights_can_be_given_counted_or_as_bytes():
    counted = Weights(total=8_030_261_248, active=7_504_924_672, bytes=16_060_522_496.0,
                      active_bytes=15_009_849_344.0, dtype="bfloat16")
    made = rl.roofline(LLAMA, H100, 8192, weights=counted)
    # the counted active weights leave the embedding table out: 15,009,849,344 + 1,073,741,824 bytes
    assert made.decode_bytes == 15_009_849_344 + 8192 * TOKEN_8B
    assert made.decode_flops == pytest.approx(2 * 7_504_924_672 + 4_294_967_296)
    assert made.prefill_bytes == 16_060_522_496 + 8192 * TOKEN_8B  # a prompt reads every weight
    # the built-in model's published count agrees with its config.json's to 0.004%: 3.35e12 / 16,083,591,168 =
    # 208.287 against 3.35e12 / 16,083,068,672 = 208.294 tokens a second (the 8.03B rounds 8,030,261,248)
    built_in = rl.roofline(LLAMA, H100, 8192)
    assert made.decode_tokens_per_s == pytest.approx(3.35e12 / 16_083_591_168)
    assert made.decode_tokens_per_s == pytest.approx(built_in.decode_tokens_per_s, rel=1e-4)
    as_bytes = rl.roofline(LLAMA, H100, 8192, weights=(WEIGHTS_8B, ACTIVE_BYTES_8B))
    assert as_bytes.decode_tokens_per_s == pytest.approx(built_in.decode_tokens_per_s)
    assert as_bytes.decode_flops == pytest.approx(2 * ACTIVE_8B + 4_294_967_296)  # bytes ÷ 2 = parameters in bf16


def test_a_narrower_cache_dtype_shrinks_the_cache_read():
    made = rl.roofline(LLAMA, H100, 8192, cache_dtype="fp8")
    assert made.cache_bytes == 8192 * TOKEN_8B / 2 and made.cache_dtype == "fp8"
    # q4_0: 18 bytes a 32 values, 0.5625 bytes a value: 65,536 values a token · 0.5625 = 36,864 B
    assert rl.roofline(LLAMA, H100, 8192, cache_dtype="q4_0").cache_bytes == 8192 * 36_864


def test_a_mixture_of_experts_reads_its_active_weights_and_says_so_at_a_batch():
    v3 = MODELS["deepseek-v3"]
    made = rl.roofline(v3, "H200", 4096)
    # 37e9 active parameters in FP8, 1 byte each, plus 61 layers · (512 + 64) · 2 bytes · 4096 of latent
    assert made.decode_bytes == pytest.approx(37e9 + 61 * 576 * 2 * 4096)
    assert made.weights_bytes == pytest.approx(671e9)
    assert any("mixture of experts" in n for n in rl.roofline(v3, "H200", 4096, batch=4).notes)
    assert not any("mixture of experts" in n for n in made.notes)
    # a dense model reads less than its total (the input embedding table) but is no mixture of experts
    for dense in ("llama-3-8b", "llama-3-70b", "mistral-7b", "mha-8b", "gemma-3-27b"):
        line = rl.roofline(MODELS[dense], "H200", 4096, batch=4)
        assert not any("mixture of experts" in n for n in line.notes), dense


def test_as_dict_names_its_method_and_its_sources():
    got = rl.roofline(LLAMA, H100, 8192).as_dict()
    for key in ("bandwidth_bytes_per_s", "flops_per_s", "decode_tokens_per_s", "decode_bound", "prefill_seconds",
                "prefill_bound", "weights_bytes", "active_weights_bytes", "cache_bytes", "method"):
        assert key in got
    assert got["method"].startswith("a roofline prediction from the vendor's data sheet: max(bytes ÷ bandwidth, "
                                    "FLOPs ÷ FLOP/s); not measured")
    assert "H100" in got["device_source"] and "8.03B" in got["weights_source"]


def test_curve_is_one_tidy_row_per_model_and_context():
    frame = rl.curve([LLAMA, MISTRAL], "B200", [1024, 8192])
    assert list(frame.columns) == ["model", "context", "decode_tokens_per_s", "prefill_seconds", "bound",
                                   "crossover"]
    assert len(frame) == 4 and set(frame["model"]) == {"Llama-3-8B", "Mistral-7B"}
    assert (frame[frame.model == "Llama-3-8B"]["crossover"] == 114_513).all()  # as worked out above
    assert frame[frame.model == "Mistral-7B"]["crossover"].isna().all()
    row = frame[(frame.model == "Llama-3-8B") & (frame.context == 1024)].iloc[0]
    # B200, 8 TB/s: 8e12 / (15,009,326,848 + 1024 · 131,072 = 15,143,544,576) = 528.28 tokens a second
    assert row.decode_tokens_per_s == pytest.approx(8e12 / (ACTIVE_BYTES_8B + 1024 * TOKEN_8B))
    assert row.decode_tokens_per_s == pytest.approx(528.28, abs=0.01)


def test_every_published_weight_count_carries_its_source():
    assert set(rl.PUBLISHED) == set(MODELS)  # every built-in model has a roofline
    for read in rl.PUBLISHED.values():
        assert 0 < read.active <= read.total and read.source
    # MHA-8B: Llama 3 8B plus 32 · 2 · 4096 · 3072 for the 24 more key/value heads a layer
    assert rl.PUBLISHED["mha-8b"].total == 8.03e9 + 32 * 2 * 4096 * 3072
    # a dense model's token reads all but its untied input embedding table (vocabulary · width, from each config.json)
    for name, total, vocab, width in (("llama-3-8b", 8.03e9, 128_256, 4096), ("llama-3-70b", 70.6e9, 128_256, 8192),
                                      ("mistral-7b", 7.24e9, 32_000, 4096),
                                      ("mha-8b", 8.03e9 + 805_306_368, 128_256, 4096)):
        assert rl.PUBLISHED[name].total == total and rl.PUBLISHED[name].active == total - vocab * width, name
    # Llama 3 70B: 70.6e9 − 128,256 · 8,192 = 70,600,000,000 − 1,050,673,152 = 69,549,326,848
    assert rl.PUBLISHED["llama-3-70b"].active == 69_549_326_848
    # Gemma 3 ties its table to the output head, which every token multiplies by: read whole
    assert rl.PUBLISHED["gemma-3-27b"].active == rl.PUBLISHED["gemma-3-27b"].total


def test_the_device_table_is_dense_bf16_with_its_source():
    assert [d.name for d in devices.DEVICES.values()] == ["H100 SXM", "H200", "B200", "MI300X", "L40S", "RTX 4090",
                                                          "M4 Max"]
    for device in devices.DEVICES.values():
        assert device.bandwidth_bytes_per_s > 0 and device.flops_per_s > 0 and device.memory_bytes > 0
        assert device.source and not device.measured
    # the H100's ridge: 989e12 / 3.35e12 = 295 FLOPs a byte; dense is half the data sheet's 1,979 with sparsity
    assert H100.flops_per_s / H100.bandwidth_bytes_per_s == pytest.approx(295.2, abs=0.1)
    assert "1,979" in H100.source and "not verified" in devices.DEVICES["m4 max"].source


@pytest.mark.parametrize("name", ["H100 SXM", "h100-sxm", "h100_sxm", "H100SXM", " rtx 4090 ", "mi300x"])
def test_a_device_is_found_whatever_its_spelling(name):
    assert devices.find_device(name).name in ("H100 SXM", "RTX 4090", "MI300X")


def test_this_machine_is_measured_and_labelled_so():
    here = devices.find_device("here")
    assert here.measured and "measured here" in here.name and here.source.startswith("measured here")
    assert here.bandwidth_bytes_per_s > 0 and here.flops_per_s > 0 and here.memory_bytes > 0
    assert rl.roofline(LLAMA, here, 1024).device == here.name


@pytest.mark.parametrize("call, words", [
    (lambda: devices.find_device("A100"), "device 'A100' is not in the table; choose one of H100 SXM, H200"),
    (lambda: rl.roofline(LLAMA, "TPU v5", 8192), "not in the table"),
    (lambda: rl.roofline(LLAMA, H100, 8192, batch=-1), "batch must be a whole number of sequences"),
    (lambda: rl.roofline(LLAMA, H100, 8192, batch=0), "batch must be"),
    (lambda: rl.roofline(LLAMA, H100, 8192, batch=True), "batch must be"),
    (lambda: rl.crossover_context(LLAMA, batch=2.5), "batch must be"),
    (lambda: rl.roofline(LLAMA, H100, 8192, cache_dtype="int3"), "cache dtype 'int3' is unknown"),
    (lambda: rl.roofline(LLAMA, H100, 0), "context must be a whole number"),
    (lambda: rl.roofline(LLAMA, H100, 8192, weights=(1e9, 2e9)), "weights must be"),
    (lambda: rl.roofline(LLAMA, H100, 8192, weights=(-1.0, -1.0)), "weights must be"),
    (lambda: rl.roofline(Model(name="Mine", layers=(Layer(name="a", mechanism="sdpa", count=2, heads=4,
                                                           head_dim=64),)), H100, 128),
     "weights of 'Mine' are not known"),
])
def test_bad_input_is_refused_with_a_sentence_naming_the_field(call, words):
    with pytest.raises(ValueError) as caught:
        call()
    assert words in str(caught.value)
