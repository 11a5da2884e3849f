"""The shared-stream bootstrap (analysis.stats.shared_stream) against its dense form.

``_dense_*`` below is the straightforward form of the scheme (every window position gathered and
zero-filled, numpy's broadcast draws): the sparse gathers, narrow counters and vectorised
draws of the module must give the same replicate means, bit for bit, on panels that exercise
every path (several bands, one-model blocks, windows that grow, top-ups, tiny and equal n).
Its statistical properties are tested in tests/analysis/test_bootstrap.py.
"""

import numpy as np
import pytest

from analysis.stats.shared_stream import shared_bootstrap_means


def _dense_bands(sizes):
    order = np.argsort(-sizes, kind="stable")
    bands, start = [], 0
    while start < order.size:
        top = sizes[order[start]]
        stop = start + int(np.sum(sizes[order[start:]] * 2 > top))
        bands.append(order[start:stop])
        start = stop
    return bands


def _dense_band_sums(xpad, xt, n, rng, c, max_elements=4_000_000):
    k, big_l, mb = xpad.shape
    u = rng.integers(0, big_l, (c, big_l))
    w = np.bincount((u + (np.arange(c) * big_l)[:, None]).ravel(),
                    minlength=c * big_l).reshape(c, big_l)
    wf = w.astype(float)
    sums = np.stack([wf @ xpad[q] for q in range(k)], axis=2)
    hits = np.cumsum(w, axis=1)[:, n - 1]
    excess = np.maximum(hits - n[None, :], 0)
    rev = u[:, ::-1]
    need = np.flatnonzero(excess.any(axis=0))
    if need.size:
        want = 1.5 * excess.max() * big_l / n[need].min()
        t = int(min(big_l, max(16, 2 ** int(np.ceil(np.log2(want))))))
    while need.size:
        block = need[: max(1, max_elements // (c * t))]
        tail = rev[:, :t, None]
        is_hit = tail < n[block][None, None, :]
        from_end = np.cumsum(is_hit, axis=1, dtype=np.int32)
        if t < big_l and not np.all(from_end[:, -1, :] >= excess[:, block]):
            t = min(big_l, 2 * t)
            continue
        drop = is_hit & (from_end <= excess[:, block][:, None, :])
        pos = tail + (block * big_l)[None, None, :]
        for q in range(k):
            sums[:, block, q] -= np.sum(np.where(drop, xt[q].take(pos), 0.0), axis=1)
        need = need[block.size:]
    deficit = np.maximum(n[None, :] - hits, 0)
    short = np.flatnonzero(deficit.any(axis=0))
    if short.size:
        top = int(deficit.max())
        extra = rng.integers(0, n[short][None, :, None], (c, short.size, top))
        keep = np.arange(top)[None, None, :] < deficit[:, short][:, :, None]
        extra += (short * big_l)[None, :, None]
        for q in range(k):
            sums[:, short, q] += np.sum(np.where(keep, xt[q].take(extra), 0.0), axis=2)
    return sums


def _dense_means(groups, *, replicates, seed, chunk=None, max_elements=4_000_000):
    xs = [np.atleast_2d(np.asarray(g, dtype=float)) for g in groups]
    k = xs[0].shape[0]
    sizes = np.array([x.shape[1] for x in xs], dtype=np.int64)
    if chunk is None:
        chunk = max(16, 2**19 // int(sizes.max(initial=1)))
    out = np.empty((k, len(xs), replicates))
    rng = np.random.default_rng(seed)
    bands = _dense_bands(sizes)
    pads = []
    for band in bands:
        xpad = np.zeros((k, int(sizes[band].max()), band.size))
        for j, m in enumerate(band):
            xpad[:, : sizes[m], j] = xs[m]
        pads.append((xpad, np.ascontiguousarray(xpad.transpose(0, 2, 1)).reshape(k, -1)))
    for start in range(0, replicates, chunk):
        c = min(chunk, replicates - start)
        for band, (xpad, xt) in zip(bands, pads):
            sums = _dense_band_sums(xpad, xt, sizes[band], rng, c, max_elements)
            out[:, band, start:start + c] = (sums / sizes[band][None, :, None]).transpose(2, 1, 0)
    return out


def _panel(seed, sizes, k=2):
    rng = np.random.default_rng(seed)
    return [rng.beta(2, 3, (k, n)) for n in sizes]


PANELS = {
    # 100 models of ~7,000 prompts, as the 100 x 10,000 benchmark panel (30 % missing)
    "large": (np.random.default_rng(0).binomial(10_000, 0.7, 100), 300, None),
    "bands": ([5, 6, 7, 9, 9, 4, 3, 2, 1, 1, 17, 33, 64, 65], 2_000, 64),
    "one per band": ([100, 40, 15, 6, 2], 1_500, 100),
    "equal n": ([50] * 12, 1_000, None),
    "single model": ([300], 700, None),
    "mixed": (list(np.random.default_rng(3).integers(1, 400, 60)), 1_200, 128),
}


@pytest.mark.parametrize("name", sorted(PANELS))
def test_bit_for_bit_the_dense_form(name):
    sizes, reps, chunk = PANELS[name]
    groups = _panel(len(name), sizes)
    got = shared_bootstrap_means(groups, replicates=reps, seed=11, chunk=chunk)
    want = _dense_means(groups, replicates=reps, seed=11, chunk=chunk)
    assert got.shape == want.shape == (2, len(sizes), reps)
    np.testing.assert_array_equal(got, want)


def test_bit_for_bit_with_one_model_blocks():
    # a memory bound of one model per block sends every block through the one-model path
    groups = _panel(5, [40, 39, 38, 30, 25, 21])
    from analysis.stats import shared_stream

    got = shared_stream.shared_bootstrap_means(groups, replicates=500, seed=2, chunk=50,
                                               max_elements=1)
    want = _dense_means(groups, replicates=500, seed=2, chunk=50, max_elements=1)
    np.testing.assert_array_equal(got, want)


def test_one_metric_and_1d_groups():
    rng = np.random.default_rng(9)
    groups = [rng.random(n) for n in (70, 61, 44, 36)]
    np.testing.assert_array_equal(
        shared_bootstrap_means(groups, replicates=800, seed=4),
        _dense_means(groups, replicates=800, seed=4))
