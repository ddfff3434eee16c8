"""A config.json is read as transformers reads it: an absent key takes its architecture's
default, and a sliding window caps the context only where some layer attends through it."""

from __future__ import annotations

import json

import pytest

from inferlab.errors import InferlabError
from inferlab.models.loader import read_model_config

SHAPE = {"vocab_size": 160, "hidden_size": 64, "intermediate_size": 96, "num_hidden_layers": 2,
         "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 16}
MODEL_TYPES = {"LlamaForCausalLM": "llama", "MistralForCausalLM": "mistral",
               "Qwen2ForCausalLM": "qwen2", "Qwen3ForCausalLM": "qwen3"}


def _both(tmp_path, architecture: str, **fields):
    """(transformers' config, ours) of one config.json."""
    import transformers

    config = {"architectures": [architecture], "model_type": MODEL_TYPES[architecture],
              **SHAPE, **fields}
    (tmp_path / "config.json").write_text(json.dumps(config))
    return transformers.AutoConfig.from_pretrained(tmp_path), read_model_config(str(tmp_path))


def _windowed_layers(theirs) -> bool:
    """Whether transformers windows some layer (Mistral: all of them, whenever a window is set)."""
    if theirs.sliding_window is None:
        return False
    return "sliding_attention" in (getattr(theirs, "layer_types", None) or ["sliding_attention"])


@pytest.mark.parametrize("architecture", sorted(MODEL_TYPES))
def test_an_absent_max_position_embeddings_is_transformers_default(tmp_path, architecture):
    theirs, ours = _both(tmp_path, architecture, sliding_window=None)
    assert ours.max_position_embeddings == theirs.max_position_embeddings
    assert ours.max_position_embeddings == {"LlamaForCausalLM": 2048,
                                            "MistralForCausalLM": 131072}.get(architecture, 32768)


@pytest.mark.parametrize(("architecture", "fields"), [
    *((architecture, {}) for architecture in sorted(MODEL_TYPES)),
    # MistralConfig refuses a null
    *((architecture, {"num_key_value_heads": None})
      for architecture in ("LlamaForCausalLM", "Qwen2ForCausalLM", "Qwen3ForCausalLM")),
])
def test_an_absent_or_null_num_key_value_heads_is_transformers(tmp_path, architecture, fields):
    """Absent: Mistral's 8 and Qwen's 32 (both once the 64 heads); null: the heads."""
    config = {key: value for key, value in SHAPE.items() if key != "num_key_value_heads"}
    (tmp_path / "config.json").write_text(json.dumps(
        {"architectures": [architecture], "model_type": MODEL_TYPES[architecture],
         **config, "num_attention_heads": 64, **fields}))
    import transformers

    theirs = transformers.AutoConfig.from_pretrained(tmp_path)
    assert read_model_config(str(tmp_path)).num_kv_heads == theirs.num_key_value_heads


@pytest.mark.parametrize(("fields", "window"), [
    ({}, 4096),  # MistralConfig's default: once read as no window, attending fully past it
    ({"sliding_window": None}, None),  # Mistral v0.2 and later
    ({"sliding_window": 300}, 300),
])
def test_mistral_windows_every_layer_by_default(tmp_path, fields, window):
    theirs, ours = _both(tmp_path, "MistralForCausalLM", max_position_embeddings=8192, **fields)
    assert theirs.sliding_window == ours.sliding_window == window
    assert ours.max_context == (window or 8192)


QWEN_CASES = [
    # once capped at the window though transformers windows no layer (28 >= 2 layers)
    {"use_sliding_window": True, "sliding_window": 32},
    {"use_sliding_window": True, "sliding_window": 32, "max_window_layers": 2},
    {"use_sliding_window": True, "sliding_window": 32, "max_window_layers": 1},
    {"use_sliding_window": True, "sliding_window": 32, "max_window_layers": 0},
    {"use_sliding_window": True, "max_window_layers": 0},  # the window's default, 4096
    {"use_sliding_window": True, "sliding_window": None, "max_window_layers": 0},
    {"use_sliding_window": False, "sliding_window": 32, "max_window_layers": 0},
    # transformers 5 writes layer_types, and reads them before max_window_layers
    {"use_sliding_window": True, "sliding_window": 32, "max_window_layers": 0,
     "layer_types": ["full_attention", "full_attention"]},
    {"use_sliding_window": True, "sliding_window": 32, "max_window_layers": 28,
     "layer_types": ["full_attention", "sliding_attention"]},
]


@pytest.mark.parametrize("architecture", ["Qwen2ForCausalLM", "Qwen3ForCausalLM"])
@pytest.mark.parametrize("fields", QWEN_CASES)
def test_qwen_caps_the_context_only_where_a_layer_is_windowed(tmp_path, architecture, fields):
    theirs, ours = _both(tmp_path, architecture, max_position_embeddings=8192, **fields)
    window = theirs.sliding_window if _windowed_layers(theirs) else None
    assert ours.sliding_window == window
    assert ours.max_context == (window or 8192)


def test_llama_has_no_window_whatever_its_config_says(tmp_path):
    theirs, ours = _both(tmp_path, "LlamaForCausalLM", use_sliding_window=True, sliding_window=32)
    assert ours.sliding_window is None and ours.max_context == theirs.max_position_embeddings


@pytest.mark.parametrize(("fields", "words"), [
    ({"layer_types": "sliding_attention"}, "layer_types must be a list of names"),
    ({"max_window_layers": 1.5}, "max_window_layers must be a whole number, got 1.5"),
])
def test_qwen_window_fields_of_the_wrong_type_are_named(tmp_path, fields, words):
    config = {"architectures": ["Qwen2ForCausalLM"], **SHAPE, "use_sliding_window": True, **fields}
    (tmp_path / "config.json").write_text(json.dumps(config))
    with pytest.raises(InferlabError, match=words):
        read_model_config(str(tmp_path))
