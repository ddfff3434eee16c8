"""inferlab: `from inferlab import LLM, SamplingParams, BeamSearchParams`, as in vLLM (and its
StructuredOutputsParams, GuidedDecodingParams)."""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from inferlab.engine.beam_search import BeamSearchParams
    from inferlab.engine.llm import LLM
    from inferlab.engine.sampling_params import SamplingParams
    from inferlab.engine.structured_outputs import GuidedDecodingParams, StructuredOutputsParams

__all__ = ["LLM", "SamplingParams", "StructuredOutputsParams", "GuidedDecodingParams", "BeamSearchParams"]

# imported at first use: `import inferlab` (every CLI command, the torch-free bench client among
# them) must not pull in torch and the engine
_LAZY = {"LLM": "inferlab.engine.llm", "SamplingParams": "inferlab.engine.sampling_params",
         "StructuredOutputsParams": "inferlab.engine.structured_outputs",
         "GuidedDecodingParams": "inferlab.engine.structured_outputs",
         "BeamSearchParams": "inferlab.engine.beam_search"}


def __getattr__(name: str) -> Any:
    if name not in _LAZY:
        raise AttributeError(f"module 'inferlab' has no attribute {name!r}")
    value = getattr(importlib.import_module(_LAZY[name]), name)
    globals()[name] = value  # later look-ups skip this function
    return value


def __dir__() -> list[str]:
    return sorted([*globals(), *_LAZY])
