"""Two runs' IRs aligned by node: one row per node id, each side pretty-printed, the row marked
``same``, ``changed`` (same id, other fields differ; the differing fields flagged line by line),
``removed`` (only in A) or ``added`` (only in B).

Input: the two stored IR JSON texts. Output: :class:`NodeDiff`, or None when either text is not
an IR document (not JSON, or ``nodes`` not a list of objects) — the page then falls back to a
line diff of the two texts. Rows follow A's node order; a node only in B is placed just before
the next node after it in B that A has too (at the end when there is none). An id that occurs k times in one IR gives k rows,
paired with the other side's occurrences in order. Document fields other than ``nodes``
(``version``, ``uri``, ``meta``) form one leading row with id None. Renamed ids are not merged
into one row (a rename is a removed and an added id); ``rename_of`` names the pairing that
:func:`viewer.diff.diff_runs` found, as a reading aid.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from viewer.diff import ir_document

SAME, CHANGED, REMOVED, ADDED = "same", "changed", "removed", "added"


@dataclass(frozen=True)
class FieldLine:
    """One line of a pretty-printed node: its text, the field path it shows (``kind``,
    ``meta.priority``; "" for braces) and whether that field differs from the other side."""

    text: str
    path: str
    differs: bool


@dataclass(frozen=True)
class NodeRow:
    """One node id: ``status`` (same/changed/removed/added), each side's lines (empty on the side
    without the node), ``fields`` the differing field paths, ``rename_of`` the id this one is
    read as renamed from/to (or "")."""

    node_id: str | None
    status: str
    left: tuple[FieldLine, ...]
    right: tuple[FieldLine, ...]
    fields: tuple[str, ...]
    rename_of: str = ""


@dataclass(frozen=True)
class NodeDiff:
    """Every row (``rows``), of which the first ``shown`` are rendered; counts per status."""

    rows: tuple[NodeRow, ...]
    shown: int

    def count(self, status: str) -> int:
        return sum(r.status == status for r in self.rows)

    def ids(self, status: str) -> list[str]:
        return [r.node_id for r in self.rows if r.status == status and r.node_id is not None]


def _doc(ir_json: str | None) -> dict[str, Any] | None:
    """The IR as a document with a list of object nodes, else None (the caller falls back to
    the text diff)."""
    doc = ir_document(ir_json)
    if not isinstance(doc, dict) or not isinstance(doc.get("nodes"), list):
        return None
    if not all(isinstance(n, dict) for n in doc["nodes"]):
        return None
    return doc


def _canon(value: Any) -> str:
    return json.dumps(value, sort_keys=True, ensure_ascii=False)


def _flat(obj: Mapping[str, Any]) -> dict[str, str]:
    """Field path → canonical JSON, one level into objects (``meta.priority``, ``range.end_col``)."""
    out: dict[str, str] = {}
    for key, value in obj.items():
        if isinstance(value, dict) and value:
            for sub, v in value.items():
                out[f"{key}.{sub}"] = _canon(v)
        else:
            out[str(key)] = _canon(value)
    return out


def _lines(obj: Mapping[str, Any] | None, differing: frozenset[str]) -> tuple[FieldLine, ...]:
    """``obj`` as indented JSON (keys sorted, ``id`` first), one field per line; the text of
    the lines joined is JSON that parses back to ``obj``."""
    if obj is None:
        return ()
    keys = sorted(obj, key=lambda k: (k != "id", k))
    out = [FieldLine("{", "", False)]
    for i, key in enumerate(keys):
        comma = "," if i < len(keys) - 1 else ""
        value = obj[key]
        if isinstance(value, dict) and value:
            out.append(FieldLine(f"  {_canon(key)}: {{", key, False))
            subs = sorted(value)
            for j, sub in enumerate(subs):
                path = f"{key}.{sub}"
                out.append(FieldLine(f"    {_canon(sub)}: {_canon(value[sub])}"
                                     f"{',' if j < len(subs) - 1 else ''}", path, path in differing))
            out.append(FieldLine(f"  }}{comma}", key, False))
        else:
            out.append(FieldLine(f"  {_canon(key)}: {_canon(value)}{comma}", str(key),
                                 str(key) in differing))
    out.append(FieldLine("}", "", False))
    return tuple(out)


def _row(node_id: str | None, a: dict | None, b: dict | None, rename_of: str = "") -> NodeRow:
    if a is None or b is None:
        return NodeRow(node_id, ADDED if a is None else REMOVED, _lines(a, frozenset()),
                       _lines(b, frozenset()), (), rename_of)
    fa, fb = _flat(a), _flat(b)
    differing = frozenset(p for p in fa.keys() | fb.keys() if fa.get(p) != fb.get(p))
    return NodeRow(node_id, CHANGED if differing else SAME, _lines(a, differing),
                   _lines(b, differing), tuple(sorted(differing)), rename_of)


def _order(nodes_a: list[dict], nodes_b: list[dict]) -> list[tuple[str, dict | None, dict | None]]:
    """(id, node in A, node in B) in A's order, B-only nodes before their successor in B."""
    def occurrences(nodes: list[dict]) -> list[tuple[str, int]]:
        seen: dict[str, int] = {}
        out = []
        for n in nodes:
            nid = str(n.get("id", ""))
            out.append((nid, seen.get(nid, 0)))
            seen[nid] = seen.get(nid, 0) + 1
        return out

    keys_a, keys_b = occurrences(nodes_a), occurrences(nodes_b)
    pos_a = {k: i for i, k in enumerate(keys_a)}
    in_b = {k: nodes_b[j] for j, k in enumerate(keys_b)}
    placed: list[tuple[tuple[int, int, int], str, dict | None, dict | None]] = [
        ((i, 0, 0), k[0], nodes_a[i], in_b.get(k)) for i, k in enumerate(keys_a)]
    # a B-only node goes right before the next node (in B's order) that A has too, so it
    # follows whatever A had in its place (a rename reads removed, then added)
    following = len(keys_a)
    for j in range(len(keys_b) - 1, -1, -1):
        k = keys_b[j]
        if k in pos_a:
            following = pos_a[k]
        else:
            placed.append(((following, -1, j), k[0], None, nodes_b[j]))
    placed.sort(key=lambda p: p[0])
    return [(nid, a, b) for _, nid, a, b in placed]


def node_diff(ir_a: str | None, ir_b: str | None, *, max_rows: int,
              renames: Mapping[str, str] | None = None) -> NodeDiff | None:
    """Align the IRs ``ir_a`` and ``ir_b`` by node id (None: either is not an IR document).
    ``max_rows``: rows rendered (every node is compared); ``renames``: removed id → added id
    (both directions are annotated)."""
    da, db = _doc(ir_a), _doc(ir_b)
    if da is None or db is None:
        return None
    renames = dict(renames or {})
    back = {new: old for old, new in renames.items()}
    rows: list[NodeRow] = []
    head_a = {k: v for k, v in da.items() if k != "nodes"}
    head_b = {k: v for k, v in db.items() if k != "nodes"}
    if head_a or head_b:
        rows.append(_row(None, head_a, head_b))
    for nid, a, b in _order(da["nodes"], db["nodes"]):
        rows.append(_row(nid, a, b, renames.get(nid, "") if b is None else
                         back.get(nid, "") if a is None else ""))
    return NodeDiff(tuple(rows), min(len(rows), max_rows))
