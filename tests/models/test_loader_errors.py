"""Bad model files give one line naming the file and what is wrong."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from collections import Counter

import pytest
import torch

from inferlab.cli import main
from inferlab.errors import InferlabError, ModelLoadError
from inferlab.models.chat_template import load_chat_template
from inferlab.models.generation_config import read_generation_config
from inferlab.models.gguf import read_gguf_config
from inferlab.models.loader import load_network, read_model_config

from .tiny_gguf import write_tiny_gguf
from .tiny_models import make_tiny_model


def _copy(src, dst):
    dst.mkdir()
    for f in src.iterdir():
        (dst / f.name).write_bytes(f.read_bytes())
    return dst


def test_unsupported_architecture(tiny_dir, tmp_path):
    d = _copy(tiny_dir, tmp_path / "m")
    cfg = json.loads((d / "config.json").read_text())
    cfg["architectures"] = ["GPT2LMHeadModel"]
    (d / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(ModelLoadError, match="architecture 'GPT2LMHeadModel' is not supported"):
        load_network(str(d))


def test_missing_weights_file(tiny_dir, tmp_path):
    d = _copy(tiny_dir, tmp_path / "m")
    (d / "model.safetensors").unlink()
    with pytest.raises(ModelLoadError, match="no model.safetensors"):
        load_network(str(d))


def test_truncated_weights_file(tiny_dir, tmp_path):
    d = _copy(tiny_dir, tmp_path / "m")
    data = (d / "model.safetensors").read_bytes()
    (d / "model.safetensors").write_bytes(data[: len(data) // 2])
    with pytest.raises(ModelLoadError, match=r"model\.safetensors: cannot be read"):
        load_network(str(d))


def test_config_contradicting_weights(tiny_dir, tmp_path):
    d = _copy(tiny_dir, tmp_path / "m")
    cfg = json.loads((d / "config.json").read_text())
    cfg["intermediate_size"] = 128
    (d / "config.json").write_text(json.dumps(cfg))
    # the first one met in the file's order (a misshapen part: test_a_misshapen_part_of_...)
    with pytest.raises(ModelLoadError, match=r"m: model.layers.0.mlp.down_proj.weight has shape \(64, 96\), the config implies \(64, 128\)"):
        load_network(str(d))


@pytest.mark.parametrize("name", [
    "model.norm.weight",
    # a part of a fused layer, named as the checkpoint names it (once "...gate_up_proj.weight parts up_proj")
    "model.layers.1.mlp.up_proj.weight",
])
def test_missing_tensor(tiny_dir, tmp_path, name):
    from safetensors.torch import load_file, save_file

    d = _copy(tiny_dir, tmp_path / "m")
    tensors = load_file(d / "model.safetensors")
    del tensors[name]
    save_file(tensors, d / "model.safetensors")
    with pytest.raises(ModelLoadError, match=f"missing tensors {re.escape(name)}$"):
        load_network(str(d))


@pytest.mark.parametrize(("extra", "words"), [
    # a bias the config does not give: once named as the fused qkv_proj.bias, or as k and v missing
    (("q_proj", "k_proj", "v_proj"), r"unexpected tensor 'model\.layers\.0\.self_attn\.[qkv]_proj\.bias'"),
    (("q_proj",), "unexpected tensor 'model.layers.0.self_attn.q_proj.bias'"),
])
def test_a_checkpoint_tensor_is_named_as_stored(tiny_dir, tmp_path, extra, words):
    import torch
    from safetensors.torch import load_file, save_file

    d = _copy(tiny_dir, tmp_path / "m")
    tensors = load_file(d / "model.safetensors")
    for part in extra:
        rows = tensors[f"model.layers.0.self_attn.{part}.weight"].shape[0]
        tensors[f"model.layers.0.self_attn.{part}.bias"] = torch.zeros(rows)
    save_file(tensors, d / "model.safetensors")
    with pytest.raises(ModelLoadError, match=words):
        load_network(str(d))


MISSHAPEN = [  # (architecture, tensor, the shape written in its place)
    ("llama", "model.layers.0.self_attn.q_proj.weight", (32, 64)),
    ("llama", "model.layers.1.self_attn.k_proj.weight", (32, 48)),
    ("llama", "model.layers.0.self_attn.v_proj.weight", (32,)),  # a rank short: was "disagree"
    ("llama", "model.layers.0.mlp.up_proj.weight", (64, 64)),
    ("llama", "model.layers.1.mlp.gate_proj.weight", (96, 32)),
    ("qwen2", "model.layers.0.self_attn.k_proj.bias", (64,)),
]


@pytest.mark.parametrize(("arch", "name", "bad_shape"), MISSHAPEN)
def test_a_misshapen_part_of_a_fused_layer_is_named_as_stored(tmp_path, arch, name, bad_shape):
    """A misshapen q/k/v or gate/up tensor is named as the checkpoint holds it, with its own
    shape and the one transformers' model has for it: the error once named the fused qkv_proj
    or gate_up_proj, which no checkpoint holds, at the fused shape ("qkv_proj.weight has shape
    (96, 64), the config implies (128, 64)" for a q_proj of 32 rows)."""
    from safetensors.torch import load_file, save_file

    reference = make_tiny_model(arch, tmp_path)  # transformers' model: the shapes it expects
    tensors = load_file(tmp_path / "model.safetensors")
    tensors[name] = torch.zeros(bad_shape)
    save_file(tensors, tmp_path / "model.safetensors", metadata={"format": "pt"})
    with pytest.raises(ModelLoadError) as failed:
        load_network(str(tmp_path))
    expected = tuple(reference.state_dict()[name].shape)
    assert str(failed.value) == f"{tmp_path}: {name} has shape {bad_shape}, the config implies {expected}"


def test_truncated_gguf(embedded_gguf, tmp_path):
    path = tmp_path / "cut.gguf"
    with open(embedded_gguf, "rb") as f:
        path.write_bytes(f.read(50_000_000))
    with pytest.raises(ModelLoadError, match="runs past the end of the file"):
        load_network(str(path))


def test_not_a_gguf(tmp_path):
    path = tmp_path / "x.gguf"
    path.write_bytes(b"hello world, not a model")
    with pytest.raises(ModelLoadError, match="bad magic"):
        load_network(str(path))


def test_no_pickle_checkpoints(tiny_dir, tmp_path):
    d = _copy(tiny_dir, tmp_path / "m")
    (d / "model.safetensors").unlink()
    torch.save({}, d / "pytorch_model.bin")
    with pytest.raises(ModelLoadError, match="pickled .bin checkpoints are never loaded"):
        load_network(str(d))


def test_cli_prints_one_line_without_traceback(tmp_path):
    result = subprocess.run([sys.executable, "-m", "inferlab.cli", "info", str(tmp_path / "nope")],
                            capture_output=True, text=True, timeout=120)
    assert result.returncode == 2
    assert result.stderr.strip().splitlines() == [f"error: {tmp_path / 'nope'}: no such file or directory"]


def test_info_on_the_embedded_model(capsys):
    assert main(["info", "--json"]) == 0
    info = json.loads(capsys.readouterr().out)
    assert (info["layers"], info["kv_heads"], info["head_dim"]) == (30, 3, 64)
    assert info["kv_bytes_per_token"] == 23_040
    assert main(["info"]) == 0
    text = capsys.readouterr().out
    assert "2 × 30 layers × 3 KV heads × 64 head dim × 2 bytes = 23,040 bytes" in text
    assert "chat template                  present" in text or "present" in text
    from gguf import GGUFReader  # the reference reader counts the tensor types

    types = Counter(t.tensor_type.name for t in GGUFReader(info["path"]).tensors)
    assert types["Q4_1"] > 200 and info["quantization"] == [
        "GGUF tensors " + ", ".join(f"{k} x {n}" for k, n in types.most_common()) + " (dequantized at load)"]
    assert info["checkpoint_bytes"] < info["weight_bytes"] / 2  # 4-bit blocks against bf16


def test_a_reader_that_leaves_early_is_no_error():
    """`inferlab info | head -1`: the pipe is closed before the writer prints (Python takes far
    longer to start than this takes to close it); no traceback, exit 0."""
    proc = subprocess.Popen([sys.executable, "-m", "inferlab.cli", "info"], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE)
    proc.stdout.close()
    assert proc.wait(timeout=120) == 0
    assert proc.stderr.read() == b""


@pytest.mark.parametrize("field, value, words", [
    ("rope_scaling", {"rope_type": "dynamic", "factor": 2.0}, "rope scaling 'dynamic' is not supported"),
    ("mlp_bias", True, "mlp_bias (biases in the MLP) is not supported"),
    ("hidden_act", "gelu", "hidden_act 'gelu' is not supported"),  # it once loaded, wrong
    # these two were KeyError tracebacks when the model was built
    ("rope_scaling", {"rope_type": "linear"}, "rope scaling 'linear' needs a positive number factor"),
    ("rope_scaling", {"rope_type": "llama3", "factor": 8.0},
     "rope scaling 'llama3' needs a positive number original_max_position_embeddings"),
])
def test_config_features_the_model_cannot_compute_are_refused(tiny_dir, tmp_path, field, value, words, one_line_error):
    d = _copy(tiny_dir, tmp_path / "m")
    cfg = json.loads((d / "config.json").read_text())
    cfg.pop("rope_parameters", None)  # transformers 5 keeps the scaling there
    cfg[field] = value
    (d / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(ModelLoadError) as error:
        load_network(str(d))
    assert words in str(error.value)
    assert words in one_line_error("info", d)


MISTRAL = {"architectures": ["MistralForCausalLM"]}  # its sliding_window is read when set


@pytest.mark.parametrize(("change", "words"), [
    # each was an AttributeError or ValueError traceback
    ([1, 2], "config.json: expected a JSON object, got list"),
    ({"rope_scaling": 5}, "config.json: invalid value (rope_scaling must be an object, got int)"),
    ({"rope_scaling": "linear"}, "rope_scaling must be an object, got str"),
    ({"rope_parameters": "linear"}, "rope_parameters must be an object, got str"),  # was ignored
    ({**MISTRAL, "sliding_window": "abc"},
     "config.json: invalid value (sliding_window must be a positive whole number or null, got 'abc')"),
    # was taken, then refused as a max_model_len the user never gave
    ({**MISTRAL, "sliding_window": -5}, "sliding_window must be a positive whole number or null, got -5"),
    ({**MISTRAL, "sliding_window": True}, "sliding_window must be a positive whole number or null"),
    # these were taken: 64.7 cut to 64, the string's first letter as the architecture
    ({"hidden_size": 64.7}, "hidden_size must be a whole number, got 64.7"),
    ({"num_hidden_layers": True}, "num_hidden_layers must be a whole number, got True"),
    ({"architectures": "LlamaForCausalLM"}, "architectures must be a list of names"),
    ({"eos_token_id": ["a"]}, "eos_token_id must be a whole number, got 'a'"),
    ({"eos_token_id": [2, -1]}, "eos_token_id must hold token ids (0 or more), got [2, -1]"),  # was taken
    ({"num_attention_heads": 0}, "num_heads must be positive, got 0"),  # not a ZeroDivisionError
    # the file named, as the other config errors name it (once "config: num_attention_heads ...")
    ({"num_attention_heads": 4, "num_key_value_heads": 3},
     "config.json: num_attention_heads (4) is not a multiple of num_key_value_heads (3)"),
])
def test_config_values_of_the_wrong_type_are_one_line_errors(tiny_dir, tmp_path, change, words, one_line_error):
    d = _copy(tiny_dir, tmp_path / "m")
    cfg = change if isinstance(change, list) else {**json.loads((d / "config.json").read_text()), **change}
    (d / "config.json").write_text(json.dumps(cfg))
    assert words in one_line_error("info", d)


@pytest.mark.parametrize(("eos", "ids"), [(2, (2,)), ([2, 3.0], (2, 3)), (None, ())])
def test_generation_config_reads_eos_ids_as_config_json_does(tmp_path, eos, ids):
    (tmp_path / "generation_config.json").write_text(json.dumps({"eos_token_id": eos}))
    assert read_generation_config(str(tmp_path)).eos_token_ids == ids


@pytest.mark.parametrize(("eos", "words"), [
    (-1, "eos_token_id must hold token ids (0 or more), got -1"),
    ("</s>", "eos_token_id must be a token id or a list of them, got '</s>'"),
    ([2.5], "eos_token_id must be a whole number, got 2.5"),
])
def test_a_bad_generation_config_eos_id_names_the_file(tmp_path, eos, words):
    (tmp_path / "generation_config.json").write_text(json.dumps({"eos_token_id": eos}))
    with pytest.raises(ModelLoadError, match="generation_config.json: ") as error:
        read_generation_config(str(tmp_path))
    assert words in str(error.value)


@pytest.mark.parametrize(("index", "words"), [
    ('{"nope": 1}', "weight_map must be an object of tensor name -> shard file name, got nothing"),
    ("{bad", "model.safetensors.index.json: not valid JSON"),
    ("[]", "model.safetensors.index.json: expected a JSON object, got list"),
    ('{"weight_map": []}', "weight_map must be an object of tensor name -> shard file name, got list"),
    ('{"weight_map": {"x": 5}}', "weight_map['x'] is 5, not a file name"),
])
def test_a_malformed_safetensors_index_is_a_one_line_error(tiny_dir, tmp_path, index, words, one_line_error):
    d = _copy(tiny_dir, tmp_path / "m")
    (d / "model.safetensors.index.json").write_text(index)
    assert words in one_line_error("generate", "hi", d, "--max-tokens", "1")


@pytest.mark.parametrize(("name", "content", "words"), [
    ("tokenizer_config.json", b"{bad", "tokenizer_config.json: not valid JSON"),
    ("tokenizer_config.json", b"[1]", "tokenizer_config.json: expected a JSON object, got list"),
    ("tokenizer_config.json", b"\xff\xfe", "tokenizer_config.json: not UTF-8 text"),
    ("tokenizer_config.json", b'{"bos_token": 7}',
     "tokenizer_config.json: bos_token must be a string or an object with a string 'content', got 7"),
    ("tokenizer_config.json", b'{"eos_token": {"content": 5}}', "eos_token must be a string"),
    ("tokenizer_config.json", b'{"chat_template": 5}', "chat_template must be a string or a list"),
    ("chat_template.jinja", "{{ caf\u00e9 }}".encode("latin-1"), "chat_template.jinja: not UTF-8 text"),
])
def test_bad_tokenizer_files_are_one_line_errors(tiny_dir, tmp_path, name, content, words, one_line_error):
    d = _copy(tiny_dir, tmp_path / "m")
    (d / name).write_bytes(content)
    assert words in one_line_error("info", d)


def test_a_named_default_chat_template_and_a_jinja_file_still_load(tiny_dir, tmp_path):
    from inferlab.models.tokenizer import load_hf_tokenizer

    d = _copy(tiny_dir, tmp_path / "m")
    named = [{"name": "tools", "template": "T"}, {"name": "default", "template": "D"}]
    (d / "tokenizer_config.json").write_text(json.dumps({"chat_template": named, "bos_token": {"content": "<s>"}}))
    tokenizer = load_hf_tokenizer(str(d))
    assert (tokenizer.chat_template, tokenizer.info.bos_token) == ("D", "<s>")
    (d / "tokenizer_config.json").write_text("{}")
    (d / "chat_template.jinja").write_bytes(b"{{ 1 }}\r\n{{ 2 }}\r\n")  # read as open() reads it
    assert load_hf_tokenizer(str(d)).chat_template == "{{ 1 }}\n{{ 2 }}\n"


@pytest.mark.parametrize(("content", "words"), [
    (None, "is a directory, not a chat template file"),  # it said "no such file"
    (b"{{ \xe9 }}", "not UTF-8 text (invalid continuation byte at byte 3)"),  # was a traceback
])
def test_serve_chat_template_files_that_cannot_be_read(tmp_path, content, words, one_line_error):
    path = tmp_path / "template.jinja"
    if content is None:
        path.mkdir()
    else:
        path.write_bytes(content)
    with pytest.raises(InferlabError, match=re.escape(words)):
        load_chat_template(str(path))
    assert f"error: {path}: {words}" in one_line_error("serve", "--chat-template", path)


@pytest.mark.parametrize("architecture", ["LlamaForCausalLM", "Qwen3ForCausalLM"])
def test_a_config_without_head_dim_takes_transformers_default(tmp_path, architecture):
    import transformers

    hf_config = {"architectures": [architecture], "vocab_size": 160, "hidden_size": 64,
                 "intermediate_size": 96, "num_hidden_layers": 2, "num_attention_heads": 4,
                 "num_key_value_heads": 2, "max_position_embeddings": 128}
    (tmp_path / "config.json").write_text(json.dumps(hf_config))
    reference = getattr(transformers, architecture.replace("ForCausalLM", "Config"))(**hf_config)
    assert read_model_config(str(tmp_path)).head_dim == reference.head_dim  # 16, and 128


def test_gguf_rope_scaling_keys(tmp_path):
    yarn = write_tiny_gguf(tmp_path / "yarn.gguf", **{"llama.rope.scaling.type": "yarn",
                                                      "llama.rope.scaling.factor": 4.0,
                                                      "llama.rope.scaling.original_context_length": 32})
    assert read_gguf_config(str(yarn)).rope_scaling == {
        "rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 32}
    longrope = write_tiny_gguf(tmp_path / "longrope.gguf", **{"llama.rope.scaling.type": "longrope"})
    with pytest.raises(ModelLoadError, match="rope scaling 'longrope' is not supported"):
        read_gguf_config(str(longrope))


@pytest.mark.parametrize(("metadata", "words"), [
    ({"llama.attention.head_count": 0}, "llama.attention.head_count is 0"),
    ({"llama.context_length": "abc"}, "llama.context_length is 'abc', not a whole number"),
])
def test_gguf_hyper_parameters_that_are_no_numbers(tmp_path, metadata, words):
    path = write_tiny_gguf(tmp_path / "bad.gguf", **metadata)
    with pytest.raises(ModelLoadError, match=words):
        read_gguf_config(str(path))


VOCAB = ["a", "b", "c", "ab", "abc", "Ġ", "x", "<|begin_of_text|>"]
TOKENIZER = {"tokenizer.ggml.model": "gpt2", "tokenizer.ggml.tokens": VOCAB,
             "tokenizer.ggml.merges": ["a b"], "tokenizer.ggml.bos_token_id": 7}


def _gguf_tokenizer(tmp_path, metadata):
    """The tokenizer of a GGUF file holding `metadata` (TOKENIZER, changed)."""
    from inferlab.models.gguf import open_gguf
    from inferlab.models.tokenizer import load_gguf_tokenizer

    path = str(write_tiny_gguf(tmp_path / "tok.gguf", **metadata))
    return load_gguf_tokenizer(open_gguf(path), path)


@pytest.mark.parametrize(("change", "words"), [
    ({"tokenizer.ggml.tokens": None}, "tokenizer.ggml.tokens is missing"),
    ({"tokenizer.ggml.merges": None}, "tokenizer.ggml.merges is missing"),
    ({"tokenizer.ggml.token_type": [1, 1]}, "token_type has 2 entries for 8 tokens"),
    ({"tokenizer.ggml.bos_token_id": 60000}, "bos_token_id is 60000, outside the 8 tokens"),
])
def test_gguf_tokenizer_metadata_that_cannot_be_read(tmp_path, change, words):
    metadata = {k: v for k, v in {**TOKENIZER, **change}.items() if v is not None}
    with pytest.raises(ModelLoadError, match=words):
        _gguf_tokenizer(tmp_path, metadata)


@pytest.mark.parametrize(("pre", "tokens"), [
    # GPT-2's rule: only what the merges reach ("abc" is in the vocabulary, no merge makes it)
    ("gpt2", ["ab", "c", "Ġ", "x", "ab", "c"]),
    # llama.cpp's for Llama 3: a word that is a token stays whole (tokenizers' ignore_merges),
    # and BOS goes first
    ("llama-bpe", ["<|begin_of_text|>", "abc", "Ġ", "x", "ab", "c"]),
])
def test_gguf_llama3_vocabularies_tokenize_as_llama_cpp(tmp_path, pre, tokens):
    tokenizer = _gguf_tokenizer(tmp_path, {**TOKENIZER, "tokenizer.ggml.pre": pre})
    assert [VOCAB[i] for i in tokenizer.encode("abc xabc")] == tokens


@pytest.mark.parametrize("alias, dtype, kv_bytes", [("half", "float16", 23_040), ("float", "float32", 46_080)])
def test_info_takes_vllms_dtype_aliases(capsys, alias, dtype, kv_bytes):
    """As generate and serve take them (they once were an invalid choice for info alone)."""
    assert main(["info", "--json", "--dtype", alias]) == 0
    info = json.loads(capsys.readouterr().out)
    assert (info["dtype"], info["kv_bytes_per_token"]) == (dtype, kv_bytes)


def test_info_dtype_auto_is_what_serve_picks_here(capsys):
    """vLLM's default --dtype; serve resolves it to bf16 where the CPU has fast bf16, else fp32."""
    from inferlab.engine.platform import cpu_has_fast_bf16

    assert main(["info", "--json", "--dtype", "auto"]) == 0
    info = json.loads(capsys.readouterr().out)
    expected = ("bfloat16", 23_040) if cpu_has_fast_bf16() else ("float32", 46_080)
    assert (info["dtype"], info["kv_bytes_per_token"]) == expected
