"""Bit layouts, each as a pack/unpack pair: compressed-tensors' int32 packing, torch's CPU int4."""
