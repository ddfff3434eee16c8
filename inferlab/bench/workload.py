"""From `--data` to serialised request templates."""

from __future__ import annotations

import random
from dataclasses import dataclass

import httpx

from inferlab.bench.config import BenchConfig
from inferlab.bench.datasets import load_file
from inferlab.bench.dataspec import SyntheticSpec, is_synthetic, resolve_corpus
from inferlab.bench.synthetic import TextSource, synthetic_prompts
from inferlab.bench.templates import BodyOptions, RequestTemplate, make_template
from inferlab.bench.tokens import TokenCounter
from inferlab.errors import InferlabError

SYNTHETIC_POOL = 512  # distinct synthetic prompts; requests cycle through them, tagged


@dataclass(frozen=True)
class Workload:
    templates: tuple[RequestTemplate, ...]
    model: str
    description: str  # for the report: what the data was
    notes: tuple[str, ...]  # caveats the report prints (estimated lengths...)
    counter: TokenCounter  # for the output token cross-check


def resolve_model(base_url: str, model: str | None, headers: dict[str, str]) -> str:
    """The model to ask for: `--model`, else the first one the server lists.

    Also the first contact with the server, so an unreachable target fails here with
    a clear message instead of as thousands of request errors.
    """
    url = base_url.rstrip("/") + "/v1/models"
    try:
        response = httpx.get(url, headers=headers, timeout=10.0)
    except (httpx.InvalidURL, UnicodeError) as e:  # not HTTPErrors: raised before any request
        raise InferlabError(f"bad --target {base_url!r}: {e}") from None
    except httpx.HTTPError as e:
        raise InferlabError(f"cannot reach {url}: {e}; is the server running?") from None
    if model is not None:
        return model
    try:
        return str(response.json()["data"][0]["id"])
    except (ValueError, KeyError, IndexError, TypeError):
        raise InferlabError(f"{url} lists no model (HTTP {response.status_code}); "
                            "pass --model") from None


def build_workload(config: BenchConfig, model: str) -> Workload:
    data = config.data
    counter = TokenCounter(data.tokenizer)
    notes = []
    if not counter.exact:
        notes.append("no --tokenizer: prompt lengths are estimated from words and the "
                     "output token counts are not cross-checked")
    synthetic = is_synthetic(data.data)
    force = data.force_length if data.force_length is not None else synthetic
    if synthetic:
        spec = SyntheticSpec.parse(data.data)
        corpus = resolve_corpus(data.data_file)
        cap = config.limits.max_requests
        count = min(SYNTHETIC_POOL, cap) if cap else SYNTHETIC_POOL
        prompts = synthetic_prompts(spec, TextSource(corpus, counter), count,
                                    config.target.chat, data.seed)
        description = f"synthetic {data.data} cut from {corpus.name}"
    else:
        prompts = load_file(data.data, counter, data.default_output_tokens)
        random.Random(data.seed).shuffle(prompts)
        description = f"{data.data} ({len(prompts)} prompts)"
    options = BodyOptions(model, config.target.chat, force, config.target.continuous_usage,
                          config.target.extra_body)
    templates = tuple(make_template(p, options) for p in prompts)
    return Workload(templates, model, description, tuple(notes), counter)
