"""Beam search (vLLM's LLM.beam_search) against transformers' `generate(num_beams=...)`: the
same beams in the same order, each with the log-probability a forward pass gives it."""

from __future__ import annotations

import pytest
import torch

from inferlab import BeamSearchParams  # as the README has it (vLLM: vllm.sampling_params)
from inferlab.errors import InferlabError, InvalidParameterError

PROMPTS = ["The capital of France is", "def fibonacci(n):", "1, 2, 3, 4, 5,"]
WIDTH, MAX_TOKENS = 4, 10


def test_beams_equal_transformers_beam_search(make_llm, hf_smollm):
    """Without end tokens (ignore_eos here; there, an end id no beam writes), both keep the best
    4 of 8 candidates a round and rank the beams by their summed logprob: the same token ids,
    best first. (How each ranks beams that end early differs: vLLM divides by the length with
    the prompt, transformers without.)"""
    llm = make_llm()
    params = BeamSearchParams(beam_width=WIDTH, max_tokens=MAX_TOKENS, ignore_eos=True)
    outputs = llm.beam_search(PROMPTS, params)
    never = hf_smollm.config.vocab_size - 1
    for prompt, out in zip(PROMPTS, outputs, strict=True):
        ids = llm.tokenizer.encode(prompt)
        with torch.no_grad():
            expected = hf_smollm.generate(
                torch.tensor([ids]), attention_mask=torch.ones(1, len(ids), dtype=torch.long),
                do_sample=False, num_beams=WIDTH, num_return_sequences=WIDTH, eos_token_id=never,
                pad_token_id=never, max_new_tokens=MAX_TOKENS, length_penalty=1.0)
        beams = [row[len(ids):].tolist() for row in expected]
        assert never not in {t for beam in beams for t in beam}  # the premise
        assert [c.token_ids for c in out.outputs] == beams, prompt
        assert all(c.finish_reason == "length" for c in out.outputs)
        assert [c.text for c in out.outputs] == [llm.tokenizer.decode(b) for b in beams]
        # vLLM's shape: `sequences`, each beam's tokens and text with the prompt's
        assert [s.tokens for s in out.sequences] == [ids + b for b in beams]
        assert [s.text for s in out.sequences] == [llm.tokenizer.decode(ids + b) for b in beams]
        for completion, sequence in zip(out.outputs, out.sequences, strict=True):
            with torch.no_grad():
                logits = hf_smollm(torch.tensor([ids + completion.token_ids])).logits[0]
            rows = torch.log_softmax(logits.float(), dim=-1)[len(ids) - 1:-1]
            reference = rows.gather(1, torch.tensor(completion.token_ids)[:, None]).sum().item()
            assert abs(completion.cumulative_logprob - reference) < 1e-3
            assert abs(sequence.cum_logprob - reference) < 1e-3


def test_a_beam_that_writes_eos_finishes_and_is_ranked_by_its_score(make_llm):
    """A chat reply ends in EOS within the budget: such a beam finishes ("stop", its text
    without the EOS), and the beams come back ranked by vLLM's length-normalized score."""
    llm = make_llm()
    prompt = llm.tokenizer.apply_chat_template([{"role": "user", "content": "Say yes."}])
    eos = llm.tokenizer.eos_token_id
    (out,) = llm.beam_search([llm.tokenizer.encode(prompt, add_special_tokens=False)],
                             BeamSearchParams(beam_width=3, max_tokens=24))
    ended = [c for c in out.outputs if c.finish_reason == "stop"]
    assert ended and all(c.token_ids[-1] == eos and eos not in c.token_ids[:-1] for c in ended)
    assert all(c.text == llm.tokenizer.decode(c.token_ids[:-1]) for c in ended)
    prompt_len = len(out.prompt_token_ids)
    scores = [c.cumulative_logprob / (prompt_len + len(c.token_ids) - (c.finish_reason == "stop"))
              for c in out.outputs]
    assert scores == sorted(scores, reverse=True)
    free = llm.beam_search(prompt, BeamSearchParams(beam_width=3, max_tokens=24, ignore_eos=True))
    assert all(len(c.token_ids) == 24 and c.finish_reason == "length" for c in free[0].outputs)


def test_beam_search_refuses_what_cannot_run(make_llm):
    llm = make_llm()
    with pytest.raises(InvalidParameterError, match="beam_width must be in"):
        BeamSearchParams(beam_width=11)
    with pytest.raises(InferlabError, match="is over the context length"):
        llm.beam_search("Hello", BeamSearchParams(beam_width=2, max_tokens=llm.engine.max_model_len))
    assert llm.engine.scheduler.block_manager.num_free_blocks == llm.num_kv_blocks
    # vLLM's parameters as a dict: once an AttributeError from deep in the engine
    with pytest.raises(InferlabError, match="^params must be a BeamSearchParams, got dict$"):
        llm.beam_search("Hello", {"beam_width": 2})
