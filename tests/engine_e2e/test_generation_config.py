"""A model's generation_config.json: its eos_token_id list ends generations (transformers' generate
stops there too), and its sampling fields are the defaults of what requests leave out (vLLM's
--generation-config auto)."""

from __future__ import annotations

import json
import logging
import shutil

import pytest
import torch
from models.tiny_gguf import write_tiny_gguf
from quant.tiny import tiny_model_dir

from inferlab.config import EngineConfig
from inferlab.engine.llm import LLM
from inferlab.engine.sampling_params import SamplingParams
from inferlab.errors import InferlabError, ModelLoadError
from inferlab.models.gguf import read_gguf_config

PROMPT = "the city of the world"
EOS = 2  # </s> in the tiny tokenizer and config.json


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    return tiny_model_dir(tmp_path_factory.mktemp("generation"))


def with_generation_config(source, target, **fields):
    shutil.copytree(source, target)
    (target / "generation_config.json").write_text(json.dumps(fields))
    return target


def tiny_llm(directory, **engine_args) -> LLM:
    return LLM(str(directory), dtype="float32", kv_cache_memory="4MiB", **engine_args)


def tokens(llm: LLM, params: SamplingParams | None = None):
    return llm.generate(PROMPT, params)[0].outputs[0]


def test_every_listed_eos_ends_the_generation_as_in_transformers(model_dir, tmp_path):
    free = tokens(tiny_llm(model_dir), SamplingParams(temperature=0, max_tokens=12, ignore_eos=True))
    # a token of the greedy run, not its first, becomes the model's second end-of-generation id
    k = next(i for i in range(1, 12) if free.token_ids[i] not in free.token_ids[:i] + [EOS])
    end = free.token_ids[k]
    directory = with_generation_config(model_dir, tmp_path / "m", eos_token_id=[EOS, end])
    llm = tiny_llm(directory)
    out = tokens(llm, SamplingParams(temperature=0, max_tokens=12))
    assert out.token_ids == free.token_ids[:k + 1]
    assert (out.finish_reason, out.stop_reason) == ("stop", end)

    from transformers import AutoModelForCausalLM  # reads the same generation_config.json

    model = AutoModelForCausalLM.from_pretrained(directory, dtype=torch.float32).eval()
    ids = llm.tokenizer.encode(PROMPT)
    with torch.no_grad():
        reference = model.generate(torch.tensor([ids]), max_new_tokens=12, do_sample=False,
                                   pad_token_id=0)[0, len(ids):].tolist()
    assert reference == out.token_ids
    # ignore_eos writes through every end token, and vllm mode keeps the model's end tokens
    assert tokens(llm, SamplingParams(temperature=0, max_tokens=12, ignore_eos=True)).token_ids == free.token_ids
    vllm_mode = tiny_llm(directory, generation_config="vllm")
    assert tokens(vllm_mode, SamplingParams(temperature=0, max_tokens=12)).stop_reason == end
    # an end id past the vocabulary (160 rows) can never be sampled: dropped, not refused
    beyond = tiny_llm(with_generation_config(model_dir, tmp_path / "beyond", eos_token_id=[EOS, 999]))
    assert beyond.engine.generation.end_token_ids == (EOS,)
    assert len(tokens(beyond, SamplingParams(max_tokens=4, min_tokens=2, ignore_eos=True)).token_ids) == 4


def test_the_models_sampling_fields_default_what_requests_leave_out(model_dir, tmp_path):
    greedy = tokens(tiny_llm(model_dir), SamplingParams(temperature=0, max_tokens=5)).token_ids
    # top_k 1 samples the argmax at any temperature; max_new_tokens caps a request without a max
    # (written 1.0 and 5.0, as some JSON writers do: SamplingParams takes them as integers)
    directory = with_generation_config(model_dir, tmp_path / "m", temperature=0.8, top_k=1.0,
                                       max_new_tokens=5.0, do_sample=True)
    llm = tiny_llm(directory)
    assert tokens(llm).token_ids == greedy  # LLM.generate without params
    chat = llm.get_default_sampling_params()
    assert (chat.temperature, chat.top_k, chat.max_tokens) == (0.8, 1, None)
    ignored = tiny_llm(directory, generation_config="vllm")
    assert ignored.get_default_sampling_params() == SamplingParams()
    # a folder named on the command line replaces the model's own file
    other = with_generation_config(model_dir, tmp_path / "other", top_p=0.5)
    assert tiny_llm(model_dir, generation_config=str(other)).engine.generation.sampling == {"top_p": 0.5}


def test_the_cli_takes_the_models_sampling_fields_its_flags_leave_out(model_dir, tmp_path, capsys):
    """`inferlab generate` as the server and LLM: the file's repetition_penalty applies (its
    flags had set every field, so the file was never read); a flag given wins over the file."""
    from inferlab.cli import main

    directory = with_generation_config(model_dir, tmp_path / "m", repetition_penalty=5.0, top_k=3)
    want = SamplingParams(temperature=0, repetition_penalty=5.0, max_tokens=8)
    penalized = tokens(tiny_llm(model_dir), want).text
    assert penalized != tokens(tiny_llm(model_dir), SamplingParams(temperature=0, max_tokens=8)).text
    flags = [str(directory), "--dtype", "float32", "--kv-cache-memory", "4MiB", "--max-tokens", "8"]
    assert main(["generate", PROMPT, *flags]) == 0
    assert capsys.readouterr().out == penalized + "\n"
    seeded = SamplingParams(temperature=1.5, top_k=3, repetition_penalty=5.0, max_tokens=8, seed=4)
    assert main(["generate", PROMPT, *flags, "--temperature", "1.5", "--sampling-seed", "4"]) == 0
    assert capsys.readouterr().out == tokens(tiny_llm(model_dir), seeded).text + "\n"


@pytest.mark.parametrize("fields, words", [
    ({"eos_token_id": "</s>"}, "eos_token_id must be a token id or a list of them"),
    ({"top_p": 0.0}, "top_p must be in (0, 1]"),
    ({"temperature": "hot"}, "temperature must be a number"),
    ({"top_k": 2.5}, "top_k must be a whole number, got 2.5"),
])
def test_a_bad_generation_config_is_a_load_error_naming_the_file(model_dir, tmp_path, fields, words):
    directory = with_generation_config(model_dir, tmp_path / "m", **fields)
    with pytest.raises(ModelLoadError, match="generation_config.json: ") as error:
        tiny_llm(directory)
    assert words in str(error.value)


def test_generation_config_must_be_auto_vllm_or_a_folder(tmp_path):
    with pytest.raises(InferlabError, match="generation_config must be auto, vllm or a folder"):
        EngineConfig(generation_config=str(tmp_path / "missing"))


def test_gguf_end_of_turn_and_message_ids_end_generations_too(tmp_path):
    """llama.cpp's converter writes Llama 3's <|eot_id|> and <|eom_id|> as their own keys."""
    path = write_tiny_gguf(tmp_path / "tiny.gguf", **{"tokenizer.ggml.eos_token_id": 2,
                                                       "tokenizer.ggml.eot_token_id": 7,
                                                       "tokenizer.ggml.eom_token_id": 9})
    assert read_gguf_config(str(path)).eos_token_ids == (2, 7, 9)


def test_a_generation_config_folder_without_the_file_is_warned_of(model_dir, tmp_path, caplog):
    """A mistyped --generation-config folder started silently with no defaults."""
    (tmp_path / "empty").mkdir()
    with caplog.at_level(logging.WARNING, logger="inferlab.engine"):
        assert tiny_llm(model_dir, generation_config=str(tmp_path / "empty")).engine.generation.sampling == {}
    assert f"--generation-config {tmp_path / 'empty'} holds no generation_config.json" in caplog.text
    caplog.clear()
    other = with_generation_config(model_dir, tmp_path / "other", top_p=0.5)
    with caplog.at_level(logging.WARNING, logger="inferlab.engine"):
        tiny_llm(model_dir, generation_config=str(other))
    assert "holds no" not in caplog.text
