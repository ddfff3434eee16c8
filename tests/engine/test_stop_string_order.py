"""Of several stop strings completed by the same token, the one listed first ends the text, as
vLLM's check_stop_strings walks `for stop_str in stop` and returns the first it finds."""

from __future__ import annotations

import pytest

from inferlab.engine.detokenizer import IncrementalDetokenizer


@pytest.fixture(scope="module")
def tokenizer(embedded_gguf):
    from inferlab.models.loader import load_tokenizer

    return load_tokenizer(embedded_gguf)


@pytest.mark.parametrize(("stop", "text", "hit"), [
    # " city" and "e city" both end with the token " city": the list's order decides, not
    # where each begins (the earlier-beginning "e city" once won either way)
    ([" city", "e city"], ", the", " city"),
    (["e city", " city"], ", th", "e city"),
])
def test_the_first_listed_stop_string_wins(tokenizer, stop, text, hit):
    ids = tokenizer.encode(", the city of", add_special_tokens=False)
    assert [tokenizer.decode([t]) for t in ids][:3] == [",", " the", " city"]
    detok = IncrementalDetokenizer(tokenizer, [], stop=stop)
    shown, found = "", None
    for i, t in enumerate(ids):
        delta, found = detok.add([t], finished=i == len(ids) - 1)
        shown += delta
        if found is not None:
            break
    assert (detok.text, shown, found) == (text, text, hit)


def test_a_stop_string_completed_earlier_still_wins_over_one_listed_first(tokenizer):
    """Each step's new text is searched: "the" ends with the token " the", before " city"."""
    ids = tokenizer.encode(", the city of", add_special_tokens=False)
    detok = IncrementalDetokenizer(tokenizer, [], stop=[" city", "the"])
    hits = [detok.add([t], finished=False)[1] for t in ids[:2]]
    assert (hits, detok.text) == ([None, "the"], ", ")
