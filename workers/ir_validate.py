"""The second half of IR extraction: a decoded JSON value, checked and normalised into an IR.

``workers.ir_extract`` finds the JSON in a model's answer (fences, prose, ``<think>`` blocks,
truncation); this module decides whether that value is an IR (``ir.md``), names every content
change it needed as a repair, validates it (``storage.ir_strict``'s fast path for the IRs that
need no leniency, else ``storage.ir.IRDocument``), and gives its canonical JSON and node ids.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass, field
from typing import Any

from pydantic import ValidationError

from storage.ir import IRDocument
from storage.ir_strict import strict_ir
from storage.records import ERROR_TEXT_MAX_CHARS, ParseOutcome

# Repairs that do not change the IR's content: the outcome stays ``ok``.
COSMETIC_REPAIRS = frozenset({"stripped_fence"})


@dataclass(frozen=True)
class IRExtraction:
    """Result of ``extract_ir``. ``document``/``ir_json`` are set for ok, repaired and
    (when complete nodes were recovered) truncated outcomes.

    ``validated`` is the ``IRDocument``, or the normalised IR that the strict fast path accepted
    (``storage.ir_strict``): then ``document`` validates it on first use, since storing a run
    needs only ``ir_json`` and the node ids."""

    parse_outcome: ParseOutcome
    repairs: tuple[str, ...] = ()
    validated: IRDocument | dict[str, Any] | None = field(default=None, repr=False)
    ir_json: str | None = None
    node_ids: tuple[str, ...] = ()
    node_count: int = 0
    duplicate_id_count: int = 0
    error: str | None = None

    @functools.cached_property
    def document(self) -> IRDocument | None:
        if self.validated is None or isinstance(self.validated, IRDocument):
            return self.validated
        return IRDocument.model_validate(self.validated)


def is_ir_like(value: Any) -> bool:
    """An object with ``nodes``, or a non-empty list of objects (a bare node list)."""
    if isinstance(value, dict):
        return "nodes" in value
    return isinstance(value, list) and bool(value) and all(isinstance(v, dict) for v in value)


def _normalise(value: Any, repairs: list[str]) -> Any:  # noqa: C901  (one flat branch per IR field the schema repairs)
    """Fill what the schema needs and record every content change as a repair."""

    def note(name: str) -> None:
        if name not in repairs:
            repairs.append(name)

    if isinstance(value, list):
        note("wrapped_node_list")
        value = {"nodes": value}
    if not isinstance(value, dict):
        return value
    doc = dict(value)
    if "version" not in doc:
        note("missing_version")
    elif isinstance(doc["version"], str):
        note("coerced_version")
    if "uri" not in doc:
        note("missing_uri")
    if not isinstance(doc.get("meta"), dict):
        note("missing_meta")
    nodes = doc.get("nodes")
    if not isinstance(nodes, list):
        return doc
    for node in nodes:
        if not isinstance(node, dict):
            continue
        if "id" in node and not isinstance(node["id"], str):
            note("coerced_id")
        if "label" not in node:
            note("missing_label")
        meta = node.get("meta")
        if not isinstance(meta, dict):
            note("missing_node_meta")
            continue
        if isinstance(meta.get("priority"), str):
            note("coerced_priority")
        if isinstance(meta.get("triggers"), str):
            note("coerced_triggers")
        if isinstance(meta.get("inferred"), str):
            note("coerced_inferred")
        rng = node.get("range")
        if isinstance(rng, dict) and any(isinstance(v, str) for v in rng.values()):
            note("coerced_range")
    return doc


def validate_ir(value: Any, repairs: list[str], outcome: ParseOutcome, max_nodes: int) -> IRExtraction:
    """``value`` (a decoded JSON value) as an IR: normalised (each content change named in
    ``repairs``), validated by the strict fast path or else leniently by ``IRDocument``, with its
    canonical JSON and node ids; ``schema_invalid`` with the reason when it is no IR. ``outcome``:
    what the text search found (``ok`` becomes ``repaired`` after a content change)."""
    if not is_ir_like(value) or (isinstance(value, dict) and not isinstance(value["nodes"], list)):
        return IRExtraction(ParseOutcome.SCHEMA_INVALID, tuple(repairs), error="JSON is not an IR: no 'nodes' list")
    count = len(value["nodes"] if isinstance(value, dict) else value)
    if count > max_nodes:
        return IRExtraction(
            ParseOutcome.SCHEMA_INVALID, tuple(repairs), error=f"IR has {count} nodes > max_ir_nodes={max_nodes}; not validated"
        )
    repairs = list(repairs)
    doc = _normalise(value, repairs)
    if outcome == ParseOutcome.OK and any(r not in COSMETIC_REPAIRS for r in repairs):
        outcome = ParseOutcome.REPAIRED
    strict = strict_ir(doc)  # most answers need no leniency: the same result ~10x cheaper
    if strict is not None:
        ids, count = strict.node_ids, strict.node_count
        return IRExtraction(outcome, tuple(repairs), doc, strict.ir_json, tuple(ids), count, count - len(ids))
    try:
        document = IRDocument.model_validate(doc)
    except ValidationError as exc:
        problems = "; ".join(
            f"{'.'.join(str(p) for p in err['loc'])}: {err['msg']}" for err in exc.errors()[:5]
        )
        return IRExtraction(ParseOutcome.SCHEMA_INVALID, tuple(repairs), error=clip_error(f"IR schema: {problems}"))
    try:
        ir_json: str | None = document.canonical_json()
    except UnicodeEncodeError:  # a surrogate in a kept field's key: pydantic's serializer refuses it
        ir_json = None
    if ir_json is None or not _is_unicode(ir_json):  # the strict path refuses these: only the lenient one gets here
        # a "\ud800" escape without its pair decodes to a lone surrogate, which no UTF-8 store
        # can hold (it failed the whole Parquet batch): not an IR we can keep
        return IRExtraction(ParseOutcome.SCHEMA_INVALID, tuple(repairs),
                            error="IR holds a lone UTF-16 surrogate (an unpaired \\uD800-\\uDFFF escape)")
    ids = document.node_ids()
    return IRExtraction(
        outcome,
        tuple(repairs),
        document,
        ir_json,
        tuple(ids),
        len(document.nodes),
        len(document.nodes) - len(ids),
    )


def _is_unicode(text: str) -> bool:
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


def clip_error(message: str) -> str:
    """``message`` bounded to ``ERROR_TEXT_MAX_CHARS``."""
    return message if len(message) <= ERROR_TEXT_MAX_CHARS else message[: ERROR_TEXT_MAX_CHARS - 1] + "…"
