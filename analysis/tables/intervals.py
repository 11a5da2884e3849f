"""Per-model intervals, ranks and the partition of one panel (the "intervals" stage of
``irbench analyze``; column meanings in :mod:`analysis.tables.audit`).

Input: the included model table, the panel's merged cells (one row per model × prompt) and
:class:`AnalysisOptions`. Output: the model table with ``jaccard_ci_*``, ``id_ci_*``,
``ci_method``, ``jaccard_ci_coverage`` (the interval's simulated coverage,
:func:`coverage_self_check`), ``rank_held``, ``rank_ci_*``, ``rank_set_*`` and ``partition``, and the
:class:`RankBootstrap`. With ``options.interval_threads`` = 2 the per-model CI bootstrap and
the joint rank bootstrap run side by side (each has its own seeded stream: same results).
"""

from __future__ import annotations

from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from analysis.memory import release_freed_memory
from analysis.options import AnalysisOptions
from analysis.stats.coverage import fit_cells, simulated_coverage
from analysis.stats.mean_intervals import panel_intervals
from analysis.stats.ranks import RankBootstrap, joint_cluster_bootstrap, partition
from analysis.stats.small_sample import Resampling
from analysis.tables.models import ModelTable

__all__ = ["score_matrix", "with_intervals"]


def _plain_values(col: pa.ChunkedArray) -> pa.ChunkedArray | pa.Array:
    """The distinct-value candidates of ``col``: its dictionary's values that occur (dictionary
    columns, as merged cells are) without decoding 700k strings, else the column itself."""
    if not pa.types.is_dictionary(col.type):
        return col
    used = [c.dictionary.take(pc.unique(c.indices).drop_null()) for c in col.chunks]
    return pa.chunked_array(used, col.type.value_type)


def _index_in(col: pa.ChunkedArray, values: pa.Array) -> pa.ChunkedArray:
    """``pc.index_in(col, values)``; on a dictionary column, looked up once per dictionary
    entry and gathered by the indices (same result; no decoded copy of the strings)."""
    if not pa.types.is_dictionary(col.type):
        return pc.index_in(col, value_set=values)
    return pa.chunked_array(
        [pc.index_in(c.dictionary, value_set=values).take(c.indices) for c in col.chunks],
        pa.int32())


def score_matrix(merged: pa.Table, models: Sequence[str], column: str = "mean_jaccard"
                 ) -> tuple[np.ndarray, list[str]]:
    """(M, P) matrix of ``column`` for ``models`` (rows in that order) over the prompts any of
    them measured (sorted by sha256); NaN where a model lacks the prompt."""
    sel = merged.select(["model", "prompt_sha256", column])
    mi = _index_in(sel.column("model"), pa.array(list(models), pa.string()))
    keep = pc.is_valid(mi)
    sel, mi = sel.filter(keep), mi.filter(keep)
    prompts = sorted(pc.unique(_plain_values(sel.column("prompt_sha256"))).to_pylist())
    pj = _index_in(sel.column("prompt_sha256"), pa.array(prompts, pa.string()))
    s = np.full((len(models), len(prompts)), np.nan)
    # vectorised scatter (a to_pylist loop would be the memory peak at 100 models x 10,000 prompts)
    s[mi.to_numpy(zero_copy_only=False), pj.to_numpy(zero_copy_only=False)] = (
        sel.column(column).cast(pa.float64()).to_numpy(zero_copy_only=False)
    )
    return s, prompts


def _model_cis(jac: np.ndarray, ids: np.ndarray, reps: int, options: AnalysisOptions
               ) -> tuple[tuple, ...]:
    """Per-model intervals (``options.interval``) of mean Jaccard and id-stability (rows of
    the (M, P) matrices, NaN = unmeasured), resampled together when both have the same cells."""
    jac_groups = [row[np.isfinite(row)] for row in jac]
    id_groups = [row[np.isfinite(row)] for row in ids]
    spec = Resampling(replicates=reps, seed=options.seed, level=options.level)
    if [len(g) for g in jac_groups] == [len(g) for g in id_groups]:  # one resampling for both
        return panel_intervals([jac_groups, id_groups], options.interval, spec)
    return tuple(panel_intervals([g], options.interval, spec)[0]
                 for g in (jac_groups, id_groups))


def coverage_self_check(jac: np.ndarray, options: AnalysisOptions) -> list[float | None]:
    """Each model's simulated coverage of its Jaccard interval: ``coverage_check_datasets``
    samples of its n cells from a zero-one-inflated Beta fitted to them
    (:func:`analysis.stats.coverage.fit_cells`), the interval by ``options.interval`` with 500
    replicates (100 inner), share covering the fitted mean. None for models above
    ``coverage_check_max_prompts`` prompts or with the check off."""
    out: list[float | None] = []
    spec = Resampling(replicates=500, seed=options.seed, level=options.level,
                      inner_replicates=100)
    for row in jac:  # loop over models (few); each check is vectorised over its datasets
        x = row[np.isfinite(row)]
        if options.coverage_check_datasets == 0 or x.size > options.coverage_check_max_prompts:
            out.append(None)
            continue
        fit = fit_cells(x)
        out.append(simulated_coverage(fit.draw, fit.mean, x.size, options.interval, spec,
                                      options.coverage_check_datasets))
    return out


def with_intervals(table: ModelTable, merged: pa.Table, options: AnalysisOptions
                   ) -> tuple[ModelTable, RankBootstrap | None]:
    """Add the interval, rank and partition columns (module docstring) to the included table."""
    models = table.models
    m = len(models)
    if m == 0:
        empty = {c: pa.array([], pa.float64()) for c in
                 ("jaccard_ci_low", "jaccard_ci_high", "id_ci_low", "id_ci_high",
                  "jaccard_ci_coverage", "rank_held")}
        empty["ci_method"] = pa.array([], pa.string())
        ints = {c: pa.array([], pa.int64()) for c in
                ("rank_ci_low", "rank_ci_high", "rank_set_low", "rank_set_high")}
        return table.with_columns(**empty, **ints, partition=pa.array([], pa.string())), None
    cols: dict[str, Any] = {}
    jac, _ = score_matrix(merged, models, "mean_jaccard")
    ids, _ = score_matrix(merged, models, "id_stability")
    reps = max(2, options.replicates)
    release_freed_memory()  # the matrices' arrow temporaries, before the bootstrap's peak

    def joint() -> RankBootstrap:
        rb = joint_cluster_bootstrap(jac, replicates=options.replicates, seed=options.seed,
                                     level=options.level, point_order=np.arange(m))
        release_freed_memory()  # this thread's heap (glibc gives each thread its own arena)
        return rb

    if options.interval_threads > 1:
        # numpy and BLAS release the GIL in the kernels: the two bootstraps share 2 cores
        with ThreadPoolExecutor(max_workers=1) as pool:
            pending = pool.submit(joint)
            all_cis = _model_cis(jac, ids, reps, options)
            rb = pending.result()
    else:
        all_cis = _model_cis(jac, ids, reps, options)
        release_freed_memory()  # the CI bootstrap's temporaries, before the joint bootstrap's
        rb = joint()
    for name, cis in zip(("jaccard", "id"), all_cis):
        cols[f"{name}_ci_low"] = [c.low for c in cis]
        cols[f"{name}_ci_high"] = [c.high for c in cis]
    cols["jaccard_ci_coverage"] = pa.array(coverage_self_check(jac, options), pa.float64())
    # the method; a "_shared" suffix = the large-panel scheme (same bootstrap, other draws)
    cols["ci_method"] = pa.array([c.method for c in all_cis[0]], pa.string())
    cols["rank_held"] = pa.array(rb.held_share, pa.float64(), from_pandas=True)
    cols["rank_ci_low"] = rb.marginal.low.astype(np.int64)
    cols["rank_ci_high"] = rb.marginal.high.astype(np.int64)
    cols["rank_set_low"] = np.asarray(rb.simultaneous.low, dtype=np.int64)
    cols["rank_set_high"] = np.asarray(rb.simultaneous.high, dtype=np.int64)
    # one model has nothing to be ranked against: documented degenerate label
    labels = list(partition(rb.simultaneous, m)) if m > 1 else ["undetermined"]
    cols["partition"] = pa.array(labels, pa.string())
    return table.with_columns(**cols), rb
