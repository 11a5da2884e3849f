"""``--data``: a directory or ``s3://BUCKET/PREFIX``, for every verb.

A bucket store is mirrored into a local cache (``IRBENCH_S3_CACHE``, default
``~/.cache/irbench/s3``) when the option is parsed, so every command works on a directory; what
the command writes goes back to the bucket every ``IRBENCH_S3_PUSH_S`` seconds and when the
process exits (``storage.objectstore.session``). The worker is the exception: it keeps its spool on its
own disk and uploads what it publishes (``--spool-dir``).
"""

from __future__ import annotations

import atexit
import os
import sys
from collections.abc import Mapping
from pathlib import Path, PosixPath
from typing import Annotated

import click
import typer

from storage.errors import IrbenchError
from storage.objectstore.location import is_store_url, parse_store_url
from storage.objectstore.mirror import SyncReport
from storage.objectstore.session import BucketOptions, BucketSession

__all__ = ["DataOpt", "MirrorPath", "bucket_of", "bucket_options", "store_root", "store_url", "worker_data_dir"]


class MirrorPath(PosixPath):
    """The local mirror of a bucket store; ``session`` is the process's BucketSession."""

    session: BucketSession | None = None


def bucket_options(environ: Mapping[str, str] | None = None) -> BucketOptions:
    """The bucket options the environment gives (cache folder, push interval)."""
    env = os.environ if environ is None else environ
    cache = env.get("IRBENCH_S3_CACHE") or str(Path(env.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "irbench" / "s3")
    try:
        push_s = float(env.get("IRBENCH_S3_PUSH_S") or 5.0)
    except ValueError:
        raise click.BadParameter(f"IRBENCH_S3_PUSH_S={env.get('IRBENCH_S3_PUSH_S')!r} is not a number of seconds") from None
    return BucketOptions(cache_dir=Path(cache), push_interval_s=push_s)


def _said(kind: str, report: SyncReport) -> None:
    print(f"{kind} {report.files_moved} files ({report.bytes_moved / 2**20:.1f} MiB)"
          + (f", {report.files_deleted} deleted" if report.files_deleted else ""), file=sys.stderr)


def store_root(value: object) -> Path:
    """``--data``'s value as a directory: itself, or a bucket store's mirror, pulled now and
    pushed when the process exits."""
    text = str(value)
    if not is_store_url(text):
        return Path(text)
    try:
        session = BucketSession(parse_store_url(text), bucket_options(), on_sync=_said,
                                on_error=lambda exc: print(f"warning: {exc}", file=sys.stderr)).open()
    except IrbenchError as exc:
        raise click.BadParameter(str(exc)) from None
    atexit.register(_close, session)  # every exit of the CLI process but a SIGKILL
    path = MirrorPath(session.root)
    path.session = session
    return path


def _close(session: BucketSession) -> None:
    try:
        session.close()
    except IrbenchError as exc:
        print(f"warning: {exc}; what this command wrote stays in {session.root} and goes with the next "
              f"command on {session.url}", file=sys.stderr)


def worker_data_dir(value: str) -> str:
    """A worker's ``--data``: a bucket store's URL as given (checked), else the absolute path."""
    if is_store_url(value):
        return parse_store_url(value).url
    return str(Path(value).resolve())


def bucket_of(path: Path) -> BucketSession | None:
    """The BucketSession behind ``path`` (a ``--data`` value), or None for a plain directory."""
    return getattr(path, "session", None)


def store_url(path: Path) -> str:
    """What workers are told the store is: the bucket's URL, or the directory's absolute path."""
    session = bucket_of(path)
    return session.url if session is not None else str(Path(path).resolve())


DataOpt = Annotated[
    Path, typer.Option("--data", envvar="IRBENCH_DATA", parser=store_root,
                       help="Dataset root: a directory or s3://BUCKET/PREFIX (runs are stored under DATA/runs/; or IRBENCH_DATA).")
]
