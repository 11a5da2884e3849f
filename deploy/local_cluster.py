#!/usr/bin/env python3
"""Start, inspect and stop a local irbench cluster as plain processes (stdlib only).

    python deploy/local_cluster.py up --workers 2 --concurrency 8 --port 6390 --data data/ [--beat]
    python deploy/local_cluster.py status [--json]
    python deploy/local_cluster.py down

``up`` starts ``redis-server`` (deploy/redis.conf: AOF on, noeviction) with its files in
``<state>/redis``, then N ``celery worker`` processes (``-P threads -c C``, node names
``w1@%h`` … so ``inspect ping`` tells them apart) and optionally ``celery beat``. Each process
runs in its own session/process group (a terminal Ctrl-C reaches only this launcher, which then
stops them in order) and logs to ``<state>/logs/<name>.log``. The state file
``<state>/cluster.json`` records pids, process start times (to detect pid reuse), ports and URLs.
Workers get ``IRBENCH_BROKER_URL`` and ``IRBENCH_DATA`` plus the launcher's environment and
optional ``--env-file`` (KEY=VALUE lines, the compose env_file format) for API keys; keys are never
written to the state file or logs by this launcher.

``up`` returns once everything is ready (the cluster keeps running; stop it with ``down``) or, with
``--foreground``, stays attached and tears everything down on Ctrl-C / SIGTERM. If anything fails or
is interrupted during start-up, what was already started is stopped before exiting.

``down`` sends SIGTERM (beat, then workers: warm shutdown re-queues unacked late-ack tasks; then
Redis, which flushes its AOF) and SIGKILL to what is still alive after ``--grace`` seconds.

Exit codes: 0 ok; 1 failure (start-up error, or ``status`` finding a dead process); 3 ``status``
with no cluster recorded.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path

if __package__:  # imported: deploy.local_cluster
    from deploy.processes import ProcInfo, free_port, is_alive, redis_ping, spawn, stop_processes
else:  # run as a script, python3 deploy/local_cluster.py: this folder is sys.path[0]
    from processes import ProcInfo, free_port, is_alive, redis_ping, spawn, stop_processes  # type: ignore[no-redef]

DEPLOY_DIR = Path(__file__).resolve().parent
STATE_FILE_NAME = "cluster.json"


def default_python() -> str:
    """This interpreter when it can import celery and irbench; else the repository's ``.venv`` one
    (so ``python3 deploy/local_cluster.py up`` works with the system Python after ``make demo``)."""
    if importlib.util.find_spec("celery") and importlib.util.find_spec("workers"):
        return sys.executable
    venv = DEPLOY_DIR.parent / ".venv" / "bin" / "python"
    return str(venv) if venv.is_file() else sys.executable


class ClusterError(RuntimeError):
    """Start-up or state problem; the message says what went wrong and what to do."""


class Interrupted(Exception):
    """Raised from the SIGTERM/SIGINT handler so start-up unwinds through the same cleanup path."""


@dataclass(frozen=True)
class ClusterConfig:
    """Everything ``up`` needs. Times in seconds; ``port=0`` picks a free loopback port."""

    state_dir: Path
    data_dir: Path
    workers: int = 2
    concurrency: int = 8
    port: int = 0
    host: str = "127.0.0.1"
    app: str = "orchestrator.distributed.worker_app"
    queues: str | None = None
    pool: str = "threads"
    beat: bool = False
    loglevel: str = "info"
    python: str = field(default_factory=default_python)
    redis_server: str = "redis-server"
    redis_conf: Path = DEPLOY_DIR / "redis.conf"
    extra_env: Mapping[str, str] = field(default_factory=dict)
    start_timeout_s: float = 60.0
    grace_s: float = 20.0


# ------------------------------------------------------------------------------------------ helpers


def read_env_file(path: Path) -> dict[str, str]:
    """KEY=VALUE lines (compose env_file format): blank lines and '#' comments skipped, optional
    matching quotes stripped. Values are never printed."""
    env: dict[str, str] = {}
    for n, line in enumerate(path.read_text().splitlines(), 1):
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        if line.startswith("export "):
            line = line[len("export ") :].lstrip()
        key, sep, value = line.partition("=")
        if not sep or not key.strip().replace("_", "a").isalnum():
            raise ClusterError(f"{path}:{n}: expected KEY=VALUE (e.g. OPENAI_API_KEY=sk-...), got a malformed line")
        value = value.strip()
        if len(value) >= 2 and value[0] == value[-1] and value[0] in "\"'":
            value = value[1:-1]
        env[key.strip()] = value
    return env


def _tail(path: str, n: int = 20) -> str:
    try:
        return "\n".join(Path(path).read_text(errors="replace").splitlines()[-n:])
    except OSError:
        return "(no log)"


def _wait_until(ready, proc: ProcInfo, what: str, deadline: float) -> None:
    while time.monotonic() < deadline:
        if ready():
            return
        if not is_alive(proc):
            raise ClusterError(f"{proc.name} exited during start-up ({what}); last log lines from {proc.log}:\n{_tail(proc.log)}")
        time.sleep(0.05)
    raise ClusterError(f"{proc.name} not ready after the start-up timeout ({what}); see {proc.log}:\n{_tail(proc.log)}")


def _log_contains(path: str, needle: str) -> bool:
    try:
        return needle in Path(path).read_text(errors="replace")
    except OSError:
        return False


# ------------------------------------------------------------------------------------------- state


def state_path(state_dir: Path) -> Path:
    return state_dir / STATE_FILE_NAME


def load_state(state_dir: Path) -> dict | None:
    p = state_path(state_dir)
    if not p.exists():
        return None
    return json.loads(p.read_text())


def state_procs(state: Mapping) -> list[ProcInfo]:
    return [ProcInfo(**p) for p in state["processes"]]


def _write_state(cfg: ClusterConfig, broker_url: str, port: int, procs: list[ProcInfo]) -> None:
    state = {
        "broker_url": broker_url,
        "redis_host": cfg.host,
        "redis_port": port,
        "data_dir": str(cfg.data_dir),
        "app": cfg.app,
        "queues": cfg.queues,
        "started_at_unix_s": time.time(),
        "launcher_pid": os.getpid(),
        "processes": [asdict(p) for p in procs],
    }
    tmp = state_path(cfg.state_dir).with_suffix(".json.tmp")
    tmp.write_text(json.dumps(state, indent=2))
    os.replace(tmp, state_path(cfg.state_dir))  # atomic: `status` never reads half a file


# ---------------------------------------------------------------------------------------------- up


def _celery_env(cfg: ClusterConfig, broker_url: str) -> dict[str, str]:
    env = dict(os.environ)
    env.update(cfg.extra_env)
    env["IRBENCH_BROKER_URL"] = broker_url
    env["IRBENCH_DATA"] = str(cfg.data_dir)
    env.setdefault("PYTHONUNBUFFERED", "1")
    return env


def _start_all(cfg: ClusterConfig, procs: list[ProcInfo]) -> tuple[str, int]:
    """Start Redis, workers and beat, appending each to ``procs`` as soon as it exists (so the
    caller can stop them if anything below raises). Returns (broker URL, port)."""
    exe = shutil.which(cfg.redis_server)
    if exe is None:
        raise ClusterError(f"{cfg.redis_server!r} not found on PATH; install Redis (apt-get install redis-server)")
    if not cfg.redis_conf.is_file():
        raise ClusterError(f"Redis config {cfg.redis_conf} not found; pass --redis-conf")
    check = subprocess.run([cfg.python, "-c", "import celery"], capture_output=True, text=True)
    if check.returncode != 0:
        raise ClusterError(
            f"{cfg.python} cannot import celery: run `make demo` once (it creates .venv) or "
            f"`pip install -e .`, or pass --python path/to/.venv/bin/python"
        )
    port = cfg.port or free_port(cfg.host)
    if redis_ping(cfg.host, port):
        raise ClusterError(f"something already answers Redis PING on {cfg.host}:{port}; choose another --port")
    redis_dir = cfg.state_dir / "redis"
    redis_dir.mkdir(parents=True, exist_ok=True)
    logs = cfg.state_dir / "logs"
    deadline = time.monotonic() + cfg.start_timeout_s
    # Command-line options override the file: loopback only, protected mode back on, our own dir.
    argv = [exe, str(cfg.redis_conf), "--port", str(port), "--bind", cfg.host, "--protected-mode", "yes",
            "--dir", str(redis_dir), "--logfile", str(logs / "redis.log")]
    redis_proc = spawn("redis", "redis", argv, logs / "redis.stdout.log", os.environ)
    procs.append(redis_proc)
    _wait_until(lambda: redis_ping(cfg.host, port), redis_proc, "Redis PING", deadline)
    broker_url = f"redis://{cfg.host}:{port}/0"

    env = _celery_env(cfg, broker_url)
    celery = [cfg.python, "-m", "celery", "-A", cfg.app, "-b", broker_url]
    workers: list[ProcInfo] = []
    for i in range(1, cfg.workers + 1):
        argv = [*celery, "worker", "-P", cfg.pool, "-c", str(cfg.concurrency), "-n", f"w{i}@%h",
                "--without-gossip", "--without-mingle", "-l", cfg.loglevel]
        if cfg.queues:
            argv += ["-Q", cfg.queues]
        w = spawn(f"worker-{i}", "worker", argv, logs / f"worker-{i}.log", env)
        procs.append(w)
        workers.append(w)
    if cfg.beat:
        argv = [*celery, "beat", "-l", cfg.loglevel, "-s", str(cfg.state_dir / "celerybeat-schedule"),
                "--pidfile", str(cfg.state_dir / "celerybeat.pid")]
        procs.append(spawn("beat", "beat", argv, logs / "beat.log", env))
    # Readiness: the worker's "<node> ready." line (INFO), beat's "beat: Starting..." line.
    # At a quieter log level those lines are absent, so only liveness is checked.
    verbose = cfg.loglevel.lower() in ("debug", "info")
    for p in procs[1:]:
        marker = " ready." if p.role == "worker" else "beat: Starting..."
        if verbose:
            _wait_until(lambda p=p, m=marker: _log_contains(p.log, m), p, f"waiting for {marker.strip()!r} in its log", deadline)
        elif not is_alive(p):
            raise ClusterError(f"{p.name} exited during start-up; see {p.log}:\n{_tail(p.log)}")
    return broker_url, port


def _install_interrupt_handlers() -> dict[int, object]:
    def handler(signum, frame):
        raise Interrupted(signal.Signals(signum).name)

    old = {}
    for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
        old[sig] = signal.signal(sig, handler)
    return old


def up(cfg: ClusterConfig, *, foreground: bool = False, out=sys.stdout) -> dict:
    """Start the cluster; on any error or interrupt stop what was started and re-raise.

    Returns the state dict written to ``<state>/cluster.json``."""
    cfg.state_dir.mkdir(parents=True, exist_ok=True)
    cfg.data_dir.mkdir(parents=True, exist_ok=True)
    existing = load_state(cfg.state_dir)
    if existing and any(is_alive(p) for p in state_procs(existing)):
        raise ClusterError(f"a cluster recorded in {state_path(cfg.state_dir)} is still running; run `down` first")
    procs: list[ProcInfo] = []
    old = _install_interrupt_handlers()
    try:
        broker_url, port = _start_all(cfg, procs)
        _write_state(cfg, broker_url, port, procs)
        state = load_state(cfg.state_dir)
        print(f"broker:  {broker_url}", file=out)
        print(f"data:    {cfg.data_dir}", file=out)
        print(f"workers: {cfg.workers} x {cfg.pool} -c {cfg.concurrency}" + (" + beat" if cfg.beat else ""), file=out)
        print(f"logs:    {cfg.state_dir / 'logs'}", file=out)
        print(f"export IRBENCH_BROKER_URL={broker_url}", file=out)
        print(f"irbench run CAMPAIGN.toml --executor celery --broker {broker_url} --data {cfg.data_dir}", file=out)
        if not foreground:
            print(f"stop with: {sys.executable} {Path(__file__).resolve()} down --state {cfg.state_dir}", file=out)
            return state
        print("running in the foreground; Ctrl-C stops everything", file=out)
        out.flush()
        while True:
            dead = [p.name for p in procs if not is_alive(p)]
            if dead:
                raise ClusterError(f"process(es) exited: {', '.join(dead)}; see {cfg.state_dir / 'logs'}")
            time.sleep(0.5)
    except BaseException:
        stop_processes(procs, cfg.grace_s)
        _clear_state(cfg.state_dir, procs)
        raise
    finally:
        for sig, h in old.items():
            signal.signal(sig, h)


def _clear_state(state_dir: Path, procs: Sequence[ProcInfo]) -> None:
    if not any(is_alive(p) for p in procs):
        state_path(state_dir).unlink(missing_ok=True)


# -------------------------------------------------------------------------------------- down, status


def down(state_dir: Path, grace_s: float = 20.0, out=sys.stdout) -> list[str]:
    """Stop every recorded process. Returns names that needed SIGKILL. No state → nothing to do."""
    state = load_state(state_dir)
    if state is None:
        print(f"no cluster recorded in {state_dir}", file=out)
        return []
    procs = state_procs(state)
    old = {s: signal.signal(s, signal.SIG_IGN) for s in (signal.SIGINT, signal.SIGHUP)}  # finish stopping
    try:
        killed = stop_processes(procs, grace_s)
    finally:
        for s, h in old.items():
            signal.signal(s, h)
    left = [p.name for p in procs if is_alive(p)]
    if left:
        raise ClusterError(f"still alive after SIGKILL: {', '.join(left)}")
    _clear_state(state_dir, procs)
    print(f"stopped {len(procs)} process(es)" + (f"; SIGKILLed: {', '.join(killed)}" if killed else ""), file=out)
    return killed


def status(state_dir: Path) -> dict | None:
    """Liveness of every recorded process and whether Redis answers PING; None if no cluster."""
    state = load_state(state_dir)
    if state is None:
        return None
    procs = [{"name": p.name, "role": p.role, "pid": p.pid, "alive": is_alive(p), "log": p.log} for p in state_procs(state)]
    return {
        "broker_url": state["broker_url"],
        "data_dir": state["data_dir"],
        "app": state["app"],
        "redis_ping": redis_ping(state["redis_host"], state["redis_port"]),
        "processes": procs,
        "all_alive": all(p["alive"] for p in procs),
    }


# ---------------------------------------------------------------------------------------------- CLI


def _parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(prog="local_cluster.py", description=__doc__.split("\n\n")[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    default_state = DEPLOY_DIR / ".state"

    def state_opt(p: argparse.ArgumentParser) -> None:
        p.add_argument("--state", type=Path, default=default_state, help=f"state directory (default {default_state})")

    u = sub.add_parser("up", help="start redis-server, N celery workers and optionally beat")
    state_opt(u)
    u.add_argument("--workers", type=int, default=2, help="worker processes (default 2)")
    u.add_argument("--concurrency", type=int, default=8, help="threads per worker, -c (default 8)")
    u.add_argument("--port", type=int, default=0, help="Redis port on 127.0.0.1 (default: a free port)")
    u.add_argument("--data", type=Path, default=os.environ.get("IRBENCH_DATA") or None,
                   help="shared dataset root (default $IRBENCH_DATA, else <state>/data)")
    u.add_argument("--beat", action="store_true", help="also start celery beat (exactly one per cluster)")
    u.add_argument("--app", default="orchestrator.distributed.worker_app", help="Celery app module (default orchestrator.distributed.worker_app)")
    u.add_argument("--queues", default=None, help="comma-separated queues for -Q (default: the app's default)")
    u.add_argument("--pool", default="threads", help="worker pool, -P (default threads)")
    u.add_argument("--loglevel", default="info")
    u.add_argument("--env-file", type=Path, default=None, help="KEY=VALUE file with API keys for the workers")
    u.add_argument("--python", default=default_python(),
                   help="interpreter that has celery and irbench installed (default: this one, else .venv's)")
    u.add_argument("--redis-server", default="redis-server")
    u.add_argument("--redis-conf", type=Path, default=DEPLOY_DIR / "redis.conf")
    u.add_argument("--start-timeout", type=float, default=60.0, help="seconds to wait for readiness (default 60)")
    u.add_argument("--grace", type=float, default=20.0, help="SIGTERM→SIGKILL grace on failure (default 20 s)")
    u.add_argument("--foreground", action="store_true", help="stay attached; Ctrl-C stops everything")

    d = sub.add_parser("down", help="stop everything (SIGTERM, SIGKILL after --grace)")
    state_opt(d)
    d.add_argument("--grace", type=float, default=20.0, help="seconds between SIGTERM and SIGKILL (default 20)")

    s = sub.add_parser("status", help="show which recorded processes are alive")
    state_opt(s)
    s.add_argument("--json", action="store_true")
    return ap


def main(argv: Sequence[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    state_dir = args.state.resolve()
    try:
        if args.cmd == "up":
            if args.workers < 0 or args.concurrency < 1:
                raise ClusterError("--workers must be >= 0 and --concurrency >= 1")
            cfg = ClusterConfig(
                state_dir=state_dir,
                data_dir=(args.data or state_dir / "data").resolve(),
                workers=args.workers, concurrency=args.concurrency, port=args.port, app=args.app,
                queues=args.queues, pool=args.pool, beat=args.beat, loglevel=args.loglevel, python=args.python,
                redis_server=args.redis_server, redis_conf=args.redis_conf.resolve(),
                extra_env=read_env_file(args.env_file) if args.env_file else {},
                start_timeout_s=args.start_timeout, grace_s=args.grace,
            )
            up(cfg, foreground=args.foreground)
            return 0
        if args.cmd == "down":
            down(state_dir, args.grace)
            return 0
        st = status(state_dir)
        if st is None:
            print(json.dumps(None) if args.json else f"no cluster recorded in {state_dir}")
            return 3
        if args.json:
            print(json.dumps(st, indent=2))
        else:
            print(f"broker {st['broker_url']}  redis PING: {'ok' if st['redis_ping'] else 'NO ANSWER'}  data {st['data_dir']}")
            for p in st["processes"]:
                print(f"  {p['name']:<10} pid {p['pid']:<8} {'alive' if p['alive'] else 'DEAD'}  {p['log']}")
        return 0 if st["all_alive"] and st["redis_ping"] else 1
    except Interrupted as e:
        print(f"interrupted ({e}); everything started was stopped", file=sys.stderr)
        return 130
    except KeyboardInterrupt:
        print("interrupted; everything started was stopped", file=sys.stderr)
        return 130
    except ClusterError as e:
        print(f"error: {e}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
