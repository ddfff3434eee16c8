"""The quantize output directory carries the source's tokenizer and chat template, and a GGUF
source (the embedded model) gets a config.json and tokenizer files transformers reads back as
the same model and the same tokenizer."""

from __future__ import annotations

import json
import os

import pytest

from inferlab.cli import main

from .tiny import tiny_model_dir

pytest.importorskip("transformers")

TEMPLATE = ("{% for m in messages %}<s>{{ m['role'] }}: {{ m['content'] }}</s>{% endfor %}"
            "{% if add_generation_prompt %}<s>assistant:{% endif %}")
CHAT = [{"role": "system", "content": "be brief"}, {"role": "user", "content": "the city"}]
SENTENCE = "<|im_start|>user\nThe 2 cities' 12345 trams — Ça va? 🤗 déjà-vu<|im_end|>\n"


def _quantize(source: str | None, out, capsys) -> None:
    """The real command path: `inferlab quantize [SOURCE] --scheme W8A16 --out OUT` (rtn)."""
    code = main(["quantize", *([source] if source else []), "--scheme", "W8A16",
                 "--out", str(out), "--quiet"])
    assert code == 0, capsys.readouterr().err


def test_hf_source_tokenizer_and_chat_template_are_copied(tmp_path, capsys) -> None:
    from transformers import AutoTokenizer

    source = tiny_model_dir(tmp_path / "src")
    config = json.loads((source / "tokenizer_config.json").read_text())
    (source / "tokenizer_config.json").write_text(json.dumps({**config, "chat_template": TEMPLATE}))
    _quantize(str(source), tmp_path / "out", capsys)
    out = tmp_path / "out"
    assert (out / "tokenizer.json").read_bytes() == (source / "tokenizer.json").read_bytes()
    assert json.loads((out / "tokenizer_config.json").read_text())["chat_template"] == TEMPLATE
    theirs, original = AutoTokenizer.from_pretrained(out), AutoTokenizer.from_pretrained(source)
    assert theirs.chat_template == TEMPLATE
    rendered = theirs.apply_chat_template(CHAT, tokenize=False, add_generation_prompt=True)
    assert rendered == original.apply_chat_template(CHAT, tokenize=False, add_generation_prompt=True)
    assert rendered.startswith("<s>system: be brief</s>")


@pytest.fixture(scope="module")
def embedded_out(tmp_path_factory):
    """The embedded GGUF model quantized W8A16 by the command with no MODEL argument (~15 s)."""
    out = tmp_path_factory.mktemp("embedded") / "out"
    assert main(["quantize", "--scheme", "W8A16", "--out", str(out), "--quiet"]) == 0
    return out


CONFIG_FIELDS = ("model_type", "hidden_size", "intermediate_size", "num_hidden_layers",
                 "num_attention_heads", "num_key_value_heads", "head_dim", "vocab_size",
                 "max_position_embeddings", "tie_word_embeddings", "bos_token_id", "eos_token_id",
                 "attention_bias")


def test_embedded_model_config_matches_the_gguf(embedded_out, embedded_gguf) -> None:
    """transformers' own reading of the GGUF metadata is the reference for our config.json."""
    from transformers import AutoConfig

    ours = AutoConfig.from_pretrained(embedded_out)
    reference = AutoConfig.from_pretrained(os.path.dirname(embedded_gguf),
                                           gguf_file=os.path.basename(embedded_gguf))
    for name in CONFIG_FIELDS:
        assert getattr(ours, name) == getattr(reference, name), name
    assert ours.rope_parameters["rope_theta"] == reference.rope_parameters["rope_theta"] == 100000.0
    assert ours.rms_norm_eps == pytest.approx(reference.rms_norm_eps)
    assert ours.architectures == ["LlamaForCausalLM"]
    # the shape DESIGN.md gives for SmolLM2-135M, so both readers being wrong the same way fails
    assert (ours.hidden_size, ours.num_hidden_layers, ours.num_attention_heads,
            ours.num_key_value_heads, ours.vocab_size, ours.tie_word_embeddings) == (
        576, 30, 9, 3, 49152, True)
    raw = json.loads((embedded_out / "config.json").read_text())
    assert raw["quantization_config"]["format"] == "pack-quantized"


def test_embedded_model_tokenizer_reads_back_in_transformers(embedded_out, hf_smollm_tokenizer,
                                                            smollm_fp32) -> None:
    from transformers import AutoTokenizer

    theirs = AutoTokenizer.from_pretrained(embedded_out)
    ids = theirs.encode(SENTENCE, add_special_tokens=False)
    assert ids == hf_smollm_tokenizer.encode(SENTENCE, add_special_tokens=False)
    assert ids == smollm_fp32.tokenizer.encode(SENTENCE, add_special_tokens=False)
    assert theirs.encode("Hello") == hf_smollm_tokenizer.encode("Hello")  # same special tokens
    assert theirs.decode(ids) == SENTENCE
    assert theirs.chat_template == hf_smollm_tokenizer.chat_template == smollm_fp32.tokenizer.chat_template
    chat = [{"role": "user", "content": "What is 2+2?"}]
    assert theirs.apply_chat_template(chat, tokenize=False, add_generation_prompt=True) == (
        hf_smollm_tokenizer.apply_chat_template(chat, tokenize=False, add_generation_prompt=True))
    assert (theirs.bos_token, theirs.eos_token) == ("<|im_start|>", "<|im_end|>")


def test_a_source_that_names_its_dtype_the_transformers_5_way_gets_one_dtype(tmp_path, capsys) -> None:
    """A config with "dtype" (transformers 5) kept the source's beside our "torch_dtype", and
    transformers read the stale one first."""
    source = tiny_model_dir(tmp_path / "src")
    config = json.loads((source / "config.json").read_text())
    config.pop("torch_dtype", None)
    (source / "config.json").write_text(json.dumps({**config, "dtype": "bfloat16"}))
    code = main(["quantize", str(source), "--scheme", "W8A16", "--dtype", "float32",
                 "--out", str(tmp_path / "out"), "--quiet"])
    assert code == 0, capsys.readouterr().err
    written = json.loads((tmp_path / "out" / "config.json").read_text())
    assert (written["dtype"], written["torch_dtype"]) == ("float32", "float32")


def test_named_chat_templates_and_special_tokens_reach_the_output(tmp_path):
    # an HF folder's additional_chat_templates/ are copied as they are; a GGUF-like source
    # (any non-folder path) has its tool_use template and named special tokens written into
    # tokenizer_config.json as transformers saves them, so both read back the same
    from inferlab.models.tokenizer import load_hf_tokenizer
    from inferlab.quant.export import write_tokenizer

    source = tiny_model_dir(tmp_path / "src")
    (source / "chat_template.jinja").write_text("DEFAULT {{ messages[0]['content'] }}")
    (source / "additional_chat_templates").mkdir()
    (source / "additional_chat_templates" / "tool_use.jinja").write_text(
        "TOOLS {{ tools | length }} {{ unk_token }}")
    config = json.loads((source / "tokenizer_config.json").read_text())
    (source / "tokenizer_config.json").write_text(json.dumps({**config, "unk_token": "<unk>"}))
    chat, tools = [{"role": "user", "content": "hi"}], [{"type": "function"}]
    for out, origin in ((tmp_path / "copied", str(source)), (tmp_path / "written", "x.gguf")):
        out.mkdir()
        write_tokenizer(str(out), origin, load_hf_tokenizer(str(source)))
        back = load_hf_tokenizer(str(out))
        assert back.apply_chat_template(chat) == "DEFAULT hi", origin
        assert back.apply_chat_template(chat, tools=tools) == "TOOLS 1 <unk>", origin


@pytest.mark.parametrize("window", [None, 1024])
def test_a_written_config_keeps_a_mistral_models_window(window):
    # transformers reads a Mistral config.json without the key as a 4096 window
    from inferlab.models.config import ModelConfig
    from inferlab.quant.export import hf_config_from

    fields = {"architectures": ["MistralForCausalLM"], "vocab_size": 64, "hidden_size": 32,
              "intermediate_size": 64, "num_hidden_layers": 1, "num_attention_heads": 2,
              "num_key_value_heads": 1, "max_position_embeddings": 8192, "sliding_window": window}
    written = hf_config_from(ModelConfig.from_hf_dict(fields))
    assert ModelConfig.from_hf_dict(written).sliding_window == window
