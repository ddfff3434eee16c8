"""`inferlab quantize` end to end on a tiny model: every method writes a checkpoint that loads."""

from __future__ import annotations

import json
import os
import random
import signal
import subprocess
import sys

import pytest
import torch

from inferlab.cli import build_parser, main
from inferlab.models.loader import load_network
from inferlab.quant.algorithms.awq import AwqConfig
from inferlab.quant.algorithms.sparsity import is_2of4
from inferlab.quant.cli import build_recipe
from inferlab.quant.linear import Int8WeightOnlyLinear, QuantLinear
from inferlab.quant.recipe import Recipe
from inferlab.quant.run import quantize_to_directory
from inferlab.quant.scheme import make_scheme
from inferlab.shared_data import WIKITEXT_VALID

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


@pytest.mark.parametrize(("flags", "message"), [
    (["--scheme", "W3A16"], "unknown scheme 'W3A16'"),
    (["--scheme", "W4A16", "--method", "hqq"], "unknown method 'hqq'"),
    (["--scheme", "W4A16", "--group-size", "48"],
     "model.layers.0.self_attn.q_proj: group size 48 does not divide its 64 inputs"),
    # once ignored without a word: W8A16 stays per channel
    (["--scheme", "W8A16", "--group-size", "64"], "--group-size applies to W4A16 and FP8_BLOCK"),
    (["--scheme", "W4A16", "--group-size", "0"], "--group-size must be positive, got 0"),
    (["--scheme", "FP8_BLOCK", "--group-size", "64"], "blocks of 64 rows do not divide its 32 outputs"),
    (["--scheme", "W4A16", "--method", "gptq", "--calib", "/no/such.txt"], "no such calibration file (--calib)"),
    (["--scheme", "W4A16", "--method", "smoothquant"], "smoothquant migrates activation outliers"),
    (["--scheme", "W8A8", "--sparsity", "1:2"], "unknown sparsity '1:2'"),
    (["--method", "gptq"], "nothing to do"),
    (["--method", "rtn", "--sparsity", "2:4"], "is done by --method sparsegpt or magnitude, not rtn"),
    (["--scheme", "W8A16", "--method", "gptq", "--sparsity", "2:4"], "not gptq"),
    # once accepted silently: a typo quantized the lm_head too, "re:.*" wrote a dense model
    (["--scheme", "W8A16", "--ignore", "foo_bar"], "--ignore 'foo_bar' matches no layer"),
    (["--scheme", "W8A16", "--ignore", "re:.*"], "--ignore leaves no decoder layer to compress"),
])
def test_bad_input_is_one_line(source, tmp_path, capsys, flags: list[str], message: str) -> None:
    code = main(["quantize", str(source[0]), "--out", str(tmp_path / "out"), "--quiet", *flags])
    err = capsys.readouterr().err
    assert code == 2 and message in err
    assert err.count("\n") == 1 and err.startswith("error: ")
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize(("flags", "method", "sparsity"), [
    (["--scheme", "W8A16"], "rtn", None),
    (["--sparsity", "2:4"], "sparsegpt", "2:4"),
    (["--scheme", "W4A16", "--sparsity", "2:4"], "sparsegpt", "2:4"),
    (["--sparsity", "2:4", "--method", "magnitude"], "magnitude", "2:4"),
    (["--method", "Magnitude"], "magnitude", "2:4"),
])
def test_default_method_follows_the_request(flags: list[str], method: str, sparsity) -> None:
    """No --method: sparsegpt when --sparsity asks for pruning (llm-compressor's usual 2:4
    tool), rtn otherwise; a named method always wins."""
    argv = ["quantize", "--out", "unused", *flags]
    recipe = build_recipe(build_parser(argv).parse_args(argv))
    assert (recipe.method, recipe.sparsity, recipe.obs.act_order) == (method, sparsity, False)


def test_recipe_default_method() -> None:
    assert Recipe(None, sparsity="2:4").method == "sparsegpt"
    assert Recipe(make_scheme("W4A16"), sparsity="2:4").method == "sparsegpt"
    assert Recipe(make_scheme("W4A16")).method == "rtn"


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


@pytest.mark.parametrize("flags", [["--scheme", "W4A16", "--group-size", "48"],
                                   ["--scheme", "FP8_BLOCK", "--group-size", "64"]])
def test_shape_errors_name_a_layer_of_the_checkpoint(source, tmp_path, one_line_error, flags) -> None:
    """Once our fused qkv_proj / gate_up_proj, which --ignore refuses: it takes the checkpoint's names."""
    from safetensors.torch import load_file

    err = one_line_error("quantize", source[0], "--out", tmp_path / "q", *flags)
    assert f"{err.removeprefix('error: ').split(':')[0]}.weight" in load_file(source[0] / "model.safetensors")


def test_cli_refuses_a_non_empty_output(source, tmp_path, capsys) -> None:
    (tmp_path / "out").mkdir()
    (tmp_path / "out" / "keep.txt").write_text("mine")
    assert main(["quantize", str(source[0]), "--scheme", "W8A16", "--out", str(tmp_path / "out")]) == 2
    assert "not empty" in capsys.readouterr().err
    assert (tmp_path / "out" / "keep.txt").read_text() == "mine"


@pytest.mark.parametrize("out", ["file/out", "/proc/inferlab-out"], ids=["under a file", "in /proc"])
def test_cli_refuses_an_output_it_cannot_create_before_quantizing(source, tmp_path, capsys, monkeypatch,
                                                                   out) -> None:
    """Once a traceback after the whole run (os.makedirs of out.partial-PID)."""
    (tmp_path / "file").write_text("not a directory")
    monkeypatch.chdir(tmp_path)
    ran = []
    monkeypatch.setattr("inferlab.quant.run.quantize_to_directory", lambda *a, **k: ran.append(a))
    assert main(["quantize", str(source[0]), "--scheme", "W8A16", "--out", out]) == 2
    err = capsys.readouterr().err
    assert "cannot write a directory" in err and "Traceback" not in err and not ran


@pytest.mark.parametrize(("flags", "message"), [
    (["--out", ""], "--out is empty"),
    (["--out", "."], "the working directory cannot be replaced"),
    (["--out", "q", "--ignore", "re:["], "not a regular expression"),
    (["--out", "q", "--method", "gptq", "--batch-size", "0"], "--batch-size must be at least 1"),
    # these two once failed only once the model had loaded
    (["--out", "q", "--method", "gptq", "--num-samples", "0"], "--num-samples must be at least 1"),
    (["--out", "q", "--method", "gptq", "--seq-len", "0"], "--seq-len must be at least 1"),
    # a segfault in torch.set_num_threads; a Cholesky error after calibration
    (["--out", "q", "--threads", "100000"], "--threads must be in [1, 1024]"),
    (["--out", "q", "--scheme", "W4A16", "--method", "gptq", "--sink-weight", "nan"],
     "--sink-weight must be a positive number"),
], ids=["empty out", "working directory", "bad regex", "batch size 0", "no samples", "no tokens",
        "threads", "sink weight"])
def test_cli_refuses_bad_arguments_before_quantizing(source, tmp_path, one_line_error, monkeypatch,
                                                     flags, message) -> None:
    """Each once a traceback, some only after the whole quantization had run."""
    monkeypatch.chdir(tmp_path)
    assert message in _refused_before_quantizing(one_line_error, monkeypatch, source[0], "--scheme", "W8A16",
                                                 *flags)


def _refused_before_quantizing(one_line_error, monkeypatch, model, *argv: str) -> str:
    """`inferlab quantize MODEL ARGV`'s one-line error (exit 2), given before any quantization."""
    ran = []
    monkeypatch.setattr("inferlab.quant.run.quantize_to_directory", lambda *a, **k: ran.append(a))
    err = one_line_error("quantize", model, *argv)
    assert not ran
    return err


@pytest.mark.parametrize(("flags", "message"), [
    (["--sparsity", "2:4", "--group-size", "7"], "--group-size needs a --scheme"),
    (["--scheme", "W8A16", "--awq-clip"], "--awq-clip applies to --method awq, not rtn"),
    (["--scheme", "W8A16", "--smoothquant-alpha", "0.9"],
     "--smoothquant-alpha applies to --method smoothquant, not rtn"),
    (["--scheme", "W4A16", "--method", "awq", "--dampening", "0.5"],
     "--dampening applies to --method gptq or smoothquant or sparsegpt, not awq"),
    (["--scheme", "W8A16", "--act-order"], "--act-order applies to --method gptq or smoothquant"),
    (["--scheme", "W8A16", "--no-act-order"], "--no-act-order applies to --method gptq or smoothquant"),
    (["--scheme", "W8A16", "--calib", "/no/such.txt"], "--calib applies to runs that calibrate"),
    (["--scheme", "W8A16", "--num-samples", "0", "--seq-len", "99999"],
     "--num-samples applies to runs that calibrate"),
    (["--scheme", "FP8_DYNAMIC", "--seq-len", "16"], "not --method rtn with --scheme FP8_DYNAMIC"),
    (["--method", "magnitude", "--batch-size", "2"], "--batch-size applies to runs that calibrate"),
    (["--scheme", "W8A16", "--seed", "1"], "--seed applies to runs that calibrate"),
], ids=["group size without a scheme", "awq flag", "smoothquant flag", "gptq flag", "act order",
        "no act order", "calib", "num samples", "seq len", "batch size", "seed"])
def test_cli_refuses_flags_no_step_reads(source, tmp_path, one_line_error, monkeypatch, flags,
                                         message) -> None:
    """Each once exited 0 and did nothing with the flag."""
    monkeypatch.chdir(tmp_path)
    assert message in _refused_before_quantizing(one_line_error, monkeypatch, source[0], "--out", "q", *flags)


@pytest.mark.parametrize(("flags", "message"), [
    (["--sparsity", "2:4", "--block-size", "6"],
     "--block-size must be a positive multiple of 4 for 2:4 pruning, got 6"),
    (["--scheme", "W8A16", "--method", "gptq", "--block-size", "0"], "--block-size must be positive, got 0"),
    (["--scheme", "W8A16", "--method", "gptq", "--dampening", "1"], "--dampening must be in [0, 1), got 1"),
], ids=["sparsegpt block", "gptq block", "dampening"])
def test_cli_refuses_bad_algorithm_settings_before_loading(source, tmp_path, one_line_error,
                                                          monkeypatch, flags, message) -> None:
    """SparseGPT's block once failed after the model loaded and its first layer calibrated, as
    "block size must be a positive multiple of 4", also said of GPTQ's, which takes any."""
    monkeypatch.chdir(tmp_path)
    assert message in _refused_before_quantizing(one_line_error, monkeypatch, source[0], "--out", "q", *flags)


@pytest.mark.parametrize(("flags", "calibration"), [
    (["--scheme", "W8A16"], {"calib": str(WIKITEXT_VALID), "num_samples": 128, "seq_len": 512,
                             "batch_size": 8, "seed": 0}),
    (["--scheme", "FP8", "--num-samples", "4", "--seq-len", "16", "--batch-size", "2", "--seed", "3"],
     {"calib": str(WIKITEXT_VALID), "num_samples": 4, "seq_len": 16, "batch_size": 2, "seed": 3}),
    (["--scheme", "W8A16", "--method", "gptq", "--block-size", "6"],
     {"calib": str(WIKITEXT_VALID), "num_samples": 128, "seq_len": 512, "batch_size": 8, "seed": 0}),
], ids=["defaults", "static scales calibrate", "gptq takes any block"])
def test_cli_passes_the_calibration_settings(source, tmp_path, monkeypatch, flags, calibration) -> None:
    """The documented defaults where a flag is left out; FP8's static input scales calibrate."""
    ran = []
    monkeypatch.setattr("inferlab.quant.run.quantize_to_directory", lambda *a, **k: ran.append(k) or {})
    assert main(["quantize", str(source[0]), "--out", str(tmp_path / "q"), *flags]) == 0
    assert {k: ran[0][k] for k in calibration} == calibration


@pytest.mark.parametrize("target", ["real", "nowhere"], ids=["to a directory", "dangling"])
def test_cli_refuses_a_symbolic_link_as_the_output(source, tmp_path, one_line_error, monkeypatch,
                                                   target) -> None:
    """Once a traceback after the whole run: os.rmdir, then os.replace, of the link itself."""
    (tmp_path / "real").mkdir()
    (tmp_path / "link").symlink_to(tmp_path / target)
    err = _refused_before_quantizing(one_line_error, monkeypatch, source[0], "--scheme", "W8A16", "--out",
                                     str(tmp_path / "link"))
    assert "is a symbolic link" in err and (tmp_path / "link").is_symlink()


def test_a_calibration_window_longer_than_the_model_is_refused(source, tmp_path, capsys) -> None:
    """Once ran on until memory ran out: 100,000-token windows through an 8,192-position model."""
    directory, calib, _ = source
    limit = json.loads((directory / "config.json").read_text())["max_position_embeddings"]
    assert main(["quantize", str(directory), "--scheme", "W8A16", "--method", "gptq", "--calib",
                 str(calib), "--seq-len", str(limit + 1), "--out", str(tmp_path / "q")]) == 2
    assert f"--seq-len {limit + 1} is longer" in capsys.readouterr().err
    assert not (tmp_path / "q").exists()


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
