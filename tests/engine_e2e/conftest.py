from __future__ import annotations

import pytest

from inferlab.engine.llm_engine import LLM


@pytest.fixture(scope="session")
def make_llm(smollm_fp32):
    """LLM engines over the one fp32 copy of the embedded model, each with its own KV cache."""

    def make(**engine_args) -> LLM:
        engine_args.setdefault("kv_cache_memory", "64MiB")
        return LLM(loaded=smollm_fp32, dtype="float32", **engine_args)

    return make


@pytest.fixture(scope="session")
def wiki_text(shared_file) -> str:
    return shared_file("wikitext-2-raw/wiki.test.raw").read_text(encoding="utf-8")
