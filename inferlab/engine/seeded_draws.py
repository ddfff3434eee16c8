"""Seeded requests' own random draws, independent of the batch they run in."""

from __future__ import annotations

import torch

from inferlab.engine.request import Request


class SeededUniforms:
    """Seeded requests' uniform draws, one per output position in order: the m-th output token
    is drawn with the m-th number of the request's generator, however many positions a step
    samples (drafts) and keeps, so a seed gives the same tokens with speculative decoding or
    without, alone or batched."""

    def __init__(self) -> None:
        self._generators: dict[str, torch.Generator] = {}
        self._drawn: dict[str, list[torch.Tensor]] = {}  # from the next output position on

    def take(self, request: Request, count: int, device: torch.device) -> list[torch.Tensor | None]:
        """The draws for the request's next `count` output positions (None: not seeded, or
        greedy, which draws nothing)."""
        params, rid = request.sampling_params, request.request_id
        if params.seed is None or params.greedy:
            return [None] * count
        if rid not in self._generators:
            self._generators[rid] = torch.Generator(device).manual_seed(generator_seed(params.seed))
            self._drawn[rid] = []
        drawn = self._drawn[rid]
        while len(drawn) < count:
            drawn.append(torch.rand(1, generator=self._generators[rid], device=device, dtype=torch.float64))
        return drawn[:count]

    def consumed(self, request_id: str, count: int) -> None:
        """The request output `count` tokens: their draws are spent."""
        drawn = self._drawn.get(request_id)
        if drawn is not None:
            del drawn[:count]

    def forget(self, request_id: str) -> None:
        self._generators.pop(request_id, None)
        self._drawn.pop(request_id, None)


def generator_seed(seed: int) -> int:
    """The seed a torch generator takes for a request's: the CPU generator (mt19937) keeps only
    a seed's low 32 bits, so 7 and 2**32 + 7, or -1 and 2**63 - 1, drew the same numbers. Seeds
    in [0, 2**32) pass as they are; any other is spread over 32 bits by splitmix64's finalizer,
    so seeds that differ only above bit 31 draw apart."""
    if 0 <= seed < 2**32:
        return seed
    z = seed % 2**64
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) % 2**64
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) % 2**64
    return (z ^ (z >> 31)) >> 32
