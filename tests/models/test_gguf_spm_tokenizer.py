"""GGUF files with a SentencePiece vocabulary (tokenizer.ggml.model "llama": Llama 1/2, Mistral 7B,
TinyLlama, CodeLlama) tokenize as llama.cpp does. The reference is transformers' GGUF tokenizer
for a phi3 file: the same SentencePiece BPE with its space prepended by a normalizer, which is
llama.cpp's rule (a space before the text and after each special token). transformers' reader
for a llama file prepends with Metaspace instead, which adds none to a text that starts with a
space (" hi" comes back "hi"), so it is the reference only for texts where the two agree."""

from __future__ import annotations

from pathlib import Path

import gguf
import pytest
from tokenizers import Tokenizer, models, pre_tokenizers, trainers

from inferlab.errors import ModelLoadError
from inferlab.models.gguf import open_gguf
from inferlab.models.tokenizer import load_gguf_tokenizer

from .raw_gguf import llama_metadata, llama_tensors, write_gguf
from .tiny_gguf import write_tiny_gguf

SENTENCES = ["The quick brown fox jumps over the lazy dog.", "Hello world, hello there!",
             "the theory of everything", "quickly quicker quickest", "  indented\n\tcode = 1"]
SPECIALS = ["<unk>", "<s>", "</s>"]  # llama.cpp's ids 0, 1, 2, as Llama 2's vocabulary has them
BYTE_TOKENS = [f"<0x{byte:02X}>" for byte in range(256)]
UNKNOWN, CONTROL, NORMAL, BYTE = 2, 3, 1, 6  # llama.cpp's token types
TEXTS = ["The quick brown fox", "hello there", "Hello\nworld\n\n", "a  b   c", "tab\there",
         " leading", "   three leading", "trailing  ", " ", "  ", "\n", "",
         "日本語", "emoji 😀 here", "naïve café", "mixed 漢字 and text",
         "x</s>y", "<s>hi", "</s>", "<s> spaced </s> out", "<unk>", "<0x41>"]


def spm_vocabulary() -> tuple[list[str], list[float], list[int]]:
    """tokens, scores and types as llama.cpp's convert writes a SentencePiece BPE vocabulary:
    the specials, the 256 byte tokens, then the pieces, the earlier learned the higher scored."""
    bpe = Tokenizer(models.BPE())
    bpe.pre_tokenizer = pre_tokenizers.Metaspace()
    bpe.train_from_iterator(SENTENCES, trainers.BpeTrainer(vocab_size=120, show_progress=False))
    pieces = sorted(bpe.get_vocab(), key=bpe.token_to_id)
    tokens = [*SPECIALS, *BYTE_TOKENS, *pieces]
    scores = [0.0] * (len(SPECIALS) + len(BYTE_TOKENS)) + [-float(i) for i in range(len(pieces))]
    types = [UNKNOWN, CONTROL, CONTROL, *[BYTE] * len(BYTE_TOKENS), *[NORMAL] * len(pieces)]
    return tokens, scores, types


TOKENS, SCORES, TYPES = spm_vocabulary()
TOKENIZER = {"tokenizer.ggml.model": "llama", "tokenizer.ggml.tokens": TOKENS,
             "tokenizer.ggml.scores": SCORES, "tokenizer.ggml.token_type": TYPES,
             "tokenizer.ggml.unknown_token_id": 0, "tokenizer.ggml.bos_token_id": 1,
             "tokenizer.ggml.eos_token_id": 2}


def ours(path: Path):
    return load_gguf_tokenizer(open_gguf(str(path)), str(path))


def tokenizer_file(tmp_path: Path, **changes: object) -> Path:
    metadata = {key: value for key, value in {**TOKENIZER, **changes}.items() if value is not None}
    return write_tiny_gguf(tmp_path / "spm.gguf", **metadata)


def transformers_tokenizer(path: Path, architecture: str):
    """transformers' tokenizer for TOKENIZER in a metadata-only GGUF of `architecture`."""
    from transformers import AutoTokenizer

    writer = gguf.GGUFWriter(str(path), architecture)
    for key, value in TOKENIZER.items():
        writer.add_key_value(key, value, gguf.GGUFValueType.get_type(value),
                             sub_type=gguf.GGUFValueType.get_type(value[0])
                             if isinstance(value, list) else None)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return AutoTokenizer.from_pretrained(str(path.parent), gguf_file=path.name)


@pytest.fixture(scope="module")
def references(tmp_path_factory):
    folder = tmp_path_factory.mktemp("spm")
    return {arch: transformers_tokenizer(folder / f"{arch}.gguf", arch) for arch in ("phi3", "llama")}


@pytest.mark.parametrize("text", TEXTS)
def test_encode_and_decode_as_llama_cpp(tmp_path, references, text):
    tokenizer, reference = ours(tokenizer_file(tmp_path)), references["phi3"]
    for special in (True, False):
        ids, want = tokenizer.encode(text, add_special_tokens=special), reference.encode(
            text, add_special_tokens=special)
        # the engine adds no BOS before one the text starts with (TextTokenizer.encode)
        assert ids == (want[1:] if want[:2] == [1, 1] else want), [TOKENS[i] for i in ids]
        for skip in (True, False):
            assert tokenizer.decode(ids, skip_special_tokens=skip) == reference.decode(
                ids, skip_special_tokens=skip)
    if not text.startswith(" ") and not any(s in text for s in SPECIALS[1:]):
        assert tokenizer.encode(text) == references["llama"].encode(text)


def test_byte_fallback_and_space_prefix_by_hand(tmp_path):
    tokenizer = ours(tokenizer_file(tmp_path))
    spelled = [TOKENS[i] for i in tokenizer.encode(" é", add_special_tokens=False)]
    assert spelled == ["▁", "▁", "<0xC3>", "<0xA9>"]  # the prefix space, the text's, é's UTF-8
    assert tokenizer.decode(tokenizer.encode(" é")) == " é"
    assert tokenizer.encode("The") == [1, TOKENS.index("▁The")]


def test_add_space_prefix_false_prepends_nothing(tmp_path):
    tokenizer = ours(tokenizer_file(tmp_path, **{"tokenizer.ggml.add_space_prefix": False}))
    ids = tokenizer.encode("The fox", add_special_tokens=False)
    assert [TOKENS[i] for i in ids] == ["The", "▁fox"]
    assert tokenizer.decode(ids) == "The fox"
    assert tokenizer.decode(tokenizer.encode(" x")) == " x"


@pytest.mark.parametrize(("flags", "bos", "eos"), [
    ({}, [1], []),  # llama.cpp's default for SentencePiece: BOS, no EOS
    ({"tokenizer.ggml.add_bos_token": False, "tokenizer.ggml.add_eos_token": True}, [], [2]),
])
def test_bos_and_eos_as_the_file_says(tmp_path, flags, bos, eos):
    tokenizer = ours(tokenizer_file(tmp_path, **flags))
    assert tokenizer.encode("fox") == [*bos, *tokenizer.encode("fox", add_special_tokens=False), *eos]


@pytest.mark.parametrize(("change", "words"), [
    ({"tokenizer.ggml.scores": None}, "tokenizer.ggml.scores is missing or not a list of numbers"),
    ({"tokenizer.ggml.scores": [0.0, 1.0]}, f"scores has 2 entries for {len(TOKENS)} tokens"),
    ({"tokenizer.ggml.model": "bert"}, "GGUF tokenizer model 'bert' is not supported"),
])
def test_metadata_that_cannot_make_a_tokenizer(tmp_path, change, words):
    with pytest.raises(ModelLoadError, match=words):
        ours(tokenizer_file(tmp_path, **change))


def spm_model(tmp_path: Path, **changes: object) -> Path:
    """A tiny random Llama GGUF with TOKENIZER (changed) for its vocabulary."""
    return write_gguf(tmp_path / "m.gguf", tensors=llama_tensors(vocab_size=len(TOKENS)),
                      metadata=llama_metadata(**{**TOKENIZER, "tokenizer.ggml.merges": None,
                                                 **changes}))


def test_generation_on_a_llama_gguf_with_a_sentencepiece_vocabulary(tmp_path):
    """The completions' text is the tokenizer's decode of prompt and completion together, less
    the prompt's (the space a "▁" piece starts with is kept, as vLLM keeps it). Sampled from the
    vocabulary's pieces: a random model's byte tokens need not make UTF-8."""
    from inferlab.engine.llm import LLM
    from inferlab.engine.sampling_params import SamplingParams

    path = spm_model(tmp_path)
    llm = LLM(str(path), dtype="float32", device="cpu", kv_cache_memory="16MiB", max_model_len=64)
    tokenizer, prompt = ours(path), "The quick brown 😀"
    pieces = [i for i, kind in enumerate(TYPES) if kind == NORMAL]
    params = SamplingParams(max_tokens=24, temperature=1.0, seed=0, n=4, allowed_token_ids=pieces)
    result = llm.generate(prompt, params, use_tqdm=False)[0]
    assert result.prompt_token_ids == tokenizer.encode(prompt)
    assert [TOKENS[i] for i in result.prompt_token_ids[-5:]] == [
        "▁", "<0xF0>", "<0x9F>", "<0x98>", "<0x80>"]
    for output in result.outputs:
        whole = tokenizer.decode(result.prompt_token_ids + output.token_ids)
        assert whole.startswith(prompt)
        assert output.text == whole[len(prompt):]


def test_a_file_without_scores_is_one_line_for_generate(tmp_path, one_line_error):
    path = spm_model(tmp_path, **{"tokenizer.ggml.scores": None})
    assert "tokenizer.ggml.scores is missing" in one_line_error(
        "generate", "Hello", path, "--max-tokens", "1")
