"""The run filter every listing shares, parsed from (and written back to) URL query strings."""

from __future__ import annotations

import datetime as dt
from collections.abc import Mapping
from typing import Any
from urllib.parse import urlencode

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from storage.errors import IrbenchError

#: Filter fields in URL order; each is an equality filter except dates (inclusive) and ``q``.
FILTER_FIELDS = ("campaign", "panel", "model", "prompt_sha256", "outcome", "date_from",
                 "date_to", "q")
MAX_QUERY_CHARS = 500


class QueryError(IrbenchError, ValueError):
    """A query parameter does not parse; the message names it (answered as HTTP 400)."""


class RunQuery(BaseModel):
    """Filters (all optional, combined with AND) and one page.

    date_from/date_to: inclusive measurement dates; q: case-insensitive substring of the
    response text or of the prompt's text (the ``prompts`` table); limit/offset: the page (limit is capped by the caller's configuration).
    """

    model_config = ConfigDict(frozen=True, extra="forbid")

    campaign: str | None = None
    panel: str | None = None
    model: str | None = None
    prompt_sha256: str | None = None
    outcome: str | None = None
    date_from: dt.date | None = None
    date_to: dt.date | None = None
    q: str | None = Field(default=None, max_length=MAX_QUERY_CHARS)
    limit: int = Field(default=50, ge=1)
    offset: int = Field(default=0, ge=0)

    @field_validator("*", mode="before")
    @classmethod
    def _blank_is_none(cls, value: Any) -> Any:
        return None if isinstance(value, str) and value.strip() == "" else value

    @classmethod
    def from_params(cls, params: Mapping[str, str], *, default_limit: int,
                    max_limit: int, ignore: tuple[str, ...] = ()) -> RunQuery:
        """Parse URL parameters; unknown names are an error unless listed in ``ignore``.
        ``limit`` defaults to ``default_limit`` and is capped at ``max_limit``."""
        values = {k: v for k, v in params.items() if k not in ignore}
        values.setdefault("limit", str(default_limit))
        try:
            parsed = cls.model_validate(values)
        except ValidationError as exc:
            err = exc.errors()[0]
            where = ".".join(str(p) for p in err["loc"]) or "query"
            raise QueryError(f"bad query parameter {where!r}: {err['msg']}") from None
        if parsed.limit > max_limit:
            parsed = parsed.model_copy(update={"limit": max_limit})
        return parsed

    def where(self) -> tuple[str, list[Any]]:
        """SQL ``WHERE`` clause (or "") over the ``runs`` table and its bound parameters."""
        terms: list[str] = []
        params: list[Any] = []
        for name in ("campaign", "panel", "model", "prompt_sha256", "outcome"):
            value = getattr(self, name)
            if value is not None:
                terms.append(f"{name} = ?")
                params.append(value)
        if self.date_from is not None:
            terms.append("measurement_date >= ?")
            params.append(self.date_from)
        if self.date_to is not None:
            terms.append("measurement_date <= ?")
            params.append(self.date_to)
        if self.q:  # the answer, or the prompt the run was asked
            terms.append("(contains(search_text, ?) OR prompt_sha256 IN (SELECT prompt_sha256 "
                         "FROM prompts WHERE contains(search_text, ?)))")
            params += [self.q.lower()] * 2
        return ("WHERE " + " AND ".join(terms) if terms else ""), params

    def filters(self) -> dict[str, str]:
        """The filters that are set, as URL parameter strings (no page)."""
        out = {}
        for name in FILTER_FIELDS:
            value = getattr(self, name)
            if value is not None:
                out[name] = value.isoformat() if isinstance(value, dt.date) else str(value)
        return out

    def url(self, path: str, **changes: Any) -> str:
        """``path`` with this query's filters and page, ``changes`` applied (None removes)."""
        params: dict[str, Any] = {**self.filters(), "limit": self.limit, "offset": self.offset}
        params.update(changes)
        params = {k: v for k, v in params.items() if v is not None and v != ""}
        if params.get("offset") == 0:
            params.pop("offset")
        return path + ("?" + urlencode(params) if params else "")
