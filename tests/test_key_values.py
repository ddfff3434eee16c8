"""The shared `key=value` splitting behind --data, --slo, --workload and --header."""

import pytest

from inferlab.errors import InferlabError
from inferlab.key_values import key_value_items, key_value_list


def test_items_are_split_once_and_stripped_in_order():
    assert key_value_list(" b = 2 ,a=1", "--x") == {"b": "2", "a": "1"}
    assert list(key_value_list("b=2,a=1", "--x")) == ["b", "a"]
    assert key_value_list("url=http://h/?q=1", "--x") == {"url": "http://h/?q=1"}  # the first '='
    assert key_value_list("a=", "--x") == {"a": ""}  # the caller judges the value


def test_empty_items_and_text_are_skipped():
    assert key_value_list("", "--x") == {}
    assert key_value_list(" , ", "--x") == {}
    assert key_value_list("a=1,,b=2,", "--x") == {"a": "1", "b": "2"}


@pytest.mark.parametrize("text, message", [
    ("a=1,b", "bad --x item 'b': expected key=value"),  # no '='
    ("=5", "bad --x item '=5': expected key=value"),  # an empty key
    (" = 5", "bad --x item '= 5': expected key=value"),  # a blank one
    ("a=1,a=2", "bad --x item 'a=2': a is given twice"),
    ("a=1, a =2", "bad --x item 'a =2': a is given twice"),
])
def test_a_bad_item_is_one_line_naming_the_flag_and_the_item(text, message):
    with pytest.raises(InferlabError) as error:
        key_value_list(text, "--x")
    assert str(error.value) == message


def test_keys_outside_the_known_ones_do_not_read_as_the_form():
    assert key_value_list("ttft=1", "--y", "ttft=N", keys=("ttft",)) == {"ttft": "1"}
    with pytest.raises(InferlabError) as error:
        key_value_list("ttft=1,itl=2", "--y", "ttft=N", keys=("ttft",))
    assert str(error.value) == "bad --y item 'itl=2': expected ttft=N"


def test_one_item_a_flag_with_another_separator():
    assert key_value_items(["X-A: 1", "X-B:a:b"], "--header", "NAME:VALUE", sep=":") == {
        "X-A": "1", "X-B": "a:b"}
    for bad, problem in (("X-A", "expected NAME:VALUE"), (":v", "expected NAME:VALUE"),
                         ("", "expected NAME:VALUE")):
        with pytest.raises(InferlabError) as error:
            key_value_items([bad], "--header", "NAME:VALUE", sep=":")
        assert str(error.value) == f"bad --header item {bad!r}: {problem}"
    with pytest.raises(InferlabError, match="^bad --header item 'X-A:2': X-A is given twice$"):
        key_value_items(["X-A:1", "X-A:2"], "--header", "NAME:VALUE", sep=":")
