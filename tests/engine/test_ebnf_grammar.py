"""The EBNF (GBNF) recognizer against lark's Earley parser, the reference.

Each grammar below is written twice, in GBNF for the recognizer and by hand in lark's notation.
A text is complete exactly when lark parses it; random walks through the recognizer end only in
texts lark parses and never reach a state from which nothing goes on.
"""

from __future__ import annotations

import random
import re

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from lark import Lark
from lark.exceptions import LarkError

from inferlab.engine.guided.ebnf_grammar import EbnfGrammar
from inferlab.engine.guided.ebnf_parse import GrammarError
from inferlab.engine.guided.token_filter import GrammarGuide, TokenFilter
from inferlab.engine.guided.token_index import TokenIndex

from .grammar_fuzz import complete, edit, finished_walks, read_whole

GRAMMARS = {  # name -> (GBNF, the same language in lark's notation, valid texts)
    "sql": ('''
root ::= select_statement
select_statement ::= "SELECT " column " from " table " where " condition
column ::= "col_1 " | "col_2 "
table ::= "table_1 " | "table_2 "
condition ::= column "= " number
number ::= "1 " | "2 "
''', '''
root: "SELECT " column " from " table " where " column "= " number
column: "col_1 " | "col_2 "
table: "table_1 " | "table_2 "
number: "1 " | "2 "
''', ["SELECT col_1  from table_2  where col_2 = 1 ", "SELECT col_2  from table_1  where col_1 = 2 "]),
    "list": (r'''
root ::= "[" ws (item ("," ws item)*)? ws "]"
item ::= [a-z]+ | [0-9]{1,3} | "\"" [^"\\]* "\""
ws   ::= [ \t\n]*   # any run of blanks
''', r'''
root: "[" ws (item ("," ws item)*)? ws "]"
item: /[a-z]/+ | /[0-9]/ ~ 1..3 | "\"" /[^"\\]/* "\""
ws: /[ \t\n]/*
''', ["[]", "[ a, bc,12]", '["x y", 7, "",q]', "[\n\t]"]),
    "arith": ('''
root   ::= expr
expr   ::= term (("+" | "-") term)*
term   ::= factor (("*" | "/") factor)*
factor ::= [0-9]+ ("." [0-9]+)? | "(" expr ")" | "-" factor
''', '''
root: expr
expr: term (("+" | "-") term)*
term: factor (("*" | "/") factor)*
factor: /[0-9]/+ ("." /[0-9]/+)? | "(" expr ")" | "-" factor
''', ["1", "-(2+3.5)*4", "((1))/-2-3", "10.25*(7-(8))"]),
    "misc": (r'''
root ::= greeting-word sep
         name_list "!"? tail   # a rule may go on over lines
greeting-word ::= ("hi" | "h\u00e9llo"){1,2}
sep ::= [,:-] " "{0,2}   # a last - is itself
name_list ::= [A-Z] [a-z]{2,} (" & " [A-Z] [a-z]{2,})*
tail ::= "" | "\x41" . [^a-z\n] | ()
''', r'''
root: greeting_word sep name_list "!"? tail
greeting_word: ("hi" | "h\u00e9llo") ~ 1..2
sep: /[,:-]/ " " ~ 0..2
name_list: /[A-Z]/ /[a-z]/ ~ 2 /[a-z]/* (" & " /[A-Z]/ /[a-z]/ ~ 2 /[a-z]/*)*
tail: ("A" /./s /[^a-z\n]/)?
''', ["hi,Annabel", "h\u00e9llohi:  Bob & Eve!", "hihi- Zed!A\n7", "hi:Amy & Bob!A\u00e9?"]),
}
RECOGNIZERS = {name: EbnfGrammar(gbnf) for name, (gbnf, _, _) in GRAMMARS.items()}
REFERENCES = {name: Lark(twin, start="root", parser="earley", lexer="dynamic")
              for name, (_, twin, _) in GRAMMARS.items()}


def reference_accepts(name: str, text: str) -> bool:
    try:
        REFERENCES[name].parse(text)
    except LarkError:
        return False
    return True


@pytest.mark.parametrize("name", sorted(GRAMMARS))
def test_valid_texts_are_complete_and_every_prefix_viable(name):
    grammar = RECOGNIZERS[name]
    for text in GRAMMARS[name][2]:
        assert reference_accepts(name, text), text  # the cases are valid
        read_whole(grammar, text)


@settings(max_examples=200, deadline=None)
@given(st.sampled_from(sorted(GRAMMARS)), st.randoms())
def test_edited_texts_are_complete_exactly_when_lark_parses_them(name, rng):
    text = edit(rng.choice(GRAMMARS[name][2]), rng, '[]",() \n\t+-*/.0123456789abcqxyzAZ!:&\u00e9SELCT_12')
    assert complete(RECOGNIZERS[name], text) == reference_accepts(name, text), repr(text)


ALPHABET = sorted(set("".join(text for _, _, texts in GRAMMARS.values() for text in texts)) | set("\"\\\t;#~"))


@pytest.mark.parametrize("name", sorted(GRAMMARS))
def test_random_walks_end_only_in_texts_lark_parses(name):
    texts = finished_walks(RECOGNIZERS[name], random.Random(name), 60, budget=40, alphabet=ALPHABET)
    assert len(texts) >= 40
    for text in texts:
        assert reference_accepts(name, text), repr(text)


def test_repetitions_keep_stacks_short():
    grammar = EbnfGrammar('root ::= ("ab" | [0-9])* "."')
    depth = {n: max(map(len, grammar.advance(grammar.start, "ab" * n + "12" * n))) for n in (1, 500)}
    assert depth[500] == depth[1] <= 3  # the caller, the repetition, the group
    state = grammar.advance(grammar.start, "ab" * 500 + "12" * 500)
    assert grammar.is_complete(grammar.step(state, "."))


@pytest.mark.parametrize(("grammar", "texts", "refused"), [
    ('root ::= ("a" | "b") +', ["a", "abba"], ["", "c"]),  # once "unexpected '+'"
    ('root ::= "x" *  "y" ?', ["", "xxy", "y"], ["yy", "yx"]),
    ('root ::= [0-9] {2,3}\t"."', ["12.", "123."], ["1.", "1234."]),
])
def test_spaces_may_come_before_a_repetition_as_llama_cpp_reads_them(grammar, texts, refused):
    ebnf = EbnfGrammar(grammar)
    assert all(ebnf.is_complete(ebnf.advance(ebnf.start, t)) for t in texts)
    assert not any(ebnf.is_complete(ebnf.advance(ebnf.start, t)) for t in refused)


@pytest.mark.parametrize(("text", "words"), [
    ("", "grammar line 1 column 1: the grammar is empty"),
    ("root ::= x", "rule 'x' is used but never defined"),
    ('a ::= "x"', "no root rule"),
    ('root ::= "a"\nroot ::= "b"', "line 2 column 1: rule 'root' is defined twice"),
    ('root ::= root "a"', "rule 'root' is left-recursive"),
    ('root ::= a\na ::= b? a "x"\nb ::= "y"', "rule 'a' is left-recursive"),
    ('root ::= ("a"?)*', "rule 'root' is left-recursive"),
    ("root ::= [z-a]", "line 1 column 14: range 'z'-'a' runs backwards"),
    ('root ::= "abc', "a string is not closed"),
    ("root ::= [abc", "a character class is not closed"),
    ('root ::= ("a" | "b"', "expected ')'"),
    ('root ::= "a"{3,1}', "repetition {3,1}: the most is below the least"),
    ('root ::= "a"{x}', "expected {m}, {m,} or {m,n}"),
    ('root ::= "\\q"', "unknown escape \\q"),
    ('root ::= "\\U00110000"', "past the last character"),
    ('root ::= "a" ) "b"', "expected a rule: name ::= ..."),
    ('root ::= "a" @', "unexpected '@'"),
    ('root ::= "a"{0,60000} "b"{0,60000}', "unrolls to over 100000 elements"),
    # refused as read, before the copies are built (a MemoryError or an OverflowError: a 500)
    ('root ::= "a"{99999999999999}', "column 29: repetition {99999999999999}: the grammar unrolls to over"),
    ('root ::= "a"{99999999999999999999999}', "repetition {99999999999999999999999}: the grammar"),
    ('root ::= "a"{100001,}', "repetition {100001,}: the grammar unrolls to over 100000 elements"),
    ('root ::= "a"{' + "9" * 5000 + "}", "the grammar unrolls to over 100000 elements"),  # a ValueError
    ('root ::= "a"{\u0663}', "expected {m}, {m,} or {m,n}"),  # an Arabic-Indic 3, which \d took
    # each {m} within the limit, the chain of them past it (a 1.6 KB grammar took 162 MB)
    ('root ::= "a"' + "{100000}" * 200, "line 1 column 21: the grammar unrolls to over 100000"),
    ('root ::= ("ab"{60000}){2}', "the grammar unrolls to over 100000 elements"),
    ("root ::= [^\\x00-\\U0010ffff]", "grammar: 'root' matches no text"),
    ('root ::= "a" x\nx ::= "b" x', "grammar: 'root' matches no text"),
])
def test_grammars_the_recognizer_cannot_read_are_refused_by_line_and_column(text, words):
    with pytest.raises(GrammarError, match=re.escape(words)):
        EbnfGrammar(text)


def test_an_alternative_that_matches_no_text_is_never_entered():
    """x only calls itself, so "a" x can never be finished: "a" is refused at once, and "c",
    the other alternative, still completes."""
    grammar = EbnfGrammar('root ::= "a" x | "c"\nx ::= "b" x')
    assert grammar.advance(grammar.start, "a") is None
    assert grammar.is_complete(grammar.advance(grammar.start, "c"))


WORDS = [f"w{i}" for i in range(2000)]  # past 1,024 that begin alike: once, "w" read them all
ALTERNATION = " | ".join(f'"{word}"' for word in WORDS)


@pytest.mark.parametrize(("grammar", "before"), [
    (f'root ::= "a" | {ALTERNATION}', ""),
    (f'root ::= "x" ({ALTERNATION}) | "y"', "x"),  # an alternation past the start
    (f'root ::= "x" word\nword ::= {ALTERNATION}', "x"),
])
def test_every_word_of_an_alternation_of_thousands_is_complete(grammar, before):
    ebnf = EbnfGrammar(grammar)
    for word in WORDS:
        assert ebnf.is_complete(ebnf.advance(ebnf.start, before + word)), word
    for text in ("w", "w01", "w2000", "w19990", "a1", "y1"):
        assert not ebnf.is_complete(ebnf.advance(ebnf.start, before + text)), text


def test_the_guide_offers_the_words_of_an_alternation_of_thousands():
    """Every token that begins a word is offered: once, only "a", the one alternative left
    within MAX_READINGS, was, so no output could be one of the words."""
    texts = [None, None, None, "a", "w", "w1999", "w1", "999", "99", "x"]
    token_filter = TokenFilter(EbnfGrammar(f'root ::= "a" | {ALTERNATION}'), TokenIndex(texts, len(texts)),
                               eos_token_id=2)
    offered = {output: GrammarGuide(token_filter).allowed_now(list(output)).nonzero().flatten().tolist()
               for output in ((), (4,), (6,), (4, 8))}
    assert offered == {(): [3, 4, 5, 6], (4,): [7, 8], (6,): [2, 7, 8], (4, 8): [2]}  # EOS is 2
