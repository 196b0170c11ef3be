"""Broken and hostile Hugging Face configs and files refused by the planner with a ValueError naming the field (one
sentence, values clipped); junk in any field raises nothing else; a file is read as data, never run."""
from __future__ import annotations

import copy
import io
import json
import os

import pytest

from attn_core.studies.planner.model import plan
from attn_core.studies.planner.hf_config import from_hf_config, parse_config, read_config
from attn_core.studies.planner.weights import count_weights
from tests.hf_configs import (ALL, DEEPSEEK_V3, FALCON_H1_34B, GEMMA3_1B, GEMMA3_27B, GPT_OSS_20B, GRANITE_H, JAMBA,
                              KIMI_LINEAR, LLAMA3_8B, LLAMA4_SCOUT, MAMBA_CODESTRAL, MINIMAX_01, MISTRAL_7B,
                              MIXTRAL_8X7B, NEMOTRON_H_8B, QWEN25_7B, QWEN3_NEXT)


# --- hostile and broken configs -----------------------------------------------------------------------------------

def without(config: dict, key: str) -> dict:
    return {k: v for k, v in config.items() if k != key}


HOSTILE = [
    (without(LLAMA3_8B, "num_hidden_layers"), "num_hidden_layers"),
    ({**LLAMA3_8B, "num_hidden_layers": -1}, "num_hidden_layers"),
    ({**LLAMA3_8B, "num_hidden_layers": "32"}, "num_hidden_layers"),
    ({**LLAMA3_8B, "num_hidden_layers": 1e30}, "num_hidden_layers"),
    ({**LLAMA3_8B, "num_hidden_layers": 10**30}, "num_hidden_layers"),
    ({**LLAMA3_8B, "num_hidden_layers": True}, "num_hidden_layers"),
    ({**LLAMA3_8B, "num_hidden_layers": 32.0}, "num_hidden_layers"),
    ({**LLAMA3_8B, "num_attention_heads": 0}, "num_attention_heads"),
    ({**LLAMA3_8B, "num_key_value_heads": 3}, "num_key_value_heads"),
    ({**LLAMA3_8B, "head_dim": -128}, "head_dim"),
    ({**LLAMA3_8B, "max_position_embeddings": 10**12}, "max_position_embeddings"),
    ({**GEMMA3_27B, "text_config": "gemma"}, "text_config"),
    ({**GEMMA3_27B, "text_config": [1, 2]}, "text_config"),
    ({**GEMMA3_1B, "layer_types": ["sliding_attention"] * 5}, "layer_types"),
    ({**GEMMA3_1B, "layer_types": ["sliding_attention"] * 25 + ["dilated_attention"]}, "layer_types[25]"),
    ({**GEMMA3_1B, "layer_types": "sliding_attention"}, "layer_types"),
    ({**GEMMA3_1B, "sliding_window": 0}, "sliding_window"),
    ({**MISTRAL_7B, "sliding_window": "4096"}, "sliding_window"),
    ({**QWEN25_7B, "use_sliding_window": "yes"}, "use_sliding_window"),
    ({**QWEN25_7B, "use_sliding_window": True, "max_window_layers": -1}, "max_window_layers"),
    ({**LLAMA3_8B, "model_type": "<script>alert(1)</script>"}, "model_type"),
    ({**LLAMA3_8B, "model_type": 42}, "model_type"),
    ({"model_type": "resnet", "num_hidden_layers": 50, "hidden_size": 2048}, "model_type"),
    ({**NEMOTRON_H_8B, "hybrid_override_pattern": "M*-"}, "hybrid_override_pattern"),
    ({**NEMOTRON_H_8B, "hybrid_override_pattern": "X" * 52}, "hybrid_override_pattern"),
    ({**KIMI_LINEAR, "linear_attn_config": "kda"}, "linear_attn_config"),
    ({**KIMI_LINEAR, "linear_attn_config": {**KIMI_LINEAR["linear_attn_config"], "kda_layers": [1, 2, 4]}},
     "linear_attn_config"),
    (without(DEEPSEEK_V3, "kv_lora_rank"), "kv_lora_rank"),
    ({**DEEPSEEK_V3, "qk_rope_head_dim": 1e30}, "qk_rope_head_dim"),
    ({**NEMOTRON_H_8B, "n_groups": 3}, "n_groups"),
    ({**QWEN3_NEXT, "linear_num_key_heads": 5}, "linear_num_key_heads"),
    ({**JAMBA, "attn_layer_offset": 8}, "attn_layer_offset"),
    ({**LLAMA4_SCOUT, "text_config": {**LLAMA4_SCOUT["text_config"], "no_rope_layers": [2] * 48}},
     "no_rope_layers"),
    ({**LLAMA4_SCOUT, "text_config": {**LLAMA4_SCOUT["text_config"], "attention_chunk_size": "big"}},
     "attention_chunk_size"),
    ({**MINIMAX_01, "attn_type_list": [0, 1]}, "attn_type_list"),
    ({**GRANITE_H, "mamba_n_heads": 7}, "mamba_n_heads"),
    ({**FALCON_H1_34B, "mamba_d_state": None}, "mamba_d_state"),
    ({**MAMBA_CODESTRAL, "state_size": [128]}, "state_size"),
    ({**LLAMA3_8B, "num_hidden_layers": 100000}, "num_hidden_layers"),  # past MAX_LAYERS: a typo, not a model
    ({**LLAMA3_8B, "hidden_size": -4096}, "hidden_size"),
    ({**LLAMA3_8B, "num_key_value_heads": 0}, "num_key_value_heads"),
    ({**LLAMA3_8B, "num_attention_heads": False}, "num_attention_heads"),
    ({**DEEPSEEK_V3, "num_attention_heads": "128"}, "num_attention_heads"),
    ({**GPT_OSS_20B, "layer_types": ["sliding_attention", "full_attention"] * 11}, "layer_types"),
    ({**QWEN3_NEXT, "full_attention_interval": 0}, "full_attention_interval"),
    ({**MINIMAX_01, "attn_type_list": [True] * 80}, "attn_type_list"),
    ({**LLAMA3_8B, "model_type": "=cmd|' /C calc'!A0"}, "model_type"),
    ({"model_type": "my_new_arch", "num_hidden_layers": 12, "hidden_size": 1024}, "model_type"),
]


@pytest.mark.parametrize("config, field", HOSTILE, ids=[f"{i}-{f}" for i, (_, f) in enumerate(HOSTILE)])
def test_a_config_that_cannot_be_planned_is_refused_naming_its_field(config, field):
    with pytest.raises(ValueError) as planned_error:
        from_hf_config(config)
    with pytest.raises(ValueError) as counted_error:
        count_weights(config)
    for error in (planned_error, counted_error):
        message = str(error.value)
        assert field in message, message
        assert len(message) < 400 and "\n" not in message  # one sentence, values clipped


@pytest.mark.parametrize("call, field", [
    (lambda: from_hf_config(LLAMA3_8B, name=7), "name"),
    (lambda: count_weights(without(LLAMA3_8B, "vocab_size")), "vocab_size"),
    (lambda: count_weights({**MIXTRAL_8X7B, "num_experts_per_tok": 9}), "num_experts_per_tok"),
    (lambda: count_weights({**LLAMA3_8B, "torch_dtype": "int3"}), "torch_dtype"),
    (lambda: count_weights({**LLAMA3_8B, "quantization_config": ["fp8"]}), "quantization_config"),
    (lambda: count_weights(LLAMA3_8B, dtype="float7"), "dtype"),
    (lambda: from_hf_config([LLAMA3_8B]), "JSON object"),
])
def test_other_bad_inputs_are_refused_by_name(call, field):
    with pytest.raises(ValueError, match=field):
        call()


def test_a_long_value_is_clipped_in_the_message():
    with pytest.raises(ValueError) as e:
        from_hf_config({**LLAMA3_8B, "num_hidden_layers": "x" * 100000})
    assert len(str(e.value)) < 200


JUNK = [None, -1, 0, 1, 2**62, 10**400, 1e30, float("nan"), True, "x", "<b>", [], [1], {}, {"a": 1}]


def test_no_field_set_to_junk_raises_anything_but_a_value_error():
    """Every field of every config above set to each junk value: planned and counted, or refused with ValueError."""
    for config in ALL.values():
        nested = "text_config" in config
        fields = config["text_config"] if nested else config
        for key in fields:
            for junk in JUNK:
                broken = copy.deepcopy(config)
                (broken["text_config"] if nested else broken)[key] = junk
                for call in (from_hf_config, count_weights):
                    try:
                        call(broken)
                    except ValueError:
                        pass


NESTED = [(KIMI_LINEAR, "linear_attn_config"), (GPT_OSS_20B, "quantization_config"),
          (DEEPSEEK_V3, "quantization_config")]


def test_no_nested_field_set_to_junk_raises_anything_but_a_value_error():
    for config, key in NESTED:
        for inner in config[key]:
            for junk in JUNK:
                broken = copy.deepcopy(config)
                broken[key][inner] = junk
                for call in (from_hf_config, count_weights):
                    try:
                        call(broken)
                    except ValueError:
                        pass
    odd_keys = {**LLAMA3_8B, 1: 2, None: 3, ("a",): 4}  # a dict built in code may have keys JSON cannot
    assert any("does not use" in n for n in from_hf_config(odd_keys)[1])


# --- files --------------------------------------------------------------------------------------------------------

def write(tmp_path, text: str | bytes, name: str = "config.json"):
    path = tmp_path / name
    path.write_bytes(text if isinstance(text, bytes) else text.encode())
    return path


def test_a_config_file_is_read(tmp_path):
    model, _ = from_hf_config(read_config(write(tmp_path, json.dumps(GEMMA3_27B))))
    assert plan(model, 131072).kv_cache_bytes == 52 * 2 * 16 * 128 * 1024 * 2 + 10 * 2 * 16 * 128 * 131072 * 2
    assert read_config(str(write(tmp_path, b"\xef\xbb\xbf" + json.dumps(LLAMA3_8B).encode()))) == LLAMA3_8B


def test_infinity_in_a_field_the_planner_does_not_read_is_noted(tmp_path):
    # transformers saves Mamba-2's time_step_limit (0.0, inf) as [0.0, Infinity]
    text = json.dumps({**MAMBA_CODESTRAL, "time_step_limit": [0.0, float("inf")]})
    assert "Infinity" in text
    _, notes = from_hf_config(read_config(write(tmp_path, text)))
    assert any("time_step_limit[1]" in n for n in notes)


def sparse(tmp_path, size: int):
    path = tmp_path / "big.json"
    with open(path, "wb") as f:
        f.truncate(size)
    return path


@pytest.mark.skipif(not hasattr(os, "mkfifo"), reason="FIFOs are POSIX")
def test_a_fifo_is_refused_without_waiting_for_a_writer(tmp_path):
    fifo = tmp_path / "config.json"
    os.mkfifo(fifo)
    with pytest.raises(ValueError, match="not a regular file"):
        read_config(fifo)


@pytest.mark.parametrize("make, words", [
    (lambda p: p, "not a regular file"),  # a directory
    (lambda p: write(p, b"{" + b" " * (5 << 20) + b"}"), "bytes"),  # 5 MB
    (lambda p: sparse(p, 50 << 20), "52,428,800 bytes"),  # 50 MB, refused before a byte is read
    (lambda p: write(p, "{'model_type': 'llama'}"), "not JSON"),
    (lambda p: write(p, "[1, 2, 3]"), "this one a list"),
    (lambda p: write(p, '"llama"'), "this one a text"),
    (lambda p: write(p, b"\xff\xfe{}"), "UTF-8"),
    (lambda p: write(p, "[" * 100000 + "]" * 100000), "not JSON"),
    (lambda p: write(p, '{"vocab_size": ' + "9" * 5000 + "}"), "not JSON"),
    (lambda p: p / "missing.json", "cannot be opened"),
])
def test_a_file_that_is_not_a_config_is_refused_in_a_sentence(tmp_path, make, words):
    with pytest.raises(ValueError, match=words):
        read_config(make(tmp_path))


@pytest.mark.skipif(not os.path.exists("/dev/zero"), reason="no /dev/zero")
def test_a_device_is_refused():
    with pytest.raises(ValueError, match="not a regular file"):
        read_config("/dev/zero")


@pytest.mark.parametrize("text, field", [
    ('{"model_type": "llama", "num_hidden_layers": NaN, "num_attention_heads": 32}', "num_hidden_layers"),
    ('{"model_type": "llama", "num_hidden_layers": 32, "num_attention_heads": Infinity}', "num_attention_heads"),
    ('{"model_type": "gemma3", "text_config": {"num_hidden_layers": -Infinity, "num_attention_heads": 8}}',
     "text_config.num_hidden_layers"),
])
def test_nan_or_infinity_in_a_size_is_refused_by_name(text, field):
    config = parse_config(text)
    with pytest.raises(ValueError, match=field.replace(".", r"\.")):
        from_hf_config(config)


def test_code_in_a_config_is_text_never_run():
    config = parse_config('{"model_type": "__import__(\'os\').system(\'false\')", "num_hidden_layers": 1}')
    with pytest.raises(ValueError, match="model_type"):
        from_hf_config(config)


# --- through the command line: a sentence on stderr, status 2, no traceback, nothing run ----------------------------

def test_every_hostile_config_file_is_refused_by_the_cli_in_one_sentence(tmp_path):
    from attn_core import cli

    for i, (config, field) in enumerate(HOSTILE):
        path = write(tmp_path, json.dumps(config), f"config{i}.json")
        out, err = io.StringIO(), io.StringIO()
        assert cli.main(["plan", str(path), "--context", "128k", "--json"], out, err) == 2, field
        lines = err.getvalue().splitlines()
        assert len(lines) == 1 and lines[0].startswith("error: ") and field in lines[0], lines
        assert "Traceback" not in err.getvalue() and out.getvalue() == ""


def test_a_formula_or_escape_sequence_as_a_name_comes_back_as_inert_text():
    from attn_core.engine.untrusted import csv_bytes, literal, terminal
    from attn_core.studies.planner.model import curves

    formula = "=cmd|' /C calc'!A0"
    model, _ = from_hf_config(LLAMA3_8B, name=formula)
    assert model.name == formula  # kept as the text it is: nothing in it is evaluated
    assert from_hf_config({**LLAMA3_8B, "_name_or_path": "=1+2"})[0].name == "=1+2"
    exported = csv_bytes(curves([model], [1024])).decode()
    assert "'" + formula in exported  # a spreadsheet shows it as typed (OWASP's leading ')
    assert not any(line.startswith("=") for line in exported.splitlines())
    assert literal(model.name).startswith("\\=")  # Markdown shows every punctuation character as typed
    escape, _ = from_hf_config({**LLAMA3_8B, "_name_or_path": "x/\x1b]0;pwned\x07\x1b[2J"})
    assert "\x1b" not in escape.name and "\\x1b]0;pwned\\x07" in terminal(escape.name)


@pytest.mark.parametrize("text, field", [
    ('{"model_type": "gemma3_text", "num_hidden_layers": 26, "num_attention_heads": 4, "head_dim": 256, '
     '"sliding_window": NaN}', "sliding_window"),
    ('{"model_type": "llama", "num_hidden_layers": 32, "num_attention_heads": 32, "hidden_size": 4096, '
     '"num_key_value_heads": -Infinity}', "num_key_value_heads"),
])
def test_more_nan_and_infinity_sizes_are_refused_by_name(text, field):
    with pytest.raises(ValueError, match=field):
        from_hf_config(parse_config(text))


def test_a_bool_where_a_count_goes_is_refused_where_the_weights_read_it():
    with pytest.raises(ValueError, match="vocab_size"):
        count_weights({**LLAMA3_8B, "vocab_size": True})
    with pytest.raises(ValueError, match="tie_word_embeddings"):
        count_weights({**LLAMA3_8B, "tie_word_embeddings": 1})
