"""An endpoint that echoes the API key back (inside a 200 answer and in a 500 body): the key
reaches the endpoint, and nothing we write holds it — Parquet bytes and decoded columns, JSON
logs, stdout/stderr, and (distributed) everything Redis ever saw (its append-only file), on both
executors and both wire formats. The same campaign carries answers built to kill a run
(200k ``[`` in the body, 100k-deep answer): classified and stored on both executors too.
Both executors call through ``PooledProvider``'s ``AioClient`` (aiohttp); a key the client cannot
send is never quoted by either client (``AioClient`` and ``DirectClient``). The same key in a
header of every hostile exchange, unmasked, reaching no error text: tests/workers/test_client_hostile.py."""

from __future__ import annotations

import json
from orchestrator.campaign.outcome import SOME_FAILED_EXIT_CODE
from pathlib import Path

import pyarrow.dataset as ds
import pytest

from tests.support.workers import CeleryWorkers
from tests.support.campaign_files import write_campaign
from tests.support.hostile_server import hostile_server
from deploy.redis_server import RedisServer
from workers.secrets import SECRET_MARKER
from tests.support.cli import run_cli

KEY = "sk-echoTEST-5f4e3d2c1b0a99887766"
REPO = Path(__file__).resolve().parents[2]
WORKER_ENV = {"IRBENCH_CLAIM_TTL_S": "3", "IRBENCH_LEASE_TTL_S": "3", "IRBENCH_MAX_WAIT_S": "1",
              "IRBENCH_MIN_DEFER_S": "0.3", "IRBENCH_MAX_DEFER_S": "3"}


def _campaign(tmp_path: Path, base_url: str) -> Path:
    return write_campaign(tmp_path, "echo", f"""[endpoints.oa]
base_url = "{base_url}"
api_key_env = "ECHO_KEY"
[endpoints.ol]
base_url = "{base_url}"
wire_format = "ollama"
api_key_env = "ECHO_KEY"
[models.echo-key]
endpoint = "oa"
[models.echo-key--ollama]
endpoint = "ol"
[models.echo-key-error]
endpoint = "oa"
[models.deep-body]
endpoint = "oa"
[models.deep-answer--ollama]
endpoint = "ol"
[retry]
max_attempts = 2
backoff_base_s = 0.01
backoff_cap_s = 0.02
""", runs=2, prompts=2)


def _haystacks(data: Path) -> list[str]:
    table = ds.dataset(data / "runs", format="parquet", partitioning="hive").to_table()
    out = [json.dumps(v, default=str) for col in table.columns for v in col.to_pylist()]
    out += [f.read_bytes().decode("latin-1") for f in data.rglob("*") if f.is_file()]
    return out


def _check_store(data: Path, expect_runs: int) -> None:
    table = ds.dataset(data / "runs", format="parquet", partitioning="hive").to_table()
    rows = table.to_pylist()
    assert len({r["run_id"] for r in rows}) == expect_runs
    outcomes = {r["model"]: r["outcome"] for r in rows}
    assert outcomes["echo-key"] == outcomes["echo-key--ollama"] == "ok"
    assert outcomes["echo-key-error"] == "server_error"
    # answers built to kill a run (RecursionError) are classified and stored, every one
    assert {r["outcome"] for r in rows if r["model"] == "deep-body"} == {"protocol_error"}
    deep = [r for r in rows if r["model"] == "deep-answer--ollama"]
    assert len(deep) == 4 and {(r["outcome"], r["parse_outcome"]) for r in deep} == {("ok", "invalid_json")}
    answers = [r["response_text"] for r in rows if r["model"].startswith("echo-key--") or r["model"] == "echo-key"]
    assert len(answers) == 8
    assert answers and all(SECRET_MARKER in a for a in answers)  # the echo was there, and masked
    echoed = [r for r in rows if r["model"] in ("echo-key", "echo-key--ollama")]
    assert {r["served_model"] for r in echoed} == {SECRET_MARKER}  # the key hidden by zero-width spaces
    assert {r["served_digest"] for r in echoed if r["model"] == "echo-key--ollama"} == {SECRET_MARKER}


def _no_key(haystacks: list[str]) -> None:
    hits = [h[:80] for h in haystacks if KEY in h]
    assert not hits, f"the key was found in {len(hits)} places"


@pytest.fixture
def server():  # type: ignore[no-untyped-def]
    with hostile_server() as s:
        yield s


def test_echoed_key_never_stored_local(server, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    campaign = _campaign(tmp_path, server.base_url)
    data, log = tmp_path / "data", tmp_path / "irbench.log"
    env = {"PATH": "/usr/bin:/bin", "ECHO_KEY": KEY}
    proc = run_cli(["run", str(campaign), "--data", str(data), "--no-progress", "--log-file", str(log), "--verbose"], env=env, cwd=REPO, timeout_s=120)
    assert proc.returncode == SOME_FAILED_EXIT_CODE, proc.stderr  # some models fail by design
    assert "failed: " in proc.stderr  # the per-model failure lines are searched for the key too
    assert all(r["headers"].get("authorization") == f"Bearer {KEY}" for r in server.received)
    calls = [r for r in server.received if r["path"] != "/api/tags"]  # the Ollama provider also reads digests
    assert len(calls) == 4 + 4 + 4 * 2 + 4 + 4  # 2 prompts x 2 runs per model; the 500s twice
    _check_store(data, 20)
    assert log.read_text().strip()
    _no_key(_haystacks(data) + [log.read_text(), proc.stdout, proc.stderr])


@pytest.mark.timeout(180)
def test_echoed_key_never_stored_distributed(server, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    import redis

    campaign = _campaign(tmp_path, server.base_url)
    data, log = tmp_path / "data", tmp_path / "irbench.log"
    with RedisServer(aof=True) as srv, CeleryWorkers(srv.url, count=1, concurrency=4,
                                                     env={**WORKER_ENV, "ECHO_KEY": KEY}) as workers:
        env = {"PATH": "/usr/bin:/bin", "ECHO_KEY": KEY}
        proc = run_cli(["run", str(campaign), "--data", str(data), "--no-progress", "--executor", "celery", "--broker", srv.url, "--no-analyze", "--log-file", str(log), "--verbose"], env=env, cwd=REPO, timeout_s=150)
        assert proc.returncode == SOME_FAILED_EXIT_CODE, proc.stderr + workers.logs()  # some models fail by design
        assert "failed: " in proc.stderr  # the per-model failure lines are searched for the key too
        client = redis.Redis.from_url(srv.url)
        live = []
        for key in client.scan_iter(count=1000):
            kind = client.type(key).decode()
            value = {"string": client.get, "hash": client.hgetall, "list": lambda k: client.lrange(k, 0, -1),
                     "set": client.smembers, "zset": lambda k: client.zrange(k, 0, -1)}.get(kind, lambda k: b"")(key)
            live.append(repr(key) + repr(value))
        client.bgrewriteaof()
        worker_logs = workers.logs()
        aof = [f.read_bytes().decode("latin-1") for f in srv.data_dir.rglob("*") if f.is_file()]
    assert len(live) > 3 and any("echo" in h for h in live)  # Redis did hold the campaign's state
    assert len([r for r in server.received if r["path"] != "/api/tags"]) == 24  # calls, not digest reads
    _check_store(data, 20)
    assert "run_finished" in worker_logs
    _no_key(_haystacks(data) + live + aof + [worker_logs, log.read_text(), proc.stdout, proc.stderr])


@pytest.mark.parametrize("client", ["aio", "direct"])
@pytest.mark.parametrize("suffix", ["\n", "\r\nX-Injected: 1", "\x00", "é"])
def test_a_key_no_client_can_send_is_never_quoted(client: str, suffix: str) -> None:
    """A key with a newline or NUL (a stray ``.env`` quote): the request is refused before it
    leaves (``protocol_error``), and the message names no part of the key, not even escaped (an
    h11 error quotes the header value with ``\\n``, which masking of the raw key would miss)."""
    import asyncio

    from tests.support.raw_http import serve_fixed
    from workers.errors import ProtocolFailed
    from workers.providers.aio import AioClient
    from workers.providers.base import ChatRequest
    from workers.providers.direct import DirectClient
    from workers.providers.openai_compat import OpenAIProvider
    from workers.providers.registry import make_tls_context
    from workers.runtask import TimeoutPolicy

    seen: list[bytes] = []

    async def main() -> ProtocolFailed:
        server = await serve_fixed(b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\n{}", on_request=seen.append)
        url = f"http://127.0.0.1:{server.sockets[0].getsockname()[1]}"
        try:
            async with {"aio": AioClient, "direct": DirectClient}[client](tls=make_tls_context()) as c:
                request = ChatRequest(model="m", user_message="hi", timeouts=TimeoutPolicy(total_timeout_s=5))
                with pytest.raises(ProtocolFailed) as refused:
                    await OpenAIProvider(c, url, KEY + suffix).complete(request)
                return refused.value
        finally:
            server.close()
            await server.wait_closed()

    error = asyncio.run(main())
    assert "request not sendable" in str(error) and KEY[:12] not in str(error) and not seen
