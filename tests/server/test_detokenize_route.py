"""/detokenize as vLLM answers it: vLLM's create_detokenize calls `tokenizer.decode(ids)`, whose
default (transformers') keeps special tokens. It once skipped them: [0, 1, 2] gave "" and a chat
prompt read back lost its <|im_start|> / <|im_end|> markers."""

from __future__ import annotations

import httpx
from server_helpers import tokenize

# SmolLM2's template for one user message and its default system prompt, written out by hand
SMOLLM2_CHAT = ("<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained by "
                "Hugging Face<|im_end|>\n<|im_start|>user\nSay hi<|im_end|>\n<|im_start|>assistant\n")


def _detokenize(server, ids: list[int]) -> str:
    r = httpx.post(f"{server.url}/detokenize", json={"tokens": ids}, headers=server.headers,
                   timeout=30)
    assert r.status_code == 200, r.text
    return r.json()["prompt"]


def test_special_tokens_are_kept(server, hf_smollm_tokenizer):
    ids = [0, 1, 2]
    assert _detokenize(server, ids) == "<|endoftext|><|im_start|><|im_end|>"
    assert _detokenize(server, ids) == hf_smollm_tokenizer.decode(ids)


def test_a_chat_prompt_reads_back_as_its_template_text(server):
    ids = tokenize(server, messages=[{"role": "user", "content": "Say hi"}])
    assert _detokenize(server, ids) == SMOLLM2_CHAT
