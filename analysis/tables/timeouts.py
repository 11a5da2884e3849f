"""Timeout sensitivity: which runs a different total timeout would have lost, and whose place
in the stability table depends on it.

Every run keeps the elapsed time of its final attempt in ``latency_ms`` (a timed-out run too),
so for a hypothetical total timeout ``T`` (seconds), per run:

* a successful run (parsed IR) with ``latency_ms > T·1000`` is **lost** under ``T``; one at or
  below ``T`` stays successful;
* a run that ended ``timeout_total`` under a recorded ``total_timeout_s`` below ``T`` is
  **censored**: it might have succeeded with more time, the data cannot say — it is counted as
  failed (so inclusion under a longer ``T`` is a lower bound) and reported separately;
* every other failed run fails under any ``T`` (a read or connect timeout does not depend on
  the total deadline).

Inclusion follows the stability table (``analysis.tables.cells`` / ``analysis.tables.models``): a cell
(panel, campaign, model, prompt, budget) is included with ≥ ``min_runs`` successful runs; a
model with ≥ ``min_prompts`` distinct prompts among its included cells. A model is *flagged*
when its inclusion under some ``T`` differs from its inclusion as recorded.

Input: a runs table (``storage.runs.RunStore.read_table``). Output: pyarrow Tables.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from storage.parquet.atomic import write_parquet_atomic

from analysis.errors import AnalysisError
from storage.outcomes import succeeded_mask

DEFAULT_TIMEOUTS_S: tuple[float, ...] = (30.0, 60.0, 120.0, 300.0)
REQUIRED_COLUMNS = (
    "run_id", "panel", "campaign", "model", "prompt_sha256", "budget_max_tokens", "outcome",
    "parse_outcome", "ir_json", "latency_ms", "total_timeout_s",
)

LOSSES_SCHEMA = pa.schema([
    pa.field("panel", pa.string(), nullable=False),
    pa.field("model", pa.string(), nullable=False),
    pa.field("timeout_s", pa.float64(), nullable=False),
    pa.field("runs", pa.int64(), nullable=False),
    pa.field("succeeded_recorded", pa.int64(), nullable=False),
    pa.field("succeeded", pa.int64(), nullable=False),  # under timeout_s
    pa.field("lost", pa.int64(), nullable=False),  # successful as recorded, too slow for timeout_s
    pa.field("censored", pa.int64(), nullable=False),  # timeout_total below timeout_s: unknown
    pa.field("prompts_included", pa.int64(), nullable=False),
    pa.field("included", pa.bool_(), nullable=False),
])

FLAGS_SCHEMA = pa.schema([
    pa.field("panel", pa.string(), nullable=False),
    pa.field("model", pa.string(), nullable=False),
    pa.field("included_recorded", pa.bool_(), nullable=False),
    pa.field("prompts_included_recorded", pa.int64(), nullable=False),
    pa.field("included_under", pa.string(), nullable=False),  # "30 s: no, 60 s: yes, ..."
    pa.field("depends_on_timeout", pa.bool_(), nullable=False),
    pa.field("note", pa.string(), nullable=False),
])


@dataclass(frozen=True)
class TimeoutSensitivity:
    """``losses``: one row per (panel, model, timeout) (:data:`LOSSES_SCHEMA`);
    ``flags``: one row per (panel, model) (:data:`FLAGS_SCHEMA`)."""

    losses: pa.Table
    flags: pa.Table
    timeouts_s: tuple[float, ...]
    min_runs: int
    min_prompts: int

    def flagged_models(self) -> list[tuple[str, str]]:
        """(panel, model) pairs whose inclusion depends on the timeout."""
        rows = self.flags.filter(self.flags.column("depends_on_timeout")).to_pylist()
        return [(r["panel"], r["model"]) for r in rows]

    def summary(self) -> dict:
        """A JSON-able digest for an analysis manifest."""
        return {
            "timeouts_s": list(self.timeouts_s),
            "min_runs": self.min_runs,
            "min_prompts": self.min_prompts,
            "models_depending_on_timeout": [f"{p}/{m}" for p, m in self.flagged_models()],
            "unit": "seconds of total timeout; runs",
        }


def _codes(values: list) -> tuple[np.ndarray, list]:
    """Integer codes of ``values`` (order of first appearance) and the distinct values."""
    index: dict = {}
    codes = np.fromiter((index.setdefault(v, len(index)) for v in values), dtype=np.int64, count=len(values))
    return codes, list(index)


def _fmt_s(t: float) -> str:
    return f"{t:g} s"


def _run_arrays(runs: pa.Table) -> dict[str, np.ndarray]:
    missing = [c for c in REQUIRED_COLUMNS if c not in runs.column_names]
    if missing:
        raise AnalysisError(f"timeout sensitivity needs run columns {missing}; read them from the run store")
    ok = succeeded_mask(runs)

    def floats(name: str) -> np.ndarray:
        col = pc.fill_null(runs.column(name).cast(pa.float64()), np.nan)
        return np.asarray(col.to_numpy(zero_copy_only=False), dtype=np.float64)

    return {
        "ok": np.asarray(pc.fill_null(ok, False).to_numpy(zero_copy_only=False), dtype=bool),
        "latency_ms": floats("latency_ms"),
        "recorded_timeout_s": floats("total_timeout_s"),
        "timeout_total": np.asarray(
            pc.equal(runs.column("outcome"), "timeout_total").to_numpy(zero_copy_only=False), dtype=bool
        ),
    }


@dataclass(frozen=True)
class _Groups:
    """Runs coded by (panel, model) and by cell, with the stability table's inclusion rule."""

    model_code: np.ndarray  # per run
    model_keys: list[tuple[str, str]]  # (panel, model) per model code
    cell_code: np.ndarray  # per run
    cell_model: np.ndarray  # per cell code
    cell_prompt: np.ndarray  # per cell code
    min_runs: int
    min_prompts: int

    @classmethod
    def of(cls, runs: pa.Table, min_runs: int, min_prompts: int) -> _Groups:
        model_code, model_keys = _codes(list(zip(runs.column("panel").to_pylist(), runs.column("model").to_pylist())))
        prompt_code, _ = _codes(runs.column("prompt_sha256").to_pylist())
        cell_code, cell_keys = _codes(list(zip(
            model_code.tolist(), runs.column("campaign").to_pylist(), prompt_code.tolist(),
            runs.column("budget_max_tokens").to_pylist(),
        )))
        return cls(model_code, model_keys, cell_code, np.array([k[0] for k in cell_keys], dtype=np.int64),
                   np.array([k[2] for k in cell_keys], dtype=np.int64), min_runs, min_prompts)

    @property
    def n_models(self) -> int:
        return len(self.model_keys)

    def per_model(self, mask: np.ndarray) -> np.ndarray:
        """Runs per model code where ``mask`` holds."""
        return np.bincount(self.model_code, weights=mask.astype(np.float64), minlength=self.n_models).astype(np.int64)

    def inclusion(self, ok: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """(prompts with an included cell, included) per model code, for one success vector."""
        per_cell = np.bincount(self.cell_code, weights=ok.astype(np.float64), minlength=len(self.cell_model))
        inc = per_cell >= self.min_runs
        pairs = (np.unique(np.stack([self.cell_model[inc], self.cell_prompt[inc]], axis=1), axis=0)
                 if inc.any() else np.empty((0, 2), np.int64))
        prompts = np.bincount(pairs[:, 0], minlength=self.n_models) if len(pairs) else np.zeros(self.n_models, np.int64)
        return prompts.astype(np.int64), prompts >= self.min_prompts


def _losses(a: dict[str, np.ndarray], g: _Groups, ts: tuple[float, ...]) -> tuple[pa.Table, list[np.ndarray]]:
    """The losses table (one row per model and timeout) and each timeout's inclusion vector."""
    n, ok = g.n_models, a["ok"]
    total = np.bincount(g.model_code, minlength=n).astype(np.int64)
    rows: dict[str, list] = {f.name: [] for f in LOSSES_SCHEMA}
    under: list[np.ndarray] = []
    for t in ts:
        ok_t = ok & ~(a["latency_ms"] > t * 1000.0)  # NaN latency (never called) is not "too slow"
        censored = a["timeout_total"] & (a["recorded_timeout_s"] < t)
        prompts_t, inc_t = g.inclusion(ok_t)
        under.append(inc_t)
        for col, values in (
            ("panel", [k[0] for k in g.model_keys]), ("model", [k[1] for k in g.model_keys]),
            ("timeout_s", [t] * n), ("runs", total), ("succeeded_recorded", g.per_model(ok)),
            ("succeeded", g.per_model(ok_t)), ("lost", g.per_model(ok & ~ok_t)),
            ("censored", g.per_model(censored)), ("prompts_included", prompts_t), ("included", inc_t),
        ):
            rows[col].extend(np.asarray(values).tolist())
    losses = pa.Table.from_pydict(rows, schema=LOSSES_SCHEMA)
    return losses.sort_by([("panel", "ascending"), ("model", "ascending"), ("timeout_s", "ascending")]), under


def _flags(g: _Groups, ts: tuple[float, ...], recorded: tuple[np.ndarray, np.ndarray], under: list[np.ndarray]) -> pa.Table:
    """One row per model: included as recorded, under each timeout, and whether that depends on it."""
    rec_prompts, rec_inc = recorded
    flags: dict[str, list] = {f.name: [] for f in FLAGS_SCHEMA}
    for i, (panel, model) in enumerate(g.model_keys):
        inc_by_t = [bool(u[i]) for u in under]
        changes = [_fmt_s(t) for t, x in zip(ts, inc_by_t) if x != bool(rec_inc[i])]
        if not changes:
            note = "inclusion does not depend on the timeout"
        elif rec_inc[i]:
            note = "drops out of the table under " + ", ".join(changes)
        else:
            note = "would enter the table under " + ", ".join(changes)
        for col, value in (("panel", panel), ("model", model), ("included_recorded", bool(rec_inc[i])),
                           ("prompts_included_recorded", int(rec_prompts[i])),
                           ("included_under", ", ".join(f"{_fmt_s(t)}: {'yes' if x else 'no'}" for t, x in zip(ts, inc_by_t))),
                           ("depends_on_timeout", bool(changes)), ("note", note)):
            flags[col].append(value)
    return pa.Table.from_pydict(flags, schema=FLAGS_SCHEMA).sort_by([("panel", "ascending"), ("model", "ascending")])


def timeout_sensitivity(
    runs: pa.Table,
    timeouts_s: Sequence[float] = DEFAULT_TIMEOUTS_S,
    *,
    min_runs: int = 2,
    min_prompts: int = 3,
) -> TimeoutSensitivity:
    """Runs lost and stability-table inclusion per (panel, model) under each total timeout.

    ``timeouts_s``: hypothetical total timeouts in seconds (positive, deduplicated, sorted).
    ``min_runs``/``min_prompts``: the stability table's inclusion thresholds.
    """
    ts = tuple(sorted({float(t) for t in timeouts_s}))
    if not ts or ts[0] <= 0:
        raise AnalysisError(f"timeouts_s must be positive seconds, got {list(timeouts_s)}")
    if min_runs < 1 or min_prompts < 1:
        raise AnalysisError(f"min_runs and min_prompts must be >= 1, got {min_runs}, {min_prompts}")
    a = _run_arrays(runs)
    g = _Groups.of(runs, min_runs, min_prompts)
    losses, under = _losses(a, g, ts)
    return TimeoutSensitivity(losses, _flags(g, ts, g.inclusion(a["ok"]), under), ts, min_runs, min_prompts)


def lost_runs(runs: pa.Table, timeout_s: float) -> pa.Table:
    """The successful runs a total timeout of ``timeout_s`` seconds would have lost
    (columns run_id, panel, model, prompt_sha256, latency_ms), slowest first."""
    a = _run_arrays(runs)
    mask = a["ok"] & (a["latency_ms"] > timeout_s * 1000.0)
    cols = ["run_id", "panel", "model", "prompt_sha256", "latency_ms"]
    return runs.select(cols).filter(pa.array(mask)).sort_by([("latency_ms", "descending"), ("run_id", "ascending")])


# ---------------------------------------------------------------- wiring for `irbench analyze`


def analyze_timeouts(
    panel_runs: pa.Table, out_dir: Path, *, min_runs: int, min_prompts: int,
    timeouts_s: Sequence[float] = DEFAULT_TIMEOUTS_S,
) -> tuple[TimeoutSensitivity, dict[str, Path]]:
    """What ``analysis.pipeline.run_analysis`` calls per panel: compute, write
    ``timeouts.parquet`` and ``timeout_flags.parquet`` into ``out_dir``, return the result and
    the paths (manifest: ``result.summary()``)."""
    result = timeout_sensitivity(panel_runs, timeouts_s, min_runs=min_runs, min_prompts=min_prompts)
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    paths = {"timeouts": out_dir / "timeouts.parquet", "timeout_flags": out_dir / "timeout_flags.parquet"}
    for table, path in ((result.losses, paths["timeouts"]), (result.flags, paths["timeout_flags"])):
        write_parquet_atomic(table, path)
    return result, paths


def timeout_lines(result: TimeoutSensitivity) -> list[str]:
    """Console lines: per model, runs lost under each timeout, and the inclusion flag."""
    lines = []
    by_model: dict[tuple[str, str], list[dict]] = {}
    for r in result.losses.to_pylist():
        by_model.setdefault((r["panel"], r["model"]), []).append(r)
    flags = {(r["panel"], r["model"]): r for r in result.flags.to_pylist()}
    for key, rs in by_model.items():
        lost = ", ".join(
            f"{_fmt_s(r['timeout_s'])}: {r['lost']} lost" + (f" ({r['censored']} unknown)" if r["censored"] else "")
            for r in rs
        )
        flag = flags[key]
        mark = "  ⚠ " + flag["note"] if flag["depends_on_timeout"] else ""
        lines.append(f"{key[1]} ({rs[0]['succeeded_recorded']}/{rs[0]['runs']} usable as recorded) — {lost}{mark}")
    return lines
