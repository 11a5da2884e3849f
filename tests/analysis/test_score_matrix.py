"""score_matrix on dictionary-encoded merged cells (as the pipeline holds them) equals the
plain-string result, also when dictionaries carry values absent from the column and when the
chunks have different dictionaries; the t-distribution calls equal scipy.stats.t's."""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pytest

from analysis.tables.intervals import score_matrix


def _cells(rng: np.random.Generator) -> pa.Table:
    models = [f"m{i}" for i in range(6)]
    prompts = [f"{i:064x}" for i in range(40)]
    rows = [(m, p) for m in models for p in prompts if rng.random() > 0.3]
    return pa.table({"model": [r[0] for r in rows], "prompt_sha256": [r[1] for r in rows],
                     "mean_jaccard": rng.random(len(rows))})


def _dictionary(t: pa.Table, extra: list[str]) -> pa.Table:
    """Two chunks with their own dictionaries, each with unused entries ``extra``."""
    half = t.num_rows // 2
    chunks: dict[str, list] = {"model": [], "prompt_sha256": []}
    for part in (t.slice(0, half), t.slice(half)):
        for name in chunks:
            values = part.column(name).combine_chunks()
            dictionary = pa.array(extra + sorted(set(values.to_pylist()), reverse=True))
            codes = pa.compute.index_in(values, value_set=dictionary).cast(pa.int32())
            chunks[name].append(pa.DictionaryArray.from_arrays(codes, dictionary))
    return pa.table({"model": pa.chunked_array(chunks["model"]),
                     "prompt_sha256": pa.chunked_array(chunks["prompt_sha256"]),
                     "mean_jaccard": t.column("mean_jaccard")})


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_score_matrix_dictionary_equals_plain(seed: int) -> None:
    plain = _cells(np.random.default_rng(seed))
    encoded = _dictionary(plain, extra=["zz-not-here", "m99"])
    models = ["m3", "m0", "m5", "m99"]  # a subset, in a given order, one never measured
    s_plain, p_plain = score_matrix(plain, models)
    s_dict, p_dict = score_matrix(encoded, models)
    assert p_dict == p_plain and "zz-not-here" not in p_dict
    np.testing.assert_array_equal(s_dict, s_plain)
    assert np.isnan(s_plain[3]).all() and np.isfinite(s_plain[:3]).sum() > 0


def test_t_functions_equal_scipy_stats() -> None:
    from scipy.special import stdtr, stdtrit
    from scipy.stats import t

    rng = np.random.default_rng(0)
    x = np.concatenate([rng.normal(size=500) * 4, [np.nan, np.inf, -np.inf, 0.0]])
    df = np.concatenate([rng.integers(1, 5000, 500).astype(float), [3.0, 3.0, 3.0, 7.0]])
    np.testing.assert_array_equal(stdtr(df, -x), t.sf(x, df))
    for n in (2, 3, 10, 250, 9999):
        assert stdtrit(n - 1, 0.975) == t.ppf(0.975, n - 1)
