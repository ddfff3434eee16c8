"""Batched sampling: penalties, temperature, top-k, top-p, min-p, seeds and logprobs.

One pass over the whole batch with per-row parameter tensors; a seeded request's rows bring
their own uniform draws (seeded_draws.SeededUniforms), so a seed gives the same tokens whatever
else is in the batch.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F

from inferlab.engine.outputs import TokenLogprobs
from inferlab.engine.request import NO_TOKEN
from inferlab.engine.sampling_params import SamplingParams
from inferlab.kernels import cpu_ops

CDF_BLOCK = 256  # vocabulary entries per block of the two-level inverse CDF


@dataclass
class SamplingBatch:
    """The sampling rows of one step, in logits-row order."""

    params: list[SamplingParams]
    # a seeded row's uniform draw [1] (float64, from its request's generator); None: drawn here
    uniforms: list[torch.Tensor | None]
    prompt_ids: list[list[int]]  # for the repetition penalty
    output_ids: list[list[int]]  # for all three penalties
    # per row, token ids it may not sample now: EOS and stop token ids before min_tokens, and
    # the bad words' next tokens
    suppressed_ids: list[list[int]] | None = None
    # per row, the only ids it may sample now (guided decoding's: ids, or a bool mask [V]),
    # None: its allowed_token_ids
    allowed_ids: list[list[int] | torch.Tensor | None] | None = None


def sample(logits: torch.Tensor, batch: SamplingBatch) -> tuple[torch.Tensor, list[TokenLogprobs | None]]:
    """logits [B, V] fp32 -> (token ids [B], per-row logprobs where asked).

    Logprobs describe the model's own distribution (before logit_bias, penalties and
    temperature), as the OpenAI API reports them. A row whose allowed and suppressed ids leave
    no token gets NO_TOKEN (its logprobs describe whatever token the draw named).
    """
    params = batch.params
    raw_logprobs = None
    if any(p.logprobs is not None for p in params):
        raw_logprobs = torch.log_softmax(logits, dim=-1)
    allowed = [p.allowed_token_ids for p in params]
    for row, ids in enumerate(batch.allowed_ids or ()):
        if ids is not None:
            allowed[row] = ids
    if any(ids is not None for ids in allowed):
        logits = keep_allowed(logits, allowed)
    if any(p.logit_bias for p in params) or any(batch.suppressed_ids or ()):
        logits = add_offsets(logits, logit_offsets(params, batch.suppressed_ids))
    if any(p.has_penalties for p in params):
        logits = apply_penalties(logits, batch)
    greedy = [p.greedy for p in params]
    if all(greedy):
        tokens = argmax(logits)
    else:
        tokens = _sample_random(logits, params, batch.uniforms)
        if any(greedy):
            tokens = torch.where(torch.tensor(greedy, device=logits.device), argmax(logits), tokens)
    logprobs: list[TokenLogprobs | None] = [None] * len(params)
    if raw_logprobs is not None:
        logprobs = gather_logprobs(raw_logprobs, tokens, [p.logprobs for p in params])
    dead = barred_rows(logits, allowed, batch.suppressed_ids)
    if dead is not None:
        tokens = tokens.masked_fill(dead, NO_TOKEN)
    return tokens, logprobs


def barred_rows(logits: torch.Tensor, allowed: list[list[int] | torch.Tensor | None],
                suppressed_ids: list[list[int]] | None) -> torch.Tensor | None:
    """[B] bool: the rows whose allowed ids and suppressed ids leave every logit at -inf (a bad
    word can bar, after some output, the last token allowed_token_ids left), where a draw would
    name a token nobody allowed; None when no row has either. Rows the model itself left at
    -inf are not the request's doing and are sampled as before."""
    rows = [row for row, ids in enumerate(allowed) if ids is not None or (suppressed_ids and suppressed_ids[row])]
    if not rows:
        return None
    dead = torch.zeros(logits.shape[0], dtype=torch.bool, device=logits.device)
    dead[rows] = torch.isneginf(logits[rows]).all(dim=-1)
    return dead


def argmax(logits: torch.Tensor) -> torch.Tensor:
    """[B, V] -> [B]: the C kernel on CPU (torch's CPU argmax is scalar: 3.5 ms for 64 rows of
    a 49k vocabulary here), torch elsewhere."""
    if _c_rows(logits):
        return cpu_ops.argmax(logits)
    return logits.argmax(dim=-1)


def _c_rows(logits: torch.Tensor) -> bool:
    """fp32 [B, V] CPU rows the C kernels (argmax, sample) take."""
    return (logits.device.type == "cpu" and logits.dtype == torch.float32 and logits.dim() == 2
            and logits.stride(1) == 1 and cpu_ops.available(logits))


def keep_allowed(logits: torch.Tensor, allowed: list[list[int] | torch.Tensor | None]) -> torch.Tensor:
    """logits [B, V] with every token outside a row's allowed ids at -inf (a copy); a row's
    allowed ids are a list, or a bool mask [V] (a JSON grammar state's); rows with None are
    left as they are."""
    rows = [row for row, ids in enumerate(allowed) if ids is not None]
    barred = torch.ones(len(rows), logits.shape[1], dtype=torch.bool, device=logits.device)  # [R, V]
    for i, row in enumerate(rows):
        ids = allowed[row]
        if isinstance(ids, torch.Tensor):  # a bool mask
            torch.logical_not(ids.to(barred.device), out=barred[i])
        else:
            barred[i, ids] = False
    logits = logits.clone()
    logits[rows] = logits[rows].masked_fill(barred, float("-inf"))
    return logits


def logit_offsets(params: list[SamplingParams], suppressed_ids: list[list[int]] | None
                  ) -> list[dict[int, float]]:
    """Per row, token id -> what is added to its logit before the penalties, as vLLM's logits
    processors do: its logit_bias, and -inf on the ids it may not sample yet (which no bias
    lifts)."""
    offsets = [dict(p.logit_bias or {}) for p in params]
    for row, ids in enumerate(suppressed_ids or ()):
        offsets[row].update(dict.fromkeys(ids, float("-inf")))
    return offsets


def add_offsets(logits: torch.Tensor, offsets: list[dict[int, float]]) -> torch.Tensor:
    """logits [B, V] plus each row's offsets at their token ids (a copy)."""
    rows = [row for row, offset in enumerate(offsets) for _ in offset]
    cols = [token for offset in offsets for token in offset]
    values = [value for offset in offsets for value in offset.values()]
    device = logits.device
    return logits.index_put((torch.tensor(rows, device=device), torch.tensor(cols, device=device)),
                            torch.tensor(values, dtype=logits.dtype, device=device), accumulate=True)


def apply_penalties(logits: torch.Tensor, batch: SamplingBatch) -> torch.Tensor:
    """Repetition (prompt and output), presence and frequency (output) penalties, as vLLM does."""
    rows, vocab = logits.shape
    device = logits.device
    counts = _token_counts(batch.output_ids, rows, vocab, device)  # [B, V]
    seen = _token_counts(batch.prompt_ids, rows, vocab, device) > 0
    seen |= counts > 0
    # a penalty fp32 rounds to 0 or inf (1e-50, 1e300) made a seen logit inf or NaN (0 * inf):
    # held to fp32's finite positive range, and the results to its finite values
    finite = torch.finfo(logits.dtype)
    rep = torch.tensor([p.repetition_penalty for p in batch.params], device=device)[:, None]
    rep = rep.clamp(finite.tiny, finite.max)
    freq = torch.tensor([p.frequency_penalty for p in batch.params], device=device)[:, None]
    pres = torch.tensor([p.presence_penalty for p in batch.params], device=device)[:, None]
    penalised = torch.where(logits > 0, logits / rep, logits * rep).clamp(-finite.max, finite.max)
    logits = torch.where(seen, penalised, logits)
    return logits - freq * counts - pres * (counts > 0).float()


def _token_counts(token_lists: list[list[int]], rows: int, vocab: int,
                  device: torch.device) -> torch.Tensor:
    width = max((len(t) for t in token_lists), default=0)
    counts = torch.zeros(rows, vocab + 1, device=device)  # column `vocab` absorbs the padding
    if width:
        ids = torch.tensor([t + [vocab] * (width - len(t)) for t in token_lists], device=device)
        counts.scatter_add_(1, ids, torch.ones_like(ids, dtype=counts.dtype))
    return counts[:, :vocab]


def _sample_random(logits: torch.Tensor, params: list[SamplingParams],
                   seeded: list[torch.Tensor | None]) -> torch.Tensor:
    device = logits.device
    temperatures = [1.0 if p.greedy else p.temperature for p in params]  # greedy: argmax later
    logits = top_k_top_p(logits, params)
    # Inverse CDF: one uniform draw per row (a seeded row's own) against the running mass.
    # Drawing noise for every vocabulary entry instead (an exponential race) cost ~25 ms a step
    # at 16 rows here.
    uniform = torch.rand(len(params), 1, device=device, dtype=torch.float64)
    for row, draw in enumerate(seeded):
        if draw is not None:
            uniform[row] = draw
    min_p = [p.min_p for p in params]
    if _c_rows(logits):  # one C call, not ~15 torch ops (~0.2 ms a step)
        return cpu_ops.sample(logits, temperatures, min_p, uniform)
    probs = torch.softmax(_tempered(logits, temperatures), dim=-1)  # [B, V]
    if any(m > 0 for m in min_p):
        floor = torch.tensor(min_p, device=device)[:, None] * probs.max(dim=-1, keepdim=True).values
        probs = probs.masked_fill(probs < floor, 0.0)
    return inverse_cdf(probs, uniform)


def _tempered(logits: torch.Tensor, temperatures: list[float]) -> torch.Tensor:
    if all(t == 1.0 for t in temperatures):  # a pass over [B, V] saved in the common case
        return logits
    # a temperature past fp32's largest would be inf, and a barred logit's -inf / inf NaN
    fp32_max = torch.finfo(torch.float32).max
    return logits / torch.tensor([min(t, fp32_max) for t in temperatures], device=logits.device)[:, None]


def inverse_cdf(probs: torch.Tensor, uniform: torch.Tensor) -> torch.Tensor:
    """probs [B, V] (non-negative, any total), uniform [B, 1] in [0, 1) -> token ids [B] drawn
    from probs / probs.sum(). Two levels, blocks of CDF_BLOCK entries and then within the
    chosen block, because a float64 cumsum over the whole vocabulary cost 16 ms a step at 64
    rows here. Never picks a zero-probability entry."""
    rows, vocab = probs.shape
    padded = F.pad(probs, (0, -vocab % CDF_BLOCK)) if vocab % CDF_BLOCK else probs
    blocks = padded.view(rows, -1, CDF_BLOCK)  # [B, NB, C]
    # fp32 sums of 256 entries, accumulated across blocks in float64
    block_cdf = blocks.sum(dim=-1).double().cumsum(dim=-1)  # [B, NB]
    target = uniform * block_cdf[:, -1:]  # [B, 1]
    block = torch.searchsorted(block_cdf, target, right=True).clamp_(max=blocks.shape[1] - 1)
    before = torch.where(block > 0, block_cdf.gather(1, (block - 1).clamp(min=0)), 0.0)
    chosen = blocks.gather(1, block[:, :, None].expand(-1, 1, CDF_BLOCK)).squeeze(1)  # [B, C]
    inner = chosen.cumsum(dim=-1, dtype=torch.float64)  # [B, C]
    # below the block's own total: summation order may put target - before a hair above it
    rest = torch.minimum(target - before, torch.nextafter(inner[:, -1:], torch.zeros_like(before)))
    token = block * CDF_BLOCK + torch.searchsorted(inner, rest, right=True)
    # a row with no mass at all (everything barred) must still name a token of the vocabulary
    return token.squeeze(1).clamp_(max=vocab - 1)


def top_k_top_p(logits: torch.Tensor, params: list[SamplingParams]) -> torch.Tensor:
    """logits [B, V] -> the same with the entries top-k and top-p drop at -inf. Only the rows
    that ask are touched, and each is ranked by its own tempered distribution, so a row's
    numbers never depend on what else is in the batch (a seed gives the same tokens alone or
    batched); temperature is applied later, to every row the same way. top-p's mass is taken
    after min-p, as vLLM orders them (min-p and top-k commute: both keep a head of the ranking,
    and min-p compares to the largest probability, which renormalizing leaves in proportion)."""
    rows = [row for row, p in enumerate(params) if p.top_k or p.top_p < 1.0]
    if not rows:
        return logits
    device = logits.device
    vocab = logits.shape[-1]
    picked = [params[row] for row in rows]
    # a top_k past the vocabulary keeps every token, as vLLM's does (and fits an int64)
    top_k = torch.tensor([min(p.top_k or vocab, vocab) for p in picked], device=device)
    top_p = torch.tensor([p.top_p for p in picked], device=device)
    index = torch.tensor(rows, device=device)
    asking = logits[index]  # [R, V]
    tempered = _tempered(asking, [1.0 if p.greedy else p.temperature for p in picked])
    # ranked by the logits themselves, the order any temperature gives: at a temperature of
    # ~1e39 every tempered logit is 0 in fp32, and the ranking would be lost to ties
    order = asking.argsort(dim=-1, descending=True, stable=True)  # [R, V]
    sorted_logits = tempered.gather(-1, order)
    ranks = torch.arange(vocab, device=device)[None, :]
    drop = ranks >= top_k[:, None]
    if any(p.min_p > 0 for p in picked):  # an exp over [R, V] only where some row asks
        min_p = torch.tensor([p.min_p for p in picked], device=device)[:, None]
        drop |= torch.exp(sorted_logits - sorted_logits[:, :1]) < min_p
    probs = torch.softmax(sorted_logits.masked_fill(drop, float("-inf")), dim=-1)
    # keep the smallest prefix whose mass reaches top_p (the token crossing it included); at
    # top_p = 1 nothing goes, though an fp32 running sum can reach 1 before the tail does; the
    # first token always stays (a top_p below fp32's smallest, 1e-46, reads as 0)
    mass_before = torch.cumsum(probs, dim=-1) - probs
    drop |= (mass_before >= top_p[:, None]) & (top_p[:, None] < 1.0) & (ranks > 0)
    dropped = torch.empty_like(drop).scatter_(-1, order, drop)  # [R, V], vocabulary order
    logits = logits.clone()
    logits[index] = asking.masked_fill(dropped, float("-inf"))
    return logits


def gather_logprobs(logprobs: torch.Tensor, tokens: torch.Tensor,
                    top_ns: list[int | None]) -> list[TokenLogprobs | None]:
    """logprobs [B, V], tokens [B] -> each asking row's chosen logprob, rank and top-n."""
    max_n = max((n for n in top_ns if n is not None), default=0)
    chosen = logprobs.gather(1, tokens[:, None]).squeeze(1)  # [B]
    ranks = (logprobs > chosen[:, None]).sum(dim=-1) + 1
    top_values, top_ids = logprobs.topk(max(max_n, 1), dim=-1)
    chosen_l, ranks_l = chosen.tolist(), ranks.tolist()
    tokens_l, values_l, ids_l = tokens.tolist(), top_values.tolist(), top_ids.tolist()
    result: list[TokenLogprobs | None] = []
    for row, n in enumerate(top_ns):
        if n is None:
            result.append(None)
            continue
        top = list(zip(ids_l[row][:n], values_l[row][:n], strict=True))
        result.append(TokenLogprobs(tokens_l[row], chosen_l[row], ranks_l[row], top))
    return result
