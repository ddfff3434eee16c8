from __future__ import annotations

import dataclasses

import pytest

from inferlab.engine.llm import LLM
from inferlab.engine.model_runner import ModelRunner


def _llm_maker(loaded, dtype: str):
    """make(**engine_args) -> an LLM over `loaded` (shared; `dtype` the engine's name of the
    dtype it was loaded in), with its own 64 MiB KV cache."""

    def make(**engine_args) -> LLM:
        engine_args.setdefault("kv_cache_memory", "64MiB")
        if "max_num_batched_tokens" in engine_args:  # a budget below the batch is refused
            engine_args.setdefault("max_num_seqs", min(256, engine_args["max_num_batched_tokens"]))
        return LLM(loaded=loaded, dtype=dtype, **engine_args)

    return make


@pytest.fixture(scope="session")
def make_llm(smollm_fp32):
    """LLM engines over the one fp32 copy of the embedded model: transformers' fp32 twin is
    the reference of their numerics."""
    return _llm_maker(smollm_fp32, "float32")


@pytest.fixture(scope="session")
def make_fast_llm(embedded_gguf):
    """LLM engines in the platform's own dtype (bf16 where the CPU has AMX, whose decode steps
    are several times faster than fp32's), for tests whose reference is not fp32 numerics:
    a format, an invariant, the engine against itself."""
    import torch

    from inferlab.engine.platform import resolve_dtype
    from inferlab.models.loader import load_model

    return _llm_maker(load_model(None, resolve_dtype("auto", torch.device("cpu"))), "auto")


@pytest.fixture(scope="session")
def wiki_text(shared_file) -> str:
    return shared_file("wikitext-2-raw/wiki.test.raw").read_text(encoding="utf-8")


def use_graph_runner(llm: LLM, max_batch: int) -> list[int]:
    """Swap in a runner whose decode steps take the CUDA-graph path (on CPU: its static buffers
    and padding, run eagerly); returns a list that grows by each graphed step's batch size."""
    engine = llm.engine
    config = dataclasses.replace(engine.runner.config, max_graph_batch_size=max_batch,
                                 max_model_len=engine.max_model_len)
    engine.runner = ModelRunner(engine.loaded.model, config)
    sizes: list[int] = []
    graphed = engine.runner.graphed
    run = graphed.run
    graphed.run = lambda chunks, device: sizes.append(len(chunks)) or run(chunks, device)
    return sizes
