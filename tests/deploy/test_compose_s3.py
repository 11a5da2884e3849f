"""deploy/compose.s3.yaml as data: per-worker spool volumes, no shared data volume, secrets from env."""

from __future__ import annotations

import re
from pathlib import Path

import yaml

COMPOSE = Path(__file__).resolve().parents[2] / "deploy" / "compose.s3.yaml"


def _services() -> dict:
    return yaml.safe_load(COMPOSE.read_text())["services"]


def test_workers_have_only_a_spool_volume():
    w = _services()["worker"]
    assert w["volumes"] == ["worker-spool:/spool"]
    assert '--spool-dir "/spool/$$(hostname)"' in w["command"][2]


def test_commands_use_the_bucket_and_secrets_come_from_env():
    s = _services()
    for name in ("worker", "orchestrator"):
        cmd = s[name]["command"][2]
        assert "--data s3://irbench/data" in cmd, name
        assert "${IRBENCH_REDIS_PASSWORD}" in cmd, name
        assert any("s3.env" in f for f in s[name]["env_file"]), name
        assert "AWS_SECRET_ACCESS_KEY" not in s[name]["environment"], name
        assert not any("/data" in v for v in s[name].get("volumes", []) if not v.endswith(":ro")), name
    assert s["redis"]["environment"]["IRBENCH_REDIS_PASSWORD"].startswith("${")
    code = "\n".join(re.sub(r"(^|\s)#.*$", "", line) for line in COMPOSE.read_text().splitlines())
    assert not re.search(r"(SECRET|PASSWORD)\w*(?:\s*=|:\s)\s*[^$\s]", code)  # a literal value, not ${VAR}
