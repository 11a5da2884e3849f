"""One model, two waves: a permutation test of "same answer distribution" and the Jaccard effect.

Per prompt p, with the node-set Jaccard kernel k(S, T) = |S∩T| / |S∪T| (two empty sets score 1,
as the project's Jaccard does) over the runs of wave A (n_a ≥ 2) and wave B (n_b ≥ 2):

* W_A,p, W_B,p — mean k over the pairs i<j of one wave's runs: the cell's node-set Jaccard J;
* C_p          — mean k over the cross-wave pairs;
* MMD²_p = W_A,p + W_B,p − 2·C_p, the unbiased squared maximum mean discrepancy (Gretton et al.;
  the kernel two-sample test of Gao, Liang & Guestrin's "Model Equality Testing"): within-wave
  minus cross-wave similarity, large when the waves answer differently (other ids, renames);
* D_p = W_B,p − W_A,p, the change of the cell's Jaccard, large when a wave is less (or more)
  stable. The MMD barely sees that: a noisier wave B resembles wave A about as much as the
  average of the two waves resembles itself (bench/wave_detection.py measures both);
* S_p = V_B,p − V_A,p, the same change with the shared-node kernel s(S, T) = |S ∩ T| (V: the
  mean number of node ids a pair of one wave's runs shares). A revision that drops nodes lowers
  the union with the intersection, so the Jaccard moves less than the shared count does.

The model's statistics are the means over prompts; the test statistic is the largest of the
three (|D| and |S|: either direction), each standardised over the permutation pool
(:func:`combined_statistic`), so one test answers "answers differ", "stability differs" and
"fewer (or more) nodes agree" at one alpha.

p-value: the wave labels are permuted *within each prompt* (each prompt keeps its n_a and n_b);
under "same distribution" a prompt's runs are exchangeable, so the test is exact in finite
samples. Permuting across prompts would not be: prompts differ far more than waves do. The
observed labelling counts as one permutation: p = (1 + #{T_b ≥ T}) / (1 + B).

Effect: mean over prompts of D_p, with a percentile bootstrap interval over prompts
(:func:`analysis.stats.bootstrap.percentile_ci`); each wave's Jaccard likewise (paired draws).

Vectorised: each prompt's two kernel matrices are built once from integer intersection/union
counts (:func:`analysis.metrics.agreement.pair_counts`); prompts of equal (n_a, n_b) are stacked,
and all permutations of a stack are one label array (prompts, B+1, N) and one batched matrix
product per kernel.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from analysis.errors import AnalysisError
from analysis.metrics.agreement import pair_counts
from analysis.stats.bootstrap import Interval, percentile_ci

__all__ = ["WaveRuns", "WaveTest", "DrawSettings", "Labelings", "jaccard_kernel", "shared_kernel",
           "prompt_kernels", "kernel_means", "labelings", "combined_statistic", "pool_p_value",
           "wave_test"]

# Label arrays of one stack are cut to at most this many entries (8 bytes each): 32 MB.
_MAX_LABEL_ENTRIES = 4_000_000
# Sums of the same kernel entries in a different order differ by rounding only.
_TIE_TOLERANCE = 1e-12

NodeSets = tuple[frozenset[str], ...]


@dataclass(frozen=True)
class WaveRuns:
    """One model's successful runs in two waves: ``a[p]`` / ``b[p]`` are the node-id sets of
    prompt p's runs in wave A / wave B (``prompts[p]`` names the prompt). A prompt enters the
    test when it has at least 2 runs in each wave."""

    prompts: tuple[str, ...]
    a: tuple[NodeSets, ...]
    b: tuple[NodeSets, ...]

    def __post_init__(self) -> None:
        if not len(self.prompts) == len(self.a) == len(self.b):
            raise AnalysisError(
                f"WaveRuns needs one entry per prompt in prompts, a and b; got "
                f"{len(self.prompts)}, {len(self.a)}, {len(self.b)}")

    @classmethod
    def of(cls, prompts: Sequence[str], a: Sequence[Sequence[frozenset[str]]],
           b: Sequence[Sequence[frozenset[str]]]) -> WaveRuns:
        """From lists (each run's ids become a frozenset)."""
        return cls(tuple(prompts), tuple(tuple(frozenset(s) for s in r) for r in a),
                   tuple(tuple(frozenset(s) for s in r) for r in b))

    def usable(self) -> list[int]:
        """Indices of prompts with at least 2 runs in each wave."""
        return [p for p in range(len(self.prompts)) if len(self.a[p]) >= 2 and len(self.b[p]) >= 2]


@dataclass(frozen=True)
class DrawSettings:
    """How one test draws: ``permutations`` (B), ``bootstrap_replicates``, interval ``level``,
    and the ``seed`` of both (an int; permutations and bootstrap use separate streams)."""

    permutations: int
    bootstrap_replicates: int
    level: float
    seed: int


@dataclass(frozen=True)
class WaveTest:
    """Result of :func:`wave_test` for one model (None fields: no usable prompt).

    ``p_value``: the combined permutation test; ``p_mmd`` / ``p_jaccard`` / ``p_shared``: the
    same permutations tested on MMD² alone, on |J_B − J_A| alone and on the change of the mean
    shared-node count alone (diagnostics, not multiplicity-corrected).
    ``mmd``: mean over prompts of MMD² (unitless); ``effect``: mean Jaccard of wave B minus wave A
    over the usable prompts, with ``effect_interval``; ``jaccard_a``/``jaccard_b``: each wave's
    mean Jaccard with its interval (same prompts, paired resampling); ``prompts``: usable prompts
    (≥ 2 successful runs in each wave); ``prompts_skipped``: the others.
    """

    p_value: float | None
    p_mmd: float | None
    p_jaccard: float | None
    p_shared: float | None
    mmd: float | None
    permutations: int
    effect: float | None
    effect_interval: Interval | None
    jaccard_a: Interval | None
    jaccard_b: Interval | None
    prompts: int
    prompts_skipped: int


def jaccard_kernel(sets: Sequence[frozenset[str]]) -> np.ndarray:
    """The (N, N) node-set Jaccard matrix of N ≥ 2 runs (diagonal 1), from integer counts."""
    scores = pair_counts(sets).scores()
    n = len(sets)
    k = np.ones((n, n))
    iu = np.triu_indices(n, k=1)
    k[iu] = scores
    k[iu[1], iu[0]] = scores
    return k


def shared_kernel(sets: Sequence[frozenset[str]]) -> np.ndarray:
    """The (N, N) matrix of shared node-id counts |S_i ∩ S_j| of N ≥ 2 runs (diagonal |S_i|)."""
    counts = pair_counts(sets)
    n = len(sets)
    k = np.diag(np.array([len(s) for s in sets], np.float64))
    iu = np.triu_indices(n, k=1)
    k[iu] = counts.intersection
    k[iu[1], iu[0]] = counts.intersection
    return k


def kernel_means(kernel: np.ndarray, labels: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Within-A, within-B and cross-wave mean kernel of label rows, over one or many prompts.

    kernel: (..., N, N); labels: (..., L, N) of 0/1 (1 = wave A), every row with the same n_a ≥ 2
    and n_b ≥ 2. Returns three (..., L) arrays; within-wave means exclude the diagonal (the
    U-statistics: mean over pairs i<j, as the project's Jaccard is)."""
    u = labels.astype(np.float64)
    v = 1.0 - u
    n_a = u[..., :1, :].sum(axis=-1)  # (..., 1)
    n_b = labels.shape[-1] - n_a
    ku = u @ kernel  # kernel is symmetric: rows of u·K
    diag = np.diagonal(kernel, axis1=-2, axis2=-1)[..., None, :]
    d_a, d_b = (u * diag).sum(axis=-1), (v * diag).sum(axis=-1)
    s_aa = (ku * u).sum(axis=-1) - d_a
    s_ab = (ku * v).sum(axis=-1)
    s_bb = kernel.sum(axis=(-2, -1))[..., None] - 2.0 * s_ab - s_aa - d_a - d_b
    return s_aa / (n_a * (n_a - 1)), s_bb / (n_b * (n_b - 1)), s_ab / (n_a * n_b)


@dataclass(frozen=True, eq=False)
class Labelings:
    """Pooled kernel means of the observed labelling (index 0) and B permutations (1..B), each
    (B+1,): the mean over prompts of the Jaccard kernel's within-A (``within_a``), within-B and
    cross-wave means, and of the shared-node kernel's within-A and within-B means (node ids)."""

    within_a: np.ndarray
    within_b: np.ndarray
    cross: np.ndarray
    shared_a: np.ndarray
    shared_b: np.ndarray

    @property
    def mmd(self) -> np.ndarray:
        """Mean over prompts of the unbiased MMD² (within-wave minus cross-wave similarity)."""
        return self.within_a + self.within_b - 2.0 * self.cross

    @property
    def jaccard_change(self) -> np.ndarray:
        """Mean over prompts of J_B − J_A (the effect)."""
        return self.within_b - self.within_a

    @property
    def shared_change(self) -> np.ndarray:
        """Mean over prompts of the change (B − A) of the mean shared-node count of a pair."""
        return self.shared_b - self.shared_a


def labelings(kernels: Sequence[np.ndarray], n_a: Sequence[int], permutations: int,
              rng: np.random.Generator) -> Labelings:
    """Kernel means of the observed labelling and ``permutations`` within-prompt relabellings.

    kernels[p]: prompt p's (2, N_p, N_p) Jaccard and shared-node matrices (:func:`prompt_kernels`)
    with wave A's runs first (``n_a[p]`` of them). Each permutation relabels every prompt
    independently, the same labels for both kernels. Prompts of equal (N, n_a) are stacked; the
    loop runs over those groups (and memory blocks of them), never over permutations."""
    sums = np.zeros((5, permutations + 1))
    for n, a in sorted({(k.shape[-1], a) for k, a in zip(kernels, n_a)}):
        group = [p for p, k in enumerate(kernels) if k.shape[-1] == n and n_a[p] == a]
        base = np.zeros(n, np.int8)
        base[:a] = 1
        step = max(1, _MAX_LABEL_ENTRIES // ((permutations + 1) * n))
        for start in range(0, len(group), step):  # memory blocks of prompts
            stack = np.stack([kernels[p] for p in group[start:start + step]], axis=1)  # (2, P, N, N)
            shuffled = rng.permuted(np.broadcast_to(base, (stack.shape[1], permutations, n)), axis=-1)
            observed = np.broadcast_to(base, (stack.shape[1], 1, n))
            wa, wb, c = kernel_means(stack, np.concatenate([observed, shuffled], axis=1))
            sums += np.stack([wa[0], wb[0], c[0], wa[1], wb[1]]).sum(axis=1)
    wa, wb, c, sa, sb = sums / len(kernels)
    return Labelings(within_a=wa, within_b=wb, cross=c, shared_a=sa, shared_b=sb)


def prompt_kernels(sets: Sequence[frozenset[str]]) -> np.ndarray:
    """(2, N, N): :func:`jaccard_kernel` and :func:`shared_kernel` of one prompt's N ≥ 2 runs."""
    return np.stack([jaccard_kernel(sets), shared_kernel(sets)])


def _standardised(values: np.ndarray) -> np.ndarray:
    """(values − mean) / SD over the pool; a constant statistic carries no evidence (0)."""
    sd = values.std()
    return (values - values.mean()) / sd if sd > 0 else np.zeros_like(values)


def pool_p_value(pool: np.ndarray) -> float:
    """Permutation p-value of ``pool[0]`` (observed) against ``pool[1:]``: (1 + #≥) / (1 + B)."""
    return float(np.count_nonzero(pool >= pool[0] - _TIE_TOLERANCE)) / len(pool)


def combined_statistic(lab: Labelings) -> np.ndarray:
    """max(z of MMD², z of |J_B − J_A|, z of |shared-count change|) for every labelling, each z
    standardised over the whole pool (observed included, so the standardising is the same
    whichever labelling is observed and the test stays exact)."""
    return np.maximum.reduce([_standardised(lab.mmd), _standardised(np.abs(lab.jaccard_change)),
                              _standardised(np.abs(lab.shared_change))])


def _wave_jaccard(kernel: np.ndarray, n_a: int) -> tuple[float, float]:
    """Mean pairwise Jaccard of wave A's and wave B's runs from the prompt's kernel matrix."""
    ia = np.triu_indices(n_a, k=1)
    b = kernel[n_a:, n_a:]
    ib = np.triu_indices(b.shape[0], k=1)
    return float(np.mean(kernel[:n_a, :n_a][ia])), float(np.mean(b[ib]))


def wave_test(runs: WaveRuns, settings: DrawSettings) -> WaveTest:
    """The permutation test and the Jaccard effect of one model (see the module docstring)."""
    use = runs.usable()
    skipped = len(runs.prompts) - len(use)
    if not use:
        return WaveTest(None, None, None, None, None, settings.permutations, None, None, None,
                        None, 0, skipped)
    kernels = [prompt_kernels(runs.a[p] + runs.b[p]) for p in use]
    n_a = [len(runs.a[p]) for p in use]
    perm_seed, boot_seed = np.random.SeedSequence(settings.seed).generate_state(2)
    lab = labelings(kernels, n_a, settings.permutations, np.random.default_rng(int(perm_seed)))
    wave_j = np.array([_wave_jaccard(k[0], a) for k, a in zip(kernels, n_a)]).T  # (2, prompts)
    reps, seed, level = settings.bootstrap_replicates, int(boot_seed), settings.level
    j_a, j_b = percentile_ci(wave_j, replicates=reps, seed=seed, level=level)
    effect = percentile_ci(wave_j[1] - wave_j[0], replicates=reps, seed=seed, level=level)
    return WaveTest(p_value=pool_p_value(combined_statistic(lab)), p_mmd=pool_p_value(lab.mmd),
                    p_jaccard=pool_p_value(np.abs(lab.jaccard_change)),
                    p_shared=pool_p_value(np.abs(lab.shared_change)), mmd=float(lab.mmd[0]),
                    permutations=settings.permutations, effect=effect.point,
                    effect_interval=effect, jaccard_a=j_a, jaccard_b=j_b, prompts=len(use),
                    prompts_skipped=skipped)
