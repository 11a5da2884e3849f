"""Every user error is one line on stderr, exit code 2, names what to fix, never a traceback.

Table-driven: each case writes a campaign (or a prompt file, or passes options) into a fresh
directory and runs the real CLI entry point (``python -m orchestrator.cli.app`` -> ``main()``) as a
subprocess, so nothing is caught on the test's behalf.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from deploy.local_cluster import free_port

pytestmark = pytest.mark.slow

REPO = Path(__file__).resolve().parents[2]

BASE = """name = "ue"
runs = 2
[corpus]
paths = ["prompts"]
[endpoints.sim]
base_url = "http://127.0.0.1:8765"
[models.m1]
"""


@dataclass(frozen=True)
class Case:
    id: str
    toml: str = BASE
    expect: str = ""  # a substring the one error line must hold (the file/field or the fix)
    args: tuple[str, ...] = ()
    verb: str = "run"
    setup: Callable[[Path], None] | None = None
    env: dict[str, str] = field(default_factory=dict)


def _sub(old: str, new: str) -> str:
    assert old in BASE
    return BASE.replace(old, new)


def _prompt_file(name: str, data: bytes) -> Callable[[Path], None]:
    def setup(d: Path) -> None:
        (d / name).write_bytes(data)

    return setup


def _only_bad_prompts(d: Path) -> None:
    for p in (d / "prompts").iterdir():
        p.unlink()
    (d / "prompts" / "a.txt").write_bytes(b"")
    (d / "prompts" / "b.txt").write_bytes(b"\xff\xfe\x00bin")


URL = 'base_url = "http://127.0.0.1:8765"'
CASES = [
    Case("toml-syntax", BASE + "runs = = 3\n", "ue.toml: TOML syntax error"),
    Case("not-utf8", setup=lambda d: (d / "ue.toml").write_bytes(b'name = "\xff"\n'), expect="not valid UTF-8"),
    Case("missing-file", args=("--data", "x"), expect="does not exist", setup=lambda d: (d / "ue.toml").unlink()),
    Case("unknown-key", _sub("runs = 2", "runz = 2"), "ue.toml: runz: unknown key; did you mean 'runs'"),
    Case("no-corpus", _sub('[corpus]\npaths = ["prompts"]\n', ""), "ue.toml: corpus: required field is missing"),
    Case("max-attempts-zero", BASE + "[retry]\nmax_attempts = 0\n", "ue.toml: retry.max_attempts"),
    Case("port-too-big", _sub(URL, 'base_url = "http://127.0.0.1:99999"'), "endpoints.sim.base_url: 'http://127.0.0.1:99999'"),
    Case("port-zero", _sub(URL, 'base_url = "http://127.0.0.1:0"'), "port 0"),
    Case("port-not-a-number", _sub(URL, 'base_url = "http://127.0.0.1:80x"'), "endpoints.sim.base_url"),
    Case("scheme-ftp", _sub(URL, 'base_url = "ftp://127.0.0.1:21"'), "not an http(s) URL"),
    Case("no-host", _sub(URL, 'base_url = "http://"'), "endpoints.sim.base_url"),
    Case("credentials-in-url", _sub(URL, 'base_url = "http://user:pw@127.0.0.1:8765"'), "credentials in the URL"),
    Case("space-in-url", _sub(URL, 'base_url = "http://127.0.0.1 :8765"'), "whitespace"),
    Case("query-in-url", _sub(URL, 'base_url = "http://127.0.0.1:8765/v1?key=1"'), "no query"),
    Case("model-space", _sub("[models.m1]", '[models."my model"]'), "'my model' is not a valid model name"),
    Case("model-traversal", _sub("[models.m1]", '[models.m1]\nname = "a/../../etc"'), "models.m1.name"),
    Case("model-html", _sub("[models.m1]", '[models.m1]\nname = "<script>alert(1)</script>"'), "not a valid model name"),
    Case("model-control", _sub("[models.m1]", '[models.m1]\nname = "m\\u0007x"'), "not a valid model name"),
    Case("model-absolute", _sub("[models.m1]", '[models.m1]\nname = "/etc/passwd"'), "not a valid model name"),
    Case("model-too-long", _sub("[models.m1]", f'[models.m1]\nname = "{"m" * 201}"'), "at most 200"),
    Case("model-newline", _sub("[models.m1]", '[models.m1]\nname = "m\\nx"'), "models.m1.name"),
    Case("endpoint-name", _sub("[endpoints.sim]", '[endpoints."s i m"]'), "endpoint name 's i m'"),
    Case("unknown-endpoint", _sub("[models.m1]", '[models.m1]\nendpoint = "simx"'), "'simx' is not a defined endpoint"),
    Case("runs-zero", _sub("runs = 2", "runs = 0"), "ue.toml: runs"),
    Case("runs-huge", _sub("runs = 2", "runs = 100000000000000000000"), "--max-planned-runs"),
    Case("over-explicit-bound", args=("--max-planned-runs", "1"), expect="ue.toml: runs: 2 plans 2 runs"),
    Case("budgets-empty", _sub("runs = 2", "runs = 2\nbudgets = []"), "ue.toml: budgets"),
    Case("budgets-dup", _sub("runs = 2", "runs = 2\nbudgets = [10, 10]"), "duplicate budget"),
    Case("temperature", _sub("[models.m1]", "[models.m1]\ntemperature = 5"), "models.m1.temperature"),
    Case("max-tokens-word", _sub("[models.m1]", '[models.m1]\nmax_tokens = "lots"'), 'models.m1.max_tokens'),
    Case("key-literal", _sub(URL, URL + '\napi_key_env = "sk-abcdefghijklmnopqrstuvwxyz123456"'), "looks like an API key"),
    Case("key-in-file", _sub(URL, URL + '\napi_key = "x"'), "never put a secret in the campaign file"),
    Case("wire-format", _sub(URL, URL + '\nwire_format = "grpc"'), "endpoints.sim.wire_format"),
    Case("key-env-unset", _sub(URL, URL + '\napi_key_env = "IRBENCH_UE_UNSET_KEY"'), "IRBENCH_UE_UNSET_KEY is not set"),
    Case("max-response-bytes", _sub("[models.m1]", "[models.m1]\nmax_response_bytes = 10"), "models.m1.max_response_bytes"),
    Case("retry-after-cap", BASE + "[retry]\nmax_retry_after_s = -1\n", "retry.max_retry_after_s"),
    Case("executor-kind", BASE + '[executor]\nkind = "k8s"\n', "executor.kind"),
    Case("corpus-missing", _sub('paths = ["prompts"]', 'paths = ["nope"]'), "/nope' does not exist"),
    Case("prompt-binary", _sub('paths = ["prompts"]', 'paths = ["bin.txt"]'), "bin.txt: binary",
         setup=_prompt_file("bin.txt", b"hello\x00world")),
    Case("prompt-empty", _sub('paths = ["prompts"]', 'paths = ["e.txt"]'), "e.txt: empty",
         setup=_prompt_file("e.txt", b"  \n")),
    Case("prompt-not-utf8", _sub('paths = ["prompts"]', 'paths = ["l1.txt"]'), "l1.txt: not valid UTF-8",
         setup=_prompt_file("l1.txt", "caf\xe9".encode("latin-1"))),
    Case("prompt-too-big", _sub('paths = ["prompts"]', 'paths = ["big.txt"]\nmax_file_bytes = 10'), "big.txt: too large",
         setup=_prompt_file("big.txt", b"x" * 100)),
    Case("prompts-all-bad", expect="no usable prompt left", setup=_only_bad_prompts),
    Case("instruction-missing", _sub("runs = 2", 'runs = 2\ninstruction = "nope.txt"'), "instruction"),
    Case("campaign-name", _sub('name = "ue"', 'name = "my campaign"'), "ue.toml: name: 'my campaign' is not slug-safe"),
    Case("executor-option", args=("--executor", "bogus"), expect="--executor 'bogus'"),
    Case("broker-scheme", args=("--executor", "celery", "--broker", "http://127.0.0.1:6379"), expect="--broker"),
    Case("broker-port", args=("--executor", "celery", "--broker", "redis://127.0.0.1:99999/0"), expect="--broker"),
    Case("broker-missing", args=("--executor", "celery"), expect="no broker given"),
    Case("redis-down", args=("--executor", "celery", "--broker-wait-s", "0"), expect="cannot reach Redis",
         env={"IRBENCH_BROKER_URL": "redis://127.0.0.1:{port}/0"}),
    Case("status-redis-down", verb="status", args=("--broker-wait-s", "0"), expect="cannot reach Redis",
         env={"IRBENCH_BROKER_URL": "redis://127.0.0.1:{port}/0"}),
    Case("status-bad-option", verb="status", args=("--frobnicate",), expect="No such option: --frobnicate"),
    Case("view-port-out-of-range", verb="view", args=("--port", "99999"), expect="--port"),
    Case("view-negative-port", verb="view", args=("--port", "-1"), expect="--port"),
    Case("simulate-port-zero", verb="simulate", args=("--config", "ue.toml", "--port", "0"), expect="--port"),
    Case("max-runs-zero", args=("--max-planned-runs", "0"), expect="--max-planned-runs"),
    Case("data-is-a-file", args=("--data", "ue.toml"), expect="ue.toml"),
]


@dataclass(frozen=True)
class Result:
    returncode: int
    stdout: bytes
    stderr: bytes


def _argv(case: Case) -> list[str]:
    takes_campaign = case.verb in ("run", "status")
    argv = [case.verb, *(["ue.toml"] if takes_campaign else []), *case.args]
    if "--data" not in case.args and case.verb != "simulate":
        argv += ["--data", "data"]
    if case.verb == "run":
        argv.append("--no-progress")
    return argv


def _env(case: Case) -> dict[str, str]:
    port = free_port()
    return {k: v.format(port=port) for k, v in case.env.items()}


def _run_subprocess(d: Path, case: Case) -> Result:
    env = {"PATH": os.environ["PATH"], "PYTHONPATH": str(REPO), **_env(case)}
    proc = subprocess.run([sys.executable, "-m", "orchestrator.cli.app", *_argv(case)], cwd=d, env=env,
                          capture_output=True, timeout=60)
    return Result(proc.returncode, proc.stdout, proc.stderr)


def _run_in_process(d: Path, case: Case, monkeypatch, capfd) -> Result:  # type: ignore[no-untyped-def]
    """The real ``main()`` (what the ``irbench`` script calls), in this process: an exception
    it lets through fails the test, exactly as a traceback would show."""
    from orchestrator.cli import app as cli

    monkeypatch.chdir(d)
    for k, v in _env(case).items():
        monkeypatch.setenv(k, v)
    monkeypatch.delenv("IRBENCH_BROKER_URL", raising=False) if "IRBENCH_BROKER_URL" not in case.env else None
    monkeypatch.setattr(sys, "argv", ["irbench", *_argv(case)])
    with pytest.raises(SystemExit) as exit_info:
        cli.main()
    out, err = capfd.readouterr()
    code = exit_info.value.code
    return Result(code if isinstance(code, int) else 1, out.encode(), err.encode())


def _one_error_line(result: Result) -> str:
    stderr = result.stderr.decode("utf-8", errors="replace")
    assert "Traceback" not in stderr and "never retrieved" not in stderr, stderr
    lines = [line for line in stderr.split("\n") if line.strip()]
    assert len(lines) == 1, stderr
    return lines[0]


def test_the_table_is_big_enough() -> None:
    assert len(CASES) >= 40 and len({c.id for c in CASES}) == len(CASES)


def _prepare(tmp_path: Path, case: Case) -> None:
    (tmp_path / "prompts").mkdir()
    (tmp_path / "prompts" / "p.txt").write_text("Always answer in JSON.\n")
    (tmp_path / "ue.toml").write_text(case.toml)
    if case.setup:
        case.setup(tmp_path)


def _check(tmp_path: Path, case: Case, result: Result) -> None:
    assert result.returncode == 2, (result.stdout, result.stderr)
    line = _one_error_line(result)
    assert line.startswith("error: "), line
    assert case.expect in line, line
    assert not (tmp_path / "data" / "runs").exists()  # nothing was run


@pytest.mark.parametrize("case", CASES, ids=[c.id for c in CASES])
def test_user_error_is_one_line_exit_2(tmp_path: Path, case: Case, monkeypatch, capfd) -> None:  # type: ignore[no-untyped-def]
    _prepare(tmp_path, case)
    _check(tmp_path, case, _run_in_process(tmp_path, case, monkeypatch, capfd))


SUBPROCESS_CASES = ("port-too-big", "missing-file", "prompt-binary", "redis-down", "status-bad-option")


@pytest.mark.parametrize("case", [c for c in CASES if c.id in SUBPROCESS_CASES], ids=SUBPROCESS_CASES)
def test_user_error_from_a_fresh_process(tmp_path: Path, case: Case) -> None:
    """A few rows again as a separate `python -m orchestrator.cli.app` process, as a user runs it."""
    _prepare(tmp_path, case)
    _check(tmp_path, case, _run_subprocess(tmp_path, case))


def test_the_valid_base_campaign_is_not_an_error(tmp_path: Path) -> None:
    """The table's base case is valid: each row fails for its own reason only (status needs no endpoint)."""
    (tmp_path / "prompts").mkdir()
    (tmp_path / "prompts" / "p.txt").write_text("Always answer in JSON.\n")
    (tmp_path / "ue.toml").write_text(BASE)
    proc = _run_subprocess(tmp_path, Case("valid", verb="status"))
    assert proc.returncode == 0, proc.stderr
    assert b"0/2 runs stored" in proc.stdout
    # no run has written here: the planned runs are shown, and stderr says there is no store
    lines = proc.stderr.decode().strip().splitlines()
    assert len(lines) == 1 and "holds no irbench store" in lines[0], proc.stderr


def test_status_names_a_corrupt_file_and_skips_it_on_request(tmp_path: Path) -> None:
    from tests.support.scripted_server import scripted_server

    (tmp_path / "prompts").mkdir()
    (tmp_path / "prompts" / "p.txt").write_text("Always answer in JSON.\n")
    with scripted_server() as sim:
        (tmp_path / "ue.toml").write_text(BASE.replace("http://127.0.0.1:8765", sim.base_url).replace("[models.m1]", "[models.ok]"))
        ran = _run_subprocess(tmp_path, Case("run"))
        assert ran.returncode == 0, ran.stderr
        assert len(sim.received) == 2
    partition = next((tmp_path / "data" / "runs").glob("measurement_date=*"))
    bad = partition / "batch-corrupt.parquet"
    bad.write_bytes(b"PAR1 this is not parquet at all")

    plain = _run_subprocess(tmp_path, Case("status", verb="status"))
    assert plain.returncode == 2
    line = _one_error_line(plain)
    assert str(bad.relative_to(tmp_path)) in line and "--skip-corrupt" in line

    skipping = _run_subprocess(tmp_path, Case("status", verb="status", args=("--skip-corrupt",)))
    assert skipping.returncode == 0, skipping.stderr
    assert b"2/2 runs stored" in skipping.stdout
    assert f"warning: skipped unreadable file {bad.relative_to(tmp_path)}".encode() in skipping.stderr

    # the --json branch behaves the same: one error line without the flag, counts with it
    plain_json = _run_subprocess(tmp_path, Case("status", verb="status", args=("--json",)))
    assert plain_json.returncode == 2 and plain_json.stdout == b""
    assert str(bad.relative_to(tmp_path)) in _one_error_line(plain_json)
    skipping_json = _run_subprocess(tmp_path, Case("status", verb="status", args=("--json", "--skip-corrupt")))
    assert skipping_json.returncode == 0, skipping_json.stderr
    report = json.loads(skipping_json.stdout)
    assert report["total"]["stored"] == 2 and report["total"]["planned"] == 2
    assert report["skipped_files"] == [str(bad.relative_to(tmp_path))]
    assert f"warning: skipped unreadable file {bad.relative_to(tmp_path)}".encode() in skipping_json.stderr
