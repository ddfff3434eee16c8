"""Loading fuses q/k/v and gate/up as soon as a layer's parts are all there and drops the parts:
held to the end beside the fused copies, every layer's parts were the load's peak memory."""

from __future__ import annotations

import gc
import weakref

from safetensors.torch import load_file

from inferlab.models.llama import fused_tensors
from inferlab.models.loader import read_model_config

from .tiny_models import make_tiny_model

PARTS = ("q_proj", "k_proj", "v_proj", "gate_proj", "up_proj")


def test_a_layer_s_parts_are_dropped_once_it_is_fused(tmp_path):
    make_tiny_model("llama", tmp_path)
    cfg = read_model_config(str(tmp_path))
    tensors = load_file(tmp_path / "model.safetensors")
    first_layer = sorted(n for n in tensors if n.startswith("model.layers.0.") and any(p in n for p in PARTS))
    assert len(first_layer) == 5
    alive: dict[str, weakref.ref] = {}
    seen_at_end: list[str] = []

    def stream():
        for name in sorted(tensors, key=lambda n: (int(n.split(".")[2]) if ".layers." in n else -1, n)):
            tensor = tensors[name].clone()  # the loader's own copy, as a GGUF's dequantized one
            alive[name] = weakref.ref(tensor)
            yield name, tensor
        gc.collect()
        seen_at_end.extend(n for n in first_layer if alive[n]() is not None)

    state = dict(fused_tensors(stream(), cfg, "tiny"))
    assert seen_at_end == []  # layer 0's parts went while later layers were still being read
    assert state["model.layers.0.self_attn.qkv_proj.weight"].shape[0] == sum(
        tensors[f"model.layers.0.self_attn.{p}.weight"].shape[0] for p in PARTS[:3])


def test_each_layer_is_prepared_before_the_next_is_read(tmp_path):
    """load_weights hands a decoder layer to prepare_layer as soon as its weights are in (the
    engine narrows its linears there), while the later layers are still on the meta device."""
    import torch

    from inferlab.models.llama import LlamaForCausalLM

    make_tiny_model("llama", tmp_path)
    cfg = read_model_config(str(tmp_path))
    tensors = load_file(tmp_path / "model.safetensors")
    with torch.device("meta"):
        net = LlamaForCausalLM(cfg)
    prepared: list[tuple[int, list[bool]]] = []

    def prepare(layer):
        index = next(i for i, candidate in enumerate(net.model.layers) if candidate is layer)
        prepared.append((index, [other.mlp.down_proj.weight.is_meta for other in net.model.layers]))

    order = sorted(tensors, key=lambda n: (int(n.split(".")[2]) if ".layers." in n else -1, n))
    net.load_weights(((name, tensors[name]) for name in order), "tiny", prepare)
    layers = cfg.num_layers
    assert [index for index, _ in prepared] == list(range(layers))
    for index, meta in prepared:  # this layer and those before it loaded, the rest not yet
        assert meta == [i > index for i in range(layers)]
    assert not any(p.is_meta for p in net.parameters())
