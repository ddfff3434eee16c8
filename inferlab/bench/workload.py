"""From `--data` to serialised request templates."""

from __future__ import annotations

import random
from dataclasses import dataclass

import httpx

from inferlab.bench.config import BenchConfig
from inferlab.bench.datasets import load_file
from inferlab.bench.dataspec import SyntheticSpec, is_synthetic, resolve_corpus
from inferlab.bench.synthetic import TextSource, synthetic_prompts, tag_tokens
from inferlab.bench.templates import BodyOptions, RequestTemplate, make_template
from inferlab.bench.tokens import TokenCounter
from inferlab.errors import InferlabError

SYNTHETIC_POOL = 512  # distinct synthetic prompts; requests cycle through them, tagged
POOL_TOKENS = 1 << 24  # ...fewer when they are long: each worker holds them all in memory


@dataclass(frozen=True)
class Workload:
    templates: tuple[RequestTemplate, ...]
    model: str
    description: str  # for the report: what the data was
    notes: tuple[str, ...]  # caveats the report prints (estimated lengths...)
    counter: TokenCounter  # for the output token cross-check
    forced_length: bool  # every request asks for exactly max_tokens (ignore_eos)
    # distinct prompts sent as written (a file's), which requests cycle through; 0: every
    # request is unique (synthetic prompts carry a tag)
    verbatim_prompts: int = 0


def resolve_model(base_url: str, model: str | None, headers: dict[str, str]) -> str:
    """The model to ask for: `--model`, else the first one the server lists.

    Also the first contact with the server, so an unreachable target or a model it does
    not serve fails here with a clear message instead of as thousands of request errors.
    """
    url = base_url.rstrip("/") + "/v1/models"
    try:
        response = httpx.get(url, headers=headers, timeout=10.0)
    except (httpx.InvalidURL, UnicodeError) as e:  # not HTTPErrors: raised before any request
        raise InferlabError(f"bad --target {base_url!r}: {e}") from None
    except httpx.HTTPError as e:
        raise InferlabError(f"cannot reach {url}: {e}; is the server running?") from None
    served = _listed_models(response)
    if model is None:
        if not served:
            raise InferlabError(f"{url} lists no model (HTTP {response.status_code}); "
                                "pass --model")
        return served[0]
    if served and model not in served:  # an unreadable or empty list proves nothing
        raise InferlabError(f"--model {model!r} is not served at {base_url}; it serves: "
                            f"{', '.join(served)}")
    return model


def _listed_models(response: httpx.Response) -> list[str]:
    """The model ids of a /v1/models answer; none when it is not such a list."""
    try:
        entries = response.json()["data"] if response.status_code == 200 else []
        return [str(entry["id"]) for entry in entries]
    except (ValueError, KeyError, TypeError):
        return []


def build_workload(config: BenchConfig, model: str) -> Workload:
    data = config.data
    counter = TokenCounter(data.tokenizer)
    notes = []
    synthetic = is_synthetic(data.data)
    if not counter.exact:
        notes.append("no --tokenizer: prompt lengths are estimated from words and the "
                     "output token counts are not cross-checked")
    elif synthetic and tag_tokens(counter) is None:  # file prompts carry no tag
        notes.append("--tokenizer merges digits unevenly, so requests' unique tags differ in "
                     "cost: prompt lengths may be a few tokens off")
    if synthetic:
        spec = SyntheticSpec.parse(data.data)
        corpus = resolve_corpus(data.data_file)
        prompts = synthetic_prompts(spec, TextSource(corpus, counter),
                                    pool_size(spec, config.limits.max_requests),
                                    config.target.chat, data.seed)
        description = f"synthetic {data.data} cut from {corpus.name}"
    else:
        prompts = load_file(data.data, counter, data.default_output_tokens)
        random.Random(data.seed).shuffle(prompts)
        count = len(prompts)
        description = f"{data.data} ({count} prompt{'' if count == 1 else 's'})"
    # --ignore-eos or not, else as each prompt asks: synthetic prompts and file rows with an
    # output count want exactly that many tokens (guidellm sends those with ignore_eos)
    options = BodyOptions(model, config.target.chat, data.force_length,
                          config.target.continuous_usage, config.target.extra_body)
    templates = tuple(make_template(p, options) for p in prompts)
    forced = all(t.ignore_eos for t in templates)
    verbatim = 0 if synthetic else len(templates)
    return Workload(templates, model, description, tuple(notes), counter, forced, verbatim)


def pool_size(spec: SyntheticSpec, max_requests: int | None) -> int:
    """How many distinct synthetic prompts to cut: no more than a stage sends, and no more
    than POOL_TOKENS tokens of them in all."""
    tokens_each = spec.prefix_tokens + spec.prompt.typical
    count = min(SYNTHETIC_POOL, max(1, POOL_TOKENS // max(1, tokens_each)))
    return min(count, max_requests) if max_requests else count
