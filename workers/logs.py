"""structlog configuration: JSON lines when not on a terminal, secrets redacted before rendering.

Call ``configure_logging`` once per process (the CLI and the Celery worker boot do); bind
``campaign``/``run_id`` with ``structlog.contextvars.bound_contextvars`` around work.
"""

from __future__ import annotations

import logging
import re
import sys
from collections.abc import Iterable, MutableMapping
from typing import Any, TextIO

import structlog

from workers.secrets import MIN_SECRET_CHARS, SECRET_MARKER, mask_secrets

REDACTED = SECRET_MARKER
_SECRET_KEY_NAMES = re.compile(r"(api[_-]?key|secret|password|passwd|token|authorization|credential)", re.I)
# Shapes of common credentials; run ids (32 hex) deliberately do not match.
_SECRET_SHAPES = re.compile(
    r"(sk-[A-Za-z0-9_\-]{12,}|Bearer\s+[A-Za-z0-9._\-~+/]{8,}=*|ghp_[A-Za-z0-9]{20,}|xox[abpr]-[A-Za-z0-9-]{10,}"
    r"|AKIA[0-9A-Z]{16}|hf_[A-Za-z0-9]{20,})"
)
_COUNT_KEYS = re.compile(r"(_tokens|tokens_per_minute|max_tokens|token_count)$")


class Redactor:
    """A structlog processor that removes credentials from every event.

    Redacts (1) values of keys whose name says secret (except token *counts*), (2) any string
    containing a known secret value (``add_secret``), (3) substrings shaped like common keys.
    """

    __slots__ = ("_secrets",)

    def __init__(self, secrets: Iterable[str] = ()) -> None:
        self._secrets: set[str] = {s for s in secrets if s}

    def add_secret(self, value: str | None) -> None:
        if value and len(value) >= MIN_SECRET_CHARS:
            self._secrets.add(value)

    @property
    def secrets(self) -> frozenset[str]:
        return frozenset(self._secrets)

    def scrub(self, text: str) -> str:
        return _SECRET_SHAPES.sub(REDACTED, mask_secrets(text, self._secrets))

    def _clean(self, key: str, value: Any) -> Any:
        if isinstance(key, str) and _SECRET_KEY_NAMES.search(key) and not _COUNT_KEYS.search(key):
            return REDACTED if value not in (None, "") else value
        if isinstance(value, str):
            return self.scrub(value)
        if isinstance(value, dict):
            return {k: self._clean(k, v) for k, v in value.items()}
        if isinstance(value, (list, tuple)):
            return type(value)(self._clean("", v) for v in value)
        if isinstance(value, BaseException):
            return self.scrub(repr(value))
        return value

    def __call__(self, logger: Any, method: str, event: MutableMapping[str, Any]) -> MutableMapping[str, Any]:
        return {k: self._clean(k, v) for k, v in event.items()}


def register_log_secret(value: str | None) -> None:
    """Add ``value`` to the redactor of this process's current structlog configuration (a key
    read by a worker from its environment); a no-op when logging was configured without one."""
    for processor in structlog.get_config().get("processors", ()):
        if isinstance(processor, Redactor):
            processor.add_secret(value)


def configure_logging(
    *, json: bool | None = None, level: str = "INFO", stream: TextIO | None = None, redactor: Redactor | None = None
) -> Redactor:
    """Configure structlog for this process; returns the redactor so callers can register keys."""
    stream = stream or sys.stderr
    redactor = redactor or Redactor()
    as_json = (not stream.isatty()) if json is None else json
    renderer: Any = structlog.processors.JSONRenderer() if as_json else structlog.dev.ConsoleRenderer(colors=False)
    structlog.configure(
        processors=[
            structlog.contextvars.merge_contextvars,
            structlog.processors.add_log_level,
            structlog.processors.TimeStamper(fmt="iso", utc=True),
            structlog.processors.format_exc_info,
            redactor,
            renderer,
        ],
        wrapper_class=structlog.make_filtering_bound_logger(getattr(logging, level.upper(), logging.INFO)),
        logger_factory=structlog.PrintLoggerFactory(file=stream),
        cache_logger_on_first_use=False,
    )
    # Libraries log through stdlib logging; keep them quiet and never let them print headers.
    for name in ("httpx", "httpcore", "uvicorn", "uvicorn.error", "uvicorn.access"):
        logging.getLogger(name).setLevel(logging.WARNING)
    return redactor
