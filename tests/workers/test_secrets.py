"""No secret is ever written to Parquet, logs or error messages."""

from __future__ import annotations

import io
import json
from orchestrator.campaign.outcome import SOME_FAILED_EXIT_CODE
from pathlib import Path

import pyarrow as pa
import pyarrow.dataset as ds
import structlog

from simulator.config import load_sim_config
from simulator.server import start_background
from workers.logs import REDACTED, Redactor, configure_logging
from tests.support.cli import run_cli

KEY = "sk-irbenchTEST-9f8e7d6c5b4a39281706"
WRONG_KEY = "sk-wrongKEY-0123456789abcdefXYZ"


def _strings(table: pa.Table) -> list[str]:
    out: list[str] = []
    for col in table.columns:
        for value in col.to_pylist():
            out.append(json.dumps(value, default=str))
    return out


def test_campaign_with_api_key_leaves_no_trace(tmp_path: Path, examples_dir: Path) -> None:
    cfg = load_sim_config(examples_dir / "sim.toml").model_copy(update={"api_key": KEY})
    with start_background(cfg) as sim:
        campaign = tmp_path / "c.toml"
        campaign.write_text(
            f"""
name = "secrets"
runs = 2
[corpus]
paths = ["{examples_dir / 'prompts'}"]
[endpoints.good]
base_url = "{sim.base_url}"
api_key_env = "IRBENCH_TEST_KEY"
[endpoints.bad]
base_url = "{sim.base_url}"
api_key_env = "IRBENCH_WRONG_KEY"
[models.sim-mild]
endpoint = "good"
[models.sim-shaky]
endpoint = "bad"
name = "sim-shaky"
[retry]
max_attempts = 1
"""
        )
        env = {"PATH": "/usr/bin:/bin", "IRBENCH_TEST_KEY": KEY, "IRBENCH_WRONG_KEY": WRONG_KEY}
        log = tmp_path / "irbench.log"
        data = tmp_path / "data"
        proc = run_cli(["run", str(campaign), "--data", str(data), "--no-progress", "--log-file", str(log), "--verbose"], env=env, timeout_s=120)
        assert proc.returncode == SOME_FAILED_EXIT_CODE, proc.stderr  # some models fail by design
        assert "failed: " in proc.stderr  # the per-model failure lines are searched for the key too
    table = ds.dataset(data / "runs", format="parquet", partitioning="hive").to_table()
    outcomes = set(table.column("outcome").to_pylist())
    assert "ok" in outcomes and "auth_error" in outcomes  # both paths exercised
    haystacks = _strings(table) + [log.read_text(), proc.stdout, proc.stderr]
    for f in data.rglob("*"):
        if f.is_file():
            haystacks.append(f.read_bytes().decode("latin-1"))
    for secret in (KEY, WRONG_KEY):
        hits = [h for h in haystacks if secret in h]
        assert not hits, f"secret found in {len(hits)} places"
    assert log.read_text().strip(), "the log should not be empty"


def test_redactor_scrubs_keys_values_and_shapes() -> None:
    buf = io.StringIO()
    red = Redactor()
    configure_logging(json=True, stream=buf, redactor=red)
    red.add_secret("hunter2-very-secret")
    structlog.get_logger().warning(
        "call failed",
        api_key="abc",
        max_tokens=1500,
        error="upstream said hunter2-very-secret was wrong; Authorization: Bearer abcdefghijklmnop",
        headers={"Authorization": "Bearer zzzzzzzzzzzz"},
        run_id="0123456789abcdef0123456789abcdef",
    )
    line = json.loads(buf.getvalue().strip().splitlines()[-1])
    assert line["api_key"] == REDACTED
    assert line["max_tokens"] == 1500
    assert "hunter2" not in line["error"] and "abcdefghijklmnop" not in line["error"]
    assert line["headers"]["Authorization"] == REDACTED
    assert line["run_id"] == "0123456789abcdef0123456789abcdef"
