"""The run store loaded once into an in-process DuckDB database, and the queries pages need.

Why DuckDB rather than per-request pyarrow scans: a 100k-run store is tens of files whose text
columns must be searched, grouped (health percentiles) and paged; re-reading Parquet per request
costs seconds, while one load at startup (through :class:`storage.runs.RunStore`, so the
store's own one-execution-per-run_id rule applies) leaves every query a columnar scan over
data that answers in milliseconds (``bench/viewer_latency.py``). The database is a file in a
temporary directory (DuckDB compresses and pages it), so memory stays under a set limit.

The ``all_runs`` table holds the runs of every wave; ``runs``, the view the pages query, those of
the selected waves (``in_selection``). It holds every RunRecord column plus derived ones: ``row_no`` (default order:
campaign, model, prompt, budget, run index), ``n_attempts``, ``n_429`` (attempts answered 429 or
classed rate_limited), ``retry_after_total_s`` (sum of Retry-After waits announced),
``truncated`` (outcome truncated or finish_reason length), ``succeeded`` (a parseable IR),
``search_text`` (the response lower-cased once, so a search is one substring scan).
Analysis outputs, when given, are loaded beside it as ``models``, ``excluded`` and ``cells``;
the store's prompt texts (``storage.prompts``) as ``prompts`` (its own ``search_text`` lower-cases
the prompt, so a search also finds the runs of a prompt that contains the words).

All values reach SQL as bound parameters; results come back as Arrow (tz-aware timestamps).
"""

from __future__ import annotations

import datetime as dt
import tempfile
import threading
import weakref
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import duckdb
import pyarrow as pa
import pyarrow.compute as pc

from storage.outcomes import call_failed_sql, succeeded_sql
from storage.prices import SPEND_COLUMNS, read_prices, spend_by_model
from storage.prompts import PROMPT_SCHEMA, PromptStore
from storage.records import Outcome
from storage.runs import RunStore
from storage.schema import RUN_SCHEMA
from storage.wave_selection import SelectedWaves, WaveSelection
from storage.waves import WaveInfo, waves_of
from viewer.outputs import AnalysisOutputs
from viewer.query import RunQuery

#: Columns of one run in list pages and ``/api/runs`` (cheap: no text).
LIST_COLUMNS = ("run_id", "campaign", "panel", "model", "prompt_sha256", "prompt_name",
                "budget_max_tokens", "run_index", "outcome", "parse_outcome", "measured_at",
                "measurement_date", "latency_ms", "node_count", "n_attempts")

#: The column marking a run of the selected waves (chunks without it are selected whole).
SELECTED = "in_selection"

_DERIVED = f"""
    row_number() OVER (PARTITION BY {SELECTED} ORDER BY campaign, model, prompt_sha256,
                       budget_max_tokens NULLS FIRST, run_index, run_id) AS row_no,
    len(attempts) AS n_attempts,
    len(list_filter(attempts, lambda a: a.status_code = 429 OR a.outcome = 'rate_limited'))
        AS n_429,
    coalesce(list_sum(list_transform(attempts, lambda a: coalesce(a.retry_after_s, 0.0))), 0.0)
        AS retry_after_total_s,
    (outcome = '{Outcome.TRUNCATED.value}' OR coalesce(finish_reason = 'length', false)) AS truncated,
    {succeeded_sql()} AS succeeded,
    lower(response_text) AS search_text
"""


@dataclass(frozen=True)
class RunPage:
    """One page of a run listing: ``total`` matching runs, ``runs`` the rows of this page."""

    total: int
    runs: list[dict[str, Any]]


class RunIndex:
    """Read-only queries over the runs (and analysis outputs) loaded at construction.

    ``chunks``: Arrow tables of run records (any order; a run_id in several chunks keeps its
    latest execution, the store's ``EXECUTION_RULE`` that its reader applies within a chunk);
    ``threads``: DuckDB worker threads; ``memory_limit_mb``: DuckDB's memory cap — the
    database lives in a file under ``work_dir`` (a fresh temporary directory by default,
    removed by :meth:`close`), compressed and paged, so a large store does not have to fit in
    memory. Thread-safe: each thread queries through its own cursor.
    """

    def __init__(self, chunks: Iterable[pa.Table], outputs: AnalysisOutputs | None = None, *,
                 threads: int = 2, memory_limit_mb: int = 1024,
                 work_dir: Path | None = None, prompts: pa.Table | None = None,
                 spend: list[dict[str, Any]] | None = None,
                 waves_held: dict[str, list[WaveInfo]] | None = None) -> None:
        self.spend = spend or []  # per campaign and model: tokens and cost of every execution (spend_rows)
        self._tmp = tempfile.TemporaryDirectory(prefix="irbench-view-", dir=work_dir)
        self._finalizer = weakref.finalize(self, self._tmp.cleanup)
        db = Path(self._tmp.name) / "index.duckdb"
        self._con = duckdb.connect(str(db), config={
            "threads": threads, "memory_limit": f"{memory_limit_mb}MB",
            "temp_directory": str(Path(self._tmp.name) / "spill")})
        self._local = threading.local()
        first = True
        for chunk in chunks:  # one partition at a time keeps the peak memory to one chunk
            self._con.register("chunk", _marked(chunk))
            self._con.execute("CREATE TABLE staging AS SELECT * FROM chunk" if first
                              else "INSERT INTO staging SELECT * FROM chunk")
            self._con.unregister("chunk")
            first = False
        if first:
            self._con.register("chunk", _marked(RUN_SCHEMA.empty_table()))
            self._con.execute("CREATE TABLE staging AS SELECT * FROM chunk")
            self._con.unregister("chunk")
        # every wave's runs in all_runs (a cell shows its waves side by side); the pages read the
        # view ``runs``, the selected waves, whose row_no is dense 1..n on its own
        self._con.execute(
            "CREATE TABLE all_runs AS WITH d AS (SELECT * FROM staging QUALIFY row_number() OVER "
            "(PARTITION BY run_id ORDER BY coalesce(finished_at, measured_at) DESC, "
            "execution_id ASC NULLS LAST, measurement_date DESC) = 1) "
            f"SELECT *, {_DERIVED} FROM d ORDER BY {SELECTED} DESC, row_no")
        self._con.execute("DROP TABLE staging")
        self._con.execute("CREATE UNIQUE INDEX runs_id ON all_runs(run_id)")
        self._con.execute(f"CREATE VIEW runs AS SELECT * EXCLUDE ({SELECTED}) FROM all_runs "
                          f"WHERE {SELECTED}")
        self.waves = dict(waves_held) if waves_held is not None else self._waves_of_runs()
        self.outputs = outputs or AnalysisOutputs.empty()
        for name, table in (("models", self.outputs.models), ("excluded", self.outputs.excluded),
                            ("cells", self.outputs.cells)):
            self._con.register(f"arrow_{name}", table)
            self._con.execute(f"CREATE TABLE {name} AS SELECT * FROM arrow_{name}")
            self._con.unregister(f"arrow_{name}")
        self._con.register("arrow_prompts", prompts if prompts is not None
                           else PROMPT_SCHEMA.empty_table())
        self._con.execute("CREATE TABLE prompts AS SELECT prompt_sha256, prompt_name, "
                          "instruction_sha256, instruction_version, prompt_text, user_message, "
                          "lower(prompt_text) AS search_text FROM arrow_prompts")
        self._con.unregister("arrow_prompts")
        self._con.execute("CHECKPOINT")
        self.n_runs = int(self.scalar("SELECT count(*) FROM runs"))

    @classmethod
    def load(cls, data_dir: Path, outputs: AnalysisOutputs | None = None, *,
             threads: int = 2, memory_limit_mb: int = 1024,
             work_dir: Path | None = None, waves: WaveSelection | None = None) -> RunIndex:
        """Read every run of ``data_dir`` once, one measurement date at a time, through the
        store's reader (so its one-row-per-run_id rule applies within each date), the store's
        prompt texts and its waves. The pages show the runs of ``waves`` (default: each
        campaign's latest wave; a WaveError names a wave not held); the other waves' runs are
        held too, for a cell's runs by wave and the wave comparison."""
        store = RunStore(Path(data_dir), fsync=False)
        selected = (waves or WaveSelection()).resolve(Path(data_dir))
        chunks = (_marked(t, selected) for t in (store.read_table(date_from=day, date_to=day)
                                                 for day in store.dataset.partitions()))
        return cls(chunks, outputs, threads=threads, memory_limit_mb=memory_limit_mb,
                   work_dir=work_dir, prompts=PromptStore(Path(data_dir), fsync=False).read(),
                   spend=spend_rows(store, selected), waves_held=waves_of(Path(data_dir)))

    def close(self) -> None:
        """Close the database and delete its directory."""
        self._con.close()
        self._finalizer()

    # ------------------------------------------------------------------ plumbing
    def _cursor(self) -> duckdb.DuckDBPyConnection:
        cur = getattr(self._local, "cursor", None)
        if cur is None:
            cur = self._local.cursor = self._con.cursor()
        return cur

    def rows(self, sql: str, params: Sequence[Any] = ()) -> list[dict[str, Any]]:
        """Run ``sql`` with bound ``params``; rows as dicts (via Arrow)."""
        return self._cursor().sql(sql, params=list(params)).to_arrow_table().to_pylist()

    def scalar(self, sql: str, params: Sequence[Any] = ()) -> Any:
        found = self.rows(sql, params)
        return next(iter(found[0].values())) if found else None

    # ------------------------------------------------------------------ runs
    def runs(self, query: RunQuery, *, with_snippet: bool = False) -> RunPage:
        """The page ``query.offset .. offset+limit`` of matching runs, in default order."""
        where, params = query.where()
        cols = ", ".join(LIST_COLUMNS)
        if not where:  # row_no is dense 1..n: a deep page is a range, not an OFFSET scan
            rows = self.rows(f"SELECT {cols} FROM runs WHERE row_no > ? ORDER BY row_no LIMIT ?",
                             [query.offset, query.limit])
            return RunPage(self.n_runs, rows)
        snippet = ""
        snippet_params: list[Any] = []
        if with_snippet and query.q:
            # 160 characters around the first match, so a search result shows why it matched
            # (or around the match in the prompt, when the answer does not contain it)
            snippet = (", CASE WHEN instr(search_text, ?) > 0 THEN substr(response_text, "
                       "greatest(1, instr(search_text, ?) - 60), 160) ELSE (SELECT 'prompt: ' || "
                       "substr(p.prompt_text, greatest(1, instr(p.search_text, ?) - 60), 160) "
                       "FROM prompts p WHERE p.prompt_sha256 = runs.prompt_sha256 LIMIT 1) END"
                       " AS snippet")
            snippet_params = [query.q.lower()] * 3
        # one scan of the filter columns serves both the total and the page
        rows = self.rows(
            f"WITH m AS MATERIALIZED (SELECT row_no FROM runs {where}) "
            f"SELECT {cols}{snippet}, (SELECT count(*) FROM m) AS __total FROM runs "
            "WHERE row_no IN (SELECT row_no FROM m ORDER BY row_no LIMIT ? OFFSET ?) "
            "ORDER BY row_no", [*params, *snippet_params, query.limit, query.offset])
        if not rows:  # past the last page (or nothing matches): the total alone
            return RunPage(int(self.scalar(f"SELECT count(*) FROM runs {where}", params)), [])
        total = rows[0]["__total"]
        for row in rows:
            del row["__total"]
        return RunPage(int(total), rows)

    def run(self, run_id: str) -> dict[str, Any] | None:
        """Every stored column of one run of any wave (None if unknown)."""
        found = self.rows(f"SELECT * EXCLUDE (search_text, {SELECTED}) FROM all_runs "
                          "WHERE run_id = ?", [run_id])
        return found[0] if found else None

    def cell_runs(self, campaign: str, model: str, prompt_sha256: str,
                  limit: int) -> tuple[int, list[dict[str, Any]]]:
        """(number of runs, the first ``limit`` runs with every column) of one cell."""
        params = [campaign, model, prompt_sha256]
        where = "WHERE campaign = ? AND model = ? AND prompt_sha256 = ?"
        total = self.scalar(f"SELECT count(*) FROM runs {where}", params)
        rows = self.rows(f"SELECT * EXCLUDE (search_text) FROM runs {where} ORDER BY row_no LIMIT ?",
                         [*params, limit])
        return int(total), rows

    def cell_wave_runs(self, campaign: str, model: str, prompt_sha256: str,
                       limit: int) -> tuple[dict[int, int], list[dict[str, Any]]]:
        """(wave -> number of runs, the first ``limit`` runs of each wave with every column) of
        one cell across every wave held, in wave then run order."""
        params = [campaign, model, prompt_sha256]
        where = "WHERE campaign = ? AND model = ? AND prompt_sha256 = ?"
        order = "budget_max_tokens NULLS FIRST, run_index, run_id"
        counts = {int(r["wave"]): int(r["n"]) for r in self.rows(
            f"SELECT wave, count(*) AS n FROM all_runs {where} GROUP BY wave", params)}
        rows = self.rows(
            f"SELECT * EXCLUDE (search_text, {SELECTED}) FROM all_runs {where} "
            f"QUALIFY row_number() OVER (PARTITION BY wave ORDER BY {order}) <= ? "
            f"ORDER BY wave, {order}", [*params, limit])
        return counts, rows

    def wave_table(self, campaign: str, waves: Sequence[int], columns: Sequence[str]) -> pa.Table:
        """The runs of ``campaign`` in ``waves`` (one row per run, run_id order, as the store's
        reader returns them), the ``columns`` the index holds."""
        held = set(self._cursor().sql("SELECT * FROM all_runs LIMIT 0").columns)
        cols = ", ".join(f'"{c}"' for c in columns if c in held)
        marks = ", ".join("?" for _ in waves)
        return self._cursor().sql(
            f"SELECT {cols} FROM all_runs WHERE campaign = ? AND wave IN ({marks}) ORDER BY run_id",
            params=[campaign, *waves]).to_arrow_table()

    def runs_per_wave(self, campaign: str) -> dict[int, int]:
        """wave -> runs the index holds of ``campaign`` in it."""
        return {int(r["wave"]): int(r["n"]) for r in self.rows(
            "SELECT wave, count(*) AS n FROM all_runs WHERE campaign = ? GROUP BY wave", [campaign])}

    def _waves_of_runs(self) -> dict[str, list[WaveInfo]]:
        """Each campaign's waves as its runs show them (no label; started: the first run)."""
        out: dict[str, list[WaveInfo]] = {}
        for r in self.rows("SELECT campaign, wave, min(measured_at) AS started_at FROM all_runs "
                           "GROUP BY campaign, wave ORDER BY campaign, wave"):
            out.setdefault(r["campaign"], []).append(
                WaveInfo(r["campaign"], int(r["wave"]), None, r["started_at"]))
        return out

    def prompt_text(self, prompt_sha256: str) -> str | None:
        """The stored text of one prompt (None: the store has none for it)."""
        return self.scalar("SELECT prompt_text FROM prompts WHERE prompt_sha256 = ? LIMIT 1",
                           [prompt_sha256])

    def user_message(self, prompt_sha256: str, prompt_name: str,
                     instruction_sha256: str) -> str | None:
        """The user message a run of this prompt, name and instruction was sent (None: not
        stored)."""
        return self.scalar("SELECT user_message FROM prompts WHERE prompt_sha256 = ? AND "
                           "prompt_name = ? AND instruction_sha256 = ? LIMIT 1",
                           [prompt_sha256, prompt_name, instruction_sha256])

    def distinct(self, column: str, query: RunQuery | None = None) -> list[Any]:
        """Sorted distinct values of one list column (for filter menus)."""
        if column not in LIST_COLUMNS:
            raise ValueError(f"no list column {column!r}")
        where, params = query.where() if query else ("", [])
        return [r[column] for r in self.rows(
            f"SELECT DISTINCT {column} FROM runs {where} ORDER BY 1", params)]

    # ------------------------------------------------------------------ overviews
    def campaigns(self) -> list[dict[str, Any]]:
        """Per campaign: panel, runs, models, prompts, ok runs, first and last date."""
        return self.rows(
            "SELECT campaign, any_value(panel) AS panel, count(*) AS runs, "
            "count(DISTINCT model) AS models, count(DISTINCT prompt_sha256) AS prompts, "
            "sum(succeeded::INT)::BIGINT AS runs_ok, min(measurement_date) AS first_date, "
            "max(measurement_date) AS last_date FROM runs GROUP BY campaign ORDER BY campaign")

    def panel_models(self, panel: str) -> list[dict[str, Any]]:
        """Per model of a panel, from the runs alone: runs, ok runs, prompts, cells."""
        return self.rows(
            "SELECT model, count(*) AS runs, sum(succeeded::INT)::BIGINT AS runs_ok, "
            "count(DISTINCT prompt_sha256) AS prompts, "
            "count(DISTINCT (campaign, prompt_sha256, budget_max_tokens)) AS cells "
            "FROM runs WHERE panel = ? GROUP BY model ORDER BY model", [panel])

    def cell_metrics(self, panel: str, campaign: str, model: str,
                     prompt_sha256: str) -> dict[str, Any] | None:
        """The analysis' metrics of one cell (None when the analysis does not cover it)."""
        found = self.rows(
            "SELECT any_value(included) AS included, avg(mean_jaccard) AS mean_jaccard, "
            "avg(id_stability) AS id_stability, bool_and(node_set_perfect) AS node_set_perfect "
            "FROM cells WHERE panel = ? AND campaign = ? AND model = ? AND prompt_sha256 = ? "
            "HAVING count(*) > 0", [panel, campaign, model, prompt_sha256])
        return found[0] if found else None

    def model_cells(self, panel: str, model: str, limit: int | None = None,
                    offset: int = 0) -> list[dict[str, Any]]:
        """One model's cells of a panel (least stable first; page ``offset``..+``limit``): run
        counts from the store, metrics from the analysis (null where it does not cover a cell)."""
        page = "" if limit is None else f" LIMIT {int(limit)} OFFSET {int(offset)}"
        return self.rows(
            "WITH r AS (SELECT campaign, prompt_sha256, any_value(prompt_name) AS prompt_name, "
            "  count(*) AS runs, sum(succeeded::INT)::BIGINT AS runs_ok, "
            f"  sum({call_failed_sql()}::INT)::BIGINT AS runs_failed, "
            "  string_agg(DISTINCT outcome, ' ' ORDER BY outcome) AS outcomes "
            "  FROM runs WHERE panel = ? AND model = ? GROUP BY campaign, prompt_sha256), "
            "c AS (SELECT campaign, prompt_sha256, any_value(included) AS included, "
            "  avg(mean_jaccard) AS mean_jaccard, avg(id_stability) AS id_stability, "
            "  bool_and(node_set_perfect) AS node_set_perfect, avg(mean_nodes) AS mean_nodes "
            "  FROM cells WHERE panel = ? AND model = ? GROUP BY campaign, prompt_sha256) "
            "SELECT r.*, c.included, c.mean_jaccard, c.id_stability, c.node_set_perfect, "
            "c.mean_nodes FROM r LEFT JOIN c USING (campaign, prompt_sha256) "
            "ORDER BY c.mean_jaccard ASC NULLS LAST, r.prompt_name, r.campaign" + page,
            [panel, model, panel, model])

    def count_model_cells(self, panel: str, model: str) -> int:
        return int(self.scalar("SELECT count(DISTINCT (campaign, prompt_sha256)) FROM runs "
                               "WHERE panel = ? AND model = ?", [panel, model]))

    def leaderboard(self, panel: str) -> list[dict[str, Any]]:
        """The analysis' model table of a panel (rank order); empty without outputs."""
        return self.rows("SELECT * FROM models WHERE panel = ? ORDER BY rank", [panel])

    def excluded(self, panel: str) -> list[dict[str, Any]]:
        return self.rows("SELECT * FROM excluded WHERE panel = ? ORDER BY model", [panel])

    def panels(self) -> list[str]:
        return [r["panel"] for r in self.rows(
            "SELECT DISTINCT panel FROM runs UNION SELECT DISTINCT panel FROM models ORDER BY 1")]

    # ------------------------------------------------------------------ health
    def health(self, by: str, query: RunQuery) -> list[dict[str, Any]]:
        """Run health grouped ``by`` "model" or "date" (measurement_date): runs, outcome mix
        (``outcomes``: outcome → count), retries per run, latency p50/p90/p99 (ms), token sums,
        truncations, 429 answers and Retry-After seconds announced."""
        key = {"model": "model", "date": "measurement_date"}[by]
        where, params = query.where()
        rows = self.rows(
            f"SELECT {key} AS key, count(*) AS runs, sum(succeeded::INT)::BIGINT AS runs_ok, "
            "avg(n_attempts - 1) AS retries_per_run, max(n_attempts - 1) AS max_retries, "
            "quantile_cont(latency_ms, 0.5) AS latency_p50_ms, "
            "quantile_cont(latency_ms, 0.9) AS latency_p90_ms, "
            "quantile_cont(latency_ms, 0.99) AS latency_p99_ms, "
            "sum(prompt_tokens)::BIGINT AS prompt_tokens, sum(completion_tokens)::BIGINT AS completion_tokens, "
            "sum(reasoning_tokens)::BIGINT AS reasoning_tokens, sum(truncated::INT)::BIGINT AS truncations, "
            "sum(n_429)::BIGINT AS http_429, sum(retry_after_total_s) AS retry_after_s "
            f"FROM runs {where} GROUP BY {key} ORDER BY {key}", params)
        mix = self.rows(f"SELECT {key} AS key, outcome, count(*) AS n FROM runs {where} "
                        f"GROUP BY {key}, outcome ORDER BY {key}, outcome", params)
        by_key: dict[Any, dict[str, int]] = {}
        for m in mix:
            by_key.setdefault(m["key"], {})[m["outcome"]] = int(m["n"])
        for row in rows:
            row["outcomes"] = by_key.get(row["key"], {})
        return rows

    def date_window(self) -> tuple[dt.date, dt.date] | None:
        row = self.rows("SELECT min(measurement_date) AS a, max(measurement_date) AS b FROM runs")
        return (row[0]["a"], row[0]["b"]) if row and row[0]["a"] is not None else None


def spend_rows(store: RunStore, selected: Any) -> list[dict[str, Any]]:
    """Per campaign and model, tokens and cost (at the prices recorded when it ran; None: no
    price) of every stored execution of the selected waves: a run executed twice was paid twice."""
    table = store.dataset.read(dedupe="executions", columns=["campaign", "wave", *SPEND_COLUMNS[1:]])
    if selected is not None:
        table = selected.keep(table)
    prices = read_prices(store.root)
    rows = []
    for campaign in sorted(set(table.column("campaign").to_pylist())):
        part = table.filter(pc.equal(table.column("campaign"), campaign))
        for model, t in spend_by_model(part, prices).items():
            rows.append({"campaign": campaign, "model": model, "executions": t.executions,
                         "prompt_tokens": t.prompt_tokens, "completion_tokens": t.completion_tokens,
                         "total_tokens": t.total_tokens, "cost_usd": t.cost_usd})
    return rows


def _marked(table: pa.Table, selected: SelectedWaves | None = None) -> pa.Table:
    """``table`` with its :data:`SELECTED` column: the rows of ``selected`` (None: every row),
    or the column it has already."""
    if SELECTED in table.column_names:
        return table
    mask = pa.array([True] * table.num_rows, pa.bool_()) if selected is None or not table.num_rows \
        else selected.mask(table)
    return table.append_column(SELECTED, mask)
