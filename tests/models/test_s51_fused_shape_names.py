"""A misshapen q/k/v or gate/up tensor is named as the checkpoint holds it, with its own shape
and the one transformers' model has for it: the error once named the fused qkv_proj or
gate_up_proj, which no checkpoint holds, at the fused shape ("qkv_proj.weight has shape
(96, 64), the config implies (128, 64)" for a q_proj of 32 rows)."""

from __future__ import annotations

import pytest
import torch
from safetensors.torch import load_file, save_file

from inferlab.errors import ModelLoadError
from inferlab.models.loader import load_network

from .tiny_models import make_tiny_model

CASES = [  # (architecture, tensor, the shape written in its place)
    ("llama", "model.layers.0.self_attn.q_proj.weight", (32, 64)),
    ("llama", "model.layers.1.self_attn.k_proj.weight", (32, 48)),
    ("llama", "model.layers.0.self_attn.v_proj.weight", (32,)),  # a rank short: was "disagree"
    ("llama", "model.layers.0.mlp.up_proj.weight", (64, 64)),
    ("llama", "model.layers.1.mlp.gate_proj.weight", (96, 32)),
    ("qwen2", "model.layers.0.self_attn.k_proj.bias", (64,)),
]


@pytest.mark.parametrize(("arch", "name", "bad_shape"), CASES)
def test_the_checkpoints_own_tensor_is_named(tmp_path, arch: str, name: str, bad_shape) -> None:
    reference = make_tiny_model(arch, tmp_path)  # transformers' model: the shapes it expects
    tensors = load_file(tmp_path / "model.safetensors")
    tensors[name] = torch.zeros(bad_shape)
    save_file(tensors, tmp_path / "model.safetensors", metadata={"format": "pt"})
    with pytest.raises(ModelLoadError) as failed:
        load_network(str(tmp_path))
    expected = tuple(reference.state_dict()[name].shape)
    assert str(failed.value) == f"{tmp_path}: {name} has shape {bad_shape}, the config implies {expected}"
