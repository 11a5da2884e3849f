"""The ``irbench analyze`` outputs the viewer shows: every panel's model table (with intervals,
rank sets and partition), excluded models, cells and manifest, read once at startup.

Input: an analysis directory (one subdirectory per panel, or one panel directory). Output:
:class:`AnalysisOutputs` with the three tables concatenated over panels, each with a ``panel``
column. Missing or unreadable files become ``problems`` (shown on the pages), never a crash.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq

#: Columns the queries rely on; a panel's file may carry more (kept) or fewer (null-filled).
MODELS_BASE = pa.schema([("panel", pa.string()), ("rank", pa.int64()), ("model", pa.string()),
                         ("n_prompts", pa.int64()), ("mean_jaccard", pa.float64()),
                         ("id_stability", pa.float64()), ("perfect", pa.int64()),
                         ("partition", pa.string()), ("jaccard_ci_low", pa.float64()),
                         ("jaccard_ci_high", pa.float64()), ("jaccard_ci_coverage", pa.float64()),
                         ("rank_held", pa.float64()), ("rank_ci_low", pa.int64()),
                         ("rank_ci_high", pa.int64()), ("rank_set_low", pa.int64()),
                         ("rank_set_high", pa.int64())])
EXCLUDED_BASE = pa.schema([("panel", pa.string()), ("model", pa.string()),
                           ("n_prompts", pa.int64()), ("reason", pa.string())])
CELLS_BASE = pa.schema([("panel", pa.string()), ("campaign", pa.string()), ("model", pa.string()),
                        ("prompt_sha256", pa.string()), ("included", pa.bool_()),
                        ("mean_jaccard", pa.float64()), ("id_stability", pa.float64()),
                        ("node_set_perfect", pa.bool_()), ("mean_nodes", pa.float64())])


@dataclass(frozen=True)
class AnalysisOutputs:
    """models / excluded / cells over all panels; manifests: panel → manifest dict;
    problems: one-line notices (file → what is wrong); directory: where they were read."""

    models: pa.Table
    excluded: pa.Table
    cells: pa.Table
    manifests: dict = field(default_factory=dict)
    problems: tuple[str, ...] = ()
    directory: Path | None = None

    @classmethod
    def empty(cls) -> AnalysisOutputs:
        return cls(MODELS_BASE.empty_table(), EXCLUDED_BASE.empty_table(),
                   CELLS_BASE.empty_table())

    @classmethod
    def load(cls, directory: Path | None) -> AnalysisOutputs:
        """Read every panel under ``directory`` (None → empty outputs)."""
        if directory is None:
            return cls.empty()
        directory = Path(directory)
        if not directory.is_dir():
            return cls(**_tables([], [], []), problems=(f"{directory}: not a directory",))
        panel_dirs = ([directory] if (directory / "models.parquet").is_file()
                      else sorted(d for d in directory.iterdir()
                                  if d.is_dir() and (d / "models.parquet").is_file()))
        parts: dict[str, list[pa.Table]] = {"models": [], "excluded": [], "cells": []}
        manifests: dict[str, dict] = {}
        problems: list[str] = []
        for pdir in panel_dirs:
            manifest: dict = {}
            try:
                manifest = json.loads((pdir / "manifest.json").read_text(encoding="utf-8"))
            except FileNotFoundError:
                pass
            except (OSError, ValueError) as exc:
                problems.append(f"{pdir / 'manifest.json'}: {exc}")
            panel = str(manifest.get("panel") or pdir.name)
            manifests[panel] = manifest
            for name in parts:
                path = pdir / f"{name}.parquet"
                if not path.is_file():
                    continue
                try:
                    table = pq.read_table(path)
                except (OSError, pa.ArrowException) as exc:
                    problems.append(f"{path}: {type(exc).__name__}: {exc}")
                    continue
                if "panel" in table.column_names:
                    table = table.drop_columns(["panel"])
                parts[name].append(table.add_column(0, "panel",
                                                    pa.array([panel] * table.num_rows)))
        return cls(**_tables(*parts.values()), manifests=manifests, problems=tuple(problems),
                   directory=directory)


def _with_base(tables: list[pa.Table], base: pa.Schema) -> pa.Table:
    """Concatenate (columns unioned) and make sure every ``base`` column exists."""
    table = (pa.concat_tables(tables, promote_options="permissive") if tables
             else base.empty_table())
    for fld in base:
        if fld.name not in table.column_names:
            table = table.append_column(fld.name, pa.nulls(table.num_rows, fld.type))
    return table


def _tables(models, excluded, cells) -> dict[str, pa.Table]:
    return {"models": _with_base(list(models), MODELS_BASE),
            "excluded": _with_base(list(excluded), EXCLUDED_BASE),
            "cells": _with_base(list(cells), CELLS_BASE)}
