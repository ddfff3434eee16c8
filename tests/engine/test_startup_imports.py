"""Start-up: building an engine on the embedded model and generating does not import
torch._dynamo, whose import alone took ~1.3 s of every `inferlab` start on this machine (torch
imports it on the first call of one of its Python reference ops, as random init on the meta
device was)."""

from __future__ import annotations

import subprocess
import sys

import torch

from inferlab.models.config import ModelConfig
from inferlab.models.llama import LlamaForCausalLM

SCRIPT = """
import sys
from inferlab.engine.llm import LLM
from inferlab.engine.sampling_params import SamplingParams
LLM(kv_cache_memory="16MiB").generate(["Hello"], SamplingParams(max_tokens=2))
print("torch._dynamo" in sys.modules)
"""


def test_an_engine_starts_and_generates_without_importing_dynamo():
    run = subprocess.run([sys.executable, "-c", SCRIPT], capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stderr
    assert run.stdout.strip().splitlines()[-1] == "False"


def test_a_model_built_off_the_meta_device_is_still_randomly_initialised():
    cfg = ModelConfig(architecture="LlamaForCausalLM", vocab_size=512, hidden_size=64,
                      intermediate_size=128, num_layers=1, num_heads=2, num_kv_heads=1,
                      head_dim=32, max_position_embeddings=64)
    torch.manual_seed(0)
    model = LlamaForCausalLM(cfg)
    weight = model.model.embed_tokens.weight
    assert 0.9 < weight.std().item() < 1.1 and abs(weight.mean().item()) < 0.05  # N(0, 1)
    assert model.model.rotary.cos[0].eq(1).all()  # position 0: cos 0 = 1
