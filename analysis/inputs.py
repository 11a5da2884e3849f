"""What ``irbench analyze`` reads: the run store and imported cell measurements of a data
directory, filtered by date window, campaign, model and measurement wave (:class:`AnalysisOptions`;
runs only: imported cells have no wave).

Unreadable Parquet files fail with their names (:class:`CorruptDataError`), or with
``options.skip_corrupt`` are skipped and listed; an empty selection is :class:`NoRunsError`.
"""

from __future__ import annotations

from pathlib import Path

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from analysis.options import AnalysisOptions
from storage.errors import StorageError


class CorruptDataError(StorageError, ValueError):
    """Some Parquet files of the data directory cannot be read; the message names them."""


class NoRunsError(StorageError, ValueError):
    """The store (after filters) holds no run records to analyse.

    Also a ValueError: the input (directory/filters) is wrong, and callers that catch bad
    input as ValueError (the CLI) report it as a one-line error instead of a traceback.
    """


# The run and cell columns the analysis reads; the rest (answer and reasoning text, attempts,
# token counts …) stays on disk — the text columns are most of a run store's bytes.
RUN_COLUMNS = (
    "schema_version", "run_id", "campaign", "panel", "prompt_sha256", "prompt_name",
    "prompt_source", "model", "budget_max_tokens", "run_index", "max_tokens", "temperature",
    "total_timeout_s", "instruction_sha256", "measured_at", "measurement_date",
    "date_is_window", "outcome", "latency_ms", "finish_reason", "retired_on", "answer_chars",
    "reasoning_chars", "parse_outcome", "ir_json", "node_ids", "node_count", "irbench_version",
    "wave",
)
CELL_COLUMNS = (
    "schema_version", "panel", "campaign", "model", "prompt_name", "prompt_sha256",
    "successful_runs", "mean_nodes", "std_nodes", "mean_jaccard", "id_stability",
    "mean_confidence", "budget_rank", "time_order", "source", "measurement_date",
    "date_is_window", "window_end",
)
# read as dictionary columns (int32 codes): as strings, 700k imported cells take 76 MB
CELL_DICTIONARY_COLUMNS = ("panel", "campaign", "model", "prompt_name", "prompt_sha256", "source")


def read_checked(dataset, options: AnalysisOptions, filters: dict,
                 columns: tuple[str, ...] | None = None, sort_by_key: bool = True,
                 dictionary_columns: tuple[str, ...] = ()) -> tuple[pa.Table, list[str]]:
    """Read a dataset (``columns`` only, if given; those the dataset has); unreadable files
    fail with their names, or are skipped (and listed) with ``options.skip_corrupt``."""
    window = {"date_from": options.date_from, "date_to": options.date_to}
    if columns is not None:
        columns = tuple(c for c in columns if c in dataset.spec.schema.names)
    dictionary_columns = tuple(c for c in dictionary_columns if c in (columns or ()))
    try:
        return dataset.read(filters=filters, columns=columns, sort_by_key=sort_by_key,
                            dictionary_columns=dictionary_columns, **window), []
    except StorageError as exc:
        files = dataset.data_files(options.date_from, options.date_to)
        bad = []
        for f in files:
            try:
                pq.read_table(f)
            except (OSError, pa.ArrowException):
                bad.append(f)
        if not bad:
            raise
        names = ", ".join(str(b) for b in bad)
        if not options.skip_corrupt:
            raise CorruptDataError(
                f"{len(bad)} unreadable Parquet file(s) under {dataset.path}: {names}; move them "
                "out of the data directory, or pass --skip-corrupt to analyse without them"
            ) from exc
        table = dataset.read_files([f for f in files if f not in bad])
        expr = dataset.filter_expression(filters=filters, **window)
        table = table.filter(expr) if expr is not None else table
        table = table.select(list(columns)) if columns is not None else table
        return _encode(table, dictionary_columns), [str(b) for b in bad]


def _encode(table: pa.Table, names: tuple[str, ...]) -> pa.Table:
    """``names`` as dictionary columns (what the deduplicating read gives)."""
    for name in names:
        if name in table.column_names and not pa.types.is_dictionary(table.schema.field(name).type):
            i = table.column_names.index(name)
            table = table.set_column(i, name, pc.dictionary_encode(table.column(i)))
    return table


def filters_of(options: AnalysisOptions) -> dict[str, list[str]]:
    out = {}
    if options.campaigns is not None:
        out["campaign"] = list(options.campaigns)
    if options.models is not None:
        out["model"] = list(options.models)
    return out


def read_inputs(data_dir: Path, options: AnalysisOptions) -> tuple[pa.Table, pa.Table, list[str]]:
    """(runs, imported cell measurements, skipped files); NoRunsError when both are empty."""
    from storage.cells import CellStore
    from storage.runs import RunStore

    if not data_dir.is_dir():
        raise NoRunsError(
            f"data directory {data_dir} does not exist; run a campaign first "
            "(`irbench run <campaign.toml>`) or pass the directory that holds its runs"
        )
    selected = options.waves.resolve(data_dir, options.campaigns)  # WaveError: a wave the store lacks
    run_filters: dict[str, list] = dict(filters_of(options))
    if selected is not None:
        run_filters["wave"] = selected.numbers()
    runs, bad_r = read_checked(RunStore(data_dir, fsync=False).dataset, options, run_filters,
                              RUN_COLUMNS, sort_by_key=False)
    runs = selected.keep(runs) if selected is not None else runs
    cells, bad_c = read_checked(CellStore(data_dir, fsync=False).dataset, options,
                                filters_of(options), CELL_COLUMNS,
                                dictionary_columns=CELL_DICTIONARY_COLUMNS)
    cells = cells.unify_dictionaries()  # one dictionary per column across the files' chunks
    if runs.num_rows == 0 and cells.num_rows == 0:
        filters = {
            k: v
            for k, v in options.model_dump(
                include={"date_from", "date_to", "campaigns", "models"}
            ).items()
            if v is not None
        }
        where = f" matching {filters}" if filters else ""
        raise NoRunsError(
            f"no run records in {data_dir}{where}; run a campaign first "
            "(`irbench run <campaign.toml>`), import one (`irbench import-artifact`), "
            "or widen the date/campaign/model filters"
        )
    return runs, cells, bad_r + bad_c


def read_run_files(data_dir: Path, files: list[Path], options: AnalysisOptions
                   ) -> tuple[pa.Table, list[str]]:
    """Runs of exactly ``files`` (one partition or file group), deduplicated by run_id and
    filtered like :func:`run_analysis` reads them; unreadable files fail (naming them) or,
    with ``options.skip_corrupt``, are skipped and returned."""
    from storage.runs import RunStore

    dataset = RunStore(Path(data_dir), fsync=False).dataset
    bad: list[Path] = []
    try:
        table = dataset.read_files(files)
    except StorageError:
        for f in files:
            try:
                pq.read_table(f)
            except (OSError, pa.ArrowException):
                bad.append(f)
        if not bad:
            raise
        if not options.skip_corrupt:
            raise CorruptDataError(
                f"{len(bad)} unreadable Parquet file(s) under {dataset.path}: "
                f"{', '.join(str(b) for b in bad)}; move them out of the data directory, or pass "
                "--skip-corrupt to analyse without them") from None
        table = dataset.read_files([f for f in files if f not in bad])
    expr = dataset.filter_expression(options.date_from, options.date_to, filters_of(options))
    if expr is not None:
        table = table.filter(expr)
    selected = options.waves.resolve(Path(data_dir), options.campaigns)
    return (selected.keep(table) if selected is not None else table), [str(b) for b in bad]
