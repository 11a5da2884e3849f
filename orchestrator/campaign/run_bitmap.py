"""A set of plan indices as one bit each: what is stored, what is to run again.

A 10**8-run plan's completion state is 12.5 MB here, where a set of its run id strings would be
about 10 GB. Bits are numpy ``uint8`` words in little bit order (index ``i`` is bit ``i % 8`` of
byte ``i // 8``), so :meth:`RunBitmap.to_bytes` is a stable encoding.
"""

from __future__ import annotations

from collections.abc import Iterable

import numpy as np


class RunBitmap:
    """Which of ``size`` plan indices are in the set."""

    def __init__(self, size: int, words: np.ndarray | None = None) -> None:
        if size < 0:
            raise ValueError(f"bitmap size {size} < 0")
        n_bytes = (size + 7) // 8
        if words is None:
            words = np.zeros(n_bytes, dtype=np.uint8)
        elif words.dtype != np.uint8 or words.shape != (n_bytes,):
            raise ValueError(f"a bitmap of {size} bits needs {n_bytes} uint8 words, got {words.dtype} {words.shape}")
        self.size = size
        self._words = words

    @classmethod
    def of(cls, size: int, indices: Iterable[int] | np.ndarray) -> RunBitmap:
        bitmap = cls(size)
        bitmap.add(np.fromiter(indices, dtype=np.int64) if not isinstance(indices, np.ndarray) else indices)
        return bitmap

    @classmethod
    def full(cls, size: int) -> RunBitmap:
        """Every index of ``[0, size)`` set (the bits past ``size`` stay clear)."""
        words = np.full((size + 7) // 8, 0xFF, dtype=np.uint8)
        if size & 7:
            words[-1] = (1 << (size & 7)) - 1
        return cls(size, words)

    def _checked(self, indices: np.ndarray) -> np.ndarray:
        """``indices`` as int64, each in ``[0, size)`` (``IndexError`` otherwise)."""
        idx = np.asarray(indices, dtype=np.int64)
        if idx.size and (idx.min() < 0 or idx.max() >= self.size):
            raise IndexError(f"index outside [0, {self.size})")
        return idx

    def add(self, indices: np.ndarray) -> None:
        """Set the bits of ``indices`` (any order, repeats allowed; each in ``[0, size)``)."""
        idx = self._checked(indices)
        if idx.size == 0:
            return
        np.bitwise_or.at(self._words, idx >> 3, (np.uint8(1) << (idx & 7).astype(np.uint8)))

    def discard(self, indices: np.ndarray) -> None:
        """Clear the bits of ``indices`` (any order, repeats allowed; each in ``[0, size)``)."""
        idx = self._checked(indices)
        if idx.size == 0:
            return
        np.bitwise_and.at(self._words, idx >> 3, ~(np.uint8(1) << (idx & 7).astype(np.uint8)))

    def test(self, indices: np.ndarray) -> np.ndarray:
        """Whether each of ``indices`` is set (a bool array; each index in ``[0, size)``)."""
        idx = np.asarray(indices, dtype=np.int64)
        if idx.size == 0:
            return np.zeros(0, dtype=bool)
        return ((self._words[idx >> 3] >> (idx & 7).astype(np.uint8)) & 1).astype(bool)

    def copy(self) -> RunBitmap:
        return RunBitmap(self.size, self._words.copy())

    def __contains__(self, i: object) -> bool:
        if not isinstance(i, (int, np.integer)) or not 0 <= i < self.size:
            return False
        return bool((self._words[int(i) >> 3] >> (int(i) & 7)) & 1)

    def mask(self, start: int = 0, stop: int | None = None) -> np.ndarray:
        """The bits of ``[start, stop)`` as a bool array."""
        stop = self.size if stop is None else min(stop, self.size)
        if stop <= start:
            return np.zeros(0, dtype=bool)
        first, last = start >> 3, (stop + 7) >> 3
        bits = np.unpackbits(self._words[first:last], bitorder="little").view(bool)
        return bits[start - (first << 3): stop - (first << 3)]

    def count(self) -> int:
        return int(np.unpackbits(self._words, bitorder="little")[: self.size].sum())

    def __len__(self) -> int:
        return self.count()

    def indices(self) -> np.ndarray:
        """The set indices, ascending (int64)."""
        return np.flatnonzero(self.mask()).astype(np.int64)

    def union(self, other: RunBitmap) -> RunBitmap:
        self._same_size(other)
        return RunBitmap(self.size, self._words | other._words)

    def difference(self, other: RunBitmap) -> RunBitmap:
        self._same_size(other)
        return RunBitmap(self.size, self._words & ~other._words)

    def _same_size(self, other: RunBitmap) -> None:
        if other.size != self.size:
            raise ValueError(f"bitmaps of {self.size} and {other.size} bits")

    def to_bytes(self) -> bytes:
        return self._words.tobytes()

    @classmethod
    def from_bytes(cls, size: int, data: bytes) -> RunBitmap:
        words = np.frombuffer(data, dtype=np.uint8).copy()
        if (size & 7) and words.size == (size + 7) // 8 and words[-1] >> (size & 7):
            raise ValueError("bits set past the bitmap's size")
        return cls(size, words)

    def __eq__(self, other: object) -> bool:
        return isinstance(other, RunBitmap) and other.size == self.size and bool(np.array_equal(other._words, self._words))

    def __repr__(self) -> str:
        return f"RunBitmap(size={self.size}, count={self.count()})"
