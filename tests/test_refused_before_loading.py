"""What the flags and the model's config.json (or GGUF metadata) decide is refused before the
slow part of a start: flag errors and a missing model before torch is imported (seconds, 15 s
on a busy host), what the model's shape rules out before its weights load (40-56 s once)."""

from __future__ import annotations

import ast
import socket
import subprocess
import sys

import pytest

from inferlab.config import EngineConfig
from inferlab.errors import InferlabError

# fp32 KV bytes a token of the embedded SmolLM2-135M: K and V x 30 layers x 3 KV heads x 64 x 4 B
FP32_BYTES_PER_TOKEN = 2 * 30 * 3 * 64 * 4  # 46,080
GiB = 2**30

REFUSALS = """
import sys
from inferlab.cli import main
codes = [main(argv) for argv in {argvs!r}]
print(codes, "torch" in sys.modules)
"""


def test_flag_errors_and_a_missing_model_are_refused_before_torch_is_imported(tmp_path):
    missing = str(tmp_path / "missing")
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        argvs = [["serve", "--block-size", "0"], ["serve", "--port", "-1"],
                 ["serve", "--max-num-seqs", "0"], ["serve", missing],
                 ["serve", "--host", "127.0.0.1", "--port", str(port)],
                 ["generate", "hi", missing], ["generate", "hi", "--block-size", "3"],
                 ["chat", "--message", "hi", missing]]
        run = subprocess.run([sys.executable, "-c", REFUSALS.format(argvs=argvs)],
                             capture_output=True, text=True, timeout=120)
    assert run.returncode == 0, run.stderr
    codes, torch_imported = run.stdout.strip().rsplit(" ", 1)
    assert ast.literal_eval(codes) == [2] * len(argvs)
    expected = [  # the start of each line: the OS's words follow "Address already in use"
        "error: block_size must be a power of two, got 0",
        "error: port must be in [0, 65535], got -1",
        "error: max_num_seqs must be at least 1, got 0",
        f"error: {missing}: no such file or directory",
        f"error: cannot listen on 127.0.0.1:{port}: Address already in use",
        f"error: {missing}: no such file or directory",
        "error: block_size must be a power of two, got 3",
        f"error: {missing}: no such file or directory",
    ]
    lines = run.stderr.splitlines()
    assert len(lines) == len(expected) and all(map(str.startswith, lines, expected)), lines
    assert torch_imported == "False"


@pytest.fixture
def no_weights(monkeypatch):
    """An engine that reaches for the weights fails the test."""
    import inferlab.engine.llm_engine as llm_engine

    def load_model(*args, **kwargs):
        raise AssertionError("the weights were loaded before the refusal")

    monkeypatch.setattr(llm_engine, "load_model", load_model)
    monkeypatch.setattr(llm_engine, "available_memory_bytes", lambda device: GiB)


@pytest.mark.parametrize("flags, message", [
    ({"max_model_len": 1_000_000}, r"^max_model_len 1000000 is over the model's 8192 positions$"),
    # one block of 16 tokens: 16 x 46,080 = 737,280 bytes
    ({"kv_cache_memory_bytes": 1000}, r"^a KV cache of 1000 B holds no block: one block of 16 "
                                      r"tokens takes 737,280 bytes \(720\.00 KiB\)"),
    # the CPU's 2 GiB default against one block of 2**20 tokens: 48,318,382,080 bytes
    ({"block_size": 2**20}, r"^a KV cache of 2\.00 GiB holds no block: one block of 1048576 "
                            r"tokens takes 48,318,382,080 bytes"),
    # 2 GiB buys 2,912 whole blocks (2,146,959,360 bytes), over the 1 GiB free
    ({"kv_cache_memory_bytes": 2 * GiB}, r"^a KV cache of 2\.00 GiB \(--kv-cache-memory\) does not "
                                         r"fit in the 1\.00 GiB this cpu has available; choose"),
    # 1 MiB buys one block: 16 tokens
    ({"max_model_len": 8192, "kv_cache_memory_bytes": 2**20},
     r"^max_model_len 8192 does not fit in the KV cache: 720\.00 KiB holds 16 tokens"),
])
def test_what_the_models_config_rules_out_is_refused_before_the_weights_load(no_weights, flags,
                                                                             message):
    from inferlab.engine.llm_engine import LLMEngine

    with pytest.raises(InferlabError, match=message):
        LLMEngine(EngineConfig(dtype="float32", device="cpu", **flags))


def test_a_kv_cache_that_fits_only_without_the_weights_is_refused_once_they_are_in(
        smollm_fp32, monkeypatch):
    """Before the weights, 1 GiB is free; once they are in, 32 MiB: 64 MiB (91 blocks,
    67,092,480 bytes) is refused then, not zeroed into the OOM killer."""
    import inferlab.engine.llm_engine as llm_engine

    free = iter([GiB, 32 * 2**20])
    monkeypatch.setattr(llm_engine, "available_memory_bytes", lambda device: next(free))
    with pytest.raises(InferlabError, match=r"^a KV cache of 63\.98 MiB \(--kv-cache-memory\) does "
                                            r"not fit in the 32\.00 MiB this cpu has available "
                                            r"after the weights; choose"):
        llm_engine.LLMEngine(EngineConfig(dtype="float32", device="cpu",
                                          kv_cache_memory_bytes=64 * 2**20), loaded=smollm_fp32)
