"""The KV pool at start: a budget under one block is one clear error, before anything is fitted
to it (it was a warning that the context fell to 0 tokens, then "num_blocks=0"), and the pool's
size and concurrency are logged, as vLLM logs them."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest

from inferlab.engine.llm import LLM
from inferlab.errors import InferlabError
from tests.models.tiny_tokenizer import save_tiny_llama

# the tiny Llama in fp32: k and v x 2 layers x 2 KV heads x 16 head dim x 4 bytes, 16 tokens a block
BLOCK_BYTES = 2 * 2 * 2 * 16 * 4 * 16  # 8 KiB
POSITIONS = 128  # its max_position_embeddings


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory) -> str:
    return save_tiny_llama(tmp_path_factory.mktemp("kv-pool"))


def test_less_than_a_block_is_one_error_naming_the_minimum(model_dir, caplog):
    with caplog.at_level(logging.INFO, logger="inferlab"), pytest.raises(
            InferlabError, match=r"^a KV cache of 1\.00 KiB holds no block: one block of 16 tokens "
                                 r"takes 8,192 bytes \(8\.00 KiB\); give --kv-cache-memory at least "
                                 r"that$"):
        LLM(model_dir, dtype="float32", kv_cache_memory="1KiB")
    assert not [r for r in caplog.records if r.levelno >= logging.WARNING]


def test_on_a_cpu_a_block_past_the_default_budget_is_not_told_to_raise_gpu_memory(model_dir):
    """The CPU's budget is a fixed 2 GiB, which --gpu-memory-utilization does not change; the
    hint once led with that flag. 2**30 tokens x 512 bytes (the tiny Llama's) = 512 GiB."""
    with pytest.raises(InferlabError) as caught:
        LLM(model_dir, dtype="float32", device="cpu", block_size=2**30)
    assert str(caught.value) == (
        "a KV cache of 2.00 GiB holds no block: one block of 1073741824 tokens takes "
        "549,755,813,888 bytes (512.00 GiB); use a smaller --block-size, or give "
        "--kv-cache-memory at least that (on a GPU, a higher --gpu-memory-utilization also makes "
        "the cache larger)")


def test_one_block_byte_short_is_refused_and_one_block_serves(model_dir):
    with pytest.raises(InferlabError, match="holds no block"):
        LLM(model_dir, dtype="float32", kv_cache_memory=BLOCK_BYTES - 1)
    assert LLM(model_dir, dtype="float32", kv_cache_memory=BLOCK_BYTES).engine.max_model_len == 16


@pytest.mark.parametrize(("max_model_len", "line"), [
    # 1 MiB / 8 KiB = 128 blocks; a request of 128 tokens takes 8 of them
    (None, "KV cache: 128 blocks of 16 tokens (2,048 tokens, 1.00 MiB): 16.0 requests of 128 "
           "tokens at once"),
    # 100 tokens take 7 blocks (the last one part full): 128 / 7
    (100, "KV cache: 128 blocks of 16 tokens (2,048 tokens, 1.00 MiB): 18.3 requests of 100 "
          "tokens at once"),
])
def test_the_pool_is_logged_at_start(model_dir, caplog, max_model_len, line):
    with caplog.at_level(logging.INFO, logger="inferlab.engine"):
        LLM(model_dir, dtype="float32", kv_cache_memory=2**20, max_model_len=max_model_len)
    assert line in [r.getMessage() for r in caplog.records]


def test_a_float_size_of_whole_bytes_is_taken(model_dir):
    """LLM(kv_cache_memory=1e9) was a TypeError from the size parser."""
    assert LLM(model_dir, dtype="float32", kv_cache_memory=1048576.0).num_kv_blocks == 128
    with pytest.raises(InferlabError, match="a size in bytes must be a whole number, got 1048576.5"):
        LLM(model_dir, dtype="float32", kv_cache_memory=1048576.5)


@pytest.mark.parametrize(("option", "value"), [
    ("max_num_batched_tokens", 2.5), ("max_num_seqs", 1.5), ("block_size", 16.0),
    ("block_size", "16"), ("max_model_len", True), ("seed", 0.5)])
def test_engine_numbers_that_are_not_whole_are_refused_by_name(model_dir, option, value):
    """Once a TypeError at the first step (2.5), or "unknown engine option: unsupported operand
    type(s) for &" (16.0)."""
    with pytest.raises(InferlabError, match=rf"^{option} must be a whole number, got {value!r}$"):
        LLM(model_dir, dtype="float32", **{option: value})


def test_a_model_that_is_no_path_is_refused_and_a_path_object_is_taken(model_dir):
    """LLM(model=123) was posixpath's TypeError; a pathlib.Path loads, as vLLM's LLM takes it."""
    with pytest.raises(InferlabError, match=r"^model must be a path, got int 123$"):
        LLM(123, dtype="float32")
    assert LLM(Path(model_dir), dtype="float32", kv_cache_memory=2**20).num_kv_blocks == 128
