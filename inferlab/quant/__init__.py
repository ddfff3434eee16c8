"""Compression: quantize (W8A16, W8A8, W4A16, FP8_DYNAMIC, FP8, FP8_BLOCK) and 2:4-sparsify linear layers.

cli.py -> run.py (load, check, calibrate, compress, write): recipe.py (scheme x method x sparsity,
--ignore) over scheme.py (what is stored); calibration.py (the calibration windows);
sequential.py / layer.py (layer-by-layer calibration) run algorithms/ (GPTQ, AWQ, SmoothQuant,
SparseGPT, magnitude) and qparams.py (scales, codes; RTN is qparams.quantize_rtn); export.py
writes the compressed-tensors checkpoint, its tensors and quantization_config from
checkpoint.py. load.py runs such checkpoints: ct_config.py parses their config (without torch),
checkpoint.py reads their tensors, linear.py and linear_dynamic.py are the quantized layers;
formats/ holds the pack/unpack pairs.
"""
