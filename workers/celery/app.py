"""The Celery application: JSON only, late acks, no result backend, threads pool.

Start a worker (the deploy files assume exactly this; ``orchestrator.distributed.worker_app`` is this app
plus the analysis-job tasks, which may import ``analysis`` and so do not live in ``workers``)::

    IRBENCH_BROKER_URL=redis://host:6379/0 IRBENCH_DATA=/data \\
        celery -A orchestrator.distributed.worker_app worker -P threads -c 16 -Q irbench

Library code calls :func:`make_celery_app`; nothing is built or connects at import.

Delivery is at-least-once (``task_acks_late`` + ``task_reject_on_worker_lost``), so the task is
idempotent by run_id (``workers.celery.tasks``). **Visibility timeout rule**: an unacked message is
re-delivered after ``visibility_timeout_s``, so it must exceed the longest fetch-to-ack time:
``visibility_timeout_s > max_attempts * max(total_timeout_s) + (max_attempts - 1) * backoff_cap_s
+ max deferral countdown (IRBENCH_MAX_DEFER_S) + margin`` per run, times the rounds a worker
needs for the runs its messages hold (threads × runs per message / run slots) when every call
meets its worst case. With the defaults (4 attempts × 600 s + 3 × 60 s + 30 s = 2610 s per run)
the default 10800 s covers 4 such rounds; auto-sized messages (up to 64 runs, 8 threads, 64
slots) can hold 8. A redelivery inside that window is harmless anyway: the copy's runs are
done, claimed by the live worker (skipped) or not started (claimed by whichever worker gets to
them first), and a lost message is re-dispatched by the orchestrator's reconciler.
"""

from __future__ import annotations

import logging
import os
import sys
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any

from celery import Celery
from celery import signals as celery_signals
from celery.signals import worker_init, worker_process_init, worker_ready, worker_shutdown

from workers.celery import DEFAULT_QUEUE, DEFAULT_THREADS
from workers.state import presence
from workers.celery.availability_tasks import (
    beat_settings_from_env,
    configure_availability_beat,
    register_availability_tasks,
)
from workers.celery.runtime import RuntimeHolder, WorkerSettings
from workers.celery.tasks import register_tasks
from workers.celery.transport import transport_for
from workers.cpu_policy import apply_cpu_policy
from workers.logs import configure_logging

#: Registers more tasks on an app (e.g. ``orchestrator.jobs.analysis_tasks.register_analysis_tasks``).
Registrar = Callable[[Celery], None]


#: Publishing retries a broker blip before the publish fails (backoff 0.2 s, +0.5 s, at most 2 s).
PUBLISH_RETRY_POLICY = {"max_retries": 5, "interval_start": 0.2, "interval_step": 0.5, "interval_max": 2.0}


def _celery_conf(broker_url: str, settings: WorkerSettings, visibility_timeout_s: float, default_queue: str) -> dict[str, Any]:
    """The app's configuration: JSON only, late acks, one prefetch, no result backend."""
    return dict(
        task_serializer="json",
        accept_content=["json"],  # pickle refused
        result_accept_content=["json"],
        task_acks_late=True,
        task_reject_on_worker_lost=True,
        task_acks_on_failure_or_timeout=True,
        worker_prefetch_multiplier=1,
        task_ignore_result=True,
        result_backend=None,
        worker_pool="threads",
        broker_transport=transport_for(broker_url),  # one reused client per channel (transport.py)
        task_default_queue=default_queue,
        # ack_flush_s: longest delay of a gathered ack (workers.celery.transport)
        # kombu scans for expired unacked messages every unacked_restore_interval (10 s) but acts on
        # every unacked_restore_throttle-th scan only (10: ~100 s); 1 makes redelivery come within
        # visibility_timeout_s + 10 s (one ZRANGE per worker per 10 s)
        broker_transport_options={"visibility_timeout": visibility_timeout_s, "unacked_restore_throttle": 1,
                                  "ack_flush_s": settings.ack_flush_s},
        broker_connection_retry=True,
        broker_connection_retry_on_startup=True,
        broker_connection_max_retries=None,  # a Redis restart must not stop a worker
        task_publish_retry=True,
        task_publish_retry_policy=dict(PUBLISH_RETRY_POLICY),
        worker_hijack_root_logger=False,
        worker_redirect_stdouts_level="INFO",  # structlog lines land in the worker log as INFO
        # On broker connection loss running runs continue: their late ack may be lost, and the
        # redelivery is a no-op (claim / done marker). Celery warns about this default; harmless.
        worker_cancel_long_running_tasks_on_connection_loss=False,
        worker_send_task_events=False,
        task_send_sent_event=False,
    )


def _on_worker_init(app: Celery, holder: RuntimeHolder) -> None:
    """Size the runtime by the worker's ``-c`` and apply the CPU policy when a worker of ``app`` starts."""

    def init(sender: Any = None, **_: Any) -> None:
        if getattr(sender, "app", None) is not app:
            return
        if getattr(sender, "concurrency", None):  # the worker's -c: its run slots by default
            holder.set_threads(sender.concurrency)
        # a worker process only (not a runtime made in a test or bench process), before its
        # pool and event-loop threads exist: they inherit the policy
        apply_cpu_policy(holder.settings.cpu_policy)

    worker_init.connect(init, weak=False)


def make_celery_app(
    broker_url: str,
    *,
    visibility_timeout_s: float | None = None,
    default_queue: str = DEFAULT_QUEUE,
    worker_settings: WorkerSettings | None = None,
    environ: Mapping[str, str] | None = None,
    registrars: Sequence[Registrar] = (),
) -> Celery:
    """A configured app with the ``irbench.run`` and ``irbench.availability_check`` tasks
    registered, plus whatever ``registrars`` add. Connects lazily.

    ``worker_settings``: what a worker process started from this app uses (default: read from
    the ``IRBENCH_*`` environment on first task, see ``WorkerSettings``).
    ``visibility_timeout_s``: the broker's redelivery horizon for an unacknowledged message
    (default: ``worker_settings``' or env ``IRBENCH_VISIBILITY_TIMEOUT_S``, else 10800 s; see
    the rule above).
    ``environ`` (default ``os.environ``): when it sets ``IRBENCH_AVAILABILITY_TARGETS`` (a JSON
    file of check targets), the availability check joins ``beat_schedule`` every
    ``IRBENCH_AVAILABILITY_INTERVAL_S`` (default 86400 s) writing under ``IRBENCH_DATA``
    (``workers.celery.availability_tasks.beat_settings_from_env``; a bad file is a ConfigError).
    """
    env = os.environ if environ is None else environ
    transport = worker_settings or WorkerSettings.from_env(broker_url, env)  # its broker-side knobs
    if visibility_timeout_s is None:
        visibility_timeout_s = transport.visibility_timeout_s
    app = Celery("irbench", broker=broker_url, backend=None, set_as_current=False)
    app.conf.update(_celery_conf(broker_url, transport, visibility_timeout_s, default_queue))
    holder = RuntimeHolder(broker_url, worker_settings)
    app.irbench_runtime = holder  # per-process resources, created lazily
    _on_worker_init(app, holder)
    register_tasks(app, holder)
    register_availability_tasks(app)
    for register in registrars:
        register(app)
    beat = beat_settings_from_env(env)
    if beat is not None:
        targets, data_dir, interval_s = beat
        configure_availability_beat(app, targets, data_dir, interval_s=interval_s)
    return app


class _CurrentStderr:
    """Writes to whatever ``sys.stderr`` is now: Celery redirects it into the worker log only
    after the init signals fire, so binding the stream object at init would lose the lines."""

    def write(self, text: str) -> int:
        return sys.stderr.write(text)

    def flush(self) -> None:
        sys.stderr.flush()

    def isatty(self) -> bool:
        return False


@dataclass(frozen=True)
class WorkerCommand:
    """The ``celery worker`` command line of one worker process: ``concurrency`` threads (``-c``),
    the ``queues`` it consumes (``-Q``), its Celery ``loglevel`` and node ``hostname`` (``-n``;
    ``None``: Celery's default name)."""

    concurrency: int = DEFAULT_THREADS
    queues: tuple[str, ...] = (DEFAULT_QUEUE,)
    loglevel: str = "INFO"
    hostname: str | None = None

    def argv(self) -> list[str]:
        """The arguments after ``celery -A <app>``."""
        argv = ["worker", "-P", "threads", "-c", str(self.concurrency), "-Q", ",".join(self.queues),
                "--loglevel", self.loglevel, "--without-gossip", "--without-mingle"]
        if self.hostname:
            argv += ["-n", self.hostname]
        return argv


def start_worker(
    broker_url: str,
    *,
    command: WorkerCommand = WorkerCommand(),
    data_dir: str | None = None,
    settings: WorkerSettings | None = None,
    registrars: Sequence[Registrar] = (),
) -> None:
    """Run a worker in this process until it is stopped (``irbench worker``); blocks.

    Equivalent to ``celery -A orchestrator.distributed.worker_app worker -P threads -c N -Q queues`` with
    ``IRBENCH_BROKER_URL=broker_url`` (and ``IRBENCH_DATA=data_dir`` when given).
    """
    settings = settings or WorkerSettings.from_env(broker_url)
    if data_dir is not None:
        settings = replace(settings, data_dir=data_dir)
    worker_app = make_celery_app(broker_url, worker_settings=settings, registrars=registrars)
    worker_app.worker_main(argv=command.argv())


#: Celery's per-task lines ("Task … received", "Task … succeeded in …"): two log records per run
#: that say less than irbench's own ``run_finished`` line; at 100k runs they are ~6 % of a worker's CPU.
PER_TASK_LOGGERS = ("celery.worker.strategy", "celery.app.trace")


def _configure_worker_logging(sender: Any = None, **_: Any) -> None:
    holder = getattr(getattr(sender, "app", None), "irbench_runtime", None)
    settings = holder.settings if holder is not None else WorkerSettings(redis_url="")  # not one of ours: defaults
    configure_logging(level=settings.log_level, json=True, stream=_CurrentStderr())  # type: ignore[arg-type]  # write/flush/isatty: all of TextIO that PrintLogger uses
    task_level = settings.celery_task_log_level.upper()
    for name in PER_TASK_LOGGERS:  # task failures are WARNING/ERROR and still logged
        logging.getLogger(name).setLevel(task_level)


def _open_store(sender: Any = None, **_: Any) -> None:
    """A worker given its store (``IRBENCH_DATA``: a directory or a bucket) opens its spool at
    start: what killed writers left on the same spool — records, and the calls they had in
    flight as ``worker_died`` — is published (and, for a bucket, uploaded) before any new run."""
    holder = getattr(getattr(sender, "app", None), "irbench_runtime", None)
    if holder is not None and holder.settings.data_dir:
        holder.get().spool(holder.settings.data_dir)


def _close_runtime(sender: Any = None, **_: Any) -> None:
    holder = getattr(getattr(sender, "app", None), "irbench_runtime", None)
    if holder is not None:
        holder.close()


# worker_process_init fires in prefork children; worker_init in the (threads-pool) worker itself.
worker_init.connect(_configure_worker_logging, weak=False, dispatch_uid="irbench-logging-init")
worker_process_init.connect(_configure_worker_logging, weak=False, dispatch_uid="irbench-logging-proc")
worker_shutdown.connect(_close_runtime, weak=False, dispatch_uid="irbench-close-runtime")
worker_ready.connect(_open_store, weak=False, dispatch_uid="irbench-open-store")
presence.install(celery_signals, lambda app: app.irbench_runtime.settings.data_dir,
                 lambda app: app.irbench_runtime.slots(), lambda app: app.irbench_runtime.settings.presence_interval_s)
