"""The built-in models read from their published config.json (attn_core/studies/planner/builtin.py): each one's cache
worked out by hand from the model's published sizes, its weights against the published parameter counts, and a
config no other test uses (Mistral NeMo 12B) planned on the command line."""
from __future__ import annotations

import io
import json

import pytest

from attn_core import cli
from attn_core.studies.planner import model as planner
from attn_core.studies.planner.builtin import WEIGHTS

BF16, FP32 = 2, 4
M = 1 << 20


def kv(layers: int, kv_heads: int, head_dim: int, tokens: int) -> int:
    """Keys and values in bf16: 2 · layers · key/value heads · head_dim · 2 bytes, a token."""
    return 2 * layers * kv_heads * head_dim * tokens * BF16


@pytest.mark.parametrize("name, context, kv_bytes, state_bytes", [
    # 12 sliding layers hold 128 tokens, 12 full layers all: 8 key/value heads of 64
    ("gpt-oss-20b", 131072, kv(12, 8, 64, 128) + kv(12, 8, 64, 131072), 0),
    ("gpt-oss-120b", 131072, kv(18, 8, 64, 128) + kv(18, 8, 64, 131072), 0),  # 36 layers: 18 and 18
    # 36 chunked layers hold at most one chunk of 8192, 12 global layers (every 4th) the whole 1M
    ("llama-4-scout-17b-16e", M, kv(36, 8, 128, 8192) + kv(12, 8, 128, M), 0),
    # 61 layers of a 512 latent and a 64 rotary key, and the indexer's key of 128, a token, bf16
    ("deepseek-v3.2", 131072, 61 * (512 + 64 + 128) * 131072 * BF16, 0),
    # 7 MLA layers of 576 a token; 20 KDA layers of 32 heads of 128 × 128 in float32, their short convolutions 3
    # inputs of 3 · 4096 channels in bf16
    ("kimi-linear-48b-a3b", M, 7 * 576 * M * BF16 + 20 * 3 * 3 * 4096 * BF16, 20 * 32 * 128 * 128 * FP32),
    # 10 softmax layers of 8 key/value heads of 128; 70 lightning layers of 64 heads, a 128 × 128 state and a 128
    # normaliser each (as linear attention), float32
    ("minimax-m1", M, kv(10, 8, 128, M), 70 * 64 * (128 * 128 + 128) * FP32),
    # 4 attention layers of 4 key/value heads of 1536 / 12 = 128; 36 Mamba-2 layers of 48 heads of 64 × 128 states,
    # their convolutions 3 inputs of 48 · 64 + 2 · 128 = 3328 channels
    ("granite-4.0-h-tiny", 131072, kv(4, 4, 128, 131072) + 36 * 3 * 3328 * BF16, 36 * 48 * 64 * 128 * FP32),
    # 4 attention layers of 8 of 128; 24 Mamba-2 layers of 128 heads of 64 × 128, convolutions over 8192 + 2048
    ("nemotron-h-8b", 8192, kv(4, 8, 128, 8192) + 24 * 3 * 10240 * BF16, 24 * 128 * 64 * 128 * FP32),
])
def test_each_config_built_in_holds_what_its_published_sizes_give(name, context, kv_bytes, state_bytes):
    made = planner.plan(planner.find(name), context)
    assert made.kv_cache_bytes == kv_bytes and made.state_bytes == state_bytes


@pytest.mark.parametrize("name, total, active, within", [
    ("gpt-oss-20b", 20.91e9, 3.61e9, 0.005),  # OpenAI's model card (arXiv 2508.10925), table 1
    ("gpt-oss-120b", 116.83e9, 5.13e9, 0.005),
    ("deepseek-v3.2", 671e9, 37e9, 0.02),  # V3's sizes (arXiv 2412.19437), the MTP module left out
    ("minimax-m1", 456e9, 45.9e9, 0.03),  # arXiv 2506.13585; 47.2e9 counted active (the output head counted)
    ("kimi-linear-48b-a3b", 48e9, 3e9, 0.04),  # "48B" and "3B": rounded; 49.1e9 and 3.1e9 counted
    ("nemotron-h-8b", 8e9, None, 0.02),
])
def test_the_weights_counted_from_each_config_are_the_published_counts(name, total, active, within):
    w = WEIGHTS[name]
    assert abs(w.total - total) <= within * total
    if active is not None:
        assert abs(w.active - active) <= within * active


def test_llama_4_scout_counts_meta_s_figures_once_the_embeddings_are_read_as_meta_reads_them():
    w = WEIGHTS["llama-4-scout-17b-16e"]
    # Meta: 109B total with the vision encoder (about 1B), 17B active counting the 202,048 · 5120 input embeddings
    assert abs(w.total - 109e9) <= 0.02 * 109e9
    assert abs(w.active + 202048 * 5120 - 17e9) <= 0.02 * 17e9


def test_gpt_oss_keeps_its_experts_in_mxfp4():
    w = WEIGHTS["gpt-oss-120b"]
    experts = 36 * 128 * 3 * 2880 * 2880  # 36 layers · 128 experts · gate, up and down of 2880 × 2880
    assert "mxfp4" in w.dtype and w.bytes < 0.3 * 2 * w.total  # 4.25 bits for most weights, not 16
    assert w.bytes > experts * 4.25 / 8


# Mistral AI, mistralai/Mistral-Nemo-Base-2407 config.json (no test but this one uses it): 40 layers, hidden 5120,
# 32 heads of head_dim 128 over 8 key/value heads, no sliding window, context 1,024,000, vocabulary 131,072
MISTRAL_NEMO = {"architectures": ["MistralForCausalLM"], "model_type": "mistral", "vocab_size": 131072,
                "hidden_size": 5120, "intermediate_size": 14336, "num_hidden_layers": 40, "num_attention_heads": 32,
                "num_key_value_heads": 8, "head_dim": 128, "max_position_embeddings": 1024000,
                "sliding_window": None, "rope_theta": 1000000.0, "rms_norm_eps": 1e-05, "hidden_act": "silu",
                "tie_word_embeddings": False, "torch_dtype": "bfloat16", "bos_token_id": 1, "eos_token_id": 2}


def test_a_config_no_other_test_uses_is_planned_on_the_command_line(tmp_path):
    path = tmp_path / "config.json"
    path.write_text(json.dumps(MISTRAL_NEMO))
    out, err = io.StringIO(), io.StringIO()
    assert cli.main(["plan", str(path), "--context", "128k", "--json"], out, err) == 0, err.getvalue()
    data = json.loads(out.getvalue())
    # 2 (K and V) · 40 layers · 8 heads · 128 · 131,072 tokens · 2 bytes = 21,474,836,480 B = 20 GiB
    hand = 2 * 40 * 8 * 128 * 131072 * 2
    assert abs(data["kv_cache_bytes"] - hand) <= 0.005 * hand and data["state_bytes"] == 0
    # weights: embeddings and head 2 · 131,072 · 5120; a layer's q and o 2 · 5120 · 4096, k and v 2 · 5120 · 1024,
    # MLP 3 · 5120 · 14,336; norms 81 · 5120: 12,247,782,400 parameters, 2 bytes each
    params = 2 * 131072 * 5120 + 40 * (2 * 5120 * 4096 + 2 * 5120 * 1024 + 3 * 5120 * 14336) + 81 * 5120
    assert data["parameters"] == params and data["weights_bytes"] == 2 * params


def test_a_built_in_read_from_a_config_gives_its_weights_on_the_command_line():
    out, err = io.StringIO(), io.StringIO()
    assert cli.main(["plan", "gpt-oss-20b", "--context", "1M", "--json"], out, err) == 0
    data = json.loads(out.getvalue())
    assert data["parameters"] == WEIGHTS["gpt-oss-20b"].total and data["active_weights_bytes"] > 0
    assert any("sinks" in note for note in data["notes"])
