"""String formats and patterns in the schema-held JSON recognizer, against jsonschema's format
checker and its re.search reading of "pattern".

A format's value is whole exactly when the checker accepts it (emails and durations by hand from
their RFCs, where the checker takes too much); a pattern is a search whose top-level alternatives
are anchored each on its own, with Python's Unicode reading of negated classes. The schemas
without formats and the random walks' alphabet are test_json_schema's.
"""

from __future__ import annotations

import json
import random

import jsonschema
import pytest

from inferlab.engine.guided.json_grammar import JsonGrammar

from .grammar_fuzz import complete, finished_walks
from .json_reference import Reference
from .test_json_schema import ALPHABET

FORMATTED = {"type": "object", "properties": {
    name: {"type": "string", "format": name} for name in (
        "date", "time", "date-time", "duration", "email", "hostname", "uuid", "ipv4", "ipv6", "uri")}}
CHECKER = jsonschema.Draft202012Validator.FORMAT_CHECKER


@pytest.mark.parametrize(("fmt", "good", "bad"), [
    ("date", "2024-02-28", "2024-02-30"), ("time", "23:59:07.5+01:00", "24:00:00Z"),
    ("date-time", "2024-12-02T11:45:00Z", "2024-12-02 11:45:00Z"), ("email", "ann.lee@mail.example.org", "ann.example.org"),
    ("uuid", "123e4567-e89b-12d3-a456-426614174000", "123e4567-e89b-12d3-a456"), ("ipv4", "192.168.0.255", "256.1.1.1"),
    ("duration", "P3Y6M4DT12H30M5S", "P1DT"), ("duration", "PT0S", "P"), ("duration", "P2W", "P1H"),
    ("hostname", "api.example.com", "-api.example.com"), ("hostname", "localhost", "a..b"),
    ("ipv6", "2001:db8::8a2e:370:7334", "2001:db8:::1"), ("ipv6", "::1", "1:2:3:4:5:6:7:8:9"),
    ("ipv6", "fe80::", "12345::"),
    ("uri", "https://example.com:8080/a/b?x=1&y=%20#top", "example.com/a"),
    ("uri", "ftp://10.0.0.1/f.txt", "http://exa mple.com"),
])
def test_formats_are_written_as_the_format_checker_accepts(fmt, good, bad):
    grammar = JsonGrammar(FORMATTED)
    for value, whole in ((good, True), (bad, False)):
        text = json.dumps({fmt: value})
        assert complete(grammar, text) == whole, text
        assert Reference(FORMATTED, format_checker=CHECKER).is_valid({fmt: value}) == whole, text


# an email is whole only after "@", a domain and a dot: random walks seldom get there (the
# hand cases check it)
@pytest.mark.parametrize("fmt", sorted(set(FORMATTED["properties"]) - {"email"}))
def test_random_walks_through_formats_end_in_values_the_format_checker_accepts(fmt):
    assert fmt in CHECKER.checkers  # jsonschema[format-nongpl] brings every format's checker
    schema = FORMATTED["properties"][fmt]
    texts = finished_walks(JsonGrammar(schema), random.Random(fmt), 8, budget=30, alphabet=ALPHABET)
    assert len(texts) >= 3
    for text in texts:
        Reference(schema, format_checker=CHECKER).validate(json.loads(text))


@pytest.mark.parametrize(("schema", "text"), [
    ({"type": "string", "format": "date", "maxLength": 10}, "2024-01-31"),
    ({"type": "string", "format": "time", "minLength": 9, "maxLength": 9}, "00:00:00Z"),
    ({"type": "string", "pattern": "^[a-c]+$", "maxLength": 1}, "c"),
])
def test_a_pattern_or_format_with_lengths_it_can_meet_compiles(schema, text):
    assert complete(JsonGrammar(schema), json.dumps(text))
    assert Reference(schema, format_checker=CHECKER).is_valid(text)


SEARCHED = ("", "a", "b", "axyz", "xb", "ax", "xa", "abzz", "zzcd", "cd\n", "b\n", "a\nb", "x", "ab", "cdx",
            "xa\\", "a$x", "\n", "|a", "^a", "xxb", "axx", "xbx")


@pytest.mark.parametrize("pattern", ["^a|b$", "^a|b", "a|b$", "^ab|cd$", "^(a|b)$", "x|^$", "[|^]a|b$",
                                     "a\\\\$", "a\\$", "a|(b|c)$"])
def test_a_pattern_is_a_search_with_each_top_level_alternative_anchored_on_its_own(pattern):
    """jsonschema runs re.search: ^a|b$ finds "a" at the start or "b" at the end, not ^(a|b)$."""
    schema = {"type": "string", "pattern": pattern}
    grammar = JsonGrammar(schema)
    for text in SEARCHED:
        assert complete(grammar, json.dumps(text)) == Reference(schema).is_valid(text), (pattern, text)


def test_each_alternative_meets_the_length_bounds_on_its_own():
    schema = {"type": "string", "pattern": "^a|b$", "minLength": 3}  # once refused as ^(a|b)$
    grammar = JsonGrammar(schema)
    for text in SEARCHED:
        assert complete(grammar, json.dumps(text)) == Reference(schema).is_valid(text), text


@pytest.mark.parametrize("pattern", ["^\\S+$", "^\\W$", "^\\D$", "^[^\\s]$", "^[^\\w\\d]$", "^.$"])
def test_a_negated_class_takes_what_python_s_unicode_reading_takes(pattern):
    """\\S under ASCII alone took U+001F, which Python's \\s (jsonschema's) holds a space. (\\d, \\w
    and \\s stay ASCII's, stricter than Python's: test_regex_grammar's hand cases.)"""
    schema = {"type": "string", "pattern": pattern}
    grammar = JsonGrammar(schema)
    for ch in "\x1c\x1d\x1e\x1f\x85\xa0\u2000\u205f\u3000\ufeff\u0663\u00e9a_1 \t":
        assert complete(grammar, json.dumps(ch)) == Reference(schema).is_valid(ch), (pattern, ch)


@pytest.mark.parametrize(("fmt", "good", "bad"), [
    ("email", ["a.b@c-d.ee", "x_y+z%1@mail.example.org", "a@b.cc"],
     [".a@b.cc", "a..b@c.de", "a.@b.cc", "a@-b.cc", "a@b-.cc", "a@b.-c.de"]),
    ("duration", ["P1Y2M", "P1M2D", "P1YT3S", "PT1H2M", "PT1M2S", "P1DT2H3M4S", "P1Y2M3DT4H5M6S"],
     ["P1Y2D", "PT1H2S", "P1Y2DT1H", "P1DT1H2S", "P1YT", "P1W2D"]),
])
def test_emails_and_durations_are_spelled_as_their_rfcs_write_them(fmt, good, bad):
    """By hand, from the RFCs: RFC 5322's dot-atom has no dot first, last or twice, RFC 1123's labels
    no hyphen first or last; RFC 3339's duration (appendix A) goes from a part only to the next one
    down (dur-year = 1*DIGIT "Y" [dur-month]). jsonschema's checkers take most of the bad ones (an
    email is anything with an "@"), so they judge the good ones only."""
    schema = FORMATTED["properties"][fmt]
    grammar = JsonGrammar(schema)
    for value in good:
        assert complete(grammar, json.dumps(value)) and CHECKER.conforms(value, fmt), value
    for value in bad:
        assert not complete(grammar, json.dumps(value)), value
