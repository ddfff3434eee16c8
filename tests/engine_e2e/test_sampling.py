"""Sampling features, each against a case worked out by hand."""

from __future__ import annotations

import dataclasses
import math
import re

import pytest
import torch

from inferlab.engine.sampler import SamplingBatch, apply_penalties, inverse_cdf, sample, top_k_top_p
from inferlab.engine.sampling_params import SamplingParams
from inferlab.errors import InvalidParameterError
from inferlab.kernels import cpu_ops


@pytest.fixture(params=["c", "torch"])
def sampling_path(request, monkeypatch):
    """Random sampling through the C kernel (where it is built) and through torch (GPUs)."""
    if request.param == "torch":
        monkeypatch.setattr(cpu_ops, "available", lambda *tensors: False)
    elif not cpu_ops.available(torch.zeros(1)):
        pytest.skip("no C compiler here")


def _batch(params, prompt=None, output=None, uniforms=None):
    n = len(params)
    return SamplingBatch(params, uniforms or [None] * n, prompt or [[]] * n, output or [[]] * n)


def test_penalties_by_hand():
    logits = torch.tensor([[2.0, 1.0, -1.0, 0.5]])
    params = [SamplingParams(repetition_penalty=2.0, frequency_penalty=0.5, presence_penalty=0.1)]
    # token 0 seen twice in output, token 2 once, token 3 only in the prompt, token 1 never
    got = apply_penalties(logits, _batch(params, prompt=[[3]], output=[[0, 0, 2]]))
    # 0: 2/2 - 2*0.5 - 0.1; 1: untouched; 2: -1*2 - 0.5 - 0.1; 3: 0.5/2
    assert torch.allclose(got, torch.tensor([[-0.1, 1.0, -2.6, 0.25]]))


@pytest.mark.parametrize("penalty", [1e-50, 1e300])
def test_penalties_past_fp32s_range_keep_the_distribution_finite(sampling_path, penalty):
    """1e-50 is 0 in fp32 (a seen positive logit / 0 = inf), 1e300 is inf (0 * inf = NaN):
    either once made the row NaN, and the sampler fell back to token 0 for every draw. They
    act as the largest and smallest finite penalties do."""
    logits = torch.tensor([[1.0, 0.5, 2.0, 0.0]]).repeat(200, 1)
    params = [SamplingParams(repetition_penalty=penalty, seed=i) for i in range(200)]
    batch = _batch(params, prompt=[[2, 3]] * 200)
    assert torch.isfinite(apply_penalties(logits, batch)).all()
    tokens, _ = sample(logits, batch)
    # 1e-50: token 2's logit grows past every other; 1e300: it shrinks to 0, as token 3's stays
    assert set(tokens.tolist()) == ({2} if penalty < 1 else {0, 1, 2, 3})


def test_top_p_top_k_min_p_by_hand(sampling_path):
    probs = torch.tensor([0.5, 0.3, 0.15, 0.05])
    logits = probs.log().repeat(400, 1)
    cases = [(SamplingParams(top_p=0.7), {0, 1}), (SamplingParams(top_k=1), {0}),
             (SamplingParams(top_k=3), {0, 1, 2}), (SamplingParams(min_p=0.2), {0, 1, 2}),
             (SamplingParams(min_p=0.5), {0, 1})]
    for params, allowed in cases:
        tokens, _ = sample(logits, _batch([params] * 400))
        assert set(tokens.tolist()) == allowed, params


def test_min_p_comes_before_top_p_as_vllm_orders_them(sampling_path):
    """min-p 0.2 keeps 0.5, 0.3 and 0.15 (not 0.05 < 0.2 x 0.5); renormalized, 0.5 and 0.3 make
    0.842 >= 0.82, so top-p keeps two. Applied to the whole distribution top-p would keep three
    (0.5 + 0.3 = 0.8 < 0.82): transformers' order, which this once followed."""
    logits = torch.tensor([0.5, 0.3, 0.15, 0.05]).log().repeat(400, 1)
    tokens, _ = sample(logits, _batch([SamplingParams(top_p=0.82, min_p=0.2)] * 400))
    assert set(tokens.tolist()) == {0, 1}


@pytest.mark.parametrize("temperature", [1e-6, 1e-39, 5e-324])
def test_a_temperature_below_vllms_epsilon_is_greedy(sampling_path, temperature):
    """1 / 1e-39 is past fp32's range: every weight was NaN and the draw fell on token 0."""
    logits = torch.tensor([[0.0, 2.0, 1.0]]).repeat(8, 1)
    params = [SamplingParams(temperature=temperature, top_p=0.9), SamplingParams(temperature=temperature)]
    tokens, _ = sample(logits, _batch(params * 4))
    assert set(tokens.tolist()) == {1}


def test_top_k_top_p_touch_only_the_rows_that_ask():
    """A row without top-k or top-p passes bit for bit, whatever its neighbours ask (before,
    one top-k row sent every row through torch's temperature division, which rounds otherwise
    than the C kernel's); a top-k row keeps its k largest, ranked at its own temperature."""
    logits = torch.randn(3, 50, generator=torch.Generator().manual_seed(0)) * 3
    params = [SamplingParams(temperature=0.7), SamplingParams(temperature=0.5, top_k=3),
              SamplingParams(temperature=1.3, top_p=0.5)]
    got = top_k_top_p(logits, params)
    assert torch.equal(got[0], logits[0])
    assert set(got[1].isfinite().nonzero().flatten().tolist()) == set(logits[1].topk(3).indices.tolist())
    probs = torch.softmax(logits[2] / 1.3, dim=-1).sort(descending=True)
    keep = int((probs.values.cumsum(0) - probs.values < 0.5).sum())  # the prefix reaching 0.5
    assert set(got[2].isfinite().nonzero().flatten().tolist()) == set(probs.indices[:keep].tolist())
    assert torch.equal(got[2][got[2].isfinite()], logits[2][got[2].isfinite()])  # untempered


def test_a_top_k_past_the_vocabulary_keeps_every_token():
    """vLLM reads such a top_k as off; 2**63 once failed the step (an int64 overflow in the
    tensor of k's) and stopped the engine for every request. Beside it, top_k = 2 still cuts."""
    logits = torch.randn(2, 50, generator=torch.Generator().manual_seed(1))
    got = top_k_top_p(logits, [SamplingParams(top_k=2**63), SamplingParams(top_k=2)])
    assert torch.equal(got[0], logits[0])
    assert int(got[1].isfinite().sum()) == 2


def test_top_p_one_keeps_the_tail_an_fp32_running_sum_rounds_away():
    """One token holds all but ~5e-12 of the mass, so the fp32 running sum is 1.0 from the
    second token on; top_p = 1 must still keep all top_k = 50 tokens."""
    logits = torch.zeros(1, 100)
    logits[0, 0] = 30.0
    got = top_k_top_p(logits, [SamplingParams(temperature=1.0, top_k=50, top_p=1.0)])
    assert int(got.isfinite().sum()) == 50


def test_a_top_p_below_fp32s_smallest_keeps_the_top_token(sampling_path):
    """top_p = 1e-46 is a valid top_p that reads as 0.0 in fp32: the top token must stay (it
    once dropped every token, and the step sampled token 0)."""
    logits = torch.tensor([[0.0, 2.0, 1.0]]).repeat(50, 1)
    tokens, _ = sample(logits, _batch([SamplingParams(temperature=0.5, top_p=1e-46)] * 50))
    assert set(tokens.tolist()) == {1}


def test_top_k_keeps_the_top_token_at_any_temperature(sampling_path):
    """temperature 1e39 is inf in fp32: every tempered logit was 0, and top_k = 1 kept whichever
    token the sort left first (not the top one); an infinite temperature is refused."""
    logits = torch.tensor([[0.0, 1.0, 3.0, 2.0]]).repeat(50, 1)
    tokens, _ = sample(logits, _batch([SamplingParams(temperature=1e39, top_k=1)] * 50))
    assert set(tokens.tolist()) == {2}
    with pytest.raises(InvalidParameterError, match="temperature must be a finite number"):
        SamplingParams(temperature=math.inf)


def test_temperature_sampling_follows_the_distribution(sampling_path):
    probs = torch.tensor([0.6, 0.3, 0.1])
    logits = probs.log().repeat(6000, 1)
    tokens, _ = sample(logits, _batch([SamplingParams(temperature=1.0)] * 6000))
    freq = torch.bincount(tokens, minlength=3).float() / 6000
    assert torch.allclose(freq, probs, atol=0.03)


def test_logprobs_by_hand():
    logits = torch.tensor([[math.log(0.5), math.log(0.3), math.log(0.2)]])
    tokens, logprobs = sample(logits, _batch([SamplingParams(temperature=0, logprobs=2)]))
    entry = logprobs[0]
    assert tokens.tolist() == [0] and entry.rank == 1
    assert abs(entry.logprob - math.log(0.5)) < 1e-6
    assert [t for t, _ in entry.top] == [0, 1] and abs(entry.top[1][1] - math.log(0.3)) < 1e-6


def test_logit_bias_by_hand(sampling_path):
    """Logits [1, 3, 2, 0]: the bias is added before the choice, the reported logprobs stay
    the model's own, and a token not allowed yet (min_tokens) stays out whatever its bias."""
    logits = torch.tensor([[1.0, 3.0, 2.0, 0.0]])
    greedy = [(SamplingParams(temperature=0, logit_bias={1: -1.5}), 2),  # 1.5 < 2
              (SamplingParams(temperature=0, logit_bias={3: 2.5}), 1),  # 2.5 < 3
              (SamplingParams(temperature=0, logit_bias={3: 3.5, 1: 0.25}), 3)]  # 3.5 > 3.25
    for params, token in greedy:
        assert sample(logits, _batch([params]))[0].tolist() == [token], params.logit_bias
    banned = sample(logits.repeat(400, 1), _batch([SamplingParams(logit_bias={1: -100})] * 400))[0]
    assert set(banned.tolist()) == {0, 2, 3}
    forced, logprobs = sample(logits, _batch([SamplingParams(logit_bias={0: 100}, logprobs=0)]))
    assert forced.tolist() == [0]
    # log softmax of [1, 3, 2, 0] at 0: 1 - log(e + e^3 + e^2 + 1)
    assert abs(logprobs[0].logprob - (1 - math.log(math.e + math.e ** 3 + math.e ** 2 + 1))) < 1e-5
    held = SamplingBatch([SamplingParams(temperature=0, logit_bias={0: 100})], [None], [[]], [[]],
                         suppressed_ids=[[0]])
    assert sample(logits, held)[0].tolist() == [1]


@pytest.mark.parametrize(("bias", "words"), [
    ({-1: 5.0}, "token ids"), ({"7": 5.0}, "token ids"), ({7: 100.5}, "[-100, 100]"),
    ({7: float("nan")}, "[-100, 100]"),
])
def test_logit_bias_out_of_range_is_refused(bias, words):
    with pytest.raises(ValueError, match=re.escape(words)):
        SamplingParams(logit_bias=bias)


def test_logit_bias_steers_one_request_of_a_batch(make_llm):
    """A bias of -100 on the greedy token gives the runner-up of the unbiased distribution;
    +100 on one token makes every output that token; the request beside them is unchanged;
    a token id past the vocabulary is refused when added, leaving nothing queued."""
    llm = make_llm()
    prompt = "1, 2, 3, 4, 5,"
    plain = SamplingParams(temperature=0, max_tokens=6, ignore_eos=True)
    alone = llm.generate([prompt], dataclasses.replace(plain, logprobs=2))[0].outputs[0]
    first, runner_up = alone.logprobs[0].top[0][0], alone.logprobs[0].top[1][0]
    banned, forced, beside = llm.generate(
        [prompt, prompt, "The capital of France is"],
        [dataclasses.replace(plain, max_tokens=1, logit_bias={first: -100}),
         dataclasses.replace(plain, logit_bias={runner_up: 100}), plain])
    assert banned.outputs[0].token_ids == [runner_up]
    assert forced.outputs[0].token_ids == [runner_up] * 6
    assert beside.outputs[0].token_ids == llm.generate(["The capital of France is"], plain)[0].outputs[0].token_ids
    vocab = llm.engine.model_config.vocab_size
    with pytest.raises(InvalidParameterError, match=f"logit_bias token id {vocab} is outside"):
        llm.generate([prompt], dataclasses.replace(plain, logit_bias={vocab: 1.0}))
    assert not llm.engine.has_unfinished_requests()


def test_one_bad_word_given_as_a_string_is_one_word():
    """As stop="x" is one stop string (it was read as the letters P, a, r, i, s)."""
    assert SamplingParams(bad_words="Paris").bad_words == ["Paris"]


def test_allowed_token_ids_by_hand(sampling_path):
    logits = torch.tensor([[1.0, 3.0, 2.0, 0.0]])
    allowed = SamplingParams(temperature=0, allowed_token_ids=[0, 2])
    assert sample(logits, _batch([allowed, SamplingParams(temperature=0)]))[0].tolist() == [2]
    both = sample(logits.repeat(2, 1), _batch([allowed, SamplingParams(temperature=0)]))[0]
    assert both.tolist() == [2, 1]  # the row beside it is untouched
    drawn = sample(logits.repeat(400, 1), _batch([SamplingParams(allowed_token_ids=[0, 3])] * 400))[0]
    assert set(drawn.tolist()) == {0, 3}


@pytest.mark.parametrize(("fields", "words"), [
    ({"allowed_token_ids": []}, "non-empty"), ({"allowed_token_ids": [-2]}, "non-empty"),
    ({"truncate_prompt_tokens": 0}, "at least 1"),
])
def test_allowed_ids_and_truncation_out_of_range_are_refused(fields, words):
    with pytest.raises(ValueError, match=re.escape(words)):
        SamplingParams(**fields)


def test_special_tokens_shown_on_request(make_llm):
    """EOS forced twice (logit_bias, ignore_eos): skipped from the text by default, its
    <|im_end|> written out with skip_special_tokens=False; an EOS that stops the output is not
    written out, unless include_stop_str_in_output."""
    llm = make_llm()
    eos = llm.tokenizer.eos_token_id
    forced = SamplingParams(temperature=0, max_tokens=2, ignore_eos=True, logit_bias={eos: 100})
    shown = dataclasses.replace(forced, skip_special_tokens=False)
    hidden_out, shown_out = (o.outputs[0] for o in llm.generate(["Hi", "Hi"], [forced, shown]))
    assert hidden_out.token_ids == shown_out.token_ids == [eos, eos]
    assert (hidden_out.text, shown_out.text) == ("", "<|im_end|>" * 2)
    # an EOS that ends the output is left out of its text, shown or not, unless asked for
    ending = dataclasses.replace(shown, ignore_eos=False)
    kept = dataclasses.replace(ending, include_stop_str_in_output=True)
    ended, kept_out = (o.outputs[0] for o in llm.generate(["Hi", "Hi"], [ending, kept]))
    assert ended.token_ids == kept_out.token_ids == [eos] and ended.finish_reason == "stop"
    assert (ended.text, kept_out.text) == ("", "<|im_end|>")


def test_allowed_ids_and_prompt_truncation_in_the_engine(make_llm):
    """allowed_token_ids keeps every output token in the set; truncate_prompt_tokens=4 gives
    exactly what the prompt's last 4 tokens give alone; an allowed set that min_tokens would
    leave empty is refused when added."""
    llm = make_llm()
    prompt = llm.tokenizer.encode("The quick brown fox jumps over the lazy dog")
    allowed = prompt[:3]
    out = llm.generate([prompt], SamplingParams(temperature=0.8, seed=3, max_tokens=8, ignore_eos=True,
                                                allowed_token_ids=allowed))[0].outputs[0]
    assert set(out.token_ids) <= set(allowed) and len(out.token_ids) == 8
    greedy = SamplingParams(temperature=0, max_tokens=6, ignore_eos=True)
    cut = llm.generate([prompt], dataclasses.replace(greedy, truncate_prompt_tokens=4))[0]
    tail = llm.generate([prompt[-4:]], greedy)[0]
    assert cut.prompt_token_ids == prompt[-4:]
    assert cut.outputs[0].token_ids == tail.outputs[0].token_ids
    eos = llm.tokenizer.eos_token_id
    with pytest.raises(InvalidParameterError, match="nothing to sample"):
        llm.generate([prompt], SamplingParams(min_tokens=2, allowed_token_ids=[eos]))
    (fox,) = llm.tokenizer.encode("fox", add_special_tokens=False)
    with pytest.raises(InvalidParameterError, match="nothing to sample"):
        llm.generate([prompt], SamplingParams(allowed_token_ids=[fox], bad_words=["fox"]))
    assert not llm.engine.has_unfinished_requests()


def test_truncate_prompt_tokens_minus_one_means_the_context_length(make_llm):
    """vLLM's -1: the prompt's last max_model_len tokens (which leave no room for output here;
    -1 was refused)."""
    from inferlab.errors import InferlabError

    llm = make_llm(max_model_len=64)
    prompt = llm.tokenizer.encode("The quick brown fox jumps over the lazy dog") * 8  # 80 tokens
    with pytest.raises(InferlabError, match="the prompt has 64 tokens, the context holds 64"):
        llm.generate([prompt], SamplingParams(truncate_prompt_tokens=-1))
    short = SamplingParams(temperature=0, max_tokens=4, truncate_prompt_tokens=-1)
    plain = SamplingParams(temperature=0, max_tokens=4)
    assert llm.generate([prompt[:10]], short)[0].outputs[0].token_ids == \
        llm.generate([prompt[:10]], plain)[0].outputs[0].token_ids
    with pytest.raises(InvalidParameterError, match="or -1"):
        SamplingParams(truncate_prompt_tokens=-2)


def test_a_row_with_every_token_barred_still_names_one_in_the_vocabulary(sampling_path):
    """A bad word can bar the last token allowed_token_ids left (it depends on the output, so
    add_request cannot refuse it): the row has no mass, and the sampler must not name a token
    past the vocabulary (the torch path named 256, the first padded entry, for 10 tokens)."""
    barred = torch.full((3, 10), float("-inf"))
    for params in (SamplingParams(temperature=0), SamplingParams(), SamplingParams(top_p=0.5)):
        tokens = sample(barred, _batch([params] * 3))[0]
        assert all(0 <= t < 10 for t in tokens.tolist()), params


def test_bad_words_by_hand(make_llm):
    """Greedy " 6, 7," comes as " ", "6", ",", " ", "7", ",". bad_words=["6"] bars "6" from the
    start: the second token is the runner-up of the unbarred distribution. "6, 7" bars "7" only
    after "6", ",", " ": the first four tokens stay and the fifth is not "7"."""
    llm = make_llm()
    prompt = "1, 2, 3, 4, 5,"
    plain = SamplingParams(temperature=0, max_tokens=6)
    alone = llm.generate([prompt], dataclasses.replace(plain, logprobs=2))[0].outputs[0]
    ids = alone.token_ids
    assert [llm.tokenizer.decode([t]) for t in ids] == [" ", "6", ",", " ", "7", ","]
    no_six, no_seven = (o.outputs[0].token_ids for o in llm.generate(
        [prompt, prompt], [dataclasses.replace(plain, bad_words=["6"]),
                           dataclasses.replace(plain, bad_words=["6, 7"])]))
    assert no_six[:2] == [ids[0], alone.logprobs[1].top[1][0]] and ids[1] not in no_six
    assert no_seven[:4] == ids[:4] and no_seven[4] != ids[4]


def test_seeded_sampling_ignores_the_rest_of_the_batch(make_llm):
    params = SamplingParams(temperature=1.0, seed=1234, max_tokens=16, ignore_eos=True)
    alone = make_llm().generate(["Tell me a story"], params)[0].outputs[0].token_ids
    others = [SamplingParams(temperature=0.8, max_tokens=10 + i, ignore_eos=True) for i in range(5)]
    mixed = make_llm().generate(["Hello", "Tell me a story", "Why", "A", "B", "C"],
                                [others[0], params, *others[1:]])
    assert mixed[1].outputs[0].token_ids == alone


@pytest.mark.parametrize("prefix_caching", [True, False])
def test_n_completions_share_the_prompt_blocks(make_llm, prefix_caching, monkeypatch):
    """The copies after the first take the prompt's full blocks from it, prefix caching on or
    off; off, a later request with the same prompt shares nothing."""
    llm = make_llm(enable_prefix_caching=prefix_caching)
    block_manager, found = llm.engine.scheduler.block_manager, []
    lookup = block_manager.get_computed_blocks  # each admission's cached prefix, recorded
    monkeypatch.setattr(block_manager, "get_computed_blocks",
                        lambda request: found.append(lookup(request)) or found[-1])
    prompt = llm.tokenizer.encode("word " * 40)
    params = SamplingParams(n=3, temperature=1.0, seed=7, max_tokens=5, ignore_eos=True)
    out = llm.generate([prompt], params)[0]
    assert [c.index for c in out.outputs] == [0, 1, 2]
    assert all(len(c.token_ids) == 5 for c in out.outputs)
    assert len({tuple(c.token_ids) for c in out.outputs}) > 1
    full_blocks = (len(prompt) - 1) // 16 * 16
    assert [prefix.num_tokens for prefix in found] == [0, full_blocks, full_blocks]
    # the stats count only what a prefix cache served, as vLLM's do
    hits = llm.engine.scheduler.stats().prefix_cache_hit_tokens
    assert hits == (2 * full_blocks if prefix_caching else 0)
    again = llm.generate([prompt], dataclasses.replace(params, n=1))[0]
    assert again.num_cached_tokens == (full_blocks if prefix_caching else 0)
    alone = make_llm(enable_prefix_caching=prefix_caching).generate([prompt], params)[0]
    assert [c.token_ids for c in alone.outputs] == [c.token_ids for c in out.outputs]


def test_inverse_cdf_by_hand():
    """Mass 0.5 at id 10 (first block of 256), 0.3 at 300 (second), 0.2 at 599 (third, the
    vocabulary padded after it): each uniform lands where the running mass first exceeds it."""
    probs = torch.zeros(1, 600)
    probs[0, 10], probs[0, 300], probs[0, 599] = 0.5, 0.3, 0.2
    cases = {0.0: 10, 0.49: 10, 0.5: 300, 0.79: 300, 0.81: 599, 1 - 1e-12: 599}
    for u, expected in cases.items():
        picked = inverse_cdf(probs * 3.0, torch.tensor([[u]], dtype=torch.float64))  # any total
        assert picked.tolist() == [expected], u
    # zeros after the last positive entry are never picked, whatever the rounding
    tail = torch.zeros(1, 300)
    tail[0, 3] = 1e-30
    assert inverse_cdf(tail, torch.tensor([[1 - 1e-16]], dtype=torch.float64)).tolist() == [3]


def test_guided_choice_allows_only_what_goes_on_with_a_choice_by_hand():
    """Choices spelled [5, 6], [5, 7, 8] and [9]; EOS 2."""
    from inferlab.engine.guided.guided_choice import ChoiceGuide

    choices = [[5, 6], [5, 7, 8], [9]]
    assert ChoiceGuide(choices, eos_token_id=2).allowed_now([]) == [5, 9]
    assert ChoiceGuide(choices, eos_token_id=2).allowed_now([5]) == [6, 7]
    assert ChoiceGuide(choices, eos_token_id=2).allowed_now([5, 6]) == [2]  # a whole choice: only EOS
    assert ChoiceGuide([[5], [5, 6]], eos_token_id=2).allowed_now([5]) == [2, 6]  # or a longer choice
    # the sampler keeps a row's allowed ids, whatever its logits prefer
    logits = torch.tensor([[0.0, 9.0, 0.0, 0.0, 0.0, 1.0, 0.0, 3.0, 0.0, 0.0]])
    batch = SamplingBatch([SamplingParams(temperature=0)], [None], [[]], [[]], allowed_ids=[[6, 7]])
    assert sample(logits, batch)[0].tolist() == [7]


def test_guided_choice_outputs_are_the_choices(make_llm):
    """Greedy and sampled, through the engine: every completion is one of the choices, ended by
    EOS, whatever the prompt would have the model say."""
    llm = make_llm()
    choices = ["positive", "negative", "no", "no idea at all"]
    params = [SamplingParams(temperature=0, max_tokens=20, guided_choice=choices),
              SamplingParams(temperature=1.5, seed=5, n=6, max_tokens=20, guided_choice=choices)]
    for out in llm.generate(["The weather today is", "Once upon a time"], params):
        for completion in out.outputs:
            assert completion.text in choices and completion.finish_reason == "stop"
    short = llm.generate("Hi", SamplingParams(temperature=0, max_tokens=1,
                                              guided_choice=["no idea at all"]))[0].outputs[0]
    assert short.finish_reason == "length" and "no idea at all".startswith(short.text)
    with pytest.raises(ValueError, match="cannot be combined with ignore_eos"):
        SamplingParams(guided_choice=["a"], ignore_eos=True)
