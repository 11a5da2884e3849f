"""Typed, lenient models of the IR a model is asked to emit (``../shared/spec/ir.md``).

Real model output departs from the instructed shape in many ways, so validation is lenient:

* unknown fields are kept (``extra="allow"``) at every level and survive ``canonical_json``;
* coercible scalars are coerced (``"2"`` -> ``2`` for priorities and ranges, numbers -> strings
  for ids, labels and categories, a single trigger string -> ``[string]``);
* ``kind`` is a free string: ``Rule``/``Condition``/``Breakpoint``/``Directive`` are the
  instructed kinds, ``Section`` and anything else are kept verbatim;
* a node without ``meta`` or ``range`` is valid (``NodeMeta()`` / ``None``).

What is *not* tolerated here (the caller reports it as ``schema_invalid``): a node without an
``id`` or ``kind``, a ``nodes`` value that is not a list of objects, a priority such as
``"high"`` that is not an integer. Repairs that change content (wrapping a bare node list,
filling a missing document ``meta``) are the extraction step's job, so they can be recorded.

Analysis code parses stored ``ir_json`` with ``IRDocument.from_json``; ``canonical_json`` is
the stored form (sorted keys, compact separators, UTF-8 rather than ``\\uXXXX`` escapes).
"""

from __future__ import annotations

import json
import math
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, field_validator

_LENIENT = ConfigDict(extra="allow", coerce_numbers_to_str=True)


def _int_or_none(value: Any) -> Any:
    """Coerce ``"2"``, ``" 2 "``, ``2.0`` to ``2``; ``""``/``"null"``/``None`` to ``None``.

    Anything else is returned unchanged so pydantic reports it (e.g. ``"high"``).
    """
    if value is None or isinstance(value, bool):
        return value
    if isinstance(value, float) and value.is_integer():
        return int(value)
    if isinstance(value, str):
        text = value.strip()
        if text == "" or text.lower() in ("null", "none"):
            return None
        try:
            return int(text)
        except ValueError:
            try:
                as_float = float(text)
            except ValueError:
                return value
            return int(as_float) if as_float.is_integer() else value
    return value


def _finite(value: Any) -> Any:
    """``value`` with every NaN or infinite float replaced by None."""
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, dict):
        return {k: _finite(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_finite(v) for v in value]
    return value


class IRRange(BaseModel):
    """Source span of a node, 0- or 1-based as the model emitted it (not normalised)."""

    model_config = _LENIENT

    start_line: int | None = None
    start_col: int | None = None
    end_line: int | None = None
    end_col: int | None = None

    @field_validator("start_line", "start_col", "end_line", "end_col", mode="before")
    @classmethod
    def _coerce_int(cls, value: Any) -> Any:
        return _int_or_none(value)


class NodeMeta(BaseModel):
    """Per-node metadata; every instructed field is optional, unknown ones are kept."""

    model_config = _LENIENT

    category: str | None = None
    priority: int | None = None
    inferred: bool | None = None
    triggers: list[str] = Field(default_factory=list)
    condition_ref: str | None = None

    @field_validator("priority", mode="before")
    @classmethod
    def _coerce_priority(cls, value: Any) -> Any:
        return _int_or_none(value)

    @field_validator("triggers", mode="before")
    @classmethod
    def _coerce_triggers(cls, value: Any) -> Any:
        if value is None:
            return []
        if isinstance(value, str):
            return [value]
        return value


class IRNode(BaseModel):
    """One node of the IR. ``kind`` is any string; ``id`` need not be unique in a document."""

    model_config = _LENIENT

    id: str
    kind: str
    label: str = ""
    meta: NodeMeta = Field(default_factory=NodeMeta)
    range: IRRange | None = None

    @field_validator("meta", mode="before")
    @classmethod
    def _meta_none(cls, value: Any) -> Any:
        return {} if value is None else value


class DocMeta(BaseModel):
    """Document metadata: ``parser_version``, ``confidence``, ``engine``, free-text ``warnings``."""

    model_config = _LENIENT

    parser_version: str | None = None
    confidence: float | None = None
    engine: str | None = None
    warnings: list[str] = Field(default_factory=list)

    @field_validator("warnings", mode="before")
    @classmethod
    def _coerce_warnings(cls, value: Any) -> Any:
        if value is None:
            return []
        if isinstance(value, str):
            return [value]
        return value


class IRDocument(BaseModel):
    """A whole IR. ``version``/``uri`` are ``None`` when the model omitted them."""

    model_config = _LENIENT

    version: int | None = None
    uri: str | None = None
    meta: DocMeta = Field(default_factory=DocMeta)
    nodes: list[IRNode] = Field(default_factory=list)

    @field_validator("version", mode="before")
    @classmethod
    def _coerce_version(cls, value: Any) -> Any:
        return _int_or_none(value)

    @field_validator("meta", mode="before")
    @classmethod
    def _meta_none(cls, value: Any) -> Any:
        return {} if value is None else value

    def canonical_json(self) -> str:
        """Sorted keys, compact separators, non-ASCII kept as UTF-8; stable across runs. A NaN or
        infinite number (Python's ``json`` reads ``NaN``/``Infinity``) is written as ``null``, as
        the strict fast path (``storage.ir_strict``, msgspec) writes it: stored IRs stay JSON."""
        data = self.model_dump(mode="json")
        try:
            return json.dumps(data, sort_keys=True, separators=(",", ":"), ensure_ascii=False, allow_nan=False)
        except ValueError:  # only when a non-finite number is in there
            return json.dumps(_finite(data), sort_keys=True, separators=(",", ":"), ensure_ascii=False)

    @classmethod
    def from_json(cls, text: str) -> IRDocument:
        """Parse stored ``ir_json`` (or any IR JSON object). Raises ``pydantic.ValidationError``."""
        return cls.model_validate_json(text)

    def node_ids(self) -> list[str]:
        """Distinct node ids, sorted: the id *set* the metrics use."""
        return sorted({node.id for node in self.nodes})
