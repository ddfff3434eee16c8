"""The Llama family (Llama, Mistral, Qwen2, Qwen3) over a flat token batch and a paged KV cache.

Parameters carry Hugging Face names, except that q/k/v are fused into `qkv_proj` and gate/up into
`gate_up_proj` (one matmul each); `load_weights` maps the unfused names onto their slices.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator

import torch
from torch import nn

from inferlab.errors import ModelLoadError
from inferlab.kernels import cpu_model
from inferlab.kernels.attention import AttentionMetadata, paged_attention
from inferlab.kernels.fused import rotary_embedding, silu_and_mul
from inferlab.models.config import ModelConfig
from inferlab.models.fused_layers import FUSED_SHARDS, shard_rows
from inferlab.models.layers import RMSNorm, RotaryEmbedding

KVCache = tuple[torch.Tensor, torch.Tensor]  # k, v: [num_blocks, block_size, Hkv, D]

# unfused checkpoint name -> (fused parameter name, shard index)
STACKED_PARAMS = {part: (fused, shard) for fused, parts in FUSED_SHARDS.items()
                  for shard, part in enumerate(parts)}


Rope = tuple[torch.Tensor, torch.Tensor, torch.Tensor]  # positions [N]; cos, sin [P, head_dim] fp32


class LlamaAttention(nn.Module):
    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__()
        self.num_heads, self.num_kv_heads, self.head_dim = cfg.num_heads, cfg.num_kv_heads, cfg.head_dim
        self.q_size, self.kv_size = cfg.q_size, cfg.kv_size
        self.qkv_proj = nn.Linear(cfg.hidden_size, cfg.q_size + 2 * cfg.kv_size, bias=cfg.attention_bias)
        self.o_proj = nn.Linear(cfg.q_size, cfg.hidden_size, bias=cfg.o_bias)
        self.q_norm = RMSNorm(cfg.head_dim, cfg.rms_norm_eps) if cfg.qk_norm else None
        self.k_norm = RMSNorm(cfg.head_dim, cfg.rms_norm_eps) if cfg.qk_norm else None
        self.scale = cfg.head_dim ** -0.5

    def forward(self, rope: Rope, x: torch.Tensor, kv_cache: KVCache,
                meta: AttentionMetadata) -> torch.Tensor:
        n, q_size, kv_size = x.shape[0], self.q_size, self.kv_size
        qkv = self.qkv_proj(x)  # [N, (Hq + 2 Hkv) * D]
        q = qkv[:, :q_size].view(n, self.num_heads, self.head_dim)  # views: no copies
        k = qkv[:, q_size:q_size + kv_size].view(n, self.num_kv_heads, self.head_dim)
        v = qkv[:, q_size + kv_size:].view(n, self.num_kv_heads, self.head_dim)
        if self.q_norm is not None:
            q, k = self.q_norm(q), self.k_norm(k)
        positions, cos, sin = rope
        rotary_embedding(positions, q, k, cos, sin)  # in place
        out = paged_attention(q, k, v, kv_cache[0], kv_cache[1], meta, self.scale)  # [N, Hq, D]
        return self.o_proj(out.view(n, -1))


class LlamaMLP(nn.Module):
    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__()
        self.gate_up_proj = nn.Linear(cfg.hidden_size, 2 * cfg.intermediate_size, bias=False)
        self.down_proj = nn.Linear(cfg.intermediate_size, cfg.hidden_size, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down_proj(silu_and_mul(self.gate_up_proj(x)))


class LlamaDecoderLayer(nn.Module):
    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__()
        self.self_attn = LlamaAttention(cfg)
        self.mlp = LlamaMLP(cfg)
        self.input_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.post_attention_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)

    def forward(self, rope: Rope, x: torch.Tensor, residual: torch.Tensor | None,
                kv_cache: KVCache, meta: AttentionMetadata) -> tuple[torch.Tensor, torch.Tensor]:
        """x: the previous sublayer's output; residual: the stream before it (None at layer 0).
        Returns (this layer's MLP output, the stream before it): the add is fused into the next
        norm."""
        if residual is None:  # the fused norms below write the stream in place: not the caller's
            x, residual = self.input_layernorm(x), x.clone()
        else:
            x, residual = self.input_layernorm(x, residual)
        x = self.self_attn(rope, x, kv_cache, meta)
        x, residual = self.post_attention_layernorm(x, residual)
        return self.mlp(x), residual


class LlamaModel(nn.Module):
    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__()
        # on the meta device (the loader's), no random init: torch runs it there through its
        # Python reference ops, whose first call imports torch._dynamo (~1.3 s of every start)
        meta = torch.empty(0).device.type == "meta"
        self.embed_tokens = nn.Embedding(
            cfg.vocab_size, cfg.hidden_size,
            _weight=torch.empty(cfg.vocab_size, cfg.hidden_size) if meta else None)
        self.rotary = RotaryEmbedding(cfg.head_dim, cfg.max_position_embeddings, cfg.rope_theta,
                                      cfg.rope_scaling, table_positions=cfg.max_positions,
                                      freq_factors=cfg.rope_freq_factors)
        self.layers = nn.ModuleList(LlamaDecoderLayer(cfg) for _ in range(cfg.num_layers))
        self.norm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)

    def forward(self, input_ids: torch.Tensor, positions: torch.Tensor,
                kv_caches: list[KVCache], meta: AttentionMetadata) -> torch.Tensor:
        rope = (positions, self.rotary.cos, self.rotary.sin)
        hidden = cpu_model.run_model(self, input_ids, rope, kv_caches, meta)  # None: not here
        if hidden is not None:  # the same kernels as below, in one C call
            return hidden
        x = self.embed_tokens(input_ids)  # [N, hidden]
        residual = None
        for layer, kv_cache in zip(self.layers, kv_caches, strict=True):
            x, residual = layer(rope, x, residual, kv_cache, meta)
        return self.norm(x) if residual is None else self.norm(x, residual)[0]


class LlamaForCausalLM(nn.Module):
    """Serves every supported architecture: they differ only in config flags."""

    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__()
        self.config = cfg
        self.model = LlamaModel(cfg)
        self.lm_head = nn.Linear(cfg.hidden_size, cfg.vocab_size, bias=False)
        if cfg.tie_word_embeddings:
            self.lm_head.weight = self.model.embed_tokens.weight

    def forward(self, input_ids: torch.Tensor, positions: torch.Tensor,
                kv_caches: list[KVCache], meta: AttentionMetadata) -> torch.Tensor:
        """input_ids, positions: [N] -> final hidden states [N, hidden]."""
        return self.model(input_ids, positions, kv_caches, meta)

    def compute_logits(self, hidden: torch.Tensor) -> torch.Tensor:
        """[M, hidden] -> fp32 logits [M, vocab]; call only on the rows that need logits."""
        if hasattr(self.lm_head, "forward_fp32"):  # a packed CPU head: its fp32 sums, unrounded
            return self.lm_head.forward_fp32(hidden)
        return self.lm_head(hidden).float()

    def load_weights(self, weights: Iterable[tuple[str, torch.Tensor]], source: str,
                     prepare_layer: Callable[[nn.Module], object] | None = None) -> None:
        """Take checkpoint tensors (HF names) as the parameters, fusing q/k/v and gate/up.

        The model may live on the meta device: tensors are assigned, not copied, so loading costs
        one copy of the weights. Each goes in as soon as it is fused, and a decoder layer whose
        parameters are all in goes to `prepare_layer` at once (the engine narrows its linears
        there), so that the load holds the checkpoint's width for one layer, not all of them.
        Errors (unexpected, missing or misshapen tensors) name `source`.
        """
        params = dict(self.named_parameters())  # a tied head is listed as the embedding only
        waiting = {i: {n for n in params if n.startswith(f"model.layers.{i}.")} for i in range(self.config.num_layers)}
        tied_head, loaded = None, set()
        for name, tensor in fused_tensors(weights, self.config, source):
            if self.config.tie_word_embeddings and name == "lm_head.weight":
                tied_head = tensor  # the embedding where the checkpoint has none (as vLLM)
                continue
            self._assign(params, name, tensor, source)
            loaded.add(name)
            layer = _layer_index(name)
            if layer is not None and name in waiting[layer]:
                waiting[layer].remove(name)
                if not waiting[layer] and prepare_layer is not None:
                    prepare_layer(self.model.layers[layer])
        if tied_head is not None and "model.embed_tokens.weight" not in loaded:
            self._assign(params, "model.embed_tokens.weight", tied_head, source)
            loaded.add("model.embed_tokens.weight")
        missing = sorted(set(params) - loaded)
        if missing:
            more = f" (and {len(missing) - 3} more)" if len(missing) > 3 else ""
            raise ModelLoadError(f"{source}: missing tensors {', '.join(missing[:3])}{more}")
        if self.config.tie_word_embeddings:
            self.lm_head.weight = self.model.embed_tokens.weight

    def _assign(self, params: dict[str, nn.Parameter], name: str, tensor: torch.Tensor, source: str) -> None:
        """Parameter `name` becomes `tensor`, after the checks load_state_dict would not make."""
        if name not in params:
            raise ModelLoadError(f"{source}: unexpected tensor {name!r} for {self.config.architecture}")
        if tensor.shape != params[name].shape:
            raise ModelLoadError(f"{source}: {name} has shape {tuple(tensor.shape)}, the config "
                                 f"implies {tuple(params[name].shape)}")
        parent, _, leaf = name.rpartition(".")
        setattr(self.get_submodule(parent), leaf, nn.Parameter(tensor, requires_grad=params[name].requires_grad))


def _layer_index(name: str) -> int | None:
    """'model.layers.3.mlp.down_proj.weight' -> 3; None for a tensor outside the decoder layers."""
    parts = name.split(".")
    return int(parts[2]) if len(parts) > 3 and parts[:2] == ["model", "layers"] else None


def fused_tensors(weights: Iterable[tuple[str, torch.Tensor]], cfg: ModelConfig,
                  source: str) -> Iterator[tuple[str, torch.Tensor]]:
    """HF-named tensors -> this model's parameter names and tensors, shards concatenated along
    rows as soon as a layer's are all there: held to the end, every layer's parts beside the
    fused copies were the load's peak (the embedded model in fp32: 1.28 -> 1.00-1.13 GB)."""
    shards: dict[str, dict[int, torch.Tensor]] = {}
    for name, tensor in weights:
        if "rotary_emb.inv_freq" in name:
            continue
        target, shard = _resolve(name)
        if shard is None:
            yield target, tensor
        elif target.endswith("qkv_proj.bias") and not cfg.attention_bias:  # named as stored
            raise ModelLoadError(f"{source}: unexpected tensor {name!r} for {cfg.architecture}")
        else:
            _check_part_shape(name, tensor, _part_shape(cfg, target, shard), source)
            parts = shards.setdefault(target, {})
            parts[shard] = tensor
            del tensor  # the fused copy alone outlives the parts
            if len(parts) == len(FUSED_SHARDS[_fused_name(target)]):
                yield target, _fuse(target, shards.pop(target), source)
    for target, parts in shards.items():  # a part missing
        fused = _fused_name(target)
        absent = [target.replace(fused, name) for i, name in enumerate(FUSED_SHARDS[fused]) if i not in parts]
        raise ModelLoadError(f"{source}: missing tensors {', '.join(absent)}")


def _fuse(target: str, parts: dict[int, torch.Tensor], source: str) -> torch.Tensor:
    """All the shards of fused parameter `target`, by index, concatenated along rows."""
    if len({part.shape[1:] for part in parts.values()}) > 1:
        raise ModelLoadError(f"{source}: the parts of {target} disagree in shape")
    return _cat_rows([parts[i] for i in range(len(parts))])


def _cat_rows(parts: list[torch.Tensor]) -> torch.Tensor:
    """torch.cat along rows; for meta tensors (`info`'s shape check) a new one of the shape:
    torch's meta cat imports its Python meta kernels first, 2.5 s of a 4 s `info`."""
    if parts[0].is_meta:
        return torch.empty((sum(p.shape[0] for p in parts), *parts[0].shape[1:]), device="meta",
                           dtype=parts[0].dtype)
    return torch.cat(parts, dim=0)


def _part_shape(cfg: ModelConfig, target: str, shard: int) -> tuple[int, ...] | None:
    """The shape the config implies for shard `shard` of fused parameter `target` (q, k, v of
    qkv_proj; gate, up of gate_up_proj), weight or bias; None for another tensor."""
    rows = shard_rows(cfg, _fused_name(target))[shard]
    return {"weight": (rows, cfg.hidden_size), "bias": (rows,)}.get(target.rsplit(".", 1)[-1])


def _fused_name(target: str) -> str:
    """The fused module a parameter name goes through ('...qkv_proj.weight' -> 'qkv_proj')."""
    return next(part for part in target.split(".") if part in FUSED_SHARDS)


def _check_part_shape(name: str, tensor: torch.Tensor, shape: tuple[int, ...] | None,
                      source: str) -> None:
    """Before fusing, so that the error names the checkpoint's own tensor and shape (as
    transformers does), not the fused one, which the checkpoint does not hold."""
    if shape is not None and tuple(tensor.shape) != shape:
        raise ModelLoadError(f"{source}: {name} has shape {tuple(tensor.shape)}, the config "
                             f"implies {shape}")


def _resolve(name: str) -> tuple[str, int | None]:
    """Checkpoint name -> (parameter name, shard of a fused parameter or None)."""
    parts = name.split(".")
    for i, part in enumerate(parts):
        if part in STACKED_PARAMS:
            fused, shard = STACKED_PARAMS[part]
            return ".".join(parts[:i] + [fused] + parts[i + 1:]), shard
    return name, None
