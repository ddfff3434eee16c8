"""A request whose constraints leave no token to sample at some step ends there, with
finish_reason "stop" as a guide's dead end does, and its KV blocks free; the sampler once named
token 0 (a token nobody allowed) and the request went on. The case add_request can refuse (every
allowed token a one-token bad word) is refused there: tests/engine_e2e/test_sampling.py."""

from __future__ import annotations

import pytest
import torch

from inferlab.engine.llm import LLM
from inferlab.engine.request import NO_TOKEN
from inferlab.engine.sampler import SamplingBatch, sample
from inferlab.engine.sampling_params import SamplingParams
from inferlab.engine.spec_decode import SpeculativeConfig
from inferlab.kernels import cpu_ops
from tests.models.tiny_tokenizer import VOCAB, save_tiny_llama

W5, W7, EOS = VOCAB["w5"], VOCAB["w7"], VOCAB["</s>"]
PROMPT = list(range(3, 13))  # 10 token ids of the tiny vocabulary
# "w5" is one token: after it, "w5 w5" bars the only token allowed_token_ids leaves
DEAD_END = SamplingParams(max_tokens=4, temperature=0, allowed_token_ids=[W5], bad_words=["w5 w5"])


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory) -> str:
    return save_tiny_llama(tmp_path_factory.mktemp("barred"))


@pytest.fixture
def llm(model_dir) -> LLM:
    return LLM(model_dir, dtype="float32", kv_cache_memory="1MiB")


@pytest.mark.parametrize("c_kernels", [True, False])
@pytest.mark.parametrize("temperature", [0.0, 1.0])
def test_a_row_its_constraints_bar_entirely_gets_no_token(c_kernels, temperature, monkeypatch):
    """Row 0 may sample only 1 and 2 and both are suppressed: nothing is left. Row 1 keeps 2
    (logit 0.5) of the same set; row 2 has no constraint and every logit at -inf, the model's
    doing: it is sampled as before (a token of the vocabulary)."""
    if not c_kernels:
        monkeypatch.setattr(cpu_ops, "available", lambda *tensors: False)
    logits = torch.tensor([[3.0, 1.0, 0.5, 2.0]] * 2 + [[float("-inf")] * 4])
    params = [SamplingParams(temperature=temperature, logprobs=1)] * 3
    batch = SamplingBatch(params, [None] * 3, [[]] * 3, [[]] * 3, suppressed_ids=[[1, 2], [1], []],
                          allowed_ids=[[1, 2], [1, 2], None])
    tokens, logprobs = sample(logits, batch)
    assert tokens.tolist()[:2] == [NO_TOKEN, 2]
    assert 0 <= tokens.tolist()[2] < 4
    assert logprobs[1].token_id == 2


@pytest.mark.parametrize("params", [
    DEAD_END,
    SamplingParams(max_tokens=4, temperature=1.0, seed=7, allowed_token_ids=[W5], bad_words=["w5 w5"]),
    # EOS is allowed, but not before min_tokens: after "w5" nothing is left either
    SamplingParams(max_tokens=4, temperature=0, min_tokens=3, allowed_token_ids=[W5, EOS],
                   bad_words=["w5 w5"], logprobs=2),
    # the dead end falls on max_tokens: the output is one token short of it, ended by the dead end
    SamplingParams(max_tokens=2, temperature=0, allowed_token_ids=[W5], bad_words=["w5 w5"]),
], ids=["greedy", "seeded", "min_tokens", "at_max_tokens"])
def test_a_request_at_a_dead_end_stops_without_a_token(llm, params):
    free_blocks = llm.engine.scheduler.block_manager.num_free_blocks
    out = llm.generate([PROMPT], params)[0].outputs[0]
    assert out.token_ids == [W5] and out.text == " w5"  # a word-level tokenizer's words join with spaces
    assert (out.finish_reason, out.stop_reason) == ("stop", None)
    if params.logprobs is not None:
        assert [entry.token_id for entry in out.logprobs] == [W5]
    assert not llm.engine.has_unfinished_requests()
    assert llm.engine.scheduler.block_manager.num_free_blocks == free_blocks
    assert llm.engine.counters.requests_finished == {"stop": 1}


def test_a_dead_end_ends_only_its_own_request_and_streams_no_token(llm):
    """Step by step: the dead-ended request's deltas add up to "w5" alone, and the request
    batched with it runs to max_tokens."""
    engine = llm.engine
    engine.add_request(PROMPT, DEAD_END, "dead")
    engine.add_request(PROMPT, SamplingParams(max_tokens=4, temperature=0, ignore_eos=True), "free")
    deltas: dict[str, list[int]] = {"dead": [], "free": []}
    finals = {}
    while engine.has_unfinished_requests():
        for out in engine.step():
            deltas[out.request_id] += out.outputs[0].token_ids_delta
            if out.finished:
                finals[out.request_id] = out.outputs[0].finish_reason
    assert deltas["dead"] == [W5] and len(deltas["free"]) == 4
    assert finals == {"dead": "stop", "free": "length"}


def test_a_dead_end_after_a_kept_draft(model_dir):
    """The prompt alternates w5 w7, so the n-gram drafts after the first token "w5" are w7 w5
    w7. w5 cannot follow w5, and nothing can follow w7: the draft w7 is kept (the only token
    left) and the row after it is the dead end, so the step's tokens are w7 and NO_TOKEN."""
    llm = LLM(model_dir, dtype="float32", kv_cache_memory="1MiB", speculative_config=SpeculativeConfig(
        num_speculative_tokens=3, prompt_lookup_min=1, prompt_lookup_max=2))
    params = SamplingParams(max_tokens=8, temperature=0, allowed_token_ids=[W5, W7], logit_bias={W5: 100},
                            bad_words=["w5 w5", "w7 w5", "w7 w7"], logprobs=1)
    out = llm.generate([[W5, W7] * 3 + [W5]], params)[0].outputs[0]
    assert out.token_ids == [W5, W7] and len(out.logprobs) == 2
    assert out.finish_reason == "stop"
    assert llm.engine.spec_counters.num_accepted_tokens == 1
    assert not llm.engine.has_unfinished_requests()
