"""What `inferlab quantize` is asked to do: scheme x method x sparsity, checked as one whole."""

from __future__ import annotations

import math
import re
from dataclasses import dataclass, field, replace

from inferlab.errors import InferlabError
from inferlab.quant.algorithms.awq import AwqConfig
from inferlab.quant.algorithms.obs import ObsConfig
from inferlab.quant.ct_config import matches
from inferlab.quant.load import checkpoint_names
from inferlab.quant.scheme import STATIC_ACT_ORDER, QuantScheme

METHODS = ("rtn", "gptq", "awq", "smoothquant", "sparsegpt", "magnitude")
PRUNING_METHODS = ("sparsegpt", "magnitude")
HESSIAN_METHODS = ("gptq", "smoothquant", "sparsegpt")  # SmoothQuant quantizes with GPTQ
DATA_FREE_METHODS = ("rtn", "magnitude")  # no calibration data (unless the scheme's scales need it)
# Each algorithm flag, by its argparse dest (--block-size: block_size) -> the methods that read it
METHOD_FLAGS = {"block_size": HESSIAN_METHODS, "dampening": HESSIAN_METHODS,
                "act_order": HESSIAN_METHODS, "sink_weight": HESSIAN_METHODS,
                "awq_grid": ("awq",), "awq_clip": ("awq",), "smoothquant_alpha": ("smoothquant",)}
SPARSITY_PATTERNS = ("2:4",)


def default_method(sparsity: str | None) -> str:
    """The method when none is named: 2:4 needs a pruning method, and SparseGPT is the one
    llm-compressor users reach for (SparseGPTModifier); plain quantization starts with RTN."""
    return "rtn" if sparsity is None else "sparsegpt"


@dataclass(frozen=True)
class Recipe:
    scheme: QuantScheme | None  # None: sparsity alone, weights stay dense
    method: str | None = None  # None: default_method(sparsity)
    sparsity: str | None = None  # "2:4"; implied by sparsegpt and magnitude
    ignore: tuple[str, ...] = ("lm_head",)  # HF names or "re:" patterns left unquantized
    obs: ObsConfig = field(default_factory=ObsConfig)  # GPTQ / SparseGPT
    awq: AwqConfig = field(default_factory=AwqConfig)
    smoothquant_alpha: float = 0.5
    # Hessian weight of each window's first token, which becomes the attention sink: nearly every
    # later query attends to it, so an error in its k/v reaches them all. None: the window length.
    sink_weight: float | None = None

    def __post_init__(self) -> None:
        if self.method is None:
            object.__setattr__(self, "method", default_method(self.sparsity))
        if self.method not in METHODS:
            raise InferlabError(f"unknown method {self.method!r} (known: {', '.join(METHODS)})")
        if self.sparsity is not None and self.sparsity not in SPARSITY_PATTERNS:
            raise InferlabError(f"unknown sparsity {self.sparsity!r} (supported: 2:4)")
        if self.method in PRUNING_METHODS and self.sparsity is None:
            object.__setattr__(self, "sparsity", "2:4")
        if self.sparsity is not None and self.method not in PRUNING_METHODS:
            raise InferlabError(f"--sparsity 2:4 is done by --method sparsegpt or magnitude, "
                                f"not {self.method}")
        if self.scheme is None and self.sparsity is None:
            raise InferlabError("nothing to do: give --scheme, --sparsity 2:4, or both")
        if self.method == "smoothquant" and (self.scheme is None or self.scheme.activations is None):
            raise InferlabError("smoothquant migrates activation outliers: use it with a scheme "
                                "that quantizes activations (W8A8, FP8_DYNAMIC, FP8)")
        if self.method == "awq" and (self.scheme is None or self.scheme.activations is not None
                                     or self.scheme.weights.kind != "int"):
            raise InferlabError("awq searches scales for integer weight-only schemes "
                                "(W4A16, W8A16)")
        if self.sparsity is not None and self.obs.act_order:
            raise InferlabError("--act-order cannot be combined with 2:4 sparsity")
        # SparseGPT prunes inside the OBS loop: its --block-size rule is checked now, before the
        # model loads, where it once failed only once the first layer had calibrated. The method
        # decides pruning, whatever prune_2of4 a caller's ObsConfig carried
        object.__setattr__(self, "obs", replace(self.obs, prune_2of4=self.method == "sparsegpt"))
        if self.sink_weight is not None and not 0 < self.sink_weight < math.inf:  # NaN fails too
            raise InferlabError(f"--sink-weight must be a positive number, got {self.sink_weight}")
        if not 0 <= self.smoothquant_alpha <= 1:
            raise InferlabError(f"--smoothquant-alpha must be in [0, 1], got {self.smoothquant_alpha}")
        for target in self.ignore:
            _check_pattern(target)

    @property
    def needs_hessian(self) -> bool:
        return self.method in HESSIAN_METHODS

    @property
    def written_scheme(self) -> QuantScheme | None:
        """The scheme as config.json states it. GPTQ's act-order (columns by decreasing Hessian
        diagonal, groups and their scales as without it, no g_idx) is compressed-tensors' actorder
        "static", which llm-compressor writes for the same GPTQ: readers learn how it was made."""
        if self.scheme is None or not (self.needs_hessian and self.obs.act_order):
            return self.scheme
        return replace(self.scheme, weights=replace(self.scheme.weights, actorder=STATIC_ACT_ORDER))

    def sink_weight_for(self, seq_len: int) -> float:
        return self.sink_weight if self.sink_weight is not None else float(seq_len)

    def settings(self, seq_len: int) -> dict[str, object]:
        """The algorithm flags' values this run used, by dest, those its method reads only: with
        the calibration settings, what reproduces the run."""
        values = {"block_size": self.obs.block_size, "dampening": self.obs.damp,
                  "act_order": self.obs.act_order, "sink_weight": self.sink_weight_for(seq_len),
                  "awq_grid": self.awq.grid, "awq_clip": self.awq.clip,
                  "smoothquant_alpha": self.smoothquant_alpha}
        return {dest: value for dest, value in values.items() if self.method in METHOD_FLAGS[dest]}

    @property
    def needs_samples(self) -> bool:
        return self.method == "awq"

    @property
    def needs_calibration(self) -> bool:
        """Calibration data: for the method, or for the scheme's static activation scales."""
        static = (self.scheme is not None and self.scheme.activations is not None
                  and self.scheme.activations.static)
        return static or self.method not in DATA_FREE_METHODS

    def ignores(self, module_name: str) -> bool:
        """Whether `--ignore` leaves a module dense; a fused module's shards must agree."""
        hits = [any(matches(n, p) for p in self.ignore) for n in checkpoint_names(module_name)]
        if any(hits) and not all(hits):
            raise InferlabError(f"--ignore matches only some of {', '.join(checkpoint_names(module_name))}"
                                ", which run as one fused layer: ignore all or none")
        return all(hits)


def _check_pattern(target: str) -> None:
    """An --ignore "re:" pattern that does not compile fails here, before the model loads."""
    if target.startswith("re:"):
        try:
            re.compile(target[3:])
        except re.error as e:
            raise InferlabError(f"--ignore {target!r}: not a regular expression ({e})") from None
