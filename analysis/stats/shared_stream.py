"""The shared-stream bootstrap of many models at once (large panels; see
:mod:`analysis.stats.bootstrap`, which picks it and turns its replicate means into intervals).

Input: one array of values per model (1-D (n_m,) or 2-D (K, n_m): K metrics of the same cells,
resampled together). Output: replicate means (K, models, replicates), in the units of the
values. The scheme and its draws are described in :func:`shared_bootstrap_means`; the sums are
formed so that every figure is bit-for-bit what the dense form of the scheme gave
(tests/analysis/test_shared_stream.py keeps that form as the reference).
"""

from __future__ import annotations

import numpy as np

from analysis.errors import AnalysisError
from analysis.stats.draws import integers_below

__all__ = ["shared_bootstrap_means"]


def _bands(sizes: np.ndarray) -> list[np.ndarray]:
    """Model indices grouped so that within a band every n_m lies in (L/2, L], L = band max."""
    order = np.argsort(-sizes, kind="stable")
    bands, start = [], 0
    while start < order.size:
        top = sizes[order[start]]
        stop = start + int(np.sum(sizes[order[start:]] * 2 > top))
        bands.append(order[start:stop])
        start = stop
    return bands


def _band_sums(xpad: np.ndarray, xt: np.ndarray, n: np.ndarray, rng: np.random.Generator,
               c: int, max_elements: int = 4_000_000) -> np.ndarray:
    """Replicate sums (c, Mb, K) of one band for one chunk of c replicates (shared scheme).

    xpad: (K, L, Mb) values, model m's n_m values in rows 0..n_m−1 and zeros below;
    xt: the same values as (K, Mb·L) (model-major rows, for fast 1-D gathers).
    """
    k, big_l, mb = xpad.shape
    u = rng.integers(0, big_l, (c, big_l))  # one stream of L draws per replicate
    w = np.bincount((u + (np.arange(c) * big_l)[:, None]).ravel(),
                    minlength=c * big_l).reshape(c, big_l)
    wf = w.astype(float)
    # one product per metric, so stacking metrics never changes a result's rounding
    sums = np.stack([wf @ xpad[q] for q in range(k)], axis=2)  # (c, Mb, K): all hits
    hits = np.cumsum(w, axis=1)[:, n - 1]  # (c, Mb): N = draws landing in 0..n_m−1
    excess = np.maximum(hits - n[None, :], 0)
    rev = u[:, ::-1]  # the stream read from its end
    need = np.flatnonzero(excess.any(axis=0))
    if need.size:  # first window: ~1.5 × the positions the largest surplus needs at hit rate n/L
        want = 1.5 * excess.max() * big_l / n[need].min()
        t = int(min(big_l, max(16, 2 ** int(np.ceil(np.log2(want))))))
    while need.size:  # blocks of models (bounded memory), vectorised over replicates
        # keep the first n_m hits: subtract the last N − n_m hits of the stream; the window
        # from the end grows until it holds them (bands keep n_m/L ≥ 1/2, so it stays short)
        block = need[: max(1, max_elements // (c * t))]
        tail = rev[:, :t, None]
        is_hit = tail < n[block][None, None, :]  # (c, t, block)
        # hits counted from the end; bytes when the window is short (4x less to add than int32)
        from_end = np.cumsum(is_hit, axis=1, dtype=np.uint8 if t < 256 else np.int32)
        if t < big_l and not np.all(from_end[:, -1, :] >= excess[:, block]):
            t = min(big_l, 2 * t)
            continue
        # the window holds every surplus, so each is ≤ t and fits the counter's type
        drop = is_hit & (from_end <= excess[:, block].astype(from_end.dtype)[:, None, :])
        _subtract_drops(sums, drop, tail, block, big_l, xt)
        need = need[block.size:]
    deficit = np.maximum(n[None, :] - hits, 0)
    short = np.flatnonzero(deficit.any(axis=0))
    if short.size:  # too few hits: top up with fresh uniform draws from the model's own values
        top = int(deficit.max())
        extra = integers_below(rng, n[short][None, :, None], (c, short.size, top))
        extra += (short * big_l)[None, :, None]
        _add_top_ups(sums, extra, deficit[:, short], short, xt)
    return sums


def _subtract_drops(sums: np.ndarray, drop: np.ndarray, tail: np.ndarray, block: np.ndarray,
                    big_l: int, xt: np.ndarray) -> None:
    """``sums[:, block, q] -= Σ_t [drop] xt[q][tail + block·L]`` for every metric q, in place.

    drop: (c, t, block) bool, the surplus hits; tail: (c, t, 1) stream positions. Only the
    dropped values are gathered (~1 in 10 of the window), and each (replicate, model) total
    is summed in stream order, as the reduction over t of the zero-filled (c, t, block) array
    did (a strided, sequential sum when block > 1; adding 0.0 changes no bit), so the sums are
    bit-for-bit those of the dense form. With one model the dense reduction runs along a
    contiguous axis (numpy's pairwise summation), so that case keeps the dense form.
    """
    if block.size == 1:
        pos = tail + (block * big_l)[None, None, :]
        for q in range(xt.shape[0]):
            sums[:, block, q] -= np.sum(np.where(drop, xt[q].take(pos), 0.0), axis=1)
        return
    c, _, nb = drop.shape
    ci, ti, bi = np.nonzero(drop)  # C order: per (replicate, model), its drops in stream order
    pos = tail[ci, ti, 0] + block[bi] * big_l
    group = ci * nb + bi
    for q in range(xt.shape[0]):
        total = np.bincount(group, weights=xt[q].take(pos), minlength=c * nb)
        sums[:, block, q] -= total.reshape(c, nb)


def _add_top_ups(sums: np.ndarray, extra: np.ndarray, deficit: np.ndarray, short: np.ndarray,
                 xt: np.ndarray) -> None:
    """``sums[:, short, q] += Σ_j [j < deficit] xt[q][extra[..., j]]`` for every metric q.

    extra: (c, S, top) positions in xt's rows; deficit: (c, S) draws used of each row. Only the
    used positions are gathered; the zero-filled rows that hold any are summed exactly as the
    dense (c, S, top) array would be (numpy's pairwise sum along the contiguous last axis, whose
    grouping depends on the row length, so the rows keep their zeros); rows without a top-up
    add 0.0, i.e. nothing.
    """
    c, n_short, top = extra.shape
    rows = np.flatnonzero(deficit.ravel() > 0)  # (replicate, model) pairs with a top-up
    keep = np.arange(top)[None, :] < deficit.ravel()[rows][:, None]  # (R, top)
    pos = extra.reshape(-1, top)[rows][keep]
    for q in range(xt.shape[0]):
        vals = np.zeros((rows.size, top))
        vals[keep] = xt[q].take(pos)
        add = np.zeros(c * n_short)
        add[rows] = vals.sum(axis=1)
        sums[:, short, q] += add.reshape(c, n_short)


def shared_bootstrap_means(groups, *, replicates: int, seed: int, chunk: int | None = None,
                           max_elements: int = 4_000_000) -> np.ndarray:
    """Replicate means of every group under the shared-stream scheme; (K, models, replicates).

    groups: a sequence of arrays, one per model, each 1-D (n_m,) or 2-D (K, n_m) (K metrics of
    the same cells, resampled together). Every model's replicate is an i.i.d. uniform draw of
    exactly n_m of its own n_m values (the ordinary nonparametric bootstrap); only the mapping
    from random numbers to draws differs from scipy's, so models are resampled jointly:
    models are grouped into bands with n_m in (L/2, L] (L = the band's largest n_m); per chunk
    of ``chunk`` replicates and per band (largest band first) one stream of L draws
    ``default_rng(seed).integers(0, L, (chunk, L))`` is drawn; model m uses the first n_m draws
    of the stream that fall in 0..n_m−1 (its "hits", i.i.d. uniform over its values, their
    number independent of their values) and, if the stream has fewer than n_m hits, tops up
    with ``integers(0, n_m, …)`` draws. Sums come from a counts matrix product, the surplus
    hits are subtracted from the stream's end, so the work is O(chunk·L·models) matrix products
    instead of O(replicates·Σ n_m) gathers. ``chunk`` (replicates per draw) defaults to
    max(16, 2¹⁹ // max n_m), i.e. about 4 MB of draws per chunk. The draws depend on ``seed``,
    ``chunk`` and the group sizes. ``max_elements`` bounds the (replicate, window position,
    model) cells looked at at once when the surplus hits are found (memory only; the results
    do not depend on it).
    """
    xs = [np.atleast_2d(np.asarray(g, dtype=float)) for g in groups]
    k = xs[0].shape[0] if xs else 1
    if any(x.shape[0] != k for x in xs):
        raise AnalysisError("every group must hold the same number of metrics (rows)")
    sizes = np.array([x.shape[1] for x in xs], dtype=np.int64)
    if chunk is None:
        chunk = max(16, 2**19 // int(sizes.max(initial=1)))
    out = np.empty((k, len(xs), replicates))
    rng = np.random.default_rng(seed)
    bands = _bands(sizes)
    pads = []
    for band in bands:
        xpad = np.zeros((k, int(sizes[band].max()), band.size))
        for j, m in enumerate(band):  # loop over models (few) to build the padded matrix
            xpad[:, : sizes[m], j] = xs[m]
        pads.append((xpad, np.ascontiguousarray(xpad.transpose(0, 2, 1)).reshape(k, -1)))
    for start in range(0, replicates, chunk):  # memory chunks, vectorised inside
        c = min(chunk, replicates - start)
        for band, (xpad, xt) in zip(bands, pads):
            sums = _band_sums(xpad, xt, sizes[band], rng, c, max_elements)  # (c, Mb, K)
            out[:, band, start:start + c] = (sums / sizes[band][None, :, None]).transpose(2, 1, 0)
    return out
