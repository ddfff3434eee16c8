"""A Llama 3.1 GGUF carries its llama3 RoPE scaling as the rope_freqs tensor (llama.cpp's
convert_hf_to_gguf writes one divisor per pair of head dimensions, and no rope.scaling keys):
such a file once failed to load. Its logits now equal transformers' on the HF config it came from."""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pytest
import torch

from inferlab.errors import ModelLoadError
from inferlab.models.loader import load_network, read_model_config

from .paged_harness import run_schedule
from .tiny_models import COMMON, make_tiny_model

CONTEXT = 131072  # Llama 3.1's llama.context_length
HEADS, KV_HEADS = COMMON["num_attention_heads"], COMMON["num_key_value_heads"]
HEAD_DIM = COMMON["hidden_size"] // HEADS
# Llama 3.1's factors with the pretraining length scaled down from 8192 to 64, so that over 200
# positions the 8 pairs (wavelengths 6 to 19869) fall in all three bands: 1 kept (under 64 / 4),
# 2 blended, 5 slowed by 8 (over 64 / 1)
LLAMA3 = {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
          "original_max_position_embeddings": 64}
THETA = 10000.0
LAYER_NAMES = {  # transformers' -> llama.cpp's
    "input_layernorm": "attn_norm", "self_attn.q_proj": "attn_q", "self_attn.k_proj": "attn_k",
    "self_attn.v_proj": "attn_v", "self_attn.o_proj": "attn_output",
    "post_attention_layernorm": "ffn_norm", "mlp.gate_proj": "ffn_gate", "mlp.up_proj": "ffn_up",
    "mlp.down_proj": "ffn_down"}
GLOBAL_NAMES = {"model.embed_tokens.weight": "token_embd.weight", "model.norm.weight":
                "output_norm.weight", "lm_head.weight": "output.weight"}


def converter_rope_factors(scaling: dict, theta: float, head_dim: int) -> np.ndarray:
    """rope_freqs as convert_hf_to_gguf's LlamaModel.generate_extra_tensors computes it (it reads
    the pretraining length outside rope_scaling, 8192 where absent: Llama 3.1's own)."""
    freqs = 1.0 / (theta ** (torch.arange(0, head_dim, 2, dtype=torch.float32) / head_dim))
    factor, low, high = scaling["factor"], scaling["low_freq_factor"], scaling["high_freq_factor"]
    old_context = scaling["original_max_position_embeddings"]
    factors = []
    for freq in freqs.tolist():
        wavelen = 2 * math.pi / freq
        if wavelen < old_context / high:
            factors.append(1.0)
        elif wavelen > old_context / low:
            factors.append(factor)
        else:
            smooth = (old_context / wavelen - low) / (high - low)
            factors.append(1 / ((1 - smooth) / factor + smooth))
    return np.array(factors, dtype=np.float32)


def converter_permute(weight: np.ndarray, heads: int) -> np.ndarray:
    """convert_hf_to_gguf's LlamaModel.permute of q and k rows (rotate-half to interleaved)."""
    return (weight.reshape(heads, 2, weight.shape[0] // heads // 2, *weight.shape[1:])
            .swapaxes(1, 2).reshape(weight.shape))


def gguf_name(hf_name: str) -> str:
    if hf_name in GLOBAL_NAMES:
        return GLOBAL_NAMES[hf_name]
    _, _, layer, rest = hf_name.split(".", 3)
    module, _, suffix = rest.rpartition(".")
    return f"blk.{layer}.{LAYER_NAMES[module]}.{suffix}"


def write_gguf(path: Path, state: dict[str, torch.Tensor], rope_freqs: np.ndarray | None) -> Path:
    import gguf

    writer = gguf.GGUFWriter(str(path), "llama")
    for key, value in {"block_count": COMMON["num_hidden_layers"], "context_length": CONTEXT,
                       "embedding_length": COMMON["hidden_size"],
                       "feed_forward_length": COMMON["intermediate_size"], "attention.head_count": HEADS,
                       "attention.head_count_kv": KV_HEADS, "vocab_size": COMMON["vocab_size"]}.items():
        writer.add_uint32(f"llama.{key}", value)
    writer.add_float32("llama.attention.layer_norm_rms_epsilon", COMMON["rms_norm_eps"])
    writer.add_float32("llama.rope.freq_base", THETA)
    for name, tensor in state.items():
        array = tensor.numpy()
        if "q_proj" in name or "k_proj" in name:
            array = converter_permute(array, HEADS if "q_proj" in name else KV_HEADS)
        writer.add_tensor(gguf_name(name), np.ascontiguousarray(array))
    if rope_freqs is not None:
        writer.add_tensor("rope_freqs.weight", rope_freqs)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path


@pytest.fixture(scope="module")
def reference(tmp_path_factory):
    """transformers' Llama with llama3 RoPE scaling, random weights (norms too), fp32."""
    return make_tiny_model("llama3-rope", tmp_path_factory.mktemp("hf"), max_position_embeddings=CONTEXT,
                           rope_theta=THETA, rope_scaling=LLAMA3, tie_word_embeddings=False)


@pytest.fixture(scope="module")
def state(reference) -> dict[str, torch.Tensor]:
    return {name: t.detach().clone() for name, t in reference.state_dict().items()}


@pytest.fixture(scope="module")
def tokens(reference) -> tuple[list[int], torch.Tensor]:
    """200 positions and transformers' logits at each."""
    ids = torch.randint(0, COMMON["vocab_size"], (200,), generator=torch.Generator().manual_seed(1)).tolist()
    with torch.no_grad():
        return ids, reference(torch.tensor([ids])).logits[0]


def _our_logits(path: Path, ids: list[int]) -> torch.Tensor:
    model, _ = load_network(str(path), torch.float32)
    prefill, chunks, decode = len(ids) - 72, [[(0, 8)]] * 4, [[(0, 1)]] * 40
    return run_schedule(model, [ids], [[(0, prefill)]] + chunks + decode)[0]


def test_rope_freqs_give_transformers_llama3_logits(tmp_path, state, tokens):
    ids, expected = tokens
    path = write_gguf(tmp_path / "llama31.gguf", state, converter_rope_factors(LLAMA3, THETA, HEAD_DIM))
    assert (_our_logits(path, ids) - expected).abs().max().item() < 1e-5


def test_without_rope_freqs_the_logits_differ(tmp_path, state, tokens):
    """The control: the same weights with unscaled RoPE are not transformers' llama3 model."""
    ids, expected = tokens
    path = write_gguf(tmp_path / "plain.gguf", state, None)
    assert (_our_logits(path, ids) - expected).abs().max().item() > 1e-3  # 100x the match's bound


def test_the_served_context_is_the_gguf_context_length(tmp_path, state):
    """llama3's context_length is already the long one (131072), as vLLM serves it."""
    path = write_gguf(tmp_path / "llama31.gguf", state, converter_rope_factors(LLAMA3, THETA, HEAD_DIM))
    assert read_model_config(str(path)).max_context == CONTEXT


@pytest.mark.parametrize(("rope_freqs", "message"), [
    (np.ones(7, np.float32), "tensor rope_freqs.weight has shape (7,), not (8,): a factor per "
                             "pair of the 16 head dimensions"),
    (np.array([1] * 7 + [0], np.float32), "tensor rope_freqs.weight holds 0.0, not a positive factor"),
    (np.array([1] * 7 + [math.nan], np.float32), "tensor rope_freqs.weight holds nan, not a positive "
                                                 "factor"),
    (np.ones(8, np.float16), "tensor rope_freqs.weight has type F16, not F32"),  # ggml's rope takes F32
])
def test_a_bad_rope_freqs_is_a_one_line_error(tmp_path, state, rope_freqs, message):
    path = write_gguf(tmp_path / "bad.gguf", state, rope_freqs)
    with pytest.raises(ModelLoadError) as failed:
        read_model_config(str(path))
    assert str(failed.value) == f"{path}: {message}"
