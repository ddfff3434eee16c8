"""Which compressed-tensors config group takes a layer: as the library's match_targets and
vLLM's find_matched_target rank them (the exact name, then a regex, then the class), not the
config's order."""

from __future__ import annotations

import pytest

from inferlab.quant.ct_config import parse_quantization_config

W8A16 = {"weights": {"num_bits": 8, "type": "int", "symmetric": True, "strategy": "channel"}}
W4A16 = {"weights": {"num_bits": 4, "type": "int", "symmetric": True, "strategy": "group",
                     "group_size": 32}}


def _config(*groups: tuple[str, dict, list[str]], ignore: list[str] = ()) -> dict:
    return {"quant_method": "compressed-tensors", "format": "mixed-precision", "ignore": list(ignore),
            "config_groups": {name: {**scheme, "targets": targets} for name, scheme, targets in groups}}


@pytest.mark.parametrize(("layer", "group"), [
    ("model.layers.0.mlp.gate_proj", "mlp"),  # a regex beats 'Linear' listed before it
    ("model.layers.0.self_attn.q_proj", "all"),
    ("model.layers.3.self_attn.o_proj", "o3"),  # the exact name beats both
    ("lm_head", None),
])
def test_name_then_regex_then_class(layer: str, group: str | None) -> None:
    parsed = parse_quantization_config(_config(
        ("all", W8A16, ["Linear"]), ("mlp", W4A16, ["re:.*mlp.*"]),
        ("o3", W4A16, ["re:.*mlp.*", "model.layers.3.self_attn.o_proj"]), ignore=["lm_head"]))
    chosen = parsed.group_for(layer)
    assert (chosen.name if chosen else None) == group


def test_equal_matches_go_to_the_first_group() -> None:
    parsed = parse_quantization_config(_config(("a", W8A16, ["re:.*proj"]), ("b", W4A16, ["re:.*mlp.*"])))
    assert parsed.group_for("model.layers.0.mlp.up_proj").name == "a"


def test_info_counts_each_layer_in_the_group_that_takes_it() -> None:
    """`inferlab info` on a checkpoint whose MLPs are int4 by regex under an int8 'Linear'
    default: bytes by hand for the embedded model's shapes (30 layers; q/o 576x576, k/v
    192x576, gate/up 1536x576, down 576x1536)."""
    from inferlab.models.cli import _weight_bytes
    from inferlab.models.loader import read_model_config
    from inferlab.models.model_path import resolve_model_path

    cfg = read_model_config(resolve_model_path(None))
    parsed = parse_quantization_config(_config(("all", W8A16, ["Linear"]), ("mlp", W4A16, ["re:.*mlp.*"]),
                                               ignore=["lm_head"]))
    attn = 576 * 576 * 2 + 192 * 576 * 2  # q, o, k, v
    mlp = 1536 * 576 * 3
    int8 = 30 * (attn + (576 + 576 + 192 + 192) * 2)  # codes + a bf16 scale per output row
    int4 = 30 * (mlp // 2 + (1536 * 576 // 32 * 2 + 576 * 1536 // 32) * 2)  # codes + group scales
    dense = (cfg.num_parameters() - 30 * (attn + mlp)) * 2
    assert _weight_bytes(cfg, "bfloat16", parsed) == int8 + int4 + dense


def test_a_library_mixed_checkpoint_loads_each_layer_in_its_groups_format(tmp_path) -> None:
    """llm-compressor's per-layer schemes, written by compressed-tensors: int8 for every Linear
    (listed first) and int4 for the MLPs by regex. Each layer we load holds the weight the
    library's own decompressor gives it (before: the MLPs were read as int8 and refused)."""
    pytest.importorskip("compressed_tensors")
    import torch
    from compressed_tensors.compressors import BaseCompressor
    from compressed_tensors.quantization import QuantizationArgs, QuantizationScheme
    from safetensors.torch import load_file

    from inferlab.models.loader import load_network
    from inferlab.quant.linear import Avx2QuantLinear, Int4WeightOnlyLinear, Int8WeightOnlyLinear

    from .tiny import library_compressed

    groups = {"all": QuantizationScheme(targets=["Linear"], weights=QuantizationArgs(num_bits=8, strategy="channel")),
              "mlp": QuantizationScheme(targets=["re:.*mlp.*"], weights=QuantizationArgs(
                  num_bits=4, strategy="group", group_size=32))}
    directory = library_compressed(tmp_path, groups)
    tensors = load_file(str(directory / "model.safetensors"))
    net, _ = load_network(str(directory), torch.float32)
    parts = {"qkv_proj": ("q_proj", "k_proj", "v_proj"), "gate_up_proj": ("gate_proj", "up_proj")}

    def library_weight(name: str) -> torch.Tensor:
        mlp = ".mlp." in name
        stored = {k[len(name) + 1:]: v for k, v in tensors.items() if k.startswith(name + ".")}
        # the library packs both widths into int32 words (pack-quantized)
        compressor = BaseCompressor.get_value_from_registry("pack-quantized")
        return compressor.decompress(stored, groups["mlp" if mlp else "all"])["weight"]

    checked = 0
    for name, module in net.named_modules():  # our q/k/v and gate/up are fused
        if isinstance(module, Int8WeightOnlyLinear):
            held, bits = module.qweight.float() * module.scale.float()[:, None], 8
        elif isinstance(module, (Int4WeightOnlyLinear, Avx2QuantLinear)):  # fp32 on AVX2: the latter
            held = module.dequantized_weight().float()
            bits = getattr(module, "bits", 4)
        else:
            continue
        assert (bits == 4) == (".mlp." in name), name
        prefix, _, leaf = name.rpartition(".")
        want = torch.cat([library_weight(f"{prefix}.{p}") for p in parts.get(leaf, (leaf,))])
        torch.testing.assert_close(held, want.float(), rtol=1e-6, atol=0, msg=name)
        checked += 1
    assert checked == 4 * len(net.model.layers)
