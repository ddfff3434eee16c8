"""`inferlab quantize` end to end on a tiny model: every method writes a checkpoint that loads."""

from __future__ import annotations

import json
import random

import pytest
import torch

from inferlab.cli import main
from inferlab.models.loader import load_network
from inferlab.quant.algorithms.awq import AwqConfig
from inferlab.quant.algorithms.sparsity import is_2of4
from inferlab.quant.linear import QuantLinear
from inferlab.quant.recipe import Recipe
from inferlab.quant.run import quantize_to_directory
from inferlab.quant.scheme import make_scheme

from .tiny import calibration_text, prefill_logits, tiny_model_dir

pytest.importorskip("transformers")

RUNS = {  # name -> (scheme, group, asymmetric, method, max relative logit error)
    "w8a16-rtn": ("W8A16", 128, False, "rtn", 0.03),
    "w4a16-gptq": ("W4A16", 32, False, "gptq", 0.3),
    "w4a16-asym-awq": ("W4A16", 32, True, "awq", 0.3),
    "w8a8-smoothquant": ("W8A8", 128, False, "smoothquant", 0.05),
    "fp8-rtn": ("FP8_DYNAMIC", 128, False, "rtn", 0.1),
    "sparsegpt": (None, 128, False, "sparsegpt", None),
    "magnitude": (None, 128, False, "magnitude", None),
    "w4a16-sparsegpt": ("W4A16", 32, False, "sparsegpt", None),
}
SEQS = [[random.Random(i).randrange(160) for _ in range(n)] for i, n in enumerate((12, 5))]


@pytest.fixture(scope="module")
def source(tmp_path_factory):
    directory = tiny_model_dir(tmp_path_factory.mktemp("tiny"))
    calib = calibration_text(directory.parent / "calib.txt")
    net, _ = load_network(str(directory), torch.float32)
    return directory, calib, prefill_logits(net, SEQS)


def _quantize(source, out, scheme, group, asym, method, **extra):
    directory, calib, _ = source
    recipe = Recipe(make_scheme(scheme, group, asym) if scheme else None, method,
                    awq=AwqConfig(grid=8, clip=True, clip_grid=8, sample_rows=64), **extra)
    return quantize_to_directory(str(directory), recipe, str(out), str(calib), num_samples=6,
                                 seq_len=24, batch_size=4, seed=0, dense_dtype="auto",
                                 progress=False)


@pytest.mark.parametrize("run", sorted(RUNS))
def test_every_method_writes_a_checkpoint_that_loads(source, tmp_path, run: str) -> None:
    scheme, group, asym, method, tol = RUNS[run]
    summary = _quantize(source, tmp_path / "out", scheme, group, asym, method)
    net, _ = load_network(str(tmp_path / "out"), torch.float32)
    qc = json.loads((tmp_path / "out" / "config.json").read_text())["quantization_config"]
    linears = [m for layer in net.model.layers for m in (
        layer.self_attn.qkv_proj, layer.self_attn.o_proj, layer.mlp.gate_up_proj, layer.mlp.down_proj)]
    if scheme is not None:
        assert all(isinstance(m, QuantLinear) for m in linears)
        assert summary["linear_weight_bytes"] < summary["linear_weight_bytes_bf16"]
    if method in ("sparsegpt", "magnitude"):
        assert qc["sparsity_config"]["sparsity_structure"] == "2:4"
        assert qc["sparsity_config"]["global_sparsity"] >= 0.5
        for m in linears:
            if isinstance(m, QuantLinear):  # a kept weight may also round to zero
                nonzero = m.dequantized_weight() != 0
                assert (nonzero.view(nonzero.shape[0], -1, 4).sum(-1) <= 2).all()
            else:
                assert is_2of4(m.weight.data != 0)
        return
    got = prefill_logits(net, SEQS)
    for g, want in zip(got, source[2], strict=True):
        assert ((g - want).norm() / want.norm()).item() < tol


def test_our_checkpoint_reads_the_same_in_transformers(source, tmp_path) -> None:
    from transformers import AutoModelForCausalLM, CompressedTensorsConfig

    _quantize(source, tmp_path / "out", "W4A16", 32, True, "rtn")
    theirs = AutoModelForCausalLM.from_pretrained(
        tmp_path / "out", dtype=torch.float32, quantization_config=CompressedTensorsConfig(dequantize=True))
    net, _ = load_network(str(tmp_path / "out"), torch.float32)
    with torch.no_grad():
        expected = [theirs(torch.tensor([s])).logits[0] for s in SEQS]
    for got, want in zip(prefill_logits(net, SEQS), expected, strict=True):
        assert (got - want).abs().max().item() < 1e-4


def test_biases_and_tied_embeddings_survive(tmp_path) -> None:
    from transformers import AutoModelForCausalLM, CompressedTensorsConfig

    directory = tiny_model_dir(tmp_path / "qwen2", arch="qwen2")
    recipe = Recipe(make_scheme("W8A16"), "rtn")
    quantize_to_directory(str(directory), recipe, str(tmp_path / "out"), "", 1, 8, 1, 0, "auto", False)
    theirs = AutoModelForCausalLM.from_pretrained(
        tmp_path / "out", dtype=torch.float32, quantization_config=CompressedTensorsConfig(dequantize=True))
    net, _ = load_network(str(tmp_path / "out"), torch.float32)
    assert net.model.layers[0].self_attn.qkv_proj.bias is not None
    with torch.no_grad():
        expected = [theirs(torch.tensor([s])).logits[0] for s in SEQS]
    for got, want in zip(prefill_logits(net, SEQS), expected, strict=True):
        assert (got - want).abs().max().item() < 1e-4


@pytest.mark.parametrize(("flags", "message"), [
    (["--scheme", "W3A16"], "unknown scheme 'W3A16'"),
    (["--scheme", "W4A16", "--method", "hqq"], "unknown method 'hqq'"),
    (["--scheme", "W4A16", "--group-size", "48"], "group size 48 does not divide its 64 inputs"),
    (["--scheme", "W4A16", "--method", "gptq", "--calib", "/no/such.txt"], "no such file"),
    (["--scheme", "W4A16", "--method", "smoothquant"], "smoothquant migrates activation outliers"),
    (["--scheme", "W8A8", "--sparsity", "1:2"], "unknown sparsity '1:2'"),
    (["--method", "gptq"], "nothing to do"),
])
def test_bad_input_is_one_line(source, tmp_path, capsys, flags: list[str], message: str) -> None:
    code = main(["quantize", str(source[0]), "--out", str(tmp_path / "out"), "--quiet", *flags])
    err = capsys.readouterr().err
    assert code == 2 and message in err
    assert err.count("\n") == 1 and err.startswith("error: ")
    assert not (tmp_path / "out").exists()


def test_cli_refuses_a_non_empty_output(source, tmp_path, capsys) -> None:
    (tmp_path / "out").mkdir()
    (tmp_path / "out" / "keep.txt").write_text("mine")
    assert main(["quantize", str(source[0]), "--scheme", "W8A16", "--out", str(tmp_path / "out")]) == 2
    assert "not empty" in capsys.readouterr().err
    assert (tmp_path / "out" / "keep.txt").read_text() == "mine"


@pytest.mark.parametrize("arch", ["llama", "llama-tied"])
def test_lm_head_quantized_when_not_ignored(tmp_path, arch: str) -> None:
    """A tied lm_head is quantized from the embedding matrix and written untied (the embedding
    stays dense), so the checkpoint still loads in transformers with the same logits."""
    from transformers import AutoModelForCausalLM, CompressedTensorsConfig

    directory = tiny_model_dir(tmp_path / arch, arch=arch)
    recipe = Recipe(make_scheme("W8A16"), "rtn", ignore=())
    quantize_to_directory(str(directory), recipe, str(tmp_path / "out"), "", 1, 8, 1, 0, "auto", False)
    config = json.loads((tmp_path / "out" / "config.json").read_text())
    net, _ = load_network(str(tmp_path / "out"), torch.float32)
    assert config["quantization_config"]["ignore"] == [] and config["tie_word_embeddings"] is False
    assert isinstance(net.lm_head, QuantLinear)
    assert isinstance(net.model.embed_tokens.weight, torch.nn.Parameter)  # dense
    reference, _ = load_network(str(directory), torch.float32)
    assert torch.equal(net.model.embed_tokens.weight, reference.model.embed_tokens.weight)
    ours = prefill_logits(net, SEQS)
    for got, want in zip(ours, prefill_logits(reference, SEQS), strict=True):
        assert ((got - want).norm() / want.norm()).item() < 0.03
    theirs = AutoModelForCausalLM.from_pretrained(
        tmp_path / "out", dtype=torch.float32, quantization_config=CompressedTensorsConfig(dequantize=True))
    with torch.no_grad():
        for got, seq in zip(ours, SEQS, strict=True):
            assert (got - theirs(torch.tensor([seq])).logits[0]).abs().max().item() < 1e-4
