"""Tokenizers from a Hugging Face tokenizer.json or from GGUF metadata, plus chat templates."""

from __future__ import annotations

import dataclasses
import functools
import os
import reprlib
from collections.abc import Mapping
from typing import Any

from tokenizers import AddedToken, Regex, Tokenizer, decoders, models, normalizers, pre_tokenizers

from inferlab.errors import InferlabError, ModelLoadError
from inferlab.models.chat_template import read_template_file, render_chat
from inferlab.models.config import read_json_object
from inferlab.models.gguf import chat_template, field, token_id, typed_field
from inferlab.models.gguf_reader import GGUFFile

# Pre-tokenizer split patterns by GGUF `tokenizer.ggml.pre`, as each vocabulary was trained.
_GPT2_SPLIT = r"'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+"
_LLAMA3_SPLIT = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}"
                 r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+")
_QWEN2_SPLIT = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}"
                r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+")
# tokenizer.ggml.model values, as llama.cpp names its tokenizers
GGUF_TOKENIZER_MODELS = ("gpt2", "llama")
SPM_SPACE = "\u2581"  # how SentencePiece spells a space inside its tokens
GGUF_PRE_SPLITS = {
    "default": (False, _GPT2_SPLIT), "gpt2": (False, _GPT2_SPLIT),
    "smollm": (True, _GPT2_SPLIT),  # digits split one by one before the GPT-2 pattern
    "llama-bpe": (False, _LLAMA3_SPLIT), "llama3": (False, _LLAMA3_SPLIT),
    "qwen2": (False, _QWEN2_SPLIT),
}
# Llama 3's vocabularies: a word that is a token is one token, whatever the merges reach, and
# BOS goes first unless tokenizer.ggml.add_bos_token says otherwise (llama.cpp's settings)
GGUF_LLAMA3_PRES = {"llama-bpe", "llama3"}
# llama.cpp's token types: undefined, normal, unknown, control, user-defined, unused, byte
GGUF_TOKEN_TYPES = range(7)
# the special tokens besides BOS and EOS that chat templates see by name, as transformers passes
# its special_tokens_map to them
TEMPLATE_TOKEN_NAMES = ("unk_token", "sep_token", "pad_token", "cls_token", "mask_token")
# where a model folder keeps its templates, as transformers saves them: the default one, and
# others by name (NAME.jinja) in the folder beside it
CHAT_TEMPLATE_FILE = "chat_template.jinja"
CHAT_TEMPLATE_DIR = "additional_chat_templates"


@dataclasses.dataclass
class TokenizerInfo:
    """Special tokens and template that sit beside the vocabulary."""

    bos_token: str | None = None
    eos_token: str | None = None
    chat_template: str | None = None  # the default one
    tool_use_template: str | None = None  # the one for a chat given tools, where there is one
    # special tokens besides BOS and EOS by the name templates know them by (unk_token, ...)
    template_tokens: dict[str, str] = dataclasses.field(default_factory=dict)
    # only for GGUF; tokenizer.json carries its own post-processor
    add_bos_token: bool = False
    add_eos_token: bool = False


class TextTokenizer:
    """Encode, decode and render chat prompts; wraps a `tokenizers.Tokenizer`."""

    def __init__(self, tokenizer: Tokenizer, info: TokenizerInfo) -> None:
        self.backend = tokenizer
        self.info = info
        self.bos_token_id = self._id(info.bos_token)
        self.eos_token_id = self._id(info.eos_token)
        self.all_special_ids = {i for i, t in tokenizer.get_added_tokens_decoder().items() if t.special}

    def _id(self, token: str | None) -> int | None:
        return None if token is None else self.backend.token_to_id(token)

    @property
    def vocab_size(self) -> int:
        return self.backend.get_vocab_size(with_added_tokens=True)

    @functools.cached_property
    def max_token_chars(self) -> int:
        """The longest token's spelling: no token decodes to more characters (a byte-level
        token spells each byte with one character), so a text needs at least
        len(text) / max_token_chars tokens, up to what normalization may contract."""
        return max(map(len, self.backend.get_vocab(with_added_tokens=True)), default=1)

    @functools.cached_property
    def keeps_every_character(self) -> bool:
        """Whether every character of a text lands in some token, as with byte-level BPE and
        byte-fallback SentencePiece; a whitespace-splitting or cleaning tokenizer drops some, so
        a text's length says nothing of its tokens. Probed on what such tokenizers drop."""
        probe = " \t\n\r\x00\x01\u200b\ufeff  x" * 8
        tokens = self.backend.encode(probe, add_special_tokens=False).ids
        return len(tokens) * self.max_token_chars >= len(probe)

    @property
    def chat_template(self) -> str | None:
        return self.info.chat_template

    def encode(self, text: str, add_special_tokens: bool = True) -> list[int]:
        try:
            text.encode("utf-8")
        except UnicodeEncodeError as e:  # a lone surrogate, e.g. "\\ud800" in a JSON string
            raise InferlabError(f"the text is not valid Unicode: {e.reason} at character "
                                f"{e.start}") from None
        # encode_batch lets go of the GIL (encode holds it: 0.5 s for a 1 MB prompt), so the
        # server can tokenize in a worker thread while its event loop goes on streaming
        ids = self.backend.encode_batch([text], add_special_tokens=add_special_tokens)[0].ids
        wants_bos = add_special_tokens and self.info.add_bos_token and self.bos_token_id is not None
        if wants_bos and (not ids or ids[0] != self.bos_token_id):
            ids = [self.bos_token_id, *ids]
        if add_special_tokens and self.info.add_eos_token and self.eos_token_id is not None:
            ids = [*ids, self.eos_token_id]
        return ids

    def decode(self, ids: list[int], skip_special_tokens: bool = True) -> str:
        return self.backend.decode(ids, skip_special_tokens=skip_special_tokens)

    def id_to_token(self, token_id: int) -> str | None:
        return self.backend.id_to_token(token_id)

    def apply_chat_template(self, messages: list[dict[str, Any]], add_generation_prompt: bool = True,
                            template: str | None = None, tools: list[dict[str, Any]] | None = None,
                            variables: Mapping[str, Any] | None = None) -> str:
        """template: one to use instead of the model's (vLLM's --chat-template); tools:
        OpenAI-style tool definitions, the template's `tools` (None when there are none, and
        `documents` None unless variables give them, as transformers passes both), which pick
        the model's tool_use template where it has one, as transformers picks it; variables: more
        for the template (vLLM's chat_template_kwargs, e.g. Qwen3's enable_thinking), over the
        special tokens as transformers lays them."""
        if tools is not None:
            template = template or self.info.tool_use_template
        template = template or self.info.chat_template
        if not template:
            raise ModelLoadError("this model has no chat template; use a completion prompt, or "
                                 "give one with --chat-template")
        return render_chat(template, {
            "bos_token": self.info.bos_token or "", "eos_token": self.info.eos_token or "",
            **self.info.template_tokens, "tools": tools, "documents": None, **(variables or {}),
            "messages": messages, "add_generation_prompt": add_generation_prompt})


def _token_text(config: dict[str, Any], key: str, config_path: str) -> str | None:
    """A special token as tokenizer_config.json writes it: its text, or an AddedToken object
    whose "content" is the text; another type is a one-line error, not a TypeError at lookup."""
    value = config.get(key)
    text = value.get("content") if isinstance(value, dict) else value
    if text is not None and not isinstance(text, str):
        raise ModelLoadError(f"{config_path}: {key} must be a string or an object with a "
                             f"string 'content', got {value!r}")
    return text


def _template_tokens(config: dict[str, Any], config_path: str) -> dict[str, str]:
    """tokenizer_config.json's named special tokens besides BOS and EOS, and its model-specific
    ones (extra_special_tokens as an object, e.g. image_token), as transformers 5's
    special_tokens_map holds them: a list of extra tokens names none, so templates see none."""
    extra = config.get("extra_special_tokens")
    named = extra if isinstance(extra, dict) else {}
    tokens = {key: _token_text(config, key, config_path) for key in TEMPLATE_TOKEN_NAMES}
    tokens |= {key: _token_text(named, key, f"{config_path} extra_special_tokens") for key in named}
    return {key: text for key, text in tokens.items() if text is not None}


def _chat_templates(config: dict[str, Any], config_path: str, model_dir: str) -> dict[str, str]:
    """The folder's templates by name ("default", "tool_use", ...), as transformers reads them:
    its files, chat_template.jinja (the default) and additional_chat_templates/NAME.jinja, where
    there are any; else tokenizer_config.json's (a string, the default; or {name, template}
    objects)."""
    files = {"default": os.path.join(model_dir, CHAT_TEMPLATE_FILE)}
    named_dir = os.path.join(model_dir, CHAT_TEMPLATE_DIR)
    if os.path.isdir(named_dir):
        files |= {name.removesuffix(".jinja"): os.path.join(named_dir, name)
                  for name in os.listdir(named_dir) if name.endswith(".jinja")}
    templates = {name: read_template_file(path) for name, path in files.items()
                 if os.path.isfile(path)}
    template = config.get("chat_template")
    if templates or template is None:
        return templates
    if isinstance(template, str):
        return {"default": template}
    if isinstance(template, list) and all(
            isinstance(t, dict) and isinstance(t.get("name"), str)
            and isinstance(t.get("template"), str) for t in template):
        return {t["name"]: t["template"] for t in template}
    raise ModelLoadError(f"{config_path}: chat_template must be a string or a list of "
                         "{name, template} objects")


def load_hf_tokenizer(model_dir: str) -> TextTokenizer:
    path = os.path.join(model_dir, "tokenizer.json")
    if not os.path.isfile(path):
        raise ModelLoadError(f"{path}: missing (a fast tokenizer.json is required)")
    try:
        tokenizer = Tokenizer.from_file(path)
    except Exception as e:
        raise ModelLoadError(f"{path}: cannot be read ({e})") from None
    config_path = os.path.join(model_dir, "tokenizer_config.json")
    config = read_json_object(config_path) if os.path.isfile(config_path) else {}
    templates = _chat_templates(config, config_path, model_dir)
    info = TokenizerInfo(bos_token=_token_text(config, "bos_token", config_path),
                         eos_token=_token_text(config, "eos_token", config_path),
                         chat_template=templates.get("default"),
                         tool_use_template=templates.get("tool_use"),
                         template_tokens=_template_tokens(config, config_path))
    return TextTokenizer(tokenizer, info)


def load_gguf_tokenizer(reader: GGUFFile, path: str) -> TextTokenizer:
    kind = field(reader, "tokenizer.ggml.model")
    if kind not in GGUF_TOKENIZER_MODELS:
        raise ModelLoadError(f"{path}: GGUF tokenizer model {kind!r} is not supported (only "
                             "byte-level BPE 'gpt2' and SentencePiece 'llama'); load the Hugging "
                             "Face directory instead")
    tokens, types = _gguf_tokens(reader, path)
    if kind == "llama":
        # llama.cpp adds BOS to a SentencePiece vocabulary unless the file says otherwise
        info = _gguf_info(reader, path, tokens, add_bos_default=True)
        space_prefix = typed_field(reader, path, "tokenizer.ggml.add_space_prefix", bool,
                                   "true or false", True)
        tokenizer = _gguf_spm(tokens, _gguf_scores(reader, path, len(tokens)),
                              info.template_tokens.get("unk_token"), space_prefix)
    else:
        pre = typed_field(reader, path, "tokenizer.ggml.pre", str, "a pre-tokenizer name", "default")
        if pre not in GGUF_PRE_SPLITS:
            raise ModelLoadError(f"{path}: GGUF pre-tokenizer {pre!r} is not supported "
                                 f"(supported: {', '.join(GGUF_PRE_SPLITS)})")
        info = _gguf_info(reader, path, tokens, add_bos_default=pre in GGUF_LLAMA3_PRES)
        tokenizer = _gguf_bpe(tokens, _gguf_merges(reader, path, tokens), pre)
    _add_gguf_special_tokens(tokenizer, tokens, types)
    return TextTokenizer(tokenizer, info)


def _gguf_strings(reader: GGUFFile, path: str, name: str) -> list[str]:
    """tokenizer.ggml.NAME, a list of strings the tokenizer cannot do without."""
    value = field(reader, f"tokenizer.ggml.{name}")
    if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
        raise ModelLoadError(f"{path}: GGUF metadata tokenizer.ggml.{name} is missing or not "
                             "a list of strings")
    return value


def _gguf_tokens(reader: GGUFFile, path: str) -> tuple[list[str], list[int]]:
    """The GGUF's tokens and their types, one each."""
    tokens = _gguf_strings(reader, path, "tokens")
    types = _gguf_token_types(reader, path) or [1] * len(tokens)
    if len(types) != len(tokens):
        raise ModelLoadError(f"{path}: GGUF metadata tokenizer.ggml.token_type has {len(types)} "
                             f"entries for {len(tokens)} tokens")
    return tokens, types


def _gguf_merges(reader: GGUFFile, path: str, tokens: list[str]) -> list[tuple[str, ...]]:
    """The GGUF's merges, checked against its tokens: the tokenizers library panics mid-encode
    on a merge whose parts or result it lacks."""
    merges = [tuple(m.split(" ", 1)) for m in _gguf_strings(reader, path, "merges")]
    known = set(tokens)
    broken = next((m for m in merges if len(m) != 2 or not {*m, "".join(m)} <= known), None)
    if broken is not None:
        raise ModelLoadError(f"{path}: GGUF merge {' '.join(broken)!r} joins tokens into one that "
                             "tokenizer.ggml.tokens lacks")
    return merges


def _gguf_scores(reader: GGUFFile, path: str, count: int) -> list[float]:
    """tokenizer.ggml.scores, one number a token: a SentencePiece vocabulary's merge order."""
    scores = field(reader, "tokenizer.ggml.scores")
    if not isinstance(scores, list) or not all(
            isinstance(s, (int, float)) and not isinstance(s, bool) for s in scores):
        raise ModelLoadError(f"{path}: GGUF metadata tokenizer.ggml.scores is missing or not a "
                             "list of numbers (a SentencePiece vocabulary needs its scores)")
    if len(scores) != count:
        raise ModelLoadError(f"{path}: GGUF metadata tokenizer.ggml.scores has {len(scores)} "
                             f"entries for {count} tokens")
    return scores


def _gguf_token_types(reader: GGUFFile, path: str) -> list[int]:
    """tokenizer.ggml.token_type, each one of llama.cpp's types: another value ("3", 7) made
    no token a control token, silently."""
    types = field(reader, "tokenizer.ggml.token_type", [])
    bad = types if not isinstance(types, list) else next(
        (t for t in types if type(t) is not int or t not in GGUF_TOKEN_TYPES), None)
    if bad is not None:
        raise ModelLoadError(f"{path}: GGUF metadata tokenizer.ggml.token_type holds "
                             f"{reprlib.repr(bad)}, not a list of token types (whole numbers "
                             f"{GGUF_TOKEN_TYPES.start} to {GGUF_TOKEN_TYPES.stop - 1})")
    return types


def _gguf_bpe(tokens: list[str], merges: list[tuple[str, ...]], pre: str) -> Tokenizer:
    """Byte-level BPE as llama.cpp runs the GGUF's pre-tokenizer `pre`."""
    vocab = {tok: i for i, tok in enumerate(tokens)}
    tokenizer = Tokenizer(models.BPE(vocab=vocab, merges=merges, ignore_merges=pre in GGUF_LLAMA3_PRES))
    split_digits, pattern = GGUF_PRE_SPLITS[pre]
    steps = [pre_tokenizers.Digits(individual_digits=True)] if split_digits else []
    steps += [pre_tokenizers.Split(Regex(pattern), behavior="isolated"),
              pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)]
    tokenizer.pre_tokenizer = pre_tokenizers.Sequence(steps)
    tokenizer.decoder = decoders.ByteLevel()
    return tokenizer


def _gguf_spm(tokens: list[str], scores: list[float], unk_token: str | None,
              space_prefix: bool) -> Tokenizer:
    """SentencePiece BPE as llama.cpp runs it: spaces spelled "▁", one more before the text and
    after each special token when `space_prefix` (sentencepiece's dummy prefix, taken off
    again by the decoder), then the best-scored joins of adjacent pieces, and a character no
    token spells as its UTF-8 bytes' <0xXX> tokens. Like Llama 2's own tokenizer.json, not
    transformers' GGUF reader, which adds no space to a text that starts with one, so that
    " hi" decodes to "hi"."""
    vocab = {tok: i for i, tok in enumerate(tokens)}
    tokenizer = Tokenizer(models.BPE(vocab=vocab, merges=_spm_merges(vocab, scores),
                                     unk_token=unk_token, byte_fallback=True, fuse_unk=True))
    spaces = normalizers.Replace(" ", SPM_SPACE)
    # a normalizer, not a pre-tokenizer, prepends to every stretch between added tokens
    tokenizer.normalizer = (normalizers.Sequence([normalizers.Prepend(SPM_SPACE), spaces])
                            if space_prefix else spaces)
    steps = [decoders.Replace(SPM_SPACE, " "), decoders.ByteFallback(), decoders.Fuse()]
    tokenizer.decoder = decoders.Sequence(
        steps + [decoders.Strip(" ", 1, 0)] if space_prefix else steps)
    return tokenizer


def _spm_merges(vocab: dict[str, int], scores: list[float]) -> list[tuple[str, str]]:
    """llama.cpp's SentencePiece tokenizer joins, of all adjacent pieces, the pair whose join
    is the best-scored token; as BPE merges: every split of every token into two tokens,
    ranked by the whole token's score, best first (ties in vocabulary order)."""
    ranked = sorted((-scores[i], i, token[:cut], token[cut:])
                    for token, i in vocab.items() for cut in range(1, len(token))
                    if token[:cut] in vocab and token[cut:] in vocab)
    return [(left, right) for _, _, left, right in ranked]


def _add_gguf_special_tokens(tokenizer: Tokenizer, tokens: list[str], types: list[int]) -> None:
    """llama.cpp's UNKNOWN (2) and CONTROL (3) tokens as special tokens, never split (llama.cpp
    reads both in a text that may hold special tokens), and its USER_DEFINED ones (4) as added
    tokens, matched whole but not special."""
    tokenizer.add_special_tokens([AddedToken(t, special=True, normalized=False)
                                  for t, kind in zip(tokens, types, strict=True) if kind in (2, 3)])
    tokenizer.add_tokens([AddedToken(t, special=False, normalized=False)
                          for t, kind in zip(tokens, types, strict=True) if kind == 4])


def _gguf_info(reader: GGUFFile, path: str, tokens: list[str], add_bos_default: bool) -> TokenizerInfo:
    """The special tokens and chat templates of the GGUF's metadata."""
    def token_at(key: str) -> str | None:
        index = token_id(reader, path, key)
        if index is None:
            return None
        if not 0 <= index < len(tokens):
            raise ModelLoadError(f"{path}: GGUF metadata {key} is {index}, outside the "
                                 f"{len(tokens)} tokens")
        return tokens[index]

    # the tokens transformers reads from a GGUF's metadata besides BOS and EOS
    template_tokens = {"unk_token": token_at("tokenizer.ggml.unknown_token_id"),
                       "pad_token": token_at("tokenizer.ggml.padding_token_id")}
    return TokenizerInfo(bos_token=token_at("tokenizer.ggml.bos_token_id"),
                         eos_token=token_at("tokenizer.ggml.eos_token_id"),
                         chat_template=chat_template(reader, path),
                         # llama.cpp's convert writes a named template under the name
                         tool_use_template=chat_template(reader, path,
                                                         "tokenizer.chat_template.tool_use"),
                         template_tokens={k: t for k, t in template_tokens.items() if t is not None},
                         add_bos_token=typed_field(reader, path, "tokenizer.ggml.add_bos_token",
                                                   bool, "true or false", add_bos_default),
                         add_eos_token=typed_field(reader, path, "tokenizer.ggml.add_eos_token",
                                                   bool, "true or false", False))
