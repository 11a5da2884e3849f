"""The ``prompts/`` dataset: the text of every prompt a campaign sent, and the user message it
became, so readers (the viewer) can show and search what was asked without the corpus files.

A run record keeps only the prompt's sha256, name and the instruction's sha256; this dataset
keeps the texts behind them, one row per distinct (prompt sha256, prompt name, instruction
sha256) — the three inputs the rendered message depends on. Rows are written when a campaign
runs, only for keys not already stored, so resuming a campaign writes nothing and a corpus of
N prompts costs N rows however many runs it has. Partitioned by ``stored_date`` (the day the
row was first written); readers keep one row per key (the earliest).

Units: ``*_chars`` characters.
"""

from __future__ import annotations

import datetime as dt
import hashlib
import json
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

import pyarrow as pa

from storage.clock import utc_now
from storage.parquet.dataset import DatasetSpec, ParquetDataset
from storage.schema import RECORD_METADATA_KEY, TIMESTAMP, VERSION_METADATA_KEY

PROMPTS_DATASET = "prompts"
PROMPT_SCHEMA_VERSION = 1

PROMPT_SCHEMA: pa.Schema = pa.schema(
    [
        pa.field("schema_version", pa.int32(), nullable=False),
        pa.field("message_key", pa.string(), nullable=False),
        pa.field("stored_date", pa.date32(), nullable=False),
        pa.field("stored_at", TIMESTAMP, nullable=False),
        pa.field("prompt_sha256", pa.string(), nullable=False),
        pa.field("prompt_name", pa.string(), nullable=False),
        pa.field("instruction_sha256", pa.string(), nullable=False),
        pa.field("instruction_version", pa.string(), nullable=False),
        pa.field("prompt_text", pa.string(), nullable=False),
        pa.field("user_message", pa.string(), nullable=False),
    ],
    metadata={
        VERSION_METADATA_KEY: str(PROMPT_SCHEMA_VERSION).encode(),
        RECORD_METADATA_KEY: b"PromptText",
    },
)


def prompt_spec(name: str = PROMPTS_DATASET) -> DatasetSpec:
    return DatasetSpec(name=name, schema=PROMPT_SCHEMA, key="message_key",
                       partition_col="stored_date", order_col="stored_at",
                       version_col="schema_version")


def message_key(prompt_sha256: str, prompt_name: str, instruction_sha256: str) -> str:
    """Deterministic key of one rendered message (64 hex chars)."""
    canonical = json.dumps([prompt_sha256, prompt_name, instruction_sha256], separators=(",", ":"),
                           ensure_ascii=False)
    return hashlib.sha256(canonical.encode("utf-8")).hexdigest()


@dataclass(frozen=True)
class PromptText:
    """One prompt as sent: its corpus text and the whole user message (instruction + prompt)."""

    prompt_sha256: str
    prompt_name: str
    instruction_sha256: str
    instruction_version: str
    prompt_text: str
    user_message: str

    @property
    def key(self) -> str:
        return message_key(self.prompt_sha256, self.prompt_name, self.instruction_sha256)


class PromptStore:
    """Prompt texts under ``root/prompts/`` (``root`` is the run store's data directory)."""

    def __init__(self, root: Path, *, fsync: bool = True) -> None:
        self.root = Path(root)
        self.dataset = ParquetDataset(self.root, prompt_spec(), fsync=fsync)

    def add(self, prompts: Iterable[PromptText], *, now: dt.datetime | None = None) -> int:
        """Store the prompts whose key is not stored yet (one file for all of them); returns
        the rows written (0 when every key was already there)."""
        stored = self.dataset.keys()
        new = {p.key: p for p in prompts if p.key not in stored}
        if not new:
            return 0
        at = now or utc_now()
        rows = list(new.values())
        table = pa.table({
            "schema_version": [PROMPT_SCHEMA_VERSION] * len(rows),
            "message_key": list(new),
            "stored_date": [at.date()] * len(rows),
            "stored_at": [at] * len(rows),
            **{name: [getattr(p, name) for p in rows] for name in (
                "prompt_sha256", "prompt_name", "instruction_sha256", "instruction_version",
                "prompt_text", "user_message")},
        })
        # the stem names the set of keys, so two processes adding the same prompts at once
        # publish one file (first writer wins) rather than two copies
        stem = "prompts-" + hashlib.sha256("\n".join(sorted(new)).encode()).hexdigest()[:32]
        return self.dataset.write(table, stem=stem).rows_written

    def read(self) -> pa.Table:
        """Every stored prompt, one row per key (sorted by key)."""
        return self.dataset.read()
