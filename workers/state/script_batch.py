"""``ScriptBatch``: the calls of several Lua scripts in ONE ``EVALSHA``.

A worker's Redis batch (``workers.celery.tasks._flush``) sends, per run, its claim, its
done marker and the release of its last permit: three script calls. In a redis-py pipeline each
call costs the worker ~17 us of CPU (command packing, per-command bookkeeping, reply parsing)
and redis-server a script invocation (bench/worker_path.py measures the batch). This module wraps the
scripts in one script that takes every call's KEYS and ARGV flattened and runs them in order,
so a batch of any size is one command, one reply and one script invocation.

Each call keeps its own semantics: its reply is what the script alone would return, and an
error in one (a Lua ``error`` or a failing ``redis.call``) is caught (``pcall``) and returned as
that call's error reply, so it neither stops the calls after it nor changes their replies — as
in a non-transactional pipeline. Writes are not rolled back in either case. The whole batch
runs atomically (a script), which no caller relies on.

Layout of one ``EVALSHA``: no KEYS, and one argument: the JSON array of the calls, each
``[script index (1-based), [keys...], [args...]]``, every key and argument a string as redis-py
would have sent it. Reply: one element per call. One JSON string instead of every call's keys
and arguments as command arguments because redis-py packs each argument in Python (an
``Encoder.encode`` call and a generator step): ~0.5 us an argument, ~180 us for a batch of 16
runs' claims and finishes (~350 arguments), against ~45 us for ``json.dumps`` of the same
(``timeit``, in isolation). The keys are not declared in KEYS: like the scripts
it runs (campaign and limiter keys under different hash tags), this needs a single Redis, not a
cluster.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

import redis

from workers.state.campaign_keys import Call

_RUNNER = """
local out = {}
for _, call in ipairs(cjson.decode(ARGV[1])) do
  local ok, res = pcall(FNS[call[1]], call[2], call[3])
  if not ok then
    if type(res) == 'table' and res.err then res = res else res = {err = tostring(res)} end
  elseif res == nil then
    res = false  -- a nil would end the reply's array here
  end
  out[#out + 1] = res
end
return out
"""


def batch_source(sources: Sequence[str]) -> str:
    """One script running the given scripts' calls (``FNS[i]`` is ``sources[i - 1]``, with its
    own KEYS and ARGV as parameters)."""
    fns = "\n".join(f"FNS[{i}] = function(KEYS, ARGV)\n{src}\nend" for i, src in enumerate(sources, 1))
    return f"local FNS = {{}}\n{fns}\n{_RUNNER}"


class ScriptBatch:
    """Runs calls of ``scripts`` in one ``EVALSHA``: :meth:`run` on ``client``, :meth:`arun`
    on ``async_client`` (the same Redis).

    ``client``: a sync ``redis.Redis``; ``async_client``: a ``redis.asyncio.Redis`` or None.
    ``scripts``: the ``Script`` objects whose calls this batches (matched by SHA, so another
    client's registration of the same source is covered).
    """

    def __init__(self, client: redis.Redis, scripts: Sequence[Any], async_client: Any = None) -> None:
        self._index = {s.sha: i for i, s in enumerate(scripts, 1)}
        source = batch_source([s.script for s in scripts])
        self._script = client.register_script(source)
        self._ascript = None if async_client is None else async_client.register_script(source)

    def covers(self, calls: Sequence[Call]) -> bool:
        """Whether every call's script is one this batch runs."""
        return all(script.sha in self._index for script, _, _ in calls)

    def run(self, calls: Sequence[Call]) -> list[Any]:
        """Each call's reply, in order; a call that failed has its ``redis.ResponseError`` as
        its reply. A server that lost the script (restart, flush) gets it loaded again by
        ``Script`` and nothing runs twice (the failed ``EVALSHA`` ran nothing)."""
        if not calls:
            return []
        keys, argv = self._flatten(calls)
        return self._checked(calls, self._script(keys=keys, args=argv))

    async def arun(self, calls: Sequence[Call]) -> list[Any]:
        """:meth:`run` on the async client, from its event loop."""
        if not calls:
            return []
        if self._ascript is None:
            raise RuntimeError("this ScriptBatch has no async client")
        keys, argv = self._flatten(calls)
        return self._checked(calls, await self._ascript(keys=keys, args=argv))

    def _flatten(self, calls: Sequence[Call]) -> tuple[list[str], list[str]]:
        """No KEYS; ARGV: the calls as one JSON string (see the module's docstring)."""
        index = self._index
        return [], [json.dumps([[index[script.sha], [x if x.__class__ is str else _arg(x) for x in k],
                                 [x if x.__class__ is str else _arg(x) for x in a]] for script, k, a in calls],
                               ensure_ascii=False, separators=(",", ":"))]

    @staticmethod
    def _checked(calls: Sequence[Call], replies: Any) -> list[Any]:
        if not isinstance(replies, list) or len(replies) != len(calls):
            raise redis.ResponseError(f"script batch: {len(calls)} calls but the reply is {replies!r:.200}")
        return replies


_AS_SENT = {int: int.__repr__, float: float.__repr__}  # the common non-str arguments, by exact type


def _arg(value: Any) -> str:
    """``value`` as the string redis-py would have sent (``redis._parsers.encoders.Encoder``)."""
    convert = _AS_SENT.get(value.__class__)
    if convert is not None:
        return convert(value)
    if isinstance(value, str):  # a str subclass
        return str(value)
    if isinstance(value, bytes | memoryview):  # JSON carries text only
        try:
            return bytes(value).decode("utf-8")
        except UnicodeDecodeError:
            raise redis.DataError(f"a script call's argument {bytes(value)[:40]!r} is not UTF-8 text: "
                                  "a batched call takes text, integers and floats") from None
    if isinstance(value, bool):  # redis-py refuses these too
        raise redis.DataError(f"invalid input of type bool ({value!r}) in a script call: convert to a str or int first")
    if isinstance(value, int | float):  # a subclass (an IntEnum member): its number
        return repr(int(value)) if isinstance(value, int) else repr(float(value))
    raise redis.DataError(f"invalid input of type {type(value).__name__} in a script call: convert to a str, int or float first")
