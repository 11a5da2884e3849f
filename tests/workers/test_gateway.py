"""Gateways and servers in front of models: every Retry-After header form, a gateway's 400 for
an unknown model, a prompt longer than the context window. Each on the simulator over loopback
HTTP, counted on both sides (what the endpoint received, what the store holds)."""

from __future__ import annotations

import asyncio
import datetime as dt
import email.utils
import time
from pathlib import Path

import httpx
import pytest

from orchestrator.campaign.prepared import prepare

from orchestrator.local.campaign import run_campaign_local
from orchestrator.campaign.spec import load_campaign
from simulator.app import go_duration
from simulator.config import SimConfig, SimModel
from simulator.server import start_background
from storage.availability import MISSING, Availability, AvailabilityStore
from storage.records import Outcome
from storage.runs import RunStore
from workers import errors
from workers.availability import CheckSettings, CheckTarget, check_availability
from workers.providers.base import ChatRequest
from workers.providers.ollama import OllamaProvider
from workers.providers.openai_compat import OpenAIProvider
from workers.providers.registry import make_http_client
from workers.providers.retry_after import parse_go_duration, retry_after_from_headers
from workers.runtask import EndpointRef, TimeoutPolicy

from tests.simulator.test_simulator import PROMPT

FAST = TimeoutPolicy(connect_timeout_s=2.0, read_timeout_s=5.0, total_timeout_s=10.0)
FORMS = ["retry-after", "retry-after-date", "retry-after-ms", "x-ratelimit-reset-requests",
         "x-ratelimit-reset-tokens", "llm_provider-retry-after"]
# per form: the simulated wait, and how close the parsed value must be (HTTP-dates have whole seconds)
WAITS = {"retry-after": (7.0, 0.0), "retry-after-date": (90.0, 1.0), "retry-after-ms": (2.5, 0.0),
         "x-ratelimit-reset-requests": (360.0, 0.0), "x-ratelimit-reset-tokens": (0.02, 1e-9),
         "llm_provider-retry-after": (12.0, 0.0)}


def _models() -> dict[str, SimModel]:
    out = {f"limited-{form}": SimModel(rate_limit_prob=1.0, retry_after_s=WAITS[form][0], retry_after_headers=(form,))
           for form in FORMS}
    out["small-context"] = SimModel(context_tokens=64)
    out["fine"] = SimModel()
    return out


@pytest.fixture(scope="module")
def gateway():
    """A simulator that answers an unknown model as LiteLLM does (400)."""
    with start_background(SimConfig(seed=3, models=_models(), unknown_model_status=400)) as sim:
        yield sim


def _call(wire: str, base_url: str, model: str, message: str = "emit the IR") -> None:
    async def go() -> None:
        async with make_http_client() as client:
            cls = OpenAIProvider if wire == "openai" else OllamaProvider
            await cls(client, base_url, None).complete(ChatRequest(model=model, user_message=message, timeouts=FAST))

    asyncio.run(go())


# ------------------------------------------------------------------ Retry-After, every form

def test_go_durations_parse_and_round_trip() -> None:
    assert [parse_go_duration(v) for v in ("1s", "6m0s", "20ms", "1h2m3.5s", "1.5s", "250us", "7")] == [
        1.0, 360.0, 0.02, 3723.5, 1.5, 0.00025, 7.0]
    assert [parse_go_duration(v) for v in ("soon", "5 s", "1x", "", None, "s", "1" * 100 + "s")] == [None] * 7
    for seconds in (0.02, 1.0, 1.5, 59.0, 360.0, 3723.5):
        assert parse_go_duration(go_duration(seconds)) == pytest.approx(seconds)
    assert go_duration(360.0) == "6m0s" and go_duration(0.02) == "20ms" and go_duration(1.0) == "1s"


def test_header_precedence_and_exhausted_windows() -> None:
    now = dt.datetime(2026, 1, 1, tzinfo=dt.timezone.utc)
    h = httpx.Headers
    assert retry_after_from_headers(h({"retry-after": "5", "retry-after-ms": "1500"}), now) == 1.5
    assert retry_after_from_headers(h({"Retry-After": "nan", "llm_provider-retry-after": "4"}), now) == 4.0
    both = {"x-ratelimit-reset-requests": "6m0s", "x-ratelimit-reset-tokens": "20ms"}
    assert retry_after_from_headers(h(both), now) == 360.0  # unknown which ran out: the longer
    assert retry_after_from_headers(h({**both, "x-ratelimit-remaining-requests": "12",
                                       "x-ratelimit-remaining-tokens": "0"}), now) == 0.02
    assert retry_after_from_headers(h({"retry-after": "inf"}), now) is None
    assert retry_after_from_headers(h({}), now) is None


@pytest.mark.parametrize("wire", ["openai", "ollama"])
@pytest.mark.parametrize("form", FORMS)
def test_each_retry_after_form_is_read(gateway, form: str, wire: str) -> None:
    wait_s, tolerance = WAITS[form]
    sent_at = time.time()
    with pytest.raises(errors.RateLimited) as info:
        _call(wire, gateway.base_url, f"limited-{form}")
    got = info.value.retry_after_s
    assert got is not None, f"{form}: Retry-After lost"
    if form == "retry-after-date":  # the date is rounded up to a whole second, then read against our clock
        assert wait_s - tolerance - (time.time() - sent_at) <= got <= wait_s + tolerance + 0.5
    else:
        assert got == pytest.approx(wait_s, abs=tolerance)


def test_simulator_sends_exactly_the_configured_header(gateway) -> None:
    resp = httpx.post(f"{gateway.base_url}/v1/chat/completions", json={
        "model": "limited-retry-after-date", "messages": [{"role": "user", "content": "x"}]})
    assert resp.status_code == 429 and "retry-after-ms" not in resp.headers
    when = email.utils.parsedate_to_datetime(resp.headers["retry-after"])
    assert 88 <= (when - dt.datetime.now(dt.timezone.utc)).total_seconds() <= 92


def test_llm_provider_retry_after_is_honoured_by_the_retry_loop(tmp_path: Path) -> None:
    """LiteLLM's header, through a whole run: the wait is stored with the attempt and the
    retry comes no earlier than it said."""
    models = {"flaky-gw": SimModel(rate_limit_prob=0.5, retry_after_s=0.4,
                                   retry_after_headers=("llm_provider-retry-after",))}
    with start_background(SimConfig(seed=1, models=models)) as sim:
        store = _run_campaign(tmp_path, sim.base_url, ["flaky-gw"], runs=6, max_attempts=6)
        received = httpx.get(f"{sim.base_url}/_stats").json()["models"]["flaky-gw"]
    rows = store.read_table().to_pylist()
    attempts = [a for r in rows for a in r["attempts"]]
    limited = [a for a in attempts if a["outcome"] == "rate_limited"]
    assert limited, "seed 1 should rate-limit some attempts"
    assert all(a["retry_after_s"] == pytest.approx(0.4) for a in limited)
    assert received["requests"] == len(attempts) and received["by_status"].get("429", 0) == len(limited)
    for r in rows:  # every retry waited at least Retry-After after the 429's start
        for prev, nxt in zip(r["attempts"], r["attempts"][1:]):
            gap_s = (nxt["started_at"] - prev["started_at"]).total_seconds()
            assert gap_s >= 0.4, (r["run_id"], gap_s)


# ------------------------------------------------------------------ unknown model at a gateway

@pytest.mark.parametrize("wire", ["openai", "ollama"])
def test_gateway_400_for_an_unknown_model(gateway, wire: str) -> None:
    with pytest.raises(errors.UnknownModel) as info:
        _call(wire, gateway.base_url, "gpt-nope")
    assert info.value.outcome is Outcome.NOT_FOUND and info.value.status_code == 400
    assert "Invalid model name passed in model=gpt-nope" in str(info.value)


def test_availability_reports_the_gateway_unknown_model_with_its_message(gateway, tmp_path: Path) -> None:
    target = CheckTarget(EndpointRef(name="gw", base_url=gateway.base_url), ("fine", "gpt-nope"))
    store = AvailabilityStore(tmp_path / "data")
    settings = CheckSettings(timeouts=FAST)
    records = {r.model: r for r in check_availability([target], store, secrets={}, settings=settings)}
    assert records["fine"].status is Availability.AVAILABLE
    bad = records["gpt-nope"]
    assert bad.status is Availability.UNKNOWN_MODEL and bad.http_status == 400 and bad.listed is False
    assert "Invalid model name passed in model=gpt-nope" in bad.message
    assert Availability.UNKNOWN_MODEL in MISSING
    stored = {t.model: t for t in store.timelines()}
    assert stored["gpt-nope"].latest_status is Availability.UNKNOWN_MODEL


# ------------------------------------------------------------------ the context window

def test_prompt_longer_than_the_context_is_its_own_class(gateway, tmp_path: Path) -> None:
    store = _run_campaign(tmp_path, gateway.base_url, ["small-context", "fine"], runs=2, max_attempts=3)
    rows = store.read_table().to_pylist()
    by_model = {m: [r for r in rows if r["model"] == m] for m in ("small-context", "fine")}
    assert {r["outcome"] for r in by_model["fine"]} == {"ok"}
    for r in by_model["small-context"]:
        assert r["outcome"] == "context_exceeded" and r["status_code"] == 400
        assert len(r["attempts"]) == 1, "a prompt that does not fit is not retried"
        assert "maximum context length is 64 tokens" in r["attempts"][0]["error"]  # the server's words kept
    received = httpx.get(f"{gateway.base_url}/_stats").json()["models"]["small-context"]
    assert received["by_status"].get("400", 0) >= 2


def _run_campaign(tmp_path: Path, base_url: str, models: list[str], *, runs: int, max_attempts: int) -> RunStore:
    prompts = tmp_path / "prompts"
    prompts.mkdir(exist_ok=True)
    (prompts / "ticket.prompt.rtpl").write_text(PROMPT, encoding="utf-8")
    tables = "\n".join(f"[models.{m}]" for m in models)
    (tmp_path / "c.toml").write_text(f"""
name = "gw"
runs = {runs}
[corpus]
paths = ["prompts"]
[endpoints.gw]
base_url = "{base_url}"
[defaults]
max_concurrency = 2
{tables}
[retry]
max_attempts = {max_attempts}
backoff_base_s = 0.01
backoff_cap_s = 0.05
""", encoding="utf-8")
    store = RunStore(tmp_path / "data")
    run_campaign_local(prepare(load_campaign(tmp_path / "c.toml")), store, {})
    return store
