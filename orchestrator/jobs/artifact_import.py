"""Import the published study artifact into irbench's datasets (``irbench import-artifact``).

Inputs: the artifact directory (layout in ``../shared/paper-artifact/NOTES.md``), the data root,
and the mapping TOML (``examples/artifact_campaigns.toml``: campaigns → panel, budget rank, time
order, declared budget; the measurement window; the IR folders' campaign and panel).

Outputs:
* every raw IR ``<irs dir>/<model_slug>/<prompt_stem>_r<k>.json`` → one :class:`RunRecord`
  (model from the slug: first ``_`` back to ``:`` unless ``[models]`` overrides it; prompt sha256
  of the corpus file's bytes; run index k; the raw JSON as ``response_text``; parse via
  :func:`workers.ir_extract.extract_ir`; ``measurement_date`` = window start, ``date_is_window``);
* every mapped ``results/ir_stability*.csv`` row → one :class:`CellMeasurement` with its campaign
  of origin, panel and precedence.
A prompt whose file is not in ``corpus/`` gets the key ``name:<prompt name>`` instead of a sha256
(reported). Run ids and measurement ids are deterministic and files are written with
content-derived stems, so importing twice changes nothing on disk.

The :class:`ImportReport` lists, per CSV cell of a panel that has raw IRs, the successful runs
found versus the CSV's ``successful_runs``.
"""

from __future__ import annotations

import datetime as dt
import hashlib
import re
import tomllib
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from analysis.tables.merge import CellRow, read_cell_csv
from storage.cells import CellMeasurement, CellStore, measurement_id
from storage.outcomes import run_succeeded
from storage.records import Outcome, RunRecord
from storage.runs import RunStore
from storage.schema import records_to_table
from workers.errors import ConfigError
from workers.ir_extract import extract_ir

_IR_FILE = re.compile(r"^(?P<stem>.+)_r(?P<k>\d+)\.json$")
ARTIFACT_ENDPOINT = "artifact://llm-evaluation-self-audit"


@dataclass(frozen=True)
class CellCoverage:
    """One CSV cell of a panel with raw IRs: successful raw runs found vs the CSV's count."""

    panel: str
    campaign: str
    model: str
    prompt: str
    csv_successful_runs: int
    runs_found: int

    @property
    def complete(self) -> bool:
        return self.runs_found >= self.csv_successful_runs


@dataclass(frozen=True)
class ImportReport:
    """What the import read and wrote. ``*_written`` = rows newly published (0 on a re-import)."""

    runs_read: int
    runs_written: int
    runs_by_outcome: dict[str, int]
    cells_read: int
    cells_written: int
    cells_by_campaign: dict[str, int]
    coverage: tuple[CellCoverage, ...]
    missing_prompt_files: tuple[str, ...]
    warnings: tuple[str, ...] = field(default=())

    def lines(self) -> list[str]:
        """Human-readable summary, one line per item."""
        out = [
            f"runs: {self.runs_read} raw IRs read, {self.runs_written} newly written "
            f"({', '.join(f'{k} {v}' for k, v in sorted(self.runs_by_outcome.items()))})",
            f"cells: {self.cells_read} CSV rows read, {self.cells_written} newly written",
        ]
        incomplete = [c for c in self.coverage if not c.complete]
        out.append(f"coverage: {len(self.coverage) - len(incomplete)}/{len(self.coverage)} CSV "
                   "cells have all their successful runs as raw IRs")
        for c in incomplete:
            out.append(f"  {c.panel} {c.campaign} {c.model} {c.prompt}: "
                       f"{c.runs_found}/{c.csv_successful_runs} runs found")
        if self.missing_prompt_files:
            out.append(f"prompt files not in corpus/ (keyed by name): "
                       f"{', '.join(self.missing_prompt_files)}")
        out.extend(f"warning: {w}" for w in self.warnings)
        return out


@dataclass(frozen=True)
class _IRSource:
    dir: str
    campaign: str
    panel: str


@dataclass(frozen=True)
class Mapping:
    """The parsed mapping file (see ``examples/artifact_campaigns.toml``)."""

    window_start: dt.date
    window_end: dt.date
    ir_sources: tuple[_IRSource, ...]
    campaigns: tuple[dict[str, Any], ...]
    models: dict[str, str]
    families: dict[str, str] = field(default_factory=dict)  # model -> family ([families])


def load_mapping(path: Path) -> Mapping:
    """Parse and check the mapping TOML; raises ConfigError listing every problem."""
    try:
        raw = tomllib.loads(Path(path).read_text(encoding="utf-8"))
    except (OSError, tomllib.TOMLDecodeError) as exc:
        raise ConfigError(f"cannot read the artifact mapping {path}: {exc}") from exc
    problems: list[str] = []
    window = raw.get("window", {})
    start, end = window.get("start"), window.get("end")
    if not isinstance(start, dt.date) or not isinstance(end, dt.date) or start > end:
        problems.append("[window] needs dates start <= end, e.g. start = 2026-05-30")
    sources = []
    for key in ("irs", "irs_crossed"):
        sec = raw.get(key)
        if sec is None:
            continue
        try:
            sources.append(_IRSource(str(sec["dir"]), str(sec["campaign"]), str(sec["panel"])))
        except KeyError as exc:
            problems.append(f"[{key}] lacks {exc}")
    campaigns = []
    for i, c in enumerate(raw.get("campaign", [])):
        missing = [k for k in ("file", "name", "panel", "budget_rank", "time_order") if k not in c]
        if missing:
            problems.append(f"[[campaign]] #{i + 1} lacks {missing}")
        else:
            campaigns.append(dict(c))
    if problems:
        raise ConfigError(f"artifact mapping {path} is invalid", problems)
    families = raw.get("families", {})
    if not isinstance(families, dict):
        raise ConfigError(f"artifact mapping {path}: [families] must be a table of "
                          '"model" = "family" lines')
    return Mapping(start, end, tuple(sources), tuple(campaigns),
                   {str(k): str(v) for k, v in raw.get("models", {}).items()},
                   {str(k): str(v) for k, v in families.items()})


def _sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def _corpus_index(artifact: Path) -> dict[str, Path]:
    """Prompt file name → path, for every file under ``corpus/`` (MANIFEST.csv excluded)."""
    root = artifact / "corpus"
    if not root.is_dir():
        return {}
    return {p.name: p for p in sorted(root.rglob("*"))
            if p.is_file() and p.name != "MANIFEST.csv"}


class _Prompts:
    """Resolve prompt stems and names to (name, key, path); the key is the file's sha256."""

    def __init__(self, corpus: dict[str, Path], csv_names: set[str]) -> None:
        self.corpus = corpus
        self.by_stem: dict[str, str] = {}
        for name in sorted(set(corpus) | csv_names):
            self.by_stem.setdefault(Path(name).stem.lower(), name)
        self.missing: set[str] = set()
        self._sha: dict[str, str] = {}

    def name_for_stem(self, stem: str) -> str:
        return self.by_stem.get(stem.lower(), stem)

    def key(self, name: str) -> str:
        if name not in self._sha:
            path = self.corpus.get(name)
            if path is None:
                self.missing.add(name)
                self._sha[name] = f"name:{name}"
            else:
                self._sha[name] = _sha256(path)
        return self._sha[name]


def _model_from_slug(slug: str, overrides: dict[str, str]) -> str:
    if slug in overrides:
        return overrides[slug]
    return slug.replace("_", ":", 1)


def _run_id(campaign: str, model: str, prompt: str, k: int) -> str:
    raw = "\x1f".join(("artifact", campaign, model, prompt, str(k))).encode()
    return "art-" + hashlib.sha256(raw).hexdigest()[:40]


def _record(path: Path, src: _IRSource, model: str, prompt: str, k: int, mapping: Mapping,
            prompts: _Prompts) -> RunRecord:
    """The run record of raw IR file ``path``: run ``k`` of ``model`` on ``prompt`` (whose key and
    corpus file ``prompts`` resolve), dated at the start of the mapping's window."""
    key, corpus_path = prompts.key(prompt), prompts.corpus.get(prompt)
    text = path.read_text(encoding="utf-8")
    ext = extract_ir(text)
    at = dt.datetime.combine(mapping.window_start, dt.time(0), tzinfo=dt.UTC)
    ok = run_succeeded(ext.parse_outcome, ext.ir_json)
    return RunRecord(
        run_id=_run_id(src.campaign, model, prompt, k), campaign=src.campaign, panel=src.panel,
        prompt_sha256=key, prompt_name=prompt,
        prompt_source=str(corpus_path) if corpus_path is not None else None,
        model=model, endpoint=ARTIFACT_ENDPOINT, wire_format="openai", run_index=k,
        temperature=0.0, instruction_version="artifact", instruction_sha256="unknown",
        measured_at=at, measurement_date=mapping.window_start, date_is_window=True,
        outcome=Outcome.OK if ok else Outcome.PROTOCOL_ERROR,
        response_text=text, answer_chars=len(text),
        parse_outcome=ext.parse_outcome, parse_repairs=list(ext.repairs), ir_json=ext.ir_json,
        node_ids=list(ext.node_ids), node_count=ext.node_count,
        duplicate_id_count=ext.duplicate_id_count, irbench_version="import-artifact",
    )


def _content_stem(prefix: str, ids: list[str]) -> str:
    digest = hashlib.sha256("\n".join(sorted(ids)).encode()).hexdigest()[:24]
    return f"{prefix}-{digest}"


def _record_families(data_dir: Path, families: dict[str, str]) -> None:
    """Write the mapping's families into ``data_dir/families.toml`` (kept entries of other
    models), so ``analyze`` on this data directory compares the study's families by default."""
    from analysis.tables.families import FAMILIES_FILE, families_toml, load_families
    from storage.parquet.atomic import write_text_atomic

    path = data_dir / FAMILIES_FILE
    known = load_families(path) if path.is_file() else {}
    merged = {**known, **families}
    if merged != known or not path.is_file():
        write_text_atomic(families_toml(merged), path)


def _read_csvs(results: Path, mapping: Mapping, mapping_path: Path, warnings: list[str]) -> dict[str, tuple[dict[str, Any], tuple[CellRow, ...]]]:
    """Each mapped campaign's stability CSV rows, by campaign name; unmapped or missing files warned about."""
    mapped_files = {c["file"] for c in mapping.campaigns}
    for csv_path in sorted(results.glob("ir_stability*.csv")):
        if csv_path.name not in mapped_files:
            warnings.append(f"{csv_path.name} has no [[campaign]] entry in {mapping_path}; skipped")
    csv_rows: dict[str, tuple[dict[str, Any], tuple[CellRow, ...]]] = {}
    for c in mapping.campaigns:
        path = results / c["file"]
        if not path.is_file():
            warnings.append(f"{c['file']} (campaign {c['name']}) not found under {results}")
            continue
        try:
            csv_rows[c["name"]] = (c, read_cell_csv(path, campaign=c["name"]))
        except ValueError as exc:
            raise ConfigError(str(exc)) from exc
    return csv_rows


def _read_runs(artifact: Path, mapping: Mapping, prompts: _Prompts, warnings: list[str]) -> list[RunRecord]:
    """One run record per raw IR file ``<prompt>_r<k>.json`` under the mapping's IR folders."""
    records: list[RunRecord] = []
    for src in mapping.ir_sources:
        base = artifact / src.dir
        if not base.is_dir():
            warnings.append(f"raw IR folder {base} not found; no runs imported from it")
            continue
        for model_dir in sorted(p for p in base.iterdir() if p.is_dir()):
            model = _model_from_slug(model_dir.name, mapping.models)
            for f in sorted(model_dir.iterdir()):
                m = _IR_FILE.match(f.name)
                if m is None:
                    warnings.append(f"{f}: not <prompt>_r<k>.json; skipped")
                    continue
                name = prompts.name_for_stem(m["stem"])
                records.append(_record(f, src, model, name, int(m["k"]), mapping, prompts))
    return records


def _cells(csv_rows: dict[str, tuple[dict[str, Any], tuple[CellRow, ...]]], mapping: Mapping, prompts: _Prompts) -> list[CellMeasurement]:
    """The CSV rows as cell measurements, dated by the study's measurement window."""
    return [
        CellMeasurement(
            measurement_id=measurement_id(c["panel"], name, r.model, r.prompt),
            panel=c["panel"], campaign=name, model=r.model, prompt_name=r.prompt,
            prompt_sha256=prompts.key(r.prompt), successful_runs=r.successful_runs,
            mean_nodes=r.mean_nodes, std_nodes=r.std_nodes, mean_jaccard=r.mean_jaccard,
            id_stability=r.id_stability, mean_confidence=r.mean_confidence,
            budget_rank=int(c["budget_rank"]), time_order=int(c["time_order"]),
            declared_budget=c.get("declared_budget"), source=f"results/{c['file']}",
            measurement_date=mapping.window_start, date_is_window=True,
            window_end=mapping.window_end)
        for name, (c, rows) in csv_rows.items() for r in rows
    ]


def _write(data_dir: Path, records: list[RunRecord], cells: list[CellMeasurement], fsync: bool) -> tuple[int, int]:
    """Write runs and cells under content-named files (a re-import writes nothing new)."""
    runs_written = cells_written = 0
    if records:
        runs_written = RunStore(data_dir, fsync=fsync).dataset.write(
            records_to_table(records), stem=_content_stem("import", [r.run_id for r in records])).rows_written
    if cells:
        stem = _content_stem("import", [f"{c.measurement_id}:{c.mean_jaccard}:{c.id_stability}" for c in cells])
        cells_written = CellStore(data_dir, fsync=fsync).write(cells, stem=stem).rows_written
    return runs_written, cells_written


def import_artifact(artifact_dir: Path, data_dir: Path, mapping_path: Path, *, fsync: bool = True) -> ImportReport:
    """Import raw IRs as run records and stability CSVs as cell measurements (module doc)."""
    artifact = Path(artifact_dir)
    results = artifact / "results"
    if not results.is_dir():
        raise ConfigError(f"{artifact} has no results/ folder; pass the artifact's root directory "
                          "(the one holding corpus/ and results/)")
    mapping = load_mapping(mapping_path)
    warnings: list[str] = []
    csv_rows = _read_csvs(results, mapping, mapping_path, warnings)
    prompts = _Prompts(_corpus_index(artifact),
                       {r.prompt for _, rows in csv_rows.values() for r in rows})
    records = _read_runs(artifact, mapping, prompts, warnings)
    cells = _cells(csv_rows, mapping, prompts)
    runs_written, cells_written = _write(Path(data_dir), records, cells, fsync)
    found = Counter((r.panel, r.model, r.prompt_name) for r in records if r.succeeded)
    ir_panels = {s.panel for s in mapping.ir_sources}
    coverage = tuple(
        CellCoverage(c.panel, c.campaign, c.model, c.prompt_name, c.successful_runs,
                     found[(c.panel, c.model, c.prompt_name)])
        for c in cells if c.panel in ir_panels)
    if mapping.families:
        _record_families(Path(data_dir), mapping.families)
    return ImportReport(
        runs_read=len(records), runs_written=runs_written,
        runs_by_outcome=dict(Counter(r.parse_outcome.value for r in records)),
        cells_read=len(cells), cells_written=cells_written,
        cells_by_campaign=dict(Counter(c.campaign for c in cells)), coverage=coverage,
        missing_prompt_files=tuple(sorted(prompts.missing)), warnings=tuple(warnings))
