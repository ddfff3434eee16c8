"""A sliding-window model (Mistral v0.1's 4096) is served within its window: attention here is
never windowed, so the context stops where the window would start to matter."""

from __future__ import annotations

import pytest
import torch
from quant.tiny import write_tokenizer

from inferlab.cli import main
from inferlab.engine.llm import LLM
from inferlab.engine.sampling_params import SamplingParams
from inferlab.errors import InferlabError
from inferlab.models.loader import read_model_config

from .tiny_models import make_tiny_model

WINDOW = 32


def test_the_context_stops_at_the_window_and_matches_transformers_within_it(tmp_path):
    model = make_tiny_model("mistral", tmp_path, sliding_window=WINDOW)
    write_tokenizer(tmp_path)
    assert read_model_config(str(tmp_path)).max_context == WINDOW  # of 128 positions
    llm = LLM(str(tmp_path), dtype="float32", kv_cache_memory="4MiB")
    assert llm.engine.max_model_len == WINDOW
    prompt = list(range(3, 15))
    params = SamplingParams(temperature=0, max_tokens=WINDOW - len(prompt), ignore_eos=True)
    out = llm.generate([prompt], params)[0].outputs[0].token_ids
    with torch.no_grad():
        reference = model.generate(torch.tensor([prompt]), max_new_tokens=WINDOW - len(prompt),
                                   do_sample=False, eos_token_id=None, pad_token_id=0)
    assert out == reference[0, len(prompt):].tolist()
    past = SamplingParams(temperature=0, max_tokens=WINDOW, ignore_eos=True)  # ends at the window
    capped = llm.generate([prompt], past)[0].outputs[0]
    assert (len(prompt) + len(capped.token_ids), capped.finish_reason) == (WINDOW, "length")
    with pytest.raises(InferlabError, match=f"max_model_len 64 is over the model's sliding window of {WINDOW}"):
        LLM(str(tmp_path), dtype="float32", kv_cache_memory="4MiB", max_model_len=64)


def test_qwen_windows_count_only_when_switched_on(tmp_path):
    """max_window_layers=1: layer 1 of 2 is windowed (the default, 28, windows none of them)."""
    make_tiny_model("qwen2", tmp_path / "off", sliding_window=WINDOW, use_sliding_window=False,
                    max_window_layers=1)
    make_tiny_model("qwen2", tmp_path / "on", sliding_window=WINDOW, use_sliding_window=True,
                    max_window_layers=1)
    assert read_model_config(str(tmp_path / "off")).max_context == 128
    assert read_model_config(str(tmp_path / "on")).max_context == WINDOW


@pytest.mark.parametrize(("window", "note"), [(WINDOW, f"128 (served: {WINDOW}, the sliding window)"),
                                              (4096, "128\n")])  # a window past the positions cuts nothing
def test_info_notes_the_served_context_only_where_the_window_cuts_it(tmp_path, capsys, window, note):
    make_tiny_model("mistral", tmp_path, sliding_window=window)
    write_tokenizer(tmp_path)
    assert main(["info", str(tmp_path), "--dtype", "float32"]) == 0
    assert note in capsys.readouterr().out
