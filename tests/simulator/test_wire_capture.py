"""Arrival times on the wire (``simulator.wire``) against a real simulator process: every request
is seen once, with its model, at the time it was sent; a stopped (starved) simulator stamps its
arrivals late, the wire does not. Needs root (an AF_PACKET socket) on Linux."""

from __future__ import annotations

import http.client
import json
import os
import signal
import sys
import threading
import time
import urllib.parse
import urllib.request

import pytest

from simulator.server import start_subprocess


@pytest.fixture(autouse=True)
def _needs_root_on_linux() -> None:
    assert sys.platform.startswith("linux") and os.geteuid() == 0, "AF_PACKET capture needs root on Linux"


from simulator.wire import WireCapture  # noqa: E402


def post(base_url: str, body: dict) -> tuple[float, float]:
    """POST a chat request; (CLOCK_REALTIME before sending, after the reply)."""
    req = urllib.request.Request(f"{base_url}/v1/chat/completions", data=json.dumps(body).encode(),
                                 headers={"content-type": "application/json"})
    before = time.time()
    with urllib.request.urlopen(req, timeout=30) as resp:
        resp.read()
    return before, time.time()


def chat(model: str, chars: int = 10) -> dict:
    return {"model": model, "messages": [{"role": "user", "content": "x" * chars}]}


@pytest.fixture(scope="module")
def sim(tmp_path_factory: pytest.TempPathFactory):
    cfg = tmp_path_factory.mktemp("wire") / "sim.toml"
    cfg.write_text("seed = 1\n[models.wa]\nlatency_ms_median = 1\n[models.wb]\nlatency_ms_median = 1\n"
                   "[models.wr]\nrate_limit_prob = 1.0\nretry_after_s = 0.5\n")
    with start_subprocess(cfg, startup_timeout_s=60.0) as s:
        yield s


def port_of(base_url: str) -> int:
    port = urllib.parse.urlsplit(base_url).port
    assert port is not None
    return port


def test_every_request_is_seen_once_with_its_model_while_it_was_sent(sim) -> None:
    sent: dict[str, list[tuple[float, float]]] = {"wa": [], "wb": []}
    with WireCapture(port_of(sim.base_url)) as wire:
        for _i in range(4):
            sent["wa"].append(post(sim.base_url, chat("wa")))
        # a body far larger than one segment's worth of headers: the model is found across segments
        sent["wb"].append(post(sim.base_url, chat("wb", chars=300_000)))
        sent["wb"].append(post(sim.base_url, chat("wb")))
    got = wire.arrivals_s()
    assert wire.drops == 0 and wire.unmatched == 0
    assert sorted(got) == ["wa", "wb"]
    for model, spans in sent.items():
        assert len(got[model]) == len(spans), (model, got[model])
        for t, (before, after) in zip(got[model], sorted(spans)):
            assert before <= t <= after, (model, before, t, after)


def test_a_stopped_simulator_stamps_late_the_wire_does_not(sim) -> None:
    stop_s = 0.8
    result: list[tuple[float, float]] = []
    offset_s = time.time() - time.monotonic()  # simulator stamps are CLOCK_MONOTONIC
    with WireCapture(port_of(sim.base_url)) as wire:
        post(sim.base_url, chat("wa"))  # a warm connection path; the stopped one is the second
        os.kill(sim.process.pid, signal.SIGSTOP)
        try:
            t = threading.Thread(target=lambda: result.append(post(sim.base_url, chat("wb"))))
            t.start()
            time.sleep(stop_s)  # the kernel accepts and queues the request meanwhile
        finally:
            os.kill(sim.process.pid, signal.SIGCONT)
        t.join(30)
    (before, _), = result
    on_wire = wire.arrivals_s()["wb"][0]
    with urllib.request.urlopen(f"{sim.base_url}/_stats", timeout=10) as resp:
        stamped = json.load(resp)["models"]["wb"]["arrivals_s"][-1] + offset_s
    assert on_wire - before < 0.3, "the wire time is the send, not the server's handling"
    assert stamped - on_wire > stop_s - 0.2, "the simulator's own stamp waited for the stopped process"


def test_replies_are_matched_to_their_requests_with_status_and_time(sim) -> None:
    """``replies=True``: each request gets its reply's status and wire time, also for several
    requests in turn on one keep-alive connection (a 429 among them), with the client's port."""
    host, port = urllib.parse.urlsplit(sim.base_url).hostname, port_of(sim.base_url)
    spans: list[tuple[str, float, float, int]] = []
    with WireCapture(port, replies=True) as wire:
        conn = http.client.HTTPConnection(host, port, timeout=30)
        try:
            for model in ("wa", "wr", "wb", "wr"):
                before = time.time()
                conn.request("POST", "/v1/chat/completions", body=json.dumps(chat(model)),
                             headers={"content-type": "application/json"})
                resp = conn.getresponse()
                resp.read()
                spans.append((model, before, time.time(), resp.status))
            client_port = conn.sock.getsockname()[1]
        finally:
            conn.close()
    got = wire.requests()
    assert wire.drops == 0 and wire.unmatched == 0
    assert [(r.model, r.status, r.client_port) for r in got] == [(m, st, client_port) for m, _, _, st in spans]
    assert [st for *_, st in spans] == [200, 429, 200, 429]
    for r, (_, before, after, _) in zip(got, spans):
        assert r.replied_s is not None and before <= r.sent_s <= r.replied_s <= after, (r, before, after)
    # without replies=True nothing of the replies is captured (the filter only takes requests)
    with WireCapture(port) as plain:
        post(sim.base_url, chat("wa"))
    assert [(r.model, r.status, r.replied_s) for r in plain.requests()] == [("wa", None, None)]
