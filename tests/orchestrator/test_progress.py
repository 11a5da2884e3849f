"""The per-model progress bars: stderr, done / failed / cancelled apart, each model's own rate and ETA."""

from __future__ import annotations

import io
import re

from rich.console import Console

from orchestrator.local.executor import ModelProgress
from orchestrator.local.progress import ModelBars


class _Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def _render(updates, clock: _Clock) -> str:
    buf = io.StringIO()
    console = Console(file=buf, width=200, force_terminal=False)
    with ModelBars(console, get_time=clock) as bars:
        for t, model, state in updates:
            clock.now = 1000.0 + t
            bars.update(model, state)
    return buf.getvalue()


def _line(text: str, model: str) -> str:
    return next(line for line in text.splitlines() if line.startswith(model))


def test_each_model_shows_its_own_rate_and_eta() -> None:
    clock = _Clock()
    updates = []
    for i in range(11):  # fast: 1 run every 0.1 s (10 runs/s); slow: 1 run every 0.5 s (2 runs/s)
        updates.append((0.1 * i, "fast", ModelProgress(total=100, done=i)))
        updates.append((0.5 * i, "slow", ModelProgress(total=100, done=i)))
    updates.sort(key=lambda u: u[0])
    text = _render(updates, clock)
    fast, slow = _line(text, "fast"), _line(text, "slow")
    rate = lambda line: float(re.search(r"([\d.]+) runs/s", line).group(1))  # noqa: E731
    assert abs(rate(fast) - 10.0) < 0.5 and abs(rate(slow) - 2.0) < 0.1
    eta = lambda line: re.search(r"ETA (\d+:\d\d:\d\d)", line).group(1)  # noqa: E731
    # 90 runs left at 10/s = 9 s; at 2/s = 45 s
    assert eta(fast) == "0:00:09" and eta(slow) == "0:00:45"


def test_failed_and_cancelled_are_counted_apart() -> None:
    state = ModelProgress(total=10, done=10, failed=2, cancelled=5)
    text = _render([(0.0, "m", ModelProgress(total=10)), (1.0, "m", state)], _Clock())
    line = _line(text, "m")
    # every count carries its label: 10 done of 10, of which 3 ok, 2 failed, 5 cancelled
    assert re.search(r"10/10 done\s+ok\s+3\s+failed\s+2\s+cancelled\s+5\s+in flight\s+0", line), line


def test_bars_default_to_stderr() -> None:
    bars = ModelBars()
    assert bars._progress.console.stderr  # stdout stays for results


def test_local_executor_reports_cancelled_apart_from_failed(tmp_path, sim_server, examples_dir) -> None:
    """A 410 closes the model: the runs never sent are `cancelled`, the 410 itself is `failed`,
    and the progress counts equal what the store holds."""
    from orchestrator.campaign.prepared import prepare
    from orchestrator.local.campaign import run_campaign_local
    from orchestrator.campaign.spec import load_campaign
    from storage.runs import RunStore

    path = tmp_path / "c.toml"
    path.write_text(f'name = "p"\nruns = 2\n[corpus]\npaths = ["{examples_dir / "prompts"}"]\n'
                    f'[endpoints.sim]\nbase_url = "{sim_server.base_url}"\n[models.sim-retiring]\nmax_concurrency = 1\n')
    last: dict[str, ModelProgress] = {}
    store = RunStore(tmp_path / "data")
    run_campaign_local(prepare(load_campaign(path)), store, {},
                       on_progress=lambda m, s: last.__setitem__(m, ModelProgress(**{
                           k: getattr(s, k) for k in ("total", "done", "failed", "cancelled", "in_flight")})))
    stored = store.count_by_outcome("p")
    state = last["sim-retiring"]
    assert stored["ok"] == 5 and stored["cancelled"] > 0  # retired_after_requests = 5
    assert state.done == 24 and state.cancelled == stored["cancelled"]
    assert state.failed == sum(v for k, v in stored.items() if k not in ("ok", "cancelled")) >= 1


def test_rates_from_finished_executions_and_eta(tmp_path) -> None:
    """Rate = executions finished in the window / time since the first of them; ETA = remaining / rate."""
    import datetime as dt

    from orchestrator.cli.rates import model_rates
    from storage.runs import RunStore
    from tests.support.run_records import make_record

    now = dt.datetime(2026, 6, 1, 12, 0, tzinfo=dt.timezone.utc)
    recs = []
    for i in range(20):  # model a: one every 5 s over the last 100 s (20 runs); b: 5 runs over 50 s
        recs.append(make_record(i, model="a", campaign="c", finished_at=now - dt.timedelta(seconds=100 - 5 * i)))
    for i in range(5):
        recs.append(make_record(100 + i, model="b", campaign="c", finished_at=now - dt.timedelta(seconds=50 - 10 * i)))
    recs.append(make_record(200, model="b", campaign="c", finished_at=now - dt.timedelta(seconds=500)))  # outside
    store = RunStore(tmp_path)
    store.write(recs)
    rates = {r.model: r for r in model_rates(store, "c", {"a": 40, "b": 0, "idle": 3}, now=now, window_s=120)}
    assert rates["a"].finished_in_window == 20 and abs(rates["a"].runs_per_s - 20 / 100) < 1e-9
    assert abs(rates["a"].eta_s - 40 / 0.2) < 1e-6
    assert rates["b"].finished_in_window == 5 and rates["b"].eta_s == 0.0
    assert rates["idle"].runs_per_s == 0.0 and rates["idle"].eta_s is None
