"""Fixtures for the benchmark tests: a text corpus, a trained tokenizer, mock servers."""

from __future__ import annotations

import random
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from inferlab.bench.mock import MockConfig
from inferlab.bench.mock_process import MockProcess

_WORDS = ("river", "stone", "light", "engine", "garden", "market", "winter", "signal", "paper",
          "valley", "the", "of", "and", "to", "in", "is", "was", "for", "a", "with", "north",
          "music", "table", "window", "station", "harbour", "season", "letter", "circle")


@pytest.fixture(scope="session")
def corpus(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A plain-text file of 20,000 words (seeded), to cut synthetic prompts from."""
    rng = random.Random(7)
    lines = [" ".join(rng.choice(_WORDS) for _ in range(20)) + " ." for _ in range(1000)]
    path = tmp_path_factory.mktemp("corpus") / "corpus.txt"
    path.write_text("\n".join(lines) + "\n")
    return path


@pytest.fixture(scope="session")
def tokenizer_json(corpus: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A byte-level BPE tokenizer trained on the corpus, saved as tokenizer.json."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=400, show_progress=False,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tokenizer.train([str(corpus)], trainer)
    path = tmp_path_factory.mktemp("tokenizer") / "tokenizer.json"
    tokenizer.save(str(path))
    return path


@pytest.fixture
def mock_server() -> Iterator[Callable[..., str]]:
    """mock_server(ttft_ms=50, ...) -> URL of a mock in its own process, closed after."""
    started: list[MockProcess] = []

    def start(**settings: object) -> str:
        process = MockProcess(MockConfig(**settings))  # type: ignore[arg-type]
        started.append(process)
        return process.url

    yield start
    for process in started:
        process.close()
