"""Model families and the paired comparisons table (``pairs.parquet``).

Default family of a model name: the part before the first ``:`` (the size tag), then trailing
``-`` segments that look like a version or size (``3``, ``m2.1``, ``4.7``, ``8b``) removed,
lower-cased: ``gpt-oss:20b`` and ``gpt-oss:120b`` → ``gpt-oss``; ``minimax-m2.1`` and
``minimax-m2.7`` → ``minimax``; ``mistral-large-3:675b`` → ``mistral-large``. A TOML file
``[families]`` ``"model name" = "family"`` overrides it per model.

Pairs: for every two models of one family (scope "family") or every two models (scope "all"),
:func:`analysis.stats.pairs.paired_comparison` on their common prompts' merged mean Jaccard, with
model_a < model_b by name and ``mean_diff`` = b − a.
"""

from __future__ import annotations

import re
import json
import tomllib
from collections.abc import Mapping, Sequence
from itertools import combinations
from pathlib import Path

import numpy as np
import pyarrow as pa

from analysis.errors import AnalysisError
from analysis.stats.pairs import paired_comparison

_VERSIONISH = re.compile(r"^[a-z]?\d+(\.\d+)*[bmk]?$")

PAIRS_SCHEMA = pa.schema([
    pa.field("family", pa.string()),
    pa.field("model_a", pa.string(), nullable=False),
    pa.field("model_b", pa.string(), nullable=False),
    pa.field("n_common", pa.int64(), nullable=False),
    pa.field("n_nonzero", pa.int64(), nullable=False),
    pa.field("mean_diff", pa.float64()),
    pa.field("p_zsplit", pa.float64()),
    pa.field("p_drop", pa.float64()),
    pa.field("rank_biserial", pa.float64()),
    pa.field("p_floor", pa.float64()),
    pa.field("mdd", pa.float64()),
])


def default_family(model: str) -> str:
    """Family of a model name by the default rule (module docstring)."""
    base = model.split(":", 1)[0].lower()
    parts = base.split("-")
    while len(parts) > 1 and _VERSIONISH.match(parts[-1]):
        parts.pop()
    return "-".join(parts)


FAMILIES_FILE = "families.toml"  # in a data directory: families recorded by an import


def families_toml(families: Mapping[str, str]) -> str:
    """``families`` as the ``[families]`` TOML that :func:`load_families` reads."""
    lines = ["# model = family; recorded by irbench (import-artifact); edit or pass --families",
             "[families]"]
    lines += [f"{json.dumps(m)} = {json.dumps(f)}" for m, f in sorted(families.items())]
    return "\n".join(lines) + "\n"


def families_for(data_dir: Path, path: Path | None) -> tuple[dict[str, str], str]:
    """The family overrides ``analyze`` uses and where they came from: ``path`` (--families)
    if given, else ``data_dir/families.toml`` when an import recorded one, else none."""
    if path is not None:
        return load_families(path), str(path)
    recorded = Path(data_dir) / FAMILIES_FILE
    if recorded.is_file():
        return load_families(recorded), str(recorded)
    return {}, "default rule"


def load_families(path: Path | None) -> dict[str, str]:
    """``{model: family}`` from a TOML ``[families]`` table; {} when ``path`` is None."""
    if path is None:
        return {}
    try:
        raw = tomllib.loads(Path(path).read_text(encoding="utf-8"))
    except (OSError, tomllib.TOMLDecodeError) as exc:
        raise AnalysisError(f"cannot read families file {path}: {exc}; expected a TOML table "
                         '[families] with lines like "gpt-oss:20b" = "gpt-oss"') from exc
    fam = raw.get("families")
    if not isinstance(fam, dict):
        raise AnalysisError(f"families file {path} has no [families] table")
    return {str(k): str(v) for k, v in fam.items()}


def family_map(models: Sequence[str], overrides: Mapping[str, str]) -> dict[str, str]:
    """Family of every model: the override if given, else :func:`default_family`."""
    return {m: overrides.get(m, default_family(m)) for m in models}


def pairs_table(scores: np.ndarray, models: Sequence[str], families: Mapping[str, str],
                scope: str = "family", *, alpha: float = 0.05) -> pa.Table:
    """scores: (M, P) merged mean Jaccard, NaN = not measured; one row per compared pair."""
    if scope not in ("family", "all"):
        raise AnalysisError(f"pair scope must be 'family' or 'all', got {scope!r}")
    order = sorted(range(len(models)), key=lambda i: models[i])
    rows = []
    for i, j in combinations(order, 2):
        fa, fb = families[models[i]], families[models[j]]
        if scope == "family" and fa != fb:
            continue
        r = paired_comparison(scores[i], scores[j], alpha=alpha)
        rows.append({"family": fa if fa == fb else None, "model_a": models[i],
                     "model_b": models[j], "n_common": r.n_common, "n_nonzero": r.n_nonzero,
                     "mean_diff": r.mean_diff, "p_zsplit": r.p_zsplit, "p_drop": r.p_drop,
                     "rank_biserial": r.rank_biserial, "p_floor": r.p_floor, "mdd": r.mdd})
    return pa.Table.from_pylist(rows, schema=PAIRS_SCHEMA)
