"""GGUF files that llama.cpp refuses are refused here too, each with one line naming the file and
the tensor or key (once tracebacks, or wrong weights loaded silently); and a loaded GGUF leaves
neither a mapping nor a descriptor of the file behind."""

from __future__ import annotations

import dataclasses
import gc
import math
import os
import sys
import weakref

import pytest
import torch

from inferlab.errors import ModelLoadError
from inferlab.models.loader import load_model, load_network, load_tokenizer

from .raw_gguf import (
    F32,
    FFN,
    HEAD_DIM,
    HEADS,
    HIDDEN,
    Q3_K,
    Q4_0,
    Q4_K,
    Q8_0,
    TOKENS,
    Tensor,
    llama_metadata,
    llama_tensors,
    write_gguf,
)

Q_PROJ = 4  # index of blk.0.attn_q.weight in llama_tensors()


def _with(index: int, **changes) -> list[Tensor]:
    tensors = llama_tensors()
    tensors[index] = dataclasses.replace(tensors[index], **changes)
    return tensors


def _quantized_q(type_id: int, row: int, block: int, block_bytes: int) -> list[Tensor]:
    """attn_q in `type_id` with rows of `row` values: bytes for the blocks the rows would need."""
    rows = HEADS * HEAD_DIM
    return _with(Q_PROJ, dims=(row, rows), type_id=type_id,
                 data=bytes(-(-row // block) * block_bytes * rows))


def _plus(name: str, dims: tuple[int, ...]) -> list[Tensor]:
    """The model's tensors and one more, F32 (an extra layer tensor, a bias it has no place for)."""
    return [*llama_tensors(), Tensor(name, dims, F32, bytes(4 * math.prod(dims)))]


def _mixture_of_experts() -> list[Tensor]:
    """llama.cpp's layout of a Mixtral-style layer: a router and 8 experts' MLPs in place of
    the dense one."""
    dense = ("blk.0.ffn_gate.weight", "blk.0.ffn_up.weight", "blk.0.ffn_down.weight")
    experts = [Tensor("blk.0.ffn_gate_inp.weight", (HIDDEN, 8), F32, bytes(4 * HIDDEN * 8))]
    experts += [Tensor(f"blk.0.{name}_exps.weight", dims, F32, bytes(4 * math.prod(dims)))
                for name, dims in (("ffn_gate", (HIDDEN, FFN, 8)), ("ffn_up", (HIDDEN, FFN, 8)),
                                   ("ffn_down", (FFN, HIDDEN, 8)))]
    return [t for t in llama_tensors() if t.name not in dense] + experts


def _twice(index: int) -> list[Tensor]:
    tensors = llama_tensors()
    tensors.append(dataclasses.replace(tensors[index], data=bytes(len(tensors[index].data))))
    return tensors


# ggml's block sizes (values, bytes): Q4_0 32 values in 18 bytes, Q8_0 32 in 34, Q4_K 256 in 144
BAD_FILES = {
    "rows of 48 Q4_0 values": (dict(tensors=_quantized_q(Q4_0, 48, 32, 18)),
                               "tensor blk.0.attn_q.weight of type Q4_0 has rows of 48 values, "
                               "not a multiple of its block size 32"),
    "rows of 40 Q8_0 values": (dict(tensors=_quantized_q(Q8_0, 40, 32, 34)),
                               "blk.0.attn_q.weight of type Q8_0 has rows of 40 values"),
    # Q3_K: 256 values in 110 bytes, a type ggml has that is not dequantized here
    "a Q3_K tensor": (dict(tensors=_quantized_q(Q3_K, 256, 256, 110)),
                      "tensor blk.0.attn_q.weight has type Q3_K (supported: F32, F16, BF16"),
    "type id 99": (dict(tensors=_with(Q_PROJ, type_id=99)),
                   "tensor blk.0.attn_q.weight has unknown type 99"),
    "rows of 128 Q4_K values": (dict(tensors=_quantized_q(Q4_K, 128, 256, 144)),
                                "blk.0.attn_q.weight of type Q4_K has rows of 128 values, not a "
                                "multiple of its block size 256"),
    "alignment 0": (dict(metadata=llama_metadata(**{"general.alignment": 0})),
                    "general.alignment is 0, not a power of two"),
    "alignment 48": (dict(metadata=llama_metadata(**{"general.alignment": 48}), alignment=48),
                     "general.alignment is 48, not a power of two"),
    "alignment as text": (dict(metadata=llama_metadata(**{"general.alignment": "32"})),
                          "general.alignment is '32', not a power of two"),
    "a name twice": (dict(tensors=_twice(6)), "tensor blk.0.attn_v.weight is in the file twice"),
    # attn_k's info points at token_embd's bytes; its own follow attn_q's
    "overlapping data": (dict(tensors=_with(Q_PROJ + 1, offset=0)),
                         "tensor blk.0.attn_k.weight has its data at offset 0, not "),
    "data past the end": (dict(tensors=_with(len(llama_tensors()) - 1, data=b"")),
                          "tensor blk.0.ffn_down.weight runs past the end of the file"),
    "rope_freqs of zeros": (dict(tensors=_plus("rope_freqs.weight", (HEAD_DIM // 2,))),
                            "tensor rope_freqs.weight holds 0.0, not a positive factor"),
    # llama.cpp refuses a file with a tensor it does not load; these were dropped silently, or
    # refused by the name of a fused parameter the file does not hold
    "an unknown tensor": (dict(tensors=_plus("blk.0.attn_sinks.weight", (HEADS,))),
                          "tensor blk.0.attn_sinks.weight is not supported (no parameter of"),
    "an MLP bias": (dict(tensors=_plus("blk.0.ffn_up.bias", (FFN,))),
                    "tensor blk.0.ffn_up.bias is not supported (no parameter of"),
    "an output bias": (dict(tensors=_plus("output.bias", (len(TOKENS),))),
                       "tensor output.bias is not supported (no parameter of"),
    "mixture of experts": (dict(tensors=_mixture_of_experts(),
                                metadata=llama_metadata(**{"llama.expert_count": 8,
                                                           "llama.expert_used_count": 2})),
                           "mixture-of-experts GGUF (llama.expert_count 8) is not supported"),
    "a dimension of 0": (dict(tensors=_with(Q_PROJ, dims=(64, 0), data=b"")),
                         "tensor blk.0.attn_q.weight has shape (64, 0), with a dimension of 0"),
    "5 dimensions": (dict(tensors=_with(Q_PROJ, dims=(64, 64, 1, 1, 1))),
                     "tensor blk.0.attn_q.weight has 5 dimensions (at most 4)"),
    "version 1": (dict(version=1), "GGUF version 1 is not supported (supported: 2, 3)"),
    "version 4": (dict(version=4), "GGUF version 4 is not supported"),
    "big-endian": (dict(version=0x03000000), "(a big-endian file?)"),
    "partial rotary": (dict(metadata=llama_metadata(**{"llama.rope.dimension_count": 8})),
                       f"llama.rope.dimension_count is 8, not the head size {HEAD_DIM}"),
    # 50 rows for 4 heads of 16: un-permuting them was a RuntimeError
    "q rows not whole heads": (dict(tensors=_with(Q_PROJ, dims=(64, 50),
                                                  data=bytes(4 * 64 * 50))),
                               "tensor blk.0.attn_q.weight has shape (50, 64), not 4 heads of 16"),
    # found by loading the weights; `info` printed every figure for them (a tester's find)
    "a tensor missing": (dict(tensors=[t for t in llama_tensors() if t.name != "blk.0.ffn_down.weight"]),
                         "missing tensors model.layers.0.mlp.down_proj.weight"),
    "a shape the config contradicts": (dict(tensors=_with(len(llama_tensors()) - 1, dims=(FFN, HIDDEN + 2),
                                                          data=bytes(4 * FFN * (HIDDEN + 2)))),
                                       f"model.layers.0.mlp.down_proj.weight has shape ({HIDDEN + 2}, {FFN}), "
                                       f"the config implies ({HIDDEN}, {FFN})"),
}


@pytest.mark.parametrize("case", list(BAD_FILES))
def test_files_llama_cpp_refuses_are_one_line_errors(tmp_path, case):
    layout, words = BAD_FILES[case]
    path = write_gguf(tmp_path / "bad.gguf", **layout)
    with pytest.raises(ModelLoadError) as error:
        load_network(str(path))
    assert str(error.value).startswith(f"{path}: ") and words in str(error.value)


@pytest.mark.parametrize("case", ["rows of 48 Q4_0 values", "alignment 0"])
def test_generate_on_a_refused_file_exits_2_with_one_line(tmp_path, case, one_line_error):
    layout, words = BAD_FILES[case]
    path = write_gguf(tmp_path / "bad.gguf", **layout)
    assert words in one_line_error("generate", "Hello", path, "--max-tokens", "1")


@pytest.mark.parametrize("case", list(BAD_FILES))
def test_info_refuses_what_loading_refuses(tmp_path, case, one_line_error):
    """`info` printed every figure, exit 0, for a file `generate` refuses (a tester's find); it
    checks the tensors' names and shapes on meta tensors, reading none of their data."""
    layout, words = BAD_FILES[case]
    path = write_gguf(tmp_path / "bad.gguf", **layout)
    assert f"error: {path}: " in (line := one_line_error("info", path)) and words in line


def _state(path) -> dict[str, torch.Tensor]:
    return load_network(str(path))[0].state_dict()


@pytest.mark.parametrize(("layout", "what"), [
    (dict(tensors=_with(Q_PROJ, dims=(64, 64, 1))), "trailing 1: ggml's padding"),
    (dict(version=2), "version 2"),
    (dict(metadata=llama_metadata(**{"llama.rope.dimension_count": HEAD_DIM})), "full rotary"),
    (dict(metadata=llama_metadata(**{"general.alignment": 64}), alignment=64), "alignment 64"),
])
def test_files_llama_cpp_reads_load_the_same_weights(tmp_path, layout, what):
    reference = _state(write_gguf(tmp_path / "plain.gguf"))
    loaded = _state(write_gguf(tmp_path / "variant.gguf", **layout))
    assert loaded.keys() == reference.keys()
    assert all(torch.equal(loaded[k], reference[k]) for k in reference), what


def _holds(path) -> tuple[int, int]:
    """(mappings, open descriptors) of `path` in this process."""
    real = os.path.realpath(path)
    with open("/proc/self/maps") as maps:
        mappings = sum(line.rstrip().endswith(real) for line in maps)
    fds = sum(os.path.realpath(f"/proc/self/fd/{fd}") == real for fd in os.listdir("/proc/self/fd"))
    return mappings, fds


linux_only = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc/self")


@linux_only
def test_a_loaded_gguf_leaves_no_mapping_and_no_descriptor(tmp_path):
    path = write_gguf(tmp_path / "m.gguf")
    gc.disable()  # what reference counting alone frees: the collector may never run
    try:
        loaded = load_model(str(path))
        assert _holds(path) == (0, 0)
        assert loaded.model is not None
    finally:
        gc.enable()


class _Cycle:
    def __init__(self) -> None:
        self.me = self


@linux_only
def test_an_engine_frees_the_file_and_freezes_no_garbage(tmp_path):
    from inferlab.engine.llm import LLM

    path = write_gguf(tmp_path / "m.gguf")
    cycle = _Cycle()
    garbage = weakref.ref(cycle)
    del cycle
    gc.disable()
    try:
        llm = LLM(str(path), dtype="float32", device="cpu", kv_cache_memory="16MiB",
                  max_model_len=64)
        gc.collect()  # frozen garbage is out of its reach
        assert garbage() is None, "the engine froze garbage that existed before it"
        assert _holds(path) == (0, 0)
        del llm
    finally:
        gc.unfreeze()
        gc.enable()


@pytest.mark.parametrize("merge", ["a c", "a", "a zz"])
def test_a_merge_the_vocabulary_cannot_hold_is_a_load_error(tmp_path, merge):
    # "ac" is no token, "a" has no second part, "zz" is no token: the tokenizers library
    # panicked on the first encode ("range end index 2 out of range")
    path = write_gguf(tmp_path / "m.gguf", metadata=llama_metadata(**{"tokenizer.ggml.merges": [merge]}))
    with pytest.raises(ModelLoadError, match=f"GGUF merge '{merge}' joins tokens into one"):
        load_tokenizer(str(path)).encode("a c b a")
    good = write_gguf(tmp_path / "good.gguf", metadata=llama_metadata())
    assert load_tokenizer(str(good)).encode("ab", add_special_tokens=False) == [15]
