"""The store's identity: a random id in ``ROOT/.irbench-store``, so two processes can tell
whether they write to the same store even when they mount it at different paths.

The orchestrator creates it (``ensure_store_id``) before dispatching; a worker reads it from
its own ``--data`` (``read_store_id``) and publishes it, so a worker started against another
directory is detected and named instead of the campaign waiting forever.
"""

from __future__ import annotations

import os
import uuid
from pathlib import Path

MARKER_NAME = ".irbench-store"


def read_store_id(root: Path) -> str | None:
    """The id in ``root``'s marker, or ``None`` when there is none (or it cannot be read)."""
    try:
        text = (Path(root) / MARKER_NAME).read_text(encoding="utf-8").strip()
    except (OSError, UnicodeDecodeError):
        return None
    return text or None


def ensure_store_id(root: Path) -> str:
    """``root``'s id, creating the marker (exclusively: concurrent callers agree) if missing.
    Raises ``OSError`` when ``root`` cannot be created or written."""
    root = Path(root)
    existing = read_store_id(root)
    if existing:
        return existing
    root.mkdir(parents=True, exist_ok=True)
    new_id = uuid.uuid4().hex
    try:
        fd = os.open(root / MARKER_NAME, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
    except FileExistsError:
        return read_store_id(root) or new_id
    with os.fdopen(fd, "w", encoding="utf-8") as fh:
        fh.write(new_id + "\n")
    return new_id
