"""fp32 greedy generation equals transformers `generate`, token for token."""

from __future__ import annotations

import torch
from transformers import LogitsProcessor, LogitsProcessorList

from inferlab.engine.sampling_params import SamplingParams
from inferlab.kernels import cpu_ops
from inferlab.kernels.avx2_fp32_linear import Avx2Fp32Linear
from inferlab.kernels.onednn_linear import OneDnnLinear

PROMPTS = [
    "The capital of France is",
    "def fibonacci(n):",
    "Once upon a time, in a land far away,",
    "1, 2, 3, 4, 5,",
    "What is the boiling point of water?",
    "Les chats sont",
    "The quick brown fox jumps over the lazy dog. The quick brown fox",
    "In 1905, Albert Einstein published",
]


def test_eight_prompts_token_identical(make_llm, hf_smollm):
    llm = make_llm()
    # fp32 linears run on oneDNN or the AVX2 kernel, not on torch's F.linear as in transformers
    model = llm.engine.loaded.model
    kernel = (Avx2Fp32Linear if cpu_ops.avx2_quant_linear_available() else OneDnnLinear)
    assert isinstance(model.lm_head, kernel) and isinstance(model.model.layers[0].mlp.down_proj, kernel)
    outputs = llm.generate(PROMPTS, SamplingParams(temperature=0, max_tokens=32))
    for prompt, out in zip(PROMPTS, outputs, strict=True):
        ids = llm.tokenizer.encode(prompt)
        with torch.no_grad():
            expected = hf_smollm.generate(torch.tensor([ids]), do_sample=False, max_new_tokens=32,
                                          attention_mask=torch.ones(1, len(ids), dtype=torch.long))
        assert out.outputs[0].token_ids == expected[0, len(ids):].tolist(), prompt


def test_logprobs_are_the_reference_distribution(make_llm, hf_smollm):
    llm = make_llm()
    out = llm.generate(PROMPTS[0], SamplingParams(temperature=0, max_tokens=6, logprobs=3))[0]
    ids = llm.tokenizer.encode(PROMPTS[0]) + out.outputs[0].token_ids
    with torch.no_grad():
        reference = torch.log_softmax(hf_smollm(torch.tensor([ids])).logits[0].float(), dim=-1)
    prompt_len = len(ids) - 6
    for i, entry in enumerate(out.outputs[0].logprobs):
        row = reference[prompt_len - 1 + i]
        assert entry.token_id == out.outputs[0].token_ids[i]
        assert abs(entry.logprob - row[entry.token_id].item()) < 1e-3
        assert entry.rank == 1  # greedy picks the most likely token
        assert [t for t, _ in entry.top] == row.topk(3).indices.tolist()
    # vLLM's cumulative_logprob: the completion's log-probability given the prompt
    completion = torch.tensor(out.outputs[0].token_ids)
    rows = reference[prompt_len - 1:prompt_len - 1 + 6]
    assert abs(out.outputs[0].cumulative_logprob - rows.gather(1, completion[:, None]).sum().item()) < 1e-3
    unasked = llm.generate(PROMPTS[0], SamplingParams(temperature=0, max_tokens=2))[0].outputs[0]
    assert unasked.cumulative_logprob is None


def test_prompt_logprobs_match_reference(make_llm, hf_smollm):
    llm = make_llm(max_num_batched_tokens=8)  # chunked: the prompt spans several steps
    prompt = "The quick brown fox jumps over the lazy dog again and again."
    out = llm.generate(prompt, SamplingParams(temperature=0, max_tokens=1, prompt_logprobs=0))[0]
    ids = out.prompt_token_ids
    with torch.no_grad():
        reference = torch.log_softmax(hf_smollm(torch.tensor([ids])).logits[0].float(), dim=-1)
    assert out.prompt_logprobs[0] is None and len(out.prompt_logprobs) == len(ids)
    for i in range(1, len(ids)):
        assert abs(out.prompt_logprobs[i].logprob - reference[i - 1, ids[i]].item()) < 1e-3


class _OpenAIPenalties(LogitsProcessor):
    """Presence and frequency penalties as the OpenAI API defines them, over the generated
    tokens only: logit - frequency * count - presence * (count > 0)."""

    def __init__(self, prompt_len: int, presence: float, frequency: float) -> None:
        self.prompt_len, self.presence, self.frequency = prompt_len, presence, frequency

    def __call__(self, input_ids: torch.Tensor, scores: torch.Tensor) -> torch.Tensor:
        generated = input_ids[:, self.prompt_len:]
        counts = torch.zeros_like(scores).scatter_add_(1, generated, torch.ones_like(scores[:, :1]).expand_as(generated))
        return scores - self.frequency * counts - self.presence * (counts > 0).float()


def test_penalties_in_a_mixed_batch_match_transformers(make_llm, hf_smollm):
    """Greedy rows with and without penalties in one batch: repetition (prompt and output
    tokens) against transformers' own `repetition_penalty`, presence and frequency against a
    transformers logits processor written from the OpenAI definition. Each row must get its
    own prompt and output ids, and the unpenalised row must stay plain greedy."""
    llm = make_llm()
    penalties = [dict(repetition_penalty=1.3), {}, dict(presence_penalty=1.5, frequency_penalty=0.5),
                 dict(repetition_penalty=1.2, presence_penalty=0.5, frequency_penalty=1.0)]
    prompts = [PROMPTS[3], PROMPTS[6], PROMPTS[0], PROMPTS[3]]
    outputs = llm.generate(prompts, [SamplingParams(temperature=0, max_tokens=24, **p) for p in penalties])
    for prompt, p, out in zip(prompts, penalties, outputs, strict=True):
        ids = llm.tokenizer.encode(prompt)
        extra = LogitsProcessorList([_OpenAIPenalties(len(ids), p.get("presence_penalty", 0.0),
                                                      p.get("frequency_penalty", 0.0))])
        with torch.no_grad():
            expected = hf_smollm.generate(torch.tensor([ids]), do_sample=False, max_new_tokens=24,
                                          attention_mask=torch.ones(1, len(ids), dtype=torch.long),
                                          repetition_penalty=p.get("repetition_penalty", 1.0),
                                          logits_processor=extra)
        assert out.outputs[0].token_ids == expected[0, len(ids):].tolist(), p
