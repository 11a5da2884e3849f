"""One in-process orchestrator at a time per campaign and data directory.

Two ``irbench run --executor local`` on the same campaign would each plan every run not yet
stored and call the endpoint for it: the runs they overlap on are paid for twice. So the local
executor holds an exclusive ``flock`` on ``DATA/campaigns/<campaign>.lock`` while it plans and
executes; a second one says who holds it and waits, then plans what is left (usually nothing)
and counts the runs stored meanwhile as executed by another orchestrator. The lock lives as long
as its holder's open file: a killed orchestrator leaves it free. It covers the orchestrators of
one machine (or of a filesystem whose ``flock`` is shared, such as NFSv4); a bucket store's
mirror is a directory per machine, and the bucket mirror does not upload ``.lock`` files.
"""

from __future__ import annotations

import contextlib
import datetime as dt
import fcntl
import os
from collections.abc import Callable, Iterator
from pathlib import Path

from storage.clock import utc_now

__all__ = ["LOCK_DIR", "campaign_lock"]

LOCK_DIR = "campaigns"  # beside the ad-hoc campaigns' provenance files (``orchestrator.campaign.adhoc``)


def _holder(fd: int) -> str:
    """What the holder wrote: its pid and start time, or nothing yet (it writes right after locking)."""
    try:
        text = os.pread(fd, 200, 0).decode("utf-8", "replace").split()
    except OSError:
        return ""
    if len(text) == 2 and text[0].isdigit():
        return f" (pid {text[0]}, since {text[1]})"
    return ""


@contextlib.contextmanager
def campaign_lock(root: Path, campaign: str, on_wait: Callable[[str], None]) -> Iterator[bool]:
    """Hold ``campaign``'s lock under ``root`` for the body; yields True when it had to wait for
    another orchestrator first. ``on_wait`` gets one line when waiting starts and one when it ends."""
    folder = root / LOCK_DIR
    folder.mkdir(parents=True, exist_ok=True)
    fd = os.open(folder / f"{campaign}.lock", os.O_RDWR | os.O_CREAT, 0o644)
    try:
        waited = False
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            waited = True
            on_wait(f"another irbench run{_holder(fd)} is executing campaign {campaign} on {root}; this one waits "
                    "for it to end, then runs what is left (Ctrl-C leaves; nothing is lost)")
            fcntl.flock(fd, fcntl.LOCK_EX)  # the wait: woken when the holder exits or releases it
            on_wait(f"the other irbench run on campaign {campaign} ended; running what is left")
        started = utc_now().astimezone(dt.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")
        os.ftruncate(fd, 0)
        os.pwrite(fd, f"{os.getpid()} {started}\n".encode(), 0)
        yield waited
        os.ftruncate(fd, 0)  # still held: a later waiter never reads this holder's pid as its own
    finally:
        os.close(fd)  # closing releases the flock
