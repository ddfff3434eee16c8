"""Decode steps through the CUDA-graph path (static buffers, batches padded to a capture size)
give the tokens of the plain path. On CPU the path runs eagerly; a GPU replays real graphs."""

from __future__ import annotations

import dataclasses

import pytest
import torch

from inferlab.engine.llm import LLM
from inferlab.engine.sampling_params import SamplingParams

from .conftest import use_graph_runner

PROMPTS = ["The capital of France is", "def fibonacci(n):", "Once upon a time",
           "1, 2, 3, 4,", "Water boils at"]
# Different lengths, so the batch shrinks 5 -> 1 and runs padded at sizes 8, 4, 2 and 1.
PARAMS = [SamplingParams(temperature=0, max_tokens=3 + 3 * i, ignore_eos=True, logprobs=1)
          for i in range(4)]
PARAMS.append(SamplingParams(temperature=0.9, top_p=0.9, seed=7, max_tokens=16, ignore_eos=True,
                             logprobs=2))


def _outputs(llm: LLM) -> list[tuple[list[int], list]]:
    outs = llm.generate(PROMPTS, PARAMS)
    return [(o.outputs[0].token_ids, o.outputs[0].logprobs) for o in outs]


@pytest.fixture(params=["float32", "bfloat16"])
def llm_pair(request, make_llm):
    if request.param == "float32":
        return make_llm(), make_llm()
    return (LLM(dtype="bfloat16", kv_cache_memory="64MiB"),
            LLM(dtype="bfloat16", kv_cache_memory="64MiB"))


def test_graph_path_gives_the_plain_paths_tokens(llm_pair) -> None:
    plain, graphed = llm_pair
    sizes = use_graph_runner(graphed, max_batch=8)
    expected = _outputs(plain)
    got = _outputs(graphed)
    assert [tokens for tokens, _ in got] == [tokens for tokens, _ in expected]
    # logprobs too (a cache entry overwritten by a padding row would move them): a padded
    # batch is a larger matmul, which may sum in another order, as any other batch may
    for (_, ours_lps), (_, ref_lps) in zip(got, expected, strict=True):
        for ours, ref in zip(ours_lps, ref_lps, strict=True):
            assert ours.token_id == ref.token_id and ours.rank == ref.rank
            assert [t for t, _ in ours.top] == [t for t, _ in ref.top]
            assert ours.logprob == pytest.approx(ref.logprob, abs=1e-4)
    assert sizes and max(sizes) == 5 and min(sizes) == 1  # decode steps took the graph path
    stats = graphed.engine.scheduler.stats()
    assert stats.num_free_blocks == graphed.num_kv_blocks


def test_batches_above_the_largest_graph_run_eagerly(make_llm) -> None:
    llm = make_llm()
    sizes = use_graph_runner(llm, max_batch=2)
    plain = make_llm()
    assert [t for t, _ in _outputs(llm)] == [t for t, _ in _outputs(plain)]
    assert sizes and max(sizes) == 2  # 5, 4 and 3 sequences took the plain path


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_replayed_graphs_give_the_eager_tokens_on_the_gpu() -> None:
    pytest.importorskip("triton")
    eager = LLM(device="cuda", dtype="float32", kv_cache_memory="256MiB", enforce_eager=True)
    graphed = LLM(device="cuda", dtype="float32", kv_cache_memory="256MiB", max_num_seqs=8)
    assert graphed.engine.runner.graphed.graphs.graphs  # captured
    greedy = [dataclasses.replace(p, temperature=0, logprobs=None) for p in PARAMS]
    assert ([o.outputs[0].token_ids for o in graphed.generate(PROMPTS, greedy)]
            == [o.outputs[0].token_ids for o in eager.generate(PROMPTS, greedy)])
