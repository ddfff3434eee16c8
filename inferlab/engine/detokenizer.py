"""Incremental detokenization and stop strings for one completion."""

from __future__ import annotations

from inferlab.engine.utf8_tokens import (
    ends_inside_a_character,
    split_utf8,
    token_bytes,
    unfinished_character,
)
from inferlab.models.tokenizer import TextTokenizer

# tokens decoded before the new ones, so merges across the boundary come out right
_CONTEXT_TOKENS = 5


class IncrementalDetokenizer:
    """Turns a growing list of token ids into text, never emitting half a UTF-8 character.

    Stop strings are searched across token boundaries; the text that could still be the start of
    a stop string is held back until it is known not to be.
    """

    def __init__(self, tokenizer: TextTokenizer, prompt_ids: list[int], stop: list[str],
                 include_stop: bool = False, skip_special_tokens: bool = True) -> None:
        self.tokenizer = tokenizer
        # a prompt may begin the window, or end, partway through a character: the window starts
        # where one begins, and the bytes of one not ended are read as new text, so the output
        # that ends it shows it (until the output shows it does not: _settle_prompt_tail)
        start = _whole_text_end(tokenizer, prompt_ids, max(len(prompt_ids) - _CONTEXT_TOKENS, 0),
                                skip_special_tokens)
        self.ids = list(prompt_ids[start:])
        self.prefix_offset = 0
        self.read_offset = _whole_text_end(tokenizer, self.ids, len(self.ids), skip_special_tokens)
        # the window's end while its unfinished character's bytes are read as new text and the
        # output has not yet said whether it goes on with them; None once it has
        self.prompt_end: int | None = len(self.ids) if self.read_offset < len(self.ids) else None
        self.stop = stop
        self.include_stop = include_stop
        self.skip_special_tokens = skip_special_tokens
        # text held back while it could still be the start of a stop string left out of the output
        self.hold = 0 if include_stop else max((len(s) for s in stop), default=1) - 1
        self.text = ""  # all decoded output text (after a stop string excluded)
        self.emitted = 0  # characters of self.text already returned as deltas

    def add(self, token_ids: list[int], finished: bool, find_stops: bool = True
            ) -> tuple[str, str | None]:
        """Append tokens; return (new text safe to show, the stop string hit or None). With
        find_stops False (min_tokens not reached) the new text is not searched, then or later."""
        self.ids.extend(token_ids)
        if self.prompt_end is not None:
            self._settle_prompt_tail()
        skip = self.skip_special_tokens
        prefix = self.tokenizer.decode(self.ids[self.prefix_offset:self.read_offset], skip)
        # a reply cut partway through a character ends without it: the tokens holding only its
        # bytes are left out (a byte fallback decodes each to a U+FFFD, and the whole characters
        # in the same run of bytes as well)
        end, straddled = len(self.ids), False
        if finished:
            end, straddled = _cut_character_start(self.tokenizer, self.ids, self.read_offset, skip)
        full = self.tokenizer.decode(self.ids[self.prefix_offset:end], skip)
        if straddled and full.endswith("\ufffd"):
            full = full[:-1]  # its first bytes' U+FFFD, after the whole text of their token (" \xe6")
        if len(full) > len(prefix) and (finished or not full.endswith("\ufffd")):
            new_from = len(self.text)
            self.text += full[len(prefix):]
            self.prefix_offset, self.read_offset = self.read_offset, len(self.ids)
            hit = self._find_stop(new_from) if find_stops else None
            if hit is not None:
                return self._delta(len(self.text)), hit
        end = len(self.text) if finished else max(len(self.text) - self.hold, self.emitted)
        return self._delta(end), None

    def _settle_prompt_tail(self) -> None:
        """The prompt's unfinished character is the output's to show only if the output's first
        byte goes on with it; an output that begins otherwise leaves those bytes, and their
        U+FFFD, in the prompt (as vLLM does). A special token skipped writes no byte, so the
        next decides; one written out ends the character."""
        tokenizer, prompt_end = self.tokenizer, self.prompt_end
        tail = unfinished_character(tokenizer, self.ids[self.read_offset:prompt_end])
        for token_id in self.ids[prompt_end:]:
            if token_id in tokenizer.all_special_ids:
                if self.skip_special_tokens:
                    continue
                continues = False
            else:
                first = _spelled(tokenizer, token_id)[:1]
                if not first:
                    continue
                continues = split_utf8(tail + first) is not None
            if not continues:
                self.read_offset = prompt_end
            self.prompt_end = None
            return

    def _find_stop(self, new_from: int) -> str | None:
        """The first stop string, in the order of the list, that ends in the text from
        `new_from` on (it may begin before), as vLLM's check_stop_strings looks for them: of two
        completed by the same tokens, the one listed first wins, wherever the other begins; one
        that lies wholly in text not searched (min_tokens) is not found later either."""
        for s in self.stop:
            i = self.text.find(s, max(new_from - len(s) + 1, 0))
            if i != -1:
                self.text = self.text[:i + (len(s) if self.include_stop else 0)]
                return s
        return None

    def _delta(self, end: int) -> str:
        end = min(end, len(self.text))
        delta, self.emitted = self.text[self.emitted:end], max(end, self.emitted)
        return delta


def _whole_text_end(tokenizer: TextTokenizer, ids: list[int], end: int, skip_special_tokens: bool) -> int:
    """The last token boundary at or before `end` that no character straddles. A special token
    written out (not skipped) ends the character before it: its bytes no longer join the next."""
    while (end > 0 and (skip_special_tokens or ids[end - 1] not in tokenizer.all_special_ids)
           and ends_inside_a_character(tokenizer, ids[:end])):
        end -= 1
    return end


def _cut_character_start(tokenizer: TextTokenizer, ids: list[int], begin: int, skip_special_tokens: bool
                         ) -> tuple[int, bool]:
    """For a reply cut partway through a character: where the tokens at or after `begin` that hold
    only its bytes begin (len(ids) for a reply that ends whole), and whether the token before them
    holds its first bytes after whole text (a byte-level " \\xe6"), which decodes to that text
    and one U+FFFD. A special token written out ends the character before it: bytes after it are
    stray, not a character cut."""
    left = len(unfinished_character(tokenizer, ids[begin:]))
    end = len(ids)
    while end > begin and left > 0:
        token_id = ids[end - 1]
        if token_id in tokenizer.all_special_ids:
            if not skip_special_tokens:
                return len(ids), False
        else:
            spelled = len(_spelled(tokenizer, token_id))
            if spelled > left:
                break
            left -= spelled
        end -= 1
    return end, left > 0


def _spelled(tokenizer: TextTokenizer, token_id: int) -> bytes:
    """The bytes a token writes (one of a byte-fallback vocabulary's <0xXX> its byte)."""
    return token_bytes(tokenizer, token_id, tokenizer.decode([token_id], False))
