"""deploy/: the local cluster launcher against a real redis-server and real Celery worker processes,
plus static checks of redis.conf, the Dockerfile and compose.yaml (no Docker engine here).

The launcher is always driven through its CLI in a subprocess, as a user would run it."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import redis

from deploy.local_cluster import free_port

pytestmark = pytest.mark.slow

REPO = Path(__file__).resolve().parents[2]
DEPLOY = REPO / "deploy"
LAUNCHER = DEPLOY / "local_cluster.py"


# A minimal Celery app configured the way the launcher's contract says: broker from
# IRBENCH_BROKER_URL; its task writes into IRBENCH_DATA so the test sees both env vars arrive.
THROWAWAY_APP = '''
import os
from pathlib import Path
from celery import Celery

app = Celery("deploytestapp", broker=os.environ["IRBENCH_BROKER_URL"])
app.conf.update(task_ignore_result=True, broker_connection_retry_on_startup=True, task_acks_late=True)

@app.task(name="deploytestapp.touch")
def touch(name):
    Path(os.environ["IRBENCH_DATA"], name).write_text(os.environ.get("DEPLOYTEST_SECRET", "absent"))
'''


def _pid_alive(pid: int) -> bool:
    """Independent of the launcher: a pid is alive if /proc has it and it is not a zombie."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except FileNotFoundError:
        return False
    return stat[stat.rindex(")") + 2] not in "ZX"


def _wait_dead(pids: list[int], timeout_s: float = 10.0) -> list[int]:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        alive = [p for p in pids if _pid_alive(p)]
        if not alive:
            return []
        time.sleep(0.05)
    return [p for p in pids if _pid_alive(p)]


def _launcher(args: list[str], env: dict[str, str], timeout_s: float = 60.0) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, str(LAUNCHER), *args], env=env, capture_output=True, text=True, timeout=timeout_s)


@pytest.fixture
def app_env(tmp_path: Path) -> dict[str, str]:
    """Environment with the throwaway app importable (PYTHONPATH) and the repo for the real one."""
    appdir = tmp_path / "app"
    appdir.mkdir()
    (appdir / "deploytestapp.py").write_text(THROWAWAY_APP)
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(appdir), str(REPO), env.get("PYTHONPATH", "")]).rstrip(os.pathsep)
    env.pop("IRBENCH_BROKER_URL", None)
    return env


@pytest.fixture
def cluster_dirs(tmp_path: Path, app_env: dict[str, str]):
    """State and data dirs; whatever a test leaves running is stopped afterwards."""
    state, data = tmp_path / "state", tmp_path / "data"
    yield state, data
    sf = state / "cluster.json"
    if sf.exists():
        pids = [p["pid"] for p in json.loads(sf.read_text())["processes"]]
        _launcher(["down", "--state", str(state), "--grace", "3"], app_env)
        for pid in pids:  # belt and braces: never leak processes into the rest of the suite
            if _pid_alive(pid):
                os.killpg(pid, signal.SIGKILL)


def _inspect_ping(app: str, broker_url: str, env: dict[str, str]) -> dict:
    env = {**env, "IRBENCH_BROKER_URL": broker_url}
    out = subprocess.run(
        [sys.executable, "-m", "celery", "-A", app, "inspect", "ping", "--json", "--timeout", "2"],
        env=env, capture_output=True, text=True, timeout=30,
    )
    assert out.returncode == 0, out.stderr[-2000:]
    return json.loads(out.stdout.strip().splitlines()[-1])


def _up_and_check(app: str, state: Path, data: Path, env: dict[str, str], *, task_roundtrip: bool) -> None:
    port = free_port()
    t0 = time.monotonic()
    up = _launcher(["up", "--workers", "2", "--concurrency", "2", "--port", str(port), "--state", str(state),
                    "--data", str(data), "--app", app], env)
    assert up.returncode == 0, up.stdout + up.stderr
    assert time.monotonic() - t0 < 30
    broker_url = f"redis://127.0.0.1:{port}/0"
    assert f"--executor celery --broker {broker_url} --data {data.resolve()}" in up.stdout

    st = json.loads((state / "cluster.json").read_text())
    assert st["broker_url"] == broker_url
    procs = {p["name"]: p for p in st["processes"]}
    assert set(procs) == {"redis", "worker-1", "worker-2"}
    pids = [p["pid"] for p in procs.values()]
    assert all(_pid_alive(p) for p in pids)
    for name in ("worker-1", "worker-2"):  # each in its own process group, running celery worker
        pid = procs[name]["pid"]
        assert os.getpgid(pid) == pid
        cmdline = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
        assert b"worker" in cmdline and b"--without-mingle" in cmdline

    r = redis.Redis.from_url(broker_url)
    assert r.ping()
    assert r.config_get("appendonly") == {"appendonly": "yes"}
    assert r.config_get("appendfsync") == {"appendfsync": "everysec"}
    assert r.config_get("maxmemory-policy") == {"maxmemory-policy": "noeviction"}
    assert r.config_get("protected-mode") == {"protected-mode": "yes"}  # local override of the file
    assert Path(r.config_get("dir")["dir"]) == (state / "redis").resolve()

    replies = _inspect_ping(app, broker_url, env)
    assert len(replies) == 2 and all(v == {"ok": "pong"} for v in replies.values()), replies

    if task_roundtrip:  # a real task through the broker proves IRBENCH_DATA and --env-file-less env reach workers
        from celery import Celery

        client = Celery(broker=broker_url)
        client.send_task("deploytestapp.touch", args=["marker.txt"])
        deadline = time.monotonic() + 10
        while not (data / "marker.txt").exists() and time.monotonic() < deadline:
            time.sleep(0.05)
        assert (data / "marker.txt").exists()
        client.close()
    r.close()

    status = _launcher(["status", "--state", str(state), "--json"], env)
    assert status.returncode == 0, status.stdout + status.stderr
    report = json.loads(status.stdout)
    assert report["redis_ping"] and report["all_alive"]
    assert {p["name"] for p in report["processes"] if p["alive"]} == {"redis", "worker-1", "worker-2"}

    down = _launcher(["down", "--state", str(state), "--grace", "10"], env)
    assert down.returncode == 0, down.stdout + down.stderr
    assert _wait_dead(pids) == []
    assert not (state / "cluster.json").exists()
    assert any((state / "redis" / "appendonlydir").iterdir())  # the AOF really was written
    assert _launcher(["status", "--state", str(state)], env).returncode == 3


@pytest.mark.timeout(60)
def test_up_status_down_with_two_workers(cluster_dirs, app_env):
    state, data = cluster_dirs
    _up_and_check("deploytestapp", state, data, app_env, task_roundtrip=True)


@pytest.mark.timeout(60)
def test_real_celery_app_two_workers_answer_ping(cluster_dirs, app_env):
    state, data = cluster_dirs
    _up_and_check("orchestrator.distributed.worker_app", state, data, app_env, task_roundtrip=False)


@pytest.mark.timeout(60)
def test_env_file_reaches_workers_and_foreground_ctrl_c_leaves_nothing(cluster_dirs, app_env, tmp_path):
    state, data = cluster_dirs
    env_file = tmp_path / "secrets.env"
    env_file.write_text("# keys for the workers\nexport DEPLOYTEST_SECRET='s3cr3t-value'\n")
    proc = subprocess.Popen(
        [sys.executable, str(LAUNCHER), "up", "--workers", "1", "--concurrency", "1", "--beat", "--state", str(state),
         "--data", str(data), "--app", "deploytestapp", "--env-file", str(env_file), "--foreground"],
        env=app_env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
    )
    lines = []
    try:
        for line in proc.stdout:  # type: ignore[union-attr]
            lines.append(line)
            if "Ctrl-C stops everything" in line:
                break
        st = json.loads((state / "cluster.json").read_text())
        assert {p["name"] for p in st["processes"]} == {"redis", "worker-1", "beat"}
        pids = [p["pid"] for p in st["processes"]]
        assert all(_pid_alive(p) for p in pids)
        assert "s3cr3t-value" not in (state / "cluster.json").read_text()

        from celery import Celery

        client = Celery(broker=st["broker_url"])
        client.send_task("deploytestapp.touch", args=["secret.txt"])
        deadline = time.monotonic() + 10
        while not (data / "secret.txt").exists() and time.monotonic() < deadline:
            time.sleep(0.05)
        client.close()
        assert (data / "secret.txt").read_text() == "s3cr3t-value"

        proc.send_signal(signal.SIGINT)  # what a terminal Ctrl-C delivers to the launcher
        rest, _ = proc.communicate(timeout=30)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 130, "".join(lines) + rest
    assert _wait_dead(pids) == []
    assert not (state / "cluster.json").exists()


@pytest.mark.timeout(60)
def test_failed_worker_start_stops_redis_too(cluster_dirs, app_env):
    state, data = cluster_dirs
    port = free_port()
    (state / "logs").mkdir(parents=True)
    for i in (1, 2):  # a previous run's "ready" lines must not count as this run's readiness
        (state / "logs" / f"worker-{i}.log").write_text(f"[..: INFO/MainProcess] w{i}@host ready.\n")
    out = _launcher(["up", "--workers", "2", "--port", str(port), "--state", str(state), "--data", str(data),
                     "--app", "no_such_module_for_deploy_test", "--grace", "3"], app_env)
    assert out.returncode == 1
    assert "worker-1 exited during start-up" in out.stderr and "no_such_module_for_deploy_test" in out.stderr
    with pytest.raises(redis.ConnectionError):
        redis.Redis(host="127.0.0.1", port=port, socket_connect_timeout=0.5).ping()
    assert not (state / "cluster.json").exists()
    assert _launcher(["status", "--state", str(state)], app_env).returncode == 3


# ------------------------------------------------------------------------------------- static files


def _conf_directives(path: Path) -> dict[str, tuple[str, bool]]:
    """directive -> (value, preceded by a comment line)."""
    out: dict[str, tuple[str, bool]] = {}
    prev_comment = False
    for line in path.read_text().splitlines():
        s = line.strip()
        if not s:
            prev_comment = False
            continue
        if s.startswith("#"):
            prev_comment = True
            continue
        key, _, value = s.partition(" ")
        out[key.lower()] = (value.strip(), prev_comment)
        # consecutive directives share the comment block above them
    return out


def test_redis_conf_is_durable_and_commented():
    d = _conf_directives(DEPLOY / "redis.conf")
    assert d["appendonly"][0] == "yes"
    assert d["appendfsync"][0] == "everysec"
    assert d["maxmemory-policy"][0] == "noeviction"
    assert re.fullmatch(r"(\d+ \d+ ?)+", d["save"][0])
    assert "protected-mode" in d and "bind" in d
    assert "dir" not in d, "dir breaks local use (Redis chdirs while parsing); the launcher/image set it"
    assert not any(k.startswith("maxmemory-policy") and v[0] != "noeviction" for k, v in d.items())
    uncommented = [k for k, (_, commented) in d.items() if not commented]
    assert uncommented == [], f"directives without a 'why' comment above them: {uncommented}"


def test_dockerfile_is_slim_non_root_and_secret_free():
    text = (DEPLOY / "Dockerfile").read_text()
    lines = [line.strip() for line in text.splitlines() if line.strip() and not line.strip().startswith("#")]
    assert lines[0].startswith("FROM python:3.11-slim")
    assert [line for line in lines if line.startswith("FROM")][-1].startswith("FROM python:3.11-slim")
    users = [line.split()[1] for line in lines if line.startswith("USER ")]
    assert users and users[-1] not in ("root", "0")
    assert any("pip install" in line for line in lines)
    assert lines[-1].startswith("CMD") and "--help" in lines[-1]
    # No key material: no ENV/ARG whose name smells like a credential, and no key-looking literal.
    env_names = re.findall(r"^(?:ENV|ARG)\s+(.*)$", text, flags=re.M)
    joined = " ".join(env_names)
    assert not re.search(r"(KEY|SECRET|TOKEN|PASSWORD)\w*\s*=", joined, flags=re.I), joined
    assert not re.search(r"sk-[A-Za-z0-9]{8,}", text)


def _load_compose() -> dict:
    """compose.yaml as data (PyYAML is in the dev extra)."""
    import yaml

    return yaml.safe_load((DEPLOY / "compose.yaml").read_text())


def test_compose_structure():
    text = (DEPLOY / "compose.yaml").read_text()
    assert "\t" not in text
    code = "\n".join(re.sub(r"(^|\s)#.*$", "", line) for line in text.splitlines())  # comments may show examples
    assert not re.search(r"(API_KEY|SECRET|TOKEN|PASSWORD)\w*\s*[:=]\s*\S", code), \
        "keys belong in the env file, not compose.yaml"
    c = _load_compose()
    s = c["services"]
    assert set(s) == {"redis", "worker", "beat", "flower", "orchestrator"}
    assert s["redis"]["image"].startswith("redis:7")
    assert "./redis.conf:/usr/local/etc/redis/redis.conf:ro" in s["redis"]["volumes"]
    assert "/usr/local/etc/redis/redis.conf" in s["redis"]["command"]
    assert any(v.startswith("redis-aof:") for v in s["redis"]["volumes"])
    assert "ports" not in s["redis"]  # broker stays on the private network (protected-mode is off)

    for name in ("worker", "beat", "orchestrator"):  # the same dataset root everywhere
        assert "irbench-data:/data" in s[name]["volumes"], name
        assert s[name]["environment"]["IRBENCH_DATA"] == "/data"
        assert s[name]["environment"]["IRBENCH_BROKER_URL"] == "redis://redis:6379/0"
        assert s[name]["build"]["dockerfile"] == "deploy/Dockerfile"
    w = s["worker"]
    assert "replicas" in w["deploy"] and "env_file" in w
    cmd = " ".join(w["command"])
    for part in ("-A orchestrator.distributed.worker_app worker", "-P threads", "--without-gossip", "--without-mingle", "worker@%h"):
        assert part in cmd
    assert "inspect ping" in " ".join(w["healthcheck"]["test"])
    assert s["beat"]["deploy"]["replicas"] == 1 and "beat" in s["beat"]["command"]
    assert s["flower"]["image"].startswith("mher/flower")
    assert all(p.startswith("127.0.0.1:") for p in s["flower"]["ports"])
    o = s["orchestrator"]
    assert o["profiles"] == ["run"] and o["restart"] == "no"
    assert o["command"][:2] == ["irbench", "run"] and "--executor" in o["command"]
    assert o["command"][o["command"].index("--executor") + 1] == "celery"
    assert o["command"][o["command"].index("--data") + 1] == "/data"
    assert {"redis-aof", "irbench-data", "beat-state"} <= set(c["volumes"])


@pytest.mark.parametrize("queues", ["", "llm.a,llm.b"])
def test_compose_worker_command_expands_to_the_agreed_argv(queues):
    c = _load_compose()
    script = c["services"]["worker"]["command"][2].replace("$$", "$")  # compose's own $$ unescaping
    script = script.replace("exec celery", "printf '%s\\n' celery", 1)
    env = {"PATH": os.environ.get("PATH", ""), "IRBENCH_QUEUES": queues, "IRBENCH_WORKER_CONCURRENCY": "7"}
    argv = subprocess.run(["sh", "-c", script], env=env, capture_output=True, text=True, check=True).stdout.splitlines()
    assert argv[:6] == ["celery", "-A", "orchestrator.distributed.worker_app", "worker", "-P", "threads"]
    assert argv[argv.index("-c") + 1] == "7"
    assert ("-Q" in argv) == bool(queues)
    if queues:
        assert argv[argv.index("-Q") + 1] == queues


def test_launcher_with_an_interpreter_lacking_celery_says_what_to_do(cluster_dirs, tmp_path):
    """The system Python without celery: a one-line hint (make demo / --python .venv/bin/python), no traceback."""
    state, data = cluster_dirs
    bare = tmp_path / "bare-python"
    bare.write_text(f"#!/bin/sh\nexec {sys.executable} -I -S \"$@\"\n")  # -S: no site-packages, so no celery
    bare.chmod(0o755)
    out = subprocess.run([sys.executable, str(LAUNCHER), "up", "--workers", "1", "--state", str(state),
                          "--data", str(data), "--python", str(bare)], capture_output=True, text=True, timeout=60)
    assert out.returncode == 1 and "Traceback" not in out.stderr
    assert "cannot import celery" in out.stderr and "make demo" in out.stderr and "--python" in out.stderr
    assert not (state / "cluster.json").exists()


def test_launcher_picks_the_repository_venv_when_run_by_a_python_without_celery(tmp_path):
    """`python3 deploy/local_cluster.py` with a bare interpreter defaults --python to .venv's when there is one."""
    venv_python = REPO / ".venv" / "bin" / "python"
    if not venv_python.is_file():
        pytest.fail(f"no .venv in this checkout: make demo creates {venv_python}")
    out = subprocess.run([sys.executable, "-I", "-S", "-c",
                          f"import sys; sys.path.insert(0, {str(DEPLOY)!r}); import local_cluster as lc; "
                          "print(lc.default_python())"], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    assert Path(out.stdout.strip()) == venv_python
