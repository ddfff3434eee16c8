"""`inferlab quantize`'s command line on a tiny model: bad input is one line with exit 2, found
before the model loads where it can be, and what the flags leave out takes its documented
defaults (the runs themselves: test_quantize.py)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from inferlab.cli import build_parser, main
from inferlab.quant.cli import CALIBRATION_DEFAULTS, build_recipe
from inferlab.quant.recipe import Recipe
from inferlab.quant.scheme import make_scheme

from .tiny import calibration_text, tiny_model_dir

pytest.importorskip("transformers")


@pytest.fixture(scope="module")
def source(tmp_path_factory):
    """(the tiny model's directory, a calibration text)."""
    directory = tiny_model_dir(tmp_path_factory.mktemp("tiny"))
    return directory, calibration_text(directory.parent / "calib.txt")


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
    (["--scheme", "W8A16"], {"num_samples": 128, "seq_len": 512, "batch_size": 8, "seed": 0}),
    (["--scheme", "FP8", "--num-samples", "4", "--seq-len", "16", "--batch-size", "2", "--seed", "3"],
     {"num_samples": 4, "seq_len": 16, "batch_size": 2, "seed": 3}),
    (["--scheme", "W8A16", "--method", "gptq", "--block-size", "6"],
     {"num_samples": 128, "seq_len": 512, "batch_size": 8, "seed": 0}),
], ids=["defaults", "static scales calibrate", "gptq takes any block"])
def test_cli_passes_the_calibration_settings(source, tmp_path, monkeypatch, flags, calibration) -> None:
    """The documented defaults where a flag is left out; FP8's static input scales calibrate."""
    # a stand-in for the default text, which runs that calibrate read first: no ../shared/data needed
    monkeypatch.setitem(CALIBRATION_DEFAULTS, "calib", str(source[1]))
    ran = []
    monkeypatch.setattr("inferlab.quant.run.quantize_to_directory", lambda *a, **k: ran.append(k) or {})
    assert main(["quantize", str(source[0]), "--out", str(tmp_path / "q"), *flags]) == 0
    assert {k: ran[0][k] for k in ["calib", *calibration]} == {"calib": str(source[1]), **calibration}


def test_default_calibration_text_is_wikitext_valid_beside_the_project() -> None:
    project_root = Path(__file__).resolve().parents[2]  # tests/quant/ -> the project
    expected = project_root.parent / "shared" / "data" / "wikitext-2-valid" / "valid.txt"
    assert CALIBRATION_DEFAULTS["calib"] == str(expected)


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
    directory, calib = source
    limit = json.loads((directory / "config.json").read_text())["max_position_embeddings"]
    assert main(["quantize", str(directory), "--scheme", "W8A16", "--method", "gptq", "--calib",
                 str(calib), "--seq-len", str(limit + 1), "--out", str(tmp_path / "q")]) == 2
    assert f"--seq-len {limit + 1} is longer" in capsys.readouterr().err
    assert not (tmp_path / "q").exists()
