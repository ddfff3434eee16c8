"""Calibration samples: random windows of a text file's tokens (the GPTQ paper's recipe).

The whole file is tokenized once (CRLF normalised) and `num_samples` windows of `seq_len`
tokens are drawn at seeded random offsets, so a run is reproducible.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch

from inferlab.errors import InferlabError
from inferlab.user_files import read_user_text

if TYPE_CHECKING:  # annotations only: `inferlab quantize --help` loads no tokenizer library
    from inferlab.models.tokenizer import TextTokenizer



def read_text(path: str) -> str:
    """The calibration file's text, CRLF line ends turned into LF."""
    return read_user_text(path, "calibration file (--calib)", as_lf=("\r\n",))


def sample_windows(token_ids: list[int], num_samples: int, seq_len: int, seed: int = 0,
                   source: str = "calibration text") -> torch.Tensor:
    """[num_samples, seq_len] int64 windows at random offsets of `token_ids`."""
    if num_samples < 1 or seq_len < 1:
        raise InferlabError(f"--num-samples and --seq-len must be positive, got {num_samples} "
                            f"and {seq_len}")
    ids = torch.tensor(token_ids, dtype=torch.int64)
    if ids.numel() < seq_len:
        raise InferlabError(f"{source}: {ids.numel()} tokens, fewer than one window of "
                            f"--seq-len {seq_len}")
    gen = torch.Generator().manual_seed(seed)
    starts = torch.randint(0, ids.numel() - seq_len + 1, (num_samples,), generator=gen)
    return torch.stack([ids[s:s + seq_len] for s in starts.tolist()])


def load_calibration(path: str, tokenizer: TextTokenizer, num_samples: int, seq_len: int,
                     seed: int = 0) -> torch.Tensor:
    """Read, tokenize (no special tokens) and sample a calibration file."""
    text = read_text(path)
    return sample_windows(tokenizer.encode(text, add_special_tokens=False), num_samples, seq_len,
                          seed, source=path)
