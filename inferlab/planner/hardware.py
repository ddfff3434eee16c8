"""Accelerators: memory, memory bandwidth and dense peak FLOP/s per dtype, from datasheets (memory
as the device reports it where that is known, see HARDWARE).

Peaks are dense (the datasheets' "with sparsity" figures are twice these). `interconnect` is the
per-GPU, one-direction bandwidth to its tensor-parallel peers. Datasheet peaks are rarely reached,
so predictions scale them by `bandwidth_efficiency` and `compute_efficiency`: the defaults (0.8
and 0.6) are typical of what tuned servers reach on large models (decode streams weights at
70-85% of HBM bandwidth; large bf16 GEMMs run at 60-75% of peak); measured hardware uses 1.0.
"""

from __future__ import annotations

import itertools
import math
from dataclasses import dataclass, replace

from inferlab.errors import InferlabError
from inferlab.planner.names import unknown_name_message

GB, TB, TFLOPS = 10**9, 10**12, 10**12
MiB = 2**20
# CUDA/ROCm context (~0.5 GiB) plus graphs and cuBLAS/NCCL workspaces (~0.5 GiB): memory a
# server holds that is neither weights, activations nor KV cache
GPU_RUNTIME_OVERHEAD_BYTES = 2**30
PCIE4_X16, PCIE5_X16 = 32 * GB, 64 * GB  # one direction


@dataclass(frozen=True)
class Hardware:
    name: str
    memory_bytes: int
    memory_bandwidth_bytes_per_s: float
    peak_flops: dict[str, float]  # dense, per dtype: bf16, fp16, fp8, int8 (ops/s), fp32
    interconnect_bytes_per_s: float
    source: str
    runtime_overhead_bytes: int = GPU_RUNTIME_OVERHEAD_BYTES
    bandwidth_efficiency: float = 0.8
    compute_efficiency: float = 0.6
    layer_overhead_s: float = 0.0  # host time to launch one layer's operators; 0: CUDA graphs
    # measured hardware: bytes/s matmuls stream weights at, by rows (tokens) then layer width
    stream_rates: dict[int, dict[int, float]] | None = None
    # the KV cache's rates where they are not the weights' (weights held as GGUF codes stream
    # slower than the dense fp32 layers whose rates the cache's plain reads are given); None: the same
    kv_stream_rates: dict[int, dict[int, float]] | None = None
    measured: bool = False
    # the KV budget inferlab's engine takes here unless told (--kv-cache-memory); None: what
    # --gpu-memory-utilization leaves after weights and activations
    engine_kv_cache_bytes: int | None = None

    def __post_init__(self) -> None:
        if self.memory_bytes <= 0:
            raise InferlabError(f"hardware {self.name}: memory must be positive, got {self.memory_bytes}")
        if self.memory_bandwidth_bytes_per_s <= 0 or not self.peak_flops:
            raise InferlabError(f"hardware {self.name}: bandwidth and peak FLOP/s must be positive")
        if self.layer_overhead_s < 0:
            raise InferlabError(f"hardware {self.name}: layer overhead must be >= 0")
        for name in ("bandwidth_efficiency", "compute_efficiency"):
            if not 0 < getattr(self, name) <= 1:
                raise InferlabError(f"{name} must be in (0, 1], got {getattr(self, name)}")

    def flops_for(self, dtype: str) -> tuple[float, str]:
        """(peak FLOP/s, the dtype whose peak applies): fp16 shares bf16's rate; a dtype the
        hardware lacks (fp8 on A100) runs as bf16, as servers then dequantize to bf16."""
        for candidate in (dtype, "bf16" if dtype == "fp16" else dtype, "bf16", "fp32"):
            if candidate in self.peak_flops:
                return self.peak_flops[candidate], candidate
        raise InferlabError(f"hardware {self.name} has no peak FLOP/s for {dtype}")

    def bandwidth_for(self, width: int, rows: int = 1) -> float:
        """Bytes/s a step reads weights at, for layers of hidden size `width` and `rows` tokens:
        the measured grid, interpolated on log scales and clamped at its edges, else the
        datasheet figure."""
        return self._rate(self.stream_rates, width, rows)

    def kv_bandwidth_for(self, width: int, rows: int = 1) -> float:
        """Bytes/s a step reads the KV cache at: kv_stream_rates' grid as bandwidth_for reads
        the weights', else the weights' own."""
        return self._rate(self.kv_stream_rates or self.stream_rates, width, rows)

    def _rate(self, grid: dict[int, dict[int, float]] | None, width: int, rows: int) -> float:
        if not grid:
            return self.memory_bandwidth_bytes_per_s
        by_rows = {r: interpolate_log(by_width, width) for r, by_width in grid.items()}
        # never faster with more rows: a step of more tokens could always be run as fewer
        return min(interpolate_log(by_rows, n) for n in [rows, *(r for r in by_rows if r <= rows)])

    def with_overrides(self, **changes: object) -> Hardware:
        """The same hardware with some values replaced (--memory, --*-efficiency)."""
        return replace(self, **{k: v for k, v in changes.items() if v is not None})


def interpolate_log(points: dict[int, float], x: float) -> float:
    """Piecewise-linear in log(x) through `points`, constant beyond the first and last."""
    ordered = sorted(points.items())
    if x <= ordered[0][0]:
        return ordered[0][1]
    for (x0, y0), (x1, y1) in itertools.pairwise(ordered):
        if x <= x1:
            return y0 + (y1 - y0) * math.log(x / x0) / math.log(x1 / x0)
    return ordered[-1][1]


def _gpu(name: str, memory_bytes: int, bandwidth_tb_s: float, *, bf16_tflops: float,
         fp8_tflops: float | None, int8_tops: float, fp32_tflops: float,
         interconnect_bytes_s: float, source: str) -> Hardware:
    """A datasheet's dense figures, named so that two of them cannot swap places unseen."""
    flops = {"bf16": bf16_tflops * TFLOPS, "int8": int8_tops * TFLOPS, "fp32": fp32_tflops * TFLOPS}
    if fp8_tflops is not None:
        flops["fp8"] = fp8_tflops * TFLOPS
    return Hardware(name, memory_bytes, bandwidth_tb_s * TB, flops, interconnect_bytes_s, source)


# Memory is the total the device reports (nvidia-smi's memory.total, cudaMemGetInfo's total), in
# MiB: servers size their KV cache from it × --gpu-memory-utilization, and it is not the
# datasheet's decimal GB (an H200's "141 GB" reports 143,771 MiB, 150.8e9 bytes). The totals are
# those nvidia-smi prints (rocm-smi's "VRAM Total Memory (B)" on AMD) in public logs; where no
# such total is known here, the entry keeps the datasheet's decimal GB and says so.
HARDWARE: dict[str, Hardware] = {h.name: h for h in (
    # NVIDIA H100 Tensor Core GPU datasheet (SXM5): 80 GB HBM3, 3.35 TB/s, BF16 1,979 TFLOPS and
    # FP8/INT8 3,958 with sparsity, FP32 67 TFLOPS; NVLink 900 GB/s (both directions)
    _gpu("H100-SXM", 81559 * MiB, 3.35, bf16_tflops=989.5, fp8_tflops=1979, int8_tops=1979,
         fp32_tflops=67, interconnect_bytes_s=450 * GB,
         source="NVIDIA H100 Tensor Core GPU datasheet, SXM column"),
    # same datasheet, PCIe column: 80 GB HBM2e, 2.0 TB/s, BF16 1,513 / FP8 3,026 sparse, FP32 51
    _gpu("H100-PCIe", 81559 * MiB, 2.0, bf16_tflops=756.5, fp8_tflops=1513, int8_tops=1513,
         fp32_tflops=51, interconnect_bytes_s=PCIE5_X16,
         source="NVIDIA H100 Tensor Core GPU datasheet, PCIe column"),
    # NVIDIA H200 Tensor Core GPU datasheet (SXM): 141 GB HBM3e, 4.8 TB/s, same tensor cores as H100
    _gpu("H200", 143771 * MiB, 4.8, bf16_tflops=989.5, fp8_tflops=1979, int8_tops=1979,
         fp32_tflops=67, interconnect_bytes_s=450 * GB,
         source="NVIDIA H200 Tensor Core GPU datasheet, SXM column"),
    # NVIDIA HGX B200 datasheet, 8 GPUs: 1.44 TB HBM3e (180 GB each), 64 TB/s (8 TB/s each),
    # FP16/BF16 36 PFLOPS and FP8/INT8 72 with sparsity, FP32 600 TFLOPS; NVLink 1.8 TB/s per GPU;
    # nvidia-smi reports 183,359 MiB
    _gpu("B200", 183359 * MiB, 8.0, bf16_tflops=2250, fp8_tflops=4500, int8_tops=4500,
         fp32_tflops=75, interconnect_bytes_s=900 * GB,
         source="NVIDIA HGX B200 datasheet, per GPU (totals / 8)"),
    # NVIDIA A100 Tensor Core GPU datasheet: BF16 312 TFLOPS, INT8 624 TOPS, FP32 19.5, no FP8;
    # 40 GB SXM 1,555 GB/s; 80 GB SXM 2,039 GB/s; NVLink 600 GB/s (both directions)
    _gpu("A100-40GB", 40960 * MiB, 1.555, bf16_tflops=312, fp8_tflops=None, int8_tops=624,
         fp32_tflops=19.5, interconnect_bytes_s=300 * GB,
         source="NVIDIA A100 Tensor Core GPU datasheet, A100 40GB SXM column"),
    _gpu("A100-80GB", 81920 * MiB, 2.039, bf16_tflops=312, fp8_tflops=None, int8_tops=624,
         fp32_tflops=19.5, interconnect_bytes_s=300 * GB,
         source="NVIDIA A100 Tensor Core GPU datasheet, A100 80GB SXM column"),
    # NVIDIA L40S datasheet: 48 GB GDDR6, 864 GB/s, BF16 733 / FP8 1,466 / INT8 1,466 with
    # sparsity, FP32 91.6 TFLOPS, PCIe Gen4 x16; nvidia-smi reports 46,068 MiB (the totals
    # modal-labs/modal-client#2797 lists for each of its GPUs)
    _gpu("L40S", 46068 * MiB, 0.864, bf16_tflops=362.05, fp8_tflops=733, int8_tops=733,
         fp32_tflops=91.6, interconnect_bytes_s=PCIE4_X16,
         source="NVIDIA L40S datasheet; memory as nvidia-smi reports it"),
    # NVIDIA L4 datasheet: 24 GB GDDR6, 300 GB/s, BF16 242 / FP8 485 / INT8 485 with sparsity,
    # FP32 30.3 TFLOPS, PCIe Gen4 x16
    _gpu("L4", 23034 * MiB, 0.300, bf16_tflops=121, fp8_tflops=242.5, int8_tops=242.5,
         fp32_tflops=30.3, interconnect_bytes_s=PCIE4_X16, source="NVIDIA L4 datasheet"),
    # NVIDIA A10 datasheet: 24 GB GDDR6, 600 GB/s, BF16 125 TFLOPS and INT8 250 TOPS dense,
    # FP32 31.2 TFLOPS. NVIDIA publishes no A10G datasheet (AWS G5); AWS describes it as a
    # 24 GB Ampere GPU of the same class, so it gets the A10's figures: approximate (nvidia-smi
    # reports both as 23,028 MiB)
    _gpu("A10", 23028 * MiB, 0.600, bf16_tflops=125, fp8_tflops=None, int8_tops=250,
         fp32_tflops=31.2, interconnect_bytes_s=PCIE4_X16, source="NVIDIA A10 datasheet"),
    _gpu("A10G", 23028 * MiB, 0.600, bf16_tflops=125, fp8_tflops=None, int8_tops=250,
         fp32_tflops=31.2, interconnect_bytes_s=PCIE4_X16,
         source="NVIDIA A10 datasheet (no A10G datasheet exists; AWS G5 GPU, same class)"),
    # AMD Instinct MI300X datasheet: 192 GB HBM3, 5.3 TB/s, BF16 1,307.4 TFLOPS, FP8 and INT8
    # 2,614.9 dense, FP32 matrix 163.4; Infinity Fabric 7 links × 64 GB/s each direction;
    # rocm-smi reports 205,822,885,888 B (196,288 MiB)
    _gpu("MI300X", 196288 * MiB, 5.3, bf16_tflops=1307.4, fp8_tflops=2614.9, int8_tops=2614.9,
         fp32_tflops=163.4, interconnect_bytes_s=448 * GB,
         source="AMD Instinct MI300X accelerator datasheet"),
    # AMD Instinct MI325X datasheet: 256 GB HBM3E, 6 TB/s, same compute as MI300X
    _gpu("MI325X", 256 * GB, 6.0, bf16_tflops=1307.4, fp8_tflops=2614.9, int8_tops=2614.9,
         fp32_tflops=163.4, interconnect_bytes_s=448 * GB,  # memory: datasheet GB
         source="AMD Instinct MI325X accelerator datasheet"),
    # NVIDIA Ada Lovelace architecture whitepaper, RTX 4090 column: 24 GB GDDR6X, 1,008 GB/s,
    # BF16 165.2 and FP8 330.3 TFLOPS dense with FP32 accumulate, INT8 660.6 TOPS, FP32 82.6;
    # nvidia-smi reports 24,564 MiB
    _gpu("RTX-4090", 24564 * MiB, 1.008, bf16_tflops=165.2, fp8_tflops=330.3, int8_tops=660.6,
         fp32_tflops=82.6, interconnect_bytes_s=PCIE4_X16,
         source="NVIDIA Ada Lovelace GPU architecture whitepaper, appendix table"),
)}

CPU_LOCAL = "cpu-local"


def hardware_names() -> list[str]:
    return [*HARDWARE, CPU_LOCAL]


def datasheet_hardware(name: str) -> Hardware:
    """A table entry by name (case-insensitive); cpu-local is built by `cpu_local.cpu_local_hardware`."""
    for key, hardware in HARDWARE.items():
        if key.lower() == name.lower():
            return hardware
    raise InferlabError(unknown_name_message("hardware", name, hardware_names()))
