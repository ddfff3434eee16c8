"""Write a compressed model as a Hugging Face directory vLLM and compressed-tensors can read.

config.json (the source's, or one built from a GGUF's metadata) gains a `quantization_config`;
model.safetensors holds the quantized linears under their unfused HF names (q_proj, k_proj,
v_proj, gate_proj, up_proj: fused layers are split by rows, which is exact) and every other
tensor dense; the tokenizer and chat template are copied along.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import shutil
from itertools import accumulate
from typing import Any

import torch
from safetensors import SafetensorError
from safetensors.torch import save_file
from torch import nn

from inferlab.errors import InferlabError
from inferlab.models.config import ModelConfig
from inferlab.models.fused_layers import FUSED_SHARDS, shard_rows
from inferlab.models.tokenizer import CHAT_TEMPLATE_DIR
from inferlab.quant.checkpoint import quantization_config, tensors_for
from inferlab.quant.load import checkpoint_names
from inferlab.quant.qparams import QuantizedWeight
from inferlab.quant.recipe import Recipe

TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json",
                   "chat_template.jinja", "chat_template.json", "generation_config.json",
                   "tokenizer.model", "vocab.json", "merges.txt")
TORCH_DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}
DTYPE_NAMES = {dtype: name for name, dtype in TORCH_DTYPES.items()}


def shard_sizes(module_name: str, cfg: ModelConfig, rows: int) -> list[int]:
    """Output rows of each checkpoint shard of `module_name`, which has `rows` in all (one
    shard when not fused)."""
    leaf = module_name.rpartition(".")[2]
    return shard_rows(cfg, leaf) if leaf in FUSED_SHARDS else [rows]


def _split(name: str, tensor: torch.Tensor, cfg: ModelConfig) -> dict[str, torch.Tensor]:
    """A dense parameter of ours ('...qkv_proj.weight') -> HF tensors ('...q_proj.weight', ...)."""
    module, _, kind = name.rpartition(".")
    if module.rpartition(".")[2] not in FUSED_SHARDS:
        return {name: tensor}
    parts = tensor.split(shard_sizes(module, cfg, tensor.shape[0]), dim=0)
    return {f"{shard}.{kind}": p for shard, p in zip(checkpoint_names(module), parts, strict=True)}


def checkpoint_tensors(net: nn.Module, qweights: dict[str, QuantizedWeight], fmt: str | None,
                       dense_dtype: torch.dtype) -> dict[str, torch.Tensor]:
    """Every tensor of the compressed model, under HF names, ready for safetensors."""
    cfg = net.config
    out: dict[str, torch.Tensor] = {}
    for name, param in net.named_parameters():  # tied lm_head appears once, as the embedding
        if name.rpartition(".")[0] in qweights:
            continue  # a dense copy kept for an lm_head that is exported quantized
        for key, t in _split(name, param.data, cfg).items():
            out[key] = t.to(dense_dtype).contiguous()
    for module_name, qw in qweights.items():
        bounds = [0, *accumulate(shard_sizes(module_name, cfg, qw.shape[0]))]
        module = net.get_submodule(module_name)
        bias = getattr(module, "bias", None)
        for shard, lo, hi in zip(checkpoint_names(module_name), bounds[:-1], bounds[1:],
                                  strict=True):
            for local, t in tensors_for(qw.rows(lo, hi), fmt).items():
                out[f"{shard}.{local}"] = t
            if bias is not None:
                out[f"{shard}.bias"] = bias[lo:hi].to(dense_dtype).contiguous()
    return out


def sparsity_config(net: nn.Module, qweights: dict[str, QuantizedWeight], recipe: Recipe) -> dict:
    """compressed-tensors' dense sparsity config, with the measured share of zero weights."""
    if recipe.sparsity is None:
        return {}
    zeros = total = 0
    for name, module in net.named_modules():
        if name in qweights:
            qw = qweights[name]
            zeros += int((qw.dequantize() == 0).sum())
            total += qw.codes.numel()
        elif (isinstance(module, nn.Linear) and name.startswith("model.layers.")
              and not recipe.ignores(name)):
            weight = module.weight.data
            zeros += int((weight == 0).sum())
            total += weight.numel()
    return {"format": "dense", "sparsity_structure": recipe.sparsity, "targets": ["Linear"],
            "ignore": list(recipe.ignore), "global_sparsity": zeros / max(total, 1)}


def written_ignore(qweights: dict[str, QuantizedWeight], recipe: Recipe) -> list[str]:
    """The ignore list for config.json: the user's, plus lm_head whenever it stayed dense (no
    weight scheme), so a reader targeting every Linear does not expect it quantized."""
    ignore = list(recipe.ignore)
    if "lm_head" not in qweights and not recipe.ignores("lm_head"):
        ignore.append("lm_head")
    return ignore


def hf_config_from(cfg: Any) -> dict[str, Any]:
    """A transformers config.json for a model we only know from GGUF metadata."""
    model_type = {"LlamaForCausalLM": "llama", "MistralForCausalLM": "mistral",
                  "Qwen2ForCausalLM": "qwen2", "Qwen3ForCausalLM": "qwen3"}[cfg.architecture]
    out = {"architectures": [cfg.architecture], "model_type": model_type,
           "vocab_size": cfg.vocab_size, "hidden_size": cfg.hidden_size,
           "intermediate_size": cfg.intermediate_size, "num_hidden_layers": cfg.num_layers,
           "num_attention_heads": cfg.num_heads, "num_key_value_heads": cfg.num_kv_heads,
           "head_dim": cfg.head_dim, "max_position_embeddings": cfg.max_position_embeddings,
           "rms_norm_eps": cfg.rms_norm_eps, "rope_theta": cfg.rope_theta,
           "rope_scaling": cfg.rope_scaling, "tie_word_embeddings": cfg.tie_word_embeddings,
           "attention_bias": cfg.attention_bias, "hidden_act": "silu",
           "sliding_window": cfg.sliding_window}  # null where there is none (Mistral's is 4096)
    if cfg.bos_token_id is not None:
        out["bos_token_id"] = cfg.bos_token_id
    if cfg.eos_token_ids:
        out["eos_token_id"] = cfg.eos_token_ids[0] if len(cfg.eos_token_ids) == 1 else list(cfg.eos_token_ids)
    return out


def write_tokenizer(out_dir: str, source_path: str, tokenizer: Any) -> None:
    """Copy an HF directory's tokenizer files, or write tokenizer.json + config from a GGUF's."""
    if os.path.isdir(source_path):
        for name in TOKENIZER_FILES:
            if os.path.isfile(os.path.join(source_path, name)):
                shutil.copy2(os.path.join(source_path, name), os.path.join(out_dir, name))
        named_templates = os.path.join(source_path, CHAT_TEMPLATE_DIR)
        if os.path.isdir(named_templates):
            shutil.copytree(named_templates, os.path.join(out_dir, CHAT_TEMPLATE_DIR))
        return
    tokenizer.backend.save(os.path.join(out_dir, "tokenizer.json"))
    info = tokenizer.info
    template: Any = info.chat_template
    if info.tool_use_template is not None:  # named templates, as transformers saves them
        named = {"default": info.chat_template, "tool_use": info.tool_use_template}
        template = [{"name": n, "template": t} for n, t in named.items() if t is not None]
    config = {"bos_token": info.bos_token, "eos_token": info.eos_token, **info.template_tokens,
              "chat_template": template, "tokenizer_class": "PreTrainedTokenizerFast"}
    with open(os.path.join(out_dir, "tokenizer_config.json"), "w", encoding="utf-8") as f:
        json.dump({k: v for k, v in config.items() if v is not None}, f, indent=2)


def export_checkpoint(out_dir: str, net: nn.Module, qweights: dict[str, QuantizedWeight],
                      recipe: Recipe, source_path: str, tokenizer: Any, dense_dtype: torch.dtype,
                      extra_info: dict[str, Any] | None = None) -> None:
    """Write config.json, model.safetensors, the tokenizer and inferlab_quantize.json.

    Everything goes to a sibling temporary directory renamed into place at the end, so a
    failure leaves no half-written model behind.
    """
    if os.path.exists(out_dir) and (not os.path.isdir(out_dir) or os.listdir(out_dir)):
        raise InferlabError(f"{out_dir}: exists and is not empty (choose a new --out)")
    fmt = recipe.scheme.format if recipe.scheme is not None else None
    tensors = checkpoint_tensors(net, qweights, fmt, dense_dtype)
    if os.path.isdir(source_path):
        with open(os.path.join(source_path, "config.json"), encoding="utf-8") as f:
            config = json.load(f)
    else:
        config = hf_config_from(net.config)
    # transformers 5 names it `dtype` and reads that first: a source's own would contradict it
    config.update({key: DTYPE_NAMES[dense_dtype] for key in ("torch_dtype", "dtype")
                   if key in config or key == "torch_dtype"})
    if "lm_head" in qweights:  # its own quantized tensors now, beside the dense embedding
        config["tie_word_embeddings"] = False
    config["quantization_config"] = quantization_config(
        recipe.written_scheme, written_ignore(qweights, recipe), sparsity_config(net, qweights, recipe))
    staging = f"{os.path.normpath(out_dir)}.partial-{os.getpid()}"
    made = missing_parents(staging)
    os.makedirs(staging)
    try:
        save_file(tensors, os.path.join(staging, "model.safetensors"), metadata={"format": "pt"})
        _write_json(os.path.join(staging, "config.json"), config)
        # safetensors writes 0600 whatever the umask: a serving account could not read the weights
        shutil.copymode(os.path.join(staging, "config.json"), os.path.join(staging, "model.safetensors"))
        write_tokenizer(staging, source_path, tokenizer)
        _write_json(os.path.join(staging, "inferlab_quantize.json"), extra_info or {})
        if os.path.isdir(out_dir):
            os.rmdir(out_dir)  # empty, checked above
        os.replace(staging, out_dir)
    except BaseException as e:
        shutil.rmtree(staging, ignore_errors=True)
        for parent in made:  # deepest first; a folder someone else filled meanwhile stays
            with contextlib.suppress(OSError):
                os.rmdir(parent)
        reason = _write_failure(e)
        if reason is None:
            raise
        raise InferlabError(f"{out_dir}: cannot write the checkpoint ({reason})") from None


def _write_failure(e: BaseException) -> str | None:
    """Why writing failed, where the system refused it (a full disk, no permission): the
    user's to fix; None for anything else (an interrupt, a bug), which goes on as it is.
    safetensors reports its I/O errors as SafetensorError, not OSError."""
    if isinstance(e, OSError):
        return e.strerror or str(e)
    if not isinstance(e, SafetensorError):
        return None
    found = re.search(r"I/O error: (.+?)(?: \(os error \d+\))?$", str(e))
    return found.group(1) if found else None


def missing_parents(path: str) -> list[str]:
    """The folders above `path` that do not exist yet, deepest first."""
    missing = []
    parent = os.path.dirname(os.path.abspath(path))
    while not os.path.exists(parent):
        missing.append(parent)
        parent = os.path.dirname(parent)
    return missing


def _write_json(path: str, data: dict[str, Any]) -> None:
    with open(path, "w", encoding="utf-8") as f:
        json.dump(data, f, indent=2, sort_keys=True)
