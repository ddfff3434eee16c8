"""The engine's settings: one frozen dataclass, validated when built; CLI defaults come from here."""

from __future__ import annotations

import os
import re
from dataclasses import dataclass
from fractions import Fraction

from inferlab.engine.kv_cache_config import check_block_size
from inferlab.engine.request_queue import SCHEDULING_POLICIES
from inferlab.engine.sampling_params import check_seed
from inferlab.engine.scheduler_config import SchedulerConfig
from inferlab.engine.spec_decode import SpeculativeConfig
from inferlab.errors import InferlabError

# vLLM's human_readable_int: a bare lowercase suffix is decimal, a bare uppercase one binary
DECIMAL_SUFFIXES = {"k": 10**3, "m": 10**6, "g": 10**9, "t": 10**12}
BINARY_SUFFIXES = {"K": 2**10, "M": 2**20, "G": 2**30, "T": 2**40}
# spelled-out units, in any case: KB decimal, KiB binary
_UNITS = {"": 1, "b": 1, "kb": 10**3, "mb": 10**6, "gb": 10**9, "tb": 10**12,
          "kib": 2**10, "mib": 2**20, "gib": 2**30, "tib": 2**40}
DTYPES = ("auto", "float32", "bfloat16", "float16")
DTYPE_ALIASES = {"half": "float16", "float": "float32"}  # vLLM's other names (ModelDType)
MAX_THREADS = 1024  # torch.set_num_threads(100000) is a segfault, and libgomp fails near 20000
CPU_KV_CACHE_BYTES = 2 * 2**30  # the KV cache on a CPU unless kv_cache_memory says otherwise
DEFAULT_MAX_NUM_BATCHED_TOKENS = 2048  # a step's tokens unless max_num_batched_tokens says otherwise


def parse_bytes(text: str | int | float, what: str | None = None) -> int:
    """'2GiB', '512MiB', '1.5GB', '2G' (2 GiB), '2g' (2 GB), or a number (1048576, 1e9; not as
    text) -> a whole number of bytes; errors start with `what` (a flag's name) where given."""
    try:
        return _bytes(text)
    except InferlabError as e:
        raise InferlabError(f"{what}: {e}" if what else str(e)) from None


def _bytes(text: str | int | float) -> int:
    if isinstance(text, bool) or not isinstance(text, (str, int, float)):
        raise InferlabError(f"a size must be a number of bytes or a string like 2GiB, got {text!r}")
    if isinstance(text, float) and not text.is_integer():  # inf and NaN too
        raise InferlabError(f"a size in bytes must be a whole number, got {text!r}")
    if not isinstance(text, str):
        return int(text)
    match = re.fullmatch(r"\s*([0-9]*\.?[0-9]+)\s*([a-zA-Z]*)\s*", text)
    unit = match and (DECIMAL_SUFFIXES | BINARY_SUFFIXES).get(match[2], _UNITS.get(match[2].lower()))
    if not unit:
        raise InferlabError(f"cannot read {text!r} as a size (examples: 2GiB, 512MiB, 1.5GB)")
    if match[2] in BINARY_SUFFIXES and "." in match[1]:  # as vLLM's human_readable_int
        raise InferlabError(f"cannot read {text!r} as a size: decimals only with k, m, g, t or a "
                            f"unit spelled out ({match[1]}{match[2]}iB)")
    size = Fraction(match[1]) * unit  # exact: 1.1GB is 1,100,000,000 bytes, not a float's near miss
    if size.denominator != 1:
        unitless = " (a number without a unit is bytes: give a size such as 24GiB)" if unit == 1 else ""
        raise InferlabError(f"a size in bytes must be a whole number, got {text!r}{unitless}")
    return int(size)


def canonical_dtype(dtype: object) -> str:
    """vLLM's ModelDType (one of DTYPES, an alias, any case, or a torch.dtype) -> its name in
    DTYPES."""
    if not isinstance(dtype, str):
        import torch  # here only: the config is read before, and without, any model

        if not isinstance(dtype, torch.dtype):
            raise InferlabError(f"dtype must be a str or a torch.dtype, got {type(dtype).__name__}")
        dtype = str(dtype).removeprefix("torch.")
    name = DTYPE_ALIASES.get(dtype.lower(), dtype.lower())
    if name not in DTYPES:
        raise InferlabError(f"dtype must be one of {', '.join([*DTYPES, *DTYPE_ALIASES])}, "
                            f"got {dtype!r}")
    return name


def check_threads(name: str, threads: int) -> None:
    if not 1 <= threads <= MAX_THREADS:
        raise InferlabError(f"{name} must be in [1, {MAX_THREADS}], got {threads}")


_WHOLE_NUMBER_FIELDS = ("kv_cache_memory_bytes", "block_size", "max_num_seqs",
                        "max_num_batched_tokens", "max_model_len", "long_prefill_token_threshold",
                        "num_threads", "seed")


@dataclass(frozen=True)
class EngineConfig:
    model: str | None = None  # HF directory or .gguf file; None: the embedded SmolLM2-135M
    # auto: bf16 on CPUs with AMX/AVX512-BF16 and on GPUs, else fp32; an alias ("half") or a
    # torch.dtype is read as its name in DTYPES
    dtype: str = "auto"
    device: str = "auto"  # auto: cuda when available, else cpu
    # None: CPU_KV_CACHE_BYTES on a CPU; on a GPU, what gpu_memory_utilization leaves after
    # the weights and a profiled step's activations
    kv_cache_memory_bytes: int | None = None
    gpu_memory_utilization: float = 0.9  # share of the GPU's memory this engine may take
    enforce_eager: bool = False  # no CUDA graphs for decode steps
    block_size: int = 16
    max_num_seqs: int = 256
    # None: DEFAULT_MAX_NUM_BATCHED_TOKENS, or without chunked prefill the larger of it and
    # max_model_len, as vLLM sizes it (a prompt is computed in one step)
    max_num_batched_tokens: int | None = None
    max_model_len: int | None = None  # None: the model's context length
    enable_prefix_caching: bool = True
    enable_chunked_prefill: bool = True  # off: a prompt is computed in one step, or waits
    long_prefill_token_threshold: int = 0  # a prompt's tokens a step at most (0: no cap)
    scheduling_policy: str = "fcfs"  # or "priority": requests' priority orders the queue
    # "auto": the model's generation_config.json sets the defaults of what requests leave out
    # (vLLM's default); "vllm": it does not; or a folder holding the generation_config.json to use
    generation_config: str = "auto"
    num_threads: int | None = None  # CPU threads for torch; None: torch's default
    seed: int = 0  # for requests without their own seed
    # n-gram drafts verified a step ahead (vLLM's speculative_config; a dict is read as one)
    speculative_config: SpeculativeConfig | None = None

    def __post_init__(self) -> None:
        if isinstance(self.model, os.PathLike):  # a pathlib.Path, as vLLM's LLM takes one
            object.__setattr__(self, "model", os.fspath(self.model))
        if self.model is not None and not isinstance(self.model, str):  # 123 once met posixpath
            raise InferlabError(f"model must be a path, got {type(self.model).__name__} {self.model!r}")
        if isinstance(self.speculative_config, dict):
            object.__setattr__(self, "speculative_config",
                               SpeculativeConfig.from_dict(self.speculative_config))
        elif not isinstance(self.speculative_config, SpeculativeConfig | None):  # "ngram" once
            raise InferlabError(  # failed at the engine's start, an AttributeError
                f"speculative_config must be a dict (vLLM's), got "
                f"{type(self.speculative_config).__name__} {self.speculative_config!r}")
        for name in _WHOLE_NUMBER_FIELDS:  # from Python: 2.5 once failed at the first step
            value = getattr(self, name)
            if value is not None and (isinstance(value, bool) or not isinstance(value, int)):
                raise InferlabError(f"{name} must be a whole number, got {value!r}")
        object.__setattr__(self, "dtype", canonical_dtype(self.dtype))
        if self.device not in ("auto", "cpu", "cuda"):
            raise InferlabError(f"device must be auto, cpu or cuda, got {self.device!r}")
        if self.kv_cache_memory_bytes is not None and self.kv_cache_memory_bytes <= 0:
            raise InferlabError("kv_cache_memory must be positive")
        if not 0 < self.gpu_memory_utilization <= 1:
            raise InferlabError(
                f"gpu_memory_utilization must be in (0, 1], got {self.gpu_memory_utilization}")
        check_block_size(self.block_size)
        if self.max_model_len is not None and self.max_model_len < 1:
            raise InferlabError(f"max_model_len must be at least 1, got {self.max_model_len}")
        if self.num_threads is not None:
            check_threads("num_threads", self.num_threads)
        if self.scheduling_policy not in SCHEDULING_POLICIES:
            raise InferlabError(f"scheduling_policy must be one of {', '.join(SCHEDULING_POLICIES)}, "
                                f"got {self.scheduling_policy!r}")
        # the step limits, before any model loads (the context comes from the model later: a
        # stand-in of 1 until then, which no other limit's check can be blamed on)
        context = 1 if self.max_model_len is None else self.max_model_len
        SchedulerConfig(max_model_len=context, max_num_seqs=self.max_num_seqs,
                        max_num_batched_tokens=self.step_token_budget(context),
                        enable_chunked_prefill=self.enable_chunked_prefill,
                        long_prefill_token_threshold=self.long_prefill_token_threshold)
        if self.generation_config not in ("auto", "vllm") and not os.path.isdir(self.generation_config):
            raise InferlabError(f"generation_config must be auto, vllm or a folder, got "
                                f"{self.generation_config!r}")
        check_seed(self.seed)

    def step_token_budget(self, max_model_len: int) -> int:
        """max_num_batched_tokens as the scheduler takes it, for a context of max_model_len."""
        if self.max_num_batched_tokens is not None:
            return self.max_num_batched_tokens
        if self.enable_chunked_prefill:
            return DEFAULT_MAX_NUM_BATCHED_TOKENS
        return max(max_model_len, DEFAULT_MAX_NUM_BATCHED_TOKENS)
