"""Perplexity through the serving engine: the prompt logprobs of each window, one request each."""

from __future__ import annotations

from collections.abc import Sequence

import torch

from inferlab.engine.llm import LLM
from inferlab.engine.sampling_params import SamplingParams
from inferlab.models.loader import LoadedModel
from inferlab.planner.memory import kv_cache_bytes_per_token

_BLOCK_SIZE = 16


class EngineScorer:
    """An engine over already-loaded weights, with a KV cache for one window plus a block."""

    def __init__(self, loaded: LoadedModel, seq_len: int, dtype: torch.dtype, device: str) -> None:
        cfg = loaded.config
        element_bytes = torch.tensor([], dtype=dtype).element_size()
        bytes_per_token = kv_cache_bytes_per_token(cfg.num_layers, cfg.num_kv_heads, cfg.head_dim,
                                                   element_bytes)
        # the prompt, plus the block the one sampled token may open
        blocks = -(-seq_len // _BLOCK_SIZE) + 1
        # max_model_len: the window and that token, what this cache is sized for; left to the
        # model's own, the engine warned on every run that it lowered it to the cache's
        self.llm = LLM(loaded=loaded, dtype=dtype, device=device,  # EngineConfig names the torch dtype
                       block_size=_BLOCK_SIZE, kv_cache_memory=blocks * _BLOCK_SIZE * bytes_per_token,
                       max_model_len=seq_len + 1, max_num_seqs=1,
                       max_num_batched_tokens=max(seq_len, 2048))
        self.params = SamplingParams(max_tokens=1, prompt_logprobs=0, temperature=0.0,
                                     detokenize=False)

    def token_nll(self, ids: Sequence[int]) -> torch.Tensor:
        """ids [L] -> NLL of tokens 1..L-1 from the engine's prompt logprobs, float64 [L-1]."""
        (out,) = self.llm.generate([list(ids)], self.params, use_tqdm=False)  # a call per window
        entries = out.prompt_logprobs
        if entries is None or len(entries) != len(ids) or entries[0] is not None:
            raise RuntimeError(f"the engine returned {0 if entries is None else len(entries)} "
                               f"prompt logprobs for a {len(ids)}-token window")
        return -torch.tensor([e.logprob for e in entries[1:]], dtype=torch.float64)  # [L-1]
