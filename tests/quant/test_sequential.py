"""Layer-by-layer calibration: each layer's statistics come from what the already compressed
layers before it output (GPTQ's sequential rule), not from the original model's activations."""

from __future__ import annotations

import copy

import torch

from inferlab.models.config import ModelConfig
from inferlab.quant.recipe import Recipe
from inferlab.quant.scheme import make_scheme
from inferlab.quant.sequential import compress_model

from .tiny import prefill_logits


def _stream_into_layer_1(net, tokens: torch.Tensor) -> torch.Tensor:
    """The residual stream entering decoder layer 1 [S*T, hidden], from a plain prefill of the
    windows (layer 1 gets it as x + residual, the add fused into its first norm)."""
    seen = []
    hook = net.model.layers[1].register_forward_pre_hook(
        lambda _m, args: seen.append(args[1] + args[2]))
    try:
        prefill_logits(net, tokens.tolist())
    finally:
        hook.remove()
    return seen[0]


def test_each_layer_calibrates_on_the_compressed_layers_before_it() -> None:
    from inferlab.models.llama import LlamaForCausalLM

    torch.manual_seed(0)
    cfg = ModelConfig(architecture="LlamaForCausalLM", vocab_size=64, hidden_size=64,
                      intermediate_size=128, num_layers=2, num_heads=4, num_kv_heads=2,
                      head_dim=16, max_position_embeddings=64)
    net = LlamaForCausalLM(cfg).eval()
    original = copy.deepcopy(net)
    tokens = torch.randint(0, 64, (3, 16), generator=torch.Generator().manual_seed(1))
    calibrated_on = []  # layer 1's hidden input in its statistics pass (residual None there)
    hook = net.model.layers[1].register_forward_pre_hook(
        lambda _m, args: calibrated_on.append(args[1].clone()) if not calibrated_on else None)
    try:
        compress_model(net, tokens, Recipe(make_scheme("W4A16", 16), "gptq"), progress=False)
    finally:
        hook.remove()
    compressed_stream = _stream_into_layer_1(net, tokens)  # net now holds the compressed weights
    original_stream = _stream_into_layer_1(original, tokens)
    assert torch.allclose(calibrated_on[0], compressed_stream, atol=1e-5)
    # and that is not what the original layer 0 outputs (else the test could not tell them apart)
    assert (calibrated_on[0] - original_stream).abs().max() > 100 * 1e-5
