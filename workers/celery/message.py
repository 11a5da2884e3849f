"""The body of a several-runs message (``irbench.runs``): what its runs share, sent once.

The runs of one message belong to one model and campaign, so most of their ``RunTask`` fields
are equal, and several are runs of the same prompt, whose rendered ``user_message`` (~4 KB, the
bulk of a task) is the same text. Sent as a list of whole tasks, a 16-run message would be ~90 KB
that kombu decodes, re-encodes into its ``unacked`` hash and stores, on the worker's consumer
thread, per message (a fifth of a worker's CPU in a profile). Here a message is

    {"common": {field: value, ...},        # fields equal in every run
     "texts": [user_message, ...],         # each distinct prompt text once
     "runs": [{field: value, ..., "user_message": <index into texts>}, ...]}

and :func:`decode_runs` gives back exactly the ``RunTask``s :func:`encode_runs` was given
(JSON only, no secret: the tasks never hold one).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from workers.runtask import RunTask

_TEXT = "user_message"
_MUTABLE = (dict, list, set)  # validated again per run: a task must not share one with another


def encode_runs(tasks: Sequence[RunTask]) -> dict[str, Any]:
    """The JSON body of a message carrying ``tasks`` (one or more)."""
    dumps = [t.model_dump(mode="json") for t in tasks]
    first, rest = dumps[0], dumps[1:]
    common = {k: v for k, v in first.items() if k != _TEXT and all(d[k] == v for d in rest)}
    texts: list[str] = []
    index: dict[str, int] = {}
    runs = []
    for d in dumps:
        delta = {k: v for k, v in d.items() if k not in common}
        text = delta[_TEXT]
        if text not in index:
            index[text] = len(texts)
            texts.append(text)
        delta[_TEXT] = index[text]
        runs.append(delta)
    return {"common": common, "texts": texts, "runs": runs}


def decode_runs(body: Mapping[str, Any] | Sequence[Mapping[str, Any]]) -> list[RunTask]:
    """The ``RunTask``s of a message body (also a plain list of task dicts, the older form).
    Raises ``pydantic.ValidationError`` for a body that does not describe valid tasks. The
    ``common`` fields are validated with the first run; the others reuse what that gave for
    every immutable value (frozen sub-models, strings, dates): 33 -> 13 us per run of a 64-run
    message on a worker's task thread, measured in isolation over 100 messages."""
    if not isinstance(body, Mapping):
        return [RunTask.model_validate(t) for t in body]
    common, texts = body["common"], body["texts"]
    tasks: list[RunTask] = []
    shared: Mapping[str, Any] = common
    for run in body["runs"]:
        task = RunTask.model_validate({**shared, **run, _TEXT: texts[run[_TEXT]]})
        if not tasks:  # the common fields, validated once: the next runs reuse the immutable ones
            shared = {k: v if isinstance(got := getattr(task, k), _MUTABLE) else got for k, v in common.items()}
        tasks.append(task)
    return tasks
