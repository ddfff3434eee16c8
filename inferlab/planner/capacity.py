"""Capacity and cost: how many replicas serve a request rate within a latency SLO.

A replica with continuous batching keeps `b` sequences decoding; each new request's prompt is
prefilled inside the same steps (chunked prefill). Those steps read the weights for their decode
tokens anyway, so a prompt adds T_prefill, the time of its own FLOPs and K/V traffic alone (a
16-token prompt costs its 16 tokens' FLOPs, not a weight read). In one second a replica spends
r × T_prefill on prompts and the rest on decode steps of b tokens, so serving r requests of O
output tokens needs r × O = b × (1 − r × T_prefill) / t_step(b), that is

    r(b)   = b / (O × t_step(b) + b × T_prefill)        requests/s per replica
    ITL(b) = t_step(b) + b × T_prefill / O              each prompt's prefill, spread over O steps

T_prefill is added to the step time, not hidden under its reads: a prompt's FLOPs run mostly in
kernels of their own (its attention; matmul rows past the decodes'), so a long compute-bound
prompt costs all of its FLOPs' time, as it would alone.

A step computes at most B = max_num_batched_tokens tokens, which caps the batch a replica keeps:
each step holds its b decodes and the prompts of the b / O requests that replace those finishing,
b + b × P / O <= B, so b <= B × O / (P + O) (past it the steps are full and prompts queue). The
scheduler serves the running sequences first, so a prompt gets the B − (b − 1) tokens the
others' decodes leave: it goes in
⌈P / (B − b + 1)⌉ chunks, each in a step that also decodes the b − 1 others, and TTFT(b) is the
roofline time of those steps (weights read once a step; at batch 1, the plain chunked prefill).
No more than B sequences decode at once. The budget also caps the rate: each request needs
P + O of the B tokens a step (of at least t_step(b)) computes, so r(b) is at most
B / ((P + O) × t_step(b)).

The planner takes the batch with the highest r(b) that meets both SLOs and fits in memory. Where
r(b) peaks below the batch those allow, what binds is the step budget's cap on the rate
(max_num_batched_tokens) or, on hardware whose steps slow faster than the batch grows, the step time.
Queueing near saturation adds to TTFT; these figures are for a replica at its capacity.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from inferlab.errors import InferlabError
from inferlab.key_values import bad_value, key_value_list
from inferlab.planner.hardware import Hardware
from inferlab.planner.roofline import ModelCost, decode_step, prefill_riding, time_to_first_token


def _parse_pairs(text: str, keys: tuple[str, ...], flag: str) -> dict[str, float]:
    """`prompt=1024,output=256` -> {'prompt': 1024.0, 'output': 256.0}; unknown keys are errors."""
    values: dict[str, float] = {}
    form = ",".join(k + "=N" for k in keys)
    for key, value in key_value_list(text, flag, form, keys).items():
        try:
            number = float(value)
        except ValueError:
            number = math.nan
        if not math.isfinite(number):
            raise bad_value(flag, key, value, "a finite number")
        values[key] = number
    return values


@dataclass(frozen=True)
class Workload:
    prompt_tokens: int = 1024
    output_tokens: int = 256

    def __post_init__(self) -> None:
        if self.prompt_tokens < 1 or self.output_tokens < 1:
            raise InferlabError(f"workload: prompt and output must be at least 1 token, got "
                                f"prompt={self.prompt_tokens},output={self.output_tokens}")

    @classmethod
    def parse(cls, text: str) -> Workload:
        if not text.strip():
            raise InferlabError("--workload is empty: give prompt=N,output=N tokens")
        values = _parse_pairs(text, ("prompt", "output"), "--workload")
        for key, value in values.items():
            if not value.is_integer():
                raise InferlabError(f"--workload: {key}={value:g} is not a whole number of tokens")
        return cls(int(values.get("prompt", cls.prompt_tokens)), int(values.get("output", cls.output_tokens)))

    @property
    def context_len(self) -> int:
        """Tokens a sequence holds when it finishes."""
        return self.prompt_tokens + self.output_tokens

    @property
    def mean_decode_context(self) -> int:
        """Context the average decode step attends to."""
        return self.prompt_tokens + self.output_tokens // 2


@dataclass(frozen=True)
class SLO:
    ttft_ms: float | None = None
    itl_ms: float | None = None

    def __post_init__(self) -> None:
        for name in ("ttft_ms", "itl_ms"):
            value = getattr(self, name)
            if value is not None and value <= 0:
                raise InferlabError(f"--slo: {name} must be positive, got {value}")

    @classmethod
    def parse(cls, text: str) -> SLO:
        values = _parse_pairs(text, ("ttft_ms", "itl_ms"), "--slo")
        return cls(values.get("ttft_ms"), values.get("itl_ms"))


@dataclass(frozen=True)
class ReplicaPoint:
    batch: int
    step_ms: float
    ttft_ms: float
    itl_ms: float
    requests_per_s: float
    step_tokens_bound: bool  # the rate is max_num_batched_tokens' cap, not the decode steps'


def replica_point(cost: ModelCost, hw: Hardware, workload: Workload, batch: int, tp: int,
                  step_tokens: int) -> ReplicaPoint:
    """A replica keeping `batch` (<= `step_tokens`) sequences decoding."""
    context = workload.mean_decode_context
    step_s = decode_step(cost, hw, batch, context, tp).time_s
    prefill_s = prefill_riding(cost, hw, workload.prompt_tokens, batch - 1, tp, step_tokens).time_s
    ttft = time_to_first_token(cost, hw, workload.prompt_tokens, batch - 1, context, tp, step_tokens)
    out = workload.output_tokens
    decode_rate = batch / (out * step_s + batch * prefill_s)
    step_token_rate = step_tokens / (workload.context_len * step_s)
    return ReplicaPoint(
        batch=batch, step_ms=step_s * 1e3, ttft_ms=ttft.time_s * 1e3,
        itl_ms=(step_s + batch * prefill_s / out) * 1e3,
        requests_per_s=min(decode_rate, step_token_rate),
        step_tokens_bound=step_token_rate < decode_rate,
    )


@dataclass(frozen=True)
class CapacityPlan:
    best: ReplicaPoint  # the batch each replica runs at
    max_batch: int  # the most sequences memory, max_num_seqs and max_num_batched_tokens allow
    # what stopped the batch growing: memory, max_num_seqs, max_num_batched_tokens (a step's
    # sequences or its token rate), itl_ms, ttft_ms, or `step time` (the rate falls past `best`)
    limited_by: str
    request_rate: float | None
    replicas: int | None
    gpus: int | None
    price_per_gpu_hour: float | None
    gpus_per_replica: int  # the tensor-parallel degree
    output_tokens_per_request: int

    @property
    def output_tokens_per_s_per_replica(self) -> float:
        return self.best.requests_per_s * self.output_tokens_per_request

    @property
    def cost_per_million_output_tokens(self) -> float | None:
        """What the replicas cost per hour over the output tokens they serve per hour at the
        target rate (a partly idle last replica still costs)."""
        if self.price_per_gpu_hour is None or self.request_rate is None or self.gpus is None:
            return None
        tokens_per_hour = self.request_rate * self.output_tokens_per_request * 3600
        return self.gpus * self.price_per_gpu_hour / tokens_per_hour * 1e6

    @property
    def cost_per_million_at_capacity(self) -> float | None:
        """The floor: a replica kept busy at its capacity."""
        if self.price_per_gpu_hour is None:
            return None
        tokens_per_hour = self.output_tokens_per_s_per_replica * 3600
        return self.gpus_per_replica * self.price_per_gpu_hour / tokens_per_hour * 1e6


def check_rate_and_price(request_rate: float | None, price_per_gpu_hour: float | None) -> None:
    if request_rate is not None and not 0 < request_rate < math.inf:
        raise InferlabError(f"--request-rate must be positive and finite, got {request_rate}")
    if price_per_gpu_hour is not None and not 0 < price_per_gpu_hour < math.inf:
        raise InferlabError(f"--price-per-hour must be positive and finite, got {price_per_gpu_hour}")


def plan_capacity(cost: ModelCost, hw: Hardware, workload: Workload, slo: SLO, max_batch: int,
                  limited_by: str, step_tokens: int, tp: int = 1, request_rate: float | None = None,
                  price_per_gpu_hour: float | None = None) -> CapacityPlan:
    """The best batch per replica within the SLO, then replicas for `request_rate`;
    `limited_by` names what set `max_batch`."""
    check_rate_and_price(request_rate, price_per_gpu_hour)
    points: list[ReplicaPoint] = []  # those within the SLO, by batch
    for batch in range(1, max_batch + 1):
        point = replica_point(cost, hw, workload, batch, tp, step_tokens)
        broken = [name for name, limit, value in (("ttft_ms", slo.ttft_ms, point.ttft_ms),
                                                  ("itl_ms", slo.itl_ms, point.itl_ms))
                  if limit is not None and value > limit]
        if broken:
            if not points:
                name = broken[0]
                raise InferlabError(
                    f"the SLO cannot be met on {hw.name}: even at batch 1 {name} is "
                    f"{getattr(point, name):.1f} > {getattr(slo, name):g}")
            limited_by = broken[0]
            break
        points.append(point)
    # the highest rate, the larger batch on a tie
    best = max(reversed(points), key=lambda p: p.requests_per_s)
    if best is not points[-1]:  # the rate peaks below the batch the limits allow
        limited_by = "max_num_batched_tokens" if points[best.batch].step_tokens_bound else "step time"
    replicas = None if request_rate is None else math.ceil(request_rate / best.requests_per_s)
    return CapacityPlan(
        best=best, max_batch=max_batch, limited_by=limited_by, request_rate=request_rate,
        replicas=replicas, gpus=None if replicas is None else replicas * tp,
        price_per_gpu_hour=price_per_gpu_hour, gpus_per_replica=tp,
        output_tokens_per_request=workload.output_tokens,
    )
