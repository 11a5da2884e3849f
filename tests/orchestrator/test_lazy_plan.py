"""The lazy plan against the materialised plan it replaces, the bitmap state, the store mapping."""

from __future__ import annotations

import datetime as dt
from pathlib import Path

import numpy as np
import pyarrow as pa
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from orchestrator.campaign.corpus import Corpus, load_corpus
from orchestrator.campaign.instruction import Instruction, load_instruction
from orchestrator.campaign.plan import LazyPlan
from orchestrator.campaign.plan import WaveStart, run_id
from orchestrator.campaign.plan_state import LatestRuns, PlanSelection, retryable_mask
from orchestrator.campaign.retry import retryable_tasks
from orchestrator.campaign.run_bitmap import RunBitmap
from orchestrator.campaign.spec import CampaignSpec, load_campaign
from storage.outcomes import RERUN_BY_DEFAULT
from storage.records import Outcome
from workers.runtask import RunTask


def materialised_plan(spec: CampaignSpec, corpus: Corpus, instruction: Instruction,
                      measured_on: dt.date | None = None, wave: WaveStart = WaveStart()) -> list[RunTask]:
    """The plan as it was built before it was lazy: every task of every model, then interleaved."""
    budgets: list[int | None] = list(spec.budgets) if spec.budgets else [None]
    messages = {p.sha256: instruction.render(p.name, p.text) for p in corpus.prompts}
    per_model = []
    for m in spec.models.values():
        retry, endpoint = spec.retry.to_policy(), spec.endpoint_ref(m)
        capped = spec.spend_cap().capped or m.spend_cap().capped
        per_model.append([
            RunTask(
                run_id=run_id(spec.name, p.sha256, m.name, budget, k, wave.number),
                campaign=spec.name, panel=spec.panel, model=m.name, endpoint=endpoint,
                limits=m.to_limits(), timeouts=m.to_timeouts(), retry=retry, response=m.to_response_limits(),
                max_tokens=budget if budget is not None else m.max_tokens, budget_max_tokens=budget,
                temperature=m.temperature, reasoning=m.reasoning, structured_output=m.structured_output,
                stream=m.stream, options=dict(m.options),
                prompt_sha256=p.sha256, prompt_name=p.name, prompt_license=p.license, prompt_source=p.source,
                run_index=k, user_message=messages[p.sha256],
                instruction_version=instruction.version, instruction_sha256=instruction.sha256,
                measured_on=measured_on, wave=wave.number, wave_started_at=wave.started_at, spend_capped=capped,
            )
            for p in corpus.prompts for budget in budgets for k in range(spec.runs)
        ])
    out: list[RunTask] = []
    for i in range(max((len(t) for t in per_model), default=0)):
        out.extend(t[i] for t in per_model if i < len(t))
    return out


def campaign(root: Path, models: int, prompts: int, budgets: int, runs: int) -> tuple[CampaignSpec, Corpus, Instruction]:
    pdir = root / "prompts"
    pdir.mkdir(parents=True, exist_ok=True)
    for old in pdir.iterdir():
        old.unlink()
    for i in range(prompts):
        (pdir / f"p{i:02d}.txt").write_text(f"prompt {i} ü\n", encoding="utf-8")
    lines = ['name = "lazy.plan_1"', f"runs = {runs}"]
    if budgets:
        lines.append(f"budgets = {[256 * (b + 1) for b in range(budgets)]}")
    lines += ["[corpus]", 'paths = ["prompts"]', "[endpoints.sim]", 'base_url = "http://127.0.0.1:9"',
              "[defaults]", 'endpoint = "sim"', "max_tokens = 100"]
    for m in range(models):
        lines += [f'[models."m-{m}"]', f"temperature = {m / 10}", f"max_concurrency = {m + 1}"]
        if m % 2:
            lines.append('options = { seed = 7 }')
    path = root / "c.toml"
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    spec = load_campaign(path)
    return spec, load_corpus(spec.corpus, spec.base_dir), load_instruction(spec.instruction)


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(models=st.integers(1, 4), prompts=st.integers(1, 4), budgets=st.integers(0, 3), runs=st.integers(1, 4),
       wave=st.integers(1, 3))
def test_the_lazy_plan_is_the_materialised_plan(tmp_path: Path, models: int, prompts: int, budgets: int, runs: int,
                                                wave: int) -> None:
    spec, corpus, ins = campaign(tmp_path, models, prompts, budgets, runs)
    start = WaveStart(wave, dt.datetime(2026, 5, 1, tzinfo=dt.timezone.utc) if wave > 1 else None)
    day = dt.date(2026, 5, 2)
    old = materialised_plan(spec, corpus, ins, day, start)
    lazy = LazyPlan(spec, corpus, ins, day, start)
    assert len(lazy) == len(old)
    assert list(lazy) == old  # every field of every task, in order
    assert [lazy.run_id(i) for i in range(len(lazy))] == [t.run_id for t in old]
    if old:
        assert lazy[-1] == old[-1] and lazy[1:3] == old[1:3]
    with pytest.raises(IndexError):
        lazy.task(len(old))
    # a stored row maps back to its index; a row of another wave or off the axes does not
    rows = pa.table({"run_id": [t.run_id for t in old] + ["f" * 32], "model": [t.model for t in old] + ["m-0"],
                     "prompt_sha256": [t.prompt_sha256 for t in old] + [corpus.prompts[0].sha256],
                     "budget_max_tokens": pa.array([t.budget_max_tokens for t in old] + [None], pa.int64()),
                     "run_index": [t.run_index for t in old] + [0]})
    assert lazy.locate(rows).tolist() == [*range(len(old)), -1]
    other = LazyPlan(spec, corpus, ins, day, WaveStart(wave + 1))
    assert (other.locate(rows) == -1).all()


@given(size=st.integers(0, 300), picks=st.lists(st.integers(0, 299)))
def test_the_bitmap_round_trips(size: int, picks: list[int]) -> None:
    chosen = sorted({p for p in picks if p < size})
    bits = RunBitmap.of(size, chosen)
    assert bits.indices().tolist() == chosen and bits.count() == len(chosen)
    assert [i for i in range(size) if i in bits] == chosen and -1 not in bits and size not in bits
    again = RunBitmap.from_bytes(size, bits.to_bytes())
    assert again == bits and again.indices().tolist() == chosen
    assert len(bits.to_bytes()) == (size + 7) // 8
    full = RunBitmap.full(size)
    assert full.count() == size and full.difference(bits).indices().tolist() == sorted(set(range(size)) - set(chosen))
    assert full.difference(bits).union(bits) == full
    if size:
        lo, hi = size // 3, size - size // 4
        assert bits.mask(lo, hi).tolist() == [i in chosen for i in range(lo, hi)]


def test_a_bitmap_refuses_what_is_not_one_of_its_indices() -> None:
    with pytest.raises(IndexError):
        RunBitmap(10).add(np.array([10]))
    with pytest.raises(ValueError, match="past the bitmap"):
        RunBitmap.from_bytes(3, bytes([0b1000]))
    with pytest.raises(ValueError):
        RunBitmap.from_bytes(9, b"\x00")


@settings(max_examples=20, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(models=st.integers(1, 3), runs=st.integers(1, 5), done=st.lists(st.integers(0, 59)), window=st.integers(1, 7))
def test_a_selection_streams_the_pending_tasks_of_each_model_in_plan_order(
    tmp_path: Path, models: int, runs: int, done: list[int], window: int
) -> None:
    spec, corpus, ins = campaign(tmp_path, models, 3, 1, runs)
    plan = LazyPlan(spec, corpus, ins)
    finished = {i for i in done if i < len(plan)}
    selection = PlanSelection(plan, RunBitmap.full(len(plan)).difference(RunBitmap.of(len(plan), finished)), window)
    expected = [t for i, t in enumerate(materialised_plan(spec, corpus, ins)) if i not in finished]  # the old pending()
    assert list(selection) == expected and len(selection) == len(expected)
    for model in plan.models:
        assert list(selection.tasks_of(model)) == [t for t in expected if t.model == model]
        assert selection.counts()[model] == sum(t.model == model for t in expected)


@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(outcomes=st.lists(st.sampled_from([o.value for o in Outcome]), min_size=0, max_size=12))
def test_retryable_indices_are_the_retryable_tasks(tmp_path: Path, outcomes: list[str]) -> None:
    spec, corpus, ins = campaign(tmp_path, 2, 2, 0, 3)
    plan, tasks = LazyPlan(spec, corpus, ins), materialised_plan(spec, corpus, ins)
    latest = {tasks[i].run_id: o for i, o in enumerate(outcomes)}
    runs = LatestRuns(np.arange(len(outcomes), dtype=np.int64), np.asarray(outcomes, dtype=object))
    for chosen in (RERUN_BY_DEFAULT, frozenset({Outcome.NOT_FOUND, Outcome.RATE_LIMITED})):
        old = [t.run_id for t in retryable_tasks(tasks, latest, chosen | {Outcome.CANCELLED})]
        mask = retryable_mask(plan, runs, chosen | {Outcome.CANCELLED})
        assert [plan.run_id(int(i)) for i in runs.indices[mask]] == old


def test_a_ten_million_run_plan_is_prepared_resumed_and_counted_without_its_tasks(tmp_path: Path) -> None:
    """What a 10**7-run campaign costs before its first call: its axes, a bitmap, one task."""
    import time
    import tracemalloc

    from orchestrator.campaign.plan_state import stored_bitmap
    from orchestrator.campaign.prepared import prepare
    from orchestrator.campaign.status import campaign_status
    from storage.runs import RunStore

    spec, _, _ = campaign(tmp_path, 4, 5, 2, 250_000)
    store = RunStore(tmp_path / "data")
    tracemalloc.start()
    t0 = time.perf_counter()
    try:
        prepared = prepare(spec, max_planned_runs=None)
        selection = PlanSelection.pending(prepared.plan, stored_bitmap(prepared.plan, store))
        first = next(selection.tasks_of("m-3"))
        status = campaign_status(prepared, store)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    seconds = time.perf_counter() - t0
    assert len(prepared.tasks) == len(selection) == status.planned == 10_000_000
    assert first == prepared.tasks[3] and status.stored == 0
    assert peak < 64 * 2**20, f"{peak / 2**20:.0f} MiB traced"  # a materialised plan: about 32 GiB
    assert seconds < 30, f"{seconds:.1f} s"


def test_the_resume_scan_finds_the_stored_runs_of_the_plan_whatever_its_read_groups(tmp_path: Path) -> None:
    from orchestrator.campaign.plan_state import latest_runs, stored_rows
    from storage.runs import RunStore
    from workers.execute import worker_error_record

    spec, corpus, ins = campaign(tmp_path, 3, 2, 2, 3)
    plan, later = LazyPlan(spec, corpus, ins), LazyPlan(spec, corpus, ins, wave=WaveStart(2))
    store = RunStore(tmp_path / "data", fsync=False)
    stored = [0, 5, 7, 8, 35, 5]  # 5 twice: two executions, one run
    for i in stored:
        store.write([worker_error_record(plan[i], "boom")])  # one file each
    store.write([worker_error_record(later[3], "another wave"), worker_error_record(
        plan[4].model_copy(update={"run_id": "0" * 32}), "an id that is not the plan's")])
    for group in (1, 2, 64):
        bitmap, rows = stored_rows(plan, store, files_per_read=group)
        assert bitmap.indices().tolist() == sorted(set(stored)) and rows == len(stored) + 2
    latest = latest_runs(plan, store)
    assert latest.indices.tolist() == sorted(set(stored)) and latest.by_outcome() == {"worker_error": 5}
    assert stored_rows(later, store)[0].indices().tolist() == [3]
