"""Tiny random models of each supported architecture, saved as safetensors by transformers."""

from __future__ import annotations

from pathlib import Path

import torch

COMMON = dict(vocab_size=160, hidden_size=64, intermediate_size=96, num_hidden_layers=2,
              num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=128,
              rms_norm_eps=1e-5)

# name -> (transformers config class, model class, extra config fields)
ARCHITECTURES = {
    "llama": ("LlamaConfig", "LlamaForCausalLM",
              dict(tie_word_embeddings=True, rope_theta=10000.0)),
    "llama3-rope": ("LlamaConfig", "LlamaForCausalLM",
                    dict(rope_scaling={"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
                                       "high_freq_factor": 4.0,
                                       "original_max_position_embeddings": 32},
                         rope_theta=500000.0)),
    "llama-linear-rope": ("LlamaConfig", "LlamaForCausalLM",
                          dict(rope_scaling={"rope_type": "linear", "factor": 2.0})),
    "mistral": ("MistralConfig", "MistralForCausalLM", dict(sliding_window=None)),
    "qwen2": ("Qwen2Config", "Qwen2ForCausalLM", dict(tie_word_embeddings=True)),
    "qwen2-yarn": ("Qwen2Config", "Qwen2ForCausalLM",
                   dict(rope_scaling={"rope_type": "yarn", "factor": 4.0,
                                      "original_max_position_embeddings": 32})),
    "qwen3": ("Qwen3Config", "Qwen3ForCausalLM", dict(head_dim=32, tie_word_embeddings=False)),
    # biases on q, k, v and o: such a checkpoint was once refused (o_proj.bias unexpected)
    "llama-attention-bias": ("LlamaConfig", "LlamaForCausalLM", dict(attention_bias=True)),
    # transformers' name for SiLU too; once refused
    "llama-swish": ("LlamaConfig", "LlamaForCausalLM", dict(hidden_act="swish")),
    # heads wider than the C rotary kernel's buffers: once a ValueError at the first forward
    "llama-wide-heads": ("LlamaConfig", "LlamaForCausalLM", dict(head_dim=576)),
}


def make_tiny_model(name: str, directory: Path, seed: int = 0, **overrides):
    """Build, save (config.json + model.safetensors) and return the transformers model, fp32;
    overrides: config fields over COMMON's and the architecture's."""
    import transformers

    config_cls, model_cls, extra = ARCHITECTURES[name]
    config = getattr(transformers, config_cls)(**{**COMMON, **extra, **overrides})
    torch.manual_seed(seed)
    model = getattr(transformers, model_cls)(config).eval()
    with torch.no_grad():  # random biases and norms, so those code paths are exercised
        for pname, param in model.named_parameters():
            if pname.endswith("bias") or "norm" in pname:
                param.add_(torch.randn_like(param) * 0.1)
    model.save_pretrained(directory, safe_serialization=True)
    return model
