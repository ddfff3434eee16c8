"""Tiny models for the quantization tests: a transformers Llama saved with a word-level tokenizer,
and the same model compressed by the compressed-tensors library itself."""

from __future__ import annotations

import json
from pathlib import Path

import torch

CONFIG = dict(vocab_size=160, hidden_size=64, intermediate_size=96, num_hidden_layers=2,
              num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=128,
              rms_norm_eps=1e-5)
ARCHS = {"llama": ("LlamaConfig", "LlamaForCausalLM", {"tie_word_embeddings": False}),
         "llama-tied": ("LlamaConfig", "LlamaForCausalLM", {"tie_word_embeddings": True}),
         "qwen2": ("Qwen2Config", "Qwen2ForCausalLM", {"tie_word_embeddings": True})}  # q/k/v bias


def make_tiny_model(arch: str, directory: Path, seed: int = 0):
    """A random transformers model saved as config.json + model.safetensors (fp32)."""
    import transformers

    config_cls, model_cls, extra = ARCHS[arch]
    torch.manual_seed(seed)
    model = getattr(transformers, model_cls)(getattr(transformers, config_cls)(**CONFIG, **extra)).eval()
    with torch.no_grad():  # non-trivial norms and biases
        for name, param in model.named_parameters():
            if "norm" in name or name.endswith("bias"):
                param.add_(torch.randn_like(param) * 0.1)
    model.save_pretrained(directory, safe_serialization=True)
    return model

WORDS = ("the of and to in a is was for on as with by at from his that it an were are which "
         "this be or has had first new after who one two their its but also they not have been "
         "he she city year years time film song game album season war world team later during "
         "may most other some when into more over only under while where there these than then "
         "them out about up all between three both many such early known part between series")


def write_tokenizer(directory: Path, vocab_size: int = 160) -> None:
    """A word-level tokenizer.json (plus tokenizer_config.json) whose ids fit the tiny vocab."""
    from tokenizers import Tokenizer, models, pre_tokenizers

    words = list(dict.fromkeys(WORDS.split()))
    vocab = {"<unk>": 0, "<s>": 1, "</s>": 2}
    for w in words[: vocab_size - 3]:
        vocab.setdefault(w, len(vocab))
    tok = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    tok.save(str(directory / "tokenizer.json"))
    (directory / "tokenizer_config.json").write_text(json.dumps({"bos_token": "<s>", "eos_token": "</s>"}))


def tiny_model_dir(directory: Path, arch: str = "llama", seed: int = 0) -> Path:
    make_tiny_model(arch, directory, seed)
    write_tokenizer(directory)
    return directory


def calibration_text(path: Path, words: int = 4000, seed: int = 0) -> Path:
    gen = torch.Generator().manual_seed(seed)
    vocab = WORDS.split()
    ids = torch.randint(0, len(vocab), (words,), generator=gen).tolist()
    path.write_text(" ".join(vocab[i] for i in ids) + "\n")
    return path


# Static activation scales are calibrated on these and then shrunk, so that the test sequences'
# largest inputs lie past them and clamp.
CALIBRATION_SEQS = [[(7 * i + 3 * j) % 160 for j in range(12)] for i in range(3)]
STATIC_SCALE_SHRINK = 0.7


def _input_absmax(model) -> dict[str, torch.Tensor]:
    """Each linear's largest |input| over CALIBRATION_SEQS, from the float model."""
    seen: dict[str, torch.Tensor] = {}
    hooks = [m.register_forward_pre_hook(
        lambda _m, args, name=name: seen.__setitem__(
            name, torch.maximum(seen.get(name, torch.zeros(())), args[0].abs().amax())))
        for name, m in model.named_modules() if isinstance(m, torch.nn.Linear)]
    with torch.no_grad():
        for seq in CALIBRATION_SEQS:
            model(torch.tensor([seq]))
    for hook in hooks:
        hook.remove()
    return seen


def library_compressed(directory: Path, groups: dict, arch: str = "llama", seed: int = 0) -> Path:
    """A tiny model quantized and saved by compressed-tensors (min-max scales from its helpers;
    static input scales from a small calibration run, shrunk by STATIC_SCALE_SHRINK)."""
    from compressed_tensors.compressors import ModelCompressor
    from compressed_tensors.quantization import QuantizationConfig, apply_quantization_config
    from compressed_tensors.quantization.utils import calculate_qparams

    model = make_tiny_model(arch, directory, seed)
    input_absmax = _input_absmax(model)
    apply_quantization_config(model, QuantizationConfig(config_groups=groups, ignore=["lm_head"]))
    for name, module in model.named_modules():
        scheme = getattr(module, "quantization_scheme", None)
        if scheme is None:
            continue
        if scheme.input_activations is not None and not scheme.input_activations.dynamic:
            top = input_absmax[name] * STATIC_SCALE_SHRINK
            scale, _ = calculate_qparams(-top.reshape(1), top.reshape(1), scheme.input_activations)
            module.input_scale.data.copy_(scale.reshape(module.input_scale.shape))
        w, args = module.weight.data, scheme.weights
        if args.strategy == "group":
            wg = w.view(w.shape[0], -1, args.group_size)
            lo, hi = wg.amin(-1), wg.amax(-1)
        elif args.strategy == "block":
            rows, cols = args.block_structure
            wb = w.view(w.shape[0] // rows, rows, w.shape[1] // cols, cols)
            lo, hi = wb.amin(dim=(1, 3)), wb.amax(dim=(1, 3))
        elif args.strategy == "channel":
            lo, hi = w.amin(-1, keepdim=True), w.amax(-1, keepdim=True)
        else:
            lo, hi = w.amin().reshape(1), w.amax().reshape(1)
        scale, zero_point = calculate_qparams(lo, hi, args)
        module.weight_scale.data.copy_(scale)
        if hasattr(module, "weight_zero_point"):
            module.weight_zero_point.data.copy_(zero_point)
    compressor = ModelCompressor.from_pretrained_model(model)
    compressor.compress_model(model)
    model.save_pretrained(directory)
    compressor.update_config(str(directory))
    return directory


def prefill_logits(net, seqs: list[list[int]], block_size: int = 16) -> list[torch.Tensor]:
    """Our model's logits [L, V] for each sequence, all prefilled in one flat batch."""
    from inferlab.kernels.attention.metadata import AttentionMetadata, token_positions

    cfg = net.config
    lens = [len(s) for s in seqs]
    tables, start = [], 0
    for n in lens:
        blocks = -(-n // block_size)
        tables.append(list(range(start, start + blocks)))
        start += blocks
    dtype = net.model.embed_tokens.weight.dtype
    shape = (start, block_size, cfg.num_kv_heads, cfg.head_dim)
    caches = [(torch.zeros(shape, dtype=dtype), torch.zeros(shape, dtype=dtype))
              for _ in range(cfg.num_layers)]
    meta = AttentionMetadata.build(lens, lens, tables, block_size)
    _, positions = token_positions(lens, lens)
    ids = torch.tensor([t for s in seqs for t in s])
    with torch.no_grad():
        logits = net.compute_logits(net(ids, positions, caches, meta))
    return list(logits.split(lens))
