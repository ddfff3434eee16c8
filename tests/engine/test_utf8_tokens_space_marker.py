"""Which vocabularies spell a space with a marker their decoder turns back (and strips from a
text's front): SentencePiece's, as Llama 2's and T5's tokenizer.json write their decoders."""

from __future__ import annotations

import pytest
from tokenizers import Regex, Tokenizer, decoders, models

from inferlab.engine.utf8_tokens import space_marker
from inferlab.models.tokenizer import TextTokenizer, TokenizerInfo

LLAMA2 = decoders.Sequence([decoders.Replace("\u2581", " "), decoders.ByteFallback(),
                            decoders.Fuse(), decoders.Strip(" ", 1, 0)])


@pytest.mark.parametrize(("decoder", "marker"), [
    (LLAMA2, "\u2581"),
    (decoders.Metaspace(), "\u2581"),
    (decoders.Metaspace(replacement="_"), "_"),
    (decoders.ByteLevel(), None),                       # GPT-2's: every byte has a character
    (decoders.WordPiece(), None),
    (decoders.Replace(Regex("\u2581+"), " "), None),     # a pattern, not one marker character
    (decoders.Replace("\u2581", "_"), None),             # not a space it makes
    (None, None),
])
def test_space_marker_is_read_from_the_decoder(decoder, marker):
    backend = Tokenizer(models.BPE(vocab={"<unk>": 0}, merges=[], unk_token="<unk>"))
    if decoder is not None:
        backend.decoder = decoder
    assert space_marker(TextTokenizer(backend, TokenizerInfo())) == marker
