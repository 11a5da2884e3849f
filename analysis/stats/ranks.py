"""Joint prompt-cluster bootstrap of the leaderboard: rank retention, rank intervals, partition.

Input everywhere: ``scores[model, prompt]`` — a 2-D float array of cell scores (unitless, e.g.
mean Jaccard in [0, 1]) with NaN for unmeasured cells (an incomplete, unbalanced panel).
Higher is better. Prompt columns with no measured cell are not part of the panel and are dropped.

Conventions (state them in the report):
* Point estimate θ̂_m = mean of model m over its measured prompts. The point-estimate order is a
  permutation of model indices, best first; by default a stable sort of −θ̂ (exact ties keep the
  model index order). Position = 1-based index in that order.
* Each replicate draws ONE multiset of P prompts with replacement from the panel's P distinct
  prompts and scores every model on it (mean over the drawn prompts it has, with multiplicity).
  A replicate is *usable* only if every model has ≥ 1 drawn prompt; unusable replicates are
  discarded, so all replicate statistics condition on n*_m > 0.
* Replicate positions: stable sort by replicate mean, descending, ties broken by the
  point-estimate order (means are rounded to 12 decimals first so that float summation order
  cannot break a tie). "Rank held" = share of usable replicates in which the model sits at
  exactly its point position.
* Marginal rank interval: the α/2 quantile (``method="lower"``) and 1−α/2 quantile
  (``method="higher"``) of the model's replicate positions (no coverage guarantee; it fails at
  exact ties — see rank-statistics.md §1.4).
* Simultaneous rank confidence set (default, ``RankBootstrap.simultaneous``): pairwise tests with
  Holm's step-down (Neuhof–Benjamini / Foucart et al., rank-statistics.md §1.2 and §8.2). Every
  ordered pair (j, k) gets a one-sided paired t-test of "θ_j > θ_k" on the prompts both models
  have (its own common prompts, so the unbalanced panel needs no imputation); Holm over all
  M(M−1) directed p-values at α = 1 − level; L/U as below. Pairs with < 2 common prompts get
  p = 1; a constant non-zero difference gets p = 0 for its direction. Holm controls the
  family-wise error under any dependence, so the set is valid in finite samples whenever the
  paired t-tests are (normal-ish differences); it is the one the partition should use.
* Alternative simultaneous set (``RankBootstrap.simultaneous_maxt``): the nonparametric max-|t|
  variant of Mogstad–Romano–Shaikh–Wilhelm (rank-statistics.md §1.1) with Romano–Wolf step-down.
  It is anti-conservative at our prompt counts: in the §1.4 simulation (M = 6, P = 15, exact
  ties) it covered all true ranks in only ~0.73 of panels (the bootstrap is too narrow by
  sqrt((n−1)/n) and has normal instead of t tails), so it is reported as a sensitivity column.
  Procedure: For every unordered pair (j, k)
  with bootstrap SD σ_jk > 0 of θ*_j − θ*_k, the statistic is max |(δ*_j − δ*_k)/σ_jk| with
  δ* = θ* − θ̂ over usable replicates; ĉ is its level-quantile; "θ_j > θ_k is established" when
  θ̂_j − θ̂_k > ĉ·σ_jk. Pairs with σ_jk = 0 (the difference never varies) are established when
  |θ̂_j − θ̂_k| > 1e-12 and are excluded from the max. Rejected pairs are removed and ĉ is
  recomputed until nothing new is rejected. Then L_j = 1 + #{k established above j},
  U_j = M − #{k established below j}; P(true rank_j ∈ [L_j, U_j] for all j) ≥ level
  asymptotically, where the true rank uses "min" ties: rank_j = 1 + #{k : θ_k > θ_j}.

No Python loop runs over replicates: counts come from one ``bincount`` per chunk of replicates,
replicate means from one matrix product ``W @ [S0 | O]``, positions from ``argsort`` along axis 1.
Memory per chunk: chunk × P draws/counts (int64, then float64) plus chunk × M means; the max-t
set works on (replicates × model pairs) in blocks of ≤ 65,536 values, never the whole array.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from analysis.errors import AnalysisError
from analysis.stats.paired import holm as _holm, paired_moments as _paired_moments

__all__ = [
    "RankSet",
    "RankBootstrap",
    "point_estimates",
    "min_ranks",
    "joint_cluster_bootstrap",
    "simultaneous_rank_set",
    "pairwise_rank_set",
    "partition",
    "LABELS",
    "panel_matrix",
    "draw_means",
    "positions",
]

LABELS = ("clearly reproducible", "clearly not", "undetermined")


@dataclass(frozen=True, eq=False)
class RankSet:
    """Rank intervals [low_m, high_m] (1-based, inclusive) per model, in model-index order.

    kind: "marginal_percentile" or "simultaneous_maxt"; level: nominal coverage (0.95).
    """

    low: np.ndarray
    high: np.ndarray
    level: float
    kind: str


@dataclass(frozen=True, eq=False)
class RankBootstrap:
    """Result of :func:`joint_cluster_bootstrap`; arrays are in model-index order.

    n_models (M), n_prompts (P, distinct prompts in the panel), replicates (drawn), usable
    (replicates where every model had ≥ 1 drawn prompt), seed, chunk (replicates per draw call;
    the draws depend on seed and chunk). point_score (M,) θ̂; point_order (M,) model indices best
    first; point_position (M,) 1-based; held_share (M,) share of usable replicates at exactly the
    point position (NaN if usable = 0); rank_counts (M, M): rank_counts[m, r−1] = usable
    replicates with model m at position r; marginal / simultaneous: :class:`RankSet`;
    critical_value: the final step-down max-|t| quantile ĉ; established (M, M) bool:
    established[j, k] ⇔ "θ_j > θ_k" established by the simultaneous procedure;
    stepdown_steps: number of ĉ recomputations.
    """

    n_models: int
    n_prompts: int
    replicates: int
    usable: int
    seed: int
    chunk: int
    point_score: np.ndarray
    point_order: np.ndarray
    point_position: np.ndarray
    held_share: np.ndarray
    rank_counts: np.ndarray
    marginal: RankSet
    simultaneous: RankSet
    critical_value: float
    established: np.ndarray
    stepdown_steps: int
    simultaneous_maxt: RankSet


def _panel(scores: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    s = np.asarray(scores, dtype=float)
    if s.ndim != 2:
        raise AnalysisError(f"scores must be 2-D [model, prompt]; got shape {s.shape}")
    observed = np.isfinite(s)
    keep = observed.any(axis=0)  # prompts outside the union are not part of the panel
    s, observed = s[:, keep], observed[:, keep]
    empty = np.flatnonzero(~observed.any(axis=1))
    if empty.size:
        raise AnalysisError(f"models {empty.tolist()} have no measured prompt: drop them first")
    return s, observed


def point_estimates(scores: np.ndarray) -> np.ndarray:
    """Per-model mean over measured prompts: (M, P) with NaN → (M,) floats."""
    s, observed = _panel(scores)
    return np.where(observed, s, 0.0).sum(axis=1) / observed.sum(axis=1)


def min_ranks(theta: np.ndarray) -> np.ndarray:
    """Competition ("min") ranks, higher is better: rank_j = 1 + #{k : θ_k > θ_j}. (M,) → (M,)."""
    t = np.asarray(theta, dtype=float)
    return 1 + (t[None, :] > t[:, None]).sum(axis=1)


def _positions(theta: np.ndarray, order: np.ndarray) -> np.ndarray:
    """1-based positions (B, M) of each model after a stable descending sort, ties by ``order``."""
    b, m = theta.shape
    # round so that means equal up to floating-point summation order count as ties
    in_order = np.round(theta[:, order], 12)
    sort_idx = np.argsort(-in_order, axis=1, kind="stable")
    pos_in_order = np.empty((b, m), dtype=np.int64)
    np.put_along_axis(pos_in_order, sort_idx, np.broadcast_to(np.arange(1, m + 1), (b, m)), 1)
    pos = np.empty_like(pos_in_order)
    pos[:, order] = pos_in_order
    return pos


def _draw_means(s0: np.ndarray, observed: np.ndarray, *, replicates: int, seed: int,
                chunk: int) -> tuple[np.ndarray, int]:
    """Replicate means θ* (usable replicates only, (U, M)) and the number drawn."""
    m, p = s0.shape
    rng = np.random.default_rng(seed)
    stacked = np.concatenate([s0, observed.astype(float)], axis=0).T  # (P, 2M)
    kept = []
    done = 0
    while done < replicates:
        c = min(chunk, replicates - done)
        idx = rng.integers(0, p, (c, p))
        idx += (np.arange(c) * p)[:, None]  # in place: flat positions in a (c, P) counts matrix
        w = np.bincount(idx.ravel(), minlength=c * p)
        del idx
        nd = w.reshape(c, p).astype(float) @ stacked  # (c, 2M): numerators then denominators
        del w
        num, den = nd[:, :m], nd[:, m:]
        usable = np.all(den > 0, axis=1)
        kept.append(num[usable] / den[usable])
        done += c
    return np.concatenate(kept, axis=0), replicates


def _max_abs_t(delta: np.ndarray, j: np.ndarray, k: np.ndarray, sigma: np.ndarray,
               max_elements: int = 65_536) -> np.ndarray:
    """Per replicate max over pairs of |δ_j − δ_k| / σ_jk.

    Chunked over replicates so that a chunk holds ≤ ``max_elements`` (replicate, pair) values
    (512 KB of float64 per temporary: small blocks are reused by the allocator instead of being
    page-faulted in afresh, which made one 10⁴ × 28 pass 4× slower), whatever the number of
    models; the per-row maxima do not depend on the chunking."""
    out = np.empty(delta.shape[0])
    if j.size == 0:
        return np.full(delta.shape[0], -np.inf)
    rows = max(1, max_elements // j.size)
    for start in range(0, delta.shape[0], rows):  # memory chunks, vectorised inside
        d = delta[start:start + rows]
        buf = d[:, j]
        np.subtract(buf, d[:, k], out=buf)
        np.abs(buf, out=buf)
        np.divide(buf, sigma, out=buf)
        out[start:start + rows] = np.max(buf, axis=1)
    return out


def _pair_sd(theta_star: np.ndarray, j: np.ndarray, k: np.ndarray,
             max_elements: int = 65_536) -> np.ndarray:
    """Bootstrap SD (ddof=1) of θ*_j − θ*_k per pair, in blocks of pairs (bounded memory;
    each column's SD is computed exactly as on the whole (replicates, pairs) array)."""
    out = np.empty(j.size)
    step = max(1, max_elements // max(1, theta_star.shape[0]))
    for a in range(0, j.size, step):  # blocks of pairs, vectorised inside
        jj, kk = j[a:a + step], k[a:a + step]
        out[a:a + step] = np.std(theta_star[:, jj] - theta_star[:, kk], axis=0, ddof=1)
    return out


def simultaneous_rank_set(theta_hat: np.ndarray, theta_star: np.ndarray, *,
                          level: float = 0.95, stepdown: bool = True
                          ) -> tuple[RankSet, np.ndarray, float, int]:
    """Simultaneous rank confidence set from bootstrap replicates (max-|t|, step-down).

    theta_hat: (M,) point estimates; theta_star: (U, M) bootstrap replicates of the estimates.
    Returns (RankSet, established (M, M) bool, final critical value ĉ, number of ĉ computations).
    See the module docstring for the procedure.
    """
    th = np.asarray(theta_hat, dtype=float)
    ts = np.asarray(theta_star, dtype=float)
    m = th.size
    established = np.zeros((m, m), dtype=bool)
    if m < 2 or ts.shape[0] < 2:
        return (RankSet(np.ones(m, int), np.full(m, m), level, "simultaneous_maxt"),
                established, float("nan"), 0)
    j, k = np.triu_indices(m, 1)
    diff_hat = th[j] - th[k]
    sigma = _pair_sd(ts, j, k)
    certain = sigma <= 1e-12
    sure = certain & (np.abs(diff_hat) > 1e-12)
    established[j[sure & (diff_hat > 0)], k[sure & (diff_hat > 0)]] = True
    established[k[sure & (diff_hat < 0)], j[sure & (diff_hat < 0)]] = True
    active = ~certain
    delta = ts - th[None, :]
    crit, steps = float("nan"), 0
    while active.any():
        tmax = _max_abs_t(delta, j[active], k[active], sigma[active])
        crit = float(np.quantile(tmax, level))
        steps += 1
        rejected = np.zeros_like(active)
        rejected[active] = np.abs(diff_hat[active]) > crit * sigma[active]
        if not rejected.any():
            break
        up = rejected & (diff_hat > 0)
        down = rejected & (diff_hat < 0)
        established[j[up], k[up]] = True
        established[k[down], j[down]] = True
        active &= ~rejected
        if not stepdown:
            break
    low = 1 + established.sum(axis=0)   # models established above j
    high = m - established.sum(axis=1)  # models established below j
    return RankSet(low, high, level, "simultaneous_maxt"), established, crit, steps


def pairwise_rank_set(scores: np.ndarray, *, level: float = 0.95
                      ) -> tuple[RankSet, np.ndarray, np.ndarray]:
    """Simultaneous rank set from one-sided paired t-tests on common prompts + Holm.

    scores: (M, P) with NaN for unmeasured cells. Returns (RankSet with kind
    "simultaneous_pairwise_holm", established (M, M) bool, p (M, M) one-sided p-values of
    "θ_j > θ_k", NaN on the diagonal). Vectorised over pairs (no loop over pairs or prompts).
    """
    # scipy.stats.t.sf(x, df) is scipy.special.stdtr(df, -x); scipy.stats itself costs ~45 MiB RSS
    from scipy.special import stdtr

    s, observed = _panel(scores)
    m = s.shape[0]
    j, k = np.nonzero(~np.eye(m, dtype=bool))
    n_u, mean_u, var_u = _paired_moments(s, observed)
    # (k, j) is (j, k) with every difference negated: IEEE subtraction, sums and quotients
    # are exactly antisymmetric, so the lower pairs are the upper ones' negated means
    upper = np.zeros((m, m), dtype=np.int64)
    upper[np.triu_indices(m, 1)] = np.arange(n_u.size)
    upper = upper + upper.T
    pick = upper[j, k]
    n, var = n_u[pick], var_u[pick]
    mean = np.where(j < k, mean_u[pick], -mean_u[pick])
    with np.errstate(invalid="ignore", divide="ignore"):
        tstat = mean / np.sqrt(var / n)
        p = stdtr(n - 1, -tstat)
    constant = (n >= 2) & (var <= 1e-24)
    p = np.where(constant, np.where(mean > 1e-12, 0.0, 1.0), p)
    p = np.where(n < 2, 1.0, p)
    established = np.zeros((m, m), dtype=bool)
    if p.size:
        rej = _holm(p, 1.0 - level)
        established[j[rej], k[rej]] = True
    pmat = np.full((m, m), np.nan)
    pmat[j, k] = p
    low = 1 + established.sum(axis=0)
    high = m - established.sum(axis=1)
    return RankSet(low, high, level, "simultaneous_pairwise_holm"), established, pmat


def joint_cluster_bootstrap(scores: np.ndarray, *, replicates: int = 10_000, seed: int,
                            level: float = 0.95, point_order: np.ndarray | None = None,
                            chunk: int = 1000, stepdown: bool = True) -> RankBootstrap:
    """Joint prompt-cluster bootstrap of an incomplete panel (see module docstring).

    scores: (M, P) floats, NaN = unmeasured; every model needs ≥ 1 measured prompt.
    point_order: optional permutation of range(M), best first (e.g. the published table's order);
    default: stable sort of −θ̂. level: coverage of both rank intervals.
    """
    s, observed = _panel(scores)
    m, p = s.shape
    theta_hat = np.where(observed, s, 0.0).sum(axis=1) / observed.sum(axis=1)
    if point_order is None:
        order = np.argsort(-theta_hat, kind="stable")
    else:
        order = np.asarray(point_order, dtype=np.int64)
        if sorted(order.tolist()) != list(range(m)):
            raise AnalysisError(f"point_order must be a permutation of range({m}); got {order}")
    point_position = np.empty(m, dtype=np.int64)
    point_position[order] = np.arange(1, m + 1)
    # at most ~2M counts per draw call (16 MB per temporary; 1000 × 10,000 prompts would be 240 MB
    # of draws, counts and their float copy); successive integers() calls continue one stream,
    # so the chunk size does not change the draws
    chunk = max(1, min(chunk, max(64, 2_000_000 // max(1, p))))
    theta_star, _ = _draw_means(np.where(observed, s, 0.0), observed, replicates=replicates,
                                seed=seed, chunk=chunk)
    usable = theta_star.shape[0]
    alpha = 1.0 - level
    if usable:
        pos = _positions(theta_star, order)
        held = np.mean(pos == point_position[None, :], axis=0)
        flat = (pos - 1 + (np.arange(m) * m)[None, :]).ravel()
        counts = np.bincount(flat, minlength=m * m).reshape(m, m)
        low = np.quantile(pos, alpha / 2, axis=0, method="lower").astype(np.int64)
        high = np.quantile(pos, 1 - alpha / 2, axis=0, method="higher").astype(np.int64)
    else:
        held = np.full(m, np.nan)
        counts = np.zeros((m, m), dtype=np.int64)
        low, high = np.ones(m, np.int64), np.full(m, m, np.int64)
    maxt, _, crit, steps = simultaneous_rank_set(
        theta_hat, theta_star, level=level, stepdown=stepdown)
    simul, established, _ = pairwise_rank_set(s, level=level)
    return RankBootstrap(
        n_models=m, n_prompts=p, replicates=replicates, usable=usable, seed=seed, chunk=chunk,
        point_score=theta_hat, point_order=order, point_position=point_position,
        held_share=held, rank_counts=counts,
        marginal=RankSet(low, high, level, "marginal_percentile"),
        simultaneous=simul, critical_value=crit, established=established,
        stepdown_steps=steps, simultaneous_maxt=maxt)


def partition(rank_sets: RankSet, n_models: int, *, top_size: int | None = None) -> np.ndarray:
    """Label models from rank intervals: "clearly reproducible" / "clearly not" / "undetermined".

    Rule (one split τ = ``top_size``, default ⌊n_models/2⌋, i.e. the top half; a middle model of
    an odd-sized board belongs to the bottom group so the positive label stays conservative):
    * "clearly reproducible" ⇔ high ≤ τ (the whole interval lies within ranks 1..τ);
    * "clearly not"          ⇔ low > τ (the whole interval lies within ranks τ+1..M);
    * "undetermined"         otherwise (the interval straddles the split).
    With the simultaneous set all labels hold jointly with probability ≥ its level; with the
    marginal set each holds only on its own (and without a guarantee at ties).
    Returns an (M,) array of label strings in model-index order.
    """
    low = np.asarray(rank_sets.low)
    high = np.asarray(rank_sets.high)
    if low.shape != (n_models,) or high.shape != (n_models,):
        raise AnalysisError(f"rank_sets must hold {n_models} intervals; got {low.shape}")
    tau = n_models // 2 if top_size is None else int(top_size)
    if not 0 <= tau <= n_models:
        raise AnalysisError(f"top_size must be in 0..{n_models}; got {tau}")
    labels = np.full(n_models, LABELS[2], dtype=object)
    labels[high <= tau] = LABELS[0]
    labels[low > tau] = LABELS[1]
    return labels


# The bootstrap's kernels under public names, for timing them on their own
# (bench/analysis_scale.py compares them like for like with a plain-Python loop).
panel_matrix = _panel
draw_means = _draw_means
positions = _positions
