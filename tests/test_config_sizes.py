"""Sizes and lengths as users write them: bytes for the KV cache (--kv-cache-memory,
LLM(kv_cache_memory=...)) and vLLM's human-readable integers for --max-model-len."""

from __future__ import annotations

import argparse

import pytest

from inferlab.config import parse_bytes
from inferlab.engine.args import add_engine_args, engine_config_from_args
from inferlab.errors import InferlabError


@pytest.mark.parametrize(("size", "expected"), [
    (1e9, 10**9),  # a float that is a whole number of bytes, as Python writes 1 GB
    (1048576.0, 2**20),
    ("1TB", 10**12), ("2tb", 2 * 10**12), ("1TiB", 2**40), ("1GB", 10**9), ("1GiB", 2**30),
    # a bare suffix as vLLM's human_readable_int (and --max-model-len) reads it
    ("1t", 10**12), ("1g", 10**9), ("1.1g", 11 * 10**8), ("2k", 2000),  # lowercase: decimal
    ("1T", 2**40), ("1G", 2**30), ("2K", 2048), ("0.5KiB", 512),  # uppercase: binary
])
def test_sizes_that_are_read(size, expected):
    assert parse_bytes(size) == expected


@pytest.mark.parametrize(("size", "message"), [
    (1.5, "a size in bytes must be a whole number, got 1.5"),
    (float("inf"), "a size in bytes must be a whole number, got inf"),
    (True, "a size must be a number of bytes or a string like 2GiB, got True"),
    (None, "a size must be a number of bytes or a string like 2GiB, got None"),
    ("1PB", "cannot read '1PB' as a size"),
    ("1.5", "a size in bytes must be a whole number, got '1.5'"),  # not 1 byte, cut down
    ("0.4", "a size in bytes must be a whole number, got '0.4'"),
    ("0.0005KB", "a size in bytes must be a whole number, got '0.0005KB'"),
    ("0.5K", "decimals only with k, m, g, t or a unit spelled out"),  # as vLLM refuses it
])
def test_sizes_that_are_refused_in_one_line(size, message):
    with pytest.raises(InferlabError, match=message.replace(".", r"\.")):
        parse_bytes(size)


def test_a_size_error_names_the_flag_it_came_by():
    with pytest.raises(InferlabError) as caught:
        parse_bytes("0.5", "--kv-cache-memory")
    assert str(caught.value).startswith("--kv-cache-memory: a size in bytes must be a whole number")


def _max_model_len(text: str) -> int | None:
    parser = argparse.ArgumentParser()
    add_engine_args(parser)
    return engine_config_from_args(parser.parse_args(["--max-model-len", text])).max_model_len


@pytest.mark.parametrize(("text", "expected"), [
    ("8192", 8192),
    ("32k", 32_000), ("25.6k", 25_600), ("1m", 10**6),  # lowercase: decimal, as in vLLM
    ("32K", 32_768), ("2M", 2 * 2**20), ("1G", 2**30),  # uppercase: binary
    (" 16k ", 16_000),
])
def test_max_model_len_takes_vllms_human_readable_integers(text, expected):
    assert _max_model_len(text) == expected


@pytest.mark.parametrize("text", ["1.5K", "1.5", "32kb", "abc", ""])
def test_max_model_len_refuses_the_rest_as_a_usage_error(text, capsys):
    with pytest.raises(SystemExit) as exit_info:
        _max_model_len(text)
    assert exit_info.value.code == 2
    assert "--max-model-len" in capsys.readouterr().err
