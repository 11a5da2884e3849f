"""storage/README.md defines every column of every dataset, with its unit, and nothing stale."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from storage.availability import AVAILABILITY_SCHEMA
from storage.cells import CELL_MEASUREMENT_SCHEMA
from storage.probes import PROBE_SCHEMA
from storage.prompts import PROMPT_SCHEMA
from storage.schema import ATTEMPT_STRUCT, RUN_SCHEMA
from storage.waves import WAVE_SCHEMA

DOC = Path(__file__).resolve().parents[2] / "storage" / "README.md"


def _documented(heading: str) -> dict[str, list[str]]:
    """column -> its table row cells, for the table under the heading starting with ``heading``."""
    text = DOC.read_text(encoding="utf-8")
    section = text.split(f"## {heading}" if not heading.startswith("#") else heading, 1)[1]
    rows: dict[str, list[str]] = {}
    for line in section.splitlines()[1:]:
        if line.startswith("#"):
            break
        m = re.match(r"^\| `([a-z_0-9]+)` \|(.*)\|$", line)
        if m:
            rows[m.group(1)] = [c.strip() for c in m.group(2).split("|")]
    return rows


@pytest.mark.parametrize(
    ("heading", "names"),
    [
        ("`runs/`", RUN_SCHEMA.names),
        ("### `attempts[]`", [ATTEMPT_STRUCT.field(i).name for i in range(ATTEMPT_STRUCT.num_fields)]),
        ("`cells/`", CELL_MEASUREMENT_SCHEMA.names),
        ("`availability/`", AVAILABILITY_SCHEMA.names),
        ("`probes/`", PROBE_SCHEMA.names),
        ("`waves/`", WAVE_SCHEMA.names),
        ("`prompts/`", PROMPT_SCHEMA.names),
    ],
)
def test_every_column_is_documented_with_a_unit(heading: str, names: list[str]) -> None:
    rows = _documented(heading)
    assert sorted(rows) == sorted(names), {"undocumented": sorted(set(names) - set(rows)),
                                           "stale": sorted(set(rows) - set(names))}
    for name, (type_, unit, meaning) in rows.items():
        assert type_ and unit and meaning, name
        if name.endswith("_ms"):
            assert unit == "ms", name
        if name.endswith("_s"):
            assert unit == "s", name
        if name.endswith("_chars") or name.endswith("_chars_median"):
            assert unit == "chars", name


def test_rows_written_before_total_latency_existed_read_as_null(tmp_path: Path) -> None:
    import pyarrow.parquet as pq

    from storage.runs import RunStore
    from storage.schema import records_to_table
    from tests.support.run_records import make_record

    table = records_to_table([make_record(1), make_record(2)])
    old = table.drop_columns(["total_latency_ms"])
    part = tmp_path / "runs" / f"measurement_date={make_record(1).measurement_date.isoformat()}"
    part.mkdir(parents=True)
    pq.write_table(old.drop_columns(["measurement_date"]).replace_schema_metadata(RUN_SCHEMA.metadata),
                   part / "batch-old.parquet")
    records = RunStore(tmp_path).read_records()
    assert [r.total_latency_ms for r in records] == [None, None] and len(records) == 2
