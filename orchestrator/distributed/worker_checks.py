"""Checks the CLI makes around a distributed campaign, each a small function of its own.

* ``check_broker_url``: a ``redis://``/``rediss://``/``unix://`` URL with a valid port, else a
  one-line ``ConfigError``.
* ``wait_for_redis``: ping Redis until it answers or ``wait_s`` passes, reporting the seconds
  left through ``on_wait`` (the CLI draws a countdown on stderr), then a ``ConfigError`` that
  says how to start Redis or fix the URL.
* ``store_problems``: live workers (``workers.state.presence``) whose store is not ours, named with
  their directory and the command that fixes it.
* ``WorkerWatch``: a daemon thread during the campaign that warns (within ``warn_after_s``,
  default 10 s) when no live worker consumes the queue, with the command to start one, and when
  a worker with another store appears.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TextIO
from urllib.parse import urlsplit

import redis

from workers.state.connect import RedisTimeouts, sync_redis
from redis.exceptions import RedisError

from storage.objectstore.location import is_store_url
from storage.parquet.store_marker import ensure_store_id
from workers.errors import ConfigError
from workers.state.presence import WorkerPresence, read_presence

BROKER_SCHEMES = ("redis", "rediss", "unix")


def check_broker_url(url: str) -> str:
    """``url`` if Redis can be addressed by it; ``ConfigError`` naming the problem otherwise."""
    example = "pass e.g. --broker redis://127.0.0.1:6379/0"
    try:
        parts = urlsplit(url)
        parts.port  # noqa: B018 - raises ValueError when out of range or not a number
    except ValueError as exc:
        raise ConfigError(f"--broker {url!r} is not a valid URL ({exc}); {example}") from None
    if parts.scheme not in BROKER_SCHEMES:
        raise ConfigError(f"--broker {url!r}: scheme must be one of {', '.join(BROKER_SCHEMES)}; {example}")
    if parts.scheme != "unix" and not parts.hostname:
        raise ConfigError(f"--broker {url!r} names no host; {example}")
    if parts.port == 0:
        raise ConfigError(f"--broker {url!r}: port 0 is not a port; {example}")
    return url


def redacted_url(url: str) -> str:
    """``url`` without a password (a Redis URL may carry one)."""
    parts = urlsplit(url)
    if parts.password is None:
        return url
    netloc = parts.netloc.replace(f":{parts.password}@", ":***@")
    return parts._replace(netloc=netloc).geturl()


def wait_for_redis(
    url: str,
    *,
    wait_s: float,
    on_wait: Callable[[float, str], None] | None = None,
    poll_s: float = 0.5,
    clock: Callable[[], float] = time.monotonic,
    sleep: Callable[[float], None] = time.sleep,
) -> redis.Redis:
    """A client for ``url`` once Redis answers PING; ``ConfigError`` after ``wait_s`` seconds.

    ``on_wait(seconds_left, reason)`` is called before each retry.
    """
    check_broker_url(url)
    client = sync_redis(url, RedisTimeouts(socket_timeout_s=2.0, connect_timeout_s=min(2.0, max(wait_s, 0.2)), retries=0))
    deadline = clock() + wait_s
    while True:
        try:
            client.ping()
            return client
        except RedisError as exc:
            reason = str(exc).split("\n")[0] or type(exc).__name__
            left = deadline - clock()
            if left <= 0:
                raise ConfigError(
                    f"cannot reach Redis at {redacted_url(url)} after {wait_s:g} s ({reason}); start it "
                    "(redis-server, or `docker compose -f deploy/compose.yaml up -d redis`) or fix --broker / "
                    "IRBENCH_BROKER_URL"
                ) from None
            if on_wait is not None:
                on_wait(left, reason)
            sleep(min(poll_s, max(left, 0.0)))


def _same_store(worker: WorkerPresence, root: Path, store_id: str) -> bool:
    if worker.data_dir is None:  # writes where each task says: our path
        return True
    if worker.store_id is not None:
        return worker.store_id == store_id
    return Path(worker.data_dir).resolve() == root.resolve()


def worker_command(broker_url: str, root: Path, queue: str, store_id: str = "") -> str:
    """The command that starts a worker on this store (a bucket store by its URL)."""
    queue_opt = "" if queue == "irbench" else f" --queues {queue}"
    data = store_id if is_store_url(store_id) else root.resolve()
    return f"irbench worker --broker {redacted_url(broker_url)} --data {data}{queue_opt}"


def store_problems(workers: list[WorkerPresence], root: Path, store_id: str, broker_url: str, queue: str) -> list[str]:
    """One line per live worker on ``queue`` whose store is not ``root`` (id ``store_id``)."""
    return [
        f"worker {w.name} (pid {w.pid} on {w.host}) stores runs under {w.data_dir}, not this campaign's store "
        f"{store_id if is_store_url(store_id) else root.resolve()}: its runs would never appear here; stop it and start "
        f"it as `{worker_command(broker_url, root, queue, store_id)}`"
        for w in workers
        if queue in w.queues and not _same_store(w, root, store_id)
    ]


def consuming(workers: list[WorkerPresence], queue: str) -> list[WorkerPresence]:
    return [w for w in workers if queue in w.queues]


@dataclass
class WorkerWatch:
    """Warns through ``warn`` while a campaign runs; ``start()`` / ``stop()``."""

    client: redis.Redis
    broker_url: str
    root: Path
    store_id: str
    queue: str
    warn: Callable[[str], None]
    warn_after_s: float = 10.0
    repeat_s: float = 60.0
    poll_s: float = 1.0

    def __post_init__(self) -> None:
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="irbench-worker-watch", daemon=True)
        self.warnings: list[str] = []

    def _say(self, text: str) -> None:
        self.warnings.append(text)
        self.warn(text)

    def _loop(self) -> None:
        started = time.monotonic()
        last_none_warning = None
        named: set[str] = set()
        while not self._stop.wait(self.poll_s):
            try:
                workers = read_presence(self.client)
            except RedisError:
                continue  # Redis is restarting: the executor already says so
            for line in store_problems(workers, self.root, self.store_id, self.broker_url, self.queue):
                name = line.split(" ", 2)[1]
                if name not in named:
                    named.add(name)
                    self._say(line)
            now = time.monotonic()
            if consuming(workers, self.queue):
                last_none_warning = None
                continue
            due = now - started >= self.warn_after_s and (
                last_none_warning is None or now - last_none_warning >= self.repeat_s
            )
            if due:
                last_none_warning = now
                self._say(
                    f"no worker is consuming queue {self.queue!r} on {redacted_url(self.broker_url)}; the runs wait "
                    f"in the queue: start one with `{worker_command(self.broker_url, self.root, self.queue, self.store_id)}`"
                )

    def start(self) -> WorkerWatch:
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(2.0)


class Countdown:
    """An ``on_wait`` for ``wait_for_redis`` that redraws one status line (``\\r``) on
    ``stream`` with the seconds left; ``end()`` erases it (only if something was drawn)."""

    def __init__(self, stream: TextIO) -> None:
        self._stream = stream
        self._width = 0

    def __call__(self, left: float, reason: str) -> None:
        text = f"\rwaiting for Redis ({reason[:60]}): {left:4.1f} s left "
        self._width = max(self._width, len(text))
        self._stream.write(text)
        self._stream.flush()

    def end(self) -> None:
        if self._width:
            self._stream.write("\r" + " " * self._width + "\r")
            self._stream.flush()


def wait_with_countdown(url: str, wait_s: float, stream: TextIO) -> redis.Redis:
    """``wait_for_redis`` drawing its countdown on ``stream``."""
    countdown = Countdown(stream)
    try:
        return wait_for_redis(url, wait_s=wait_s, on_wait=countdown)
    finally:
        countdown.end()


def celery_preflight(url: str, root: Path, queue: str, *, wait_s: float, stream: TextIO,
                     presence_wait_s: float = 2.5, store_url: str | None = None) -> tuple[redis.Redis, str]:
    """Before a distributed campaign: Redis reachable (countdown on ``stream``), the store's id
    created, and no live worker on ``queue`` writing to another store (``ConfigError`` naming
    each). Workers whose marker is not read yet get ``presence_wait_s`` to re-publish. A bucket
    store (``store_url``, ``root`` its mirror) is identified by its URL."""
    client = wait_with_countdown(url, wait_s, stream)
    store_id = store_url or ensure_store_id(root)
    workers = read_presence(client)
    if any(w.data_dir is not None and w.store_id is None for w in consuming(workers, queue)):
        time.sleep(presence_wait_s)
        workers = read_presence(client)
    problems = store_problems(workers, root, store_id, url, queue)
    if problems:
        raise ConfigError("workers write to another store", problems)
    return client, store_id
