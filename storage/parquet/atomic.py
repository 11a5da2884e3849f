"""Atomic whole-file writes for derived tables and documents (analysis outputs, reports,
probe tables, job markers): write a temporary file beside the target, optionally fsync it,
then ``os.replace`` — a reader sees the old file or the new one, never half of one.

The run datasets publish through :mod:`storage.parquet.dataset` (first-writer-wins links); this module
is for files that a rerun replaces.
"""

from __future__ import annotations

import errno
import json
import os
import uuid
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq


def _tmp_beside(path: Path) -> Path:
    return path.with_name(f".{path.name}.{uuid.uuid4().hex}.tmp")


def _fsync(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _publish(path: Path, write, fsync: bool) -> None:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = _tmp_beside(path)
    try:
        write(tmp)
        if fsync:
            _fsync(tmp)
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)


def write_parquet_atomic(table: pa.Table, path: Path, *, fsync: bool = False) -> None:
    """``table`` as the Parquet file ``path`` (parent directories created)."""
    _publish(path, lambda tmp: pq.write_table(table, tmp), fsync)


def write_bytes_atomic(data: bytes, path: Path, *, fsync: bool = False) -> None:
    """``data`` as the file ``path``."""
    _publish(path, lambda tmp: tmp.write_bytes(data), fsync)


def write_text_atomic(text: str, path: Path, *, fsync: bool = False) -> None:
    """``text`` as the UTF-8 file ``path``."""
    write_bytes_atomic(text.encode("utf-8"), path, fsync=fsync)


def write_json_atomic(obj: Any, path: Path, *, fsync: bool = True) -> None:
    """``obj`` as indented UTF-8 JSON (keys in insertion order, trailing newline); fsynced by
    default, since manifests and job markers are what readers poll for."""
    text = json.dumps(obj, indent=2, ensure_ascii=False, sort_keys=False) + "\n"
    write_text_atomic(text, path, fsync=fsync)


def link_first_wins(tmp: Path, target: Path) -> bool:
    """Publish ``tmp`` as ``target`` unless ``target`` exists; True if this call published."""
    try:
        os.link(tmp, target)
        return True
    except FileExistsError:
        return False
    except OSError as exc:
        if exc.errno not in (errno.EPERM, errno.ENOTSUP, errno.EOPNOTSUPP, errno.EMLINK):
            raise
    # Filesystem without hard links: not atomic against a concurrent writer of the same name,
    # but both candidates are complete files, and readers deduplicate.
    if target.exists():
        return False
    os.replace(tmp, target)
    return True
