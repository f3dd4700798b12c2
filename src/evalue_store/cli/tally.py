"""Streaming summaries of numbers for ``stats``: count, min, max, mean and a fixed-size
histogram, exact for integers of any int64 or uint64 value and free of overflow for any
finite double (the JSON report must hold only finite numbers).
"""

from __future__ import annotations

import math

import numpy as np

BINS = 64  # bins of every histogram; memory stays fixed however many values are counted
DOUBLE_MAX = float(np.finfo(np.float64).max)
# Float bins are kept in units of 1/SCALE: a span of two doubles, or a range doubled past
# it, then still fits in a double. Dividing by a power of two is exact for normal numbers.
SCALE = 16.0


def _merged(counts: np.ndarray, toward_low: bool) -> np.ndarray:
    """The counts after pairs of bins merge and the range doubles toward one side."""
    merged = counts.reshape(-1, 2).sum(axis=1)
    doubled = np.zeros(BINS, np.int64)
    if toward_low:
        doubled[BINS // 2 :] = merged
    else:
        doubled[: BINS // 2] = merged
    return doubled


class IntBins:
    """Bins ``[lo + k * 2**shift, lo + (k + 1) * 2**shift)`` with an integer ``lo``.

    All arithmetic is on unsigned 64-bit distances from the batch's minimum, so values
    near 2**63 or 2**64 are binned exactly (a double rounds them).
    """

    def __init__(self, lo: int) -> None:
        self.lo = lo
        self.shift = 0
        self.counts = np.zeros(BINS, np.int64)

    def add(self, values: np.ndarray) -> None:
        """Count a non-empty int64 or uint64 array."""
        low, high = int(values.min()), int(values.max())
        while low < self.lo:
            self.counts = _merged(self.counts, toward_low=True)
            self.lo -= BINS << self.shift
            self.shift += 1
        while high >= self.lo + (BINS << self.shift):
            self.counts = _merged(self.counts, toward_low=False)
            self.shift += 1
        # value - lo = distance + offset: distance = value - low is below 2**64, and
        # offset = low - lo below BINS << shift. The range never needs more than 2**61
        # per bin (int64 and uint64 span 1.5 * 2**64), so the sums below fit 64 bits.
        distance = values.view(np.uint64) - np.uint64(low % 2**64)
        offset, shift = low - self.lo, np.uint64(self.shift)
        mask = (1 << self.shift) - 1
        carry = ((distance & np.uint64(mask)) + np.uint64(offset & mask)) >> shift
        index = (distance >> shift) + np.uint64(offset >> self.shift) + carry
        self.counts += np.bincount(index.astype(np.intp), minlength=BINS)

    def edges(self, first: int, last: int) -> list[int]:
        return [self.lo + (k << self.shift) for k in range(first, last + 2)]

    def to_floats(self) -> FloatBins:
        """The same bins for a stream that turned out to hold non-integers too."""
        width = math.ldexp(1.0, self.shift) / SCALE
        return FloatBins(self.lo / SCALE, width, self.counts)


class FloatBins:
    """Bins ``[lo + k * width, lo + (k + 1) * width)`` in units of 1/SCALE."""

    def __init__(self, lo: float, width: float, counts: np.ndarray) -> None:
        self.lo = lo
        self.width = width
        self.counts = counts

    @classmethod
    def first(cls, scaled: np.ndarray) -> FloatBins:
        """Bins spanning the first batch (``scaled``: finite values divided by SCALE)."""
        low, high = float(scaled.min()), float(scaled.max())
        width = (high - low) / (BINS - 1) if high > low else max(abs(low), 1 / SCALE) / 1024
        if high > low and (low + BINS * width) * SCALE > DOUBLE_MAX:  # the maximum ends them
            width = (high - low) / BINS * (1 + 2**-40)
        return cls(low, width, np.zeros(BINS, np.int64))

    def add(self, scaled: np.ndarray) -> None:
        low, high = float(scaled.min()), float(scaled.max())
        while low < self.lo:
            self.counts = _merged(self.counts, toward_low=True)
            self.lo -= BINS * self.width
            self.width *= 2
        while high >= self.lo + BINS * self.width:
            self.counts = _merged(self.counts, toward_low=False)
            self.width *= 2
        index = ((scaled - self.lo) / self.width).astype(np.intp)
        np.clip(index, 0, BINS - 1, out=index)  # rounding at the top edge
        self.counts += np.bincount(index, minlength=BINS)

    def edges(self, first: int, last: int) -> list[float]:
        """Edges in real units; one beyond the largest double is given as that double."""
        scaled = self.lo + self.width * np.arange(first, last + 2)
        with np.errstate(over="ignore"):
            edges = scaled * SCALE
        return np.clip(edges, -DOUBLE_MAX, DOUBLE_MAX).tolist()


class Numbers:
    """Running count/min/max/mean, NaN and Inf counts and a histogram of a stream of numbers.

    Small arrays and scalars are buffered and counted in batches: numpy's per-call overhead
    would otherwise dominate on datasets of many small records. While every value is an
    integer, min, max and the bins are exact; the first non-integer turns them to doubles.
    """

    BATCH = 1 << 16  # buffered values before a flush
    CHUNK = 1 << 20  # elements of a big array counted at once

    def __init__(self) -> None:
        self.count = 0
        self.nan = 0
        self.posinf = 0
        self.neginf = 0
        self.mean = 0.0  # in units of 1/SCALE, so that no partial sum overflows
        self.low: int | float = math.inf
        self.high: int | float = -math.inf
        self.integer = True
        self.bins: IntBins | FloatBins | None = None
        self._arrays: list[np.ndarray] = []
        self._scalars: list[int | float] = []
        self._buffered = 0

    def add_scalar(self, value: int | float) -> None:
        if isinstance(value, float):
            self.integer = False
        self._scalars.append(value)
        self._buffered += 1
        if self._buffered >= self.BATCH:
            self.flush()

    def add_array(self, array: np.ndarray) -> None:
        """Count every element of a real-valued array (any shape; bool, int or float)."""
        if array.dtype.kind == "f":
            self.integer = False
        flat = array.reshape(-1)
        if flat.size >= self.BATCH:
            for start in range(0, flat.size, self.CHUNK):
                self._count([flat[start : start + self.CHUNK]])
            return
        self._arrays.append(flat)
        self._buffered += flat.size
        if self._buffered >= self.BATCH:
            self.flush()

    def flush(self) -> None:
        parts = self._arrays
        if self._scalars:
            parts.append(np.array(self._scalars, np.float64 if not self.integer else np.int64))
        self._arrays, self._scalars, self._buffered = [], [], 0
        if parts:
            self._count(parts)

    def _count(self, parts: list[np.ndarray]) -> None:
        if self.integer:
            wide = [p for p in parts if p.dtype == np.uint64]
            narrow = [p.astype(np.int64, copy=False) for p in parts if p.dtype != np.uint64]
            for group in (wide, narrow):
                if group and (values := np.concatenate(group)).size:
                    self._count_integers(values)
            return
        if isinstance(self.bins, IntBins):
            self.bins = self.bins.to_floats()
        self._count_floats(np.concatenate([p.astype(np.float64, copy=False) for p in parts]))

    def _count_integers(self, values: np.ndarray) -> None:
        self.low = min(self.low, int(values.min()))
        self.high = max(self.high, int(values.max()))
        if self.bins is None:
            self.bins = IntBins(int(values.min()))
        self.bins.add(values)
        self._add_to_mean(values.astype(np.float64) / SCALE)

    def _count_floats(self, values: np.ndarray) -> None:
        finite = np.isfinite(values)
        if not finite.all():
            self.nan += int(np.isnan(values).sum())
            self.posinf += int((values == math.inf).sum())
            self.neginf += int((values == -math.inf).sum())
            values = values[finite]
        if not values.size:
            return
        self.low = min(self.low, float(values.min()))
        self.high = max(self.high, float(values.max()))
        scaled = values / SCALE
        if self.bins is None:
            self.bins = FloatBins.first(scaled)
        self.bins.add(scaled)
        self._add_to_mean(scaled)

    def _add_to_mean(self, scaled: np.ndarray) -> None:
        """Weighted update of the mean: each term stays within the values' range."""
        with np.errstate(over="ignore"):
            total = float(scaled.sum())
        mean = total / scaled.size if math.isfinite(total) else float((scaled / scaled.size).sum())
        before, self.count = self.count, self.count + scaled.size
        self.mean = self.mean * (before / self.count) + mean * (scaled.size / self.count)

    def empty(self) -> bool:
        return not (self.count or self.nan or self.posinf or self.neginf or self._buffered)

    def to_json(self) -> dict:
        self.flush()
        found = self.count > 0
        return {
            "count": self.count,
            "min": (int(self.low) if self.integer else float(self.low)) if found else None,
            "max": (int(self.high) if self.integer else float(self.high)) if found else None,
            "mean": min(max(self.mean * SCALE, -DOUBLE_MAX), DOUBLE_MAX) if found else None,
            "nan": self.nan,
            "posinf": self.posinf,
            "neginf": self.neginf,
            "histogram": self._histogram(),
        }

    def _histogram(self) -> dict:
        """Non-empty span of bins: ``edges`` (one more than ``counts``), bins are [lo, hi)."""
        counts = self.bins.counts if self.bins is not None else np.zeros(0, np.int64)
        nonzero = np.flatnonzero(counts)
        if not nonzero.size:
            return {"edges": [], "counts": [], "integer": self.integer}
        first, last = int(nonzero[0]), int(nonzero[-1])
        return {
            "edges": self.bins.edges(first, last),
            "counts": counts[first : last + 1].tolist(),
            "integer": self.integer,
        }
