"""Intents: the record that stands for an execution whose writer died before its real record.

Before each call a worker makes, it puts an *intent* into its spool (``RunSpool.intend``): the
record of that execution as it is to be stored if the process dies now (outcome
``worker_died``, the attempts so far and the one being sent). Intents share the spool's
segments and fsyncs with records; a record of the same ``execution_id`` resolves them, and so
does a line ``{"resolved":"<execution_id>"}`` (an execution that ended without a record to
store, ``RunSpool.resolve``). In a segment an intent is one line ``{"intent":<record JSON>}``;
a record is its JSON alone.

When a writer's spool is recovered, the intents no record resolves (:func:`unresolved`) are
published as records of their own. Several intents of one execution (one per attempt) collapse
to the one with the most attempts: every call of the execution is in it.
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path

from pydantic import ValidationError

from storage.records import RunRecord

INTENT_PREFIX = b'{"intent":'
INTENT_SUFFIX = b"}\n"
RESOLVED_PREFIX = b'{"resolved":'


@dataclass
class Journal:
    """What a segment file holds: ``records``, ``intents``, ``resolved`` execution ids and how
    many lines were unreadable (``bad``: a torn last line)."""

    records: list[RunRecord] = field(default_factory=list)
    intents: list[RunRecord] = field(default_factory=list)
    resolved: set[str] = field(default_factory=set)
    bad: int = 0


def intent_line(record: RunRecord) -> bytes:
    """The segment line of ``record`` as an intent."""
    return INTENT_PREFIX + record.model_dump_json().encode() + INTENT_SUFFIX


def resolved_line(execution_id: str) -> bytes:
    """The segment line that resolves the intents of ``execution_id`` without a record."""
    return RESOLVED_PREFIX + json.dumps(execution_id).encode() + INTENT_SUFFIX


def is_intent(line: bytes) -> bool:
    """True for an intent or resolution line (records never start with these keys)."""
    return line.startswith(INTENT_PREFIX) or line.startswith(RESOLVED_PREFIX)


def read_journal(path: Path) -> Journal:
    """What the segment file at ``path`` holds."""
    out = Journal()
    with open(path, "rb") as fh:
        for line in fh:
            line = line.strip()
            if not line:
                continue
            try:
                if line.startswith(INTENT_PREFIX):
                    out.intents.append(RunRecord.model_validate_json(line[len(INTENT_PREFIX):-1]))
                elif line.startswith(RESOLVED_PREFIX):
                    out.resolved.add(str(json.loads(line)["resolved"]))
                else:
                    out.records.append(RunRecord.model_validate_json(line))
            except (ValidationError, ValueError, KeyError):
                out.bad += 1
    return out


def unresolved(records: Iterable[RunRecord], intents: Iterable[RunRecord],
               resolved: Iterable[str] = ()) -> list[RunRecord]:
    """The intents whose execution has no record in ``records`` and is not in ``resolved``,
    one per execution (the one with the most attempts), ordered by execution id: the same
    input gives the same rows."""
    done = {r.execution_id for r in records} | set(resolved)
    best: dict[str, RunRecord] = {}
    for intent in intents:
        key = intent.execution_id or ""
        if key in done:
            continue
        held = best.get(key)
        if held is None or len(intent.attempts) > len(held.attempts):
            best[key] = intent
    return [best[k] for k in sorted(best)]
