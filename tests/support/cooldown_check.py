"""What a provider sees of a 429 storm: every request's send and reply time, and the requests
sent into a cooldown the workers had been told about.

A cooldown starts for the whole fleet when Redis has it (``tests.support.redis_monitor``): from
then on every admission check sees it. A request whose last check came just before that may
still be sent after it; the limiter bounds that delay by its jitter allowance (a permit whose
grant is older than the allowance at the check is given back, ``DeferringLimiter``). So a
request *breaks* a cooldown when it was sent later than ``allowance_s`` after Redis recorded the
cooldown and before the cooldown's end. A request sent before that (after the 429 was
delivered, while the worker that got it was still reading it and writing the cooldown, or
already on its way) is *in flight*: reported, not a breach; no client could have stopped it.

Times come from the wire (``simulator.wire.WireCapture(replies=True)``: kernel timestamps of
each request's first segment and of its reply's, independent of how the simulator or the
workers are scheduled) when the test runs as root, else from the simulator's own stamps
(arrival before the body is read, reply when the handler returned), which a starved simulator
can shift.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

from simulator.wire import WireRequest
from tests.support.redis_monitor import CooldownRecord


@dataclass(frozen=True)
class Exchange:
    """One request and its reply: times in seconds on one clock, ``sender`` a process label."""

    sent_s: float
    replied_s: float | None
    status: int | None
    sender: str


def from_wire(requests: Sequence[WireRequest], model: str, owner: Callable[[int], int | None]) -> list[Exchange]:
    return sorted((Exchange(r.sent_s, r.replied_s, r.status, _label(r.client_port, owner))
                   for r in requests if r.model == model), key=lambda e: e.sent_s)


def from_simulator(exchanges: Sequence[Sequence[float]], owner: Callable[[int], int | None],
                   offset_s: float) -> list[Exchange]:
    """``exchanges``: the simulator's ``/_stats`` rows ``[arrived_s, replied_s, status, client_port]``
    (its monotonic clock); ``offset_s`` turns them into CLOCK_REALTIME (Redis's clock)."""
    return sorted((Exchange(a + offset_s, r + offset_s, int(st), _label(int(port), owner))
                   for a, r, st, port in exchanges), key=lambda e: e.sent_s)


def _label(port: int, owner: Callable[[int], int | None]) -> str:
    pid = owner(port)
    return f"pid {pid} (port {port})" if pid is not None else f"port {port}"


def _cause(ex: Sequence[Exchange], recorded_s: float) -> str:
    """The latest 429 delivered before a cooldown was recorded: the one that caused it."""
    limited = [(i, e) for i, e in enumerate(ex) if e.status == 429 and e.replied_s is not None
               and e.replied_s <= recorded_s]
    if not limited:
        return "no 429 delivered before it"
    i, e = limited[-1]
    return f"429 #{i} delivered {1000 * (recorded_s - e.replied_s):.1f} ms before, to {e.sender}"


def cooldown_breaches(ex: Sequence[Exchange], cooldowns: Sequence[CooldownRecord], retry_after_s: float,
                      allowance_s: float, tolerance_s: float) -> tuple[list[str], list[str]]:
    """(breaches, in flight): one line per (cooldown, request) pair with the request sent more
    than ``allowance_s`` after Redis recorded the cooldown and more than ``tolerance_s`` before
    ``retry_after_s`` from then ran out (the 429's demand, whatever end Redis was given); and
    one per request sent into a cooldown earlier than that."""
    broke, in_flight = [], []
    for k, c in enumerate(cooldowns):
        end_s = c.recorded_s + retry_after_s
        for i, e in enumerate(ex):
            if not c.recorded_s < e.sent_s < end_s - tolerance_s:
                continue
            line = (f"request #{i} sent {1000 * (e.sent_s - c.recorded_s):+.1f} ms after cooldown #{k} reached "
                    f"Redis ({_cause(ex, c.recorded_s)}; Retry-After ends {1000 * (end_s - e.sent_s):.1f} ms "
                    f"after the send): sent by {e.sender}, answered {e.status}")
            if e.sent_s > c.recorded_s + allowance_s:
                broke.append(line)
            else:
                in_flight.append(line)
    return broke, in_flight


def causes_precede(ex: Sequence[Exchange], cooldowns: Sequence[CooldownRecord]) -> list[str]:
    """Each cooldown has its own 429 delivered before it: the k-th recorded cooldown comes
    after the k-th delivered 429 (one cooldown per 429, written once the 429 was read)."""
    delivered = sorted(e.replied_s for e in ex if e.status == 429 and e.replied_s is not None)
    return [f"cooldown #{k} reached Redis {1000 * (r - c.recorded_s):.1f} ms before the 429 #{k} was delivered"
            for k, (r, c) in enumerate(zip(delivered, cooldowns)) if c.recorded_s < r]


def window_breaches(sent_s: Sequence[float], limit: int, window_s: float) -> list[str]:
    """One line per request that was the (limit+1)-th or later within ``window_s``."""
    t = sorted(sent_s)
    out, j = [], 0
    for i, x in enumerate(t):
        while t[j] <= x - window_s:
            j += 1
        if i - j + 1 > limit:
            out.append(f"{i - j + 1} requests within {window_s} s ending at request #{i}")
    return out


def timeline(ex: Sequence[Exchange], limit: int = 400) -> str:
    """The exchanges as lines ``+ms sent, +ms replied, status, sender`` from the first send."""
    if not ex:
        return "(no requests)"
    t0 = ex[0].sent_s
    lines = [f"#{i:3d} sent {1000 * (e.sent_s - t0):9.1f} ms  replied "
             + (f"{1000 * (e.replied_s - t0):9.1f} ms" if e.replied_s is not None else "        ? ms")
             + f"  {e.status}  {e.sender}" for i, e in enumerate(ex[:limit])]
    return "\n".join(lines)
