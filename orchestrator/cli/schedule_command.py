"""``irbench schedule``: re-measure a campaign as a new wave every period, on the workers.

    irbench schedule examples/demo.toml --every 7d --broker redis://HOST:6379/0 --data /shared/data
    irbench schedule --list
    irbench schedule --remove demo

The schedule lives in Redis (``workers.state.wave_schedules``); a beat process
(``celery -A orchestrator.distributed.worker_app beat``) ticks it and a worker starts each due
wave (``orchestrator.jobs.wave_schedule``). Paths are stored as given, made absolute: the
workers must see the campaign file and the store at the same paths.
"""

from __future__ import annotations

import datetime as dt
import os
import sys
import time
from pathlib import Path
from typing import Annotated, Optional

import typer
from rich.console import Console
from rich.table import Table

from orchestrator.cli.shell import broker_url
from orchestrator.cli.user_errors import fail
from workers.errors import ConfigError, IrbenchError


def _when(unix_s: float) -> str:
    return dt.datetime.fromtimestamp(unix_s, dt.timezone.utc).isoformat(timespec="seconds")


def _table(schedules: list) -> Table:
    t = Table(title="wave schedules", title_justify="left")
    for col in ("campaign", "every", "next wave (UTC)", "campaign file", "data"):
        t.add_column(col)
    for s in schedules:
        t.add_row(s.campaign, f"{s.every_s:g} s", _when(s.next_due_s), s.campaign_path, s.data)
    return t


def schedule_command(
    campaign: Annotated[Optional[Path], typer.Argument(help="Campaign TOML file to re-measure on schedule.",
                                                       exists=True, dir_okay=False)] = None,
    every: Annotated[Optional[str], typer.Option("--every", help="Period: 7d, 12h, 30m or seconds.")] = None,
    data: Annotated[Path, typer.Option("--data", envvar="IRBENCH_DATA", help="Dataset root, as the workers see it.")] = Path("data"),
    broker: Annotated[Optional[str], typer.Option("--broker", envvar="IRBENCH_BROKER_URL",
                                                  help="Redis URL of the Celery broker (or IRBENCH_BROKER_URL).")] = None,
    list_: Annotated[bool, typer.Option("--list", help="List the schedules.")] = False,
    remove: Annotated[Optional[str], typer.Option("--remove", help="Remove the schedule of this campaign name.")] = None,
) -> None:
    """Start a new measurement wave of CAMPAIGN every --every on the workers (beat must run).

    Example: irbench schedule examples/demo.toml --every 7d --broker redis://127.0.0.1:6379/0 --data data/
    """
    from redis.exceptions import RedisError

    from orchestrator.distributed.worker_checks import redacted_url

    from workers.state.connect import sync_redis
    from workers.state.wave_schedules import WaveSchedules

    url = ""
    try:
        url = broker_url(broker, None)
        chosen = sum([campaign is not None, list_, remove is not None])
        if chosen != 1:
            raise ConfigError("give one of: CAMPAIGN --every PERIOD, --list, --remove NAME")
        client = sync_redis(url)
        try:
            schedules = WaveSchedules(client)
            _act(schedules, campaign, every, data, url, list_=list_, remove=remove)
        finally:
            client.close()
    except IrbenchError as exc:
        fail(exc)
    except (RedisError, OSError) as exc:
        fail(f"cannot reach the broker at {redacted_url(url)} ({type(exc).__name__}); start Redis or pass --broker")


def _act(schedules, campaign: Path | None, every: str | None, data: Path, url: str, *, list_: bool,
         remove: str | None) -> None:
    from orchestrator.campaign.spec import load_campaign
    from workers.state.wave_schedules import WaveSchedule, parse_every

    # paths are long: a pipe gets $COLUMNS when set, else 200 columns
    out = Console(width=None if sys.stdout.isatty() or os.environ.get("COLUMNS") else 200)
    if list_:
        found = schedules.all()
        out.print(_table(found) if found else "no wave schedules")
        return
    if remove is not None:
        if not schedules.remove(remove):
            raise ConfigError(f"no wave schedule for campaign {remove!r} (see irbench schedule --list)")
        out.print(f"campaign {remove}: schedule removed")
        return
    assert campaign is not None
    if every is None:
        raise ConfigError("give the period with --every, e.g. --every 7d")
    every_s = parse_every(every)
    spec = load_campaign(campaign)
    s = WaveSchedule(campaign=spec.name, campaign_path=str(campaign.resolve()), data=str(data.resolve()),
                     every_s=every_s, next_due_s=time.time() + every_s)
    schedules.put(s)
    out.print(f"campaign {spec.name}: a new wave every {every_s:g} s, the next at {_when(s.next_due_s)} UTC "
              "(a beat process must run: celery -A orchestrator.distributed.worker_app beat)")
