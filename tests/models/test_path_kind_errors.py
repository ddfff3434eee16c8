"""A path of the wrong kind (a directory where a file is expected, a file where a directory or a
model is expected) is named as such, in one line, whichever command was given it: these once
said "not found" for a directory that exists, "not empty" for a file, and "bad magic" or
"expected a model directory" for the same text file, by command."""

from __future__ import annotations

import shutil

import pytest

from inferlab.bench.dataspec import resolve_corpus
from inferlab.cli import main
from inferlab.errors import InferlabError, ModelLoadError
from inferlab.models.loader import load_network, read_model_config


def test_a_directory_as_the_data_file_is_named_a_directory(tmp_path):
    with pytest.raises(InferlabError) as caught:
        resolve_corpus(str(tmp_path))
    assert str(caught.value) == f"--data-file {tmp_path}: is a directory, not a text file"


def test_bench_names_a_directory_given_as_data_file(tmp_path, capsys):
    """Checked before the target is reached: port 1 answers nothing."""
    argv = ["bench", "--target", "http://127.0.0.1:1", "--max-requests", "1",
            "--data-file", str(tmp_path)]
    assert main(argv) == 2
    assert capsys.readouterr().err == f"error: --data-file {tmp_path}: is a directory, not a text file\n"


def test_bench_names_a_directory_given_as_data(tmp_path, capsys):
    prompts = tmp_path / "prompts.jsonl"
    prompts.mkdir()
    argv = ["bench", "--target", "http://127.0.0.1:1", "--max-requests", "1", "--data", str(prompts)]
    assert main(argv) == 2
    assert capsys.readouterr().err == f"error: --data {prompts}: is a directory, not a file of prompts\n"


def test_quantize_names_a_file_given_as_out(tmp_path, capsys):
    """Checked before the model is read: there is none at that path."""
    out = tmp_path / "notes.txt"
    out.write_text("keep me\n")
    argv = ["quantize", str(tmp_path / "no-model"), "--scheme", "W8A16", "--out", str(out)]
    assert main(argv) == 2
    assert capsys.readouterr().err == f"error: {out}: is a file, not a directory (choose a new --out)\n"
    assert out.read_text() == "keep me\n"


@pytest.mark.parametrize("content", [b"hello, not a model\n", b"", b"GGU"])
def test_a_file_that_is_no_gguf_gets_one_message_from_every_reader(tmp_path, content):
    """`info` read the name, `serve` and `generate` the magic; both now read name or magic."""
    path = tmp_path / "afile.txt"
    path.write_bytes(content)
    expected = f"{path}: is neither a model directory (config.json + safetensors) nor a .gguf file"
    for read in (read_model_config, load_network):
        with pytest.raises(ModelLoadError) as caught:
            read(str(path))
        assert str(caught.value) == expected


@pytest.mark.parametrize("command", [["info"], ["generate", "hi"]])
def test_info_and_generate_name_a_text_file_alike(tmp_path, capsys, command):
    path = tmp_path / "afile.txt"
    path.write_text("hello\n")
    assert main([*command, str(path)]) == 2
    assert capsys.readouterr().err == (f"error: {path}: is neither a model directory "
                                       f"(config.json + safetensors) nor a .gguf file\n")


def test_a_gguf_file_without_the_extension_is_read_by_its_magic(tmp_path, embedded_gguf, capsys):
    # an ollama blob ("sha256-...") is a GGUF file with no extension; vLLM reads it by its magic
    blob = tmp_path / "sha256-0123"
    blob.symlink_to(embedded_gguf)
    assert read_model_config(str(blob)) == read_model_config(embedded_gguf)
    assert main(["info", str(blob)]) == 0
    assert "LlamaForCausalLM" in capsys.readouterr().out


@pytest.mark.parametrize("command", [["info"], ["generate", "hi"]])
def test_a_folder_without_weights_gets_one_message_from_info_and_generate(tiny_dir, tmp_path, capsys,
                                                                          command):
    """`info` reported 0 checkpoint bytes and every other figure for it, as if it would load
    (found by a tester)."""
    folder = tmp_path / "no-weights"
    shutil.copytree(tiny_dir, folder, ignore=shutil.ignore_patterns("*.safetensors"))
    assert main([*command, str(folder)]) == 2
    assert capsys.readouterr().err == (f"error: {folder}: no model.safetensors or "
                                       "model.safetensors.index.json (pickled .bin checkpoints are "
                                       "never loaded)\n")
