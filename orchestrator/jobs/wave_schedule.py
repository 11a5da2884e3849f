"""Scheduled measurement waves on the workers: a beat tick starts each due wave.

``irbench schedule CAMPAIGN --every 7d`` stores a ``workers.state.wave_schedules.WaveSchedule``
in Redis. Beat sends ``irbench.wave_schedule_tick`` every ``tick_s``; the tick takes the due
schedules (each moved to its next period in the same Redis script, so two beats start a wave
once) and starts, for each, a detached ``python -m orchestrator.jobs.scheduled_wave`` process:
it runs the campaign as a new wave on the celery executor with the analysis on completion,
then compares the wave with the one before (``irbench waves``) and logs a warning per changed
model. The tick itself returns at once: a wave lasts longer than any message should stay
unacknowledged, and a redelivered tick finds nothing due.
"""

from __future__ import annotations

import datetime as dt
import os
import subprocess
import sys
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import structlog

from workers.state.wave_schedules import DueWave, WaveSchedules

TICK_TASK = "irbench.wave_schedule_tick"
BEAT_ENTRY = "irbench-wave-schedule"
log = structlog.get_logger("irbench.schedule")

#: Starts a wave's process: (argv, log file, extra environment) -> nothing; a detached
#: ``subprocess.Popen`` in a worker. The broker URL goes in the environment (it may hold a
#: password, and argv is visible to every user of the machine).
Launcher = Callable[[Sequence[str], Path, Mapping[str, str]], None]


def wave_log_path(due: DueWave) -> Path:
    """Where a scheduled wave's process writes its output: ``DATA/schedule/<campaign>/<due>.log``."""
    stamp = dt.datetime.fromtimestamp(due.due_s, dt.timezone.utc).strftime("%Y%m%dT%H%M%SZ")
    return Path(due.schedule.data) / "schedule" / due.schedule.campaign / f"{stamp}.log"


def wave_argv(due: DueWave) -> list[str]:
    """The command that measures one due wave and compares it with the wave before."""
    s = due.schedule
    label = "scheduled " + dt.datetime.fromtimestamp(due.due_s, dt.timezone.utc).isoformat(timespec="seconds")
    return [sys.executable, "-m", "orchestrator.jobs.scheduled_wave", "--campaign-file", s.campaign_path,
            "--data", s.data, "--label", label]


def launch_detached(argv: Sequence[str], log_file: Path, env: Mapping[str, str]) -> None:
    """Start ``argv`` in its own session with ``env`` added to this process's environment,
    output appended to ``log_file``; do not wait."""
    log_file.parent.mkdir(parents=True, exist_ok=True)
    with log_file.open("ab") as out:
        subprocess.Popen(list(argv), stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                         start_new_session=True, close_fds=True, env={**os.environ, **env})


@dataclass(frozen=True)
class TickResult:
    """What one tick started: the campaigns and their log files."""

    started: tuple[str, ...]
    logs: tuple[str, ...]


def run_tick(schedules: WaveSchedules, now_s: float, broker_url: str, launch: Launcher = launch_detached) -> TickResult:
    """Start every wave due at ``now_s`` (Unix seconds) through ``launch``, on ``broker_url``."""
    started, logs = [], []
    for due in schedules.take_due(now_s):
        path = wave_log_path(due)
        try:
            launch(wave_argv(due), path, {"IRBENCH_BROKER_URL": broker_url})
        except OSError as exc:  # the period is taken: the next one tries again, and the log says why
            log.error("scheduled_wave_not_started", campaign=due.schedule.campaign, error=str(exc))
            continue
        log.info("scheduled_wave_started", campaign=due.schedule.campaign, log_file=str(path))
        started.append(due.schedule.campaign)
        logs.append(str(path))
    return TickResult(tuple(started), tuple(logs))


def register_wave_schedule(app: Any, *, tick_s: float = 60.0) -> None:
    """Register the tick task on a Celery app and add it to the app's beat schedule (every
    ``tick_s`` seconds; a tick's message expires after one tick)."""
    from workers.state.connect import sync_redis

    @app.task(name=TICK_TASK, ignore_result=True, shared=False)
    def wave_schedule_tick() -> dict:
        client = sync_redis(app.conf.broker_url)
        try:
            result = run_tick(WaveSchedules(client), time.time(), app.conf.broker_url)
            return {"started": list(result.started), "logs": list(result.logs)}
        finally:
            client.close()

    schedule = dict(app.conf.beat_schedule or {})
    schedule[BEAT_ENTRY] = {"task": TICK_TASK, "schedule": float(tick_s), "options": {"expires": float(tick_s)}}
    app.conf.beat_schedule = schedule
