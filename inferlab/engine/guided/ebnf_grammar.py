"""A recognizer of an EBNF grammar (ebnf_parse.py) one character at a time, for guided decoding
by vLLM's guided_grammar: the output is a whole `root`.

A state is a set of stacks, one for each way the text so far can be read; a stack's frames are
(alternative, position) pairs, the innermost last, each waiting for the element at its
position. Every stack of a state waits for a character (its top element is a character class),
or is empty: the text is a whole root. A rule called as the last element of an alternative
replaces its caller's frame (a tail call), so repetitions keep stacks short.

A rule's alternatives that begin with the same characters share them (a prefix tree): each
stack is a reading of the text, limited to MAX_READINGS (grammar.py), and 2,000 words that
begin with "w" were 2,000 stacks after it, so the guide offered none of them.

Left recursion (a rule that can reach itself before reading a character) would make a stack
grow without reading anything; such grammars are refused by name, as llama.cpp refuses them.
"""

from __future__ import annotations

from collections.abc import Callable

from inferlab.engine.guided.ebnf_parse import (
    Compiled,
    Element,
    GrammarError,
    Matcher,
    parse_grammar,
)
from inferlab.engine.guided.grammar import Grammar, bounded_state, check_settling_work

Frame = tuple[int, int]  # (alternative, position of the element it waits for)
Stack = tuple[Frame, ...]
State = frozenset[Stack]


class EbnfGrammar(Grammar):
    def __init__(self, text: str) -> None:
        super().__init__()
        compiled = parse_grammar(text)
        _refuse_left_recursion(compiled)
        self.alternatives: list[tuple[Element, ...]] = []  # all rules' alternatives, numbered
        self.rule_alternatives: list[list[int]] = []  # rule -> its alternatives' numbers
        for options in _shared_prefixes(_productive_alternatives(compiled)):
            self.rule_alternatives.append(list(range(len(self.alternatives), len(self.alternatives) + len(options))))
            self.alternatives.extend(options)
        self.matchers = compiled.matchers
        self.start: State = frozenset(self._settle(self._call(compiled.root, ())))

    def _next(self, state: State, ch: str) -> State | None:
        moved = [(*stack[:-1], (alternative, position + 1)) for stack in state if stack
                 for alternative, position in (stack[-1],)
                 if self.matchers[self.alternatives[alternative][position][1]].matches(ch)]
        return bounded_state(set(self._settle(moved)))  # settled together: one bound on the work

    def is_complete(self, state: State | None) -> bool:
        return state is not None and () in state

    def char_key(self, state: State) -> Callable[[str], tuple[bool, ...]]:
        """Which of the character classes the stacks wait for take a character: the next state
        depends on nothing else."""
        classes = self._classes(state)
        return lambda ch: tuple(c.matches(ch) for c in classes)

    def _takes_one_of(self, state: State, lo: str, hi: str) -> bool:
        return any(c.meets(lo, hi) for c in self._classes(state))

    def _classes(self, state: State) -> list[Matcher]:
        """The character classes the stacks wait for."""
        return [self.matchers[m] for m in sorted({self.alternatives[a][p][1] for a, p in
                                                  (stack[-1] for stack in state if stack)})]

    def _call(self, rule: int, below: Stack) -> list[Stack]:
        return [(*below, (alternative, 0)) for alternative in self.rule_alternatives[rule]]

    def _settle(self, todo: list[Stack]) -> list[Stack]:
        """The stacks `todo` become once each waits for a character (or is empty): finished
        frames popped, called rules expanded."""
        settled, seen = [], set()
        while todo:
            stack = todo.pop()
            if stack in seen:
                continue
            seen.add(stack)
            check_settling_work(len(seen))
            if not stack:
                settled.append(stack)
                continue
            alternative, position = stack[-1]
            elements = self.alternatives[alternative]
            if position == len(elements):
                todo.append(stack[:-1])
                continue
            kind, value = elements[position]
            if kind == "char":
                settled.append(stack)
                continue
            below = stack[:-1] if position + 1 == len(elements) else (*stack[:-1], (alternative, position + 1))
            todo.extend(self._call(value, below))
        return settled


def _refuse_left_recursion(compiled: Compiled) -> None:
    """A rule that can reach itself before reading a character (through rules that can be
    empty) is refused, named as its grammar names it."""
    empty = _nullable(compiled)
    first_calls: list[set[int]] = [set() for _ in compiled.names]  # rules callable before a char
    for rule, options in enumerate(compiled.alternatives):
        for option in options:
            for kind, value in option:
                if kind == "char":
                    break
                first_calls[rule].add(value)
                if not empty[value]:
                    break
    finished: set[int] = set()

    def visit(rule: int, path: list[int]) -> None:
        if rule in finished:
            return
        if rule in path:
            name = compiled.names[rule].split("/")[0]
            raise GrammarError(f"grammar: rule {name!r} is left-recursive (it can reach itself before "
                               "reading a character); write the repetition on the right")
        path.append(rule)
        for callee in first_calls[rule]:
            visit(callee, path)
        path.pop()
        finished.add(rule)

    for rule in range(len(compiled.names)):
        visit(rule, [])


def _nullable(compiled: Compiled) -> list[bool]:
    """Which rules can match the empty text."""
    return _rules_where(compiled, lambda matcher: False)


def _productive_alternatives(compiled: Compiled) -> list[list[tuple[Element, ...]]]:
    """Each rule's alternatives less those that match no text (one reads a class no character is
    in, half a surrogate pair aside, or calls a rule that only calls itself), so that every text
    the guide lets through can still be finished; a root left with none is refused, as the guide
    could only force an end."""
    def reads(matcher: Matcher) -> bool:
        return matcher.meets("\0", "\ud7ff") or matcher.meets("\ue000", "\U0010ffff")

    productive = _rules_where(compiled, reads)
    if not productive[compiled.root]:
        raise GrammarError(f"grammar: {compiled.names[compiled.root]!r} matches no text")
    return [[option for option in options if _option_ok(option, productive, compiled, reads)]
            for options in compiled.alternatives]


def _shared_prefixes(rules: list[list[tuple[Element, ...]]]) -> list[list[tuple[Element, ...]]]:
    """The rules, each rule's alternatives that begin with the same character class made one:
    their longest common beginning, then a new rule of what follows it in each (called last,
    so a tail call). The same texts; after a character, one stack for each way on, not each word."""
    rules = [list(dict.fromkeys(options)) for options in rules]  # an alternative twice is one reading
    todo = list(range(len(rules)))
    while todo:
        rule = todo.pop()
        shared = []
        for group in _by_first_class(rules[rule]):
            if len(group) > 1:
                length = _common_beginning(group)
                rules.append([option[length:] for option in group])
                todo.append(len(rules) - 1)
                group = [(*group[0][:length], ("rule", len(rules) - 1))]
            shared.extend(group)
        rules[rule] = shared
    return rules


def _by_first_class(options: list[tuple[Element, ...]]) -> list[list[tuple[Element, ...]]]:
    """`options` grouped by the character class they begin with; each other one alone."""
    groups: dict[Element | int, list[tuple[Element, ...]]] = {}
    for number, option in enumerate(options):
        groups.setdefault(option[0] if option and option[0][0] == "char" else number, []).append(option)
    return list(groups.values())


def _common_beginning(options: list[tuple[Element, ...]]) -> int:
    """How many character classes all `options` begin with alike (at least one)."""
    shortest = min(map(len, options))
    return next((i for i in range(shortest)
                 if options[0][i][0] != "char" or len({option[i] for option in options}) > 1), shortest)


def _rules_where(compiled: Compiled, char_ok: Callable[[Matcher], bool]) -> list[bool]:
    """Which rules match some text whose characters are read by classes char_ok takes: a fixed
    point over the alternatives."""
    ok = [False] * len(compiled.names)
    changed = True
    while changed:
        changed = False
        for rule, options in enumerate(compiled.alternatives):
            if not ok[rule] and any(_option_ok(option, ok, compiled, char_ok) for option in options):
                ok[rule] = changed = True
    return ok


def _option_ok(option: tuple[Element, ...], rule_ok: list[bool], compiled: Compiled,
               char_ok: Callable[[Matcher], bool]) -> bool:
    return all(rule_ok[v] if k == "rule" else char_ok(compiled.matchers[v]) for k, v in option)
