"""`inferlab info` on a non-uniform compressed-tensors checkpoint (one scheme per config group),
which the loader and vLLM take scheme by scheme: info once refused it ("choose one with
--weight-format", a flag info does not have)."""

from __future__ import annotations

import json

import pytest
import torch

from inferlab.cli import main
from inferlab.models.loader import load_network

from .tiny import library_compressed, write_tokenizer

pytest.importorskip("compressed_tensors")
from compressed_tensors.quantization import QuantizationArgs, QuantizationScheme  # noqa: E402

MIXED = {
    "attn": QuantizationScheme(targets=["re:.*self_attn.*"], weights=QuantizationArgs(
        num_bits=8, strategy="channel")),
    "mlp": QuantizationScheme(targets=["re:.*mlp.*"], weights=QuantizationArgs(
        num_bits=4, strategy="group", group_size=32, symmetric=False)),
}


@pytest.fixture(scope="module")
def mixed(tmp_path_factory):
    directory = library_compressed(tmp_path_factory.mktemp("mixed"), MIXED)
    write_tokenizer(directory)  # info reads the chat template
    return directory


def test_info_counts_each_group_in_its_own_format(mixed, capsys) -> None:
    assert main(["info", str(mixed), "--json"]) == 0
    info = json.loads(capsys.readouterr().out)
    assert info["quantization"] == [
        "int8 weights per channel (re:.*self_attn.*; ignores lm_head)",
        "int4 weights in groups of 32, asymmetric (re:.*mlp.*; ignores lm_head)"]
    assert info["linears_as_stored"] is True
    # the reference: the tensors the loader holds, codes, scales and zero points, rest in bf16
    net, _ = load_network(str(mixed), torch.bfloat16)
    held = {id(t): t.numel() * t.element_size() for m in net.modules() if m is not net.model.rotary
            for t in [*m.parameters(recurse=False), *m.buffers(recurse=False)]}
    assert info["weight_bytes"] == sum(held.values())


def test_info_text_lists_one_line_per_group(mixed, capsys) -> None:
    assert main(["info", str(mixed)]) == 0
    out = capsys.readouterr().out
    assert [line.split(None, 1)[1] for line in out.splitlines() if line.startswith("quantization ")] == [
        "int8 weights per channel (re:.*self_attn.*; ignores lm_head)",
        "int4 weights in groups of 32, asymmetric (re:.*mlp.*; ignores lm_head)"]
