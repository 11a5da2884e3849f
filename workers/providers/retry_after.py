"""How long a provider or gateway asks us to wait, from the response headers.

Providers and gateways say it differently; every form is read (seconds, never negative):

=================================  ==========================================================
``retry-after-ms``                 milliseconds (OpenAI, Azure OpenAI)
``retry-after``                    delta-seconds or an HTTP-date (RFC 9110)
``llm_provider-retry-after``       LiteLLM's pass-through of the upstream's ``retry-after``
``x-ratelimit-reset-requests``     when the request / token window resets, as a Go duration
``x-ratelimit-reset-tokens``       ("1s", "6m0s", "20ms", "1h2m3.5s") or plain seconds (OpenAI)
=================================  ==========================================================

The first three say "retry after"; they are taken in that order of precision. The reset
headers say when a window refills, so they are used only when none of those is present, and
then only for a window reported exhausted (``x-ratelimit-remaining-<kind>: 0``) when the
remaining counts are sent, else the longest: we never come back before the server said.
"""

from __future__ import annotations

import datetime as dt
import email.utils
import math
import re
from collections.abc import Mapping

_GO_PART = re.compile(r"(\d+(?:\.\d*)?|\.\d+)(ns|us|µs|μs|ms|s|m|h)")
_GO_UNIT_S = {"ns": 1e-9, "us": 1e-6, "µs": 1e-6, "μs": 1e-6, "ms": 1e-3, "s": 1.0, "m": 60.0, "h": 3600.0}
_DIRECT = ("retry-after-ms", "retry-after", "llm_provider-retry-after")
_RESET_KINDS = ("requests", "tokens")


def parse_retry_after(value: str | None, now: dt.datetime) -> float | None:
    """Seconds to wait from a ``Retry-After`` header (delta-seconds or HTTP-date); ``None`` if
    absent or unparseable; never negative."""
    if value is None or not value.strip():
        return None
    text = value.strip()
    seconds = _number(text)
    if seconds is not None:
        return seconds
    try:
        when = email.utils.parsedate_to_datetime(text)
    except (TypeError, ValueError, IndexError):
        return None
    if when.tzinfo is None:
        when = when.replace(tzinfo=dt.timezone.utc)
    return max(0.0, (when - now).total_seconds())


def parse_go_duration(value: str | None) -> float | None:
    """Seconds in a Go ``time.Duration`` string ("6m0s", "20ms", "1.5s") or a plain number of
    seconds; ``None`` when absent or not of that form."""
    if value is None or not value.strip():
        return None
    text = value.strip()
    seconds = _number(text)
    if seconds is not None:
        return seconds
    if len(text) > 64:  # hostile header: never scan an unbounded string
        return None
    pos, total = 0, 0.0
    for match in _GO_PART.finditer(text):
        if match.start() != pos:
            return None
        total += float(match.group(1)) * _GO_UNIT_S[match.group(2)]
        pos = match.end()
    return total if pos == len(text) and pos > 0 else None


def retry_after_from_headers(headers: Mapping[str, str], now: dt.datetime) -> float | None:
    """Seconds to wait before retrying, from any of the header forms above; ``None`` if none
    is present and parseable. ``headers`` must look names up case-insensitively
    (``httpx.Headers`` does)."""
    for name in _DIRECT:
        raw = headers.get(name)
        seconds = parse_go_duration(raw) if name != "retry-after-ms" else _ms(raw)
        if name == "retry-after" and seconds is None:
            seconds = parse_retry_after(raw, now)
        if seconds is not None:
            return seconds
    parsed = {kind: parse_go_duration(headers.get(f"x-ratelimit-reset-{kind}")) for kind in _RESET_KINDS}
    resets = {kind: s for kind, s in parsed.items() if s is not None}
    if not resets:
        return None
    exhausted = [s for kind, s in resets.items() if (headers.get(f"x-ratelimit-remaining-{kind}") or "").strip() == "0"]
    return max(exhausted or resets.values())


def _number(text: str) -> float | None:
    """A finite number, clamped at 0; ``None`` for anything else (NaN and inf included)."""
    try:
        value = float(text)
    except ValueError:
        return None
    return max(0.0, value) if math.isfinite(value) else None


def _ms(value: str | None) -> float | None:
    seconds = _number(value.strip()) if value is not None else None
    return None if seconds is None else seconds / 1000.0
