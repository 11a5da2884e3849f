"""The report's run-health section: how hard each model was to measure, from the raw runs.

Input: the dataset root's ``runs/`` (read through :class:`storage.runs.RunStore`, one row per
run_id) for one panel. Output: per model (and per measurement date) ``runs``, the outcome mix,
retries per run (attempts − 1), final-attempt latency p50/p90 (ms, linear interpolation),
completion and reasoning token sums, truncations (outcome truncated or finish_reason length),
HTTP 429 answers over all attempts and the Retry-After seconds those answers announced. A model
that needed many retries does not look like a clean one.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from analysis.report.doc import Block, Cell, Note, Paragraph, Table
from analysis.report.tables import fmt_num
from storage.wave_selection import WaveSelection

HEALTH_COLUMNS = ("panel", "model", "measurement_date", "outcome", "attempts", "latency_ms",
                  "completion_tokens", "reasoning_tokens", "finish_reason")
HEADINGS = ("runs", "outcomes", "retries / run", "latency p50 ms", "latency p90 ms",
            "completion tokens", "reasoning tokens", "truncations", "429s", "Retry-After s")


def load_runs(data_dir: Path | None, waves: WaveSelection | None = None) -> pa.Table | None:
    """The columns the health tables need, every panel, runs of ``waves`` (default each
    campaign's latest; None without a readable store)."""
    if data_dir is None or not (Path(data_dir) / "runs").is_dir():
        return None
    from storage.wave_selection import read_runs

    try:
        return read_runs(Path(data_dir), waves or WaveSelection(), columns=list(HEALTH_COLUMNS))
    except (OSError, pa.ArrowException, ValueError):
        return None


def _per_run(runs: pa.Table) -> dict[str, np.ndarray]:
    """Vectorised per-run figures: retries, 429 answers, Retry-After seconds, truncated."""
    n = runs.num_rows
    attempts = runs.column("attempts").combine_chunks()
    parent = pc.list_parent_indices(attempts).to_numpy()
    flat = pc.list_flatten(attempts)
    status = pc.fill_null(pc.struct_field(flat, "status_code"), 0).to_numpy()
    wait = pc.fill_null(pc.struct_field(flat, "retry_after_s"), 0.0).to_numpy()
    finish = pc.fill_null(runs.column("finish_reason"), "").to_numpy(zero_copy_only=False)
    outcome = runs.column("outcome").to_numpy(zero_copy_only=False)
    return {
        "retries": np.maximum(pc.list_value_length(attempts).to_numpy(zero_copy_only=False) - 1, 0),
        "http_429": np.bincount(parent[status == 429], minlength=n),
        "retry_after_s": np.bincount(parent, weights=wait, minlength=n),
        "truncated": (outcome == "truncated") | (finish == "length"),
        "latency_ms": pc.fill_null(runs.column("latency_ms"), np.nan).to_numpy(),
        "completion_tokens": pc.fill_null(runs.column("completion_tokens"), 0).to_numpy(),
        "reasoning_tokens": pc.fill_null(runs.column("reasoning_tokens"), 0).to_numpy(),
        "outcome": outcome,
    }


def health_rows(runs: pa.Table, key: str) -> list[tuple]:
    """(group value, figures...) per distinct ``key`` value, sorted; figures as in HEADINGS."""
    if runs.num_rows == 0:
        return []
    per = _per_run(runs)
    keys = np.asarray(runs.column(key).to_pylist(), dtype=object)
    out = []
    for value in sorted(set(keys.tolist())):
        m = keys == value
        lat = per["latency_ms"][m]
        lat = lat[np.isfinite(lat)]
        p50, p90 = (np.percentile(lat, [50, 90]) if lat.size else (np.nan, np.nan))
        kinds, counts = np.unique(per["outcome"][m], return_counts=True)
        mix = ", ".join(f"{k} {c}" for k, c in zip(kinds.tolist(), counts.tolist(), strict=True))
        out.append((value, int(m.sum()), mix, float(per["retries"][m].mean()), float(p50),
                    float(p90), int(per["completion_tokens"][m].sum()),
                    int(per["reasoning_tokens"][m].sum()), int(per["truncated"][m].sum()),
                    int(per["http_429"][m].sum()), float(per["retry_after_s"][m].sum())))
    return out


def _cells(values: tuple) -> tuple[Cell, ...]:
    out = []
    for v in values:
        if isinstance(v, float):
            out.append(Cell(fmt_num(v, 2 if abs(v) < 10 else 0), v))
        elif isinstance(v, int):
            out.append(Cell(str(v), v))
        else:
            out.append(Cell(str(v), str(v)))
    return tuple(out)


def health_blocks(panel: str, runs: pa.Table | None) -> list[Block]:
    """The per-model and per-date health tables of one panel (a notice without raw runs)."""
    if runs is None:
        return [Note("not available: run health (pass --data with the raw runs)", "missing")]
    mine = runs.filter(pc.equal(runs.column("panel"), panel))
    if mine.num_rows == 0:
        return [Note(f"not available: run health (no raw runs of panel {panel} in --data)",
                     "missing")]
    by_model = tuple(_cells(r) for r in health_rows(mine, "model"))
    by_date = tuple(_cells((str(r[0]),) + r[1:]) for r in health_rows(mine, "measurement_date"))
    return [Table(("model",) + HEADINGS, by_model, table_id=f"health-{panel}"),
            Table(("measurement date",) + HEADINGS, by_date, table_id=f"health-dates-{panel}"),
            Paragraph("retries / run = attempts − 1, averaged; latency = the final attempt's; "
                      "429s count every attempt answered 429; Retry-After s sums the waits those "
                      "answers asked for. `irbench view` filters these by campaign, prompt and "
                      "date (/health).")]
