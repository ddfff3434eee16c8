"""The shape of a Llama-family model: pure Python, shared by the models, the engine and the planner."""

from __future__ import annotations

import math
import sys
from dataclasses import dataclass, field
from typing import Any

from inferlab.errors import ModelLoadError
from inferlab.user_files import read_user_json

SUPPORTED_ARCHITECTURES = (
    "LlamaForCausalLM",
    "MistralForCausalLM",
    "Qwen2ForCausalLM",
    "Qwen3ForCausalLM",
)


ROPE_TYPES = ("default", "linear", "llama3", "yarn")  # RoPE scalings layers.py computes
# transformers' defaults (its *Config classes) for keys a config.json leaves out, where they are
# not the same for every architecture: a checkpoint means what transformers reads in it. Llama's
# num_key_value_heads is num_attention_heads; Qwen3's head_dim is fixed, not hidden / heads;
# Qwen's sliding_window counts only with use_sliding_window.
_HF_DEFAULTS: dict[str, dict[str, int]] = {
    "LlamaForCausalLM": {"max_position_embeddings": 2048},
    "MistralForCausalLM": {"max_position_embeddings": 4096 * 32, "sliding_window": 4096,
                           "num_key_value_heads": 8},
    "Qwen2ForCausalLM": {"max_position_embeddings": 32768, "sliding_window": 4096,
                         "max_window_layers": 28, "num_key_value_heads": 32},
    "Qwen3ForCausalLM": {"max_position_embeddings": 32768, "sliding_window": 4096,
                         "max_window_layers": 28, "num_key_value_heads": 32, "head_dim": 128},
}
_QWEN = ("Qwen2ForCausalLM", "Qwen3ForCausalLM")
_ROPE_NEEDS = {"linear": ("factor",), "llama3": ("factor", "original_max_position_embeddings")}
_ROPE_MAY_HAVE = {  # positive numbers where given (null, and 0 for _ROPE_ZERO_UNSET: the default)
    "llama3": ("low_freq_factor", "high_freq_factor"),
    "yarn": ("factor", "original_max_position_embeddings", "beta_fast", "beta_slow",
             "attention_factor", "mscale", "mscale_all_dim")}
# read as unset at 0, as transformers reads them (beta_fast or 32, if mscale and mscale_all_dim)
_ROPE_ZERO_UNSET = ("beta_fast", "beta_slow", "mscale", "mscale_all_dim")
# RoPE types whose pretraining length a top-level original_max_position_embeddings gives, before
# their own (transformers' standardize_rope_params: Phi-3 keeps it outside the dict)
_ROPE_ORIGINAL_OUTSIDE = ("llama3", "yarn")


def check_architecture(architecture: str) -> None:
    if architecture not in SUPPORTED_ARCHITECTURES:
        raise ModelLoadError(f"architecture {architecture!r} is not supported "
                             f"(supported: {', '.join(SUPPORTED_ARCHITECTURES)})")


def llama3_freq_factors(scaling: dict[str, Any]) -> tuple[float, float]:
    """llama3 RoPE's (low_freq_factor, high_freq_factor): absent or null, 1 and 4 (transformers')."""
    return float(scaling.get("low_freq_factor") or 1.0), float(scaling.get("high_freq_factor") or 4.0)


def rope_kind(scaling: dict[str, Any] | None) -> str:
    """A rope_scaling dict's type ("rope_type", or the older "type")."""
    return (scaling or {}).get("rope_type", (scaling or {}).get("type", "default"))


@dataclass(frozen=True)
class ModelConfig:
    architecture: str
    vocab_size: int
    hidden_size: int
    intermediate_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    max_position_embeddings: int
    rms_norm_eps: float = 1e-6
    rope_theta: float = 10000.0
    rope_scaling: dict[str, Any] | None = None  # HF's dict: rope_type "linear", "llama3" or "yarn"
    # per pair of head dimensions, a divisor of its scaled frequency: llama.cpp's rope_freqs
    # tensor, how a GGUF of Llama 3.1 and later carries its llama3 scaling
    rope_freq_factors: tuple[float, ...] | None = None
    tie_word_embeddings: bool = False
    attention_bias: bool = False  # bias on q, k, v (Qwen2's, or attention_bias)
    o_bias: bool = False  # and on o_proj: transformers' Llama and Qwen3 with attention_bias
    qk_norm: bool = False  # Qwen3: RMSNorm per head on q and k
    bos_token_id: int | None = None
    eos_token_ids: tuple[int, ...] = ()
    sliding_window: int | None = None
    extra: dict[str, Any] = field(default_factory=dict, compare=False)

    def __post_init__(self) -> None:
        kind = rope_kind(self.rope_scaling)
        if kind not in ROPE_TYPES:
            raise ModelLoadError(f"config: rope scaling {kind!r} is not "
                                 f"supported (supported: {', '.join(ROPE_TYPES)})")
        for key in _ROPE_NEEDS.get(kind, ()) + _ROPE_MAY_HAVE.get(kind, ()):
            value = (self.rope_scaling or {}).get(key)
            if key in _ROPE_MAY_HAVE.get(kind, ()) and (value is None or (
                    key in _ROPE_ZERO_UNSET and value == 0 and not isinstance(value, bool))):
                continue
            if not _positive_finite(value):  # NaN and inf: JSON's NaN and Infinity parse
                raise ModelLoadError(f"config: rope scaling {kind!r} needs a positive number "
                                     f"{key}, got {value!r}")
        if kind == "llama3":
            low, high = llama3_freq_factors(self.rope_scaling)
            if high <= low:  # the blend between them divides by high - low
                raise ModelLoadError(f"config: rope scaling 'llama3' needs high_freq_factor ({high}) "
                                     f"above low_freq_factor ({low})")
        for name in ("rope_theta", "rms_norm_eps"):
            if not _positive_finite(getattr(self, name)):
                raise ModelLoadError(f"config: {name} must be a positive number, got {getattr(self, name)!r}")
        if not math.isfinite(self._stretched_positions()):  # 1e308 x 10 is inf: no length
            base = ("original_max_position_embeddings" if kind == "yarn"
                    and self.rope_scaling.get("original_max_position_embeddings")
                    else "max_position_embeddings")
            raise ModelLoadError(f"config: rope scaling {kind!r}: factor × {base} overflows "
                                 "(no context is that long)")
        check_architecture(self.architecture)
        positive = ("vocab_size", "hidden_size", "intermediate_size", "num_layers",
                    "num_heads", "num_kv_heads", "head_dim", "max_position_embeddings")
        for name in positive:
            if getattr(self, name) <= 0:
                raise ModelLoadError(f"config: {name} must be positive, got {getattr(self, name)}")
        if self.num_heads % self.num_kv_heads:
            raise ModelLoadError(
                f"config: num_attention_heads ({self.num_heads}) is not a multiple of "
                f"num_key_value_heads ({self.num_kv_heads})"
            )

    @property
    def q_size(self) -> int:
        return self.num_heads * self.head_dim

    @property
    def kv_size(self) -> int:
        return self.num_kv_heads * self.head_dim

    @property
    def max_positions(self) -> int:
        """The positions the model is made for, as vLLM derives them (_get_and_verify_max_len):
        linear and YaRN RoPE stretch the positions by their factor, YaRN's from its
        original_max_position_embeddings; llama3's max_position_embeddings already counts it."""
        return int(self._stretched_positions())

    def _stretched_positions(self) -> float:
        """max_positions before it is made whole: inf where the product overflows."""
        scaling, kind = self.rope_scaling or {}, rope_kind(self.rope_scaling)
        factor = scaling.get("factor")
        if kind not in ("linear", "yarn") or factor is None:  # YaRN's factor defaults to the ratio
            return self.max_position_embeddings
        base = scaling.get("original_max_position_embeddings") if kind == "yarn" else None
        try:
            return (base or self.max_position_embeddings) * float(factor)
        except OverflowError:  # a whole number past a float's range (JSON's have no bound)
            return math.inf

    @property
    def max_context(self) -> int:
        """The longest sequence computed as the model computes it: its positions, and within its
        sliding window, since attention here is never windowed (vLLM's --disable-sliding-window
        caps the context the same way)."""
        return min(self.max_positions, self.sliding_window or self.max_positions)

    def num_parameters(self) -> int:
        """Parameter count from the shapes alone (what the weight files must hold)."""
        h, i, v = self.hidden_size, self.intermediate_size, self.vocab_size
        attn = h * (self.q_size + 2 * self.kv_size) + self.q_size * h
        if self.attention_bias:
            attn += self.q_size + 2 * self.kv_size
        if self.o_bias:
            attn += h
        if self.qk_norm:
            attn += 2 * self.head_dim
        layer = attn + 3 * h * i + 2 * h
        embeddings = v * h * (1 if self.tie_word_embeddings else 2)
        return self.num_layers * layer + embeddings + h

    @classmethod
    def from_hf_dict(cls, cfg: dict[str, Any], source: str = "config.json") -> ModelConfig:
        """Build from a Hugging Face config.json dict; errors name `source`."""
        arch = _architecture(cfg, source)
        defaults = _HF_DEFAULTS[arch]
        try:
            num_heads = _whole(cfg, "num_attention_heads")
            num_layers = _whole(cfg, "num_hidden_layers")
            # an explicit null is num_attention_heads in every transformers config
            kv_heads_default = num_heads if "num_key_value_heads" in cfg else defaults.get(
                "num_key_value_heads", num_heads)
            hidden = _whole(cfg, "hidden_size")
            eos_ids = token_ids("eos_token_id", cfg.get("eos_token_id"))
            rope_theta, rope_scaling = _rope(cfg)
            if cfg.get("mlp_bias"):
                raise ModelLoadError(f"{source}: mlp_bias (biases in the MLP) is not supported")
            if cfg.get("hidden_act", "silu") not in ("silu", "swish"):  # one function in transformers
                raise ModelLoadError(f"{source}: hidden_act {cfg['hidden_act']!r} is not supported "
                                     "(the Llama family's MLP is SiLU-gated)")
            return cls(
                architecture=arch,
                vocab_size=_whole(cfg, "vocab_size"),
                hidden_size=hidden,
                intermediate_size=_whole(cfg, "intermediate_size"),
                num_layers=num_layers,
                num_heads=num_heads,
                num_kv_heads=_whole(cfg, "num_key_value_heads", kv_heads_default),
                head_dim=_whole(cfg, "head_dim", defaults.get("head_dim", hidden // max(num_heads, 1))),
                max_position_embeddings=_whole(cfg, "max_position_embeddings",
                                               defaults["max_position_embeddings"]),
                rms_norm_eps=_number("rms_norm_eps", cfg.get("rms_norm_eps", 1e-6)),
                rope_theta=10000.0 if rope_theta is None else _number("rope_theta", rope_theta),
                rope_scaling=dict(rope_scaling) if rope_scaling else None,
                tie_word_embeddings=bool(cfg.get("tie_word_embeddings", False)),
                # as transformers builds them: Qwen2's q, k, v always; Mistral's none; Llama's
                # and Qwen3's all four projections with attention_bias
                attention_bias=arch == "Qwen2ForCausalLM" or (
                    arch != "MistralForCausalLM" and bool(cfg.get("attention_bias"))),
                o_bias=arch in ("LlamaForCausalLM", "Qwen3ForCausalLM") and bool(cfg.get("attention_bias")),
                qk_norm=arch == "Qwen3ForCausalLM",
                bos_token_id=_whole(cfg, "bos_token_id", None),
                eos_token_ids=eos_ids,
                sliding_window=_sliding_window(cfg, arch, num_layers),
                extra={"torch_dtype": cfg.get("torch_dtype") or cfg.get("dtype"),
                       "quantization_config": _object_or_none(cfg, "quantization_config")},
            )
        except KeyError as e:
            raise ModelLoadError(f"{source}: missing field {e.args[0]!r}") from None
        except ModelLoadError as e:  # a ValueError too, already saying what is wrong
            raise config_error_in(source, e) from None
        except (TypeError, ValueError) as e:
            raise ModelLoadError(f"{source}: invalid value ({e})") from None


def config_error_in(source: str, error: ModelLoadError) -> ModelLoadError:
    """`error` naming the file `source`: ModelConfig's own checks know no file and say
    "config: ..."; other errors already name theirs."""
    message = str(error)
    if message.startswith("config: "):
        return ModelLoadError(f"{source}: {message.removeprefix('config: ')}")
    return error


def _architecture(cfg: Any, source: str) -> str:
    """The config's architecture, checked before its fields: another family's config lacks
    ours (GPT-2 has no num_attention_heads)."""
    if not isinstance(cfg, dict):  # valid JSON of another type, e.g. a list
        raise ModelLoadError(f"{source}: expected a JSON object, got {type(cfg).__name__}")
    archs = cfg.get("architectures") or []
    if not archs:
        raise ModelLoadError(f"{source}: no 'architectures' entry")
    if not isinstance(archs, list) or not all(isinstance(a, str) for a in archs):
        raise ModelLoadError(f"{source}: architectures must be a list of names, got {archs!r}")
    check_architecture(archs[0])
    return archs[0]


def _rope(cfg: dict[str, Any]) -> tuple[Any, dict[str, Any] | None]:
    """(rope_theta as given or None, its scaling or None where it is the default rotation)."""
    rope_scaling = _object_or_none(cfg, "rope_scaling")
    rope_theta = cfg.get("rope_theta")
    rope_params = _object_or_none(cfg, "rope_parameters")  # transformers >= 5 keeps both here
    if rope_params is not None:
        rope_theta = rope_params.get("rope_theta", rope_theta)
        if rope_params.get("rope_type", "default") != "default":
            rope_scaling = rope_params
    if rope_scaling is not None and rope_kind(rope_scaling) == "default":
        rope_scaling = None
    outside = cfg.get("original_max_position_embeddings")
    if rope_scaling is not None and rope_kind(rope_scaling) in _ROPE_ORIGINAL_OUTSIDE and outside is not None:
        rope_scaling = {**rope_scaling, "original_max_position_embeddings": outside}
    return rope_theta, rope_scaling


_REQUIRED = object()


def _is_number(value: Any) -> bool:
    """A JSON number: true is none, though a bool is an int."""
    return isinstance(value, (int, float)) and not isinstance(value, bool)


_FLOAT_MAX_INT = int(sys.float_info.max)


def _number(name: str, value: Any) -> float:
    """A JSON number as a float; one past a float's range (a long integer) is refused too."""
    if _is_number(value) and (isinstance(value, float) or abs(value) <= _FLOAT_MAX_INT):
        return float(value)
    raise ModelLoadError(f"config: {name} must be a number, got {str(value)[:40]!r}")


def _positive_finite(value: Any) -> bool:
    """A JSON number above 0 and below infinity."""
    return _is_number(value) and value > 0 and (isinstance(value, int) or math.isfinite(value))  # 10**400: no float


def _whole(cfg: dict[str, Any], key: str, default: Any = _REQUIRED) -> Any:
    """cfg[key] as a whole number (64.0 too); null or absent: `default` (absent without one: a
    KeyError). 64.7, true or "64" are a ValueError (named by the caller), not cut to 64 or 1."""
    value = cfg.get(key)
    if value is None:
        if default is _REQUIRED:
            raise KeyError(key)
        return default
    return _as_whole(key, value)


def _as_whole(key: str, value: Any) -> int:
    if (isinstance(value, bool) or not isinstance(value, (int, float))
            or isinstance(value, float) and not value.is_integer()):  # inf and NaN too
        raise ValueError(f"{key} must be a whole number, got {value!r}")
    return int(value)


def token_ids(key: str, value: Any) -> tuple[int, ...]:
    """A config's eos_token_id: null, a token id or a list of them (5.0 is 5); anything else,
    a negative id among them, is a ValueError (named by the caller)."""
    if value is None:
        return ()
    if not isinstance(value, int | float | list):
        raise ValueError(f"{key} must be a token id or a list of them, got {value!r}")
    ids = tuple(_as_whole(key, v) for v in (value if isinstance(value, list) else [value]))
    if any(i < 0 for i in ids):
        raise ValueError(f"{key} must hold token ids (0 or more), got {value!r}")
    return ids


def _sliding_window(cfg: dict[str, Any], architecture: str, num_layers: int) -> int | None:
    """The window some layer's attention keeps to, or None; a value that is no positive whole
    number is a ValueError (it would cap the context below 1 token, or fail in formatting)."""
    # Mistral windows every layer whenever a window is set; Qwen only with use_sliding_window,
    # and then only the layers it names (as transformers and vLLM do)
    if architecture != "MistralForCausalLM" and not (
            architecture in _QWEN and cfg.get("use_sliding_window")):
        return None
    # an absent key is transformers' default; an explicit null is no window
    value = cfg.get("sliding_window", _HF_DEFAULTS[architecture]["sliding_window"])
    if value is not None and (isinstance(value, bool) or not isinstance(value, int) or value <= 0):
        raise ValueError(f"sliding_window must be a positive whole number or null, got {value!r}")
    if architecture in _QWEN and not _qwen_windows_a_layer(cfg, architecture, num_layers):
        return None
    return value


def _qwen_windows_a_layer(cfg: dict[str, Any], architecture: str, num_layers: int) -> bool:
    """Whether a Qwen layer is windowed: by transformers 5's layer_types where given, else those
    from max_window_layers on."""
    layer_types = cfg.get("layer_types")
    if layer_types is None:
        first = _whole(cfg, "max_window_layers", _HF_DEFAULTS[architecture]["max_window_layers"])
        return first < num_layers
    if not isinstance(layer_types, list) or not all(isinstance(t, str) for t in layer_types):
        raise ValueError(f"layer_types must be a list of names, got {layer_types!r}")
    return "sliding_attention" in layer_types


def read_json_object(path: str) -> dict[str, Any]:
    """A model folder's JSON file (config.json, the safetensors index, tokenizer_config.json);
    one that is not UTF-8, not JSON or not an object is a one-line error naming it."""
    raw = read_user_json(path)
    if not isinstance(raw, dict):
        raise ModelLoadError(f"{path}: expected a JSON object, got {type(raw).__name__}")
    return raw


def _object_or_none(cfg: dict[str, Any], key: str) -> dict[str, Any] | None:
    """cfg[key] where it is a JSON object; another type is a ValueError (named by the caller)."""
    value = cfg.get(key)
    if value is not None and not isinstance(value, dict):
        raise ValueError(f"{key} must be an object, got {type(value).__name__}")
    return value
