"""bf16 linear layers on CPU through the C kernels of matmul.c, weights packed once at load.

A decode step multiplies a few rows by every weight, so it is bound by reading the weights:
oneDNN's bf16 path reaches about a third of the memory bandwidth there (a 1728x576 layer, one
row: ~210 us from memory on this machine; the AVX512-BF16 kernel: ~70 us). The packed layout
also feeds AMX tiles for more rows (a batch of decodes, a prefill), so a layer keeps one copy of
its weight, in that layout, and every product goes through the C kernels.
"""

from __future__ import annotations

import abc
from collections.abc import Callable

import torch
from torch import nn

from inferlab.kernels import cpu_library, cpu_ops


def packed_linear_supported(device: torch.device, dtype: torch.dtype) -> bool:
    return device.type == "cpu" and dtype == torch.bfloat16 and cpu_ops.bf16_linear_available()


class CLinear(nn.Module, abc.ABC):
    """A linear layer the C kernels can run from a description of its buffers; the whole-model
    call (cpu_model.py) takes a layer whose linears are all CLinear. Declared here, beside the
    kernels, so that the quantized layers (inferlab.quant) implement it rather than the kernels
    importing them."""

    @abc.abstractmethod
    def c_desc(self) -> cpu_library.LinearDesc:
        """The layer for the C kernels (pointers into this module's tensors)."""


class PackedLinear(CLinear):
    """A bf16 nn.Linear whose weight lives in the kernels' packed layout [N/16, K/2, 16, 2]."""

    def __init__(self, linear: nn.Linear) -> None:
        super().__init__()
        self.in_features, self.out_features = linear.in_features, linear.out_features
        self.register_buffer("packed", cpu_ops.pack_bf16(linear.weight.detach()))
        self.bias = linear.bias

    def forward(self, x: torch.Tensor) -> torch.Tensor:  # [..., K] -> [..., N]
        return self._product(x, torch.bfloat16)

    def forward_fp32(self, x: torch.Tensor) -> torch.Tensor:  # [..., K] -> fp32 [..., N]
        """The kernel's fp32 sums as they are (an lm_head's logits): no bf16 rounding, and no
        second pass to widen them."""
        return self._product(x, torch.float32)

    def _product(self, x: torch.Tensor, out_dtype: torch.dtype) -> torch.Tensor:
        x2 = x.reshape(-1, self.in_features)
        if x2.stride(1) != 1:
            x2 = x2.contiguous()
        bias = None if self.bias is None else self.bias.detach()
        y = cpu_ops.bf16_linear(x2, self.packed, bias, out_dtype)
        return y.view(*x.shape[:-1], self.out_features)

    def c_desc(self) -> cpu_library.LinearDesc:
        return cpu_library.LinearDesc(
            kind=cpu_library.LINEAR_BF16, n_out=self.out_features, k_in=self.in_features,
            weight=self.packed.data_ptr(), bias=cpu_library.tensor_ptr(self.bias))

    def extra_repr(self) -> str:
        return f"in_features={self.in_features}, out_features={self.out_features}, packed bf16"


class PackedEmbedding(nn.Module):
    """A tied embedding read from its lm_head's packed weight, so the table is held once: 56.6 MB
    less for the embedded model in bf16 (28% of its weights), 113 MB in fp32. The head's layout
    keeps a block's outputs side by side (PackedLinear's [V/16, H/2, 16, 2], Avx2Fp32Linear's
    [V/8, H, 8]): token t's row is block t / B's lane t % B, its inputs B lanes apart; a step
    gathers a few rows, which costs microseconds. A head held as GGUF blocks' codes
    (Avx2Fp32Linear.code_bits) has its rows decoded by its kernel: the same fp32 values."""

    def __init__(self, head: nn.Module) -> None:
        super().__init__()
        self.num_embeddings, self.embedding_dim = head.out_features, head.in_features
        self.register_buffer("packed", head.packed)  # the head's own
        # the head's C description (a bound method, not a submodule: the head is the model's)
        self.codes_desc = head._kept_desc if getattr(head, "code_bits", 0) else None

    def forward(self, input_ids: torch.Tensor) -> torch.Tensor:  # [...] -> [..., H]
        ids = input_ids.to(torch.int64)
        if ids.numel() and (int(ids.min()) < 0 or int(ids.max()) >= self.num_embeddings):
            raise IndexError(f"a token id outside the embedding table (0..{self.num_embeddings - 1})")
        if self.codes_desc is not None:
            rows = cpu_ops.avx2_quant_rows(self.codes_desc(), ids.reshape(-1))  # [n, H]
        else:
            lanes = self.packed.shape[2]  # outputs a block
            rows = self.packed[ids // lanes, :, ids % lanes]  # [..., H/2, 2] or [..., H]
        return rows.reshape(*ids.shape, self.embedding_dim)

    def extra_repr(self) -> str:
        held = "codes of the" if self.codes_desc is not None else "the packed"
        return f"{self.num_embeddings}, {self.embedding_dim}, read from {held} lm_head"


def use_packed_linears(model: nn.Module) -> int:
    """Replace every bf16 nn.Linear of `model` whose shape the kernels take by a PackedLinear, in
    place; returns how many."""
    return replace_linears_keeping_ties(model, PackedLinear, lambda child: (
        child.weight.dtype == torch.bfloat16
        and cpu_ops.bf16_linear_fits(child.out_features, child.in_features)))


def replace_linears_keeping_ties(model: nn.Module, kernel: Callable[[nn.Linear], nn.Module],
                                 takes: Callable[[nn.Linear], bool]) -> int:
    """replace_linears, whose layers hold their weight only in a packed layout: the row-major
    weights are released, and an embedding tied to a packed head reads the head's packed weight
    instead (PackedEmbedding)."""
    tied = _tied_embedding_owner(model)
    count = replace_linears(model, kernel, takes)
    if tied is not None and type(model.lm_head) is not nn.Linear:  # the head was replaced
        tied.embed_tokens = PackedEmbedding(model.lm_head)
    return count


def _tied_embedding_owner(model: nn.Module) -> nn.Module | None:
    """The module holding `embed_tokens` when `model.lm_head` shares its weight (a causal LM with
    tied embeddings), else None."""
    head, inner = getattr(model, "lm_head", None), getattr(model, "model", None)
    embedding = getattr(inner, "embed_tokens", None)
    if isinstance(head, nn.Linear) and isinstance(embedding, nn.Embedding) and head.weight is embedding.weight:
        return inner
    return None


def replace_linears(model: nn.Module, kernel: Callable[[nn.Linear], nn.Module],
                    takes: Callable[[nn.Linear], bool]) -> int:
    """Replace, in place, every plain nn.Linear of `model` that `takes` by `kernel(linear)`;
    returns how many."""
    swaps = [(parent, name, child) for parent in model.modules()
             for name, child in parent.named_children()
             if type(child) is nn.Linear and takes(child)]
    for parent, name, child in swaps:
        setattr(parent, name, kernel(child))
    return len(swaps)
