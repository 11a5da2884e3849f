"""The fast path of IR validation: a strict twin of ``storage.ir.IRDocument`` in msgspec.

``IRDocument`` is lenient: Python field validators coerce priorities, ranges, ids and triggers,
unknown fields are kept. Validating one IR with it, dumping it and sorting its keys into
``canonical_json`` cost ~75 us per 7-node answer, most of the writer process's CPU per run
(bench/writer_cpu.py measures this). Most answers need none of that leniency: every field
already has its type, there is nothing unknown, nothing to coerce. For exactly those, the
lenient validation is the identity plus the defaults, and msgspec (validation and sorted-key
encoding in C) gives the same canonical JSON in ~8 us.

``strict_ir(value)`` returns ``None`` for any IR outside that set (an unknown field anywhere, a
value of another type, a ``null`` where a default is due, a number the encoder would spell
differently from ``json.dumps``); the caller then takes the ``IRDocument`` path. Equality of the
two paths on everything accepted here is a property test (tests/storage/test_ir_strict.py), and the
twin's fields are pinned to ``IRDocument``'s there too.
"""

from __future__ import annotations

import math
from typing import Any, NamedTuple

import msgspec

# repr() (hence json.dumps) writes a float in positional notation exactly in this range; outside
# it the two spell exponents differently (1e+16 / 1e16, 1e-05 / 0.00001), and NaN/Infinity are
# not JSON to msgspec at all
_POSITIONAL_MIN = 1e-4
_POSITIONAL_MAX = 1e16


class _Range(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    start_line: int | None = None
    start_col: int | None = None
    end_line: int | None = None
    end_col: int | None = None


class _NodeMeta(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    category: str | None = None
    priority: int | None = None
    inferred: bool | None = None
    triggers: list[str] = []
    condition_ref: str | None = None


class _Node(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    id: str
    kind: str
    label: str = ""
    meta: _NodeMeta = msgspec.field(default_factory=_NodeMeta)
    range: _Range | None = None


class _DocMeta(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    parser_version: str | None = None
    confidence: float | None = None
    engine: str | None = None
    warnings: list[str] = []


class _Document(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    version: int | None = None
    uri: str | None = None
    meta: _DocMeta = msgspec.field(default_factory=_DocMeta)
    nodes: list[_Node] = []


#: the twin of each ``storage.ir`` model, by name (tests pin their fields to each other)
TWINS: dict[str, type[msgspec.Struct]] = {
    "IRRange": _Range, "NodeMeta": _NodeMeta, "IRNode": _Node, "DocMeta": _DocMeta, "IRDocument": _Document,
}


class StrictIR(NamedTuple):
    """What ``IRDocument.model_validate(value)`` would have given: its ``canonical_json()``, its
    ``node_ids()`` (distinct, sorted) and its node count."""

    ir_json: str
    node_ids: list[str]
    node_count: int


def _positional(value: float | None) -> bool:
    return value is None or value == 0.0 or (math.isfinite(value) and _POSITIONAL_MIN <= abs(value) < _POSITIONAL_MAX)


def strict_ir(value: Any) -> StrictIR | None:
    """``value`` (a decoded, normalised IR) validated and encoded without leniency, or None when
    it needs any (then ``IRDocument`` decides)."""
    try:
        doc = msgspec.convert(value, _Document, strict=True)
        if not _positional(doc.meta.confidence):
            return None
        text = msgspec.json.encode(doc, order="sorted")
    # a field the twin refuses, an int past 64 bits, a lone surrogate (UnicodeEncodeError is a
    # ValueError): anything the fast path cannot say is for IRDocument to decide
    except (msgspec.ValidationError, msgspec.EncodeError, ValueError, TypeError, OverflowError):
        return None
    return StrictIR(text.decode(), sorted({node.id for node in doc.nodes}), len(doc.nodes))
