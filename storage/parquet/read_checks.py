"""Checks on what a dataset read returned: schema versions too new, required columns null, and
which files made a scan fail. Each raises (or returns) one ``StorageError`` that names the files
and says what to do.
"""

from __future__ import annotations

from pathlib import Path

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from storage.errors import StorageError
from storage.schema import schema_version_of
from storage.parquet.spec import DatasetSpec


FILENAME_COLUMN = "__filename"  # pyarrow's per-row source file name (a scanner special field)


def check_versions(spec: DatasetSpec, version: int | None, table: pa.Table, names: list[str]) -> None:
    """A ``StorageError`` naming the files whose rows carry a schema version above ``version``
    (``names``: file paths by the ordinals in ``FILENAME_COLUMN``)."""
    vcol = spec.version_col
    if vcol is None or version is None or table.num_rows == 0:
        return
    too_new = pc.greater(table[vcol], version)
    if pc.any(too_new).as_py():
        bad = table.filter(too_new)
        files = sorted({names[i] for i in bad[FILENAME_COLUMN].to_pylist()})
        top = pc.max(bad[vcol]).as_py()
        raise StorageError(
            f"dataset {spec.name!r}: {len(files)} file(s) were written with schema "
            f"version {top}, this irbench reads versions <= {version}: upgrade irbench "
            f"(first: {files[0]})"
        )


def check_required(spec: DatasetSpec, version: int | None, path: Path, table: pa.Table, names: list[str]) -> None:
    """Non-nullable columns that came back null belong to files that lack them."""
    for name in table.column_names:
        if name == FILENAME_COLUMN or spec.schema.field(name).nullable:
            continue
        col = table[name]
        if col.null_count:
            files = sorted({names[i] for i in
                            table.filter(pc.is_null(col))[FILENAME_COLUMN].to_pylist()})
            raise StorageError(
                f"dataset {spec.name!r}: required column {name!r} is missing or null in "
                f"{len(files)} file(s) (first: {files[0]}); they were not written by this "
                f"schema (version {version}): move them out of {path}"
            )


def diagnose_unreadable(spec: DatasetSpec, version: int | None, path: Path, files: list[Path],
                        exc: Exception) -> StorageError:
    """Find which files are unreadable or of an incompatible schema, and say so."""
    bad: list[str] = []
    for f in files:
        try:
            fschema = pq.read_schema(f)
        except (OSError, pa.ArrowException) as e:
            bad.append(f"{f} (unreadable: {e})")
            continue
        for fld in fschema:
            if fld.name in spec.schema.names and not fld.type.equals(
                spec.schema.field(fld.name).type
            ):
                version = schema_version_of(fschema)
                bad.append(
                    f"{f} (column {fld.name!r} is {fld.type}, expected "
                    f"{spec.schema.field(fld.name).type}; file schema version {version}, "
                    f"reader version {version})"
                )
                break
    if not bad:
        return StorageError(f"dataset {spec.name!r} at {path} cannot be read: {exc}")
    listing = "\n".join(f"  - {b}" for b in bad[:20])
    return StorageError(
        f"dataset {spec.name!r}: {len(bad)} file(s) cannot be read; move them out of "
        f"{path} (or delete them) and re-run the affected runs:\n{listing}"
    )
