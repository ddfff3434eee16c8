"""Summary statistics of a sample: mean, percentiles, extremes."""

from __future__ import annotations

from dataclasses import asdict, dataclass

import numpy as np

# (field name, percentile); linear interpolation between order statistics (numpy default)
PERCENTILES = (("median", 50.0), ("p90", 90.0), ("p95", 95.0), ("p99", 99.0), ("p999", 99.9))
STAT_NAMES = ("mean", *(name for name, _ in PERCENTILES), "min", "max")


@dataclass(frozen=True)
class Distribution:
    count: int
    mean: float | None = None
    median: float | None = None
    p90: float | None = None
    p95: float | None = None
    p99: float | None = None
    p999: float | None = None
    min: float | None = None
    max: float | None = None
    stdev: float | None = None

    @classmethod
    def of(cls, values: list[float] | np.ndarray) -> Distribution:
        data = np.asarray(values, dtype=np.float64)
        data = data[np.isfinite(data)]
        if data.size == 0:
            return cls(count=0)
        points = np.percentile(data, [p for _, p in PERCENTILES])
        stdev = float(np.std(data, ddof=1)) if data.size > 1 else None
        return cls(count=int(data.size), mean=float(np.mean(data)),
                   **{name: float(v) for (name, _), v in zip(PERCENTILES, points, strict=True)},
                   min=float(np.min(data)), max=float(np.max(data)), stdev=stdev)

    def get(self, stat: str) -> float | None:
        return getattr(self, stat)

    def to_dict(self) -> dict:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict) -> Distribution:
        return cls(**data)
