"""The outstanding window and how due deferred runs travel.

The auto window grows with the calls the campaign's models allow at once, so the workers hold
runs of every model beyond its permits; runs due again go out together, never before their
countdown (a reserved rate slot is never run into early).
"""

from __future__ import annotations

from pathlib import Path

import pytest

from orchestrator.campaign.prepared import prepare
from orchestrator.campaign.spec import load_campaign
from orchestrator.distributed.options import AUTO_WINDOW_RUNS, WINDOW_PER_CALL, CeleryOptions, window_runs
from orchestrator.distributed.plan_view import PlanView
from orchestrator.distributed.publisher import COUNTDOWN_STEP_S, _messages
from tests.support.campaign_files import write_campaign
from workers.errors import ConfigError


def _plan(tmp_path: Path, caps: list[int]) -> PlanView:
    tmp_path.mkdir(exist_ok=True)
    body = '[endpoints.s]\nbase_url = "http://127.0.0.1:9"\n' + "".join(
        f'[models.m{k}]\nendpoint = "s"\nmax_concurrency = {c}\n' for k, c in enumerate(caps))
    return PlanView(prepare(load_campaign(write_campaign(tmp_path, "w", body, runs=2, prompts=3))).tasks)


def test_the_auto_window_is_three_times_the_calls_the_models_allow_or_the_floor(tmp_path: Path) -> None:
    wide = _plan(tmp_path / "wide", [600, 500, 400])
    assert wide.allowed_calls() == 1500
    assert window_runs(CeleryOptions().max_outstanding, wide.allowed_calls()) == WINDOW_PER_CALL * 1500 == 4500
    narrow = _plan(tmp_path / "narrow", [2, 3])
    assert window_runs(0, narrow.allowed_calls()) == AUTO_WINDOW_RUNS
    assert window_runs(7, wide.allowed_calls()) == 7  # a set value is kept as given


def test_a_model_without_a_concurrency_cap_leaves_the_floor(tmp_path: Path) -> None:
    tasks = [t.model_copy(update={"limits": t.limits.model_copy(update={"max_concurrency": None})})
             if t.model == "m1" else t for t in _plan(tmp_path, [900, 900]).tasks]
    view = PlanView(tasks)
    assert view.allowed_calls() is None
    assert window_runs(0, view.allowed_calls()) == AUTO_WINDOW_RUNS


def test_a_negative_window_is_refused_with_the_variable_to_change() -> None:
    with pytest.raises(ConfigError, match="IRBENCH_MAX_OUTSTANDING"):
        CeleryOptions(max_outstanding=-1)


def test_runs_due_together_share_a_message_sent_no_earlier_than_any_of_their_countdowns(tmp_path: Path) -> None:
    tasks = list(_plan(tmp_path, [4, 4]).tasks)  # 12 runs
    waits = [0.01, 0.05, 0.099, 0.12, 0.15, 0.61, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0]
    countdown = {t.run_id: w for t, w in zip(tasks, waits) if w}
    messages = _messages(tasks, 4, countdown)
    sent = {t.run_id: wait for group, wait in messages for t in group}
    assert sorted(sent) == sorted(t.run_id for t in tasks)  # every run once
    assert all(sent[r] >= w for r, w in countdown.items())  # late, never early
    assert all(sent[r] - w < COUNTDOWN_STEP_S for r, w in countdown.items())  # by less than one step
    with_wait = [(len(group), wait) for group, wait in messages if wait]
    assert with_wait == [(3, pytest.approx(0.1)), (2, pytest.approx(0.2)), (1, pytest.approx(0.7))]
    assert [len(group) for group, wait in messages if not wait] == [4, 2]
