"""Compression algorithms as functions of tensors (weights, input statistics), model-agnostic."""
