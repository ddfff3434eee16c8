"""Shapes of common public models, copied field by field from each model's Hugging Face
config.json (the `source` of each entry); only the fields the planner needs."""

from __future__ import annotations

from typing import Any

from inferlab.models.config import ModelConfig
from inferlab.planner.names import lookup


def _llama(hidden: int, inter: int, layers: int, heads: int, kv: int, vocab: int, ctx: int,
           tied: bool = False, head_dim: int | None = None, arch: str = "LlamaForCausalLM",
           **extra: Any) -> dict[str, Any]:
    cfg = {"architectures": [arch], "hidden_size": hidden, "intermediate_size": inter,
           "num_hidden_layers": layers, "num_attention_heads": heads, "num_key_value_heads": kv,
           "vocab_size": vocab, "max_position_embeddings": ctx, "tie_word_embeddings": tied}
    if head_dim is not None:
        cfg["head_dim"] = head_dim
    return cfg | extra


HF = "https://huggingface.co/{}/blob/main/config.json"

# name -> (config.json fields, source)
PRESETS: dict[str, tuple[dict[str, Any], str]] = {
    "Llama-2-7B": (_llama(4096, 11008, 32, 32, 32, 32000, 4096),
                   HF.format("meta-llama/Llama-2-7b-hf")),
    "Llama-2-13B": (_llama(5120, 13824, 40, 40, 40, 32000, 4096),
                    HF.format("meta-llama/Llama-2-13b-hf")),
    "Llama-2-70B": (_llama(8192, 28672, 80, 64, 8, 32000, 4096),
                    HF.format("meta-llama/Llama-2-70b-hf")),
    "Llama-3.1-8B": (_llama(4096, 14336, 32, 32, 8, 128256, 131072),
                     HF.format("meta-llama/Llama-3.1-8B")),
    "Llama-3.1-70B": (_llama(8192, 28672, 80, 64, 8, 128256, 131072),
                      HF.format("meta-llama/Llama-3.1-70B")),
    "Llama-3.2-1B": (_llama(2048, 8192, 16, 32, 8, 128256, 131072, tied=True, head_dim=64),
                     HF.format("meta-llama/Llama-3.2-1B")),
    "Llama-3.2-3B": (_llama(3072, 8192, 28, 24, 8, 128256, 131072, tied=True, head_dim=128),
                     HF.format("meta-llama/Llama-3.2-3B")),
    "Mistral-7B": (_llama(4096, 14336, 32, 32, 8, 32768, 32768, arch="MistralForCausalLM",
                          sliding_window=None),  # v0.3's config.json says null: no window
                   HF.format("mistralai/Mistral-7B-Instruct-v0.3")),
    "Qwen2.5-0.5B": (_llama(896, 4864, 24, 14, 2, 151936, 32768, tied=True,
                            arch="Qwen2ForCausalLM"), HF.format("Qwen/Qwen2.5-0.5B-Instruct")),
    "Qwen2.5-7B": (_llama(3584, 18944, 28, 28, 4, 152064, 32768, arch="Qwen2ForCausalLM"),
                   HF.format("Qwen/Qwen2.5-7B-Instruct")),
    "Qwen3-0.6B": (_llama(1024, 3072, 28, 16, 8, 151936, 40960, tied=True, head_dim=128,
                          arch="Qwen3ForCausalLM"), HF.format("Qwen/Qwen3-0.6B")),
    "Qwen3-1.7B": (_llama(2048, 6144, 28, 16, 8, 151936, 40960, tied=True, head_dim=128,
                          arch="Qwen3ForCausalLM"), HF.format("Qwen/Qwen3-1.7B")),
    "Qwen3-4B": (_llama(2560, 9728, 36, 32, 8, 151936, 40960, tied=True, head_dim=128,
                        arch="Qwen3ForCausalLM"), HF.format("Qwen/Qwen3-4B")),
    "Qwen3-8B": (_llama(4096, 12288, 36, 32, 8, 151936, 40960, head_dim=128,
                        arch="Qwen3ForCausalLM"), HF.format("Qwen/Qwen3-8B")),
    "Qwen3-14B": (_llama(5120, 17408, 40, 40, 8, 151936, 40960, head_dim=128,
                         arch="Qwen3ForCausalLM"), HF.format("Qwen/Qwen3-14B")),
    "Qwen3-32B": (_llama(5120, 25600, 64, 64, 8, 151936, 40960, head_dim=128,
                         arch="Qwen3ForCausalLM"), HF.format("Qwen/Qwen3-32B")),
    "SmolLM2-135M": (_llama(576, 1536, 30, 9, 3, 49152, 8192, tied=True),
                     HF.format("HuggingFaceTB/SmolLM2-135M-Instruct")),
    "SmolLM2-360M": (_llama(960, 2560, 32, 15, 5, 49152, 8192, tied=True),
                     HF.format("HuggingFaceTB/SmolLM2-360M-Instruct")),
    "SmolLM2-1.7B": (_llama(2048, 8192, 24, 32, 32, 49152, 8192, tied=True),
                     HF.format("HuggingFaceTB/SmolLM2-1.7B-Instruct")),
}


def preset_config(name: str) -> tuple[str, ModelConfig, str]:
    """(canonical name, shape, source) of a preset; InferlabError with the closest names if unknown."""
    fields, source = lookup(PRESETS, name, "model preset")
    canonical = next(k for k in PRESETS if k.lower() == name.lower())
    return canonical, ModelConfig.from_hf_dict(fields, source=f"preset {canonical}"), source
