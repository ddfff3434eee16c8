"""Guided decoding (structured outputs): a request's output held to a JSON schema (or OpenAI's
json_object), a regex (guided_regex), an EBNF grammar (guided_grammar), a structural tag or a
list of choices (guided_choice), then EOS; the sampler takes only the tokens a guide allows.

Start at token_filter.py: the engine's GrammarFilters gives each request a GrammarGuide, whose
allowed tokens a TokenFilter finds by walking the vocabulary (token_index.py) through a Grammar
(grammar.py). The grammars: json_grammar.py, over the nodes json_schema.py compiles a schema to
(json_*.py); regex_grammar.py; ebnf_grammar.py, over ebnf_parse.py; structural_tag.py; and
thinking_grammar.py, which starts one after a reasoning model's thinking. guided_choice.py
guides by the choices' token ids, with no grammar.
"""
