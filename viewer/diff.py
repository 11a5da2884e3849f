"""What differs between two runs of a cell: the drift class, ids added / removed / renamed,
metadata and labels changed, and a line diff of any two texts.

The class is :func:`analysis.drift.classify_pair`'s (count → id_label → metadata → agree, in
that order), so the viewer and the analysis never disagree on a pair; "unparsed" when either run
has no parseable IR. Renames are a reading aid, not a metric: a removed id and an added id are
paired when their nodes have the same kind and the same source range, or failing that the same
kind and the same label text (one-to-one, in id order).
"""

from __future__ import annotations

import difflib
import json
from collections import Counter
from dataclasses import asdict, dataclass
from typing import Any

from analysis.metrics.drift import classify_pair, run_ir_from_json

UNPARSED = "unparsed"
_RANGE_KEYS = ("start_line", "start_col", "end_line", "end_col")


@dataclass(frozen=True)
class NodeView:
    """One IR node as shown: id, kind, label, canonical JSON of meta and range ("null" if
    absent)."""

    id: str
    kind: str
    label: str
    meta_json: str
    range_json: str

    @property
    def range_text(self) -> str:
        r = json.loads(self.range_json)
        if not isinstance(r, dict):
            return ""
        a, b, c, d = (r.get(k) for k in _RANGE_KEYS)
        return f"{a}:{b}–{c}:{d}"


def _canon(value: Any) -> str:
    return json.dumps(value, sort_keys=True, ensure_ascii=False, default=str)


def ir_document(ir_json: str | None) -> Any:
    """A stored IR's JSON value (None when there is no IR or it is not JSON); the one parse the
    viewer's diffs share."""
    if not ir_json:
        return None
    try:
        return json.loads(ir_json)
    except ValueError:
        return None


def parse_nodes(ir_json: str | None) -> list[NodeView] | None:
    """The nodes of a stored IR (None when there is no IR or it is not JSON)."""
    doc = ir_document(ir_json)
    if doc is None:
        return None
    nodes = doc.get("nodes") if isinstance(doc, dict) else None
    out = []
    for n in nodes if isinstance(nodes, list) else []:
        if isinstance(n, dict):
            rng = n.get("range")
            out.append(NodeView(str(n.get("id", "")), str(n.get("kind", "")),
                                str(n.get("label", "")), _canon(n.get("meta")),
                                _canon({k: rng.get(k) for k in _RANGE_KEYS}
                                       if isinstance(rng, dict) else None)))
    return out


@dataclass(frozen=True)
class Rename:
    """id ``before`` (run a) reads as id ``after`` (run b); ``matched_on`` "range" or "label"."""

    before: str
    after: str
    matched_on: str


@dataclass(frozen=True)
class FieldChange:
    """Field ``field`` ("range", "label" or "meta.<key>") of node ``node_id``: before → after
    (canonical JSON; label text as is)."""

    node_id: str
    field: str
    before: str
    after: str


@dataclass(frozen=True)
class PairDiff:
    """Run a versus run b (see module docstring). Counts include duplicate ids; kinds_* are the
    node kinds (with multiplicity) only in b (added) or only in a (removed)."""

    run_a: str
    run_b: str
    drift_class: str
    label_only: bool
    count_a: int
    count_b: int
    kinds_added: tuple[str, ...]
    kinds_removed: tuple[str, ...]
    ids_added: tuple[str, ...]
    ids_removed: tuple[str, ...]
    renamed: tuple[Rename, ...]
    metadata_changed: tuple[FieldChange, ...]
    labels_changed: tuple[FieldChange, ...]

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


def _match_renames(removed: list[str], added: list[str], a: dict[str, list[NodeView]],
                   b: dict[str, list[NodeView]]) -> list[Rename]:
    out: list[Rename] = []
    free = list(added)
    for on in ("range", "label"):
        for old in list(removed):
            na = a[old][0]
            key_a = (na.kind, na.range_json if on == "range" else na.label.strip().lower())
            if key_a[1] in ("null", ""):
                continue
            for new in free:
                nb = b[new][0]
                key_b = (nb.kind, nb.range_json if on == "range" else nb.label.strip().lower())
                if key_a == key_b:
                    out.append(Rename(old, new, on))
                    free.remove(new)
                    removed.remove(old)
                    break
    return out


def _by_id(nodes: list[NodeView]) -> dict[str, list[NodeView]]:
    out: dict[str, list[NodeView]] = {}
    for n in nodes:
        out.setdefault(n.id, []).append(n)
    for v in out.values():
        v.sort(key=lambda n: (n.range_json, n.meta_json))
    return out


def _field_changes(node_id: str, xs: list[NodeView], ys: list[NodeView]
                   ) -> tuple[list[FieldChange], list[FieldChange]]:
    meta, labels = [], []
    for x, y in zip(xs, ys, strict=False):
        if x.range_json != y.range_json:
            meta.append(FieldChange(node_id, "range", x.range_json, y.range_json))
        mx, my = json.loads(x.meta_json) or {}, json.loads(y.meta_json) or {}
        if not isinstance(mx, dict) or not isinstance(my, dict):
            if x.meta_json != y.meta_json:
                meta.append(FieldChange(node_id, "meta", x.meta_json, y.meta_json))
        else:
            for key in sorted(set(mx) | set(my)):
                before, after = _canon(mx.get(key)), _canon(my.get(key))
                if before != after:
                    meta.append(FieldChange(node_id, f"meta.{key}", before, after))
        if x.label != y.label:
            labels.append(FieldChange(node_id, "label", x.label, y.label))
    return meta, labels


@dataclass(frozen=True)
class ParsedRun:
    """One run's IR parsed once for many pair comparisons (nodes/ir None: no parseable IR)."""

    run_id: str
    nodes: list[NodeView] | None
    ir: Any  # analysis.drift.RunIR | None

    @property
    def node_ids(self) -> list[str]:
        return sorted({n.id for n in self.nodes or []})


def parse_run(run_id: str, ir_json: str | None) -> ParsedRun:
    nodes = parse_nodes(ir_json)
    ir = run_ir_from_json(ir_json) if nodes is not None and ir_json is not None else None  # nodes: ir_json is set
    return ParsedRun(run_id, nodes, ir)


def diff_runs(ra: ParsedRun, rb: ParsedRun) -> PairDiff:
    """Compare two parsed runs (either without an IR → class "unparsed")."""
    na, nb = ra.nodes, rb.nodes
    if na is None or nb is None:
        return PairDiff(ra.run_id, rb.run_id, UNPARSED, False, len(na or []), len(nb or []),
                        (), (), (), (), (), (), ())
    drift_class, label_only = classify_pair(ra.ir, rb.ir)
    a, b = _by_id(na), _by_id(nb)
    removed = sorted(set(a) - set(b))
    added = sorted(set(b) - set(a))
    renamed = _match_renames(removed, added, a, b)
    renamed_new = {r.after for r in renamed}
    meta: list[FieldChange] = []
    labels: list[FieldChange] = []
    for node_id in sorted(set(a) & set(b)):
        m, lab = _field_changes(node_id, a[node_id], b[node_id])
        meta += m
        labels += lab
    ka, kb = Counter(n.kind for n in na), Counter(n.kind for n in nb)
    return PairDiff(
        ra.run_id, rb.run_id, drift_class, label_only, len(na), len(nb),
        tuple(sorted((kb - ka).elements())), tuple(sorted((ka - kb).elements())),
        tuple(i for i in added if i not in renamed_new), tuple(removed), tuple(renamed),
        tuple(meta), tuple(labels))


def pair_diff(run_a: str, ir_a: str | None, run_b: str, ir_b: str | None) -> PairDiff:
    """Compare two runs' stored IR JSON (None or unparsable → class "unparsed")."""
    return diff_runs(parse_run(run_a, ir_a), parse_run(run_b, ir_b))


@dataclass(frozen=True)
class DiffRow:
    """One row of a side-by-side diff: tag equal/replace/delete/insert/skip; 1-based line
    numbers (None on the side without the line); "skip" rows stand for unchanged lines left
    out."""

    tag: str
    left_no: int | None
    left: str
    right_no: int | None
    right: str


@dataclass(frozen=True)
class TextDiff:
    rows: tuple[DiffRow, ...]
    identical: bool
    truncated: bool  # a side had more than max_lines lines; only the first were compared


def text_diff(a: str | None, b: str | None, *, max_lines: int, context: int = 3) -> TextDiff:
    """Line diff of two texts, hunks with ``context`` unchanged lines around each change."""
    la, lb = (a or "").splitlines(), (b or "").splitlines()
    truncated = len(la) > max_lines or len(lb) > max_lines
    la, lb = la[:max_lines], lb[:max_lines]
    if la == lb:
        return TextDiff((), True, truncated)
    rows: list[DiffRow] = []
    matcher = difflib.SequenceMatcher(None, la, lb, autojunk=False)
    for k, group in enumerate(matcher.get_grouped_opcodes(context)):
        if k or group[0][1] > 0:
            rows.append(DiffRow("skip", None, "", None, ""))
        for tag, i1, i2, j1, j2 in group:
            n = max(i2 - i1, j2 - j1)
            for off in range(n):
                i, j = i1 + off, j1 + off
                left = la[i] if i < i2 else None
                right = lb[j] if j < j2 else None
                rows.append(DiffRow(tag, i + 1 if left is not None else None, left or "",
                                    j + 1 if right is not None else None, right or ""))
    return TextDiff(tuple(rows), False, truncated)


def pretty_ir(ir_json: str | None) -> str:
    """Stored (compact) IR JSON re-indented so a line diff is meaningful."""
    if not ir_json:
        return ""
    try:
        return json.dumps(json.loads(ir_json), indent=2, sort_keys=True, ensure_ascii=False)
    except ValueError:
        return ir_json
