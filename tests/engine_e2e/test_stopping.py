"""When a request ends: stop strings (cut where the text first holds one, or kept on request),
stop token ids, min_tokens holding them off, and EOS unless ignored, each on a hand-checked
greedy case of the embedded model."""

from __future__ import annotations

from inferlab.engine.sampling_params import SamplingParams


def test_stop_string_included_on_request(make_llm):
    """Greedy " 6, 7, 8," (see the min_tokens test): stop="," ends it after " 6", and with
    include_stop_str_in_output the "," stays in the text."""
    llm = make_llm()
    params = SamplingParams(temperature=0, max_tokens=10, stop=[","], include_stop_str_in_output=True)
    out = llm.generate(["1, 2, 3, 4, 5,"], params)[0].outputs[0]
    assert (out.text, out.finish_reason, out.stop_reason) == (" 6,", "stop", ",")


def test_stop_string_truncates_where_the_text_first_contains_it(make_llm):
    llm = make_llm()
    full = llm.generate(["The capital of France is"], SamplingParams(temperature=0, max_tokens=24,
                                                                      ignore_eos=True))[0]
    text = full.outputs[0].text
    stop = text[8:12]  # a piece in the middle, likely spanning a token boundary
    out = llm.generate(["The capital of France is"],
                       SamplingParams(temperature=0, max_tokens=24, stop=[stop]))[0].outputs[0]
    assert out.text == text[:text.index(stop)]
    assert out.finish_reason == "stop" and out.stop_reason == stop


def test_a_stop_string_completed_by_the_last_allowed_token_is_reported(make_llm):
    """The token that reaches max_tokens also completes the stop string: the text is cut and
    the finish reason is "stop" with the string, not "length" (vLLM's order)."""
    llm = make_llm()
    prompt = "The capital of France is"
    full = llm.generate([prompt], SamplingParams(temperature=0, max_tokens=12, ignore_eos=True))[0]
    text = full.outputs[0].text
    tail = next(text[-k:] for k in range(3, len(text)) if text.index(text[-k:]) == len(text) - k)
    out = llm.generate([prompt], SamplingParams(temperature=0, max_tokens=12, ignore_eos=True,
                                                stop=[tail]))[0].outputs[0]
    assert out.token_ids == full.outputs[0].token_ids
    assert (out.text, out.finish_reason, out.stop_reason) == (text[:-len(tail)], "stop", tail)


def test_stop_token_ids_and_min_tokens(make_llm):
    llm = make_llm()
    greedy = llm.generate(["1, 2, 3, 4, 5,"], SamplingParams(temperature=0, max_tokens=10))[0]
    ids = greedy.outputs[0].token_ids
    out = llm.generate(["1, 2, 3, 4, 5,"], SamplingParams(temperature=0, max_tokens=10,
                                                           stop_token_ids=[ids[2]]))[0].outputs[0]
    first = ids.index(ids[2])
    assert out.token_ids == ids[:first + 1] and out.stop_reason == ids[2]
    # the stop token's text is left out of the output unless asked for, as vLLM does
    assert out.text == llm.tokenizer.decode(ids[:first])
    kept = llm.generate(["1, 2, 3, 4, 5,"], SamplingParams(
        temperature=0, max_tokens=10, stop_token_ids=[ids[2]], include_stop_str_in_output=True))
    assert kept[0].outputs[0].text == llm.tokenizer.decode(ids[:first + 1]) != out.text
    # min_tokens = 3 masks the stop token for the first three tokens: greedy then takes the
    # runner-up of the unmasked first distribution
    ranked = llm.generate(["1, 2, 3, 4, 5,"], SamplingParams(temperature=0, max_tokens=1,
                                                             logprobs=2))[0].outputs[0]
    late = llm.generate(["1, 2, 3, 4, 5,"], SamplingParams(
        temperature=0, max_tokens=10, stop_token_ids=[ids[0]], min_tokens=3))[0].outputs[0]
    assert late.token_ids[0] == ranked.logprobs[0].top[1][0]
    assert len(late.token_ids) >= 3 and ids[0] not in late.token_ids[:3]
    assert late.finish_reason == "length" or late.token_ids.index(ids[0]) == len(late.token_ids) - 1


def test_min_tokens_holds_off_stop_strings(make_llm):
    """Greedy " 6, 7, 8," in tokens " ", "6", ",", " ", "7", ",", ...: stop="," ends it after
    " 6"; with min_tokens = 3 stop strings count from the fourth token on, in the text it adds,
    so the first "," is let through and the second one ends it after " 6, 7"."""
    llm = make_llm()
    prompt = "1, 2, 3, 4, 5,"
    greedy = llm.generate([prompt], SamplingParams(temperature=0, max_tokens=6))[0].outputs[0]
    assert greedy.text == " 6, 7,"
    early = llm.generate([prompt], SamplingParams(temperature=0, max_tokens=10, stop=[","]))[0]
    assert early.outputs[0].text == " 6"
    late = llm.generate([prompt], SamplingParams(temperature=0, max_tokens=10, stop=[","],
                                                 min_tokens=3))[0].outputs[0]
    assert (late.text, late.finish_reason, late.stop_reason) == (" 6, 7", "stop", ",")


def test_eos_ends_a_request_unless_ignored(make_llm):
    llm = make_llm()
    chat = llm.chat([{"role": "user", "content": "Say hi"}], SamplingParams(temperature=0, max_tokens=64))
    out = chat[0].outputs[0]
    assert out.finish_reason == "stop" and out.token_ids[-1] == llm.tokenizer.eos_token_id
    forced = llm.chat([{"role": "user", "content": "Say hi"}],
                      SamplingParams(temperature=0, max_tokens=64, ignore_eos=True))[0].outputs[0]
    assert forced.finish_reason == "length" and len(forced.token_ids) == 64
