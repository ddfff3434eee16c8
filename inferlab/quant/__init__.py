"""Compression: quantize (W8A16, W8A8, W4A16, FP8_DYNAMIC, FP8, FP8_BLOCK) and 2:4-sparsify linear layers.

scheme.py (what is stored) -> qparams.py (scales, codes) -> algorithms/ (RTN, GPTQ, AWQ,
SmoothQuant, SparseGPT, magnitude) -> layer.py / sequential.py (layer-by-layer calibration) ->
export.py (compressed-tensors checkpoint); load.py + linear.py run such checkpoints with
quantized kernels; formats/ holds the pack/unpack pairs.
"""
