"""Text as the provider clients store it: valid Unicode, secrets masked, bounded; and the
parsing helpers of a 2xx answer (outcome, a leading ``<think>`` block, integer fields)."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from storage.records import ERROR_TEXT_MAX_CHARS, SERVED_IDENTITY_MAX_CHARS, Outcome
from workers.secrets import MIN_SECRET_CHARS, mask_secrets

#: How much of a served-identity value is read: a 100k-character ``model`` costs no more than this.
IDENTITY_SCAN_CHARS = 16 * SERVED_IDENTITY_MAX_CHARS


def storable(text: str) -> str:
    """``text`` as valid Unicode: a lone UTF-16 surrogate (a JSON ``\\ud800`` escape without its
    pair, which ``json`` decodes as is) becomes U+FFFD. No UTF-8 store can hold one: a single
    such answer would fail the whole Parquet batch it is written in, and again on every resume."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return text.encode("utf-16", "surrogatepass").decode("utf-16", "replace")
    return text


def clip(text: str, secrets: Iterable[str | None] = ()) -> str:
    """Redact secrets, then bound the text to ``ERROR_TEXT_MAX_CHARS`` (valid Unicode, ``storable``)."""
    text = storable(mask_secrets(text, secrets))
    if len(text) > ERROR_TEXT_MAX_CHARS:
        text = text[: ERROR_TEXT_MAX_CHARS - 1] + "…"
    return text


def identity_text(value: Any, secrets: Iterable[str | None] = ()) -> str | None:
    """A served-identity field as stored: a string only (anything else is None), valid Unicode,
    control characters dropped, secrets masked, at most ``SERVED_IDENTITY_MAX_CHARS``; "" -> None.

    Characters are dropped before masking, since a key interleaved with control characters is whole
    only once they are gone, and masking precedes the final cut, which could leave part of a key.
    Only the first ``IDENTITY_SCAN_CHARS`` are read (the cost per answer stays bounded); when the
    value is longer, what could be the start of a key at the end of that scan is dropped too."""
    if not isinstance(value, str):
        return None
    keys = tuple(s for s in secrets if s and len(s) >= MIN_SECRET_CHARS)
    text = storable(value[:IDENTITY_SCAN_CHARS])
    if not text.isprintable():
        text = "".join(ch for ch in text if ch.isprintable())
    if len(value) > IDENTITY_SCAN_CHARS and keys:
        text = text[: max(0, len(text) - max(map(len, keys)) + 1)]
    return mask_secrets(text, keys)[:SERVED_IDENTITY_MAX_CHARS] or None


def answer_outcome(finish_reason: str | None, answer: str) -> Outcome:
    """Classify a 2xx answer (failures.md): the provider saying the budget ran out wins, even
    over empty content; otherwise no answer text is ``empty``."""
    if finish_reason == "length":
        return Outcome.TRUNCATED
    return Outcome.EMPTY if not answer.strip() else Outcome.OK


def split_think(content: str) -> tuple[str, str]:
    """Split a leading ``<think>…</think>`` block out of ``content``: ``(answer, reasoning)``.
    An unterminated leading ``<think>`` makes the whole content reasoning."""
    stripped = content.lstrip()
    if not stripped.startswith("<think>"):
        return content, ""
    inner = stripped[len("<think>") :]
    end = inner.find("</think>")
    if end < 0:
        return "", inner.strip()
    return inner[end + len("</think>") :].lstrip(), inner[:end].strip()


def int_or_none(value: Any) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) else None
