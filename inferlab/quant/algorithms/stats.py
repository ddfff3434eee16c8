"""Running statistics of a linear layer's inputs, gathered batch by batch during calibration.

Nothing keeps all activations: the Hessian (GPTQ, SparseGPT) is a sum and the per-channel
maxima (SmoothQuant, static activation scales) a running maximum, and AWQ's search keeps a random
sample of at most `sample_rows` rows, whatever the number of batches.
"""

from __future__ import annotations

import torch


class InputStats:
    """What the algorithms need to know about the inputs x [tokens, K] of one linear layer."""

    def __init__(self, in_features: int, hessian: bool, sample_rows: int, seed: int = 0) -> None:
        self.in_features = in_features
        self.weight_sum = 0.0  # of the Hessian's row weights
        self.xtx = torch.zeros(in_features, in_features, dtype=torch.float64) if hessian else None
        self.abs_max = torch.zeros(in_features)  # max |x| per channel
        self.sample_rows = sample_rows
        self._samples = torch.zeros(0, in_features)  # [<= sample_rows, K], in arrival order
        self._sample_keys = torch.zeros(0)  # [<= sample_rows], the kept rows' random keys
        self._generator = torch.Generator().manual_seed(seed)

    def add(self, x: torch.Tensor, row_weights: torch.Tensor | None = None) -> None:
        """x [T, K]; `row_weights` [T] weigh each row's share of the Hessian (default 1)."""
        x = x.detach().reshape(-1, self.in_features).float()  # [T, K]
        if self.xtx is not None:
            if row_weights is None:
                self.xtx += (x.t() @ x).double()  # fp32 GEMM, fp64 running sum
                self.weight_sum += x.shape[0]
            else:
                self.xtx += ((x * row_weights[:, None]).t() @ x).double()
                self.weight_sum += float(row_weights.sum())
        torch.maximum(self.abs_max, x.abs().amax(dim=0), out=self.abs_max)
        if self.sample_rows:
            self._keep_sample(x)

    def _keep_sample(self, x: torch.Tensor) -> None:
        """Reservoir sampling by random keys: every row seen gets a uniform key and the rows
        with the `sample_rows` smallest keys so far are kept. The sample is then a uniform
        random subset of all rows of all batches while memory stays at the cap; thinning at the
        end instead would hold up to a cap's worth per batch until then."""
        keys = torch.cat([self._sample_keys, torch.rand(x.shape[0], generator=self._generator)])
        rows = torch.cat([self._samples, x])  # a copy: x may be a view of the layer's activations
        if rows.shape[0] > self.sample_rows:
            keep = keys.topk(self.sample_rows, largest=False).indices.sort().values
            keys, rows = keys[keep], rows[keep]
        self._sample_keys, self._samples = keys, rows

    @property
    def held_rows(self) -> int:
        """Sample rows in memory (at most `sample_rows`)."""
        return self._samples.shape[0]

    def hessian(self) -> torch.Tensor:
        """H = 2 X^T D X / sum(D) [K, K] fp32 (D: row weights): the curvature of the layer's
        weighted squared output error."""
        if self.xtx is None or not self.weight_sum:
            raise RuntimeError("no Hessian was accumulated for this layer")
        return (2.0 * self.xtx / self.weight_sum).float()

    def samples(self) -> torch.Tensor:
        """A uniform random subset of the input rows [<= sample_rows, K], in arrival order
        (all of them while they fit); the same rows every call."""
        return self._samples

    def scale_inputs(self, scale: torch.Tensor) -> None:
        """The producer was divided by `scale` [K]: the inputs are now x / scale, and every
        statistic follows exactly (X^T X becomes S^-1 X^T X S^-1)."""
        self._samples = self._samples / scale
        self.abs_max /= scale
        if self.xtx is not None:
            s = scale.double()
            self.xtx /= s[:, None] * s[None, :]
