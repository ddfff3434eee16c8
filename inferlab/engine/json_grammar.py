"""A JSON object recognizer one character at a time, for guided decoding (OpenAI's json_object).

The text must be one JSON object (RFC 8259) with nothing before or after it: whitespace is
taken between tokens inside, not around, so a model cannot pad without end before or after
the object. A state is a hashable (mode, open containers) pair: `step` returns the state after
one more character, or None when no JSON object starts with the text so far. Being hashable,
states key the token filter's cache (guided_json.py).
"""

from __future__ import annotations

State = tuple[str, tuple[str, ...]]  # (mode, the open containers: "{" or "[", outermost first)

START: State = ("start", ())
DONE = "done"  # the object is closed: only the end of the text may follow
WHITESPACE = frozenset(" \t\n\r")
_DIGITS = frozenset("0123456789")
_HEX = frozenset("0123456789abcdefABCDEF")
_ESCAPED = {'"', "\\", "/", "b", "f", "n", "r", "t"}
_LITERALS = {"t": "l_rue", "f": "l_alse", "n": "l_ull"}
# modes where a number may end: the next character is then read after the value
_NUMBER_ENDS = {"n_zero", "n_int", "n_frac", "n_exp"}
_NUMBER_STEPS = {  # mode -> {character class: next mode}
    "n_minus": {"0": "n_zero", "1": "n_int"},
    "n_zero": {".": "n_dot", "e": "n_e"},
    "n_int": {"0": "n_int", "1": "n_int", ".": "n_dot", "e": "n_e"},
    "n_dot": {"0": "n_frac", "1": "n_frac"},
    "n_frac": {"0": "n_frac", "1": "n_frac", "e": "n_e"},
    "n_e": {"+": "n_sign", "0": "n_exp", "1": "n_exp"},
    "n_sign": {"0": "n_exp", "1": "n_exp"},
    "n_exp": {"0": "n_exp", "1": "n_exp"},
}


def _number_class(ch: str) -> str:
    if ch == "0":
        return "0"
    if ch in _DIGITS:
        return "1"
    return {"E": "e", "-": "+"}.get(ch, ch)


def _after_value(stack: tuple[str, ...]) -> State:
    return ("after", stack) if stack else (DONE, ())


def _start_value(ch: str, stack: tuple[str, ...]) -> State | None:
    if ch == "{":
        return ("obj", (*stack, "{"))
    if ch == "[":
        return ("arr", (*stack, "["))
    if ch == '"':
        return ("str", stack)
    if ch in _DIGITS or ch == "-":
        return ({"-": "n_minus", "0": "n_zero"}.get(ch, "n_int"), stack)
    mode = _LITERALS.get(ch)
    return None if mode is None else (mode, stack)


def _in_string(mode: str, ch: str, stack: tuple[str, ...]) -> State | None:
    """Modes str/key (a value or a key), their escapes (_esc) and \\u digits (_u1.._u4)."""
    kind, _, sub = mode.partition("_")
    if not sub:
        if ch == '"':
            return ("colon", stack) if kind == "key" else _after_value(stack)
        if ch == "\\":
            return (f"{kind}_esc", stack)
        return None if ch < " " else (mode, stack)  # control characters must be escaped
    if sub == "esc":
        if ch == "u":
            return (f"{kind}_u1", stack)
        return (kind, stack) if ch in _ESCAPED else None
    if ch not in _HEX:
        return None
    n = int(sub[1])
    return (kind, stack) if n == 4 else (f"{kind}_u{n + 1}", stack)


def step(state: State, ch: str) -> State | None:
    """The state after one more character `ch`, or None if the text can no longer be JSON."""
    mode, stack = state
    if mode.startswith(("str", "key")):
        return _in_string(mode, ch, stack)
    if mode.startswith("n_"):
        nxt = _NUMBER_STEPS[mode].get(_number_class(ch))
        if nxt is not None:
            return (nxt, stack)
        return step(_after_value(stack), ch) if mode in _NUMBER_ENDS else None
    if mode.startswith("l_"):
        rest = mode[2:]
        if ch != rest[0]:
            return None
        return _after_value(stack) if len(rest) == 1 else (f"l_{rest[1:]}", stack)
    if mode == "start":
        return ("obj", ("{",)) if ch == "{" else None
    if mode == DONE:
        return None
    if ch in WHITESPACE:
        return state
    return _structural(mode, ch, stack)


def _structural(mode: str, ch: str, stack: tuple[str, ...]) -> State | None:
    """Between tokens: after '{' (obj), '[' (arr), ',' in an object (next_key), a key (colon),
    ':' or ',' in an array (value), and a value in a container (after)."""
    closer = "}" if stack and stack[-1] == "{" else "]"
    if mode in ("obj", "next_key"):
        if ch == '"':
            return ("key", stack)
        return _after_value(stack[:-1]) if ch == "}" and mode == "obj" else None
    if mode == "colon":
        return ("value", stack) if ch == ":" else None
    if mode == "arr" and ch == "]":
        return _after_value(stack[:-1])
    if mode in ("arr", "value"):
        return _start_value(ch, stack)
    if mode == "after":
        if ch == ",":
            return ("next_key" if closer == "}" else "value", stack)
        return _after_value(stack[:-1]) if ch == closer else None
    raise ValueError(f"unknown JSON state {mode!r}")


def advance(state: State | None, text: str) -> State | None:
    """The state after `text`, or None as soon as it cannot be part of a JSON object."""
    for ch in text:
        if state is None:
            return None
        state = step(state, ch)
    return state


def is_complete(state: State | None) -> bool:
    return state is not None and state[0] == DONE
