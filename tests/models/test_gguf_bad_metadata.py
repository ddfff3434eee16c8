"""GGUF metadata of the wrong type or size is a one-line error naming the file and the key, found
by a tester: lengths and counts read past the file allocated many times its size before failing,
a list or a string where a number goes was a TypeError or ValueError traceback, "false" turned
BOS on, a block_count of 1e12 hung `info`, and ModelConfig's own checks named no file."""

from __future__ import annotations

import os
import struct
import threading
import tracemalloc

import pytest

from inferlab.errors import ModelLoadError
from inferlab.models.gguf_reader import MAX_ARRAY_VALUES, GGUFFile
from inferlab.models.loader import load_tokenizer, read_model_config

from .raw_gguf import TOKENS, Raw, llama_metadata, write_gguf

STRING, ARRAY = 8, 9
TAIL = 2 << 20  # zeros after the metadata, where a count that lies reads on


def _lying(tmp_path, value: Raw):
    """A GGUF with no tensors whose last metadata value is `value`, then TAIL zero bytes: read
    as lengths they are empty strings, as arrays empty ones."""
    path = write_gguf(tmp_path / "m.gguf", tensors=[], metadata={**llama_metadata(), "x": value})
    with open(path, "ab") as f:
        f.write(bytes(TAIL))
    return path


@pytest.mark.parametrize(("value", "words"), [
    (Raw(struct.pack("<IQ", STRING, 2**40)), "the file ends inside its GGUF header"),
    (Raw(struct.pack("<IIQ", ARRAY, STRING, 2**40)), f"array of {2**40} values past end of file"),
    (Raw(struct.pack("<IIQ", ARRAY, ARRAY, 2**40)), f"array of {2**40} values past end of file"),
])
def test_a_length_or_count_past_the_file_fails_before_allocating(tmp_path, value, words):
    path = _lying(tmp_path, value)
    tracemalloc.start()
    try:
        with pytest.raises(ModelLoadError, match=f"{path}: .*{words}"):
            GGUFFile(str(path))
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < TAIL // 8, f"{peak} bytes allocated for a {os.path.getsize(path)}-byte file"


def _header_cut(tmp_path, size: int):
    path = write_gguf(tmp_path / "m.gguf")
    path.write_bytes(path.read_bytes()[:size])
    return path


def _counting(tmp_path, at: int, count: int):
    """The tiny model with the header's tensor count (at 8) or field count (at 16) replaced."""
    path = write_gguf(tmp_path / "m.gguf")
    blob = path.read_bytes()
    path.write_bytes(blob[:at] + struct.pack("<Q", count) + blob[at + 8:])
    return path


# 8 bytes: magic and version; 300 and 400: inside the metadata (past what its counts need, so
# those are not what is refused)
@pytest.mark.parametrize("size", [8, 300, 400])
def test_a_file_cut_inside_its_header_says_so(tmp_path, size, one_line_error):
    """It was "not a readable GGUF file (unpack_from requires a buffer of at least 16 bytes
    ...)", or "(string past end of file)": Python's words, not the file's."""
    path = _header_cut(tmp_path, size)
    words = f"{path}: the file ends inside its GGUF header ({size} bytes; truncated?)"
    assert words in one_line_error("info", path)


@pytest.mark.parametrize(("at", "what"), [(8, "tensor"), (16, "metadata field")])
@pytest.mark.parametrize("count", [2**62, 10**7])
def test_a_count_past_what_the_file_holds_says_so(tmp_path, at, what, count, one_line_error):
    path = _counting(tmp_path, at, count)
    words = f"{path}: {what} count {count} is more than a file of {path.stat().st_size} bytes can hold"
    assert words in one_line_error("info", path)


def test_an_array_of_more_values_than_a_tokenizer_needs_is_refused(tmp_path):
    """It fits in the file, but as a list of Python ints it took 16x the file (found by a
    reviewer)."""
    count = MAX_ARRAY_VALUES + 1
    big = Raw(struct.pack("<IIQ", ARRAY, 0, count) + bytes(count))  # uint8s
    path = write_gguf(tmp_path / "m.gguf", tensors=[], metadata={**llama_metadata(), "x": big})
    with pytest.raises(ModelLoadError, match=f"not a readable GGUF file .*array of {count} values"):
        GGUFFile(str(path))


def test_arrays_nested_past_the_stack_are_a_load_error(tmp_path):
    nested = Raw(struct.pack("<IIQ", ARRAY, ARRAY, 1) + struct.pack("<IQ", ARRAY, 1) * 5000
                 + struct.pack("<IQ", STRING, 0))
    path = write_gguf(tmp_path / "m.gguf", tensors=[], metadata={**llama_metadata(), "x": nested})
    with pytest.raises(ModelLoadError, match=f"{path}: not a readable GGUF file"):
        GGUFFile(str(path))


def _read_all(path) -> None:
    """Config and tokenizer, as `generate` reads them."""
    read_model_config(str(path))
    load_tokenizer(str(path))


ALL_CONTROL = [7] * len(TOKENS)
WRONG_TYPES = {
    "architecture as a list": ({"general.architecture": ["llama"]},
                               "general.architecture is ['llama'], not an architecture name"),
    "pre-tokenizer as a list": ({"tokenizer.ggml.pre": ["gpt2"]},
                                "tokenizer.ggml.pre is ['gpt2'], not a pre-tokenizer name"),
    "vocab_size as text": ({"llama.vocab_size": "sixteen"},
                           "llama.vocab_size is 'sixteen', not a whole number"),
    "eos as a list": ({"tokenizer.ggml.eos_token_id": [2]},
                      "tokenizer.ggml.eos_token_id is [2], not a token id"),
    "eos as text": ({"tokenizer.ggml.eos_token_id": "</s>"},
                    "tokenizer.ggml.eos_token_id is '</s>', not a token id"),
    "bos as text": ({"tokenizer.ggml.bos_token_id": "<s>"},
                    "tokenizer.ggml.bos_token_id is '<s>', not a token id"),
    "add_bos_token as text": ({"tokenizer.ggml.add_bos_token": "false"},
                              "tokenizer.ggml.add_bos_token is 'false', not true or false"),
    "token types as text": ({"tokenizer.ggml.token_type": ["3"] * len(TOKENS)},
                            "tokenizer.ggml.token_type holds '3', not a list of token types"),
    "token type 7": ({"tokenizer.ggml.token_type": ALL_CONTROL},
                     "tokenizer.ggml.token_type holds 7, not a list of token types (whole "
                     "numbers 0 to 6)"),
    "eos past the vocabulary": ({"tokenizer.ggml.eos_token_id": 5000},
                                f"tokenizer.ggml.eos_token_id is 5000, outside the {len(TOKENS)} tokens"),
    "chat template as a number": ({"tokenizer.chat_template": 5},
                                  "tokenizer.chat_template is 5, not a chat template"),
    "block_count as text": ({"llama.block_count": "1"}, "llama.block_count is '1', not a whole number"),
    "block_count as a float": ({"llama.block_count": 1.5}, "llama.block_count is 1.5, not a whole number"),
    "rms eps as text": ({"llama.attention.layer_norm_rms_epsilon": "1e-5"},
                        "llama.attention.layer_norm_rms_epsilon is '1e-5', not a number"),
    "block_count 1e12": ({"llama.block_count": 10**12},
                         "llama.block_count is 1000000000000, but the file holds tensors for "
                         "layers 0 to 0 (1 in all)"),
    "block_count 2": ({"llama.block_count": 2}, "llama.block_count is 2, but the file holds "
                                                "tensors for layers 0 to 0"),
    "a split GGUF's first shard": ({"split.count": 3}, "one of the 3 shards of a split GGUF; "
                                   "merge them into one file first"),  # a layer count mismatch
    # ModelConfig's own checks, which said "config:"
    "block_count -1": ({"llama.block_count": -1}, "num_layers must be positive, got -1"),
    "context_length 0": ({"llama.context_length": 0}, "max_position_embeddings must be positive"),
    "3 kv heads for 4": ({"llama.attention.head_count_kv": 3},
                         "num_attention_heads (4) is not a multiple of num_key_value_heads (3)"),
    "rope type longrope": ({"llama.rope.scaling.type": "longrope"},
                           "rope scaling 'longrope' is not supported"),
}


@pytest.mark.parametrize("case", list(WRONG_TYPES))
def test_metadata_of_the_wrong_type_or_value_is_named(tmp_path, case):
    change, words = WRONG_TYPES[case]
    path = write_gguf(tmp_path / "m.gguf", metadata=llama_metadata(**change))
    with pytest.raises(ModelLoadError) as error:
        _read_all(path)
    assert str(error.value).startswith(f"{path}: ") and words in str(error.value)


@pytest.mark.parametrize("case", ["architecture as a list", "chat template as a number",
                                  "eos past the vocabulary",
                                  "block_count 1e12", "block_count -1"])
def test_info_on_such_a_file_is_one_line(tmp_path, case, one_line_error):
    change, words = WRONG_TYPES[case]
    path = write_gguf(tmp_path / "m.gguf", metadata=llama_metadata(**change))
    assert f"error: {path}: " in (line := one_line_error("info", path)) and words in line


def test_add_bos_token_as_a_bool_is_taken(tmp_path):
    metadata = llama_metadata(**{"tokenizer.ggml.add_bos_token": True,
                                 "tokenizer.ggml.bos_token_id": 0})
    path = write_gguf(tmp_path / "m.gguf", metadata=metadata)
    assert load_tokenizer(str(path)).encode("b") == [0, 1]


def test_a_device_is_not_a_regular_file(tmp_path):
    link = tmp_path / "zero.gguf"
    link.symlink_to(os.devnull)
    for read in (read_model_config, load_tokenizer):  # "no such file", for a link that is there
        with pytest.raises(ModelLoadError, match=f"^{link}: not a regular file$"):
            read(str(link))


def test_a_fifo_is_refused_before_it_is_opened(tmp_path):
    """With no writer, opening it blocked `info` and `generate` for good."""
    fifo = tmp_path / "m.gguf"
    os.mkfifo(fifo)
    errors = []

    def read() -> None:
        with pytest.raises(ModelLoadError) as error:
            read_model_config(str(fifo))
        errors.append(str(error.value))

    thread = threading.Thread(target=read, daemon=True)
    thread.start()
    thread.join(5)
    blocked = thread.is_alive()
    if blocked:  # a writer lets the open return
        os.close(os.open(fifo, os.O_WRONLY | os.O_NONBLOCK))
        thread.join(5)
    assert not blocked, "opened the FIFO"
    assert errors == [f"{fifo}: not a regular file"]
