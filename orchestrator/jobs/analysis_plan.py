"""The parts of a distributed analysis (``irbench analyze --executor celery``): which run files
each map task reads, and which cells have runs in more than one part.

A map task computes everything per cell for the cells whose runs all sit in its part; a cell
whose runs are spread over parts ("split") has its runs sent to the reduce, which computes it
there. So the plan keeps cells whole where it can without giving up locality: within one date
partition (what a machine holds when the store is spread by date), files that share a cell are
put in the same part (connected components over shared cell keys), and the components are
packed, in file-name order, into groups of about ``ceil(files / min_parts)`` files (at most
``max_files_per_part``). A component larger than that (a campaign whose concurrent runs spread
every cell over many files) becomes ``k`` parts that each read all its files and keep the cells
of one hash shard (``part_summaries.shard_of``): cells stay whole, the files are read k times. Only the key columns of each file are
read; an unreadable file is planned alone (its map task reports it).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq

from analysis.options import AnalysisOptions
from analysis.tables.part_summaries import KEY_COLUMNS, shard_of, split_keys
from storage.runs import RunStore

__all__ = ["AnalysisPlan", "file_keys", "plan_analysis"]

_KEY_SCHEMA = pa.schema([("panel", pa.string()), ("campaign", pa.string()), ("model", pa.string()),
                         ("prompt_sha256", pa.string()), ("budget_max_tokens", pa.int64())])


@dataclass(frozen=True)
class AnalysisPlan:
    """``parts``: file lists of the map tasks; ``shards``: per part, ``(j, k)`` when it keeps
    only the cells of shard ``j`` of ``k`` of its files (``part_summaries.shard_of``), else
    None; ``split``: keys of cells spanning parts."""

    parts: list[list[str]]
    shards: list[tuple[int, int] | None]
    split: pa.Table


def file_keys(path: str) -> pa.Table | None:
    """The cell-key columns of one run file (budget null when the file predates it); None when
    the file cannot be read."""
    try:
        names = pq.read_schema(path).names
        t = pq.read_table(path, columns=[c for c in KEY_COLUMNS if c in names])
    except (OSError, pa.ArrowException):
        return None
    if "budget_max_tokens" not in t.column_names:
        t = t.append_column("budget_max_tokens", pa.nulls(t.num_rows, pa.int64()))
    return t.select(list(KEY_COLUMNS)).cast(_KEY_SCHEMA)


def _components(keys: list[pa.Table | None]) -> list[list[int]]:
    """Groups of file indices connected by a shared cell key, each sorted, in first-file order."""
    parent = list(range(len(keys)))

    def find(i: int) -> int:
        while parent[i] != i:
            parent[i] = parent[parent[i]]
            i = parent[i]
        return i

    first: dict[tuple, int] = {}
    for i, t in enumerate(keys):
        if t is None:
            continue
        cols = [t.column(c).to_pylist() for c in KEY_COLUMNS]
        for key in set(zip(*cols)):
            j = first.setdefault(key, i)
            a, b = find(i), find(j)
            if a != b:
                parent[max(a, b)] = min(a, b)
    groups: dict[int, list[int]] = {}
    for i in range(len(keys)):
        groups.setdefault(find(i), []).append(i)
    return [groups[r] for r in sorted(groups)]


def plan_analysis(data_dir: Path, options: AnalysisOptions, max_files_per_part: int = 64,
                  min_parts: int = 8) -> AnalysisPlan:
    """The plan (module docstring) over the date partitions in the options' window."""
    if max_files_per_part < 1 or min_parts < 1:
        raise ValueError(f"max_files_per_part and min_parts must be >= 1, got {max_files_per_part}, {min_parts}")
    dataset = RunStore(Path(data_dir), fsync=False).dataset
    by_day = [[str(f) for f in dataset.partition_files(day)]
              for day in dataset.partitions(options.date_from, options.date_to)]
    by_day = [files for files in by_day if files]
    total = sum(map(len, by_day))
    size = max(1, min(max_files_per_part, math.ceil(total / min_parts))) if total else 1
    parts: list[list[str]] = []
    shards: list[tuple[int, int] | None] = []
    part_keys: list[pa.Table] = []

    def add(files: list[str], keys: pa.Table, shard: tuple[int, int] | None) -> None:
        parts.append(files)
        shards.append(shard)
        part_keys.append(keys)

    for files in by_day:
        keys = [file_keys(f) for f in files]
        current: list[int] = []
        for comp in _components(keys):
            if len(comp) > size:  # one large component: its cells split by hash, files read by each
                k = math.ceil(len(comp) / size)
                ck = _concat([keys[i] for i in comp])
                shard = shard_of(ck, k)
                for j in range(k):
                    add([files[i] for i in comp], ck.filter(pa.array(shard == j)), (j, k))
                continue
            if current and len(current) + len(comp) > size:
                add([files[i] for i in sorted(current)], _concat([keys[i] for i in current]), None)
                current = []
            current += comp
        if current:
            add([files[i] for i in sorted(current)], _concat([keys[i] for i in current]), None)
    return AnalysisPlan(parts, shards, split_keys(part_keys))


def _concat(tables: list[pa.Table | None]) -> pa.Table:
    got = [t for t in tables if t is not None]
    return pa.concat_tables(got) if got else _KEY_SCHEMA.empty_table()
