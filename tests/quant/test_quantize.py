"""`inferlab quantize` end to end on a tiny model: every method writes a checkpoint that loads."""

from __future__ import annotations

import json
import os
import random
import signal
import stat
import subprocess
import sys

import pytest
import torch

from inferlab.cli import main
from inferlab.models.loader import load_network
from inferlab.quant.algorithms.awq import AwqConfig
from inferlab.quant.algorithms.sparsity import is_2of4
from inferlab.quant.linear import Int8WeightOnlyLinear, QuantLinear
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
    "fp8-static-rtn": ("FP8", 128, False, "rtn", 0.1),
    "fp8-static-smoothquant": ("FP8", 128, False, "smoothquant", 0.1),
    "fp8-block-gptq": ("FP8_BLOCK", 32, False, "gptq", 0.1),
    "sparsegpt": (None, 128, False, "sparsegpt", None),
    "magnitude": (None, 128, False, "magnitude", None),
    "w4a16-sparsegpt": ("W4A16", 32, False, "sparsegpt", None),
}
OBS_DEFAULTS = {"block_size": 128, "dampening": 0.01, "act_order": False,
                "sink_weight": 24.0}  # a window's length: _quantize's seq_len
SETTINGS = {  # method -> the algorithm settings its run record names (those it reads)
    "rtn": {}, "magnitude": {}, "gptq": OBS_DEFAULTS, "sparsegpt": OBS_DEFAULTS,
    "smoothquant": {**OBS_DEFAULTS, "smoothquant_alpha": 0.5},
    "awq": {"awq_grid": 8, "awq_clip": True},
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


def _decoder_linears(net) -> list[torch.nn.Module]:
    return [m for layer in net.model.layers for m in (
        layer.self_attn.qkv_proj, layer.self_attn.o_proj, layer.mlp.gate_up_proj, layer.mlp.down_proj)]


def _assert_2of4_checkpoint(out, net) -> None:
    """config.json declares 2:4 and every decoder linear of the loaded `net` keeps it."""
    qc = json.loads((out / "config.json").read_text())["quantization_config"]
    assert qc["sparsity_config"]["sparsity_structure"] == "2:4"
    assert qc["sparsity_config"]["global_sparsity"] >= 0.5
    for m in _decoder_linears(net):
        if isinstance(m, Int8WeightOnlyLinear):  # symmetric W8A16: w = q * s, zero iff q is
            assert not m.asymmetric
            nonzero = m.qweight != 0
        elif isinstance(m, QuantLinear):
            nonzero = m.dequantized_weight() != 0
        else:
            assert is_2of4(m.weight.data != 0)
            continue
        # a kept weight may also round to zero
        assert (nonzero.view(nonzero.shape[0], -1, 4).sum(-1) <= 2).all()


@pytest.mark.parametrize("run", sorted(RUNS))
def test_every_method_writes_a_checkpoint_that_loads(source, tmp_path, run: str) -> None:
    scheme, group, asym, method, tol = RUNS[run]
    summary = _quantize(source, tmp_path / "out", scheme, group, asym, method)
    # once without them, and the run could not be reproduced from its checkpoint
    record = json.loads((tmp_path / "out" / "inferlab_quantize.json").read_text())
    assert record["method_settings"] == SETTINGS[method]
    net, _ = load_network(str(tmp_path / "out"), torch.float32)
    if scheme is not None:
        assert all(isinstance(m, QuantLinear) for m in _decoder_linears(net))
        assert summary["linear_weight_bytes"] < summary["linear_weight_bytes_bf16"]
    if method in ("sparsegpt", "magnitude"):
        _assert_2of4_checkpoint(tmp_path / "out", net)
        return
    got = prefill_logits(net, SEQS)
    for g, want in zip(got, source[2], strict=True):
        assert ((g - want).norm() / want.norm()).item() < tol


def test_the_weights_file_follows_the_umask(source, tmp_path) -> None:
    """model.safetensors was 0600 (safetensors' own mode) beside 0644 files: a serving account
    could read the config but not the weights."""
    old = os.umask(0o027)
    try:
        _quantize(source, tmp_path / "out", "W8A16", None, False, "rtn")
    finally:
        os.umask(old)
    modes = {f.name: stat.S_IMODE(f.stat().st_mode) for f in (tmp_path / "out").iterdir()}
    assert modes["model.safetensors"] == modes["config.json"] == 0o640, modes


@pytest.mark.parametrize("scheme", ["W4A16", "FP8", "FP8_BLOCK"])
def test_our_checkpoint_reads_the_same_in_transformers(source, tmp_path, scheme: str) -> None:
    """W4A16 (asymmetric) through the library's dequantized weights; FP8 and FP8_BLOCK through
    its forward, which quantizes each linear's input with the static scale we calibrated, or per
    group of 32 of each token's inputs."""
    from transformers import AutoModelForCausalLM, CompressedTensorsConfig

    _quantize(source, tmp_path / "out", scheme, 32, scheme == "W4A16", "rtn")
    extra = {"quantization_config": CompressedTensorsConfig(dequantize=True)} if scheme == "W4A16" else {}
    theirs = AutoModelForCausalLM.from_pretrained(tmp_path / "out", dtype=torch.float32, **extra)
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



@pytest.mark.parametrize("scheme", [None, "W8A16"])
def test_sparsity_flag_alone_or_with_a_scheme_runs(source, tmp_path, capsys, monkeypatch, scheme) -> None:
    """`inferlab quantize MODEL --sparsity 2:4 [--scheme W8A16]` with no --method prunes by
    SparseGPT (calibrated) and writes a 2:4 checkpoint that loads. Its record names the model
    and the calibration text by absolute paths, though given relative ones."""
    directory, calib, _ = source
    out = tmp_path / "out"
    monkeypatch.chdir(directory.parent)
    code = main(["quantize", directory.name, "--sparsity", "2:4", *(["--scheme", scheme] if scheme else []),
                 "--calib", os.path.relpath(calib), "--num-samples", "6", "--seq-len", "24", "--out", str(out),
                 "--block-size", "16", "--sink-weight", "2", "--quiet"])
    captured = capsys.readouterr()
    assert code == 0, captured.err
    summary = json.loads(captured.out)
    assert (summary["method"], summary["sparsity"], summary["scheme"]) == ("sparsegpt", "2:4", scheme)
    record = json.loads((out / "inferlab_quantize.json").read_text())
    assert record["method_settings"] == {"block_size": 16, "dampening": 0.01, "act_order": False,
                                         "sink_weight": 2.0}
    assert summary["calibration"]["num_samples"] == 6  # SparseGPT's Hessian, not magnitude
    assert (record["source"], record["calibration"]["file"]) == (str(directory), str(calib))
    net, _ = load_network(str(out), torch.float32)
    assert all(isinstance(m, QuantLinear) == (scheme is not None) for m in _decoder_linears(net))
    _assert_2of4_checkpoint(out, net)
    # info says it is pruned (it said "none" for a pruned-only model, and counting its weight
    # bytes failed on it once they counted quantized linears as stored)
    assert main(["info", str(out), "--json"]) == 0
    info = json.loads(capsys.readouterr().out)
    assert info["quantization"][-1].startswith("2:4 sparsity, stored dense, ")
    assert info["linears_as_stored"] == (scheme is not None)



def test_an_interrupted_export_leaves_no_folders_behind(source, tmp_path, monkeypatch) -> None:
    """Ctrl-C while the checkpoint is written: the staging folder goes, and so do the parents
    of --out that the export created; a parent that existed stays."""
    def interrupted(*args, **kwargs):
        raise KeyboardInterrupt

    monkeypatch.setattr("inferlab.quant.export.save_file", interrupted)
    directory, calib, _ = source
    recipe = Recipe(make_scheme("W8A16"), "rtn")
    with pytest.raises(KeyboardInterrupt):
        quantize_to_directory(str(directory), recipe, str(tmp_path / "new" / "deeper" / "q"),
                              str(calib), 4, 16, 2, 0, "auto", False)
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize(("arch", "scheme"), [("llama", "W8A16"), ("llama-tied", "W8A16"),
                                            ("llama-tied", "FP8")])
def test_lm_head_quantized_when_not_ignored(tmp_path, arch: str, scheme: str) -> None:
    """A tied lm_head is quantized from the embedding matrix and written untied (the embedding
    stays dense), so the checkpoint still loads in transformers with the same logits. Under FP8
    its static input scale is calibrated on the final norm's outputs."""
    from transformers import AutoModelForCausalLM, CompressedTensorsConfig

    directory = tiny_model_dir(tmp_path / arch, arch=arch)
    calib = calibration_text(tmp_path / "calib.txt")
    recipe = Recipe(make_scheme(scheme), "rtn", ignore=())
    quantize_to_directory(str(directory), recipe, str(tmp_path / "out"), str(calib), 4, 16, 2, 0,
                          "auto", False)
    config = json.loads((tmp_path / "out" / "config.json").read_text())
    net, _ = load_network(str(tmp_path / "out"), torch.float32)
    assert config["quantization_config"]["ignore"] == [] and config["tie_word_embeddings"] is False
    assert isinstance(net.lm_head, QuantLinear)
    assert (getattr(net.lm_head, "input_scale", None) is not None) == (scheme == "FP8")
    assert isinstance(net.model.embed_tokens.weight, torch.nn.Parameter)  # dense
    reference, _ = load_network(str(directory), torch.float32)
    assert torch.equal(net.model.embed_tokens.weight, reference.model.embed_tokens.weight)
    ours = prefill_logits(net, SEQS)
    for got, want in zip(ours, prefill_logits(reference, SEQS), strict=True):
        assert ((got - want).norm() / want.norm()).item() < (0.03 if scheme == "W8A16" else 0.1)
    extra = {"quantization_config": CompressedTensorsConfig(dequantize=True)} if scheme == "W8A16" else {}
    theirs = AutoModelForCausalLM.from_pretrained(tmp_path / "out", dtype=torch.float32, **extra)
    with torch.no_grad():
        for got, seq in zip(ours, SEQS, strict=True):
            assert (got - theirs(torch.tensor([seq])).logits[0]).abs().max().item() < 1e-4


_KILLED_WHILE_WRITING = """
import os, signal, sys
import inferlab.quant.export as export
from inferlab.cli import main

def save_file(*args, **kwargs):  # the checkpoint half written when the signal comes
    real_save_file(*args, **kwargs)
    os.kill(os.getpid(), signal.SIGTERM)

real_save_file, export.save_file = export.save_file, save_file
sys.exit(main(["quantize", sys.argv[1], "--scheme", "W8A16", "--out", sys.argv[2], "--quiet"]))
"""


def test_sigterm_while_writing_leaves_no_partial_checkpoint(source, tmp_path) -> None:
    """SIGTERM (kill) once left out.partial-PID behind, with the tensors written so far."""
    out = tmp_path / "q"
    done = subprocess.run([sys.executable, "-c", _KILLED_WHILE_WRITING, str(source[0]), str(out)],
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 128 + signal.SIGTERM, done.stderr[-2000:]
    assert list(tmp_path.iterdir()) == [] and "Traceback" not in done.stderr
