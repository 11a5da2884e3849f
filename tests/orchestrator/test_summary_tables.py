"""`irbench compact` and `irbench import-artifact` print short tables on stdout; details with -v."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from orchestrator.jobs.artifact_import import import_artifact
from tests.support.cli import run_cli

IRBENCH = [sys.executable, "-m", "orchestrator.cli.app"]
REPO = Path(__file__).resolve().parents[2]


def _irbench(*args: str) -> subprocess.CompletedProcess:
    return run_cli([*args], env={**os.environ, "COLUMNS": "200"}, timeout_s=180)


def test_import_artifact_prints_a_short_table_and_lists_cells_with_v(tmp_path: Path, artifact_dir: Path) -> None:
    out = _irbench("import-artifact", str(artifact_dir), "--data", str(tmp_path / "d"))
    assert out.returncode == 0, out.stderr
    assert len(out.stdout.splitlines()) < 40 and "Traceback" not in out.stderr
    report = import_artifact(artifact_dir, tmp_path / "again", REPO / "examples" / "artifact_campaigns.toml")
    incomplete = [c for c in report.coverage if not c.complete]
    assert f"{len(incomplete)} incomplete cells" in out.stdout and "listed with -v" in out.stdout
    for campaign in {c.campaign for c in report.coverage}:
        assert campaign in out.stdout
    assert f"│ {report.runs_read} " in out.stdout  # runs read, from the independent import
    verbose = _irbench("import-artifact", str(artifact_dir), "--data", str(tmp_path / "d"), "-v")
    assert verbose.returncode == 0
    listed = [line for line in verbose.stdout.splitlines() if line.rstrip().endswith("runs found")]
    assert len(listed) == len(incomplete)
    assert "│ 0 " in verbose.stdout  # re-import: nothing newly written


def test_compact_prints_files_before_and_after(tmp_path: Path) -> None:
    from tests.support.run_records import make_record

    from storage.runs import RunStore

    store = RunStore(tmp_path)
    for i in range(3):
        store.write([make_record(2 * i), make_record(2 * i + 1)])
    files = list((tmp_path / "runs").rglob("*.parquet"))
    assert len(files) == 3
    out = _irbench("compact", "--data", str(tmp_path))
    assert out.returncode == 0, out.stderr
    assert "3 → 1" in out.stdout and "6 → 6" in out.stdout and "CompactionReport(" not in out.stdout
    assert "per partition" not in out.stdout
    assert len(list((tmp_path / "runs").rglob("*.parquet"))) == 1
    verbose = _irbench("compact", "--data", str(tmp_path), "-v")
    assert "per partition" in verbose.stdout
