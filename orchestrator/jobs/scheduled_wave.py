"""One scheduled wave, as a process of its own (started by ``orchestrator.jobs.wave_schedule``):

1. ``irbench run FILE --new-wave --wave-label LABEL --executor celery --analyze``: every planned
   run measured again as the campaign's next wave, analysed when complete;
2. ``irbench waves --campaign NAME --json``: that wave against the one before; each changed model
   is logged as a warning (``scheduled_wave_changed``); the report's "Over time" section shows
   the same comparison from the store.

Each step is the command a user would type, so a scheduled wave behaves exactly as a manual one
(exit codes, summaries, provenance). The process's output is the log file the tick chose.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

import structlog

from workers.logs import configure_logging

log = structlog.get_logger("irbench.schedule")

#: Runs one command: argv -> (exit code, stdout); ``subprocess.run`` in production.
Runner = Callable[[Sequence[str]], tuple[int, str]]

#: ``irbench run`` exit codes that still leave a wave to compare (runs failed, some or all).
_RUN_FINISHED = (0, 3, 4)


def _run(argv: Sequence[str]) -> tuple[int, str]:
    done = subprocess.run(list(argv), stdout=subprocess.PIPE, stderr=None, text=True, check=False)
    sys.stdout.write(done.stdout)
    sys.stdout.flush()
    return done.returncode, done.stdout


@dataclass(frozen=True)
class ScheduledWave:
    """The wave to measure: the campaign file, its name, the store and the label (the broker is
    ``IRBENCH_BROKER_URL``, which both commands read)."""

    campaign_file: str
    campaign: str
    data: str
    label: str


def measure_and_compare(wave: ScheduledWave, run: Runner = _run) -> int:
    """Run the wave, then compare it with the previous one. Returns the process exit code (the
    run's, or the comparison's when the run finished)."""
    cli = [sys.executable, "-m", "orchestrator.cli.app"]
    code, _ = run([*cli, "run", wave.campaign_file, "--new-wave", "--wave-label", wave.label, "--executor", "celery",
                   "--data", wave.data, "--analyze"])
    if code not in _RUN_FINISHED:
        log.error("scheduled_wave_failed", campaign=wave.campaign, exit_code=code)
        return code
    code, out = run([*cli, "waves", "--data", wave.data, "--campaign", wave.campaign, "--json"])
    if code != 0:
        log.error("scheduled_wave_not_compared", campaign=wave.campaign, exit_code=code)
        return code
    report = json.loads(out)
    for c in report.get("campaigns", []):
        for m in c.get("models", []):
            if m.get("changed"):
                log.warning("scheduled_wave_changed", campaign=c.get("campaign"), model=m.get("model"),
                            from_wave=c.get("from_wave"), to_wave=c.get("to_wave"), q_value=m.get("q_value"),
                            effect=m.get("effect"))
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    from orchestrator.campaign.spec import load_campaign

    p = argparse.ArgumentParser(prog="scheduled_wave")
    p.add_argument("--campaign-file", required=True)
    p.add_argument("--data", required=True)
    p.add_argument("--label", required=True)
    a = p.parse_args(argv)
    configure_logging(level="INFO")
    name = load_campaign(Path(a.campaign_file)).name
    return measure_and_compare(ScheduledWave(a.campaign_file, name, a.data, a.label))


if __name__ == "__main__":
    sys.exit(main())
