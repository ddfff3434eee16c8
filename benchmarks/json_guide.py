"""What guided decoding by grammar costs (json_object, a json_schema, a guided_regex, a
guided_grammar, a structural tag, and free text counted out by each): building the token index, a grammar
state's token set the first time it is met, the sampler's masking, and a stream's time a token.

Run: .venv/bin/python benchmarks/json_guide.py [--rows 8] [--tokens 96]

The engine part runs the embedded model (the engine's default dtype) on one chat prompt, greedy:
guided (the filter's states already met once) and unguided (ignore_eos, as many tokens as the
guided answer), interleaved for five rounds; it prints each one's ms a token and their ratio.
"""

from __future__ import annotations

import statistics
import time

import torch
from workloads import positive_int, script_parser

from inferlab.engine.guided.ebnf_grammar import EbnfGrammar
from inferlab.engine.guided.grammar import Grammar
from inferlab.engine.guided.json_grammar import JsonGrammar
from inferlab.engine.guided.json_schema import OBJECT_SCHEMA
from inferlab.engine.guided.regex_grammar import RegexGrammar
from inferlab.engine.guided.structural_tag import StructuralTagGrammar
from inferlab.engine.guided.token_filter import TokenFilter
from inferlab.engine.guided.token_index import TokenIndex, appended_texts
from inferlab.engine.llm import LLM
from inferlab.engine.sampler import SamplingBatch, sample
from inferlab.engine.sampling_params import SamplingParams

SAMPLE = ('{"name": "Felix", "age": 10, "tags": ["cat", "black"], "owner": {"name": "Ann", '
          '"since": 2019.5, "indoor": true, "vet": null}}')
CAT_SCHEMA = {  # the sample's shape, as a schema
    "type": "object", "required": ["name", "age"],
    "properties": {
        "name": {"type": "string"}, "age": {"type": "integer"},
        "tags": {"type": "array", "items": {"type": "string"}, "maxItems": 5},
        "owner": {"type": "object", "properties": {
            "name": {"type": "string"}, "since": {"type": "number"},
            "indoor": {"type": "boolean"}, "vet": {"anyOf": [{"type": "string"}, {"type": "null"}]}}},
    },
}
DATE = r"(\d{4})-(0[1-9]|1[0-2])-\d\d( at \d+:\d\d)?"
SQL = '''
root ::= "SELECT " column ("," " "? column)* " FROM " table (" WHERE " column " " op " " value)? ";"
column ::= "name" | "age" | "city" | "color" | "owner"
table ::= "cats" | "owners"
op ::= "=" | "<" | ">"
value ::= [0-9]+ | "'" [a-zA-Z ]* "'"
'''
TAG = {"structures": [{"begin": "<cat>", "schema": CAT_SCHEMA, "end": "</cat>"}], "triggers": ["<cat"]}
COUNTED = "the quick brown fox jumps over the dog."  # 38 letters and spaces, then the end
MESSAGES = [{"role": "user", "content": "Describe a cat as a JSON object."}]


def token_index(llm: LLM) -> TokenIndex:
    start = time.perf_counter()
    texts = appended_texts(llm.tokenizer)
    built = time.perf_counter()
    index = TokenIndex(texts, llm.engine.model_config.vocab_size)
    print(f"token texts {1e3 * (built - start):.0f} ms, token index {1e3 * (time.perf_counter() - built):.0f} ms "
          f"({len(texts)} tokens)")
    return index


def filter_costs(name: str, grammar: Grammar, sample: str, index: TokenIndex, eos: int) -> TokenFilter:
    token_filter = TokenFilter(grammar, index, eos)
    state, cold = grammar.start, []
    for ch in sample:
        if state not in token_filter._cache:
            t0 = time.perf_counter()
            token_filter.allowed(state)
            cold.append(1e3 * (time.perf_counter() - t0))
        state = grammar.step(state, ch)
    print(f"{name}: {len(cold)} states of the sample met cold: median {statistics.median(cold):.1f} ms, "
          f"max {max(cold):.1f} ms, total {sum(cold):.0f} ms")
    return token_filter


def sampler_cost(token_filter: TokenFilter, rows: int, vocab: int) -> None:
    grammar = token_filter.grammar
    in_string = grammar.advance(grammar.start, '{"name": "Fe')
    allowed = token_filter.allowed(in_string)
    logits = torch.randn(rows, vocab)
    params = [SamplingParams(temperature=0)] * rows
    plain = SamplingBatch(params, [None] * rows, [[]] * rows, [[]] * rows)
    guided = SamplingBatch(params, [None] * rows, [[]] * rows, [[]] * rows, allowed_ids=[allowed] * rows)
    times = {"plain": [], "guided": []}
    for _ in range(100):
        for name, batch in (("plain", plain), ("guided", guided)):
            t0 = time.perf_counter()
            sample(logits, batch)
            times[name].append(1e3 * (time.perf_counter() - t0))
    p, g = statistics.median(times["plain"]), statistics.median(times["guided"])
    print(f"sample() over {rows} rows, all inside a string ({int(allowed.sum())} tokens allowed): "
          f"{p:.2f} ms plain, {g:.2f} ms guided (+{g - p:.2f} ms)")


def stream_cost(llm: LLM, tokens: int, **guide: object) -> None:
    guided = SamplingParams(temperature=0, max_tokens=tokens, **guide)
    first = llm.chat([MESSAGES], guided, use_tqdm=False)[0].outputs[0]  # meets its states once
    plain = SamplingParams(temperature=0, max_tokens=len(first.token_ids), ignore_eos=True)
    per_token = {"guided": [], "plain": []}
    for _ in range(5):
        for name, params in (("guided", guided), ("plain", plain)):
            t0 = time.perf_counter()
            out = llm.chat([MESSAGES], params, use_tqdm=False)[0].outputs[0]
            per_token[name].append(1e3 * (time.perf_counter() - t0) / len(out.token_ids))
    g, p = statistics.median(per_token["guided"]), statistics.median(per_token["plain"])
    print(f"{next(iter(guide))}: one stream, {len(first.token_ids)} tokens ({first.finish_reason}): {g:.2f} ms a token "
          f"guided, {p:.2f} ms plain: {g / p:.3f}x")


def main() -> None:
    parser = script_parser(__doc__)
    parser.add_argument("--rows", type=positive_int, default=8,
                        help="rows of the sampler measurement")
    parser.add_argument("--tokens", type=positive_int, default=96,
                        help="max tokens of the streamed answer")
    args = parser.parse_args()
    llm = LLM(None)
    index = token_index(llm)
    eos = llm.engine.generation.eos_token_id
    token_filter = filter_costs("json_object", JsonGrammar(OBJECT_SCHEMA), SAMPLE, index, eos)
    filter_costs("json_schema", JsonGrammar(CAT_SCHEMA), SAMPLE, index, eos)
    filter_costs("guided_regex", RegexGrammar(DATE), "2024-12-02 at 11:45", index, eos)
    filter_costs("guided_grammar", EbnfGrammar(SQL), "SELECT name, age FROM cats WHERE color = 'black';", index, eos)
    filter_costs("structural_tag", StructuralTagGrammar(TAG), f"Here it is: <cat>{SAMPLE}</cat> A cat.", index, eos)
    # free text counted out: each character a new state, each state met for the first time
    filter_costs("guided_regex [a-z ]{1,40}", RegexGrammar(r"[a-z ]{1,40}\."), COUNTED, index, eos)
    filter_costs("guided_grammar [a-z ]{1,40}", EbnfGrammar('root ::= [a-z ]{1,40} "."'), COUNTED, index, eos)
    filter_costs("json_schema maxLength 40", JsonGrammar({"type": "string", "maxLength": 40}), f'"{COUNTED[:-1]}"',
                 index, eos)
    sampler_cost(token_filter, args.rows, llm.engine.model_config.vocab_size)
    stream_cost(llm, args.tokens, json_object=True)
    stream_cost(llm, args.tokens, json_schema=CAT_SCHEMA)
    stream_cost(llm, args.tokens, guided_regex=DATE)
    stream_cost(llm, args.tokens, guided_grammar=SQL)
    stream_cost(llm, args.tokens, structural_tag=TAG)


if __name__ == "__main__":
    main()
