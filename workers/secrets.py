"""Masking configured secret values out of text before it is stored, logged or sent anywhere.

An endpoint may echo its API key back (in an error body, or inside a 200 answer); every text
that leaves a provider (answer, reasoning, finish reason, error message, the kept head of a
refused body) and every log event passes through ``mask_secrets`` with the keys configured for
that process. The marker is the same everywhere, so a test (or a user) can grep for it.
"""

from __future__ import annotations

from collections.abc import Iterable

SECRET_MARKER = "[redacted]"
MIN_SECRET_CHARS = 4  # shorter values would mask ordinary words; keys are far longer


def mask_secrets(text: str, secrets: Iterable[str | None]) -> str:
    """``text`` with every occurrence of each secret (>= ``MIN_SECRET_CHARS``) replaced by
    ``SECRET_MARKER``; longer secrets first, so one key containing another is masked whole."""
    for secret in sorted((s for s in secrets if s and len(s) >= MIN_SECRET_CHARS), key=len, reverse=True):
        if secret in text:
            text = text.replace(secret, SECRET_MARKER)
    return text


def mask_optional(text: str | None, secrets: Iterable[str | None]) -> str | None:
    """``mask_secrets`` for an optional text."""
    return None if text is None else mask_secrets(text, secrets)
