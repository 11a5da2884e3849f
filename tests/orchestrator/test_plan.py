"""Instruction rendering and run planning: stable ids, the full cross, interleaving, resume."""

from __future__ import annotations

import datetime as dt
import hashlib
import json
from collections import Counter
from pathlib import Path

import pytest

from orchestrator.campaign.corpus import load_corpus
from orchestrator.campaign.instruction import BEGIN_MARKER, END_MARKER, load_instruction
from orchestrator.campaign.plan import pending, plan_runs, run_id
from orchestrator.campaign.spec import load_campaign
from workers.errors import ConfigError
from workers.runtask import RunTask

TEMPLATE_FILE = Path(__file__).resolve().parents[2] / "orchestrator" / "campaign" / "templates" / "instruction_v1.txt"

CAMPAIGN = """
name = "plan-test"
runs = 3
{budgets}
[corpus]
paths = ["prompts"]
[endpoints.sim]
base_url = "http://127.0.0.1:8765"
[defaults]
endpoint = "sim"
max_tokens = 2048
[models.m-a]
[models.m-b]
temperature = 0.7
[models.m-c]
requests_per_minute = 30
"""


def make(tmp_path: Path, budgets: str = ""):
    root = tmp_path / "prompts"
    root.mkdir(exist_ok=True)
    (root / "one.txt").write_text("First prompt with {braces} and {prompt} and {uri}.\n", encoding="utf-8")
    (root / "two.prompt.rtpl").write_text("// @rule RULE:r1 priority=1\n{% if x %}Do {{ y }}{% endif %}\n", encoding="utf-8")
    path = tmp_path / "c.toml"
    path.write_text(CAMPAIGN.format(budgets=budgets), encoding="utf-8")
    spec = load_campaign(path)
    return spec, load_corpus(spec.corpus, spec.base_dir), load_instruction(spec.instruction)


# ---------------------------------------------------------------- instruction


def test_builtin_instruction_version_hash_and_markers() -> None:
    ins = load_instruction(None)
    assert ins.version == "irbench-v1"
    assert ins.sha256 == hashlib.sha256(TEMPLATE_FILE.read_bytes()).hexdigest()
    assert not ins.template.startswith("#!")
    text = "line 1 {x} {{ y }} {% if z %}\n// @rule RULE:a category=policy priority=2\n"
    msg = ins.render("dir/p.prompt.rtpl", text)
    before, rest = msg.split(BEGIN_MARKER + "\n", 1)
    inner, after = rest.split("\n" + END_MARKER, 1)
    assert inner == text[:-1]  # verbatim, braces untouched, one trailing newline dropped
    assert '"dir/p.prompt.rtpl"' in before and "{uri}" not in before and "{prompt}" not in msg.replace(text, "")
    for needle in ('"inferred"', "@rule", "@condition", "@breakpoint", "@provider", "nothing else"):
        assert needle in before
    assert after.strip() == ""


def test_custom_instruction(tmp_path: Path) -> None:
    good = tmp_path / "mine.txt"
    good.write_text(f"#! irbench-instruction team-v7\nDescribe {{uri}}.\n{BEGIN_MARKER}\n{{prompt}}\n{END_MARKER}\n", encoding="utf-8")
    ins = load_instruction(good)
    assert (ins.version, ins.sha256) == ("team-v7", hashlib.sha256(good.read_bytes()).hexdigest())
    assert ins.render("p", "{uri}") == f"Describe p.\n{BEGIN_MARKER}\n{{uri}}\n{END_MARKER}\n"
    plain = tmp_path / "plain.txt"
    plain.write_text(f"{BEGIN_MARKER}\n{{prompt}}\n{END_MARKER}\n", encoding="utf-8")
    assert load_instruction(plain).version == "custom-plain"
    bad = tmp_path / "bad.txt"
    bad.write_text("Describe this: {prompt}\n", encoding="utf-8")
    with pytest.raises(ConfigError, match="bad.txt"):
        load_instruction(bad)
    with pytest.raises(ConfigError, match="cannot read instruction template"):
        load_instruction(tmp_path / "absent.txt")


# ---------------------------------------------------------------- run ids


def test_run_id_golden_and_independent_encoding() -> None:
    prompt = "ab" * 32
    canonical = '["irbench-run-v1","demo","' + prompt + '","sim-mild",null,2]'
    expected = hashlib.sha256(canonical.encode()).hexdigest()[:32]
    assert run_id("demo", prompt, "sim-mild", None, 2) == expected
    # pinned literal (computed with `printf ... | sha256sum`): changing the encoding would orphan every stored run, so it must fail loudly
    assert run_id("demo", prompt, "sim-mild", None, 2) == "d1366ac9df75ee5a789680e263493a5f"
    with_budget = '["irbench-run-v1","demo","' + prompt + '","sim-mild",1500,0]'
    assert run_id("demo", prompt, "sim-mild", 1500, 0) == hashlib.sha256(with_budget.encode()).hexdigest()[:32]


def test_run_id_of_a_later_wave_has_the_wave_in_its_canonical_array() -> None:
    prompt = "ab" * 32
    assert run_id("demo", prompt, "sim-mild", None, 2, wave=1) == "d1366ac9df75ee5a789680e263493a5f"  # wave 1 as always
    canonical = '["irbench-run-v1","demo","' + prompt + '","sim-mild",null,2,2]'
    assert run_id("demo", prompt, "sim-mild", None, 2, wave=2) == hashlib.sha256(canonical.encode()).hexdigest()[:32]
    assert len({run_id("demo", prompt, "sim-mild", None, 2, wave=w) for w in (1, 2, 3)}) == 3


def test_a_wave_plan_keeps_every_run_and_names_its_wave(tmp_path: Path) -> None:
    from orchestrator.campaign.plan import WaveStart

    spec, corpus, ins = make(tmp_path)
    started = dt.datetime(2026, 5, 1, 9, tzinfo=dt.timezone.utc)
    one, two = plan_runs(spec, corpus, ins), plan_runs(spec, corpus, ins, wave=WaveStart(2, started))
    assert [(t.model, t.prompt_sha256, t.run_index) for t in one] == [(t.model, t.prompt_sha256, t.run_index) for t in two]
    assert not {t.run_id for t in one} & {t.run_id for t in two}
    assert {(t.wave, t.wave_started_at) for t in one} == {(1, None)} and {(t.wave, t.wave_started_at) for t in two} == {(2, started)}
    assert RunTask.model_validate_json(two[0].model_dump_json()) == two[0]


def test_run_id_unambiguous() -> None:
    p = "0" * 64
    ids = {
        run_id("a", p, "b-c", None, 0),
        run_id("a-b", p, "c", None, 0),
        run_id("a", p, "b", None, 0),
        run_id("a", p, "b", 0, 0),
        run_id("a", p, "b", None, 1),
        run_id("a", p, 'b","x', None, 0),
    }
    assert len(ids) == 6 and all(len(i) == 32 and int(i, 16) >= 0 for i in ids)


# ---------------------------------------------------------------- planning


def test_plan_cross_fields_and_interleaving(tmp_path: Path) -> None:
    spec, corpus, ins = make(tmp_path)
    day = dt.date(2025, 3, 1)
    tasks = plan_runs(spec, corpus, ins, measured_on=day)
    assert len(tasks) == 2 * 3 * 3  # prompts × models × runs
    assert len({t.run_id for t in tasks}) == len(tasks)
    assert [t.model for t in tasks[:6]] == ["m-a", "m-b", "m-c"] * 2
    # within one model: prompt then run
    a = [(t.prompt_name, t.run_index) for t in tasks if t.model == "m-a"]
    assert a == [("one.txt", 0), ("one.txt", 1), ("one.txt", 2), ("two.prompt.rtpl", 0), ("two.prompt.rtpl", 1), ("two.prompt.rtpl", 2)]
    by_sha = {p.sha256: p for p in corpus.prompts}
    for t in tasks:
        assert isinstance(t, RunTask) and t.campaign == "plan-test" and t.panel == "plan-test"
        assert t.run_id == run_id("plan-test", t.prompt_sha256, t.model, None, t.run_index)
        assert t.budget_max_tokens is None and t.max_tokens == 2048 and t.measured_on == day
        assert t.user_message == ins.render(by_sha[t.prompt_sha256].name, by_sha[t.prompt_sha256].text)
        assert (t.instruction_version, t.instruction_sha256) == (ins.version, ins.sha256)
        assert t.endpoint.base_url == "http://127.0.0.1:8765" and t.retry == spec.retry.to_policy()
    assert {t.temperature for t in tasks if t.model == "m-b"} == {0.7}
    assert {t.limits.requests_per_minute for t in tasks if t.model == "m-c"} == {30}
    # JSON round trip (what Celery will carry)
    assert RunTask.model_validate_json(tasks[0].model_dump_json()) == tasks[0]
    # deterministic
    assert [t.run_id for t in plan_runs(spec, corpus, ins, measured_on=day)] == [t.run_id for t in tasks]


def test_plan_budgets_cross(tmp_path: Path) -> None:
    spec, corpus, ins = make(tmp_path, budgets="budgets = [1500, 8000]")
    tasks = plan_runs(spec, corpus, ins)
    assert len(tasks) == 2 * 3 * 2 * 3
    assert len({t.run_id for t in tasks}) == len(tasks)
    cells = Counter((t.prompt_sha256, t.model, t.budget_max_tokens) for t in tasks)
    assert set(cells.values()) == {3} and len(cells) == 2 * 3 * 2
    assert all(t.max_tokens == t.budget_max_tokens for t in tasks)  # the budget overrides max_tokens
    a = [(t.prompt_name, t.budget_max_tokens, t.run_index) for t in tasks if t.model == "m-a"][:4]
    assert a == [("one.txt", 1500, 0), ("one.txt", 1500, 1), ("one.txt", 1500, 2), ("one.txt", 8000, 0)]
    # a budgeted run never collides with the unbudgeted run of the same cell
    assert not {t.run_id for t in tasks} & {t.run_id for t in plan_runs(*make(tmp_path))}


def test_pending_resume_filter(tmp_path: Path) -> None:
    spec, corpus, ins = make(tmp_path)
    tasks = plan_runs(spec, corpus, ins)
    done = {t.run_id for t in tasks[::2]} | {"not-a-planned-id"}
    rest = pending(tasks, done)
    assert [t.run_id for t in rest] == [t.run_id for t in tasks[1::2]]
    assert pending(tasks, set()) == tasks and pending(tasks, {t.run_id for t in tasks}) == []
    # a replanned campaign (new day, same spec) resumes onto the same ids
    replanned = plan_runs(spec, corpus, ins, measured_on=dt.date(2030, 1, 1))
    assert [t.run_id for t in pending(replanned, done)] == [t.run_id for t in rest]
    assert json.loads(json.dumps([t.run_id for t in rest]))  # plain strings
