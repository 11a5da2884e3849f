"""Intents: the record that stands for an execution whose writer died before its real record.

Before each call a worker makes, it puts an *intent* into its spool (``RunSpool.intend``): the
record of that execution as it is to be stored if the process dies now (outcome
``worker_died``, the attempts so far and the one being sent). Intents share the spool's
segments and fsyncs with records; a record of the same ``execution_id`` resolves them. In a
segment an intent is one line ``{"intent":<record JSON>}``; a record is its JSON alone.

When a writer's spool is recovered, the intents no record resolves (:func:`unresolved`) are
published as records of their own. Several intents of one execution (one per attempt) collapse
to the one with the most attempts: every call of the execution is in it.
"""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path

from pydantic import ValidationError

from storage.records import RunRecord

INTENT_PREFIX = b'{"intent":'
INTENT_SUFFIX = b"}\n"


def intent_line(record: RunRecord) -> bytes:
    """The segment line of ``record`` as an intent."""
    return INTENT_PREFIX + record.model_dump_json().encode() + INTENT_SUFFIX


def is_intent(line: bytes) -> bool:
    """True for an intent line (records never start with this key)."""
    return line.startswith(INTENT_PREFIX)


def read_journal(path: Path) -> tuple[list[RunRecord], list[RunRecord], int]:
    """The records, the intents and the number of unreadable lines (a torn last line) of the
    segment file at ``path``."""
    records: list[RunRecord] = []
    intents: list[RunRecord] = []
    bad = 0
    with open(path, "rb") as fh:
        for line in fh:
            line = line.strip()
            if not line:
                continue
            try:
                if is_intent(line):
                    intents.append(RunRecord.model_validate_json(line[len(INTENT_PREFIX):-1]))
                else:
                    records.append(RunRecord.model_validate_json(line))
            except ValidationError:
                bad += 1
    return records, intents, bad


def unresolved(records: Iterable[RunRecord], intents: Iterable[RunRecord]) -> list[RunRecord]:
    """The intents whose execution has no record in ``records``, one per execution (the one
    with the most attempts), ordered by execution id: the same input gives the same rows."""
    done = {r.execution_id for r in records}
    best: dict[str, RunRecord] = {}
    for intent in intents:
        key = intent.execution_id or ""
        if key in done:
            continue
        held = best.get(key)
        if held is None or len(intent.attempts) > len(held.attempts):
            best[key] = intent
    return [best[k] for k in sorted(best)]
