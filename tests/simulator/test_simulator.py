"""The simulated endpoint over real loopback HTTP, driven by the official openai and ollama clients."""

from __future__ import annotations

import asyncio
import json
import math
import time
from pathlib import Path

import httpx
import numpy as np
import ollama
import openai
import pytest

from storage.annotations import parse_annotations
from simulator.app import extract_prompt
from simulator.config import SimConfig, SimModel, load_sim_config
from simulator.model import apply_token_budget, expected_node_set_jaccard, node_set_jaccard, simulate_ir
from simulator.server import start_background, start_subprocess
from workers.errors import ConfigError

ROOT = Path(__file__).resolve().parents[2]
PROMPT = """Summarise the support ticket below.
// @rule RULE:tone category=style priority=2
Keep a calm tone.
// @rule RULE:no_pii category=safety priority=1 trigger=topic:privacy,topic:pii
// @condition CONDITION:is_urgent
{% if CONDITION:is_urgent %}
// @breakpoint BREAKPOINT:escalate [conditionRef=CONDITION:is_urgent]
Escalate first.
{% endif %}
// @rule RULE:format category=format priority=3
// @provider local model=tiny
{{ ticket }}
"""
OTHER_PROMPT = "Translate.\n// @rule RULE:glossary category=policy\n// @condition CONDITION:formal\n"
TRUE_IDS = {"RULE:tone", "RULE:no_pii", "CONDITION:is_urgent", "BREAKPOINT:escalate", "RULE:format", "local"}

SHAKY = SimModel(drop_prob=0.25, rename_prob=0.15, add_rate=1.5, metadata_prob=0.3, fence_prob=0.8, prose_prob=0.4)
CONFIG = SimConfig(seed=11, models={
    "steady": SimModel(),
    "shaky": SHAKY,
    "limited": SimModel(rate_limit_prob=1.0, retry_after_s=2),
    "flaky": SimModel(server_error_prob=1.0),
    "retiring": SimModel(retired_after_requests=3, retired_on="2026-08-01", retirement_reference="RET-0042",
                         replacement_model="steady"),
    "reasoner": SimModel(reasoning_chars_mean=8000),
    "hang": SimModel(hang_prob=1.0, hang_s=2.0, listed=False),
})


def message(prompt: str = PROMPT) -> list[dict]:
    return [{"role": "user", "content": f"Emit the IR as JSON.\n--- BEGIN PROMPT ---\n{prompt}--- END PROMPT ---\n"}]


def ir_of(text: str) -> dict:
    """Strip fences and prose the way an extractor would: the outermost JSON object."""
    return json.loads(text[text.index("{"): text.rindex("}") + 1])


@pytest.fixture(scope="module")
def sim():
    with start_background(CONFIG) as running:
        yield running


@pytest.fixture()
def fresh(sim):
    httpx.post(f"{sim.base_url}/_reset").raise_for_status()
    return sim


def oa(sim, **kw) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{sim.base_url}/v1", api_key=kw.pop("api_key", "unused"), max_retries=0, **kw)


def test_model_listing_with_both_clients(sim):
    listed = {n for n, p in CONFIG.models.items() if p.listed}
    assert {m.id for m in oa(sim).models.list()} == listed
    assert {m.model for m in ollama.Client(host=sim.base_url).list().models} == listed
    assert "hang" not in listed


def test_steady_returns_exactly_the_annotated_ids_in_both_formats(fresh):
    r = oa(fresh).chat.completions.create(model="steady", messages=message())
    ir = ir_of(r.choices[0].message.content)
    assert {n["id"] for n in ir["nodes"]} == TRUE_IDS and ir["version"] == 1
    assert r.choices[0].finish_reason == "stop"
    assert r.usage.completion_tokens == math.ceil(len(r.choices[0].message.content) / 4)
    node = next(n for n in ir["nodes"] if n["id"] == "RULE:no_pii")
    assert node["meta"] == {"category": "safety", "priority": 1, "inferred": False,
                            "triggers": ["topic:privacy", "topic:pii"], "condition_ref": None}
    assert node["range"]["start_line"] == 4 and node["kind"] == "Rule"
    assert next(n for n in ir["nodes"] if n["id"] == "local")["kind"] == "Directive"
    o = ollama.Client(host=fresh.base_url).chat(model="steady", messages=message())
    assert {n["id"] for n in ir_of(o.message.content)["nodes"]} == TRUE_IDS
    assert o.done_reason == "stop" and o.eval_count > 0 and o.prompt_eval_count > 0


def test_shaky_mean_jaccard_matches_the_simulation(fresh):
    runs = 30
    client = oa(fresh)
    sets = []
    for _ in range(runs):
        text = client.chat.completions.create(model="shaky", messages=message()).choices[0].message.content
        sets.append(frozenset(n["id"] for n in ir_of(text)["nodes"]))
    observed = node_set_jaccard(sets)
    mean, sd = expected_node_set_jaccard(SHAKY, parse_annotations(PROMPT), runs=runs, n_sims=200, seed=3)
    assert 0.2 < mean < 0.9 and sd > 0
    assert abs(observed - mean) <= 4 * sd, (observed, mean, sd)
    assert any(n_set - TRUE_IDS for n_set in sets)  # inferred nodes appear


def test_rate_limited_has_retry_after(fresh):
    with pytest.raises(openai.RateLimitError) as exc:
        oa(fresh).chat.completions.create(model="limited", messages=message())
    assert exc.value.response.headers["retry-after"] == "2"
    assert exc.value.status_code == 429


def test_server_errors(fresh):
    with pytest.raises(openai.InternalServerError) as exc:
        oa(fresh).chat.completions.create(model="flaky", messages=message())
    assert exc.value.status_code in (500, 503)


def test_retired_after_n_requests(fresh):
    client = oa(fresh)
    for _ in range(3):
        client.chat.completions.create(model="retiring", messages=message())
    for _ in range(2):
        with pytest.raises(openai.APIStatusError) as exc:
            client.chat.completions.create(model="retiring", messages=message(OTHER_PROMPT))
        assert exc.value.status_code == 410
        body = exc.value.response.text
        assert "2026-08-01" in body and "RET-0042" in body and "'steady'" in body
    with pytest.raises(ollama.ResponseError) as oexc:
        ollama.Client(host=fresh.base_url).chat(model="retiring", messages=message())
    assert oexc.value.status_code == 410 and "2026-08-01" in oexc.value.error
    stats = httpx.get(f"{fresh.base_url}/_stats").json()["models"]["retiring"]
    assert stats["requests"] == 6 and stats["by_status"] == {"200": 3, "410": 3}
    assert len(stats["arrivals_s"]) == 6 and stats["arrivals_s"] == sorted(stats["arrivals_s"])
    # one [arrived_s, replied_s, status, client_port] per request, each reply after its arrival
    ex = stats["exchanges"]
    assert [e[2] for e in ex] == [200, 200, 200, 410, 410, 410]
    assert sorted(e[0] for e in ex) == stats["arrivals_s"] and all(e[0] <= e[1] and e[3] > 0 for e in ex)


def test_unknown_model_is_404_in_both_shapes(fresh):
    with pytest.raises(openai.NotFoundError) as exc:
        oa(fresh).chat.completions.create(model="no-such-model", messages=message())
    assert exc.value.response.json()["error"]["code"] == "model_not_found"
    with pytest.raises(ollama.ResponseError) as oexc:
        ollama.Client(host=fresh.base_url).chat(model="no-such-model", messages=message())
    assert oexc.value.status_code == 404 and "no-such-model" in oexc.value.error


def test_api_key_required_and_never_echoed():
    secret = "s3cr3t-key-value"
    with start_background(CONFIG.model_copy(update={"api_key": secret})) as sim:
        for bad in ("wrong-key-value", ""):
            r = httpx.post(f"{sim.base_url}/v1/chat/completions", json={"model": "steady", "messages": message()},
                           headers={"Authorization": f"Bearer {bad}"} if bad else {})
            assert r.status_code == 401 and secret not in r.text and (not bad or bad not in r.text)
        assert httpx.get(f"{sim.base_url}/api/tags").status_code == 401
        with pytest.raises(openai.AuthenticationError):
            oa(sim, api_key="wrong").models.list()
        assert oa(sim, api_key=secret).chat.completions.create(model="steady", messages=message()).choices
        good = ollama.Client(host=sim.base_url, headers={"Authorization": f"Bearer {secret}"})
        assert good.chat(model="steady", messages=message()).done


def test_max_tokens_truncation(fresh):
    r = oa(fresh).chat.completions.create(model="steady", messages=message(), max_tokens=50)
    assert r.choices[0].finish_reason == "length"
    assert len(r.choices[0].message.content) == 200 and r.usage.completion_tokens == 50
    with pytest.raises(json.JSONDecodeError):
        json.loads(r.choices[0].message.content)
    r2 = oa(fresh).chat.completions.create(model="steady", messages=message(), max_completion_tokens=100_000)
    assert r2.choices[0].finish_reason == "stop"
    # a reasoning-heavy model under a tight budget: reasoning eats it all, content is empty
    tight = oa(fresh).chat.completions.create(model="reasoner", messages=message(), max_tokens=300)
    assert tight.choices[0].finish_reason == "length" and tight.choices[0].message.content == ""
    assert len(tight.choices[0].message.reasoning_content) == 1200
    assert tight.usage.completion_tokens_details.reasoning_tokens == 300
    roomy = ollama.Client(host=fresh.base_url).chat(model="reasoner", messages=message(),
                                                    options={"num_predict": 100_000})
    assert roomy.done_reason == "stop" and roomy.message.thinking and ir_of(roomy.message.content)
    short = ollama.Client(host=fresh.base_url).chat(model="reasoner", messages=message(), options={"num_predict": 20})
    assert short.done_reason == "length" and short.message.content == ""


def _transcript(sim, seq):
    client = oa(sim)
    out = []
    for model, prompt in seq:
        r = client.chat.completions.create(model=model, messages=message(prompt))
        c = r.choices[0]
        out.append((c.message.content, getattr(c.message, "reasoning_content", None), c.finish_reason,
                    r.usage.completion_tokens))
    return out


def test_determinism_across_fresh_servers_and_interleaving():
    seq = [("shaky", PROMPT), ("shaky", OTHER_PROMPT), ("shaky", PROMPT), ("reasoner", PROMPT), ("shaky", PROMPT)]
    with start_background(CONFIG) as a:
        ta = _transcript(a, seq)
    with start_background(CONFIG) as b:
        tb = _transcript(b, seq)
        # the per-(model, prompt) counter makes answers independent of what else is interleaved
        httpx.post(f"{b.base_url}/_reset")
        only = _transcript(b, [("shaky", PROMPT)] * 3)
    with start_background(CONFIG.model_copy(update={"seed": 12})) as c:
        tc = _transcript(c, seq)
    assert ta == tb
    assert only == [ta[0], ta[2], ta[4]]
    assert len({t[0] for t in ta}) > 1
    assert ta != tc


def test_hanging_request_does_not_delay_a_concurrent_one(fresh):
    async def scenario():
        async with httpx.AsyncClient(base_url=fresh.base_url) as client:
            hang = asyncio.create_task(client.post("/v1/chat/completions", timeout=0.8,
                                                   json={"model": "hang", "messages": message()}))
            await asyncio.sleep(0.05)
            t0 = time.perf_counter()
            ok = await client.post("/v1/chat/completions", json={"model": "steady", "messages": message()})
            elapsed = time.perf_counter() - t0
            with pytest.raises(httpx.ReadTimeout):
                await hang
            return ok, elapsed
    ok, elapsed = asyncio.run(scenario())
    assert ok.status_code == 200 and elapsed < 1.0  # blocked would mean >= 1.95 s (hang_s=2)


def test_bad_requests_are_400(fresh):
    r = httpx.post(f"{fresh.base_url}/v1/chat/completions", content=b"{not json")
    assert r.status_code == 400 and "error" in r.json()
    r = httpx.post(f"{fresh.base_url}/api/chat", json={"model": "steady", "messages": message(),
                                                        "options": {"num_predict": "many"}, "stream": False})
    assert r.status_code == 400 and isinstance(r.json()["error"], str)


# ---- pure model functions ---------------------------------------------------------------
def test_simulate_ir_extremes():
    truth = parse_annotations(PROMPT)
    rng = np.random.default_rng(0)
    assert simulate_ir(truth, "u", SimModel(drop_prob=1.0), rng)["nodes"] == []
    renamed = simulate_ir(truth, "u", SimModel(rename_prob=1.0), rng)["nodes"]
    assert len(renamed) == len(TRUE_IDS) and not ({n["id"] for n in renamed} & TRUE_IDS)
    added = simulate_ir(truth, "u", SimModel(add_rate=1000.0), rng)["nodes"]
    inferred = [n for n in added if n["meta"]["inferred"]]
    assert len(inferred) == 6 and all(n["id"].startswith("SECTION:") for n in inferred)
    assert all(not n["meta"]["inferred"] for n in added if n["id"] in TRUE_IDS)


def test_expected_jaccard_matches_closed_form_for_one_node():
    # one node kept with prob q, two runs: Jaccard is 1 if both agree (both empty scores 1), else 0
    truth = parse_annotations("// @rule ONLY\n")
    for drop in (0.0, 0.3, 0.5):
        q = 1 - drop
        mean, sd = expected_node_set_jaccard(SimModel(drop_prob=drop), truth, runs=2, n_sims=4000, seed=5)
        p = q * q + (1 - q) * (1 - q)
        assert abs(mean - p) <= 4 * math.sqrt(p * (1 - p) / 4000) + 1e-12
        assert sd == pytest.approx(math.sqrt(p * (1 - p)), abs=0.03)


def test_token_budget_and_prompt_markers():
    out = apply_token_budget("a" * 40, "r" * 20, 8, 4.0)
    assert (out.content, out.reasoning, out.finish_reason, out.completion_tokens) == ("a" * 12, "r" * 20, "length", 8)
    assert apply_token_budget("a" * 40, "", None, 4.0).finish_reason == "stop"
    assert extract_prompt("instr\n--- BEGIN PROMPT ---\nP1\nP2\n--- END PROMPT ---\ntail") == "P1\nP2"
    assert extract_prompt("no markers") == "no markers"


def test_example_config_and_subprocess(tmp_path):
    cfg = load_sim_config(ROOT / "examples" / "sim.toml")
    for name in ("sim-steady", "sim-mild", "sim-medium", "sim-shaky", "sim-chaotic", "sim-ratelimited",
                 "sim-hang", "sim-retiring", "sim-reasoner", "sim-flaky"):
        assert name in cfg.models
    bad = tmp_path / "bad.toml"
    bad.write_text("seed = 1\n[models.x]\ndrop_prob = 2\nfoo = 1\n")
    with pytest.raises(ConfigError) as exc:
        load_sim_config(bad)
    assert "models.x.drop_prob" in str(exc.value) and "models.x.foo" in str(exc.value)
    with start_subprocess(ROOT / "examples" / "sim.toml") as sub:
        r = oa(sub).chat.completions.create(model="sim-steady", messages=message())
        assert {n["id"] for n in ir_of(r.choices[0].message.content)["nodes"]} == TRUE_IDS
    assert sub.process.poll() is not None


def test_example_prompts_and_demo_panel_order_by_stability():
    """The demo (5 models x 12 prompts x 3 runs) ranks the models as designed."""
    prompts = sorted((ROOT / "examples" / "prompts").glob("*.prompt.rtpl"))
    assert len(prompts) >= 12
    texts = [p.read_text(encoding="utf-8") for p in prompts]
    parsed = [parse_annotations(t) for t in texts]
    assert all(4 <= len(s.annotations) <= 10 for s in parsed)
    assert sum(a.tag == "provider" for s in parsed for a in s.annotations) == 1
    assert sum(a.tag == "breakpoint" for s in parsed for a in s.annotations) >= 6
    panel = ["sim-steady", "sim-mild", "sim-medium", "sim-shaky", "sim-chaotic"]
    cfg = load_sim_config(ROOT / "examples" / "sim.toml")

    async def demo(base_url):
        sem = asyncio.Semaphore(24)
        async with httpx.AsyncClient(base_url=base_url, timeout=10) as client:
            async def one(model, text):
                async with sem:
                    r = await client.post("/v1/chat/completions", json={"model": model, "messages": message(text)})
                r.raise_for_status()
                return frozenset(n["id"] for n in ir_of(r.json()["choices"][0]["message"]["content"])["nodes"])
            jobs = [(m, i, one(m, t)) for m in panel for i, t in enumerate(texts) for _ in range(3)]
            sets = await asyncio.gather(*(j[2] for j in jobs))
        cells: dict[tuple[str, int], list] = {}
        for (m, i, _), s in zip(jobs, sets):
            cells.setdefault((m, i), []).append(s)
        return {m: float(np.mean([node_set_jaccard(cells[(m, i)]) for i in range(len(texts))])) for m in panel}

    with start_background(cfg) as sim:
        means = asyncio.run(demo(sim.base_url))
    assert means["sim-steady"] == 1.0
    assert [means[m] for m in panel] == sorted((means[m] for m in panel), reverse=True), means
    assert means["sim-chaotic"] < 0.6


def test_structured_output_has_no_fence_or_prose_and_think_false_drops_reasoning():
    chaotic_fmt = SimModel(fence_prob=1.0, prose_prob=1.0, reasoning_chars_mean=400)
    with start_background(SimConfig(seed=1, models={"fmt": chaotic_fmt})) as sim:
        client = oa(sim)
        plain = client.chat.completions.create(model="fmt", messages=message()).choices[0].message.content
        assert "```json" in plain and not plain.startswith("{")
        structured = client.chat.completions.create(model="fmt", messages=message(),
                                                    response_format={"type": "json_object"})
        assert json.loads(structured.choices[0].message.content)["version"] == 1
        o = ollama.Client(host=sim.base_url)
        r = o.chat(model="fmt", messages=message(), format="json", think=False)
        assert json.loads(r.message.content)["nodes"] and not r.message.thinking
        assert o.chat(model="fmt", messages=message()).message.thinking
