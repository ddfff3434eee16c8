"""What benchmarks/gpu.py runs: models with random weights built in memory (an 8B-shaped one,
SmolLM2-135M-shaped, a tiny one for --smoke), their transformers twins over the same tensors,
and workloads run through the engine and through transformers `generate`."""

from __future__ import annotations

import copy
import random
import time
from dataclasses import dataclass

import torch
from torch import nn

from inferlab.config import EngineConfig
from inferlab.engine.llm_engine import LLMEngine
from inferlab.engine.sampling_params import SamplingParams
from inferlab.models.config import ModelConfig
from inferlab.models.layers import RotaryEmbedding
from inferlab.models.llama import LlamaForCausalLM
from inferlab.models.loader import LoadedModel
from inferlab.models.tokenizer import TextTokenizer, TokenizerInfo

LLAMA_8B = dict(architecture="LlamaForCausalLM", vocab_size=128256, hidden_size=4096,
                intermediate_size=14336, num_layers=32, num_heads=32, num_kv_heads=8,
                head_dim=128, max_position_embeddings=131072, rms_norm_eps=1e-5,
                rope_theta=500000.0, rope_scaling={"rope_type": "llama3", "factor": 8.0,
                                                   "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                                                   "original_max_position_embeddings": 8192})
SMOLLM_135M = dict(architecture="LlamaForCausalLM", vocab_size=49152, hidden_size=576,
                   intermediate_size=1536, num_layers=30, num_heads=9, num_kv_heads=3,
                   head_dim=64, max_position_embeddings=8192, rms_norm_eps=1e-5,
                   rope_theta=100000.0, tie_word_embeddings=True)
TINY = dict(architecture="LlamaForCausalLM", vocab_size=512, hidden_size=128,
            intermediate_size=256, num_layers=2, num_heads=4, num_kv_heads=2, head_dim=32,
            max_position_embeddings=4096, rms_norm_eps=1e-5, tie_word_embeddings=False)


def sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize()


# --- models: built in memory, and their transformers twins --------------------------------------

def random_model(fields: dict, dtype: torch.dtype, device: torch.device) -> LoadedModel:
    """A model with random weights (nn defaults, norms at one), no tokenizer needed: requests
    carry token ids and ask for no detokenization."""
    cfg = ModelConfig(**fields)
    torch.manual_seed(0)
    previous = torch.get_default_dtype()
    torch.set_default_dtype(dtype)
    try:
        with torch.device(device):
            model = LlamaForCausalLM(cfg)
    finally:
        torch.set_default_dtype(previous)
    for rotary in model.modules():  # the cos/sin tables stay fp32 whatever the weights' dtype
        if isinstance(rotary, RotaryEmbedding):
            rotary.cos = torch.empty(rotary.cos.shape, device=device)
            rotary.sin = torch.empty(rotary.sin.shape, device=device)
            rotary.reset_buffers()
    return LoadedModel(model.eval(), cfg, ids_only_tokenizer(), name="random", path="")


def ids_only_tokenizer() -> TextTokenizer:
    """A one-word vocabulary: the engine asks it for an EOS id (none); nothing is decoded."""
    from tokenizers import Tokenizer, models

    return TextTokenizer(Tokenizer(models.WordLevel({"<unk>": 0}, unk_token="<unk>")),
                         TokenizerInfo())


def hf_twin(model: LlamaForCausalLM) -> nn.Module:
    """transformers' LlamaForCausalLM over the very same weight tensors (views, no copy)."""
    import transformers

    cfg = model.config
    hf_cfg = transformers.LlamaConfig(
        vocab_size=cfg.vocab_size, hidden_size=cfg.hidden_size,
        intermediate_size=cfg.intermediate_size, num_hidden_layers=cfg.num_layers,
        num_attention_heads=cfg.num_heads, num_key_value_heads=cfg.num_kv_heads,
        head_dim=cfg.head_dim, max_position_embeddings=cfg.max_position_embeddings,
        rms_norm_eps=cfg.rms_norm_eps, rope_theta=cfg.rope_theta, rope_scaling=cfg.rope_scaling,
        tie_word_embeddings=cfg.tie_word_embeddings, attention_bias=False,
        bos_token_id=None, eos_token_id=None, pad_token_id=0)
    weight = model.lm_head.weight
    with torch.device("meta"):
        hf = transformers.LlamaForCausalLM(hf_cfg)
    state = {}
    for name, t in model.state_dict().items():
        if ".qkv_proj." in name:
            for part, piece in zip(("q_proj", "k_proj", "v_proj"),
                                   t.split([cfg.q_size, cfg.kv_size, cfg.kv_size]), strict=True):
                state[name.replace("qkv_proj", part)] = piece
        elif ".gate_up_proj." in name:
            for part, piece in zip(("gate_proj", "up_proj"), t.chunk(2), strict=True):
                state[name.replace("gate_up_proj", part)] = piece
        else:
            state[name] = t
    result = hf.load_state_dict(state, strict=False, assign=True)
    missing = set(result.missing_keys) - {"lm_head.weight"}  # tied: set just below
    if missing or result.unexpected_keys:
        raise RuntimeError(f"weights do not map onto transformers: missing {sorted(missing)[:3]}, "
                           f"unexpected {result.unexpected_keys[:3]}")
    if cfg.tie_word_embeddings:
        hf.lm_head.weight = hf.model.embed_tokens.weight
    with torch.device(weight.device):  # its inv_freq buffers were left on the meta device
        hf.model.rotary_emb = type(hf.model.rotary_emb)(config=hf_cfg)
    return hf.eval()


# --- workloads through the engine and through transformers ---------------------------------------

@dataclass(frozen=True)
class Workload:
    prompts: list[list[int]]
    output_lens: list[int]

    def subset(self, n: int) -> Workload:
        return Workload(self.prompts[:n], self.output_lens[:n])


def random_workload(n: int, prompt_range: tuple[int, int], output_range: tuple[int, int],
                    vocab: int, seed: int) -> Workload:
    rng = random.Random(seed)
    prompts = [[rng.randrange(vocab) for _ in range(rng.randint(*prompt_range))] for _ in range(n)]
    return Workload(prompts, [rng.randint(*output_range) for _ in range(n)])


@dataclass(frozen=True)
class Run:
    elapsed_s: float
    step_end_s: list[float]  # time of each step's end, from the start
    outputs: dict[str, list[int]]  # request id -> generated token ids

    @property
    def output_tokens(self) -> int:
        return sum(len(v) for v in self.outputs.values())


def make_engine(loaded: LoadedModel, dtype: str, device: torch.device, kv_bytes: int | None,
                max_num_seqs: int, max_model_len: int, enforce_eager: bool = False,
                gpu_memory_utilization: float = 0.9, speculative_config: dict | None = None) -> LLMEngine:
    """kv_bytes None: the engine sizes its cache from gpu_memory_utilization (CUDA)."""
    config = EngineConfig(dtype=dtype, device=device.type, kv_cache_memory_bytes=kv_bytes,
                          gpu_memory_utilization=gpu_memory_utilization,
                          max_num_seqs=max_num_seqs, max_num_batched_tokens=8192,
                          max_model_len=max_model_len, enable_prefix_caching=False,
                          enforce_eager=enforce_eager, speculative_config=speculative_config)
    if device.type == "cpu":  # (smoke run) a CPU engine packs bf16 linears in place, and later
        # sections need the model's nn.Linear layers; oneDNN's prepacked int8 weights (W8A8 on
        # an Intel Xeon) have no storage to copy, and nothing writes them: shared
        prepacked = {id(t): t for t in loaded.model.buffers() if t.is_mkldnn}
        loaded = copy.deepcopy(loaded, prepacked)
    return LLMEngine(config, loaded)


def run_engine(engine: LLMEngine, work: Workload, device: torch.device) -> Run:
    """All requests at once, greedy, ignore_eos; steps until every one has finished."""
    ids = [engine.add_request(p, SamplingParams(max_tokens=n, ignore_eos=True, temperature=0.0,
                                                detokenize=False))
           for p, n in zip(work.prompts, work.output_lens, strict=True)]
    outputs: dict[str, list[int]] = {}
    sync(device)
    start = time.perf_counter()
    ends = []
    while engine.has_unfinished_requests():
        for out in engine.step():
            if out.finished:
                outputs[out.request_id] = list(out.outputs[0].token_ids)
        ends.append(time.perf_counter() - start)
    sync(device)
    return Run(time.perf_counter() - start, ends, {i: outputs[i] for i in ids})


@torch.inference_mode()
def run_transformers(hf: nn.Module, work: Workload, device: torch.device,
                     batch: int) -> tuple[float, list[list[int]]]:
    """Static batches, left-padded, each batch generating its longest requested output."""
    start = time.perf_counter()
    results: list[list[int]] = []
    for b in range(0, len(work.prompts), batch):
        prompts, lens = work.prompts[b:b + batch], work.output_lens[b:b + batch]
        width = max(len(p) for p in prompts)
        ids = torch.tensor([[0] * (width - len(p)) + p for p in prompts], device=device)
        mask = torch.tensor([[0] * (width - len(p)) + [1] * len(p) for p in prompts], device=device)
        out = hf.generate(input_ids=ids, attention_mask=mask, max_new_tokens=max(lens),
                          min_new_tokens=max(lens), do_sample=False, pad_token_id=0)
        results += [row[width:width + n].tolist() for row, n in zip(out, lens, strict=True)]
    sync(device)
    return time.perf_counter() - start, results


if __name__ == "__main__":
    raise SystemExit("a section of benchmarks/gpu.py, not a script: run benchmarks/gpu.py --help")
