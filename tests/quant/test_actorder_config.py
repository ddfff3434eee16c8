"""config.json says how GPTQ ordered the columns: compressed-tensors' actorder "static" when
`inferlab quantize` used act-order (as llm-compressor writes it for the same GPTQ: columns by
decreasing Hessian diagonal, groups and their scales unchanged, no g_idx), null otherwise."""

from __future__ import annotations

import json

import pytest
import torch

from inferlab.cli import main
from inferlab.models.loader import load_network
from inferlab.quant.linear import QuantLinear

from .tiny import calibration_text, tiny_model_dir

pytest.importorskip("transformers")
pytest.importorskip("compressed_tensors")
from compressed_tensors.quantization import ActivationOrdering, QuantizationConfig  # noqa: E402

CASES = [  # flags after the model, the actorder config.json should hold
    (["--scheme", "W4A16", "--group-size", "32", "--method", "gptq"], "static"),  # on by default
    (["--scheme", "W4A16", "--group-size", "32", "--method", "gptq", "--no-act-order"], None),
    (["--scheme", "W8A8", "--method", "smoothquant"], "static"),  # its GPTQ step, per channel
    (["--scheme", "W4A16", "--group-size", "32", "--method", "rtn"], None),
]


@pytest.fixture(scope="module")
def source(tmp_path_factory):
    directory = tiny_model_dir(tmp_path_factory.mktemp("tiny"))
    return directory, calibration_text(directory.parent / "calib.txt")


@pytest.mark.parametrize(("flags", "actorder"), CASES)
def test_written_actorder_says_how_gptq_ran(source, tmp_path, capsys, flags: list[str],
                                           actorder: str | None) -> None:
    directory, calib = source
    out = tmp_path / "out"
    calibration = [] if "rtn" in flags else ["--calib", str(calib), "--num-samples", "4", "--seq-len", "16"]
    code = main(["quantize", str(directory), *flags, *calibration, "--out", str(out), "--quiet"])
    assert code == 0, capsys.readouterr().err
    qc = json.loads((out / "config.json").read_text())["quantization_config"]
    assert qc["config_groups"]["group_0"]["weights"]["actorder"] == actorder
    theirs = QuantizationConfig.model_validate(qc).config_groups["group_0"].weights
    if actorder is None:
        assert theirs.actorder is None
    else:  # the library's enum: "static" is its alias of "weight", neither needs a g_idx
        assert ActivationOrdering(theirs.actorder) is ActivationOrdering.STATIC
        assert ActivationOrdering(theirs.actorder) == ActivationOrdering.WEIGHT
    net, _ = load_network(str(out), torch.float32)
    layer = net.model.layers[0]
    assert all(isinstance(m, QuantLinear) for m in (layer.self_attn.qkv_proj, layer.mlp.down_proj))
