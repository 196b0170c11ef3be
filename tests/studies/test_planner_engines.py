"""The cache as engines hold it: dtypes with their scales, pages, sliding layers at their window or full size (the
waste vLLM's RFC #11382 states for Gemma-2 and Ministral, recomputed), and recurrent states kept for prefix caching;
every figure worked out by hand."""
from __future__ import annotations

import pytest

from attn_core.studies.planner import engines
from attn_core.studies.planner.model import MODELS, Layer, Model

GIB = 2**30
LLAMA, GEMMA3, HYBRID, V3 = (MODELS[k] for k in ("llama-3-8b", "gemma-3-27b", "mamba-2-hybrid-8b", "deepseek-v3"))
TOKEN_8B = 32 * 2 * 8 * 128 * 2  # Llama 3 8B: 131,072 bytes a token in bf16


def attention(count: int, kv_heads: int, window: int | None = None) -> Layer:
    return Layer(name="sliding" if window else "global", mechanism="sliding_window" if window else "sdpa",
                 count=count, heads=32, kv_heads=kv_heads, head_dim=128, window=window)


@pytest.mark.parametrize("name, want", [
    ("bf16", 2.0), ("float16", 2.0), ("fp8", 1.0),
    ("q8_0", 34 / 32),  # 32 int8 + an fp16 scale = 34 bytes a 32: 1.0625
    ("q4_0", 18 / 32),  # 32 nibbles in 16 bytes + an fp16 scale = 18 bytes a 32: 0.5625
    ("kivi-4bit", 20 / 32), ("int2", 12 / 32),  # 16 or 8 bytes of codes + fp16 scale and zero, a group of 32
    ("mla-fp8", 656 / 576),  # 512 fp8 + 4 float32 scales + 64 bf16 = 656 bytes for 576 values
])
def test_bytes_per_value_spreads_a_block_s_scales_over_its_values(name, want):
    assert engines.bytes_per_value(name) == pytest.approx(want)
    assert engines.describe_dtype(name)


def test_a_page_rounds_the_tokens_up():
    assert engines.paged_tokens(1000, 16) == 1008  # ⌈1000 / 16⌉ = 63 pages of 16
    assert engines.paged_tokens(1024, 16) == 1024
    held = engines.cache_by_engine(LLAMA, 1000, engine="vllm")
    assert held.page_tokens == 16 and held.kinds[0].tokens == 1008
    assert held.bytes == 1008 * TOKEN_8B
    assert engines.cache_by_engine(LLAMA, 1000, engine="formula").bytes == 1000 * TOKEN_8B


def test_a_sliding_layer_keeps_the_pages_its_window_covers():
    # positions 900 … 999: pages ⌊900 / 16⌋ = 56 … ⌈1000 / 16⌉ − 1 = 62, 7 pages of 16 = 112 tokens' room
    assert engines.window_pages(1000, 100, 16) == 112
    assert engines.window_pages(131072, 1024, 16) == 1024  # aligned: exactly the window's 64 pages
    assert engines.window_pages(50, 100, 16) == 64  # shorter than the window: the context, paged


def test_gemma_3_at_128k_formula_against_vllm_s_uniform_pages():
    # a layer's token: 2 · 16 key/value heads · 128 · 2 bytes = 8,192 B
    formula = engines.cache_by_engine(GEMMA3, 131072, engine="formula")
    uniform = engines.cache_by_engine(GEMMA3, 131072, engine="vllm-uniform")
    # formula: 8,192 · (52 · 1024 + 10 · 131,072) = 8,192 · 1,363,968 = 11,173,625,856 B (10.41 GiB)
    assert formula.bytes == 8192 * (52 * 1024 + 10 * 131072) == 11_173_625_856
    # full pages for every layer: 62 · 131,072 · 8,192 = 62 GiB
    assert uniform.bytes == 62 * 131072 * 8192 == 62 * GIB
    # 62 · 131,072 / 1,363,968 = 8,126,464 / 1,363,968 = 5.958: the sliding layers' full pages hold 83% waste
    assert uniform.bytes / formula.bytes == pytest.approx(5.958, abs=0.001)
    assert engines.cache_by_engine(GEMMA3, 131072, engine="llama.cpp").bytes == formula.bytes
    assert engines.cache_by_engine(GEMMA3, 131072, engine="vllm").bytes == formula.bytes  # 131,072 and 1024 align
    assert engines.cache_by_engine(GEMMA3, 131072, engine="llama.cpp-swa-full").bytes == uniform.bytes
    assert "RFC #11382" in uniform.source and "#12637" in engines.ENGINES["llama.cpp"].source


@pytest.mark.parametrize("model, context, waste", [
    # Gemma-2: 1 sliding (window 4096) to 1 global at 8192: half the layers waste half, 1/2 · 1/2 = 25%
    (Model(name="Gemma-2-like", layers=(attention(23, 16, 4096), attention(23, 16)), max_context=8192), 8192, 0.25),
    # Ministral: 3 sliding (window 32,768) to 1 global at 128k: 3/4 of the layers waste 3/4, 9/16 = 56.25%
    (Model(name="Ministral-like", layers=(attention(27, 8, 32768), attention(9, 8))), 131072, 0.5625),
])
def test_uniform_pages_waste_what_vllm_s_rfc_states(model, context, waste):
    uniform = engines.cache_by_engine(model, context, engine="vllm-uniform").bytes
    hybrid = engines.cache_by_engine(model, context, engine="vllm").bytes
    assert 1 - hybrid / uniform == pytest.approx(waste)


def test_a_narrower_dtype_shrinks_keys_and_values_but_not_recurrent_states():
    bf16, q4 = (engines.cache_by_engine(HYBRID, 8192, dtype=d, engine="formula") for d in ("bf16", "q4_0"))
    assert q4.kv_bytes == bf16.kv_bytes * 0.5625 / 2  # 4 attention layers · 2 · 8 · 128 values a token
    assert q4.state_bytes == bf16.state_bytes == 24 * 128 * 64 * 128 * 4  # float32 states, as the kernel keeps them


def test_mla_s_fp8_latent_takes_656_bytes_a_token():
    fp8 = engines.cache_by_engine(V3, 8192, dtype="mla-fp8", engine="formula")
    bf16 = engines.cache_by_engine(V3, 8192, engine="formula")
    assert fp8.bytes == 61 * 8192 * 656  # 61 layers · 8192 tokens · (512 + 4 · 4 + 64 · 2)
    assert bf16.bytes == 61 * 8192 * 576 * 2
    assert fp8.bytes / bf16.bytes == pytest.approx(656 / 1152)  # 0.569


def test_prefix_caching_keeps_a_mamba_2_state_every_4096_tokens():
    # a Mamba-2 layer's state: 128 heads · 64 · 128 · 4 bytes = 4 MiB; ⌈131,072 / 4096⌉ = 32 kept, 24 layers: 3 GiB
    held = engines.cache_by_engine(HYBRID, 131072, engine="formula", state_every=4096)
    assert held.kinds[0].tokens == 32 and held.state_bytes == 32 * 24 * 4 * 2**20 == 3 * GIB
    assert held.kv_bytes == 4 * 2 * 8 * 128 * 2 * 131072 == 2 * GIB  # the 4 attention layers, unchanged
    assert engines.cache_by_engine(HYBRID, 131073, engine="formula", state_every=4096).kinds[0].tokens == 33
    assert engines.cache_by_engine(HYBRID, 131072, engine="formula").state_bytes == 24 * 4 * 2**20  # one state
    assert any("PR #25752" in n for n in held.notes)


def test_a_batch_multiplies_every_kind():
    one, four = (engines.cache_by_engine(HYBRID, 4096, batch=b) for b in (1, 4))
    assert four.bytes == 4 * one.bytes and four.as_dict()["batch"] == 4


@pytest.mark.parametrize("call, words", [
    (lambda: engines.bytes_per_value("int3"), "cache dtype 'int3' is unknown; choose one of"),
    (lambda: engines.cache_by_engine(LLAMA, 8192, engine="sglang"), "engine 'sglang' is unknown"),
    (lambda: engines.cache_by_engine(LLAMA, 8192, page_tokens=0), "page_tokens must be a whole number"),
    (lambda: engines.cache_by_engine(HYBRID, 8192, state_every=-1), "state_every must be a whole number"),
    (lambda: engines.cache_by_engine(LLAMA, 8192, batch=-2), "batch must be a whole number"),
    (lambda: engines.cache_by_engine(LLAMA, 8192, dtype="mla-fp8"), "layer 'full attention' is sdpa, not mla"),
    (lambda: engines.cache_by_engine(LLAMA, -5), "context must be a whole number"),
])
def test_bad_input_is_refused_with_a_sentence_naming_the_field(call, words):
    with pytest.raises(ValueError) as caught:
        call()
    assert words in str(caught.value)
