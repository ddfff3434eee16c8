"""`inferlab eval` end to end: the JSON result, the engine path, and one-line errors with exit 2."""

from __future__ import annotations

import json
import logging
import shutil
from pathlib import Path

import pytest
from eval_helpers import MAX_POSITIONS, make_char_model

from inferlab.cli import main


def _run(capsys, *argv: str) -> tuple[int, str, str]:
    code = main(["eval", *argv])
    captured = capsys.readouterr()
    return code, captured.out, captured.err


def test_json_result_of_a_quick_run(char_models, char_text_file, tmp_path, capsys):
    (base_dir, _), _ = char_models
    out = tmp_path / "result.json"
    code, stdout, _ = _run(capsys, str(base_dir), "--dataset", str(char_text_file), "--seq-len", "16",
                           "--limit", "3", "--dtype", "float32", "--output", str(out))
    assert code == 0
    result = json.loads(out.read_text())
    assert {k: result[k] for k in ("model", "dataset", "seq_len", "windows", "tokens")} == {
        "model": "base", "dataset": str(char_text_file), "seq_len": 16, "windows": 3, "tokens": 45}
    assert result["model_path"] == str(base_dir)  # the name alone is only the folder's
    assert f"perplexity {result['ppl']:.4f}" in stdout
    assert "kl_mean" not in result


def test_json_result_against_a_baseline(char_models, char_text_file, tmp_path, capsys):
    (base_dir, _), (other_dir, _) = char_models
    out = tmp_path / "result.json"
    code, stdout, _ = _run(capsys, str(other_dir), "--baseline", str(base_dir), "--dataset",
                           str(char_text_file), "--seq-len", "16", "--limit", "2", "--dtype",
                           "float32", "--output", str(out))
    assert code == 0
    result = json.loads(out.read_text())
    assert result["baseline"] == "base" and result["model"] == "perturbed"
    assert (result["baseline_path"], result["model_path"]) == (str(base_dir), str(other_dir))
    assert result["kl_mean"] > 0 and result["kl_p99"] >= result["kl_median"]
    assert 0 <= result["top1_agreement"] <= 1 and result["baseline_ppl"] > 1
    assert "top-1 agreement" in stdout


def test_json_records_the_models_absolute_paths(char_models, char_text_file, tmp_path, capsys,
                                               monkeypatch):
    """Models named relative to where eval ran: the result, read from anywhere, says which
    (it once held "perturbed" and "base", as typed)."""
    (base_dir, _), (other_dir, _) = char_models
    monkeypatch.chdir(base_dir.parent)
    out = tmp_path / "result.json"
    code, _, _ = _run(capsys, other_dir.name, "--baseline", f"./{base_dir.name}", "--dataset",
                      str(char_text_file), "--seq-len", "16", "--limit", "1", "--dtype", "float32",
                      "--output", str(out))
    assert code == 0
    result = json.loads(out.read_text())
    assert (result["model_path"], result["baseline_path"]) == (str(other_dir), str(base_dir))


def test_json_records_the_datasets_absolute_path(char_models, char_text_file, tmp_path, capsys,
                                                 monkeypatch):
    """As the models' paths: it once kept the dataset as typed ("text.txt")."""
    (base_dir, _), _ = char_models
    monkeypatch.chdir(char_text_file.parent)
    out = tmp_path / "result.json"
    code, _, _ = _run(capsys, str(base_dir), "--dataset", char_text_file.name, "--seq-len", "16",
                      "--limit", "1", "--dtype", "float32", "--output", str(out))
    assert code == 0
    assert json.loads(out.read_text())["dataset"] == str(char_text_file)


def test_engine_path_gives_the_direct_perplexity(char_models, char_text_file, tmp_path, capsys,
                                                 caplog):
    (base_dir, _), _ = char_models
    results = []
    for extra in ([], ["--via-engine"]):
        out = tmp_path / f"r{len(extra)}.json"
        code, _, _ = _run(capsys, str(base_dir), "--dataset", str(char_text_file), "--seq-len", "64",
                          "--dtype", "float32", "--output", str(out), *extra)
        assert code == 0
        results.append(json.loads(out.read_text()))
    direct, engine = results
    assert engine["via_engine"] and engine["tokens"] == direct["tokens"] == 7 * 63
    assert engine["ppl"] == pytest.approx(direct["ppl"], rel=1e-5)
    # eval sizes the engine's KV cache itself: the engine once warned, every run, that it
    # lowered max_model_len to what that cache holds
    assert [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING] == []


@pytest.fixture(scope="module")
def other_vocab_model(tmp_path_factory):
    directory = tmp_path_factory.mktemp("eval_vocab") / "reversed"
    make_char_model(directory, seed=0, reverse_vocab=True)
    return directory


def _windowed_copy(model_dir: Path, directory: Path, window: int) -> Path:
    """The model as a Mistral with a sliding window of `window` tokens (the same weights)."""
    shutil.copytree(model_dir, directory)
    config = json.loads((directory / "config.json").read_text())
    config.update(architectures=["MistralForCausalLM"], model_type="mistral", sliding_window=window)
    (directory / "config.json").write_text(json.dumps(config))
    return directory


def _grown_tokenizer(model_dir: Path, tmp_path: Path, text_file: Path) -> list[str]:
    """The model with 33 tokens added to its tokenizer (ids 96-128; the model has 128 rows), and
    a text that holds the last."""
    from tokenizers import Tokenizer

    directory = tmp_path / "grown"
    shutil.copytree(model_dir, directory)
    tokenizer = Tokenizer.from_file(str(directory / "tokenizer.json"))
    tokenizer.add_tokens([f"<x{i}>" for i in range(33)])
    tokenizer.save(str(directory / "tokenizer.json"))
    text = tmp_path / "grown.txt"
    text.write_text(text_file.read_text() + " <x32> ")
    return [str(directory), "--dataset", str(text)]


@pytest.mark.parametrize(("case", "message"), [
    ("missing_dataset", "no such dataset file (--dataset)"),
    ("seq_len_1", "--seq-len must be at least 2"),
    ("unknown_model", "no such file or directory"),
    ("limit_0", "--limit must be at least 1"),
    ("engine_and_baseline", "--via-engine gives only the prompt tokens' logprobs"),
    ("text_too_short", "fewer than one window of --seq-len 120"),
    ("window_too_long", f"--seq-len {MAX_POSITIONS + 1} is longer than base can take"),
    # once a traceback, from the forward's own check
    ("sliding_window_too_long", "--seq-len 16 is longer than windowed can take: 8 tokens of sliding window"),
    ("engine_window_too_long", "the engine needs one position"),
    ("other_vocabulary", "have different vocabularies"),
    ("tokens_past_the_model", "gives token id 128, past its 128 embedding rows"),  # once an IndexError
    ("unwritable_output", ": cannot write (Is a directory)"),  # before the run, not after it
    ("empty_output", "--output must name a file"),  # once ignored: nothing written, exit 0
    ("output_under_a_file", "short.txt is not a folder"),  # once "folder ... does not exist"
    # these three once said "error: : no such ..."
    ("empty_model", "the model path is empty"),
    ("empty_baseline", "the model path is empty"),
    ("empty_dataset", "the dataset file (--dataset) path is empty"),
])
def test_bad_input_is_one_line_and_exit_2(case, message, char_models, char_text_file,
                                          other_vocab_model, tmp_path, capsys):
    (base_dir, _), _ = char_models
    short = tmp_path / "short.txt"
    short.write_text("just a few words\n")
    data = ["--dataset", str(char_text_file), "--seq-len", "16"]  # a later --seq-len wins
    argv = {
        "missing_dataset": [str(base_dir), "--dataset", str(tmp_path / "absent.raw")],
        "seq_len_1": [str(base_dir), *data, "--seq-len", "1"],
        "unknown_model": [str(tmp_path / "no-such-model"), *data],
        "limit_0": [str(base_dir), *data, "--limit", "0"],
        "engine_and_baseline": [str(base_dir), *data, "--via-engine", "--baseline", str(base_dir)],
        "text_too_short": [str(base_dir), "--dataset", str(short), "--seq-len", "120"],
        "window_too_long": [str(base_dir), *data, "--seq-len", str(MAX_POSITIONS + 1)],
        "engine_window_too_long": [str(base_dir), *data, "--seq-len", str(MAX_POSITIONS),
                                   "--via-engine"],
        "other_vocabulary": [str(base_dir), *data, "--baseline", str(other_vocab_model)],
        "tokens_past_the_model": [*_grown_tokenizer(base_dir, tmp_path, char_text_file), "--seq-len", "16"],
        "unwritable_output": [str(base_dir), *data, "--output", str(tmp_path)],  # a directory
        "empty_output": [str(base_dir), *data, "--output", ""],
        "output_under_a_file": [str(base_dir), *data, "--output", str(short / "x.json")],
        "empty_model": ["", *data],
        "empty_baseline": [str(base_dir), *data, "--baseline", ""],
        "empty_dataset": [str(base_dir), "--dataset", ""],
        "sliding_window_too_long": [str(_windowed_copy(base_dir, tmp_path / "windowed", 8)), *data],
    }[case]
    code, stdout, stderr = _run(capsys, *argv)
    assert code == 2
    assert stderr.startswith("error: ") and message in stderr
    assert stderr.count("\n") == 1 and "Traceback" not in stderr
    assert stdout == ""  # refused before the run: no result half delivered


def test_the_json_is_written_when_stdout_is_gone(char_models, char_text_file, tmp_path, monkeypatch):
    """`inferlab eval ... --output r.json | true`: the summary's print meets a closed pipe (a
    success to `main`, exit 0), and the file was once never written; a full disk gave a traceback
    and lost it too."""
    (base_dir, _), _ = char_models
    out = tmp_path / "result.json"

    def closed_pipe(*args, **kwargs):
        raise BrokenPipeError(32, "Broken pipe")

    monkeypatch.setattr("builtins.print", closed_pipe)
    monkeypatch.setattr("inferlab.cli.silence_stdout", lambda: None)
    assert main(["eval", str(base_dir), "--dataset", str(char_text_file), "--seq-len", "16",
                 "--limit", "1", "--dtype", "float32", "--output", str(out)]) == 0
    assert json.loads(out.read_text())["windows"] == 1


def test_a_model_whose_logits_are_nan_is_called_broken(char_models, char_text_file, tmp_path, capsys):
    """A checkpoint whose weights give NaN logits (one norm weight NaN here; a tester's scales
    x 1e30) once printed `perplexity nan` and nothing else, exit 0: the figures stay (null in
    the JSON), and a warning says the model, not the text, is at fault."""
    from safetensors.torch import load_file, save_file

    (base_dir, _), _ = char_models
    broken = tmp_path / "broken"
    shutil.copytree(base_dir, broken)
    weights = load_file(broken / "model.safetensors")
    weights["model.norm.weight"][0] = float("nan")
    save_file(weights, broken / "model.safetensors", metadata={"format": "pt"})
    out = tmp_path / "result.json"
    code, stdout, stderr = _run(capsys, str(broken), "--baseline", str(base_dir), "--dataset",
                                str(char_text_file), "--seq-len", "16", "--limit", "1",
                                "--dtype", "float32", "--output", str(out))
    assert code == 0 and "perplexity nan" in stdout
    assert stderr == ("warning: broken gave NaN log-probabilities: its logits are not all numbers "
                      "(broken weights or scales?), so its figures and any comparison with it "
                      "mean nothing\n")
    result = json.loads(out.read_text())
    assert result["ppl"] is None and result["baseline_ppl"] > 1  # the baseline is fine
