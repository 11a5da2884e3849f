"""A throwaway local cluster for the distributed benchmarks: redis-server + N ``celery worker``
processes + the simulator in its own process, all stopped on exit (also on Ctrl-C / SIGTERM).

    with interrupt_as_keyboard(), BenchCluster(sim_toml, workers=3, worker_env={...}) as c:
        c.redis.url, c.sim.base_url, c.sim_stats()
        c.restart_workers(count=2)      # same Redis and simulator, a fresh set of workers

Redis and worker launchers come from ``deploy/`` (the same ones the distributed tests use):
a private redis-server on a free loopback port, workers each in their own process group.
Also: ``write_campaign`` (a campaign TOML over generated prompts) and ``sliding_window_max``.
"""

from __future__ import annotations

import contextlib
import json
import signal
import sys
import urllib.request
from collections.abc import Iterator, Mapping
from pathlib import Path
from types import TracebackType

import numpy as np

REPO = Path(__file__).resolve().parent.parent
if str(REPO) not in sys.path:  # `python bench/x.py` puts bench/ first, not the repo
    sys.path.insert(0, str(REPO))

from simulator.server import SubprocessSimulator, start_subprocess  # noqa: E402
from deploy.celery_workers import CeleryWorkers, WorkerCommand  # noqa: E402
from deploy.redis_server import RedisServer  # noqa: E402


@contextlib.contextmanager
def interrupt_as_keyboard() -> Iterator[None]:
    """Turn SIGTERM into KeyboardInterrupt while inside, so ``with`` blocks clean up on kill."""

    def raise_kbd(signum: int, frame: object) -> None:
        raise KeyboardInterrupt(f"signal {signum}")

    previous = signal.signal(signal.SIGTERM, raise_kbd)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)


class BenchCluster:
    """Start redis-server, ``workers`` celery workers (``concurrency`` threads each, env
    ``worker_env`` on top of ours) and the simulator for ``sim_toml``; ``close()`` stops them all.

    Every start happens inside ``__enter__``'s cleanup scope: a failure half-way stops what
    was already running.
    """

    def __init__(
        self,
        sim_toml: Path,
        *,
        workers: int = 3,
        concurrency: int = 4,
        worker_env: Mapping[str, str] | None = None,
        worker_log_level: str = "INFO",  # readiness is read from the "ready." INFO line
    ) -> None:
        self.sim_toml = sim_toml
        self.worker_count = workers
        self.concurrency = concurrency
        self.worker_env = dict(worker_env or {})
        self.worker_log_level = worker_log_level
        self._stack = contextlib.ExitStack()
        self.redis: RedisServer | None = None
        self.sim: SubprocessSimulator | None = None
        self.workers: CeleryWorkers | None = None

    @property
    def url(self) -> str:
        assert self.redis is not None
        return self.redis.url

    def _start_workers(self, count: int, app: str | None = None, queues: str | None = None) -> None:
        default = WorkerCommand()
        command = WorkerCommand(app=default.app if app is None else app, queues=default.queues if queues is None else queues,
                                log_level=self.worker_log_level)
        self.workers = CeleryWorkers(
            self.url, count=count, concurrency=self.concurrency, command=command, env=self.worker_env, start_timeout_s=60.0,
        )
        self.workers.start()

    def restart_workers(self, count: int, *, app: str | None = None, queues: str | None = None) -> None:
        """Stop the current workers (if any) and start ``count`` new ones on the same Redis
        (``app``/``queues``: another Celery app module and its queues, e.g. ``bench.bare_celery``)."""
        if self.workers is not None:
            self.workers.close()
            self.workers = None
        try:
            self._start_workers(count, app, queues)
        except BaseException:
            if self.workers is not None:
                self.workers.close()
                self.workers = None
            raise

    def sim_stats(self) -> dict:
        """The simulator's ``/_stats`` models map (arrival times on the simulator's monotonic clock)."""
        assert self.sim is not None
        with urllib.request.urlopen(f"{self.sim.base_url}/_stats", timeout=10) as resp:
            return json.load(resp)["models"]

    def sim_reset(self) -> None:
        assert self.sim is not None
        req = urllib.request.Request(f"{self.sim.base_url}/_reset", method="POST", data=b"")
        with urllib.request.urlopen(req, timeout=10):
            pass

    def __enter__(self) -> BenchCluster:
        try:
            self.redis = self._stack.enter_context(RedisServer())
            # 60 s: at load average 25 on 2 cores the simulator's imports alone took over 20 s
            self.sim = self._stack.enter_context(start_subprocess(self.sim_toml, startup_timeout_s=60.0))
            self._stack.callback(self._close_workers)
            if self.worker_count > 0:
                self._start_workers(self.worker_count)
        except BaseException:
            self._stack.close()
            raise
        return self

    def _close_workers(self) -> None:
        if self.workers is not None:
            self.workers.close()
            self.workers = None

    def close(self) -> None:
        self._stack.close()

    def __exit__(self, et: type[BaseException] | None, e: BaseException | None, tb: TracebackType | None) -> None:
        self.close()


PROMPT = "// @rule RULE:r{i} priority=1\n// @step STEP:s{i}\nPrompt number {i}: do the thing {{ x }}.\n"


def _toml_value(v: object) -> str:
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, (int, float)):
        return repr(v)
    return json.dumps(v)


DEFAULTS = {"requests_per_minute": "none", "connect_timeout_s": 5, "read_timeout_s": 30, "total_timeout_s": 30}
RETRY = {"max_attempts": 3, "backoff_base_s": 0.05, "backoff_cap_s": 0.2}


def write_campaign(
    directory: Path, name: str, base_url: str, models: Mapping[str, Mapping[str, object]], *, prompts: int, runs: int,
    defaults: Mapping[str, object] | None = None, retry: Mapping[str, object] | None = None,
) -> Path:
    """A campaign TOML (plus ``prompts`` generated prompt files) crossing every model with every
    prompt ``runs`` times; per-model fields (limits, timeouts) override the defaults.
    ``defaults``/``retry``: fields over ``DEFAULTS``/``RETRY`` (the tests' cluster uses shorter
    timeouts and a concurrency cap)."""
    pdir = directory / "prompts"
    pdir.mkdir(parents=True, exist_ok=True)
    for i in range(prompts):
        (pdir / f"p{i:03d}.txt").write_text(PROMPT.format(i=i), encoding="utf-8")
    lines = [f'name = "{name}"', f"runs = {runs}", "[corpus]", 'paths = ["prompts"]',
             "[endpoints.sim]", f'base_url = "{base_url}"', "[defaults]", 'endpoint = "sim"']
    lines += [f"{k} = {_toml_value(v)}" for k, v in {**DEFAULTS, **(defaults or {})}.items()]
    for model, fields in models.items():
        lines.append(f"[models.{model}]")
        lines += [f"{k} = {_toml_value(v)}" for k, v in fields.items()]
    lines.append("[retry]")
    lines += [f"{k} = {_toml_value(v)}" for k, v in {**RETRY, **(retry or {})}.items()]
    path = directory / f"{name}.toml"
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return path


def sliding_window_max(arrivals_s: list[float], window_s: float) -> int:
    """Most arrivals in any half-open window ``(t - window_s, t]`` (vectorised)."""
    t = np.sort(np.asarray(arrivals_s, dtype=float))
    if t.size == 0:
        return 0
    first_inside = np.searchsorted(t, t - window_s, side="right")
    return int((np.arange(t.size) - first_inside + 1).max())
