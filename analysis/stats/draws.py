"""Bounded random integers with per-element bounds, as numpy draws them, without its slow
per-element broadcasting loop.

:func:`integers_below` returns exactly ``rng.integers(0, high, shape)`` (int64) for an array
``high`` of bounds in 2..2³²−1 and leaves ``rng`` in exactly the state that call would: numpy's
``Generator`` draws each such integer by Lemire's multiply-shift on one 32-bit word of its bit
stream, rejecting (and drawing another word) only when the low half of the product falls below
``(2³² − high) mod high`` (a chance below high / 2³², ~10⁻⁶ for bootstrap sizes). Here the
words come in one vectorised call (the generator's raw 64-bit outputs, split as it splits them), the products are vectorised, and in the rare call where a word would be
rejected the generator is put back and numpy's own broadcast call draws the whole array.
tests/analysis/test_draws.py checks both paths against ``rng.integers``.
"""

from __future__ import annotations

import sys
from typing import Any

import numpy as np

__all__ = ["integers_below"]

_WORD = np.uint64(32)


def integers_below(rng: np.random.Generator, high: np.ndarray, shape: tuple[int, ...]
                   ) -> np.ndarray:
    """``rng.integers(0, high, shape)`` (int64), bit-for-bit, with the same state afterwards.

    high: int array broadcastable to ``shape``, bounds ≥ 1. Bounds of 1 (numpy returns 0 without
    drawing a word) or above 2³²−1 go to numpy's call directly. shape: the output shape.
    """
    high = np.asarray(high, dtype=np.int64)
    if high.size == 0 or high.min() < 2 or high.max() > 0xFFFF_FFFF:
        return rng.integers(0, high, shape)
    saved = rng.bit_generator.state
    words = _words(rng, int(np.prod(shape))).reshape(shape)
    n32 = high.astype(np.uint32)  # the small bounds array, broadcast below (never expanded)
    # numpy rejects a word when (word·n mod 2³²) < (2³² − n) mod n; uint32 products wrap to
    # exactly that low half
    if np.any(words * n32 < ((2**32 - high) % high).astype(np.uint32)):
        rng.bit_generator.state = saved  # a rejection shifts the stream: let numpy draw it
        return rng.integers(0, high, shape)
    prod = words.astype(np.uint64)
    prod *= high.astype(np.uint64)
    prod >>= _WORD
    return prod.view(np.int64)  # < 2³², so the same values as int64


def _words(rng: np.random.Generator, size: int) -> np.ndarray:
    """The next ``size`` 32-bit words of ``rng`` (uint32), as its bounded draws take them.

    PCG64 (numpy's default) hands out each 64-bit output as two words, low half first, keeping
    the high half for the next word: read here from ``random_raw`` (3x faster than
    ``integers(0, 2³², dtype=uint32)``, which gives the same words), with the kept half taken
    and left as the generator would. Other bit generators use ``integers``."""
    state: dict[str, Any] = dict(rng.bit_generator.state)  # a copy to edit, assigned back whole below
    if state.get("bit_generator") != "PCG64" or sys.byteorder != "little":
        return rng.integers(0, 2**32, size, dtype=np.uint32)
    out = np.empty(size, dtype=np.uint32)
    if size == 0:
        return out
    start = 0
    if state["has_uint32"]:
        out[0] = state["uinteger"]
        start = 1
    rest = size - start
    raw = rng.bit_generator.random_raw((rest + 1) // 2)
    halves = raw.view(np.uint32)  # little-endian: each output's low half, then its high half
    out[start:] = halves[:rest]
    state = dict(rng.bit_generator.state)
    if rest % 2:  # the last output's high half waits for the next word
        state["has_uint32"], state["uinteger"] = 1, int(halves[-1])
    else:
        state["has_uint32"], state["uinteger"] = 0, 0
    rng.bit_generator.state = state
    return out
