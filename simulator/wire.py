"""Request arrival times on the wire: kernel timestamps of the HTTP requests sent to one TCP port
(the simulator's, or any loopback server's), independent of how that server is scheduled.

    with WireCapture(port=sim_port) as wire:
        ...                                  # the campaign
    wire.arrivals_s()                        # {"rl-a": [t, ...], ...}, seconds (CLOCK_REALTIME)

Why: the simulator stamps a request when its event loop gets to it. When the simulator is
starved of CPU (load average >= 10 on 2 cores) that stamp can be late by a different amount for
each request, so its windows can look fuller (or emptier) than what was sent. A provider has its
own CPUs; what it receives is what went over the wire. Here an ``AF_PACKET`` socket on the
loopback interface, with a classic BPF filter for ``tcp dst port <port>``, receives a copy of
each segment with the kernel's timestamp (``SO_TIMESTAMPNS``) taken as the segment crossed ``lo``,
i.e. during the sender's ``write``; the capture thread itself may be starved without changing
the times (the kernel queues the copies, ``--rcvbuf-mib`` of them; drops are counted).

A request's time is that of its first segment (``POST ...``); its model is read from the
``"model"`` field of the JSON body on the same connection. With ``replies=True`` the segments
*from* the port are captured too: each reply's status line and the time it crossed ``lo`` (when
the server's ``write`` put it in the client's socket: the moment the client could know it),
matched to the request it answers (HTTP/1.1 answers in order on a connection), and the client's
port of each request (to tell which process sent it). Needs root (CAP_NET_RAW), Linux only.
"""

from __future__ import annotations

import json
import re
import socket
import struct
import threading
from collections import defaultdict
from dataclasses import dataclass
from types import TracebackType

ETH_P_ALL = 0x0003
SO_TIMESTAMPNS = 35
SO_ATTACH_FILTER = 26
SO_RCVBUFFORCE = 33
SOL_PACKET = 263
PACKET_STATISTICS = 6
PACKET_HOST = 0  # the incoming copy of a loopback segment (the outgoing one is PACKET_OUTGOING)
_MODEL = re.compile(rb'"model"\s*:\s*"((?:[^"\\]|\\.)*)"')
_STATUS = re.compile(rb"HTTP/1\.[01] (\d{3}) ")


@dataclass(frozen=True)
class WireRequest:
    """One request seen on the wire: ``sent_s`` its first segment's time (CLOCK_REALTIME), the
    client's ``client_port``, and (``replies=True``) its reply's ``status`` and ``replied_s``
    (None if no reply was seen before the capture ended)."""

    model: str
    sent_s: float
    client_port: int
    status: int | None = None
    replied_s: float | None = None


def _bpf_tcp_port(port: int, *, both_directions: bool = False) -> bytes:
    """Classic BPF: accept IPv4 TCP segments (not fragments) to ``port`` (and from it when
    ``both_directions``); what ``tcpdump -dd 'tcp dst port P'`` (``'tcp port P'``) gives."""
    src = 1 if both_directions else 0  # the extra "source port == port" test
    code = [
        (0x28, 0, 0, 12),              # ldh [12]            ethertype
        (0x15, 0, 8 + 2 * src, 0x0800),  # jeq IPv4 else drop
        (0x30, 0, 0, 23),              # ldb [23]            IP protocol
        (0x15, 0, 6 + 2 * src, 6),     # jeq TCP else drop
        (0x28, 0, 0, 20),              # ldh [20]            fragment offset
        (0x45, 4 + 2 * src, 0, 0x1FFF),  # jset -> drop
        (0xB1, 0, 0, 14),              # ldxb 4*([14]&0xf)   IP header length
    ]
    if both_directions:
        code += [(0x48, 0, 0, 14),     # ldh [x+14]          TCP source port
                 (0x15, 2, 0, port)]   # jeq port -> accept
    code += [
        (0x48, 0, 0, 16),              # ldh [x+16]          TCP destination port
        (0x15, 0, 1, port),            # jeq port
        (0x06, 0, 0, 0x40000),         # accept (snap 256 KiB)
        (0x06, 0, 0, 0),               # drop
    ]
    return b"".join(struct.pack("HBBI", *c) for c in code)


class WireCapture:
    """Capture HTTP requests to ``port`` on ``lo`` from ``__enter__`` to ``__exit__``.

    ``rcvbuf_mib``: kernel queue for segments not yet read by the (possibly starved) thread.
    After exit: :meth:`arrivals_s` per model, ``drops`` (segments the kernel could not queue:
    if > 0, requests may be missing) and ``unmatched`` (requests whose model was not found).
    """

    def __init__(self, port: int, *, interface: str = "lo", rcvbuf_mib: int = 256, replies: bool = False) -> None:
        self.port = port
        self.drops = 0
        self.unmatched = 0
        self._replies = replies
        self._arrivals: dict[str, list[float]] = defaultdict(list)
        self._requests: list[WireRequest] = []
        self._unanswered: dict[tuple[bytes, int], list[int]] = defaultdict(list)  # flow -> indexes into _requests
        self._pending: dict[tuple[bytes, int], tuple[float, bytes]] = {}  # flow -> (first ts, bytes so far)
        self._sock = socket.socket(socket.AF_PACKET, socket.SOCK_RAW, socket.htons(ETH_P_ALL))
        self._sock.setsockopt(socket.SOL_SOCKET, SO_RCVBUFFORCE, rcvbuf_mib << 20)
        self._sock.setsockopt(socket.SOL_SOCKET, SO_TIMESTAMPNS, 1)
        prog = _bpf_tcp_port(port, both_directions=replies)
        self._prog = struct.pack("HL", len(prog) // 8, _address_of(prog))
        self._sock.setsockopt(socket.SOL_SOCKET, SO_ATTACH_FILTER, self._prog)
        self._sock.bind((interface, 0))
        self._sock.settimeout(0.2)
        self._stop = threading.Event()
        self._t = threading.Thread(target=self._run, name="wire-capture", daemon=True)

    def arrivals_s(self) -> dict[str, list[float]]:
        """Per model, the wire time of each request (seconds, CLOCK_REALTIME), sorted."""
        return {m: sorted(ts) for m, ts in self._arrivals.items()}

    def requests(self) -> list[WireRequest]:
        """Every request seen, in the order sent, with its reply when ``replies=True``."""
        return sorted(self._requests, key=lambda r: r.sent_s)

    def _run(self) -> None:
        while True:
            try:
                data, anc, _, addr = self._sock.recvmsg(1 << 18, 64)
            except TimeoutError:
                if self._stop.is_set():
                    return
                continue
            except OSError:
                return
            if addr[2] != PACKET_HOST:
                continue
            ts = next((s + ns / 1e9 for lvl, typ, d in anc if lvl == socket.SOL_SOCKET and typ == SO_TIMESTAMPNS
                       for s, ns in [struct.unpack("qq", d[:16])]), None)
            if ts is not None:
                self._segment(ts, data)

    def _segment(self, ts: float, frame: bytes) -> None:
        ip = 14
        ihl = (frame[ip] & 0x0F) * 4
        tcp = ip + ihl
        src = frame[ip + 12:ip + 16]
        sport, dport = struct.unpack("!HH", frame[tcp:tcp + 4])
        payload = frame[tcp + (frame[tcp + 12] >> 4) * 4:]
        if not payload:
            return
        if sport == self.port:  # a reply (replies=True): to the flow (dst address, dst port)
            self._reply(ts, (frame[ip + 16:ip + 20], dport), payload)
            return
        if dport != self.port:  # queued before the filter was attached: any traffic on lo
            return
        flow = (src, sport)
        if payload.startswith(b"POST "):
            if flow in self._pending:
                self.unmatched += 1
            self._pending[flow] = (ts, payload)
        elif flow in self._pending:
            first, seen = self._pending[flow]
            self._pending[flow] = (first, seen + payload)
        else:
            return
        first, seen = self._pending[flow]
        body = seen.partition(b"\r\n\r\n")[2]
        m = _MODEL.search(body)
        if m is not None:
            model = json.loads(b'"' + m.group(1) + b'"')
            self._arrivals[model].append(first)
            self._unanswered[flow].append(len(self._requests))
            self._requests.append(WireRequest(model, first, sport))
            del self._pending[flow]

    def _reply(self, ts: float, flow: tuple[bytes, int], payload: bytes) -> None:
        """A reply's first segment starts with its status line; the rest (body, later segments,
        stream chunks) do not, and are skipped."""
        m = _STATUS.match(payload)
        queue = self._unanswered.get(flow)
        if m is None or not queue:
            return
        i = queue.pop(0)
        r = self._requests[i]
        self._requests[i] = WireRequest(r.model, r.sent_s, r.client_port, int(m.group(1)), ts)

    def _read_drops(self) -> int:
        raw = self._sock.getsockopt(SOL_PACKET, PACKET_STATISTICS, 8)  # tpacket_stats; reading resets it
        return struct.unpack("II", raw)[1]

    def __enter__(self) -> WireCapture:
        self._read_drops()
        self._t.start()
        return self

    def __exit__(self, et: type[BaseException] | None, e: BaseException | None, tb: TracebackType | None) -> None:
        self._stop.set()
        self._t.join(30)  # drains what the kernel queued first (recvmsg returns data before timing out)
        self.drops = self._read_drops()
        self.unmatched += len(self._pending)
        self._sock.close()


def _address_of(buf: bytes) -> int:
    """Address of an immutable bytes object's data (kept alive by the caller) for sock_fprog."""
    import ctypes

    return ctypes.cast(ctypes.c_char_p(buf), ctypes.c_void_p).value or 0
