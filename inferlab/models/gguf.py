"""GGUF files: hyper-parameters, tokenizer and weights, mapped onto the Hugging Face layout.

Reading the config does not import torch (the planner uses it); weights are dequantized to the run
dtype by the `gguf` package, and the Q/K row permutation that llama.cpp's converter applies is undone
so the model sees Hugging Face's rotate-half layout.
"""

from __future__ import annotations

import math
import re
import reprlib
import stat
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING, Any

from inferlab.errors import ModelLoadError
from inferlab.models.config import ModelConfig, config_error_in
from inferlab.models.gguf_reader import GGUFFile, GGUFTensor
from inferlab.user_files import stat_user_path

if TYPE_CHECKING:  # annotations only: reading the config needs no torch
    import torch

ARCHITECTURES = {"llama": "LlamaForCausalLM", "mistral": "MistralForCausalLM",
                 "qwen2": "Qwen2ForCausalLM", "qwen3": "Qwen3ForCausalLM"}
SUPPORTED_TYPES = ("F32", "F16", "BF16", "Q8_0", "Q4_0", "Q4_1", "Q4_K", "Q5_K", "Q6_K")

_LAYER_NAMES = {
    "attn_q": "self_attn.q_proj", "attn_k": "self_attn.k_proj", "attn_v": "self_attn.v_proj",
    "attn_output": "self_attn.o_proj", "attn_norm": "input_layernorm",
    "ffn_norm": "post_attention_layernorm", "ffn_gate": "mlp.gate_proj",
    "ffn_up": "mlp.up_proj", "ffn_down": "mlp.down_proj",
    "attn_q_norm": "self_attn.q_norm", "attn_k_norm": "self_attn.k_norm",
}
_GLOBAL_NAMES = {"token_embd": "model.embed_tokens", "output_norm": "model.norm", "output": "lm_head"}
ROPE_FREQS = "rope_freqs.weight"
_BIASED = ("attn_q", "attn_k", "attn_v", "attn_output")  # the model has no other biases
_LAYER_TENSOR = re.compile(r"blk\.([0-9]+)\.")


def check_regular_file(path: str) -> None:
    """Refuse a path that is no regular file before anything opens it: a FIFO with no writer
    blocks open() for good, and a device (a link to /dev/zero) is no file of ours."""
    found = stat_user_path(path)
    if found is None:
        raise ModelLoadError(f"{path}: no such file")
    if not stat.S_ISREG(found.st_mode):
        raise ModelLoadError(f"{path}: not a regular file")


def open_gguf(path: str) -> GGUFFile:
    check_regular_file(path)
    return GGUFFile(path)


def field(reader: GGUFFile, key: str, default: Any = None) -> Any:
    return reader.get(key, default)


def typed_field(reader: GGUFFile, path: str, key: str, kind: type | tuple[type, ...], what: str,
                default: Any = None) -> Any:
    """reader[key] where it is a `kind` (a bool is no int), else a one-line error saying it
    should be `what`: a value of another type failed later as a TypeError, or was misread
    (bool("false") is True)."""
    value = field(reader, key, default)
    if value is None or (isinstance(value, kind) and (kind is bool or not isinstance(value, bool))):
        return value
    raise ModelLoadError(f"{path}: GGUF metadata {key} is {reprlib.repr(value)}, not {what}")


def token_id(reader: GGUFFile, path: str, key: str) -> int | None:
    return typed_field(reader, path, key, int, "a token id (a whole number)")


def chat_template(reader: GGUFFile, path: str, key: str = "tokenizer.chat_template") -> str | None:
    return typed_field(reader, path, key, str, "a chat template (a string)")


def read_gguf_config(path: str, reader: GGUFFile | None = None) -> ModelConfig:
    """Model shape from GGUF metadata."""
    reader = reader or open_gguf(path)
    arch = typed_field(reader, path, "general.architecture", str, "an architecture name")
    if arch not in ARCHITECTURES:
        raise ModelLoadError(f"{path}: GGUF architecture {arch!r} is not supported "
                             f"(supported: {', '.join(ARCHITECTURES)})")
    _check_dense(reader, path, arch)
    names = {t.name for t in reader.tensors}

    def meta(key: str, default: Any = None, cast: type = int) -> Any:
        # a number as the file types it, as llama.cpp reads it: int() took "12" and 12.7
        kinds, what = (int, "a whole number") if cast is int else ((int, float), "a number")
        value = typed_field(reader, path, f"{arch}.{key}", kinds, what, default)
        if value is None:
            raise ModelLoadError(f"{path}: GGUF metadata {arch}.{key} is missing")
        return cast(value)

    hidden = meta("embedding_length")
    num_heads = meta("attention.head_count")
    if num_heads < 1:
        raise ModelLoadError(f"{path}: GGUF metadata {arch}.attention.head_count is {num_heads}")
    head_dim = meta("attention.key_length", 0) or hidden // num_heads
    rotary_dim = meta("rope.dimension_count", head_dim)
    if rotary_dim != head_dim:  # llama.cpp refuses it for llama too
        raise ModelLoadError(f"{path}: GGUF metadata {arch}.rope.dimension_count is {rotary_dim}, "
                             f"not the head size {head_dim} (partial rotary embeddings are not "
                             "supported)")
    tokens = field(reader, "tokenizer.ggml.tokens")
    vocab = (typed_field(reader, path, f"{arch}.vocab_size", int, "a whole number")
             or (len(tokens) if isinstance(tokens, list) else 0))
    rope_scaling = _rope_scaling(reader, arch, meta)
    # llama.cpp ends a generation at any of these (Llama 3's <|eot_id|> and <|eom_id|> besides EOS)
    end_ids = [token_id(reader, path, f"tokenizer.ggml.{name}_token_id")
               for name in ("eos", "eot", "eom")]
    try:
        cfg = ModelConfig(
            architecture=ARCHITECTURES[arch],
            vocab_size=vocab,
            hidden_size=hidden,
            intermediate_size=meta("feed_forward_length"),
            num_layers=meta("block_count"),
            num_heads=num_heads,
            num_kv_heads=meta("attention.head_count_kv", num_heads),
            head_dim=head_dim,
            max_position_embeddings=meta("context_length"),
            rms_norm_eps=meta("attention.layer_norm_rms_epsilon", cast=float),
            rope_theta=meta("rope.freq_base", 10000.0, float),
            rope_scaling=rope_scaling,
            rope_freq_factors=_rope_freq_factors(reader, path, head_dim),
            tie_word_embeddings="output.weight" not in names,
            attention_bias="blk.0.attn_q.bias" in names,
            o_bias="blk.0.attn_output.bias" in names,
            qk_norm="blk.0.attn_q_norm.weight" in names,
            bos_token_id=token_id(reader, path, "tokenizer.ggml.bos_token_id"),
            eos_token_ids=tuple(dict.fromkeys(i for i in end_ids if i is not None)),
        )
    except ModelLoadError as e:
        raise config_error_in(path, e) from None
    _check_layers(reader, path, f"{arch}.block_count", cfg.num_layers, names)
    return cfg


def _check_dense(reader: GGUFFile, path: str, arch: str) -> None:
    """Refuse a mixture of experts by its metadata, before its expert tensors (which no
    parameter takes) read as a dense model missing its MLP."""
    experts = field(reader, f"{arch}.expert_count")
    if isinstance(experts, int) and experts > 0:
        raise ModelLoadError(f"{path}: mixture-of-experts GGUF ({arch}.expert_count {experts}) "
                             "is not supported")


def _check_layers(reader: GGUFFile, path: str, key: str, count: int, names: set[str]) -> None:
    """The declared layers are those the tensors number, blk.0 to blk.{count - 1}, as llama.cpp
    loads them: checked before anything builds a list per layer (a block_count of 1e12 hung
    `info` and `generate`). A shard of a split GGUF holds some of them: it says so."""
    shards = field(reader, "split.count")
    if isinstance(shards, int) and not isinstance(shards, bool) and shards > 1:
        raise ModelLoadError(f"{path}: one of the {shards} shards of a split GGUF; merge them into "
                             "one file first (llama-gguf-split --merge)")
    layers = {int(m[1]) for name in names if (m := _LAYER_TENSOR.match(name))}
    if len(layers) != count or max(layers, default=-1) != count - 1:
        held = f"layers {min(layers)} to {max(layers)}" if layers else "no layers"
        raise ModelLoadError(f"{path}: GGUF metadata {key} is {count}, but the file holds tensors "
                             f"for {held} ({len(layers)} in all)")


def _rope_scaling(reader: GGUFFile, arch: str, meta: Callable[..., Any]) -> dict[str, Any] | None:
    """llama.cpp's rope.scaling keys as a Hugging Face rope_scaling dict; ModelConfig refuses
    the types it cannot compute."""
    kind = field(reader, f"{arch}.rope.scaling.type")
    if kind in (None, "none"):
        return None
    if kind == "linear":
        return {"rope_type": "linear", "factor": meta("rope.scaling.factor", cast=float)}
    if kind == "yarn":
        return {"rope_type": "yarn", "factor": meta("rope.scaling.factor", cast=float),
                "original_max_position_embeddings": meta("rope.scaling.original_context_length")}
    return {"rope_type": kind}


def _rope_freq_factors(reader: GGUFFile, path: str, head_dim: int) -> tuple[float, ...] | None:
    """The rope_freqs tensor's divisors, one per pair of head dimensions (llama.cpp's shape for
    it), or None where the file has none."""
    tensor = next((t for t in reader.tensors if t.name == ROPE_FREQS), None)
    if tensor is None:
        return None
    if tensor.shape != (head_dim // 2,):
        raise ModelLoadError(f"{path}: tensor {ROPE_FREQS} has shape {tensor.shape}, not "
                             f"({head_dim // 2},): a factor per pair of the {head_dim} head "
                             "dimensions")
    factors = tensor.f32_values()
    bad = next((f for f in factors if not (0 < f < math.inf)), None)  # NaN fails both
    if bad is not None:  # each divides a frequency
        raise ModelLoadError(f"{path}: tensor {ROPE_FREQS} holds {bad}, not a positive factor")
    return tuple(factors)


def hf_name(gguf_name: str) -> str | None:
    """blk.3.attn_q.weight -> model.layers.3.self_attn.q_proj.weight; None for a tensor no
    parameter of the model takes (a bias but on attention's projections among them)."""
    base, _, suffix = gguf_name.rpartition(".")
    parts = base.split(".")
    if parts[0] == "blk" and len(parts) == 3 and parts[2] in _LAYER_NAMES:
        kind, name = parts[2], f"model.layers.{parts[1]}.{_LAYER_NAMES[parts[2]]}"
    elif base in _GLOBAL_NAMES:
        kind, name = base, _GLOBAL_NAMES[base]
    else:
        return None
    if suffix == "weight" or (suffix == "bias" and kind in _BIASED):
        return f"{name}.{suffix}"
    return None


def check_gguf_tensors(path: str, reader: GGUFFile) -> list[tuple[str, GGUFTensor]]:
    """(HF name, tensor) for each tensor, refused as loading refuses it: data outside the file
    or out of order, a tensor no parameter takes (llama.cpp refuses a file with a tensor it
    does not load), a type not dequantized here."""
    named = []
    for tensor in reader.checked_tensors():
        if tensor.name == ROPE_FREQS:  # no parameter: read_gguf_config took it into the config
            continue
        name = hf_name(tensor.name)
        if name is None:
            raise ModelLoadError(f"{path}: tensor {tensor.name} is not supported (no parameter of "
                                 "the model takes it)")
        if tensor.type_name not in SUPPORTED_TYPES:
            raise ModelLoadError(f"{path}: tensor {tensor.name} has type {tensor.type_name} "
                                 f"(supported: {', '.join(SUPPORTED_TYPES)})")
        named.append((name, tensor))
    return named


def iter_gguf_weights(path: str, cfg: ModelConfig, dtype: torch.dtype, reader: GGUFFile | None = None,
                      shapes_only: bool = False) -> Iterator[tuple[str, torch.Tensor]]:
    """Yield (HF name, tensor in `dtype`) for every weight, Q/K rows un-permuted; shapes_only:
    tensors on the meta device, none of the data read (what `info` checks)."""
    import gguf
    import torch

    from inferlab.models import gguf_blocks

    reader = reader or open_gguf(path)
    for name, tensor in check_gguf_tensors(path, reader):
        shape = tuple(reversed(tensor.shape))
        if shapes_only:
            weight = torch.empty(shape, device="meta")
        elif tensor.type_name in gguf_blocks.TYPES:
            weight = gguf_blocks.dequantize_blocks(tensor.raw(), tensor.type_name).reshape(shape)
        else:
            array = gguf.quants.dequantize(tensor.raw(), gguf.GGMLQuantizationType(tensor.type_id))
            if not array.flags.writeable:  # F32 tensors are views of the read-only file mapping
                array = array.copy()
            weight = torch.from_numpy(array.reshape(shape))
        heads = _permuted_heads(cfg, name)
        if heads is not None:
            if weight.shape[0] != heads * cfg.head_dim:  # else the un-permuting reshape fails
                raise ModelLoadError(f"{path}: tensor {tensor.name} has shape "
                                     f"{tuple(weight.shape)}, not {heads} heads of {cfg.head_dim} rows")
            weight = unpermute_rows(weight, heads)
        yield name, weight.to(dtype)


def _permuted_heads(cfg: ModelConfig, name: str) -> int | None:
    """The heads of a tensor whose rows llama.cpp's converter permuted (Llama's and Mistral's
    q and k projections), None for the others."""
    if cfg.architecture not in ("LlamaForCausalLM", "MistralForCausalLM"):
        return None
    if name.endswith(("q_proj.weight", "q_proj.bias")):
        return cfg.num_heads
    if name.endswith(("k_proj.weight", "k_proj.bias")):
        return cfg.num_kv_heads
    return None


def unpermute_rows(weight: torch.Tensor, num_heads: int) -> torch.Tensor:
    """Undo llama.cpp's interleaving of each head's rotary halves. weight: [heads*D, ...]."""
    rest = weight.shape[1:]
    head_dim = weight.shape[0] // num_heads
    return (weight.reshape(num_heads, head_dim // 2, 2, *rest)
            .transpose(1, 2).reshape(weight.shape))
