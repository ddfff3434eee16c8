"""A checkpoint whose config contradicts its tensors fails in one line naming the tensor."""

from __future__ import annotations

import json
import re

import pytest
import torch
from safetensors.torch import load_file, save_file

from inferlab.errors import InferlabError
from inferlab.models.cli import model_info
from inferlab.models.loader import load_network
from inferlab.quant.linear import QuantLinear

from .tiny import library_compressed, prefill_logits, write_tokenizer

pytest.importorskip("compressed_tensors")
from compressed_tensors.quantization import QuantizationArgs, QuantizationScheme  # noqa: E402

W4_ASYM = {"g": QuantizationScheme(targets=["Linear"], weights=QuantizationArgs(
    num_bits=4, strategy="group", group_size=32, symmetric=False))}


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory):
    return library_compressed(tmp_path_factory.mktemp("w4"), W4_ASYM)


def _variant(checkpoint, tmp_path, edit_config=None, edit_tensors=None):
    config = json.loads((checkpoint / "config.json").read_text())
    tensors = load_file(checkpoint / "model.safetensors")
    if edit_config:
        edit_config(config["quantization_config"])
    if edit_tensors:
        edit_tensors(tensors)
    (tmp_path / "config.json").write_text(json.dumps(config))
    save_file(tensors, tmp_path / "model.safetensors")
    return str(tmp_path)


def _load_error(path: str) -> str:
    with pytest.raises(InferlabError) as info:
        load_network(path, torch.float32)
    message = str(info.value)
    assert "\n" not in message
    return message


def test_the_untouched_checkpoint_loads_quantized(checkpoint) -> None:
    net, _ = load_network(str(checkpoint), torch.float32)
    assert isinstance(net.model.layers[0].self_attn.qkv_proj, QuantLinear)
    assert isinstance(net.model.layers[1].mlp.gate_up_proj, QuantLinear)
    assert isinstance(net.lm_head, torch.nn.Linear)  # ignored


def _group_0(qc: dict) -> dict:
    return qc["config_groups"]["group_0"]


@pytest.mark.parametrize(("edit", "message"), [
    (lambda qc: _group_0(qc)["weights"].update(num_bits="4bit"),
     "config_groups.group_0.weights.num_bits: '4bit' is not of the type it takes"),
    (lambda qc: _group_0(qc)["weights"].update(group_size="64"), "weights.group_size: '64'"),
    (lambda qc: _group_0(qc)["weights"].update(symmetric="no"), "weights.symmetric: 'no'"),
    (lambda qc: _group_0(qc).update(input_activations="x"), "input_activations must be an object"),
    (lambda qc: qc.update(sparsity_config="x"), "sparsity_config must be an object"),
    (lambda qc: qc.update(ignore=[5]), "ignore must be a list of names, got [5]"),
    (lambda qc: qc.update(ignore="lm_head"), "ignore must be a list of names"),  # not its letters
    (lambda qc: _group_0(qc).update(format="sparse-bitmask"), "format 'sparse-bitmask' is not supported"),
    # int codes declared fp8: loaded as ints, shown by `info` as fp8 (found by a tester)
    (lambda qc: _group_0(qc)["weights"].update(type="float", num_bits=8, strategy="channel", group_size=None,
                                                   symmetric=True),
     "config_groups.group_0: format 'pack-quantized' holds int weights, not 'float' ones"),
])
def test_config_fields_of_the_wrong_type_are_one_line_errors(checkpoint, tmp_path, edit, message) -> None:
    """Once tracebacks (int("4bit"), "x".get, 5.startswith) from loading and from `info`."""
    assert message in _load_error(_variant(checkpoint, tmp_path, edit_config=edit))


def test_a_quantization_config_that_is_not_an_object_is_one_line(checkpoint, tmp_path) -> None:
    path = _variant(checkpoint, tmp_path)
    config = json.loads((tmp_path / "config.json").read_text())
    (tmp_path / "config.json").write_text(json.dumps({**config, "quantization_config": "foo"}))
    assert "quantization_config must be an object, got str" in _load_error(path)


def test_missing_scale(checkpoint, tmp_path) -> None:
    """Named by the checkpoint's directory, as a dense one's missing tensors are (the errors
    once began "checkpoint:", whichever was loaded)."""
    path = _variant(checkpoint, tmp_path, edit_tensors=lambda t: t.pop(
        "model.layers.0.self_attn.k_proj.weight_scale"))
    assert _load_error(path) == (f"{path}: the config quantizes model.layers.0.self_attn.k_proj "
                                 "but model.layers.0.self_attn.k_proj.weight_scale is missing")


def test_bits_contradict_packed_shape(checkpoint, tmp_path) -> None:
    def eight_bits(qc):
        qc["config_groups"]["group_0"]["weights"]["num_bits"] = 8
    message = _load_error(_variant(checkpoint, tmp_path, edit_config=eight_bits))
    assert "weight_packed has shape" in message and "8-bit" in message


@pytest.mark.parametrize("argv", [["eval", "{ck}", "--dataset", "{text}", "--seq-len", "16"],
                                  ["generate", "Hi", "{ck}", "--max-tokens", "1"]])
def test_a_group_size_that_does_not_divide_names_the_config(checkpoint, tmp_path, capsys,
                                                            argv: list[str]) -> None:
    """The checkpoint contradicts itself: its config.json is at fault, not a flag (the error
    once said "try --group-size 64", which only `quantize` takes, and named no file)."""
    from inferlab.cli import main

    def group_48(qc):
        _group_0(qc)["weights"]["group_size"] = 48
    (tmp_path / "ck").mkdir()
    path = _variant(checkpoint, tmp_path / "ck", edit_config=group_48)
    text = tmp_path / "text.txt"
    text.write_text("a few words of text to score " * 4)
    assert main([a.format(ck=path, text=text) for a in argv]) == 2
    assert capsys.readouterr().err == (f"error: {path}/config.json: model.layers.0.self_attn.q_proj: "
                                       "group size 48 does not divide its 64 inputs\n")


def test_group_size_contradicts_scales(checkpoint, tmp_path) -> None:
    def group_16(qc):
        qc["config_groups"]["group_0"]["weights"]["group_size"] = 16
    assert "weight_scale has shape" in _load_error(_variant(checkpoint, tmp_path, edit_config=group_16))


def test_quantized_tensors_for_an_ignored_layer(checkpoint, tmp_path) -> None:
    def ignore_o(qc):
        qc["ignore"] = ["lm_head", "re:.*o_proj"]
    message = _load_error(_variant(checkpoint, tmp_path, edit_config=ignore_o))
    assert "o_proj has quantized tensors but the config leaves it unquantized" in message


def test_fused_shards_must_share_a_scheme(checkpoint, tmp_path) -> None:
    def dense_v(tensors):  # v_proj stored dense, and ignored by the config
        codes_name = "model.layers.0.self_attn.v_proj"
        for suffix in ("weight_packed", "weight_scale", "weight_shape", "weight_zero_point"):
            tensors.pop(f"{codes_name}.{suffix}")
        tensors[f"{codes_name}.weight"] = torch.zeros(32, 64)

    def ignore_v(qc):
        qc["ignore"] = ["lm_head", "model.layers.0.self_attn.v_proj"]
    message = _load_error(_variant(checkpoint, tmp_path, ignore_v, dense_v))
    assert "shards of model.layers.0.self_attn.qkv_proj" in message


def test_unsupported_config_parts(checkpoint, tmp_path) -> None:
    def kv_cache(qc):
        qc["kv_cache_scheme"] = {"num_bits": 8, "type": "float", "strategy": "tensor"}
    path = _variant(checkpoint, tmp_path, kv_cache)
    message = _load_error(path)
    assert message == f"{path}/config.json: kv_cache_scheme is not supported"
    # `inferlab info` checks the config as loading does, and names the file alike (it once
    # said "quantization_config: ...", no file)
    with pytest.raises(InferlabError) as info:
        model_info(path, "bfloat16")
    assert str(info.value) == message


def _with_g_idx(order, actorder="group"):
    """Edits declaring GPTQ act-order and storing a g_idx per quantized layer, as GPTQ writes
    it: `order(contiguous)` -> the group of each input column."""
    def edit_config(qc):
        qc["config_groups"]["group_0"]["weights"]["actorder"] = actorder

    def edit_tensors(tensors):
        for name in [n for n in tensors if n.endswith(".weight_packed")]:
            k = int(tensors[name.replace("weight_packed", "weight_shape")][1])
            contiguous = torch.arange(k, dtype=torch.int32) // 32
            tensors[name.replace("weight_packed", "weight_g_idx")] = order(contiguous)
    return edit_config, edit_tensors


def _logits(path: str) -> list[torch.Tensor]:
    net, _ = load_network(path, torch.float32)
    return prefill_logits(net, [[3, 17, 42, 99, 5, 150, 8]])


def test_permuted_g_idx_is_refused(checkpoint, tmp_path) -> None:
    """Group act-order: the columns of each group scattered over the input (here each group's
    columns interleaved with the others'), which our contiguous-group kernels cannot compute."""
    def interleave(contiguous):
        return contiguous.view(-1, 32).t().reshape(-1)  # a permutation of the same group ids
    path = _variant(checkpoint, tmp_path, *_with_g_idx(interleave))
    message = _load_error(path)
    assert message.startswith(f"{path}: model.layers.0.self_attn.q_proj.weight_g_idx ")
    assert "group act-order" in message and "not supported" in message


@pytest.mark.parametrize(("actorder", "store_g_idx"), [("group", True), ("weight", False)])
def test_contiguous_act_order_loads_unchanged(checkpoint, tmp_path, actorder: str,
                                              store_g_idx: bool) -> None:
    """An identity g_idx keeps every group contiguous, and "weight" act-order stores none: both
    compute exactly what the checkpoint without act-order computes."""
    edit_config, edit_tensors = _with_g_idx(lambda contiguous: contiguous, actorder)
    path = _variant(checkpoint, tmp_path, edit_config, edit_tensors if store_g_idx else None)
    for got, want in zip(_logits(path), _logits(str(checkpoint)), strict=True):
        assert torch.equal(got, want)


def test_group_act_order_without_g_idx(checkpoint, tmp_path) -> None:
    edit_config, _ = _with_g_idx(lambda contiguous: contiguous)
    message = _load_error(_variant(checkpoint, tmp_path, edit_config))
    assert "with group act-order but model.layers.0.self_attn.q_proj.weight_g_idx is missing" in message


def test_unknown_act_order(checkpoint, tmp_path) -> None:
    edit_config, _ = _with_g_idx(lambda contiguous: contiguous, "sideways")
    assert "actorder 'sideways' is not supported" in _load_error(_variant(checkpoint, tmp_path, edit_config))


@pytest.fixture(scope="module")
def fp8_static(tmp_path_factory):
    return library_compressed(tmp_path_factory.mktemp("fp8"), {"FP8": ["Linear"]})


def _set(name: str, value: torch.Tensor):
    def edit(tensors):
        tensors[name] = value
    return edit


def _drop(name: str):
    def edit(tensors):
        del tensors[name]
    return edit


Q = "model.layers.0.self_attn.q_proj"


@pytest.mark.parametrize(("edit", "message"), [
    (_drop(f"{Q}.input_scale"), f"{Q}.input_scale is missing"),
    (_set(f"{Q}.input_scale", torch.tensor([-0.5])), f"{Q}.input_scale is -0.5"),
    (_set(f"{Q}.input_scale", torch.tensor([float("nan")])), "must be positive and finite"),
    (_set(f"{Q}.input_scale", torch.ones(2)), "a static per-tensor scale is one floating-point value"),
    (_set(f"{Q}.input_zero_point", torch.tensor([3], dtype=torch.int8)), "asymmetric activations"),
])
def test_bad_static_input_scales(fp8_static, tmp_path, edit, message: str) -> None:
    assert message in _load_error(_variant(fp8_static, tmp_path, edit_tensors=edit))


def test_fused_shards_take_the_largest_input_scale(fp8_static, tmp_path) -> None:
    """q, k and v read the same input: the fused layer quantizes it with the largest of their
    static scales (vLLM's rule), whichever shard holds it."""
    tensors = load_file(fp8_static / "model.safetensors")
    k_scale = tensors["model.layers.0.self_attn.k_proj.input_scale"]
    path = _variant(fp8_static, tmp_path, edit_tensors=_set(
        "model.layers.0.self_attn.k_proj.input_scale", k_scale * 3))
    net, _ = load_network(path, torch.float32)
    assert net.model.layers[0].self_attn.qkv_proj.input_scale.item() == pytest.approx(
        3 * k_scale.item(), rel=1e-6)
    assert net.model.layers[0].mlp.gate_up_proj.input_scale.item() == pytest.approx(
        tensors["model.layers.0.mlp.up_proj.input_scale"].item(), rel=1e-6)


def test_activation_strategies_we_cannot_run_are_refused(fp8_static, tmp_path) -> None:
    def per_group(qc):
        qc["config_groups"]["group_0"]["input_activations"].update(strategy="group", group_size=32,
                                                                   dynamic=True)
    message = _load_error(_variant(fp8_static, tmp_path, per_group))
    assert "need weights in groups or blocks as wide" in message


def test_info_describes_the_quantization(checkpoint, fp8_static, capsys) -> None:
    from inferlab.cli import main

    for directory in (checkpoint, fp8_static):
        write_tokenizer(directory)  # info reads the chat template
    assert main(["info", str(checkpoint), "--json"]) == 0
    info = json.loads(capsys.readouterr().out)
    assert info["quantization"] == ["int4 weights in groups of 32, asymmetric (Linear; ignores lm_head)"]
    # the linears as loaded, codes, scales and zero points, the rest in bf16 (it was all bf16)
    net, _ = load_network(str(checkpoint), torch.bfloat16)
    held = {id(t): t.numel() * t.element_size() for m in net.modules() if m is not net.model.rotary
            for t in [*m.parameters(recurse=False), *m.buffers(recurse=False)]}
    assert info["weight_bytes"] == sum(held.values())
    assert main(["info", str(fp8_static)]) == 0
    out = capsys.readouterr().out
    assert re.search(r"\nquantization +float8 weights per tensor, float8 activations with one "
                     r"static scale \(Linear; ignores lm_head\)\n", out)


@pytest.fixture(scope="module")
def fp8_block(tmp_path_factory):
    preset = QuantizationScheme(targets=["Linear"], weights=QuantizationArgs(
        num_bits=8, type="float", strategy="block", block_structure=[32, 32]),
        input_activations=QuantizationArgs(num_bits=8, type="float", strategy="group",
                                           group_size=32, dynamic=True))
    return library_compressed(tmp_path_factory.mktemp("fp8b"), {"g": preset})


def test_block_scales_that_contradict_the_config(fp8_block, tmp_path) -> None:
    name = "model.layers.0.mlp.down_proj.weight_scale"  # [64, 96]: blocks [2, 3]
    message = _load_error(_variant(fp8_block, tmp_path, edit_tensors=_set(name, torch.ones(3, 3))))
    assert f"{name} has shape (3, 3), the config (block 32x32) implies [2, 3]" in message

    def rows_48(qc):
        next(iter(qc["config_groups"].values()))["weights"]["block_structure"] = [48, 32]
    path = _variant(fp8_block, tmp_path, rows_48)
    assert _load_error(path).startswith(f"{path}/config.json: model.layers.0.self_attn.q_proj: "
                                        "blocks of 48 rows do not divide its")
