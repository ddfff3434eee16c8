"""Validate and load a model (model_path finds it): a Hugging Face directory, a GGUF file, or the
embedded default."""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator
from dataclasses import dataclass

import torch

from inferlab.errors import InferlabError, ModelLoadError
from inferlab.models import gguf
from inferlab.models.config import ModelConfig, read_json_object
from inferlab.models.generation_config import GenerationConfig, read_generation_config
from inferlab.models.gguf_reader import GGUFFile, is_gguf_file
from inferlab.models.llama import LlamaForCausalLM
from inferlab.models.model_path import model_display_name, resolve_model_path
from inferlab.models.tokenizer import TextTokenizer, load_gguf_tokenizer, load_hf_tokenizer
from inferlab.user_files import check_readable, is_user_file

PrepareLayer = Callable[[torch.nn.Module], object]  # a decoder layer, its weights all in


def read_model_config(path: str) -> ModelConfig:
    """The model's shape, without loading weights."""
    if os.path.isdir(path):
        config_path = os.path.join(path, "config.json")
        if not is_user_file(config_path):
            raise ModelLoadError(f"{config_path}: missing")
        return ModelConfig.from_hf_dict(read_json_object(config_path), source=config_path)
    _check_gguf_name(path)
    return gguf.read_gguf_config(path)


def _check_gguf_name(path: str) -> None:
    """A path that is no directory must be a GGUF file (by name or magic): any other gets this
    one message from every command (`serve` once read a text file as GGUF, "bad magic"); one
    we may not read says so first (its magic cannot be told), and one that is no regular file
    before anything opens it (a FIFO with no writer blocks the open)."""
    gguf.check_regular_file(path)
    check_readable(path)
    if not is_gguf_file(path):
        raise ModelLoadError(f"{path}: is neither a model directory (config.json + safetensors) "
                             "nor a .gguf file")


@dataclass
class LoadedModel:
    model: LlamaForCausalLM
    config: ModelConfig
    tokenizer: TextTokenizer
    name: str
    path: str
    generation: GenerationConfig = GenerationConfig()  # a directory's generation_config.json

    def checked_for(self, dtype: torch.dtype, device: torch.device) -> LoadedModel:
        """This model, once it is seen to be loaded in `dtype` on `device`: an engine given one
        loaded for another dtype ran in a mix of both (bf16 weights, an fp32 KV cache), silently
        off."""
        weight = self.model.model.norm.weight
        loaded_as, wanted = (f"{str(t).removeprefix('torch.')} on {kind}" for t, kind in
                             ((weight.dtype, weight.device.type), (dtype, device.type)))
        if loaded_as != wanted:
            raise InferlabError(f"the model was loaded as {loaded_as}; this engine runs {wanted}")
        return self


def load_model(model: str | None = None, dtype: torch.dtype = torch.float32,
               device: str | torch.device = "cpu", prepare_layer: PrepareLayer | None = None) -> LoadedModel:
    """`prepare_layer`: called on each decoder layer as soon as its weights are in (see
    LlamaForCausalLM.load_weights)."""
    path = resolve_model_path(model)
    generation = read_generation_config(path) if os.path.isdir(path) else GenerationConfig()
    reader = None if os.path.isdir(path) else _open_gguf_model(path)  # parsed once: 98k strings
    net, cfg = load_network(path, dtype, device, reader, prepare_layer)
    return LoadedModel(net, cfg, load_tokenizer(path, reader), model_display_name(model), path, generation)


def load_tokenizer(path: str, reader: GGUFFile | None = None) -> TextTokenizer:
    """The tokenizer of a resolved model path (a directory or a .gguf file, `reader` if open),
    without its weights."""
    if os.path.isdir(path):
        return load_hf_tokenizer(path)
    return load_gguf_tokenizer(reader or gguf.open_gguf(path), path)


def _open_gguf_model(path: str) -> GGUFFile:
    _check_gguf_name(path)
    return gguf.open_gguf(path)


def load_network(path: str, dtype: torch.dtype = torch.float32, device: str | torch.device = "cpu",
                 reader: GGUFFile | None = None,
                 prepare_layer: PrepareLayer | None = None) -> tuple[LlamaForCausalLM, ModelConfig]:
    """The network alone (no tokenizer), from a model directory or a GGUF file (`reader` if
    open)."""
    if os.path.isdir(path):
        cfg = read_model_config(path)
        weights = _iter_safetensors(path)
        quant_config = cfg.extra.get("quantization_config")
    else:
        reader = reader or _open_gguf_model(path)
        cfg = gguf.read_gguf_config(path, reader)
        weights = gguf.iter_gguf_weights(path, cfg, dtype, reader)
        quant_config = None
    if quant_config:
        net = _load_quantized(cfg, quant_config, weights, path, dtype, device)
    else:
        net = _materialize(cfg, weights, path, dtype, device, prepare_layer)
    return net.eval(), cfg


def check_gguf_weights(path: str, reader: GGUFFile, cfg: ModelConfig) -> None:
    """What loading the file's weights refuses (a tensor unexpected, missing or of a shape the
    config contradicts, q/k rows not whole heads), found on meta tensors: no data read."""
    with torch.device("meta"):
        net = LlamaForCausalLM(cfg)
    net.load_weights(gguf.iter_gguf_weights(path, cfg, torch.float32, reader, shapes_only=True), path)


def _materialize(cfg: ModelConfig, weights: Iterator[tuple[str, torch.Tensor]], path: str,
                 dtype: torch.dtype, device: str | torch.device,
                 prepare_layer: PrepareLayer | None = None) -> LlamaForCausalLM:
    """Build on the meta device (no random init), then take the checkpoint's tensors as parameters."""
    with torch.device("meta"):
        net = LlamaForCausalLM(cfg)
    net.load_weights(((name, t.to(device=device, dtype=dtype)) for name, t in weights), path, prepare_layer)
    materialize_buffers(net, device)
    return net


def materialize_buffers(net: LlamaForCausalLM, device: str | torch.device) -> None:
    """Allocate and fill the non-parameter buffers (RoPE tables) of a model built on meta or with
    the default dtype; they stay fp32 whatever the weights' dtype."""
    rotary = net.model.rotary
    rotary.cos = torch.empty(rotary.cos.shape, device=device)
    rotary.sin = torch.empty(rotary.sin.shape, device=device)
    rotary.reset_buffers()


def _load_quantized(cfg: ModelConfig, quant_config: dict, weights: Iterator[tuple[str, torch.Tensor]],
                    path: str, dtype: torch.dtype, device: str | torch.device) -> LlamaForCausalLM:
    """Quantized linears are built straight from the compressed tensors; the rest loads as usual."""
    from inferlab.quant.load import apply_compressed_tensors

    if quant_config.get("quant_method") != "compressed-tensors":
        raise ModelLoadError(f"{path}: quantization method {quant_config.get('quant_method')!r} "
                             "is not supported (supported: compressed-tensors)")
    with torch.device("meta"):
        net = LlamaForCausalLM(cfg)
    rest = apply_compressed_tensors(net, quant_config, dict(weights), path, dtype, device)
    net.load_weights(((name, t.to(device=device, dtype=dtype)) for name, t in rest.items()), path)
    materialize_buffers(net, device)
    return net


def safetensors_files(model_dir: str) -> list[str]:
    index = os.path.join(model_dir, "model.safetensors.index.json")
    if is_user_file(index):
        return [os.path.join(model_dir, s) for s in _index_shards(index)]
    single = os.path.join(model_dir, "model.safetensors")
    if is_user_file(single):
        return [single]
    raise ModelLoadError(f"{model_dir}: no model.safetensors or model.safetensors.index.json "
                         "(pickled .bin checkpoints are never loaded)")


def _index_shards(index: str) -> list[str]:
    """The shard files an index's weight_map names (tensor name -> file name), each once."""
    weight_map = read_json_object(index).get("weight_map")
    if not isinstance(weight_map, dict):
        raise ModelLoadError(f"{index}: weight_map must be an object of tensor name -> shard "
                             f"file name, got {'nothing' if weight_map is None else type(weight_map).__name__}")
    for name, shard in weight_map.items():
        if not isinstance(shard, str) or not shard:
            raise ModelLoadError(f"{index}: weight_map[{name!r}] is {shard!r}, not a file name")
    return sorted(set(weight_map.values()))


def _iter_safetensors(model_dir: str) -> Iterator[tuple[str, torch.Tensor]]:
    from safetensors import safe_open

    for file in safetensors_files(model_dir):
        if not is_user_file(file):
            raise ModelLoadError(f"{file}: missing (listed in the index)")
        check_readable(file)
        try:
            with safe_open(file, framework="pt") as f:
                for name in f.keys():  # noqa: SIM118 -- safe_open has no __iter__
                    yield name, f.get_tensor(name)
        except ModelLoadError:
            raise
        except Exception as e:  # SafetensorError on a truncated or corrupt file
            raise ModelLoadError(f"{file}: cannot be read ({e})") from None
