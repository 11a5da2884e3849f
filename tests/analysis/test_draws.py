"""analysis.stats.draws.integers_below against numpy's own broadcast rng.integers."""

import numpy as np
import pytest

from analysis.stats.draws import _words, integers_below


@pytest.mark.parametrize("seed", range(6))
def test_same_draws_and_state_as_numpy_for_bootstrap_sized_bounds(seed):
    gen = np.random.default_rng(100 + seed)
    shape = (int(gen.integers(1, 40)), int(gen.integers(1, 30)), int(gen.integers(1, 50)))
    high = gen.integers(1, 20_000, (1, shape[1], 1))
    a, b = np.random.default_rng(seed), np.random.default_rng(seed)
    if seed % 2:  # start with half a 64-bit word buffered in the generator
        a.integers(0, 2**32, 1, dtype=np.uint32)
        b.integers(0, 2**32, 1, dtype=np.uint32)
    expected = a.integers(0, high, shape)
    got = integers_below(b, high, shape)
    assert got.dtype == expected.dtype == np.int64
    np.testing.assert_array_equal(got, expected)
    # the generators continue identically (the same number of words consumed)
    np.testing.assert_array_equal(a.random(5), b.random(5))
    np.testing.assert_array_equal(a.integers(0, 7, 9), b.integers(0, 7, 9))


def test_rejections_fall_back_to_numpy_with_the_same_stream():
    # bounds just above 2^31: about half of all words are rejected by numpy's sampler
    high = np.array([2**31 + 1, 3, 2**31 + 7, 3_000_000_001])
    for seed in range(5):
        a, b = np.random.default_rng(seed), np.random.default_rng(seed)
        expected = a.integers(0, high[None, :], (50, 4))
        got = integers_below(b, high[None, :], (50, 4))
        np.testing.assert_array_equal(got, expected)
        np.testing.assert_array_equal(a.random(3), b.random(3))


def test_bound_one_draws_no_word_as_in_numpy():
    high = np.array([1, 1, 9])
    a, b = np.random.default_rng(8), np.random.default_rng(8)
    np.testing.assert_array_equal(integers_below(b, high[None, :], (30, 3)),
                                  a.integers(0, high[None, :], (30, 3)))
    np.testing.assert_array_equal(a.random(3), b.random(3))


def test_uniform_below_each_bound():
    rng = np.random.default_rng(3)
    high = np.array([1, 2, 5, 1000])
    draws = integers_below(rng, high[None, :], (20_000, 4))
    assert draws.min() == 0
    assert np.all(draws < high[None, :])
    assert np.all(draws[:, 0] == 0)
    # each value of the bound-5 column about 1/5 of the time (binomial sd ≈ 0.0028)
    shares = np.bincount(draws[:, 2], minlength=5) / draws.shape[0]
    np.testing.assert_allclose(shares, 0.2, atol=0.015)


@pytest.mark.parametrize("buffered", [False, True])
def test_words_are_numpys_32_bit_words_for_every_size_parity(buffered):
    a, b = np.random.default_rng(21), np.random.default_rng(21)
    if buffered:
        a.integers(0, 2**32, 1, dtype=np.uint32)
        b.integers(0, 2**32, 1, dtype=np.uint32)
    for size in (0, 1, 2, 3, 4, 7, 10, 1):
        np.testing.assert_array_equal(_words(b, size), a.integers(0, 2**32, size, dtype=np.uint32))
    np.testing.assert_array_equal(a.integers(0, 1000, 11), b.integers(0, 1000, 11))
    assert a.bit_generator.state == b.bit_generator.state
